"""Event BUS on a NATS JetStream cluster: delivered rate, snapshot, and the waits at faults.

Everything on 127.0.0.1, real processes: nats-server nodes (``bus.nats.servers``, JetStream
on, fresh store directories for every run, so runs never share a stream) and Event BUS
front-ends (``twistd -n eventbus --store jetstream --nats URLS --nats-replicas R``).
Beside them, in the same run, the default server (``twistd -n eventbus``, its log in
SQLite) is the baseline.

1. *Delivered*: the raw pyzmq publisher -> COLLECTOR -> log -> PUB -> raw subscriber of
   ``eventbus_throughput.py`` (6-frame events, 100-byte payload; the subscriber checks
   the sequences are contiguous) against the SQLite server, a front-end of an R1 stream
   (one nats-server) and a front-end of an R3 stream (three clustered nats-servers),
   alternated ``--repeat`` times. Also the CPU per event of the front-end and of the
   nats-servers.
2. *Snapshot*: the SQLite server and a front-end of an R3 stream each hold the same
   ``--snapshot-events`` events (published through their collectors); a raw DEALER
   times SYNCSTART (all topics, from 0) -> SYNCEND, checking every SYNC arrived,
   contiguous (``eventbus_snapshot.py``'s client), alternating between the two.
3. *Waits at faults*: three nats-servers, an R3 stream, two front-ends A and B. A paced
   publisher sends ``--rate`` events a second to B; the project's subscriber,
   ``bus.eventbus.client.EventBusSubscriber([A, B])`` with its defaults, in a process of
   its own, follows A and notes when each event arrives. A few seconds in: (a) A is
   killed (kill -9), or (b) the nats-server that leads the stream is killed (kill -9).
   Measured: the subscriber's longest silence from then on (from the last event before
   it to the first after), and that every event was delivered once, in order.
4. *Restarts*: three nats-servers (lame-duck timings of ``bus-cluster``), an R3 stream, two
   front-ends A and B. A ``ConfirmedPublisher([B, A])`` sends ``--restart-rate`` events a
   second, an ``EventBusSubscriber([A, B])`` follows, each in a process of its own, each
   noting what it was told (the sequence each event was confirmed at; each delivery and
   when). Then, in one run, a planned restart of each nats-server in turn (``bus.nats.roll``:
   its peers current, its leaders stepped down, lame-duck mode, started again, its
   replicas current) and of each front-end (SIGTERM, started again); in another, the same
   processes killed (kill -9) in turn, each started again once the stream has a leader.
   Measured: the subscriber's longest silence in each restart's window (from the first
   step to its replicas current, or the front-end serving again), beside its longest
   silence over as long a window before the first (the baseline); and the checker over
   what both clients saw: every event sent confirmed, each confirmed event delivered once
   at the sequence it was confirmed with, the deliveries gapless and in order. Also the
   CPU per event of the front-ends and of the nats-servers over the run.

    python bench/eventbus_cluster.py [--events 100000] [--repeat 2] [--snapshot-events 200000]
        [--snapshot-repeat 1] [--faults 2] [--rate 1000] [--fault-seconds 8] [--warmup 3]
        [--restarts 1] [--restart-rate 500] [--only throughput,snapshot,faults,restarts]

5. *Against nats-py* (``--only natspy``, not run by default): the same number of events
   through an R3 front-end (part 1's raw clients) and, on three fresh nats-servers, through
   nats-py alone: acknowledged publishes (``NATSPY_BATCH`` in flight) into an R3 stream and
   an ordered consumer reading it. Measured: events/s from the first publish to the last
   delivery, and the CPU per event of every process (clients, front-end, nats-servers).
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import os
import re
import signal
import sys
import time
from collections.abc import Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

from _common import (
    HOST,
    PYTHON,
    BusServer,
    Cleanup,
    CpuAccount,
    Figure,
    Worker,
    add_common_arguments,
    cpu_latency,
    cpu_of,
    cpu_seconds,
    fmt_rate,
    machine,
    machine_busy_seconds,
    median,
    server_prefix,
    summary,
    terminate_on_sigterm,
    wait_for_quiet,
    wait_until,
    workdir,
)

from bus.nats.servers import NatsCluster

THIS = Path(__file__).resolve()

#: Delivered events/s of an R3 front-end, and the snapshot's rate, against the SQLite
#: server's in the same run.
TARGET_DELIVERED_RATIO = 0.5
TARGET_SNAPSHOT_RATIO = 0.5
#: The subscriber's longest silence after kill -9 of its front-end / of the stream leader.
TARGET_FRONT_END_KILL = 2.0
TARGET_LEADER_KILL = 5.0
#: The subscriber's longest silence during a planned restart of a nats-server (issue 44).
TARGET_PLANNED_RESTART = 1.0
#: Seconds of flow before each restart and after the last: what each restart does to the
#: subscriber shows in its window and the next one's alone.
SETTLE = 3.0
#: The nats-servers' lame-duck timings in the restarts part (``bus-cluster``'s): clients
#: leave at the lame-duck INFO, the grace period only delays the exit.
LAME_DUCK = 'lame_duck_duration: "30s"\nlame_duck_grace_period: "2s"\n'
#: A silence at the subscriber shorter than this is not noted (at 1,000 events/s the
#: usual one is 1 ms).
SILENCE = 0.05
#: What every server of this benchmark shares: status.json twice a second, no HTTP port
#: (two front-ends run at once; status.json says all the benchmark reads).
#: ``--cpu-latency-us`` adds itself here.
COMMON = ["--http-port", "0"]

KINDS = ("sqlite", "r1", "r3")
LABELS = {"sqlite": "SQLite server", "r1": "front-end, R1", "r3": "front-end, R3"}


# -- processes ------------------------------------------------------------------------------


#: What runs each nats-server: it asks the kernel to SIGTERM it when this script dies
#: (``PR_SET_PDEATHSIG`` survives the exec), as every other process a benchmark starts.
_DIE_WITH_US = (
    "import ctypes, os, sys; ctypes.CDLL(None).prctl(1, 15); os.execv(sys.argv[1], sys.argv[1:])"
)


class Nats(NatsCluster):
    """:class:`bus.nats.servers.NatsCluster`, its nodes started through :data:`_DIE_WITH_US`
    (its ``prefix``; then a node is up when its log says so)."""

    def pids(self) -> list[int]:
        return [
            node.process.pid
            for node in self.nodes
            if node.process is not None and node.process.poll() is None
        ]


def start_nats(stack: Cleanup, directory: Path, size: int, extra: str = "") -> Nats:
    # An older revision under bench/ab.py may not take a prefix: its nodes then outlive a
    # script killed with SIGKILL (any other end stops them).
    hook = {f.name for f in dataclasses.fields(NatsCluster)} & {"prefix"}
    wrap: dict[str, Any] = {"prefix": lambda node: [PYTHON, "-c", _DIE_WITH_US]} if hook else {}
    nats = Nats(directory, size=size, extra=extra, **wrap)
    stack.callback(nats.stop)
    nats.start()
    return nats


def start_front_end(
    stack: Cleanup, directory: Path, nats: Nats, prefix: Sequence[str] = ()
) -> BusServer:
    """A front-end of the stream EVENTBUS with as many replicas as ``nats`` has nodes; it
    makes the stream when missing (retrying while a new cluster has no leader yet)."""
    extra = (
        *COMMON,
        "--store", "jetstream",
        "--nats", ",".join(nats.urls),
        "--nats-replicas", str(len(nats.nodes)),
    )  # fmt: skip
    server = stack.server(BusServer(directory, prefix=prefix, extra=extra))
    # status.json comes before the first report of the stream's state (its leader).
    wait_until(
        lambda: (
            bool((server.status().get("jetstream") or {}).get("leader")) or len(nats.nodes) == 1
        ),
        30,
        "the stream to have a leader",
        server.check_alive,
        0.05,
    )
    return server


def start_bus(
    stack: Cleanup, kind: str, root: Path, prefix: Sequence[str]
) -> tuple[BusServer, Nats | None]:
    """The server of ``kind`` (``sqlite``, ``r1``, ``r3``), ready to serve."""
    if kind == "sqlite":
        return stack.server(BusServer(root / "sqlite", prefix=prefix, extra=COMMON)), None
    nats = start_nats(stack, root / "nats", 1 if kind == "r1" else 3)
    return start_front_end(stack, root / "front-end", nats, prefix), nats


# -- 1. delivered events/s ------------------------------------------------------------------


def throughput_once(
    kind: str, events: int, root: Path, prefix: Sequence[str], wait_idle: float
) -> dict[str, Any]:
    wait_for_quiet(wait_idle)
    account = CpuAccount()
    with Cleanup() as stack:
        server, nats = start_bus(stack, kind, root, prefix)
        subscriber = stack.worker("subscribe", server.publisher, events)
        subscriber.wait_ready()
        publisher = stack.worker("publish", server.collector, events)
        publisher.wait_ready()
        nats_pids = nats.pids() if nats else []
        server_cpu, nats_cpu = cpu_seconds(server.pid), cpu_of(nats_pids)
        busy = machine_busy_seconds()
        publisher.go()
        sent = publisher.result()
        received = subscriber.result()
        busy = machine_busy_seconds() - busy
        server_cpu = cpu_seconds(server.pid) - server_cpu
        nats_cpu = cpu_of(nats_pids) - nats_cpu
        status = server.status()
    return {
        "kind": kind,
        "rate": received["rate"],
        "received": received["received"],
        "lost": received["lost"],
        "gaps": received["gaps"],
        "last_sequence": received["last_sequence"],
        "end_to_end_rate": received["received"] / max(received["t_last"] - sent["t_start"], 1e-9),
        "server_cpu_us_per_event": server_cpu / events * 1e6,
        "nats_cpu_us_per_event": nats_cpu / events * 1e6,
        "publisher_cpu_us_per_event": sent["cpu_seconds"] / events * 1e6,
        "subscriber_cpu_us_per_event": received["cpu_seconds"] / events * 1e6,
        # Every process of the machine: the clients, the servers, the nats-servers.
        "machine_cpu_us_per_event": busy / events * 1e6,
        "max_timer_lag_ms": status.get("max_timer_lag_ms"),
        "accepted": status.get("accepted"),
        "jetstream": status.get("jetstream"),
        "foreign_cores": account.stop(),
    }


def describe_throughput(run: dict[str, Any]) -> str:
    text = (
        f"{LABELS[run['kind']]:<14} {fmt_rate(run['rate']):>7} ev/s delivered, lost "
        f"{run['lost']}, gaps {run['gaps']}; CPU-us/event: server {run['server_cpu_us_per_event']:.1f}"
    )
    if run["kind"] != "sqlite":
        text += f", nats-servers {run['nats_cpu_us_per_event']:.1f}"
    return text + f"; other processes {run['foreign_cores']:.2f} cores"


# -- 1b. the same events through nats-py alone ----------------------------------------------

#: Acknowledged publishes nats-py keeps in flight (``asyncio.gather`` of a batch).
NATSPY_BATCH = 500


def _natspy_stream(urls: Sequence[str], stream: str, replicas: int, deadline: float) -> None:
    """Create ``stream`` (file storage, ``replicas``) with nats-py, retrying while a new
    cluster has no meta leader yet."""
    import asyncio

    import nats
    from nats.js.api import StreamConfig

    async def create() -> None:
        client = await nats.connect(list(urls))
        try:
            await client.jetstream().add_stream(
                StreamConfig(name=stream, subjects=[f"{stream}.>"], num_replicas=replicas)
            )
        finally:
            await client.close()

    while True:
        try:
            asyncio.run(create())
            return
        except Exception as error:  # no leader yet, said many ways
            if time.monotonic() > deadline:
                raise RuntimeError(f"cannot create the stream {stream}: {error}") from error
            time.sleep(0.2)


def natspy_once(events: int, root: Path, wait_idle: float) -> dict[str, Any]:
    """nats-py publishing ``events`` events (acknowledged, :data:`NATSPY_BATCH` in flight)
    into an R3 stream and an ordered consumer reading them, on three fresh nats-servers."""
    wait_for_quiet(wait_idle)
    account = CpuAccount()
    with Cleanup() as stack:
        nats = start_nats(stack, root / "nats", 3)
        urls = ",".join(nats.urls)
        _natspy_stream(nats.urls, "BENCH", 3, time.monotonic() + 60)
        subscriber = stack.worker("natspy-subscribe", urls, "BENCH", events)
        subscriber.wait_ready()
        publisher = stack.worker("natspy-publish", urls, "BENCH", events, NATSPY_BATCH)
        publisher.wait_ready()
        nats_pids = nats.pids()
        nats_cpu = cpu_of(nats_pids)
        publisher.go()
        sent = publisher.result()
        received = subscriber.result()
        nats_cpu = cpu_of(nats_pids) - nats_cpu
    return {
        "kind": "natspy",
        "rate": received["rate"],
        "received": received["received"],
        "lost": received["lost"],
        "gaps": received["gaps"],
        "end_to_end_rate": received["received"] / max(received["t_last"] - sent["t_start"], 1e-9),
        "publisher_cpu_us_per_event": sent["cpu_seconds"] / events * 1e6,
        "subscriber_cpu_us_per_event": received["cpu_seconds"] / events * 1e6,
        "server_cpu_us_per_event": 0.0,
        "nats_cpu_us_per_event": nats_cpu / events * 1e6,
        "foreign_cores": account.stop(),
    }


def own_cpu_per_event(run: dict[str, Any]) -> float:
    """CPU per event of every process of the run: clients, front-end, nats-servers."""
    return float(
        run["publisher_cpu_us_per_event"]
        + run["subscriber_cpu_us_per_event"]
        + run["server_cpu_us_per_event"]
        + run["nats_cpu_us_per_event"]
    )


# -- 2. snapshot ----------------------------------------------------------------------------


def fill(stack: Cleanup, server: BusServer, events: int) -> None:
    publisher = stack.worker("publish", server.collector, events)
    publisher.wait_ready()
    publisher.go()
    publisher.result(timeout=900)
    server.wait_sequence(events, timeout=600)


def one_snapshot(stack: Cleanup, endpoint: str, events: int) -> dict[str, Any]:
    """One raw DEALER's SYNCSTART -> SYNCEND (a fresh process and socket). The raw client
    asks once: a snapshot the server ends unanswered leaves it silent for 60 s, then it
    exits; that run counts as stalled (no time)."""
    worker = stack.worker("snapshot-client", endpoint, events, 1)
    started = time.monotonic()
    try:
        run: dict[str, Any] = worker.result(timeout=900)["runs"][0]
    except (RuntimeError, TimeoutError) as error:
        last = str(error).strip().splitlines()[-1:] or [""]
        return {
            "seconds": float("nan"),
            "complete": False,
            "stalled_after_s": time.monotonic() - started,
            "error": last[0],
        }
    worker.proc.wait(30)
    return run


def seconds_of(run: dict[str, Any]) -> str:
    return f"{run['seconds']:.3f}" if run["complete"] else "stalled"


def completed(runs: Sequence[dict[str, Any]]) -> list[float]:
    return [r["seconds"] for r in runs if r["complete"]]


_READ_FAILED = re.compile(r"a snapshot's read failed \((?P<error>.*)\): its client asks again")


def snapshots(
    events: int, repeat: int, root: Path, prefix: Sequence[str], wait_idle: float
) -> dict[str, Any]:
    with Cleanup() as stack:
        sqlite = stack.server(BusServer(root / "sqlite", prefix=prefix, extra=COMMON))
        nats = start_nats(stack, root / "nats", 3)
        front = start_front_end(stack, root / "front-end", nats, prefix)
        started = time.monotonic()
        fill(stack, sqlite, events)
        filled_sqlite = time.monotonic()
        fill(stack, front, events)
        filled_front = time.monotonic()
        print(
            f"snapshot: stores filled with {events:,} events (SQLite "
            f"{filled_sqlite - started:.1f} s, R3 stream {filled_front - filled_sqlite:.1f} s)",
            flush=True,
        )
        runs: dict[str, list[dict[str, Any]]] = {"sqlite": [], "stream": []}
        wait_for_quiet(wait_idle)
        account = CpuAccount(live=[sqlite.pid, front.pid, *nats.pids()])
        for _ in range(repeat):
            # Alternated, pair by pair: each pair saw the same machine.
            for kind, server, others in (("sqlite", sqlite, []), ("stream", front, nats.pids())):
                before = cpu_seconds(server.pid), cpu_of(others)
                run = one_snapshot(stack, server.snapshot, events)
                run["server_cpu_us_per_sync"] = (cpu_seconds(server.pid) - before[0]) / events * 1e6
                run["nats_cpu_us_per_sync"] = (cpu_of(others) - before[1]) / events * 1e6
                runs[kind].append(run)
            print(
                f"snapshot: SQLite {seconds_of(runs['sqlite'][-1])} s, R3 stream "
                f"{seconds_of(runs['stream'][-1])} s",
                flush=True,
            )
        noise = account.stop()
        # Why a stream snapshot stalled, in the front-end's words.
        failed_reads = [
            m["error"] for m in _READ_FAILED.finditer(front.log_path.read_text(errors="replace"))
        ]
    return {
        "runs": runs,
        "foreign_cores": noise,
        "fill_seconds": filled_front - filled_sqlite,
        "failed_reads": failed_reads,
    }


# -- 3. waits at faults ---------------------------------------------------------------------


def failover_subscribe(servers: str, events: int, deadline: float) -> None:
    """Worker role (in its own process): ``EventBusSubscriber(SERVERS)`` with its defaults
    delivers events until it holds sequence EVENTS (or DEADLINE seconds passed); prints
    READY at the first event, then a JSON line: the silences longer than SILENCE (their
    bounds, on CLOCK_MONOTONIC, which every process of the machine shares), and whether
    every sequence came once, in order."""
    from twisted.internet import reactor as global_reactor

    from bus.eventbus.client import EventBusSubscriber

    reactor: Any = global_reactor
    state: dict[str, Any] = {
        "delivered": 0, "first_sequence": 0, "last_sequence": 0, "gaps": 0,
        "missing": 0, "repeated": 0, "silences": [],
    }  # fmt: skip
    last_at = 0.0

    def on_event(event: Any) -> None:
        nonlocal last_at
        now = time.monotonic()
        sequence = event.sequence
        previous = state["last_sequence"]
        if state["delivered"] == 0:
            state["first_sequence"] = sequence
            state["t_first"] = now
            print("READY", flush=True)
        elif sequence <= previous:
            state["repeated"] += 1
        elif sequence != previous + 1:
            state["gaps"] += 1
            state["missing"] += sequence - previous - 1
        if last_at and now - last_at >= SILENCE:
            state["silences"].append([last_at, now, previous, sequence])
        last_at = now
        state["delivered"] += 1
        state["last_sequence"] = max(sequence, previous)
        if sequence >= events and reactor.running:
            reactor.callLater(0, reactor.stop)

    subscriber = EventBusSubscriber(servers.split(","), (), on_event)
    reactor.callLater(deadline, reactor.stop)
    subscriber.startService()
    reactor.run()
    subscriber.stopService()
    state["t_last"] = last_at
    state["failovers"] = subscriber.failovers
    state["server"] = str(subscriber.server)
    state["heartbeat_timeout"] = subscriber.heartbeat_timeout
    state["failover_after"] = getattr(subscriber, "failover_after", None)
    state["stats"] = vars(subscriber.core.stats)
    print(json.dumps(state), flush=True)


_STORES_AGAIN = re.compile(r"JetStream stores again after (?P<seconds>[0-9.]+)s")


_ELECTED = re.compile(
    r"^\[\d+\] (?P<time>\d{4}/\d\d/\d\d \d\d:\d\d:\d\d\.\d+) \[INF\] JetStream cluster new "
    r"stream leader for '[^']* > EVENTBUS'",
    re.MULTILINE,
)


def election(nats: Nats, since: float) -> dict[str, Any]:
    """The first stream leader elected after ``since`` (wall clock), from the nats-servers'
    logs (each logs its own election, in local time, to the microsecond)."""
    found: list[tuple[float, str]] = []
    for node in nats.nodes:
        if node.log is None or not node.log.exists():
            continue
        for match in _ELECTED.finditer(node.log.read_text(errors="replace")):
            at = datetime.strptime(match["time"], "%Y/%m/%d %H:%M:%S.%f").timestamp()
            if at > since:
                found.append((at, node.name))
    if not found:
        return {"new_leader": None, "election_s": float("nan")}
    at, name = min(found)
    return {"new_leader": name, "election_s": at - since}


_META = re.compile(
    r"^\[\d+\] (?P<time>\d{4}/\d\d/\d\d \d\d:\d\d:\d\d\.\d+) \[INF\] (?:Self is new "
    r"JetStream cluster metadata leader|JetStream cluster new metadata leader: (?P<other>[^/\s]+))",
    re.MULTILINE,
)


def meta_leader(nats: Nats) -> str | None:
    """The JetStream meta leader as the nats-servers' logs last said it."""
    said: list[tuple[str, str]] = []
    for node in nats.nodes:
        if node.log is not None and node.log.exists():
            for match in _META.finditer(node.log.read_text(errors="replace")):
                said.append((match["time"], match["other"] or node.name))
    return max(said)[1] if said else None


