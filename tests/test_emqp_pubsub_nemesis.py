"""eMQP's PUBLISH service across brokers under a nemesis (issue 47): six hosts as network
namespaces (three nats-servers in one cluster, two ``emqp-pubsub`` brokers on ``--nats``, one
host of clients: at each broker a publisher and two subscribers, and a watcher asking every
broker and nats-server what it says of itself; tests/emqp_pubsub_nemesis_clients.py), and
rounds of faults while publications flow, each healed before the next: kill -9 of a broker
(started again), SIGSTOP of a broker, kill -9 of a nats-server (started again), and a host's
link cut (a broker's or a nats-server's).

The checker reads what every subscriber received and what the watcher heard, every anomaly
listed at the end:

- **No publication twice**: no subscriber received a publication twice, whatever the faults
  (nor one nobody sent).
- **None lost while everything on its way was connected and alive.** A publication is owed
  to a subscriber at the other broker when, from INTEREST_SLACK before it was sent until
  GRACE after its own broker's subscribers had it, all of these held, each as the processes
  themselves said it:

  - *the publisher connected to its broker*: a subscriber at the publisher's broker received
    it (the broker had it; the earliest such receipt ends the time it was handled in);
  - *a broker connected and alive*: each of the watcher's polls of its ``/status`` answered
    within a second, from one process (``pid``), with its link ``connected`` and its count
    of ``disconnects`` unchanged, from the publication's sending to its handling (its
    broker) and over the whole span (the subscriber's broker), and still DETECTION after:
    a link silently cut says ``connected`` until its client misses two PINGs (sent every
    2 s), so what a broker says of its link holds for a moment only once it has said the
    same that much later. A process stopped, killed, cut from the clients or off NATS even
    for an instant between two polls breaks the run;
  - *the subscriber in place at its broker*: it received a publication of its own broker's
    publisher in that run of its broker, INTEREST_SLACK before this one was sent (its
    subscription reached the broker, which then listened on NATS for it);
  - *the NATS cluster connected and alive*: each nats-server answered ``/routez`` every poll,
    the same server (``server_id``) with the same routes (their ids) to both others, until
    DETECTION after (a host's cut reaches its links one after another).

``NEMESIS_ROUNDS`` (default 4: one of each kind) sets the rounds, ``NEMESIS_SEED`` the
faults' order; ``make nemesis-emqp-pubsub`` runs 16.
"""

from __future__ import annotations

import bisect
import os
import random
import signal
import sys
import time
from collections import Counter, defaultdict
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from bus.nats.servers import NatsCluster
from tests import netns
from tests.nemesis import BIN, Window
from tests.netns import Hosts, HostService, LinePeer, poll_until
from tests.processes import START_BOUND

pytest.importorskip("nats")

ROUNDS = int(os.environ.get("NEMESIS_ROUNDS", "4"))
SEED = int(os.environ.get("NEMESIS_SEED", str(random.randrange(1 << 30))))
FAULT_SECONDS = 4.0
PORT = 7000  # publishers; subscribers on PORT + 1 (every host is a namespace of its own)
HTTP_PORT = 8080
MONITOR_PORT = 8222
NATS_NODES = ["n1", "n2", "n3"]
BROKERS = ["b1", "b2"]
KINDS = ["kill-broker", "stop-broker", "kill-nats", "cut-host"]
#: A publication's path must have held from this long before it was sent: a broker's new
#: subscription on NATS reaches the other servers of the cluster over their routes.
INTEREST_SLACK = 1.0
#: ... and until this long after its broker's subscribers had it.
GRACE = 5.0
#: How long after a silent loss of its connection (a host cut) a process may still say all
#: is well: a NATS client misses two PINGs, 2 s apart, and leaves at the third (6 s), plus
#: a busy machine's reactor delays.
DETECTION = 7.0
#: After a fault, before the next: brokers back on NATS (a lost server noticed in two pings
#: 1 s apart, connection attempts backing off up to 2 s) and every subscriber hearing both
#: publishers again.
SETTLE = 6.0
#: After a fault, the next comes once every subscriber has heard each publisher this long
#: after the heal: publications of five seconds, past the settling, whose whole span (from
#: INTEREST_SLACK before to GRACE after, and DETECTION beyond) ends before the next fault,
#: so that every round leaves publications the checker owes.
QUIET = SETTLE + INTEREST_SLACK + GRACE + DETECTION + 5.0


