"""eMQP brokers and a Spark query on a JetStream cluster under a nemesis (issues 30 and 49):
seven hosts as network namespaces: three nats-servers (one cluster; R3 streams), two
``twistd -n emqp --store jetstream`` brokers, each with the real eventmq 0.3.13 job managers
(one of queue ``default``, one of the schedule's queue) and eventmq's own client
(tests/emqp_interop/nemesis_client.py: guaranteed requests with a reply, without end); an
Event BUS front-end (``twistd -n eventbus --store jetstream``) with a confirming publisher;
and the bus's Spark pipeline (local mode), reading the front-end's stream through the bus's
Spark source with every NATS server listed, into a Parquet sink.

Rounds of faults while requests and events flow, each healed before the next: kill -9 of
a broker (restarted after), kill -9 of a nats-server (restarted after), a partition that
cuts one broker's host from the rest, and one that cuts the host of the nats-server leading
a queue's consumer or a stream (read from JetStream's API: the first such round cuts the
``default`` queue's consumer leader, the issue's original failure; later ones one of the
EMQP stream, the schedules' bucket, the EVENTBUS stream or a queue's consumer, at random). A
schedule made at the start with eventmq's ``schedule()`` (every INTERVAL s, on its own
queue and job managers, so that a run never waits for a slot) runs through the rounds and
is unscheduled after them; the next round comes once it ran after the last fault settled.
It has no ``run_count`` (issue 30's version had one and checked only that count): a count
ends the schedule before the rounds do, or keeps the test waiting after them, and it cannot
tell a burst from the rhythm; the runs' msgids and times can.

Each job run appends ``start`` and ``end`` lines (its token, pid, time, and the msgid it
runs for) to its host's file; each eMQP client records what it sent, each dispatch
acknowledgement (eventmq's 5-frame REPLY) and each answer; the publisher each event
confirmed. The checks, every anomaly listed at the end:

- **No acknowledged request lost**: every request a client was acknowledged for ran at
  least once; every answer is its request's; a request that ran more than once did so only
  because a run of it was under way on the host of a broker killed or cut off at the time,
  or while a nats-server was killed or cut off (an election outlasts ``ack_wait``): counted
  by fault, any other is an anomaly.
- **Schedules once and on time** (docs/emqp.md, "Schedules"), from the runs' times at every
  host, a run being a msgid: a run executed again only under a fault, as above; two runs
  never closer than half the interval (less DISPATCH_SLACK: the rule holds for the times the
  stream stored the runs, a job starts a delivery and a dispatch later), so no burst of
  made-up runs after an outage, but while a nats-server is lost or cut off (and settling):
  the queue's consumer may then wait for a new leader while the stream stores runs on time,
  and deliver them together (CI: four at once, 9.7 s into a cut of its leader; listed, not
  an anomaly); and no gap longer than ON_TIME (the interval, half an
  interval more when a late run moves the next to the following point of its rhythm, and
  LATE_SLACK; AFTER_MISSED, an interval more, where a broker logged a run missed between:
  one the stream gave out so late that the next point was near, acknowledged without
  running) but where a fault's window and its settling time (an election it set off) lie
  between two runs: then the next run comes within ON_TIME of that time.
- **Queues drain**: once the rounds are over, the clients stopped and the schedule removed,
  every broker's status (status.json: its ``/status``) says each queue's ``pending`` is 0,
  within DRAIN_BOUND; the time each took is reported.
- **A Spark query's sink exact**: every event confirmed to the publisher is in the sink
  once, at its sequence; nothing twice, no hole, nothing the publisher did not send; the
  query was never started again for a failure of its own (only Spark's own start-up guess
  on a busy machine is taken in stride).

``NEMESIS_ROUNDS`` (default 4: one of each kind) sets the rounds, ``NEMESIS_SEED`` the
faults' order; ``make nemesis-emqp`` runs 15.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import sys
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime
from itertools import pairwise
from pathlib import Path
from typing import Any

import pytest

from bus.emqp.jobstream import consumer_name
from bus.nats.servers import NatsCluster
from tests.jetstream_helpers import leaders
from tests.nemesis import FrontEnd, SparkQuery, Window, check_sink
from tests.netns import (
    Hosts,
    HostService,
    LinePeer,
    hosts_while_used,
    nats_on_hosts,
    poll_until,
    read_records,
)
from tests.processes import START_BOUND
from tests.test_emqp_interop import JOBS, SENT_LINGER, InteropProcess

pytest.importorskip("nats")

ROUNDS = int(os.environ.get("NEMESIS_ROUNDS", "4"))
SEED = int(os.environ.get("NEMESIS_SEED", str(random.randrange(1 << 30))))
WORKER_PORT, CLIENT_PORT, ADMIN_PORT = 7000, 7001, 7002  # every host is a namespace of its own
#: How long a fault holds: past the consumers' ack_wait (4 s), so that the stream gives what
#: a dead or cut-off broker held to the other one.
FAULT_SECONDS = 6.0
#: How long a nats-server's host is cut off: past Raft's longest election timeout (9 s,
#: docs/cluster.md), so that what it led is always led by another server meanwhile.
CUT_NATS_SECONDS = 12.0
BIN = Path(sys.executable).parent
NATS_NODES = ["n1", "n2", "n3"]
BROKERS = ["b1", "b2"]
FRONT_END, SPARK = "f1", "s"
KINDS = ["kill-broker", "kill-nats", "cut-broker", "cut-nats-leader"]
#: Requests/s per client: half of what the job managers take together. eventmq's job
#: manager reads its finished jobs when its poll of the broker's socket returns, at the
#: latest each second: a slot takes about one job a second.
RATE = 2.0
JOB_SECONDS = 0.3  # each run's work: some are always under way when a fault comes
JOBS_PER_MANAGER = 4
#: A run that ended this long before a fault began may still have been unacknowledged by
#: its broker then: its job manager sends the REPLY up to a second later (see RATE), the
#: broker's ack to the stream follows.
REPLY_SLACK = 2.5
EVENTS_PER_SECOND = 100

# -- the schedule -------------------------------------------------------------------------------
#: Seconds between runs. 2 s rather than 1 s: the half-interval rule is about the times the
#: stream stores the runs, and a job starts a pull, a dispatch and a job manager's hand-over
#: later, each of which a busy 2-core machine delays by tenths of a second.
INTERVAL = 2
SCHEDULE_QUEUE = "sched"
QUEUES = ["default", SCHEDULE_QUEUE]
#: A run's start at a worker after the stream stored it: a delivery on an open pull, a
#: dispatch, the job manager's worker process taking it.
DISPATCH_SLACK = 0.25
#: A run's own lateness on a busy machine: the bucket's two compare-and-sets and the append
#: before the stream stores it, then DISPATCH_SLACK.
LATE_SLACK = 1.0
#: The longest gap between runs outside faults: a run more than half an interval late moves
#: the next to the following point of its rhythm (docs/emqp.md), so up to 1.5 intervals.
ON_TIME = 1.5 * INTERVAL + LATE_SLACK
#: ... and where a run the stream gave out late was missed (a broker logs each: acknowledged
#: without running, as the next point is near), the next point of its rhythm.
AFTER_MISSED = 2 * INTERVAL + LATE_SLACK
#: How long after a nats-server is back its fault may still show: the streams' groups may
#: elect again (4-9 s), and a member cut off that comes back has made the majority stop
#: storing for 3.6-13.3 s (docs/cluster.md, notes of 2026-11-28).
NATS_SETTLE = 15.0
#: After a broker's fault: what it held is delivered again after ack_wait (4 s), its pulls
#: lapse 1 s past their expiry.
BROKER_SETTLE = 6.0

#: After a fault's heal the clients are acknowledged and requests run again within this:
#: an election (4-9 s), what a broker held delivered again after ack_wait (4 s), a pull the
#: fault left open lapsing (6 s), a broker restarted and its job managers INFORMing again.
PROGRESS_BOUND = 90.0

# -- the drain ----------------------------------------------------------------------------------
#: Once the clients stop: what is left is pulled as the job managers free slots (8 a second
#: at most), a pull a fault left open lapses 6 s after it was made, what a broker held is
#: delivered again after ack_wait (4 s); a broker reads each consumer's pending every 5 s.
DRAIN_BOUND = 60.0
#: Pending 0 at every broker this long: past a broker's next read of its consumer (5 s) and
#: its next status.json (0.5 s), so that no 0 read before the clients stopped is taken.
DRAIN_HOLD = 6.0


class Broker(HostService):
    """One broker on its host, restartable; its broker id is kept in its data directory."""

    def __init__(self, hosts: Hosts, name: str, nats_urls: str, root: Path) -> None:
        address = hosts.addresses[name]
        self.worker = f"tcp://{address}:{WORKER_PORT}"
        self.client = f"tcp://{address}:{CLIENT_PORT}"
        argv = [
            str(BIN / "twistd"), "-n", "--pidfile=", "emqp", "--bind", address,
            "--worker-port", str(WORKER_PORT), "--client-port", str(CLIENT_PORT),
            "--admin-port", str(ADMIN_PORT), "--data-dir", str(root / name),
            "--store", "jetstream", "--nats", nats_urls, "--nats-replicas", "3",
            "--stats-interval", "0.5s", "--heartbeat-interval", "1s",
        ]  # fmt: skip
        super().__init__(hosts, name, root, argv)

    def serving(self) -> bool:
        """Serving, its stream ready, and job managers of every queue (INFORMed) beside it."""
        if not self.ready():
            return False
        status = self.status()
        queues = status.get("queues") or {}
        return bool((status.get("jetstream") or {}).get("ready")) and all(
            (queues.get(queue) or {}).get("workers") for queue in QUEUES
        )

    def queues(self) -> dict[str, Any]:
        """What its status says of each queue's consumer (``pending``, ``pulls_open``...)."""
        return dict((self.status().get("jetstream") or {}).get("queues") or {})