def leader_of(server: BusServer) -> str | None:
    leader: str | None = (server.status().get("jetstream") or {}).get("leader")
    return leader


def fault_once(
    fault: str,
    root: Path,
    prefix: Sequence[str],
    rate: float,
    seconds: float,
    warmup: float,
    wait_idle: float,
) -> dict[str, Any]:
    """One fault (``front-end`` or ``leader``) while the paced publisher runs."""
    wait_for_quiet(wait_idle)
    account = CpuAccount()
    count = int(rate * seconds)
    with Cleanup() as stack:
        nats = start_nats(stack, root / "nats", 3)
        a = start_front_end(stack, root / "a", nats, prefix)
        b = start_front_end(stack, root / "b", nats)
        subscriber = Worker(
            "failover-subscribe",
            f"{HOST}:{a.port},{HOST}:{b.port}",
            count,
            seconds + 90,
            script=THIS,
        )
        stack.callback(subscriber.stop)
        publisher = stack.worker("paced-publish", b.collector, rate, seconds)
        publisher.wait_ready()
        publisher.go()
        subscriber.wait_ready()  # its first event
        time.sleep(warmup)
        result: dict[str, Any] = {"fault": fault}
        fault_wall = time.time()
        if fault == "front-end":
            fault_at = time.monotonic()
            os.kill(a.pid, signal.SIGKILL)
            assert a.proc is not None
            a.proc.wait(10)
            result["killed"] = "front-end A"
        else:
            leader = leader_of(a)
            node = next(n for n in nats.nodes if n.name == leader)
            fault_at = time.monotonic()
            nats.kill(node)
            result["killed"] = f"nats-server {leader} (the stream's leader)"
        sent = publisher.result(timeout=seconds + 120)
        received = subscriber.result(timeout=seconds + 120)
        if fault == "leader":
            result.update(election(nats, fault_wall))
        stores_again = [
            float(m["seconds"])
            for path in (a.log_path, b.log_path)
            for m in _STORES_AGAIN.finditer(path.read_text(errors="replace"))
        ]
    silences = [s for s in received["silences"] if s[1] > fault_at and s[0] >= fault_at - 1.0]
    longest = max(silences, key=lambda s: s[1] - s[0], default=None)
    result.update(
        {
            "sent": sent["sent"],
            "late_sends": sent["late"],
            "delivered": received["delivered"],
            "complete": received["delivered"] == count
            and received["first_sequence"] == 1
            and received["last_sequence"] == count
            and received["gaps"] == 0
            and received["repeated"] == 0,
            "repeated": received["repeated"],
            "missing": received["missing"] + max(count - received["last_sequence"], 0),
            "wait_s": (longest[1] - longest[0]) if longest else 0.0,
            "resumed_s": (longest[1] - fault_at) if longest else 0.0,
            "silence_started_s": (longest[0] - fault_at) if longest else 0.0,
            "failovers": received["failovers"],
            "subscriber_server": received["server"],
            "heartbeat_timeout": received["heartbeat_timeout"],
            "failover_after": received["failover_after"],
            "subscriber_stats": received["stats"],
            "stores_again_s": stores_again,
            "foreign_cores": account.stop(),
        }
    )
    return result


