"""Raw pyzmq processes used by the Event BUS benchmarks (run by ``_common.Worker``).

Roles:

``publish ENDPOINT EVENTS``
    A DEALER connected to a collector. Builds the PUBs first, prints ``READY``, waits for
    ``GO`` on stdin, then sends them as fast as blocking sends allow (the HWM is the
    backpressure) and prints a JSON line with its timings.
``subscribe ENDPOINT EVENTS``
    A SUB (RCVHWM 0) subscribed to everything. Prints ``READY`` once it received a first
    message (the server's heartbeat: proof the subscription reached the PUB socket), then
    counts BROADCASTs and checks their sequences are contiguous; prints a JSON line.
``forward COLLECTOR_ENDPOINT PUBLISHER_ENDPOINT``
    The throughput baseline: a ROUTER -> PUB forwarder doing the server's 6-frame work
    (receive a PUB, assign a sequence, send the 6 frames on PUB) and a heartbeat a second.
``snapshot-server ENDPOINT EVENTS``
    The snapshot baseline: a ROUTER serving EVENTS pre-built SYNC messages from memory,
    then SYNCEND, for every SYNCSTART.
``snapshot-client ENDPOINT EVENTS REPEAT``
    A raw DEALER (RCVHWM 0) timing SYNCSTART -> SYNCEND, REPEAT times (a fresh socket
    each time); checks it got EVENTS contiguous SYNCs.
``twisted-snapshot HOST:PORT EVENTS``
    The project's ``bus.eventbus.client.EventBusSubscriber`` timing the same snapshot.
``paced-publish ENDPOINT RATE SECONDS``
    A DEALER sending RATE events a second for SECONDS, each carrying its send time
    (``{"t": <monotonic ns>, "pad": <bin>}``, 100 bytes), after ``GO``.
``latency-subscribe ENDPOINT EVENTS``
    A SUB that reads the send time out of each BROADCAST and reports latency percentiles
    (CLOCK_MONOTONIC is the same clock in every process of the machine).
``soak-publish ENDPOINT RATE SECONDS TOPICS``
    ``paced-publish`` for a soak: each event's UUID made as it is sent (no list of them in
    memory), topics ``/soak/NNNNN/`` in turn over TOPICS; sends in bursts of a
    millisecond's worth.
``soak-subscribe ENDPOINT SAMPLES``
    A SUB to everything that keeps, per event, its send time and its arrival time (CLOCK_MONOTONIC
    ns) until a line arrives on stdin; then writes them to the file SAMPLES (int64 pairs,
    native order) and prints a JSON line (events, gaps in the sequence, heartbeats).
``connect-churn ENDPOINT CONNECTIONS``
    After ``GO``, CONNECTIONS DEALERs one after the other: each connects, waits for its
    handshake to succeed (a socket monitor), and closes; prints a JSON line (connections
    per second, and any handshake that failed). The cost of a new connection to a server.
``stuck-snapshot ENDPOINT CLIENTS``
    CLIENTS raw DEALERs (default options) that each send SYNCSTART for everything and
    never read. Prints ``READY`` once all have asked; closes them all when a line (or
    EOF) arrives on stdin, then prints a JSON line.

Events are 6 frames with a 100-byte msgpack payload: ``{"n": <uint32>, "pad": <bin>}``.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
import time
from collections.abc import Iterator
from typing import Any

from _curve import secure

HEARTBEAT = b"$heartbeat"
PRODUCER = b"bench-publisher"
TIMESTAMP = b"2026-11-21T10:00:00.123Z"
TOPICS = [b"/bench/topic-%02d/" % i for i in range(16)]
PAYLOAD_BYTES = 100
_PAYLOAD_HEAD = b"\x82\xa1n\xce"  # fixmap(2), "n", uint32
_PAD_HEAD = b"\xa3pad\xc4"  # "pad", bin8
_PAD = b"x" * (PAYLOAD_BYTES - len(_PAYLOAD_HEAD) - 4 - len(_PAD_HEAD) - 1)
_PAYLOAD_TAIL = _PAD_HEAD + bytes([len(_PAD)]) + _PAD
ZERO_SEQUENCE = b"\x00" * 8


def payload(n: int) -> bytes:
    """A 100-byte msgpack object ``{"n": n, "pad": b"xx..."}``."""
    return _PAYLOAD_HEAD + (n & 0xFFFFFFFF).to_bytes(4, "big") + _PAYLOAD_TAIL


def _uuid_format() -> bytes:
    # A v4-shaped UUID: a random per-run prefix and the event number (unique in a run).
    salt = int.from_bytes(os.urandom(8), "big")
    return b"%08x-%04x-4%03x-%04x-%%012x" % (
        salt >> 32,
        (salt >> 16) & 0xFFFF,
        (salt >> 4) & 0xFFF,
        0x8000 | (salt & 0x3FFF),
    )


def pubs(first: int, count: int, uuid_format: bytes) -> list[list[bytes]]:
    """PUB commands (6 frames) for events first .. first+count-1."""
    return [
        [TOPICS[n % 16], ZERO_SEQUENCE, PRODUCER, TIMESTAMP, uuid_format % n, payload(n)]
        for n in range(first, first + count)
    ]


def _chunks(events: int, size: int) -> Iterator[tuple[int, int]]:
    for start in range(0, events, size):
        yield start, min(size, events - start)


def _cpu() -> float:
    """CPU seconds used by this process so far, all threads (libzmq's IO thread too)."""
    import resource

    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _emit(value: dict[str, object]) -> None:
    print(json.dumps(value), flush=True)


def _ready() -> None:
    print("READY", flush=True)


def _wait_go() -> None:
    line = sys.stdin.readline()
    if line.strip() != "GO":
        sys.exit(0)  # the benchmark went away


# -- roles -------------------------------------------------------------------------------


def publish(endpoint: str, events: int, prebuild_limit: int = 400_000) -> None:
    import zmq

    context = zmq.Context()
    dealer = context.socket(zmq.DEALER)
    dealer.sndhwm = 1000
    dealer.linger = -1  # close() waits until everything was handed to TCP
    secure(dealer)
    dealer.connect(endpoint)
    uuid_format = _uuid_format()
    chunk = events if events <= prebuild_limit else 100_000
    prepared = pubs(0, chunk, uuid_format)
    _ready()
    _wait_go()
    more = zmq.SNDMORE
    send = dealer.send
    cpu = _cpu()
    started = time.monotonic()
    for start, count in _chunks(events, chunk):
        batch = prepared if start == 0 else pubs(start, count, uuid_format)
        for topic, sequence, producer, timestamp, uuid, data in batch:
            send(topic, more)
            send(sequence, more)
            send(producer, more)
            send(timestamp, more)
            send(uuid, more)
            send(data)
    sent_at = time.monotonic()
    dealer.close()
    context.term()
    finished = time.monotonic()
    _emit(
        {
            "sent": events,
            "cpu_seconds": _cpu() - cpu,
            "t_start": started,
            "t_sent": sent_at,
            "t_flushed": finished,
            "send_rate": events / max(sent_at - started, 1e-9),
        }
    )


def subscribe(endpoint: str, events: int, idle_timeout: float = 10.0) -> None:
    import zmq

    context = zmq.Context()
    sub = context.socket(zmq.SUB)
    sub.rcvhwm = 0
    sub.linger = 0
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    secure(sub)
    sub.connect(endpoint)
    sub.rcvtimeo = 30_000
    frames = sub.recv_multipart()  # raises zmq.Again if the PUB side is silent for 30 s
    cpu = _cpu()
    _ready()
    # Protocol-aware reads (a BROADCAST is 6 frames, a heartbeat 3): recv_multipart asks
    # RCVMORE after every frame, which costs more than the receive itself in pyzmq 27.
    recv = sub.recv
    heartbeats = 0
    count = 0
    first_sequence = previous = -1
    gaps = missing = out_of_order = malformed = 0
    first_at = last_at = 0.0
    now = time.monotonic
    sub.rcvtimeo = 120_000  # until the first event
    while True:
        if frames[0] == HEARTBEAT:
            heartbeats += 1
        elif len(frames) != 6 or len(frames[1]) != 8:
            malformed += 1
        else:
            sequence = int.from_bytes(frames[1], "big")
            last_at = now()
            if count == 0:
                first_at = last_at
                first_sequence = sequence
                sub.rcvtimeo = int(idle_timeout * 1000)
            elif sequence != previous + 1:
                if sequence <= previous:
                    out_of_order += 1
                else:
                    gaps += 1
                    missing += sequence - previous - 1
            previous = sequence
            count += 1
            if count >= events:
                break
        try:
            topic = recv()
            if topic == HEARTBEAT:
                frames = [topic, recv(), recv()]
            else:
                frames = [topic, recv(), recv(), recv(), recv(), recv()]
            if not count & 1023 and sub.rcvmore:
                malformed += 1
                sub.recv_multipart()  # resynchronise on message boundaries
        except zmq.Again:
            break
    cpu = _cpu() - cpu
    sub.close()
    context.term()
    span = last_at - first_at
    _emit(
        {
            "cpu_seconds": cpu,
            "received": count,
            "expected": events,
            "first_sequence": first_sequence,
            "last_sequence": previous,
            "gaps": gaps,
            "missing_inside": missing,
            "lost": max(events - count, 0) + out_of_order,
            "out_of_order": out_of_order,
            "malformed": malformed,
            "heartbeats": heartbeats,
            "t_first": first_at,
            "t_last": last_at,
            "rate": (count - 1) / span if count > 1 and span > 0 else 0.0,
        }
    )


_stop = False


def _request_stop(signum: int, frame: object) -> None:
    global _stop
    _stop = True


def forward(collector: str, publisher: str) -> None:
    import zmq

    signal.signal(signal.SIGTERM, _request_stop)
    context = zmq.Context()
    router = context.socket(zmq.ROUTER)
    router.rcvhwm = 10_000  # the server's collector HWM
    router.linger = 0
    router.bind(collector)
    pub = context.socket(zmq.PUB)
    pub.sndhwm = 200_000  # the server's publish HWM
    pub.linger = 0
    pub.bind(publisher)
    recv = router.recv_multipart
    send = pub.send
    more = zmq.SNDMORE
    noblock = zmq.NOBLOCK
    sequence = 0
    next_beat = 0.0
    _ready()
    while not _stop:
        try:
            _, topic, _, producer, timestamp, uuid, data = recv(noblock)
        except zmq.Again:
            now = time.monotonic()
            if now >= next_beat:
                pub.send_multipart([HEARTBEAT, sequence.to_bytes(8, "big"), b"baseline"])
                next_beat = now + 1.0
            router.poll(100)
            continue
        except ValueError:
            continue  # not 7 frames: drop, as the server would
        sequence += 1
        send(topic, more)
        send(sequence.to_bytes(8, "big"), more)
        send(producer, more)
        send(timestamp, more)
        send(uuid, more)
        send(data)
        if not sequence & 4095:
            now = time.monotonic()
            if now >= next_beat:
                pub.send_multipart([HEARTBEAT, sequence.to_bytes(8, "big"), b"baseline"])
                next_beat = now + 1.0
    _emit({"forwarded": sequence})
    router.close()
    pub.close()
    context.term()


def snapshot_server(endpoint: str, events: int) -> None:
    import zmq

    context = zmq.Context()
    router = context.socket(zmq.ROUTER)
    router.sndhwm = 500  # the server's snapshot HWM (bus.eventbus.config.DEFAULT_SNAPSHOT_HWM)
    router.router_mandatory = 1  # block rather than drop at the HWM
    router.linger = 0
    router.bind(endpoint)
    uuid_format = _uuid_format()
    messages = [
        [b"SYNC", topic, (n + 1).to_bytes(8, "big"), producer, timestamp, uuid, data]
        for n, (topic, _, producer, timestamp, uuid, data) in enumerate(
            pubs(0, events, uuid_format)
        )
    ]
    send = router.send
    more = zmq.SNDMORE
    _ready()
    while True:
        frames = router.recv_multipart()
        identity = frames[0]
        if len(frames) < 3 or frames[1] != b"SYNCSTART":
            continue
        spec = frames[2]
        for message in messages:
            send(identity, more)
            for frame in message[:-1]:
                send(frame, more)
            send(message[-1])
        router.send_multipart([identity, b"SYNCEND", spec, events.to_bytes(8, "big")])


def snapshot_client(endpoint: str, events: int, repeat: int) -> None:
    import zmq

    context = zmq.Context()
    runs = []
    for _ in range(repeat):
        dealer = context.socket(zmq.DEALER)
        dealer.rcvhwm = 0
        dealer.linger = 0
        dealer.rcvtimeo = 60_000
        dealer.connect(endpoint)
        recv = dealer.recv
        count = gaps = malformed = 0
        previous = 0
        end_sequence = -1
        started = time.monotonic()
        dealer.send_multipart([b"SYNCSTART", b"", b"\x00" * 8])
        while True:
            # Protocol-aware reads: SYNC is 7 frames, SYNCEND 3 (see subscribe()).
            command = recv()
            if command == b"SYNC":
                frames = [command, recv(), recv(), recv(), recv(), recv(), recv()]
                sequence = int.from_bytes(frames[2], "big")
                if sequence != previous + 1:
                    gaps += 1
                previous = sequence
                count += 1
                if not count & 1023 and dealer.rcvmore:
                    malformed += 1
                    dealer.recv_multipart()
            elif command == b"SYNCEND":
                frames = [command, recv(), recv()]
                end_sequence = int.from_bytes(frames[2], "big")
                break
            else:
                malformed += 1
                if dealer.rcvmore:
                    dealer.recv_multipart()
        finished = time.monotonic()
        dealer.close()
        runs.append(
            {
                "seconds": finished - started,
                "syncs": count,
                "gaps": gaps,
                "malformed": malformed,
                "syncend_sequence": end_sequence,
                "complete": count == events
                and gaps == 0
                and malformed == 0
                and end_sequence == events,
            }
        )
    context.term()
    _emit({"runs": runs})


def twisted_snapshot(address: str, events: int) -> None:

    from twisted.internet import reactor as global_reactor
    from twisted.internet import task

    from bus.eventbus.client import EventBusSubscriber

    reactor: Any = global_reactor

    result: dict[str, object] = {"complete": False}
    delivered = 0

    def on_event(event: object) -> None:
        nonlocal delivered
        delivered += 1

    subscriber = EventBusSubscriber([address], (), on_event, heartbeat_timeout=60.0)

    def check_end() -> None:
        if not subscriber.core.syncing:
            result["seconds"] = time.monotonic() - started
            result["complete"] = delivered == events and subscriber.last_sequence == events
            finish()

    def last_delivered(sequence: int) -> None:
        result["seconds_to_last_sync"] = time.monotonic() - started
        poller.start(0.0005)

    def finish() -> None:
        if poller.running:
            poller.stop()
        if reactor.running:
            reactor.stop()

    poller = task.LoopingCall(check_end)
    reactor.callLater(120, finish)
    started = time.monotonic()
    subscriber.startService()
    subscriber.wait_for(events).addCallback(last_delivered)
    reactor.run()
    subscriber.stopService()
    result["delivered"] = delivered
    result["stats"] = vars(subscriber.core.stats)
    _emit(result)


def stuck_snapshot(endpoint: str, clients: int) -> None:
    import zmq

    context = zmq.Context()
    dealers = []
    for _ in range(clients):
        dealer = context.socket(zmq.DEALER)
        dealer.linger = 0
        dealer.connect(endpoint)
        dealer.send_multipart([b"SYNCSTART", b"", ZERO_SEQUENCE])
        dealers.append(dealer)
    _ready()
    sys.stdin.readline()
    for dealer in dealers:
        dealer.close()
    context.term()
    _emit({"clients": clients})


_TIMED_HEAD = b"\x82\xa1t\xcf"  # fixmap(2), "t", uint64
_TIMED_PAD = b"x" * (PAYLOAD_BYTES - len(_TIMED_HEAD) - 8 - len(_PAD_HEAD) - 1)
_TIMED_TAIL = _PAD_HEAD + bytes([len(_TIMED_PAD)]) + _TIMED_PAD


def paced_publish(endpoint: str, rate: float, seconds: float) -> None:
    import zmq

    context = zmq.Context()
    dealer = context.socket(zmq.DEALER)
    dealer.sndhwm = 100_000
    dealer.linger = -1
    dealer.connect(endpoint)
    uuid_format = _uuid_format()
    count = int(rate * seconds)
    uuids = [uuid_format % n for n in range(count)]
    _ready()
    _wait_go()
    more = zmq.SNDMORE
    send = dealer.send
    clock = time.monotonic_ns
    started = time.monotonic()
    late = 0
    for n in range(count):
        due = started + n / rate
        pause = due - time.monotonic()
        if pause > 0:
            time.sleep(pause)
        elif pause < -0.001:
            late += 1
        send(TOPICS[n & 15], more)
        send(ZERO_SEQUENCE, more)
        send(PRODUCER, more)
        send(TIMESTAMP, more)
        send(uuids[n], more)
        send(_TIMED_HEAD + clock().to_bytes(8, "big") + _TIMED_TAIL)
    dealer.close()
    context.term()
    _emit({"sent": count, "late": late, "seconds": time.monotonic() - started})


def _subscribed(context: Any, endpoint: str) -> Any:
    """A SUB to every topic at ``endpoint``, once its first heartbeat came (subscribed)."""
    import zmq

    sub = context.socket(zmq.SUB)
    sub.rcvhwm = 0
    sub.linger = 0
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    sub.connect(endpoint)
    sub.rcvtimeo = 30_000
    sub.recv_multipart()  # a heartbeat: subscribed
    return sub


def latency_subscribe(endpoint: str, events: int, warmup: int = 200) -> None:
    import zmq

    context = zmq.Context()
    sub = _subscribed(context, endpoint)
    _ready()
    clock = time.monotonic_ns
    latencies: list[int] = []
    count = 0
    previous = -1
    gaps = 0
    sub.rcvtimeo = 120_000
    offset = len(_TIMED_HEAD)
    try:
        while count < events:
            frames = sub.recv_multipart()
            now = clock()
            if frames[0] == HEARTBEAT or len(frames) != 6:
                continue
            sequence = int.from_bytes(frames[1], "big")
            if previous >= 0 and sequence != previous + 1:
                gaps += 1
            previous = sequence
            count += 1
            if count > warmup:
                latencies.append(now - int.from_bytes(frames[5][offset : offset + 8], "big"))
            sub.rcvtimeo = 10_000
    except zmq.Again:
        pass
    sub.close()
    context.term()
    latencies.sort()

    def pick(q: float) -> float:
        return (
            latencies[min(int(q * len(latencies)), len(latencies) - 1)] / 1e6 if latencies else 0.0
        )

    _emit(
        {
            "received": count,
            "gaps": gaps,
            "p50_ms": pick(0.5),
            "p90_ms": pick(0.9),
            "p99_ms": pick(0.99),
            "p999_ms": pick(0.999),
            "max_ms": latencies[-1] / 1e6 if latencies else 0.0,
        }
    )


def soak_publish(endpoint: str, rate: float, seconds: float, topics: int) -> None:
    import zmq

    context = zmq.Context()
    dealer = context.socket(zmq.DEALER)
    dealer.sndhwm = 100_000
    dealer.linger = -1
    dealer.connect(endpoint)
    uuid_format = _uuid_format()
    names = [b"/soak/%05d/" % t for t in range(topics)]
    count = int(rate * seconds)
    _ready()
    _wait_go()
    more = zmq.SNDMORE
    send = dealer.send
    clock = time.monotonic_ns
    started = time.monotonic()
    late = 0
    n = 0
    while n < count:
        due = started + n / rate
        pause = due - time.monotonic()
        if pause > 0:
            time.sleep(pause)
        elif pause < -0.001:
            late += 1
        # A millisecond's worth at once: per-event sleeps cost the machine more than the
        # pacing is worth.
        burst = min(count, n + max(1, int(rate / 1000)))
        while n < burst:
            send(names[n % topics], more)
            send(ZERO_SEQUENCE, more)
            send(PRODUCER, more)
            send(TIMESTAMP, more)
            send(uuid_format % n, more)
            send(_TIMED_HEAD + clock().to_bytes(8, "big") + _TIMED_TAIL)
            n += 1
    dealer.close()
    context.term()
    _emit({"sent": count, "late": late, "seconds": time.monotonic() - started, "cpu": _cpu()})


def soak_subscribe(endpoint: str, samples_path: str) -> None:
    from array import array

    import zmq

    context = zmq.Context()
    sub = _subscribed(context, endpoint)
    _ready()
    poller = zmq.Poller()
    poller.register(sub, zmq.POLLIN)
    poller.register(sys.stdin.fileno(), zmq.POLLIN)
    samples = array("q")
    clock = time.monotonic_ns
    offset = len(_TIMED_HEAD)
    previous = -1
    gaps = heartbeats = 0
    stdin = sys.stdin.fileno()
    while True:
        ready = dict(poller.poll(1000))
        if stdin in ready:
            break
        if sub not in ready:
            continue
        while True:
            try:
                frames = sub.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                break
            now = clock()
            if frames[0] == HEARTBEAT or len(frames) != 6:
                heartbeats += 1
                continue
            sequence = int.from_bytes(frames[1], "big")
            if previous >= 0 and sequence != previous + 1:
                gaps += 1
            previous = sequence
            samples.append(int.from_bytes(frames[5][offset : offset + 8], "big"))
            samples.append(now)
    with open(samples_path, "wb") as out:
        samples.tofile(out)
    sub.close()
    context.term()
    _emit({"received": len(samples) // 2, "gaps": gaps, "heartbeats": heartbeats, "cpu": _cpu()})


def connect_churn(endpoint: str, connections: int) -> None:
    import zmq
    from zmq.utils.monitor import recv_monitor_message

    context = zmq.Context()
    _ready()
    _wait_go()
    failed = 0
    started = time.monotonic()
    for _ in range(connections):
        dealer = context.socket(zmq.DEALER)
        dealer.linger = 0
        secure(dealer)
        monitor = dealer.get_monitor_socket(
            zmq.EVENT_HANDSHAKE_SUCCEEDED | zmq.EVENT_HANDSHAKE_FAILED_AUTH
            | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL | zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL
        )  # fmt: skip
        dealer.connect(endpoint)
        event = recv_monitor_message(monitor)["event"]
        failed += event != zmq.EVENT_HANDSHAKE_SUCCEEDED
        dealer.disable_monitor()
        monitor.close()
        dealer.close()
    elapsed = time.monotonic() - started
    context.term()
    _emit({"connections": connections, "failed": failed, "rate": connections / elapsed})


# -- nats-py on the same servers (bench/eventbus_cluster.py --only natspy) -------------------


def natspy_publish(url: str, stream: str, events: int, batch: int) -> None:
    """nats-py publishing ``events`` 100-byte payloads to ``stream`` with acknowledged
    publishes, ``batch`` in flight at a time (what a nats-py user writes for throughput)."""
    import asyncio

    import nats

    async def run() -> dict[str, object]:
        client = await nats.connect(url.split(","), max_reconnect_attempts=-1)
        js = client.jetstream()
        subject = f"{stream}.events"
        bodies = [payload(n) for n in range(min(events, batch))]
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(None, _ready)
        await loop.run_in_executor(None, _wait_go)
        cpu, started = _cpu(), time.monotonic()
        last = 0
        for first in range(0, events, batch):
            count = min(batch, events - first)
            acks = await asyncio.gather(*(js.publish(subject, bodies[i]) for i in range(count)))
            last = int(acks[-1].seq)
        finished = time.monotonic()
        await client.close()
        return {
            "sent": events,
            "last_seq": last,
            "cpu_seconds": _cpu() - cpu,
            "t_start": started,
            "t_sent": finished,
            "send_rate": events / max(finished - started, 1e-9),
        }

    _emit(asyncio.run(run()))


def natspy_subscribe(url: str, stream: str, events: int) -> None:
    """nats-py reading ``stream`` with an ordered consumer (push, flow control, heartbeats:
    nats-py's way to follow a stream), checking the stream sequences are contiguous."""
    import asyncio

    import nats

    async def run() -> dict[str, object]:
        client = await nats.connect(url.split(","), max_reconnect_attempts=-1)
        js = client.jetstream()
        done = asyncio.get_running_loop().create_future()
        state = {"count": 0, "previous": 0, "gaps": 0, "first": 0.0, "last": 0.0}
        now = time.monotonic

        async def got(message: object) -> None:
            sequence = message.metadata.sequence.stream  # type: ignore[attr-defined]
            state["last"] = now()
            if state["count"] == 0:
                state["first"] = state["last"]
            elif sequence != state["previous"] + 1:
                state["gaps"] += 1
            state["previous"] = sequence
            state["count"] += 1
            if state["count"] >= events and not done.done():
                done.set_result(None)

        subscription = await js.subscribe(
            f"{stream}.>",
            cb=got,
            ordered_consumer=True,
            pending_msgs_limit=-1,
            pending_bytes_limit=-1,
        )
        cpu = _cpu()
        _ready()
        with contextlib.suppress(TimeoutError):  # what arrived is the result
            await asyncio.wait_for(done, timeout=300)
        cpu = _cpu() - cpu
        await subscription.unsubscribe()
        await client.close()
        count, span = state["count"], state["last"] - state["first"]
        return {
            "cpu_seconds": cpu,
            "received": count,
            "lost": max(events - int(count), 0),
            "gaps": state["gaps"],
            "last_sequence": state["previous"],
            "t_first": state["first"],
            "t_last": state["last"],
            "rate": (count - 1) / span if count > 1 and span > 0 else 0.0,
        }

    _emit(asyncio.run(run()))


def main(argv: list[str]) -> None:
    role, *args = argv
    if role == "paced-publish":
        paced_publish(args[0], float(args[1]), float(args[2]))
        return
    if role == "latency-subscribe":
        latency_subscribe(args[0], int(args[1]))
        return
    if role == "soak-publish":
        soak_publish(args[0], float(args[1]), float(args[2]), int(args[3]))
        return
    if role == "soak-subscribe":
        soak_subscribe(args[0], args[1])
        return
    if role == "natspy-publish":
        natspy_publish(args[0], args[1], int(args[2]), int(args[3]))
        return
    if role == "natspy-subscribe":
        natspy_subscribe(args[0], args[1], int(args[2]))
        return
    if role == "publish":
        publish(args[0], int(args[1]))
    elif role == "subscribe":
        subscribe(args[0], int(args[1]), *(float(a) for a in args[2:3]))
    elif role == "forward":
        forward(args[0], args[1])
    elif role == "snapshot-server":
        snapshot_server(args[0], int(args[1]))
    elif role == "snapshot-client":
        snapshot_client(args[0], int(args[1]), int(args[2]))
    elif role == "twisted-snapshot":
        twisted_snapshot(args[0], int(args[1]))
    elif role == "connect-churn":
        connect_churn(args[0], int(args[1]))
    elif role == "stuck-snapshot":
        stuck_snapshot(args[0], int(args[1]))
    else:
        raise SystemExit(f"unknown role {role!r}")


if __name__ == "__main__":
    main(sys.argv[1:])