@dataclass
class Run:
    token: str
    host: str
    start: float
    end: float | None
    msgid: str


@pytest.fixture
def hosts() -> Iterator[Hosts]:
    yield from hosts_while_used([*NATS_NODES, *BROKERS, FRONT_END, SPARK])


def read_runs(root: Path) -> list[Run]:
    """Every run the job managers recorded, from their hosts' files."""
    runs: dict[tuple[str, str, str], Run] = {}  # (host, token, pid) of the run under way
    done: list[Run] = []
    for host in BROKERS:
        path = root / f"runs-{host}.txt"
        text = path.read_text() if path.exists() else ""
        for line in text.splitlines():
            fields = line.split()
            if len(fields) != 5:
                continue  # the last line, while a job writes it
            word, token, pid, at, msgid = fields
            key = (host, token, pid)
            if word == "start":
                runs[key] = Run(token, host, float(at), None, msgid)
            elif key in runs:
                run = runs.pop(key)
                run.end = float(at)
                done.append(run)
    return done + list(runs.values())


def acknowledged(root: Path) -> dict[str, str]:
    """token -> msgid of every request a client was acknowledged for."""
    found: dict[str, str] = {}
    for host in BROKERS:
        records = read_records(root / f"client-{host}.jsonl")
        token_of = {r["msgid"]: r["token"] for r in records if r["kind"] == "sent"}
        found.update({token_of[r["msgid"]]: r["msgid"] for r in records if r["kind"] == "ack"})
    return found