def describe_fault(run: dict[str, Any]) -> str:
    text = (
        f"kill -9 of {run['killed']}: the subscriber waited {run['wait_s']:.2f} s (silent from "
        f"{run['silence_started_s']:+.2f} s to {run['resumed_s']:.2f} s after the kill), "
        f"{run['delivered']:,} of {run['sent']:,} events "
        f"{'delivered once, in order' if run['complete'] else 'NOT all delivered once in order'}"
        f", failovers {run['failovers']}"
    )
    if run["fault"] == "leader":
        text += (
            f"; {run['new_leader']} elected stream leader {run['election_s']:.2f} s after"
            if run.get("new_leader")
            else "; NO new stream leader in the nats-servers' logs"
        )
    if run["stores_again_s"]:
        text += "; front-end stores again after " + ", ".join(
            f"{s:.1f}" for s in run["stores_again_s"]
        )
        text += " s"
    return text + f"; other processes {run['foreign_cores']:.2f} cores"


# -- 4. restarts ----------------------------------------------------------------------------


def _commands(handlers: dict[str, Any]) -> None:
    """Worker side: stdin's lines (``WORD REST``), each handed to the reactor's thread."""
    import threading

    from twisted.internet import reactor as global_reactor

    reactor: Any = global_reactor

    def read() -> None:
        for line in sys.stdin:
            word, _, rest = line.strip().partition(" ")
            if word in handlers:
                reactor.callFromThread(handlers[word], rest)

    threading.Thread(target=read, daemon=True).start()