class Broker(HostService):
    """``twistd -n eventbus --services emqp-pubsub --emqp-pubsub-nats URLS`` on its host: its
    ports and its ``/status`` on its address."""

    #: On NATS and serving: it says what the servers take once connected.
    ready_line = "the servers take messages of up to"

    def __init__(self, hosts: Hosts, name: str, nats_urls: str, root: Path) -> None:
        address = hosts.addresses[name]
        self.publishers = f"tcp://{address}:{PORT}"
        self.subscribers = f"tcp://{address}:{PORT + 1}"
        self.status_url = f"http://{address}:{HTTP_PORT}/status"
        argv = [
            str(BIN / "twistd"), "-n", "--pidfile=", "eventbus", "--services", "emqp-pubsub",
            "--data-dir", str(root / name), "--http-bind", address, "--http-port",
            str(HTTP_PORT), "--emqp-pubsub-bind", address, "--emqp-pubsub-incoming-port",
            str(PORT), "--emqp-pubsub-outgoing-port", str(PORT + 1), "--emqp-pubsub-nats",
            nats_urls, "--emqp-pubsub-stats-interval", "1s",
        ]  # fmt: skip
        super().__init__(hosts, name, root, argv)


@pytest.fixture
def hosts() -> Iterator[Hosts]:
    yield from netns.hosts_while_used([*NATS_NODES, *BROKERS, "c"])


# -- the checker ------------------------------------------------------------------------------


@dataclass
class Run:
    """A span over which every poll of one process answered alike (see the module's text)."""

    start: float  # the first such poll's answer
    end: float  # the last such poll's question

    def covers(self, start: float, end: float) -> bool:
        return self.start <= start and end <= self.end


def broker_runs(polls: list[dict[str, Any]]) -> list[Run]:
    """A broker's runs: consecutive polls answered, connected, from one pid, with the same
    count of disconnects."""
    runs: list[Run] = []
    key: Any = None
    for poll in sorted(polls, key=lambda p: p["asked"]):
        now = (poll["pid"], poll["disconnects"]) if poll["answered"] and poll["connected"] else None
        if now is None:
            key = None
            continue
        if now == key:
            runs[-1].end = poll["asked"]
        else:
            runs.append(Run(poll["answered"], poll["answered"]))
            key = now
    return trimmed(runs)


def trimmed(runs: list[Run]) -> list[Run]:
    """Each run without its last DETECTION seconds (see the module's text)."""
    kept = [Run(run.start, run.end - DETECTION) for run in runs]
    return [run for run in kept if run.end > run.start]


def nats_runs(polls: list[dict[str, Any]], peers: int) -> list[Run]:
    """A nats-server's runs: consecutive polls answered by the same server, with the same
    routes, to ``peers`` others."""
    runs: list[Run] = []
    key: Any = None
    for poll in sorted(polls, key=lambda p: p["asked"]):
        whole = poll["answered"] and len(poll["peers"]) == peers
        now = (poll["server_id"], tuple(poll["routes"])) if whole else None
        if now is None:
            key = None
            continue
        if now == key:
            runs[-1].end = poll["asked"]
        else:
            runs.append(Run(poll["answered"], poll["answered"]))
            key = now
    return trimmed(runs)


def covered(runs: list[Run], start: float, end: float) -> Run | None:
    return next((run for run in runs if run.covers(start, end)), None)