def fault_of(run: Run, windows: list[Window]) -> str | None:
    """The fault ``run`` was under way (or its answer on its way) in, if any: its broker
    killed or cut off, or a nats-server killed or cut off (the stream's or its consumer's
    leader among them: while the others elect a new one, longer than ack_wait, nothing is
    acknowledged and what was delivered is delivered again)."""
    end = run.end if run.end is not None else float("inf")
    for w in windows:
        if (
            run.start <= w.end
            and end >= w.start - REPLY_SLACK
            and (w.everywhere or w.host == run.host)
        ):
            return w.kind
    return None


def again_by_fault(runs: list[Run], windows: list[Window]) -> tuple[dict[str, int], list[str]]:
    """Runs of one request (or one schedule run) beyond the last: each must have been cut
    short of its acknowledgement by a fault. Counts by fault, and the anomalies."""
    by_kind = dict.fromkeys(KINDS, 0)
    anomalies = []
    ordered = sorted(runs, key=lambda r: r.start)
    for run in ordered[:-1]:
        kind = fault_of(run, windows)
        if kind is None:
            where = [(r.host, round(r.start, 3), r.end and round(r.end, 3)) for r in ordered]
            anomalies.append(f"{run.token} {run.msgid} ran {len(runs)} times, no fault: {where}")
        else:
            by_kind[kind] += 1
    return by_kind, anomalies


