"""eMQP brokers on a JetStream cluster under a nemesis (issue 30): five hosts as network
namespaces (three nats-servers with an R3 stream, two ``twistd -n emqp --store jetstream``
brokers), on each broker's host the real eventmq 0.3.13 job manager and eventmq's own client
(tests/emqp_interop/nemesis_client.py: guaranteed requests with a reply, without end), and
rounds of faults while requests flow: kill -9 of a broker (restarted after), kill -9 of a
NATS server (restarted after), a partition that cuts one broker's host from the rest; each
healed before the next round. A schedule made at the start (eventmq's own ``schedule``,
every second, ``run_count`` limited) runs through the rounds.

Each job run appends ``start`` and ``end`` lines (its token, pid, time) to its host's file;
each client records what it sent, each dispatch acknowledgement (eventmq's 5-frame REPLY)
and each answer. The checker: every request a client was acknowledged for ran at least
once; every answer is the one of its request; a request that ran more than once did so
only because a run of it was under way on the host of a broker that was killed or cut off
at the time, or while a NATS server was killed (a leader's election outlasts ack_wait);
those are counted by fault and reported, any other is an anomaly. The schedule ran at
least its ``run_count`` times, and more only by as many of its runs as were under way in
such a fault.

``NEMESIS_ROUNDS`` (default 3: one of each kind) sets the rounds, ``NEMESIS_SEED`` the
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
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from bus.nats.servers import NatsCluster
from tests.netns import Hosts, HostService, make_hosts, nats_on_hosts, poll_until
from tests.processes import START_BOUND
from tests.test_emqp_interop import JOBS, SENT_LINGER, InteropProcess

pytest.importorskip("nats")

ROUNDS = int(os.environ.get("NEMESIS_ROUNDS", "3"))
SEED = int(os.environ.get("NEMESIS_SEED", str(random.randrange(1 << 30))))
WORKER_PORT, CLIENT_PORT, ADMIN_PORT = 7000, 7001, 7002  # every host is a namespace of its own
#: How long a fault holds: past the consumers' ack_wait (4 s), so that the stream gives what
#: a dead or cut-off broker held to the other one.
FAULT_SECONDS = 6.0
BIN = Path(sys.executable).parent
NATS_NODES = ["n1", "n2", "n3"]
BROKERS = ["b1", "b2"]
KINDS = ["kill-broker", "kill-nats", "cut-broker"]
#: Requests/s per client: half of what the job managers take together. eventmq's job
#: manager reads its finished jobs when its poll of the broker's socket returns, at the
#: latest each second: a slot takes about one job a second, whatever the job's length.
RATE = 2.0
JOB_SECONDS = 0.3  # each run's work: some are always under way when a fault comes
JOBS_PER_MANAGER = 4
SCHEDULE_RUNS = 8 * ROUNDS
#: A run that ended this long before a fault began may still have been unacknowledged by
#: its broker then: its job manager sends the REPLY up to a second later (see RATE), the
#: broker's ack to the stream follows.
REPLY_SLACK = 2.5


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
        """Serving, its stream ready, and a job manager (INFORMed) beside it."""
        if not self.ready():
            return False
        status = self.status()
        return bool((status.get("jetstream") or {}).get("ready") and status.get("workers"))


@dataclass
class Window:
    """A fault from its start to its heal (and, for a broker killed, its serving again)."""

    kind: str
    host: str
    start: float
    end: float = 0.0


@dataclass
class Run:
    token: str
    host: str
    start: float
    end: float | None


@pytest.fixture
def hosts() -> Iterator[Hosts]:
    made = make_hosts([*NATS_NODES, *BROKERS])
    try:
        yield made
    finally:
        made.delete()


def read_records(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def read_runs(root: Path) -> list[Run]:
    """Every run the job managers recorded, from their hosts' files."""
    runs: dict[tuple[str, str, str], Run] = {}  # (host, token, pid) of the run under way
    done: list[Run] = []
    for host in BROKERS:
        path = root / f"runs-{host}.txt"
        text = path.read_text() if path.exists() else ""
        for line in text.splitlines():
            word, token, pid, at = line.split()
            key = (host, token, pid)
            if word == "start":
                runs[key] = Run(token, host, float(at), None)
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
    killed or cut off, or a NATS server killed (the stream's or its consumer's leader among
    them: while the others elect a new one, longer than ack_wait, nothing is acknowledged
    and what was delivered is delivered again)."""
    end = run.end if run.end is not None else float("inf")
    for w in windows:
        if (
            run.start <= w.end
            and end >= w.start - REPLY_SLACK
            and (w.kind == "kill-nats" or w.host == run.host)
        ):
            return w.kind
    return None


def check(root: Path, windows: list[Window]) -> dict[str, int]:
    """The checker: raises on any anomaly, returns what it counted."""
    runs = read_runs(root)
    by_token: dict[str, list[Run]] = {}
    for run in runs:
        by_token.setdefault(run.token, []).append(run)
    acked = acknowledged(root)
    lost = sorted(token for token in acked if not any(r.end for r in by_token.get(token, [])))
    assert not lost, f"{len(lost)} acknowledged requests never ran: {lost[:10]}"
    sent = answered = 0
    for host in BROKERS:
        records = read_records(root / f"client-{host}.jsonl")
        token_of = {r["msgid"]: r["token"] for r in records if r["kind"] == "sent"}
        sent += len(token_of)
        others = [r for r in records if r["kind"] == "other"]
        assert not others, f"client at {host} got what it did not expect: {others[:5]}"
        for record in records:
            if record["kind"] == "result":
                answered += 1
                token = token_of[record["msgid"]]
                assert record["value"] == {"value": token}, f"{token} answered {record['value']}"
                assert by_token.get(token), f"{token} answered yet never ran"
    twice = {t: rs for t, rs in by_token.items() if len(rs) > 1 and t != "schedule"}
    # The last run is the one acknowledged; each earlier one must have been cut short of its
    # acknowledgement by a fault.
    why = {
        token: [fault_of(r, windows) for r in sorted(rs, key=lambda r: r.start)[:-1]]
        for token, rs in twice.items()
    }
    unexplained = {
        token: [(r.host, r.start, r.end) for r in twice[token]]
        for token, faults in why.items()
        if None in faults
    }
    assert not unexplained, (
        f"requests run more than once with no fault to explain it: {unexplained}"
    )
    duplicated_by = {kind: sum(kind in faults for faults in why.values()) for kind in KINDS}
    schedule_runs = by_token.get("schedule", [])
    excused = sum(fault_of(r, windows) is not None for r in schedule_runs)
    assert SCHEDULE_RUNS <= len(schedule_runs) <= SCHEDULE_RUNS + excused, (
        f"the schedule of {SCHEDULE_RUNS} runs ran {len(schedule_runs)} times "
        f"({excused} of them under a fault)"
    )
    return {
        "sent": sent,
        "acknowledged": len(acked),
        "answered": answered,
        "ran": sum(1 for t in by_token if t != "schedule"),
        "runs": sum(len(rs) for t, rs in by_token.items() if t != "schedule"),
        "unacknowledged_ran": sum(1 for t in by_token if t != "schedule" and t not in acked),
        "duplicated": len(twice),
        **{f"duplicated {kind}": n for kind, n in duplicated_by.items()},
        "schedule_runs": len(schedule_runs),
        "schedule_excused": excused,
    }


def test_no_acknowledged_request_is_lost_through_rounds_of_faults(
    hosts: Hosts, tmp_path: Path
) -> None:
    rng = random.Random(SEED)
    print(f"nemesis (emqp): {ROUNDS} rounds, NEMESIS_SEED={SEED}")
    nats = nats_on_hosts(hosts, NATS_NODES, tmp_path / "nats")
    urls = ",".join(nats.urls)
    brokers = {name: Broker(hosts, name, urls, tmp_path) for name in BROKERS}
    eventmq: list[InteropProcess] = []
    clients: dict[str, InteropProcess] = {}
    stop_file = tmp_path / "stop"
    windows: list[Window] = []
    try:
        nats.start(timeout=30)
        for broker in brokers.values():
            broker.start()
        poll_until(lambda: all(b.ready() for b in brokers.values()), 60, "brokers serving")
        for name, broker in brokers.items():
            eventmq.append(
                InteropProcess(
                    "jobmanager.py", broker.worker, json.dumps([[10, "default"]]),
                    str(JOBS_PER_MANAGER), log=tmp_path / f"jobmanager-{name}.log",
                    # Heartbeats every second, silence judged in 2 s: it INFORMs a restarted
                    # broker again within a few seconds.
                    env={"EVENTMQ_HEARTBEAT_INTERVAL": "1", "EVENTMQ_HEARTBEAT_TIMEOUT": "2",
                         "NEMESIS_RUNS": str(tmp_path / f"runs-{name}.txt")},
                    prefix=hosts.prefix(name),
                )
            )  # fmt: skip
        poll_until(lambda: all(b.serving() for b in brokers.values()), 60, "job managers")
        schedule = InteropProcess(
            "schedule.py", brokers["b1"].client, f"{JOBS}.nemesis_run",
            json.dumps(["schedule", 0]), "1", f"run_count:{SCHEDULE_RUNS}",
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

        def progressed(before: dict[str, int]) -> bool:
            now = acks()
            return all(now[n] >= before[n] + 5 for n in BROKERS) and all(
                b.serving() for b in brokers.values()
            )

        poll_until(lambda: progressed(dict.fromkeys(BROKERS, 0)), 60, "requests flowing")
        began = time.time()
        kinds = rng.sample(KINDS, len(KINDS))
        for round_ in range(ROUNDS):
            kind = kinds[round_] if round_ < len(kinds) else rng.choice(KINDS)
            before = acks()
            window = fault(kind, rng, hosts, nats, brokers)
            windows.append(window)
            print(
                f"round {round_ + 1}: {kind} {window.host} "
                f"({window.start - began:.1f}s to {window.end - began:.1f}s)"
            )
            # Every client acknowledged again, every broker serving with its job manager:
            # the system recovered before the next fault.
            poll_until(lambda b=before: progressed(b), 90, f"progress after {kind}")
        stop_file.touch()
        for name, client in clients.items():
            poll_until(client.finished, 120, f"the client at {name} to finish")
        # Every acknowledged request runs, however late (one a killed broker held waits out
        # ack_wait), and the schedule runs out. Past the deadline check() says what is lost.
        with contextlib.suppress(AssertionError):
            poll_until(lambda: settled(tmp_path), SCHEDULE_RUNS + 60.0, "every run")
        counts = check(tmp_path, windows)
        by_kind = ", ".join(f"{k}: {counts['duplicated ' + k]}" for k in KINDS)
        print(
            f"nemesis (emqp): {ROUNDS} rounds ({', '.join(w.kind for w in windows)}): "
            f"{counts['sent']} guaranteed requests sent, {counts['acknowledged']} acknowledged "
            f"and every one ran, {counts['answered']} answered (each with its own result), "
            f"{counts['ran']} ran ({counts['unacknowledged_ran']} never acknowledged) in "
            f"{counts['runs']} runs: {counts['duplicated']} ran more than once, each under a "
            f"fault ({by_kind}); "
            f"the schedule of {SCHEDULE_RUNS} runs ran "
            f"{counts['schedule_runs']} times ({counts['schedule_excused']} under a fault): "
            "no anomaly"
        )
    finally:
        for client in clients.values():
            client.stop()
        for process in eventmq:
            process.stop()
        hosts.heal()
        for broker in brokers.values():
            broker.stop()
        nats.stop()


def settled(root: Path) -> bool:
    ran = [r.token for r in read_runs(root) if r.end is not None]
    return set(acknowledged(root)) <= set(ran) and ran.count("schedule") >= SCHEDULE_RUNS


def fault(
    kind: str, rng: random.Random, hosts: Hosts, nats: NatsCluster, brokers: dict[str, Broker]
) -> Window:
    """Do one fault, hold it FAULT_SECONDS, undo it; say what was done and when."""
    if kind == "kill-nats":
        node = rng.choice(nats.nodes)
        window = Window(kind, node.name, time.time())
        nats.kill(node)
        time.sleep(FAULT_SECONDS)
        nats.start(node, timeout=30)
    elif kind == "kill-broker":
        broker = brokers[rng.choice(BROKERS)]
        window = Window(kind, broker.name, time.time())
        broker.signal(signal.SIGKILL)
        time.sleep(FAULT_SECONDS)
        broker.start()
        poll_until(broker.ready, 60, f"{broker.name} serving again")
    else:
        name = rng.choice(BROKERS)
        window = Window(kind, name, time.time())
        hosts.cut([name])
        time.sleep(FAULT_SECONDS)
        hosts.heal()
    window.end = time.time()
    return window