def check(out: Path) -> tuple[dict[str, Any], list[str]]:
    """The checker (see the module's text): what it counted, and every anomaly."""
    anomalies: list[str] = []
    sent = {(r["pub"], r["seq"]): r["sent"] for r in netns.read_records(out / "sent.jsonl")}
    got = netns.read_records(out / "got.jsonl")
    polls: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for poll in netns.read_records(out / "polls.jsonl"):
        polls[poll["who"]].append(poll)
    runs = {name: broker_runs(polls[name]) for name in BROKERS}
    each_nats = [nats_runs(polls[name], len(NATS_NODES) - 1) for name in NATS_NODES]

    def nats_whole(start: float, end: float) -> bool:
        return all(covered(server, start, end) is not None for server in each_nats)

    broker_of: dict[str, str] = {}
    received: dict[str, Counter[tuple[str, int]]] = defaultdict(Counter)
    #: When each broker's subscribers first had each publication (the broker handled it).
    handled: dict[tuple[str, int], float] = {}
    #: When each subscriber received its own broker's publications, in order.
    local: dict[str, list[float]] = defaultdict(list)
    for record in got:
        sub, broker, message = record["sub"], record["at_broker"], (record["pub"], record["seq"])
        broker_of[sub] = broker
        received[sub][message] += 1
        if record["pub"] == broker:
            local[sub].append(record["at"])
            handled[message] = min(handled.get(message, record["at"]), record["at"])
    for sub, counts in sorted(received.items()):
        twice = sorted(m for m, n in counts.items() if n > 1)
        if twice:
            anomalies.append(
                f"subscriber {sub} received {len(twice)} publications twice: {twice[:5]}"
            )
        foreign = sorted(m for m in counts if m not in sent)
        if foreign:
            anomalies.append(f"subscriber {sub} received {len(foreign)} never sent: {foreign[:5]}")
    for times in local.values():
        times.sort()

    def in_place(sub: str, run: Run, by: float) -> bool:
        """``sub`` received a publication of its own broker's publisher within ``run``, by
        ``by``."""
        times = local[sub]
        first = bisect.bisect_left(times, run.start)
        return first < len(times) and times[first] <= by

    why: Counter[str] = Counter()
    owed = lost = 0
    for (pub, seq), sent_at in sorted(sent.items(), key=lambda item: item[1]):
        at_broker = handled.get((pub, seq))
        if at_broker is None:
            why["never at its broker"] += 1
            continue
        if covered(runs[pub], sent_at, at_broker) is None:
            why["its broker not connected and alive"] += 1
            continue
        start, end = sent_at - INTEREST_SLACK, at_broker + GRACE
        if not nats_whole(start, end):
            why["the NATS cluster not whole"] += 1
            continue
        for sub, broker in sorted(broker_of.items()):
            if broker == pub:
                continue
            run = covered(runs[broker], start, end)
            if run is None:
                why["the subscriber's broker not connected and alive"] += 1
                continue
            if not in_place(sub, run, start):
                why["the subscriber not yet in place"] += 1
                continue
            owed += 1
            if received[sub][(pub, seq)] == 0:
                lost += 1
                if lost <= 10:
                    anomalies.append(
                        f"publication {pub}/{seq} (sent {sent_at:.3f}, at {pub} {at_broker:.3f}) "
                        f"never reached {sub} at {broker}"
                    )
    if lost > 10:
        anomalies.append(f"... {lost} owed publications lost in all")
    counts = {
        "sent": len(sent),
        "received": sum(sum(c.values()) for c in received.values()),
        "owed": owed,
        "lost": lost,
        "not_owed": dict(why),
        "broker_runs": {name: len(r) for name, r in runs.items()},
        "polls": sum(len(p) for p in polls.values()),
        # Its own publications heard back from NATS (dropped): each run's last word, summed.
        "own_returned": {
            name: sum(
                max(
                    (p.get("own_returned") or 0 for p in polls[name] if p.get("pid") == pid),
                    default=0,
                )
                for pid in {p.get("pid") for p in polls[name]}
            )
            for name in BROKERS
        },
    }
    return counts, anomalies


# -- the test ---------------------------------------------------------------------------------