def check_requests(root: Path, windows: list[Window]) -> tuple[dict[str, int], list[str]]:
    """Every acknowledged request ran, every answer is its request's, a request run again
    only under a fault."""
    anomalies: list[str] = []
    by_token: dict[str, list[Run]] = {}
    for run in read_runs(root):
        if run.token != "schedule":
            by_token.setdefault(run.token, []).append(run)
    acked = acknowledged(root)
    lost = sorted(token for token in acked if not any(r.end for r in by_token.get(token, [])))
    if lost:
        anomalies.append(f"{len(lost)} acknowledged requests never ran: {lost[:10]}")
    sent = answered = 0
    for host in BROKERS:
        records = read_records(root / f"client-{host}.jsonl")
        token_of = {r["msgid"]: r["token"] for r in records if r["kind"] == "sent"}
        sent += len(token_of)
        others = [r for r in records if r["kind"] == "other"]
        if others:
            anomalies.append(f"client at {host} got what it did not expect: {others[:5]}")
        for record in records:
            if record["kind"] == "result":
                answered += 1
                token = token_of[record["msgid"]]
                if record["value"] != {"value": token} or not by_token.get(token):
                    anomalies.append(
                        f"{token} answered {record['value']}, ran {by_token.get(token)}"
                    )
    duplicated = dict.fromkeys(KINDS, 0)
    twice = 0
    for runs in by_token.values():
        if len(runs) > 1:
            twice += 1
            kinds, unexplained = again_by_fault(runs, windows)
            anomalies += unexplained
            for kind, n in kinds.items():
                duplicated[kind] += n > 0
    counts = {
        "sent": sent,
        "acknowledged": len(acked),
        "answered": answered,
        "ran": len(by_token),
        "runs": sum(len(rs) for rs in by_token.values()),
        "unacknowledged_ran": sum(1 for t in by_token if t not in acked),
        "duplicated": twice,
        **{f"duplicated {kind}": n for kind, n in duplicated.items()},
    }
    return counts, anomalies


def missed_runs(brokers: Iterable[Broker]) -> list[float]:
    """When the brokers' logs (every start) say a schedule run was missed; to the second,
    as twistd's log stamps its lines."""
    return sorted(
        datetime.strptime(line.split(" ", 1)[0], "%Y-%m-%dT%H:%M:%S%z").timestamp()
        for broker in brokers
        for start in range(1, broker.starts + 1)
        for line in broker.log(start).splitlines()
        if "] schedule run " in line and " missed: " in line
    )