def confirmed_publish(servers: str, rate: float, out: str) -> None:
    """Worker role: ``ConfirmedPublisher(SERVERS)`` prints READY once ready, sends RATE
    events a second from GO, each one's confirmation a line ``{"uuid", "seq"}`` in OUT;
    STOP ends the sending, waits (up to 180 s) until every event sent is confirmed, then
    prints a JSON line of its counts."""
    from twisted.internet import reactor as global_reactor
    from twisted.internet import task

    from bus.eventbus.confirmed import ConfirmedPublisher

    reactor: Any = global_reactor
    publisher = ConfirmedPublisher(servers.split(","), "bench-restarts", failover_after=1.0)
    records = open(out, "w")  # noqa: SIM115 - written to until the process ends
    state = {"sent": 0, "confirmed": 0, "failed": 0, "top": 0}
    burst = max(int(rate / 50), 1)

    def stored(sequence: int, event_id: str) -> None:
        state["confirmed"] += 1
        state["top"] = max(state["top"], sequence)
        records.write(f'{{"uuid": "{event_id}", "seq": {sequence}}}\n')

    def lost(failure: Any) -> None:
        state["failed"] += 1

    def tick() -> None:
        for _ in range(burst):
            number = state["sent"]
            state["sent"] += 1
            event_id = f"00000000-0000-4000-8000-{number:012x}"
            sent = publisher.publish(f"/restarts/{number % 16}/", number, event_id=event_id)
            sent.addCallbacks(stored, lost, callbackArgs=(event_id,))

    sending = task.LoopingCall(tick)
    deadline = [0.0]

    def finish() -> None:
        if publisher.unconfirmed and time.monotonic() < deadline[0]:
            reactor.callLater(0.1, finish)
            return
        records.close()
        print(json.dumps({**state, "unconfirmed": publisher.unconfirmed,
                          "resent": publisher.resent}), flush=True)  # fmt: skip
        reactor.stop()

    def stop(_: str) -> None:
        if sending.running:
            sending.stop()
        deadline[0] = time.monotonic() + 180
        finish()

    _commands({"GO": lambda _: sending.start(1 / 50), "STOP": stop})
    publisher.startService()
    publisher.when_ready().addCallback(lambda _: print("READY", flush=True))
    reactor.run()


def record_subscribe(servers: str, out: str) -> None:
    """Worker role: ``EventBusSubscriber(SERVERS)`` (its defaults) notes every delivery
    (time on CLOCK_MONOTONIC, sequence, uuid), prints READY at the first; ``UNTIL N`` makes
    it stop once it holds sequence N (or 180 s later), write its deliveries to OUT (a JSON
    list) and print a JSON line of its counts."""
    from twisted.internet import reactor as global_reactor

    from bus.eventbus.client import EventBusSubscriber

    reactor: Any = global_reactor
    seen: list[tuple[float, int, str]] = []
    until = [0, 0.0]

    def on_event(event: Any) -> None:
        if not seen:
            print("READY", flush=True)
        seen.append((time.monotonic(), event.sequence, event.uuid.decode()))
        if until[0] and event.sequence >= until[0] and reactor.running:
            reactor.callLater(0, reactor.stop)

    subscriber = EventBusSubscriber(servers.split(","), (), on_event)

    def stop_at(number: str) -> None:
        until[0] = int(number)
        if seen and seen[-1][1] >= until[0]:
            reactor.stop()
        else:
            reactor.callLater(180, lambda: reactor.running and reactor.stop())

    _commands({"UNTIL": stop_at})
    subscriber.startService()
    reactor.run()
    subscriber.stopService()
    Path(out).write_text(json.dumps(seen))
    print(json.dumps({"delivered": len(seen), "failovers": subscriber.failovers,
                      "last_sequence": seen[-1][1] if seen else 0}), flush=True)  # fmt: skip


class CpuTally:
    """CPU seconds of processes that come and go (a restarted server is another process),
    by kind: each process's time when first seen (0 for one started during the run) and
    its last reading, sampled a few times a second in a thread."""

    def __init__(self, processes: Any) -> None:
        import threading

        self._processes = processes  # () -> [(kind, pid)]
        self._first: dict[int, float] = {}
        self._last: dict[int, float] = {}
        self._kind: dict[int, str] = {}
        self._started = False
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _sample(self) -> None:
        for kind, pid in self._processes():
            try:
                now = cpu_seconds(pid)
            except (OSError, IndexError):
                continue
            if pid not in self._first:
                # The processes there at the start count from then; any other from its start.
                self._first[pid] = now if not self._started else 0.0
                self._kind[pid] = kind
            self._last[pid] = now

    def _run(self) -> None:
        while not self._stop.wait(0.2):
            self._sample()

    def start(self) -> CpuTally:
        self._sample()
        self._started = True
        self._thread.start()
        return self

    def stop(self) -> dict[str, float]:
        self._stop.set()
        self._thread.join(5)
        self._sample()
        totals: dict[str, float] = {}
        for pid, first in self._first.items():
            kind = self._kind[pid]
            totals[kind] = totals.get(kind, 0.0) + self._last[pid] - first
        return totals