@pytest.mark.netns
@pytest.mark.slow
def test_no_publication_twice_and_none_lost_while_its_path_was_up_through_rounds_of_faults(
    hosts: Hosts, tmp_path: Path
) -> None:
    rng = random.Random(SEED)
    print(f"emqp-pubsub nemesis: {ROUNDS} rounds, NEMESIS_SEED={SEED}")
    nats = NatsCluster(
        tmp_path / "nats",
        size=len(NATS_NODES),
        hosts=[hosts.addresses[name] for name in NATS_NODES],
        client_ports=[4222] * len(NATS_NODES),
        route_ports=[6222] * len(NATS_NODES),
        prefix=lambda node: hosts.prefix(node.name),
        extra=f"http_port: {MONITOR_PORT}",  # /routez, for the clients' watcher
    )
    urls = nats.urls
    brokers = {
        # Each broker on another server first: publications cross the cluster's routes.
        name: Broker(hosts, name, ",".join(urls[i:] + urls[:i]), tmp_path)
        for i, name in enumerate(BROKERS)
    }
    clients: LinePeer | None = None
    out = tmp_path / "records"
    windows: list[Window] = []
    try:
        nats.start(timeout=30)
        for broker in brokers.values():
            broker.start()
        poll_until(lambda: all(b.ready() for b in brokers.values()), START_BOUND, "brokers")
        clients = LinePeer(
            [
                *hosts.prefix("c"), sys.executable, "-m", "tests.emqp_pubsub_nemesis_clients",
                *(f"--broker={n}={b.publishers},{b.subscribers},{b.status_url}"
                  for n, b in brokers.items()),
                *(f"--nats={n}=http://{hosts.addresses[n]}:{MONITOR_PORT}/routez"
                  for n in NATS_NODES),
                "--out", str(out),
            ],
            tmp_path / "clients.log",
        )  # fmt: skip
        clients.wait_for("READY", timeout=START_BOUND)

        def everyone_hears_everyone_since(since: float) -> bool:
            """Every subscriber has received a publication of each publisher sent after
            ``since``."""
            progress = clients.events("PROGRESS") if clients is not None else []
            if not progress:
                return False
            latest: dict[str, dict[str, float]] = progress[-1]["latest"]
            return len(latest) == 2 * len(BROKERS) and all(
                all(heard.get(pub, 0.0) > since for pub in BROKERS) for heard in latest.values()
            )

        # Whole once: the first fault may come at once (the rounds leave what is owed).
        began = time.time()
        poll_until(
            lambda: everyone_hears_everyone_since(began + INTEREST_SLACK), 180, "first traffic"
        )
        kinds = rng.sample(KINDS, len(KINDS))
        for round_ in range(ROUNDS):
            kind = kinds[round_] if round_ < len(kinds) else rng.choice(KINDS)
            window = fault(kind, rng, hosts, nats, brokers)
            windows.append(window)
            print(f"round {round_ + 1}: {kind} {window.host}")
            # Back to whole before the next: everyone hears everyone again, and publications
            # sent well after the heal (which the checker owes) have come.
            poll_until(
                lambda w=window: everyone_hears_everyone_since(w.end + QUIET), 180,
                f"everyone hearing everyone after {kind}",
            )  # fmt: skip
        clients.send({"cmd": "finish"})
        finished = clients.wait_for("FINISHED", timeout=START_BOUND)
        counts, anomalies = check(out)
        print(f"emqp-pubsub nemesis: {finished}; {counts}")
        for window in windows:
            print(f"  {window}")
        for anomaly in anomalies:
            print("ANOMALY", anomaly)
        assert anomalies == []
        assert counts["owed"] > 0
    finally:
        if clients is not None:
            clients.stop()
        hosts.heal()
        for broker in brokers.values():
            broker.stop()  # a stopped one is continued first
        for node in nats.nodes:
            if node.process is not None and node.process.poll() is None:
                node.process.send_signal(signal.SIGCONT)
        nats.stop()
    for broker in brokers.values():
        broker.assert_no_traceback()


def fault(
    kind: str, rng: random.Random, hosts: Hosts, nats: NatsCluster, brokers: dict[str, Broker]
) -> Window:
    """Do one fault, hold it FAULT_SECONDS, undo it (a process killed is serving again):
    its window (for the record: the checker reads what the processes said)."""
    if kind == "kill-nats":
        node = rng.choice(nats.nodes)
        window = Window(kind, node.name, time.time(), everywhere=True)
        nats.kill(node)
        time.sleep(FAULT_SECONDS)  # the fault's length, not a wait for something
        nats.start(node, timeout=30)
    elif kind in ("kill-broker", "stop-broker"):
        broker = brokers[rng.choice(BROKERS)]
        window = Window(kind, broker.name, time.time())
        broker.signal(signal.SIGKILL if kind == "kill-broker" else signal.SIGSTOP)
        time.sleep(FAULT_SECONDS)
        if kind == "kill-broker":
            broker.start()
            poll_until(broker.ready, START_BOUND, f"{broker.name} serving again")
        else:
            broker.signal(signal.SIGCONT)
    else:
        host = rng.choice([*NATS_NODES, *BROKERS])
        window = Window(kind, host, time.time(), everywhere=host in NATS_NODES)
        hosts.cut([host])
        time.sleep(FAULT_SECONDS)
        hosts.heal()
    window.end = time.time()
    return window


# -- the checker on records made here ---------------------------------------------------------