def check_schedule(
    root: Path,
    windows: list[Window],
    made: float,
    removed: float,
    origin: float,
    missed: Sequence[float] = (),
) -> tuple[dict[str, Any], list[str]]:
    """The schedule's runs once and on time, from ``made`` (its SCHEDULE sent: it runs at
    once) to ``removed`` (its UNSCHEDULE sent); see the module's text. ``missed``: when
    brokers logged a missed run (:func:`missed_runs`). Times in the anomalies are seconds
    from ``origin``."""
    anomalies: list[str] = []
    by_msgid: dict[str, list[Run]] = {}
    for run in read_runs(root):
        if run.token == "schedule":
            by_msgid.setdefault(run.msgid, []).append(run)
    if "-" in by_msgid:
        raise AssertionError("a schedule run recorded no msgid: tests/emqp_interop/jobs.py")
    again = dict.fromkeys(KINDS, 0)
    for runs in by_msgid.values():
        kinds, unexplained = again_by_fault(runs, windows)
        anomalies += unexplained
        for kind, n in kinds.items():
            again[kind] += n

    first_runs = sorted(
        (min(runs, key=lambda r: r.start) for runs in by_msgid.values()), key=lambda r: r.start
    )
    firsts = [r.start for r in first_runs]

    def consumer_stalled(at: float) -> bool:
        """A NATS server lost or cut off at ``at`` (or still settling): the schedule queue's
        consumer may wait for a new leader while the stream goes on storing runs, which it
        then delivers together (the rule is for the times the stream stores them)."""
        return any(w.everywhere and w.start <= at <= w.settled for w in windows)

    close, bunched = [], []
    for a, b in pairwise(first_runs):
        if b.start - a.start < INTERVAL / 2 - DISPATCH_SLACK:
            pair = (round(a.start - origin, 2), round(b.start - a.start, 3), a.host, b.host)
            (bunched if consumer_stalled(b.start) else close).append(pair)
    if close:
        anomalies.append(
            f"schedule: {len(close)} runs less than half an interval after the one before "
            f"(at s, gap s, the two runs' hosts): {close[:10]}"
        )

    def settled_between(a: float, b: float) -> float:
        """The latest time a fault between ``a`` and ``b`` settled (else ``a``)."""
        return max([a, *(w.settled for w in windows if w.start < b and w.settled > a)])

    def bound(a: float, b: float) -> float:
        """The longest gap from ``a`` to ``b`` outside faults: longer with a run missed
        between (its log line stamped to the second)."""
        return AFTER_MISSED if any(a - 1 <= t <= b + 1 for t in missed) else ON_TIME

    points = [made, *firsts, removed]
    late = [
        (a, b, settled_between(a, b))
        for a, b in pairwise(points)
        if b - settled_between(a, b) > bound(a, b)
    ]
    if late:
        anomalies.append(
            f"schedule: {len(late)} gaps longer than {ON_TIME}s outside faults "
            f"({AFTER_MISSED}s with a run missed between) (at s, gap s, "
            f"of which outside faults s): "
            f"{[(round(a - origin, 2), round(b - a, 3), round(b - s, 3)) for a, b, s in late[:10]]}"
        )
    gaps = [b - a for a, b in pairwise(firsts)]
    quiet = [b - a for a, b in pairwise(firsts) if settled_between(a, b) == a]
    resumed = [
        round(min((t for t in firsts if t > w.end), default=float("inf")) - w.end, 2)
        for w in windows
    ]
    counts = {
        "runs": len(by_msgid),
        "executions": sum(len(rs) for rs in by_msgid.values()),
        "again": again,
        "closest": round(min(gaps, default=0.0), 3),
        "longest": round(max(gaps, default=0.0), 3),
        "longest_outside_faults": round(max(quiet, default=0.0), 3),
        "missed": [round(t - origin, 1) for t in missed],
        "resumed_after_heal": resumed,
        "bunched": bunched,
    }
    return counts, anomalies


def drain(brokers: dict[str, Broker], since: float) -> tuple[dict[str, float], list[str]]:
    """Poll every broker's status until each queue's ``pending`` is 0 at every broker (and
    stays so DRAIN_HOLD): seconds from ``since`` to that for each queue, or the anomaly with
    every broker's queues past DRAIN_BOUND."""
    zero_since: dict[str, float | None] = dict.fromkeys(QUEUES)
    drained: dict[str, float] = {}
    while True:
        now = time.time()
        seen = {name: broker.queues() for name, broker in brokers.items()}
        for queue in QUEUES:
            if queue in drained:
                continue
            zero_since_then = zero_since[queue]
            if any((queues.get(queue) or {}).get("pending") != 0 for queues in seen.values()):
                zero_since[queue] = None
            elif zero_since_then is None:
                zero_since[queue] = now
            elif now - zero_since_then >= DRAIN_HOLD:
                drained[queue] = round(max(zero_since_then - since, 0.0), 1)
        if len(drained) == len(QUEUES):
            return drained, []
        if now - since > DRAIN_BOUND + DRAIN_HOLD:
            left = [q for q in QUEUES if q not in drained]
            return drained, [f"queues {left} not drained within {DRAIN_BOUND}s: {seen}"]
        time.sleep(0.1)