def _longest_silence(
    times: Sequence[float], start: float, end: float
) -> tuple[float, float, float]:
    """The longest gap between two deliveries that overlaps [start, end] (with deliveries
    at both ends): (length, its start, its end)."""
    best = (0.0, start, start)
    for before, after in itertools.pairwise(times):
        if after > start and before < end and after - before > best[0]:
            best = (after - before, before, after)
    return best


def restarts_once(
    mode: str, root: Path, prefix: Sequence[str], rate: float, quiet: float, wait_idle: float
) -> dict[str, Any]:
    """Each nats-server, then each front-end, restarted in turn (``planned`` or ``kill``)
    while the confirming publisher and the subscriber run; the silences and the check."""
    from bus.nats.blocking import Connection
    from bus.nats.jsapi import JetStreamError as jsapi_error
    from bus.nats.roll import Group, JetStreamApi, Roll, RollError, Server

    wait_for_quiet(wait_idle)
    account = CpuAccount()
    steps: list[str] = []
    windows: list[dict[str, Any]] = []
    with Cleanup() as stack:
        nats = start_nats(stack, root / "nats", 3, LAME_DUCK)
        a = start_front_end(stack, root / "a", nats, prefix)
        b = start_front_end(stack, root / "b", nats)
        subscriber = Worker(
            "record-subscribe", f"{HOST}:{a.port},{HOST}:{b.port}", root / "sub.json", script=THIS
        )
        stack.callback(subscriber.stop)
        publisher = Worker(
            "confirmed-publish", f"{HOST}:{b.port},{HOST}:{a.port}", rate, root / "pub.jsonl",
            script=THIS,
        )  # fmt: skip
        stack.callback(publisher.stop)
        publisher.wait_ready()
        publisher.go()
        subscriber.wait_ready()

        def processes() -> list[tuple[str, int]]:
            found = [
                ("front-ends", end.pid) for end in (a, b) if end.proc and end.proc.poll() is None
            ]
            return found + [("nats-servers", pid) for pid in nats.pids()]

        cpu = CpuTally(processes).start()
        cpu_from = time.monotonic()
        api = JetStreamApi(nats.urls, lambda urls: Connection(urls, name="bench", echo=False))
        roll = Roll(api, say=lambda line: steps.append(f"{time.monotonic():.3f} {line}"))
        quiet_from = time.monotonic()
        time.sleep(quiet)
        quiet_until = time.monotonic()

        class Local:
            """How the roll stops and starts this run's nats-servers."""

            def stop(self, what: Any) -> None:
                node = next(n for n in nats.nodes if n.name == what.name)
                assert node.process is not None
                os.kill(node.process.pid, signal.SIGUSR2)  # nats-server --signal ldm=PID
                node.process.wait(120)

            def start(self, what: Any) -> None:
                nats.start(next(n for n in nats.nodes if n.name == what.name), timeout=60)

        stream = Group("EVENTBUS", "", None)
        for node in nats.nodes:
            time.sleep(SETTLE)
            led = api.group(stream).leader
            meta = meta_leader(nats)
            held = sorted(
                role
                for end, name in ((a, "A"), (b, "B"))
                for server in (end.status().get("jetstream") or {}).get("servers") or ()
                if server.get("url") == node.url
                for role in (f"{name} {r}" for r in server.get("ours") or ())
            )
            began = time.monotonic()
            if mode == "planned":
                roll.restart(Server(node.name, node.url), Local())
            else:
                nats.kill(node)
                api.avoid(node.url)

                def led_elsewhere(name: str = node.name) -> bool:
                    try:
                        return api.group(stream).leader not in (None, name)
                    except (OSError, jsapi_error):
                        return False  # no answer while there is no leader

                wait_until(led_elsewhere, 120, "a stream leader", None, 0.1)
                starting = time.monotonic()
                nats.start(node, timeout=60)
                try:
                    roll.wait_current(node.name, since=starting)
                except RollError as error:
                    steps.append(f"{node.name}: {error}")
                api.avoid(None)
            windows.append({
                "what": f"nats-server {node.name}",
                "role": ("stream leader" if led == node.name else "follower")
                + (", meta leader" if meta == node.name else "")
                + (f"; front-end connections {', '.join(held)}" if held else ""),
                "start": began, "end": time.monotonic(),
            })  # fmt: skip
        for end, name in ((a, "A"), (b, "B")):
            time.sleep(SETTLE)
            began = time.monotonic()
            if mode == "planned":
                end.stop()  # SIGTERM: it stores what it collected, then closes its ports
            else:
                os.kill(end.pid, signal.SIGKILL)
                assert end.proc is not None
                end.proc.wait(10)
            (end.data_dir / "status.json").unlink(missing_ok=True)
            end.start()
            wait_until(
                lambda e=end: bool((e.status().get("jetstream") or {}).get("connected")),
                120, f"front-end {name} serving", end.check_alive, 0.05,
            )  # fmt: skip
            windows.append({
                "what": f"front-end {name}",
                "role": "the subscriber's" if name == "A" else "the publisher's",
                "start": began, "end": time.monotonic(),
            })  # fmt: skip
        time.sleep(SETTLE)
        assert publisher.proc.stdin is not None
        publisher.proc.stdin.write("STOP\n")
        publisher.proc.stdin.flush()
        published = publisher.result(timeout=240)
        assert subscriber.proc.stdin is not None
        subscriber.proc.stdin.write(f"UNTIL {published['top']}\n")
        subscriber.proc.stdin.flush()
        received = subscriber.result(timeout=240)
        cpu_by_kind = cpu.stop()
        cpu_wall = time.monotonic() - cpu_from
        api.close()
        stores_again = [
            float(m["seconds"])
            for path in (a.log_path, b.log_path)
            for m in _STORES_AGAIN.finditer(path.read_text(errors="replace"))
        ]
    deliveries = json.loads((root / "sub.json").read_text())
    confirmed = [json.loads(line) for line in (root / "pub.jsonl").read_text().splitlines()]
    times = [d[0] for d in deliveries]
    for window in windows:
        # What a restart does may show a moment after its last step (a reader made again).
        length, since, _ = _longest_silence(times, window["start"], window["end"] + SETTLE / 2)
        window.update(
            silence_s=length,
            silence_from_s=since - window["start"],
            window_s=window["end"] - window["start"],
        )
    baseline = _longest_silence(times, quiet_from, quiet_until)[0]
    anomalies = check_deliveries(deliveries, confirmed, published)
    events = max(len(deliveries), 1)
    return {
        "mode": mode,
        "windows": windows,
        "baseline_silence_s": baseline,
        "sent": published["sent"],
        "confirmed": published["confirmed"],
        "unconfirmed": published["unconfirmed"],
        "resent": published["resent"],
        "delivered": len(deliveries),
        "failovers": received["failovers"],
        "anomalies": anomalies,
        "stores_again_s": stores_again,
        "steps": steps,
        # Wall clock less CLOCK_MONOTONIC: the servers' logs are in wall-clock time.
        "wall_offset": time.time() - time.monotonic(),
        "cpu_us_per_event": {kind: seconds / events * 1e6 for kind, seconds in cpu_by_kind.items()},
        "cpu_cores": {kind: seconds / cpu_wall for kind, seconds in cpu_by_kind.items()},
        "foreign_cores": account.stop(),
    }


