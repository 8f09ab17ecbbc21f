"""Per-event CPU cost of the Event BUS collector path, stage by stage, in one process.

Part 1 runs the server's *own* code as it is now (whatever ``bus`` currently contains):
an ``EventBusService`` is started on 127.0.0.1 (its reactor is never run), then

* ``read``: its COLLECTOR ``ZmqSocket.doRead()`` drains PUBs that a DEALER queued, with
  the batch handler replaced by a no-op (the transport's receive cost alone);
* ``collect``: ``EventBusService._on_collected(batch)`` on batches of ``read_budget``
  PUBs (validation, store commit, BROADCAST to a connected SUB). The store and the
  PUB socket are wrapped in a timing proxy, so the cost splits into store calls,
  PUB-socket calls and the rest (validation and message building).

Part 2 times pyzmq building blocks the server's transport could use instead, to show
where the microseconds go: ``recv_multipart`` vs frame-by-frame reads, ``getsockopt``,
the ``Socket.send`` wrapper vs the Cython method, and SQLite WAL checkpoints.

Baseline: the raw pyzmq forwarder's work per event (``recv_multipart`` + 6 ``send``), as
the baseline process of ``eventbus_throughput.py`` does it.

    python bench/eventbus_costs.py [--events 100000] [--rounds 3]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import zmq
from _common import machine, summary, temporary_directory
from _workers import _uuid_format, pubs

NOBLOCK = zmq.NOBLOCK
MORE = zmq.NOBLOCK | zmq.SNDMORE


class TimingProxy:
    """Forwards attribute access to ``target``; times every method call by name."""

    def __init__(self, target: Any) -> None:
        object.__setattr__(self, "_target", target)
        object.__setattr__(self, "seconds", defaultdict(float))
        object.__setattr__(self, "calls", defaultdict(list))

    def __getattr__(self, name: str) -> Any:
        value = getattr(self._target, name)
        if not callable(value):
            return value
        seconds, calls = self.seconds, self.calls

        def timed(*args: Any, **kwargs: Any) -> Any:
            started = time.perf_counter()
            try:
                return value(*args, **kwargs)
            finally:
                elapsed = time.perf_counter() - started
                seconds[name] += elapsed
                calls[name].append(elapsed)

        return timed

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(self._target, name, value)

    @property
    def total(self) -> float:
        return float(sum(self.seconds.values()))


def connect_sub(context: zmq.Context[zmq.Socket[bytes]], endpoint: str) -> zmq.Socket[bytes]:
    sub = context.socket(zmq.SUB)
    sub.rcvhwm = 0
    sub.linger = 0
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    sub.connect(endpoint)
    return sub


def empty(sub: zmq.Socket[bytes]) -> int:
    """Read whatever the SUB holds (not timed); return how many frames."""
    frames = 0
    while sub.poll(100):
        while True:
            try:
                sub.recv(NOBLOCK)
                frames += 1
            except zmq.Again:
                break
    return frames


# -- part 1: the server's own code ------------------------------------------------------------


def server_costs(
    root: Path, events: int, rounds: int, context: zmq.Context[zmq.Socket[bytes]]
) -> dict[str, Any]:
    from bus.eventbus.config import EventBusConfig
    from bus.eventbus.server import EventBusService

    config = EventBusConfig(
        port=0, data_dir=root / "data", heartbeat_interval=0.0, stats_interval=0.0
    )
    service = EventBusService(config)
    service.startService()
    try:
        collector = service.collector_socket
        assert collector is not None
        budget = config.read_budget
        chunk = min(config.collector_hwm - budget, 8000)
        uuid_format = _uuid_format()
        dealer = context.socket(zmq.DEALER)
        dealer.sndhwm = 0
        dealer.linger = 0
        dealer.connect(service.endpoints["collector"])
        sub = connect_sub(context, service.endpoints["publisher"])
        time.sleep(0.3)  # let the connections and the subscription settle (not timed)

        # read: doRead with a no-op handler, chunk by chunk (the ROUTER holds its HWM)
        received: list[list[list[bytes]]] = []
        collector.on_messages = received.append
        read_seconds = 0.0
        read_count = 0
        for start in range(0, events, chunk):
            count = min(chunk, events - start)
            send = dealer.send
            for message in pubs(start, count, uuid_format):
                for frame in message[:-1]:
                    send(frame, zmq.SNDMORE)
                send(message[-1])
            got_before = sum(len(b) for b in received)
            deadline = time.monotonic() + 30
            while sum(len(b) for b in received) - got_before < count:
                time.sleep(0.002 + count / 2_000_000)  # let the IO thread deliver (not timed)
                started = time.perf_counter()
                while True:
                    before = len(received)
                    collector.doRead()
                    if len(received) == before:
                        break
                read_seconds += time.perf_counter() - started
                if time.monotonic() > deadline:
                    raise TimeoutError("PUBs did not reach the collector")
            read_count += count
        batches = [b for b in received if b]
        collector.on_messages = None

        # collect: _on_collected on the batches that were read, round after round
        store_proxy = TimingProxy(service.store)
        pub_proxy = TimingProxy(service.publisher_socket)
        service.core.log = store_proxy  # type: ignore[assignment]
        service.publisher_socket = pub_proxy  # type: ignore[assignment]
        empty(sub)
        best: dict[str, float] | None = None
        commit_times: list[float] = []
        accepted_before = service.core.accepted
        for _ in range(rounds):
            store_proxy.seconds.clear()
            pub_proxy.seconds.clear()
            store_proxy.calls.clear()
            started = time.perf_counter()
            for batch in batches:
                service._on_collected(batch)
            total = time.perf_counter() - started
            commit_times += [t for calls in store_proxy.calls.values() for t in calls]
            current = {
                "total": total,
                "store": store_proxy.total,
                "pub": pub_proxy.total,
            }
            if best is None or current["total"] < best["total"]:
                best = current
            empty(sub)
        assert best is not None
        accepted = (service.core.accepted - accepted_before) // rounds
        if accepted != events:
            print(
                f"warning: {events - accepted} PUBs of a round were not accepted", file=sys.stderr
            )
        store_methods = ", ".join(sorted(store_proxy.seconds)) or "-"
        pub_methods = ", ".join(sorted(pub_proxy.seconds)) or "-"
        service.core.log = store_proxy._target
        service.publisher_socket = pub_proxy._target
        dealer.close()
        sub.close()
        per = 1e6 / events
        return {
            "read": read_seconds / read_count * 1e6,
            "collect": best["total"] * per,
            "store": best["store"] * per,
            "pub": best["pub"] * per,
            "rest": (best["total"] - best["store"] - best["pub"]) * per,
            "store_methods": store_methods,
            "pub_methods": pub_methods,
            "batch": statistics.median(len(b) for b in batches),
            "commit_ms": sorted(t * 1000 for t in commit_times),
        }
    finally:
        service.stopService()


# -- part 2: pyzmq and SQLite building blocks ---------------------------------------------------


def best_of(function: Callable[[], object], events: int, repeat: int) -> float:
    best = float("inf")
    for _ in range(repeat):
        started = time.perf_counter()
        function()
        best = min(best, time.perf_counter() - started)
    return best / events * 1e6


def receive_variants(
    context: zmq.Context[zmq.Socket[bytes]], events: int, rounds: int
) -> dict[str, float]:
    router = context.socket(zmq.ROUTER)
    router.rcvhwm = 0
    router.linger = 0
    port = router.bind_to_random_port("tcp://127.0.0.1")
    dealer = context.socket(zmq.DEALER)
    dealer.sndhwm = 0
    dealer.linger = 0
    dealer.connect(f"tcp://127.0.0.1:{port}")
    messages = pubs(0, events, _uuid_format())
    recv, recv_multipart = router.recv, router.recv_multipart

    def multipart() -> list[bytes]:
        return recv_multipart(NOBLOCK)

    def frames_with_more() -> list[bytes]:
        frame = recv(NOBLOCK, copy=False)
        parts = [frame.bytes]
        while frame.more:
            frame = recv(NOBLOCK, copy=False)
            parts.append(frame.bytes)
        return parts

    def seven_unchecked() -> list[bytes]:
        return [recv(NOBLOCK), recv(), recv(), recv(), recv(), recv(), recv()]

    variants = {
        "recv_multipart(NOBLOCK)  [the forwarder's read]": multipart,
        "recv(copy=False) + Frame.more + Frame.bytes  [ZmqSocket's read]": frames_with_more,
        "7 x recv() without RCVMORE checks [lower bound, unsafe]": seven_unchecked,
    }
    costs: dict[str, float] = {}
    for _ in range(rounds):  # round-robin, best of each: fair on a noisy machine
        for name, read in variants.items():
            send = dealer.send
            for message in messages:
                for frame in message[:-1]:
                    send(frame, zmq.SNDMORE)
                send(message[-1])
            router.poll(5000)
            time.sleep(0.2 + events / 300_000)  # let the IO thread queue them (not timed)
            got = 0
            started = time.perf_counter()
            while got < events:
                try:
                    read()
                    got += 1
                except zmq.Again:
                    router.poll(1000)
            cost = (time.perf_counter() - started) / events * 1e6
            costs[name] = min(costs.get(name, float("inf")), cost)
    get, rcvmore = router.getsockopt, zmq.RCVMORE
    costs["one getsockopt(RCVMORE) (recv_multipart does 7 per PUB)"] = best_of(
        lambda: [get(rcvmore) for _ in range(events)], events, 5
    )
    router.close()
    dealer.close()
    return costs


def send_variants(
    context: zmq.Context[zmq.Socket[bytes]], events: int, rounds: int
) -> dict[str, float]:
    pub = context.socket(zmq.PUB)
    pub.sndhwm = 0
    pub.linger = 0
    port = pub.bind_to_random_port("tcp://127.0.0.1")
    sub = connect_sub(context, f"tcp://127.0.0.1:{port}")
    while True:  # until the subscription reached the PUB socket
        pub.send(b"hello")
        if sub.poll(50):
            break
    messages = [
        [topic, n.to_bytes(8, "big"), producer, timestamp, uuid, data]
        for n, (topic, _, producer, timestamp, uuid, data) in enumerate(
            pubs(0, events, _uuid_format()), 1
        )
    ]
    sugar = pub.send
    cython = zmq.backend.Socket.send.__get__(pub)  # the method the wrapper ends up calling

    def sugar_loop() -> None:
        for frames in messages:
            for frame in frames[:-1]:
                sugar(frame, MORE)
            sugar(frames[-1], NOBLOCK)

    def cython_loop() -> None:
        for topic, sequence, producer, timestamp, uuid, data in messages:
            cython(topic, MORE)
            cython(sequence, MORE)
            cython(producer, MORE)
            cython(timestamp, MORE)
            cython(uuid, MORE)
            cython(data, NOBLOCK)

    def multipart() -> None:
        for frames in messages:
            pub.send_multipart(frames, NOBLOCK)

    variants = {
        "6 x Socket.send (pyzmq's Python wrapper)  [the forwarder's send]": sugar_loop,
        "6 x zmq.backend.Socket.send (the Cython method)  [ZmqSocket.send_many's]": cython_loop,
        "send_multipart": multipart,
    }
    costs: dict[str, float] = {}
    for _ in range(rounds):
        for name, function in variants.items():
            empty(sub)
            costs[name] = min(costs.get(name, float("inf")), best_of(function, events, 1))
    empty(sub)
    pub.close()
    sub.close()
    return costs


def sqlite_checkpoints(root: Path, events: int) -> dict[str, str]:
    """EventStore appends of 512 with SQLite's automatic WAL checkpoint on and off."""
    from bus.eventbus import codec
    from bus.eventbus.store import EventStore

    parsed = [codec.parse_pub(p) for p in pubs(0, events, _uuid_format())]
    batches = [parsed[i : i + 512] for i in range(0, events, 512)]
    found = {}
    for label, pragma in [("autocheckpoint on (default)", None), ("autocheckpoint off", 0)]:
        store = EventStore(root / f"ckpt-{pragma}")
        if pragma is not None:
            store._db.execute(f"PRAGMA wal_autocheckpoint={pragma}")
        times = []
        for batch in batches:
            started = time.perf_counter()
            store.append(batch, time.time())
            times.append((time.perf_counter() - started) * 1000)
        times.sort()
        started = time.perf_counter()
        store._db.execute("PRAGMA wal_checkpoint(PASSIVE)")
        checkpoint = (time.perf_counter() - started) * 1000
        store.close()
        found[label] = (
            f"append(512) median {statistics.median(times):.2f} ms, "
            f"p99 {times[int(len(times) * 0.99)]:.2f} ms, max {times[-1]:.2f} ms, "
            f"{sum(t > 10 for t in times)} over 10 ms; then a full checkpoint {checkpoint:.1f} ms"
        )
    return found


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--events", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=3, help="round-robin passes (best kept)")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    events = args.events
    info = machine()
    context: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    with temporary_directory("eventbus-costs-") as root:
        server = server_costs(root, events, args.rounds, context)
        receive = receive_variants(context, events, args.rounds)
        send = send_variants(context, events, args.rounds)
        checkpoints = sqlite_checkpoints(root, min(events, 100_000))
    context.term()

    print(f"\nThe server's own code, per event ({events:,} PUBs, best of {args.rounds}), us:")
    print(f"  {server['read']:7.2f}  read     COLLECTOR ZmqSocket.doRead (no-op handler)")
    print(
        f"  {server['collect']:7.2f}  collect  EventBusService._on_collected, batches of ~{server['batch']:.0f}"
    )
    print(f"  {server['store']:7.2f}             of which store ({server['store_methods']})")
    print(f"  {server['pub']:7.2f}             of which PUB socket ({server['pub_methods']})")
    print(f"  {server['rest']:7.2f}             of which the rest (validation, message building)")
    total = server["read"] + server["collect"]
    print(f"  {total:7.2f}  total = {1e6 / total:,.0f} events/s on one core (IO threads excluded)")
    commits = server["commit_ms"]
    if commits:
        print(
            f"  store calls per batch: median {statistics.median(commits):.2f} ms, "
            f"max {commits[-1]:.2f} ms (a reactor turn is at least this long)"
        )
    print("\npyzmq building blocks, per event (7-frame PUB in, 6-frame BROADCAST out), us:")
    for name, cost in [*receive.items(), *send.items()]:
        print(f"  {cost:7.2f}  {name}")
    print("\nSQLite WAL checkpoints (EventStore.append of 512 events):")
    for label, text in checkpoints.items():
        print(f"  {label}: {text}")

    baseline = (
        receive["recv_multipart(NOBLOCK)  [the forwarder's read]"]
        + send["6 x Socket.send (pyzmq's Python wrapper)  [the forwarder's send]"]
    )
    summary(
        "eventbus_costs",
        info,
        measured=f"server path {total:.2f} us/event in the reactor thread "
        f"(read + _on_collected) = {1e6 / total:,.0f} events/s per core",
        baseline=f"raw forwarder work {baseline:.2f} us/event (recv_multipart + 6 sends) "
        f"= {1e6 / baseline:,.0f} events/s per core",
        ratio=f"{baseline / total:.2f} (baseline cost / server cost: the throughput ratio "
        "if both were CPU-bound on one core)",
        target="server path <= 16.7 us/event (60k events/s on one core, before IO threads)",
        verdict=total <= 1e6 / 60_000,
        json_path=args.json,
        record={
            "server_us": {k: v for k, v in server.items() if k != "commit_ms"},
            "receive_us": receive,
            "send_us": send,
            "checkpoints": checkpoints,
        },
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