def test_nothing_acknowledged_is_lost_and_schedules_run_once_on_time_through_rounds_of_faults(
    hosts: Hosts, tmp_path: Path
) -> None:
    rng = random.Random(SEED)
    origin = time.time()  # every time printed is seconds from here
    print(f"nemesis (emqp): {ROUNDS} rounds, NEMESIS_SEED={SEED}")
    nats = nats_on_hosts(hosts, NATS_NODES, tmp_path / "nats")
    urls = ",".join(nats.urls)
    brokers = {name: Broker(hosts, name, urls, tmp_path) for name in BROKERS}
    front_end = FrontEnd(hosts, FRONT_END, urls, tmp_path)
    spark = SparkQuery(hosts, SPARK, urls, tmp_path)
    eventmq: list[InteropProcess] = []
    clients: dict[str, InteropProcess] = {}
    publisher: LinePeer | None = None
    stop_file = tmp_path / "stop"
    windows: list[Window] = []
    schedule_args = [f"{JOBS}.nemesis_run", json.dumps(["schedule", 0]), str(INTERVAL)]
    anomalies: list[str] = []
    try:
        nats.start(timeout=30)
        for service in [front_end, *brokers.values()]:
            service.start()
        # Spark's JVM and session take longest to start: they do while the rest does, once
        # the front-end's stream is there.
        poll_until(front_end.stream_led, 60, "the front-end's stream")
        spark.start()
        poll_until(lambda: all(b.ready() for b in brokers.values()), 60, "brokers serving")
        poll_until(front_end.ready, 60, "the front-end serving")
        publisher = LinePeer(
            [*hosts.prefix(FRONT_END), sys.executable, "-m", "tests.nemesis_clients",
             "--server", front_end.address, "--publishers", "1", "--subscribers", "0",
             "--rate", str(EVENTS_PER_SECOND), "--out", str(tmp_path / "records")],
            tmp_path / "publisher.log",
        )  # fmt: skip
        publisher.wait_for("PROGRESS", timeout=START_BOUND, ready=True)
        for name, broker in brokers.items():
            for queue, slots in (("default", JOBS_PER_MANAGER), (SCHEDULE_QUEUE, 2)):
                eventmq.append(
                    InteropProcess(
                        "jobmanager.py", broker.worker, json.dumps([[10, queue]]), str(slots),
                        log=tmp_path / f"jobmanager-{name}-{queue}.log",
                        # Heartbeats every second, silence judged in 2 s: it INFORMs a
                        # restarted broker again within a few seconds.
                        env={"EVENTMQ_HEARTBEAT_INTERVAL": "1", "EVENTMQ_HEARTBEAT_TIMEOUT": "2",
                             "NEMESIS_RUNS": str(tmp_path / f"runs-{name}.txt")},
                        prefix=hosts.prefix(name),
                    )
                )  # fmt: skip
        poll_until(lambda: all(b.serving() for b in brokers.values()), 60, "job managers")
        made = time.time()
        schedule = InteropProcess(
            "schedule.py", brokers["b1"].client, *schedule_args, f"queue:{SCHEDULE_QUEUE}",
            log=tmp_path / "schedule.log", prefix=hosts.prefix("b1"),
        )  # fmt: skip
        eventmq.append(schedule)
        poll_until(schedule.finished, START_BOUND + SENT_LINGER, "the SCHEDULE sent")
        for name, broker in brokers.items():
            clients[name] = InteropProcess(
                "nemesis_client.py", broker.client, f"c{name}",
                str(tmp_path / f"client-{name}.jsonl"), str(stop_file), str(RATE),
                str(JOB_SECONDS), log=tmp_path / f"client-{name}.log",
                prefix=hosts.prefix(name),
            )  # fmt: skip

        def acks() -> dict[str, int]:
            return {
                name: sum(
                    r["kind"] == "ack" for r in read_records(tmp_path / f"client-{name}.jsonl")
                )
                for name in BROKERS
            }

        def ran() -> int:
            """Client requests whose run ended, at any host."""
            return len({r.token for r in read_runs(tmp_path) if r.end and r.token != "schedule"})

        def progress() -> tuple[dict[str, int], int]:
            return acks(), ran()

        def progressed(before: tuple[dict[str, int], int]) -> bool:
            """Every client acknowledged again, requests ran again (a queue no broker pulls
            any more stores on and runs nothing), every broker serves with its job managers."""
            (acked, done), (acked_now, done_now) = before, progress()
            return (
                all(acked_now[n] >= acked[n] + 5 for n in BROKERS)
                and done_now >= done + 5
                and all(b.serving() for b in brokers.values())
            )

        def schedule_ran_after(moment: float) -> bool:
            return any(r.token == "schedule" and r.start > moment for r in read_runs(tmp_path))

        poll_until(lambda: progressed((dict.fromkeys(BROKERS, 0), 0)), 60, "requests flowing")
        poll_until(lambda: schedule_ran_after(made), 60, "the schedule running")
        # The rounds begin once the query runs (its first batches are read through them).
        poll_until(spark.started, START_BOUND * 2, "the Spark query started")
        began = time.time()
        kinds = rng.sample(KINDS, len(KINDS))
        for round_ in range(ROUNDS):
            kind = kinds[round_] if round_ < len(kinds) else rng.choice(KINDS)
            before = progress()
            first_cut = not any(w.kind == "cut-nats-leader" for w in windows)
            window, detail = fault(kind, rng, hosts, nats, brokers, first_cut)
            windows.append(window)
            print(
                f"round {round_ + 1}: {kind} {window.host}{detail} "
                f"({window.start - origin:.1f}s to {window.end - origin:.1f}s)"
            )
            # The system recovered before the next fault. Else that is an anomaly and the
            # rounds end: the checks say what was lost.
            try:
                poll_until(lambda b=before: progressed(b), PROGRESS_BOUND, "progress")
            except AssertionError:
                queues = {name: broker.queues() for name, broker in brokers.items()}
                anomalies.append(
                    f"round {round_ + 1}: no progress within {PROGRESS_BOUND}s of {kind}'s "
                    f"heal (acknowledged and ran before {before}, now {progress()}); "
                    f"queues: {queues}"
                )
                break
            # The next fault comes once the schedule ran after this one settled, so that
            # its rhythm is checked between faults too.
            with contextlib.suppress(AssertionError):  # the checker says how late it was
                poll_until(
                    lambda w=window: schedule_ran_after(w.settled),
                    window.settled + ON_TIME + 30 - time.time(),
                    f"the schedule after {kind}",
                )
        removed = time.time()
        unschedule = InteropProcess(
            "schedule.py", brokers["b1"].client, *schedule_args, "unschedule",
            log=tmp_path / "unschedule.log", prefix=hosts.prefix("b1"),
        )  # fmt: skip
        eventmq.append(unschedule)
        poll_until(unschedule.finished, START_BOUND + SENT_LINGER, "the UNSCHEDULE sent")
        stop_file.touch()
        stopped = time.time()
        publisher.send({"cmd": "finish"})
        drained, found = drain(brokers, stopped)
        anomalies += found
        phases = {"drain": time.time() - stopped}
        for name, client in clients.items():
            poll_until(client.finished, 120, f"the client at {name} to finish")
        # Every acknowledged request runs, however late (one a killed broker held waits out
        # ack_wait). Past the deadline the checker says what is lost.
        with contextlib.suppress(AssertionError):
            poll_until(lambda: settled(tmp_path), 60.0, "every acknowledged request run")
        finished = publisher.wait_for("FINISHED", timeout=180)
        confirmed = read_records(tmp_path / "records" / "pub-0.jsonl")
        last = max((r["seq"] for r in confirmed), default=0)
        with contextlib.suppress(AssertionError):  # the sink's check says what is missing
            poll_until(lambda: spark.landed() >= last, START_BOUND * 2, f"Spark at {last}")
        phases["Spark caught up"] = time.time() - stopped
        missed = {
            name: (broker.status().get("counters") or {}).get("schedule_runs_missed")
            for name, broker in brokers.items()
        }
        restarts = spark.restarts()
        status = spark.stop()
        sink_counts, found = check_sink(spark.sink(), confirmed, finished["sent"])
        anomalies += found
        phases["sink read"] = time.time() - stopped
        # SIGTERM while its query streams (the driver's main thread waiting on Spark
        # through py4j) stops the query and ends the job cleanly: a handler that stopped it
        # from inside that wait broke the gateway ("reentrant call"), tracebacks, status 1.
        ended = spark.text()
        at = ended.find("signal 15: stopping queries")
        if status != 0 or at < 0 or "Traceback" in ended[at:]:
            anomalies.append(
                f"the Spark pipeline did not end cleanly on SIGTERM (status {status}): "
                f"{ended[-1500:]}"
            )
        anomalies += [
            f"the Spark query failed and was started again: {reason}"
            for reason in restarts
            if not SparkQuery.own_guess(reason)
        ]
        requests, found = check_requests(tmp_path, windows)
        anomalies += found
        runs, found = check_schedule(
            tmp_path, windows, made, removed, origin, missed_runs(brokers.values())
        )
        (tmp_path / "windows.json").write_text(
            json.dumps({"origin": origin, "made": made, "removed": removed,
                        "windows": [vars(w) for w in windows]})
        )  # fmt: skip
        anomalies += found
        by_kind = ", ".join(f"{k}: {requests['duplicated ' + k]}" for k in KINDS)
        again = ", ".join(f"{k}: {n}" for k, n in runs["again"].items())
        print(
            f"nemesis (emqp): {ROUNDS} rounds ({', '.join(w.kind for w in windows)}), "
            f"NEMESIS_SEED={SEED}\n"
            f"  requests: {requests['sent']} guaranteed requests sent, "
            f"{requests['acknowledged']} acknowledged, {requests['answered']} answered, "
            f"{requests['ran']} ran ({requests['unacknowledged_ran']} never acknowledged) "
            f"in {requests['runs']} runs; {requests['duplicated']} ran more than once "
            f"({by_kind})\n"
            f"  schedule (every {INTERVAL}s): {runs['runs']} runs in {runs['executions']} "
            f"executions (again under faults: {again}); gaps: closest {runs['closest']}s, "
            f"longest {runs['longest']}s, longest outside faults "
            f"{runs['longest_outside_faults']}s; first run after each heal: "
            f"{runs['resumed_after_heal']}s; closer than half an interval while a NATS "
            f"fault stalled the queue's consumer (at s, gap s, hosts): {runs['bunched']}; "
            f"missed runs (acknowledged unrun, since each "
            f"broker's last start): {missed}, logged at {runs['missed']}s\n"
            f"  drain after the clients stopped (s): {drained}\n"
            f"  spark: {sink_counts['rows']} rows in the sink, sequences up to "
            f"{sink_counts['last']}, {sink_counts['confirmed']} confirmed of "
            f"{sink_counts['sent']} sent ({finished['resent']} resent); restarts: "
            f"{restarts or 'none'}\n"
            f"  took {began - origin:.0f}s to start, {removed - began:.0f}s of rounds, "
            f"{time.time() - removed:.0f}s to drain and check (from the clients' stop: "
            f"{', '.join(f'{k} {v:.0f}s' for k, v in phases.items())})\n"
            f"  anomalies: {len(anomalies)}" + "".join(f"\n    - {a}" for a in anomalies)
        )
        assert not anomalies, f"{len(anomalies)} anomalies (above)"
    finally:
        for client in clients.values():
            client.stop()
        for process in eventmq:
            process.stop()
        if publisher is not None:
            publisher.stop()
        spark.kill()
        hosts.heal()
        for service in [*brokers.values(), front_end]:
            service.stop()
        nats.stop()