def check_deliveries(
    deliveries: Sequence[Sequence[Any]],
    confirmed: Sequence[dict[str, Any]],
    published: dict[str, Any],
) -> list[str]:
    """What the clients saw, checked: every event sent was confirmed; the subscriber got
    each sequence from 1 once, in order, with no hole; each confirmed event is delivered
    once, at the sequence it was confirmed with. One line per anomaly."""
    anomalies = []
    if published["confirmed"] != published["sent"] or published["unconfirmed"]:
        anomalies.append(
            f"{published['sent'] - published['confirmed']} of {published['sent']} events sent "
            f"never confirmed ({published['failed']} failed)"
        )
    sequences = [d[1] for d in deliveries]
    if sequences != list(range(1, len(sequences) + 1)):
        first = next((i for i, s in enumerate(sequences, 1) if s != i), None)
        anomalies.append(f"deliveries not 1..{len(sequences)} in order (first break at {first})")
    where: dict[str, list[int]] = {}
    for _, sequence, uuid in deliveries:
        where.setdefault(uuid, []).append(sequence)
    twice = [uuid for uuid, at in where.items() if len(at) > 1]
    if twice:
        anomalies.append(f"{len(twice)} events delivered more than once: {twice[:3]}")
    missing = [r for r in confirmed if where.get(r["uuid"]) != [r["seq"]]]
    if missing:
        anomalies.append(
            f"{len(missing)} confirmed events not delivered once at their sequence: "
            + ", ".join(f"{r['uuid']}@{r['seq']}->{where.get(r['uuid'])}" for r in missing[:3])
        )
    return anomalies


def describe_restarts(run: dict[str, Any]) -> str:
    word = "planned restart" if run["mode"] == "planned" else "kill -9 and start"
    return (
        f"{word}: "
        + "; ".join(
            f"{w['what']} ({w['role']}) silent {w['silence_s']:.2f} s in {w['window_s']:.1f} s"
            for w in run["windows"]
        )
        + f"; baseline {run['baseline_silence_s']:.3f} s; {run['delivered']:,} delivered, "
        f"{run['confirmed']:,} of {run['sent']:,} confirmed, "
        + (
            "checker: no anomaly"
            if not run["anomalies"]
            else "ANOMALIES: " + "; ".join(run["anomalies"])
        )
        + f"; other processes {run['foreign_cores']:.2f} cores"
    )


# -- the summary ----------------------------------------------------------------------------