def write_records(out: Path, records: dict[str, list[dict[str, Any]]]) -> None:
    import json

    out.mkdir(parents=True, exist_ok=True)
    for name, lines in records.items():
        (out / name).write_text("".join(json.dumps(line) + "\n" for line in lines))


def a_quiet_run(
    seconds: float = 20.0, unanswered: tuple[str, float, float] | None = None
) -> dict[str, list[dict[str, Any]]]:
    """Records of a run with no fault: polls every 0.25 s, everything answering (but
    ``unanswered``: who, from, to), a publication from each broker every 0.1 s, each received
    by every subscriber 10 ms later."""
    polls: list[dict[str, Any]] = []
    t = 0.0
    while t < seconds:
        for pid, who in enumerate([*BROKERS, *NATS_NODES]):
            silent = unanswered is not None and who == unanswered[0]
            if silent and unanswered is not None and unanswered[1] <= t <= unanswered[2]:
                polls.append({"who": who, "asked": t, "answered": None})
            elif who in BROKERS:
                polls.append({"who": who, "asked": t, "answered": t + 0.01, "pid": pid,
                              "connected": True, "disconnects": 0})  # fmt: skip
            else:
                others = [n for n in NATS_NODES if n != who]
                polls.append({"who": who, "asked": t, "answered": t + 0.01, "server_id": who,
                              "routes": ["1", "2"], "peers": others})  # fmt: skip
        t += 0.25
    sent, got = [], []
    seq = 0
    t = 0.1
    while t < seconds - GRACE - 1:
        seq += 1
        for pub in BROKERS:
            sent.append({"pub": pub, "seq": seq, "sent": t})
            for broker in BROKERS:
                for index in range(2):
                    got.append({"sub": f"{broker}.{index}", "at_broker": broker, "pub": pub,
                                "seq": seq, "at": t + 0.01})  # fmt: skip
        t += 0.1
    return {"sent.jsonl": sent, "got.jsonl": got, "polls.jsonl": polls}


def test_the_checker_owes_what_crossed_a_whole_path_and_finds_one_lost_and_one_twice(
    tmp_path: Path,
) -> None:
    records = a_quiet_run()
    write_records(tmp_path / "whole", records)
    counts, anomalies = check(tmp_path / "whole")
    assert anomalies == []
    owed = counts["owed"]
    # Every publication from 1 s on (a subscriber in place: INTEREST_SLACK after the first
    # local one) to each subscriber of the other broker.
    assert owed > 0 and counts["lost"] == 0
    got = records["got.jsonl"]
    dropped = next(r for r in got if r["sub"] == "b2.0" and r["pub"] == "b1" and r["seq"] == 50)
    lost = [r for r in got if r is not dropped]
    lost.append(dict(next(r for r in got if r["sub"] == "b1.1" and r["seq"] == 60)))
    write_records(tmp_path / "faulty", {**records, "got.jsonl": lost})
    counts, anomalies = check(tmp_path / "faulty")
    assert counts["lost"] == 1 and len(anomalies) == 2, anomalies
    assert any("b1/50" in a and "b2.0" in a for a in anomalies)
    assert any("b1.1 received 1 publications twice" in a for a in anomalies)


def test_the_checker_owes_nothing_across_a_broker_that_did_not_answer(tmp_path: Path) -> None:
    """b2 silent from 5 s to 7 s: what b1 published from INTEREST_SLACK before its silence
    until GRACE after it is not owed to b2's subscribers, and its loss is no anomaly; a loss
    outside that still is."""
    records = a_quiet_run(seconds=40.0, unanswered=("b2", 5.0, 7.0))
    got = records["got.jsonl"]

    kept = [
        r for r in got if not (r["at_broker"] == "b2" and r["pub"] == "b1" and 45 <= r["seq"] <= 75)
    ]
    write_records(tmp_path / "excused", {**records, "got.jsonl": kept})
    counts, anomalies = check(tmp_path / "excused")
    assert (
        anomalies == []
        and counts["not_owed"]["the subscriber's broker not connected and alive"] > 0
    )
    # Lost at 12 s (b2 answering since 7 s, its subscribers in place again): owed.
    kept = [r for r in got if not (r["at_broker"] == "b2" and r["pub"] == "b1" and r["seq"] == 120)]
    write_records(tmp_path / "owed", {**records, "got.jsonl": kept})
    counts, anomalies = check(tmp_path / "owed")
    assert counts["lost"] == 2, anomalies  # both of b2's subscribers