def settled(root: Path) -> bool:
    ran = {r.token for r in read_runs(root) if r.end is not None}
    return set(acknowledged(root)) <= ran


STREAMS = ["EMQP", "KV_EMQP_SCHEDULES", "EVENTBUS"]
CONSUMERS = [("EMQP", consumer_name(queue.encode())) for queue in QUEUES]


def fault(
    kind: str,
    rng: random.Random,
    hosts: Hosts,
    nats: NatsCluster,
    brokers: dict[str, Broker],
    first_cut: bool,
) -> tuple[Window, str]:
    """Do one fault, hold it, undo it; say what was done and when."""
    detail = ""
    if kind == "kill-nats":
        node = rng.choice(nats.nodes)
        window = Window(kind, node.name, time.time(), settle=NATS_SETTLE, everywhere=True)
        nats.kill(node)
        time.sleep(FAULT_SECONDS)
        nats.start(node, timeout=30)
    elif kind == "cut-nats-leader":
        led = hosts.inside(FRONT_END, lambda: leaders(nats.urls, STREAMS, CONSUMERS))
        target = (
            f"consumer EMQP/{consumer_name(b'default')}" if first_cut else rng.choice(sorted(led))
        )
        name = led[target]
        detail = f" (leader of {', '.join(k for k, v in sorted(led.items()) if v == name)})"
        window = Window(kind, name, time.time(), settle=NATS_SETTLE, everywhere=True)
        hosts.cut([name])
        time.sleep(CUT_NATS_SECONDS)
        hosts.heal()
    elif kind == "kill-broker":
        broker = brokers[rng.choice(BROKERS)]
        window = Window(kind, broker.name, time.time(), settle=BROKER_SETTLE)
        broker.signal(signal.SIGKILL)
        time.sleep(FAULT_SECONDS)
        broker.start()
        poll_until(broker.ready, 60, f"{broker.name} serving again")
    else:
        name = rng.choice(BROKERS)
        window = Window(kind, name, time.time(), settle=BROKER_SETTLE)
        hosts.cut([name])
        time.sleep(FAULT_SECONDS)
        hosts.heal()
    window.end = time.time()
    return window, detail