def verdict_word(ok: bool) -> str:
    return "PASS" if ok else "MISS"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--events", type=int, default=100_000, help="events per delivery run")
    parser.add_argument("--repeat", type=int, default=2, help="delivery runs of each kind")
    parser.add_argument("--snapshot-events", type=int, default=200_000)
    parser.add_argument(
        "--snapshot-repeat", type=int, default=1, help="snapshot pairs (SQLite, then the stream)"
    )
    parser.add_argument("--faults", type=int, default=2, help="runs of each fault")
    parser.add_argument("--rate", type=float, default=1000.0, help="events/s during faults")
    parser.add_argument(
        "--fault-seconds", type=float, default=8.0, help="how long the paced publisher runs"
    )
    parser.add_argument(
        "--warmup", type=float, default=3.0, help="seconds of flow before the fault"
    )
    parser.add_argument(
        "--restarts", type=int, default=1, help="runs of each kind of restart (planned, kill)"
    )
    parser.add_argument(
        "--restart-rate", type=float, default=500.0, help="events/s during the restarts"
    )
    parser.add_argument(
        "--restart-quiet",
        type=float,
        default=10.0,
        help="seconds of flow before the first restart (the baseline's window)",
    )
    parser.add_argument(
        "--only",
        default="throughput,snapshot,faults,restarts",
        help="comma-separated parts to run: throughput, snapshot, faults, restarts, and "
        "natspy (not by default: an R3 front-end against nats-py alone, same servers)",
    )
    add_common_arguments(parser)
    args = parser.parse_args()
    parts = {p.strip() for p in args.only.split(",") if p.strip()}
    unknown = parts - {"throughput", "natspy", "snapshot", "faults", "restarts"}
    if unknown:
        parser.error(f"unknown parts: {', '.join(sorted(unknown))}")
    terminate_on_sigterm()
    info = machine()
    prefix = server_prefix(args.server_prefix)
    record: dict[str, Any] = {}
    figures: dict[str, Figure] = {}
    measured: list[str] = []
    baseline: list[str] = []
    ratios: list[str] = []
    targets: list[str] = []
    details: list[tuple[str, str]] = []
    noise: list[str] = []
    verdict = True

    if args.cpu_latency_us is not None:
        COMMON.extend(["--cpu-latency-us", str(args.cpu_latency_us)])
    with (
        workdir("eventbus-cluster-", args.keep) as root,
        cpu_latency(args.cpu_latency_us) as held,
    ):
        details += held
        if "throughput" in parts:
            runs: dict[str, list[dict[str, Any]]] = {kind: [] for kind in KINDS}
            for index in range(args.repeat):
                for kind in KINDS:
                    run = throughput_once(
                        kind, args.events, root / f"{kind}-{index}", prefix, args.wait_idle
                    )
                    runs[kind].append(run)
                    print(f"run {index + 1}/{args.repeat} {describe_throughput(run)}", flush=True)
            record["throughput"] = runs
            noise.append(
                "delivery runs (SQLite, R1, R3 each time) "
                + ", ".join(
                    f"{runs[kind][index]['foreign_cores']:.2f}"
                    for index in range(args.repeat)
                    for kind in KINDS
                )
            )
            rate = {kind: median([r["rate"] for r in runs[kind]]) for kind in KINDS}
            lost = {kind: sum(r["lost"] for r in runs[kind]) for kind in KINDS}
            ratio = {kind: rate[kind] / rate["sqlite"] for kind in ("r1", "r3")}
            ok = ratio["r3"] >= TARGET_DELIVERED_RATIO and lost["r3"] == 0 and lost["r1"] == 0
            verdict = verdict and ok
            measured.append(
                f"delivered R3 {fmt_rate(rate['r3'])} ev/s, R1 {fmt_rate(rate['r1'])} ev/s"
            )
            baseline.append(f"SQLite server {fmt_rate(rate['sqlite'])} ev/s")
            ratios.append(f"R3 {ratio['r3']:.2f} x, R1 {ratio['r1']:.2f} x")
            targets.append(f"R3 delivered >= {TARGET_DELIVERED_RATIO} x SQLite, none lost")
            total = args.events * args.repeat
            for kind in ("r3", "r1"):
                line = (
                    f"{fmt_rate(rate[kind])} ev/s (median of {args.repeat}; runs "
                    + ", ".join(fmt_rate(r["rate"]) for r in runs[kind])
                    + f"), lost {lost[kind]} of {total:,}; SQLite server same run "
                    f"{fmt_rate(rate['sqlite'])} ev/s (runs "
                    + ", ".join(fmt_rate(r["rate"]) for r in runs["sqlite"])
                    + f", lost {lost['sqlite']}); ratio {ratio[kind]:.2f}"
                )
                if kind == "r3":
                    line += f"; target >= {TARGET_DELIVERED_RATIO} -> {verdict_word(ok)}"
                else:
                    line += " (reported, no target)"
                details.append((f"delivered {kind.upper()}", line))
            details.append(
                (
                    "CPU per event",
                    "; ".join(
                        f"{LABELS[kind]} "
                        f"{median([r['server_cpu_us_per_event'] for r in runs[kind]]):.1f} us"
                        + (
                            f" + nats-servers "
                            f"{median([r['nats_cpu_us_per_event'] for r in runs[kind]]):.1f} us"
                            if kind != "sqlite"
                            else ""
                        )
                        for kind in KINDS
                    ),
                )
            )
            busy_per_event = {
                kind: median([r["machine_cpu_us_per_event"] for r in runs[kind]]) for kind in KINDS
            }
            bound = (os.cpu_count() or 1) / (busy_per_event["r3"] / 1e6)
            details.append(
                (
                    "machine CPU",
                    "per event, every process (clients, servers, nats-servers): "
                    + "; ".join(f"{LABELS[kind]} {busy_per_event[kind]:.1f} us" for kind in KINDS)
                    + f"; so with all {os.cpu_count()} cores busy R3 could deliver at most "
                    f"{fmt_rate(bound)} ev/s here, {bound / rate['sqlite']:.2f} x SQLite's rate",
                )
            )
            figures["delivered_r3"] = Figure(rate["r3"], "events/s")
            figures["delivered_r1"] = Figure(rate["r1"], "events/s")
            figures["delivered_sqlite"] = Figure(rate["sqlite"], "events/s")
            figures["r3_vs_sqlite"] = Figure(ratio["r3"], "x sqlite")
            figures["r1_vs_sqlite"] = Figure(ratio["r1"], "x sqlite")
            figures["r3_cpu_per_event"] = Figure(
                median(
                    [r["server_cpu_us_per_event"] + r["nats_cpu_us_per_event"] for r in runs["r3"]]
                ),
                "us",
                better="lower",
            )

            figures["r3_front_end_cpu_per_event"] = Figure(
                median([r["server_cpu_us_per_event"] for r in runs["r3"]]), "us", better="lower"
            )
            figures["sqlite_server_cpu_per_event"] = Figure(
                median([r["server_cpu_us_per_event"] for r in runs["sqlite"]]),
                "us",
                better="lower",
            )

        if "natspy" in parts:
            pairs: dict[str, list[dict[str, Any]]] = {"r3": [], "natspy": []}
            for index in range(args.repeat):
                bus_run = throughput_once(
                    "r3", args.events, root / f"natspy-r3-{index}", prefix, args.wait_idle
                )
                py_run = natspy_once(args.events, root / f"natspy-{index}", args.wait_idle)
                pairs["r3"].append(bus_run)
                pairs["natspy"].append(py_run)
                for run in (bus_run, py_run):
                    label = "nats-py alone, R3" if run is py_run else LABELS["r3"]
                    print(
                        f"run {index + 1}/{args.repeat} {label:<18} "
                        f"{fmt_rate(run['end_to_end_rate']):>7} ev/s end to end, lost "
                        f"{run['lost']}, gaps {run['gaps']}; CPU-us/event: publisher "
                        f"{run['publisher_cpu_us_per_event']:.1f}, subscriber "
                        f"{run['subscriber_cpu_us_per_event']:.1f}, front-end "
                        f"{run['server_cpu_us_per_event']:.1f}, nats-servers "
                        f"{run['nats_cpu_us_per_event']:.1f}; other processes "
                        f"{run['foreign_cores']:.2f} cores",
                        flush=True,
                    )
            record["natspy"] = pairs
            noise.append(
                "bus vs nats-py runs "
                + ", ".join(f"{r['foreign_cores']:.2f}" for r in pairs["r3"] + pairs["natspy"])
            )
            end = {k: median([r["end_to_end_rate"] for r in v]) for k, v in pairs.items()}
            cpu = {k: median([own_cpu_per_event(r) for r in v]) for k, v in pairs.items()}
            lost_pairs = sum(r["lost"] for v in pairs.values() for r in v)
            verdict = verdict and lost_pairs == 0
            measured.append(f"R3 through the bus {fmt_rate(end['r3'])} ev/s end to end")
            baseline.append(f"nats-py alone on R3 {fmt_rate(end['natspy'])} ev/s")
            ratios.append(f"bus / nats-py {end['r3'] / end['natspy']:.2f} x")
            targets.append("bus vs nats-py: reported (no target), none lost")
            details.append(
                (
                    "bus vs nats-py",
                    f"end to end (first publish to last delivery): the bus (raw pyzmq clients, "
                    f"a front-end) {fmt_rate(end['r3'])} ev/s, nats-py (acknowledged publishes, "
                    f"{NATSPY_BATCH} in flight; an ordered consumer) "
                    f"{fmt_rate(end['natspy'])} ev/s, {end['r3'] / end['natspy']:.2f} x; "
                    f"CPU per event of every process: bus {cpu['r3']:.1f} us, nats-py "
                    f"{cpu['natspy']:.1f} us; lost {lost_pairs}",
                )
            )
            figures["bus_vs_natspy"] = Figure(end["r3"] / end["natspy"], "x nats-py")
            figures["bus_cpu_per_event_all"] = Figure(cpu["r3"], "us", better="lower")

        if "snapshot" in parts:
            events = args.snapshot_events
            snap = snapshots(events, args.snapshot_repeat, root / "snapshot", prefix,
                             args.wait_idle)  # fmt: skip
            record["snapshot"] = snap
            noise.append(f"snapshots {snap['foreign_cores']:.2f}")
            sq, st = snap["runs"]["sqlite"], snap["runs"]["stream"]
            # Medians of the runs that ended (a stalled one has no time; it fails the target).
            sq_s, st_s = median(completed(sq)), median(completed(st))
            per_pair = [
                f"{a['seconds'] / b['seconds']:.2f}" if a["complete"] and b["complete"] else "-"
                for a, b in zip(sq, st, strict=True)
            ]
            complete = all(r["complete"] for r in sq + st)
            ratio_s = sq_s / st_s
            ok = ratio_s >= TARGET_SNAPSHOT_RATIO and complete
            verdict = verdict and ok
            measured.append(f"snapshot of {events:,} from the R3 stream {st_s:.2f} s")
            baseline.append(f"SQLite snapshot {sq_s:.2f} s")
            ratios.append(f"snapshot rate {ratio_s:.2f} x")
            targets.append(f"snapshot rate >= {TARGET_SNAPSHOT_RATIO} x SQLite's, complete")
            stalled = sum(not r["complete"] for r in sq + st)
            details.append(
                (
                    "snapshot",
                    f"SYNCSTART (all, from 0) -> SYNCEND, {events:,} events from the R3 stream: "
                    f"median {st_s:.3f} s ({events / st_s:,.0f} events/s; runs "
                    + ", ".join(seconds_of(r) for r in st)
                    + f"); SQLite server same run {sq_s:.3f} s ({events / sq_s:,.0f} events/s; "
                    "runs "
                    + ", ".join(seconds_of(r) for r in sq)
                    + f"), alternated; rate ratio {ratio_s:.2f} (per pair "
                    + ", ".join(per_pair)
                    + "), "
                    + ("all complete" if complete else f"{stalled} INCOMPLETE or stalled")
                    + f"; target >= {TARGET_SNAPSHOT_RATIO} -> {verdict_word(ok)}",
                )
            )
            if snap["failed_reads"]:
                details.append(
                    (
                        "snapshot stalls",
                        f"the front-end ended {len(snap['failed_reads'])} snapshot(s) unanswered "
                        "('its client asks again'; the raw client does not): a read failed: "
                        + "; ".join(sorted(set(snap["failed_reads"]))),
                    )
                )
            done_sq = [r for r in sq if r["complete"]] or sq
            done_st = [r for r in st if r["complete"]] or st
            details.append(
                (
                    "snapshot CPU",
                    f"per SYNC: SQLite server "
                    f"{median([r['server_cpu_us_per_sync'] for r in done_sq]):.1f} us; front-end "
                    f"{median([r['server_cpu_us_per_sync'] for r in done_st]):.1f} us + "
                    f"nats-servers {median([r['nats_cpu_us_per_sync'] for r in done_st]):.1f} us; "
                    f"filling the R3 stream took {snap['fill_seconds']:.1f} s",
                )
            )
            figures["snapshot_stream_s"] = Figure(st_s, "s", better="lower")
            figures["snapshot_sqlite_s"] = Figure(sq_s, "s", better="lower")
            figures["snapshot_vs_sqlite"] = Figure(ratio_s, "x sqlite")
            figures["snapshot_front_end_cpu_per_sync"] = Figure(
                median([r["server_cpu_us_per_sync"] for r in done_st]), "us", better="lower"
            )
            figures["snapshot_sqlite_cpu_per_sync"] = Figure(
                median([r["server_cpu_us_per_sync"] for r in done_sq]), "us", better="lower"
            )

        if "faults" in parts:
            faults: dict[str, list[dict[str, Any]]] = {"front-end": [], "leader": []}
            for index in range(args.faults):
                for fault in faults:
                    run = fault_once(
                        fault,
                        root / f"fault-{fault}-{index}",
                        prefix,
                        args.rate,
                        args.fault_seconds,
                        args.warmup,
                        args.wait_idle,
                    )
                    faults[fault].append(run)
                    print(f"fault {index + 1}/{args.faults}: {describe_fault(run)}", flush=True)
            record["faults"] = faults
            noise.append(
                "fault runs (front-end, leader each time) "
                + ", ".join(
                    f"{faults[fault][index]['foreign_cores']:.2f}"
                    for index in range(args.faults)
                    for fault in faults
                )
            )
            for fault, target, key in (
                ("front-end", TARGET_FRONT_END_KILL, "front_end_kill_wait"),
                ("leader", TARGET_LEADER_KILL, "leader_kill_wait"),
            ):
                done = faults[fault]
                worst = max(r["wait_s"] for r in done)
                complete = all(r["complete"] for r in done)
                ok = worst < target and complete
                verdict = verdict and ok
                waits = ", ".join(f"{r['wait_s']:.2f}" for r in done)
                what = "its front-end" if fault == "front-end" else "the stream's leader"
                measured.append(f"wait after kill -9 of {what} {worst:.2f} s (worst)")
                targets.append(f"{fault} kill wait < {target:g} s, none lost")
                if fault == "front-end":
                    # What the subscriber waits by design before it moves on.
                    floor = float(done[0]["failover_after"] or done[0]["heartbeat_timeout"])
                    base = (
                        f"{floor:g} s, the subscriber's "
                        + ("failover_after" if done[0]["failover_after"] else "heartbeat_timeout")
                        + " (it moves after that long without a connection, by design)"
                    )
                    ratio_text = f"{worst / floor:.2f} x"
                else:
                    # The cluster's own failover: no front-end can store before it.
                    elections = [r["election_s"] for r in done]
                    floor = max(elections)
                    base = (
                        "the nats-servers elected a new stream leader "
                        + ", ".join(f"{e:.2f}" for e in elections)
                        + " s after the kill (their logs)"
                    )
                    ratio_text = (
                        "per run "
                        + ", ".join(f"{r['wait_s'] / r['election_s']:.2f}" for r in done)
                        + " x the election"
                    )
                baseline.append(f"{fault} kill: {base.split(' (')[0]}")
                ratios.append(f"{fault} kill {ratio_text}")
                details.append(
                    (
                        f"{fault} kill",
                        f"subscriber silent {waits} s (worst {worst:.2f}; from the kill to the "
                        "next event "
                        + ", ".join(f"{r['resumed_s']:.2f}" for r in done)
                        + f" s), {'every event once, in order' if complete else 'LOSS/REPEATS'}"
                        f"; baseline {base}; ratio {ratio_text}; target < {target:g} s -> "
                        f"{verdict_word(ok)}",
                    )
                )
                figures[f"{key}_s"] = Figure(worst, "s", better="lower")
                figures[f"{key}_vs_floor"] = Figure(worst / floor, "x", better="lower")
            details.append(
                (
                    "faults",
                    f"{args.rate:,.0f} events/s for {args.fault_seconds:g} s from a paced "
                    f"publisher at front-end B; EventBusSubscriber([A, B]) (defaults) at A; "
                    f"the kill {args.warmup:g} s after its first event; R3, two front-ends",
                )
            )

        if "restarts" in parts:
            restarts: dict[str, list[dict[str, Any]]] = {"planned": [], "kill": []}
            for index in range(args.restarts):
                for mode in restarts:
                    run = restarts_once(
                        mode,
                        root / f"restarts-{mode}-{index}",
                        prefix,
                        args.restart_rate,
                        args.restart_quiet,
                        args.wait_idle,
                    )
                    restarts[mode].append(run)
                    print(
                        f"restarts {index + 1}/{args.restarts}: {describe_restarts(run)}",
                        flush=True,
                    )
            record["restarts"] = restarts
            noise.append(
                "restart runs (planned, kill each time) "
                + ", ".join(
                    f"{restarts[mode][index]['foreign_cores']:.2f}"
                    for index in range(args.restarts)
                    for mode in restarts
                )
            )

            def worst(mode: str, kind: str) -> float:
                return max(
                    (w["silence_s"] for r in restarts[mode] for w in r["windows"]
                     if w["what"].startswith(kind)),
                    default=float("nan"),
                )  # fmt: skip

            planned_nats, killed_nats = (
                worst("planned", "nats-server"),
                worst("kill", "nats-server"),
            )
            planned_fe, killed_fe = worst("planned", "front-end"), worst("kill", "front-end")
            clean = all(not r["anomalies"] for rs in restarts.values() for r in rs)
            ok = planned_nats < TARGET_PLANNED_RESTART and clean
            verdict = verdict and ok
            base = max(r["baseline_silence_s"] for rs in restarts.values() for r in rs)
            measured.append(
                f"planned restart of each nats-server: subscriber silent {planned_nats:.2f} s at "
                f"worst (kill -9: {killed_nats:.2f} s); of each front-end {planned_fe:.2f} s "
                f"(kill -9: {killed_fe:.2f} s)"
            )
            baseline.append(f"longest silence with nothing restarted {base:.3f} s")
            ratios.append(f"planned / kill -9 of a nats-server {planned_nats / killed_nats:.2f} x")
            targets.append(
                f"planned nats-server restart silence < {TARGET_PLANNED_RESTART:g} s, 0 lost"
            )
            for mode, mode_runs in restarts.items():
                for index, each in enumerate(mode_runs):
                    details.append((f"restarts {mode} {index + 1}", describe_restarts(each)))
            kinds = sorted(
                {k for rs in restarts.values() for r in rs for k in r["cpu_us_per_event"]}
            )
            details.append(
                (
                    "restarts CPU",
                    "per event delivered, over a whole run (restarts, idle work and all; "
                    "cores used on average): "
                    + "; ".join(
                        f"{mode}: "
                        + ", ".join(
                            f"{kind} "
                            f"{median([r['cpu_us_per_event'].get(kind, 0.0) for r in rs]):.1f} us "
                            f"({median([r['cpu_cores'].get(kind, 0.0) for r in rs]):.2f} cores)"
                            for kind in kinds
                        )
                        for mode, rs in restarts.items()
                    ),
                )
            )
            details.append(
                (
                    "restarts",
                    f"{args.restart_rate:,.0f} events/s from ConfirmedPublisher([B, A]); "
                    "EventBusSubscriber([A, B]) (defaults); R3, two front-ends; each nats-server, "
                    "then A, then B, restarted in turn; a window runs from the first step to 1.5 s after "
                    "the replicas current (or the front-end serving); target "
                    f"< {TARGET_PLANNED_RESTART:g} s -> {verdict_word(ok)}",
                )
            )
            figures["planned_restart_silence_s"] = Figure(planned_nats, "s", better="lower")
            figures["kill_restart_silence_s"] = Figure(killed_nats, "s", better="lower")
            figures["planned_front_end_restart_silence_s"] = Figure(planned_fe, "s", better="lower")

    details.append(("noise", "other processes kept cores busy: " + "; ".join(noise)))
    summary(
        "eventbus_cluster",
        info,
        measured="; ".join(measured),
        baseline="same run: " + "; ".join(baseline),
        ratio="; ".join(ratios),
        target="; ".join(targets),
        verdict=verdict,
        details=details,
        json_path=args.json,
        record=record,
        figures=figures,
    )
    return 0 if verdict else 1


if __name__ == "__main__":
    if sys.argv[1:2] == ["failover-subscribe"]:
        failover_subscribe(sys.argv[2], int(sys.argv[3]), float(sys.argv[4]))
    elif sys.argv[1:2] == ["confirmed-publish"]:
        confirmed_publish(sys.argv[2], float(sys.argv[3]), sys.argv[4])
    elif sys.argv[1:2] == ["record-subscribe"]:
        record_subscribe(sys.argv[2], sys.argv[3])
    else:
        sys.exit(main())
