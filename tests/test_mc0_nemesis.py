"""mc0 brokers on NATS under a nemesis (issue 47): six hosts as network namespaces (three
nats-servers in one cluster, two ``twistd -n mc0 --nats`` brokers, one host of clients:
mc0 connectors given both brokers, each subscribed to one topic and PUTting to it with
IDs), and rounds of faults while messages flow, each healed before the next: kill -9 of a
broker (started again), SIGSTOP of a broker, kill -9 of a nats-server (started again), and
a host's link cut (a broker's or a nats-server's).

The checker reads what every client recorded (tests/mc0_nemesis_clients.py: its sessions,
each PUT and its answer, each MESSAGE), every anomaly listed at the end:

- **No message twice**: no subscriber received a message twice, over all its sessions,
  whatever the faults.
- **Nothing acknowledged lost while both ends were connected to live brokers**: a PUT
  answered OK was received by every client whose session held the topic (its SUB
  acknowledged) from INTEREST_SLACK before the PUT was sent until GRACE after its OK, at a
  broker no fault touched meanwhile, while no nats-server was lost (a broker on a lost or
  cut-off server loses what comes for it until it noticed, two pings later, and
  reconnected: docs/mc0.md). Faults at the PUT's own broker excuse nothing: its OK says the
  cluster had it.

``NEMESIS_ROUNDS`` (default 4: one of each kind) sets the rounds, ``NEMESIS_SEED`` the
faults' order; ``make nemesis-mc0`` runs 16.
"""

from __future__ import annotations

import json
import os
import random
import signal
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from bus.nats.servers import NatsCluster
from tests.curve_helpers import Keys
from tests.nemesis import Window
from tests.netns import Hosts, HostService, LinePeer, make_hosts, nats_on_hosts, poll_until
from tests.processes import START_BOUND

pytest.importorskip("nats")

ROUNDS = int(os.environ.get("NEMESIS_ROUNDS", "4"))
SEED = int(os.environ.get("NEMESIS_SEED", str(random.randrange(1 << 30))))
FAULT_SECONDS = 4.0
PORT = 7000  # every host is a namespace of its own
BIN = Path(sys.executable).parent
NATS_NODES = ["n1", "n2", "n3"]
BROKERS = ["b1", "b2"]
KINDS = ["kill-broker", "stop-broker", "kill-nats", "cut-host"]
#: After a broker's fault: its clients have left it (silent for 1.05 x their 2 s TTL) or
#: come back to it with their topics.
BROKER_SETTLE = 3.0
#: After a nats-server's fault: a broker on it noticed (two pings, 1 s apart) and made its
#: subscriptions on another (connection attempts back off up to 2 s).
NATS_SETTLE = 6.0
#: A PUT's MESSAGE is owed to a session that still held its topic this long after the OK.
GRACE = 5.0
#: A broker's SUB on NATS is confirmed by its own server; the other servers of the cluster
#: learn of the interest over their routes a moment later.
INTEREST_SLACK = 1.0


class Broker(HostService):
    """One broker on its host (CURVE, the key pair of the test), restartable."""

    #: Serving, its link to NATS up (it says so before it says it started).
    ready_line = "started mc0"

    def __init__(self, hosts: Hosts, name: str, nats_urls: str, root: Path, keys: Keys) -> None:
        address = hosts.addresses[name]
        self.endpoint = f"tcp://{address}:{PORT}"
        argv = [
            str(BIN / "twistd"), "-n", "--pidfile=", "mc0", "--bind", address, "--port",
            str(PORT), "--data-dir", str(root / name), "--server-cert", str(keys.server_cert),
            "--nats", nats_urls, "--nats-without-tls",
        ]  # fmt: skip
        super().__init__(hosts, name, root, argv)


@pytest.fixture
def hosts() -> Iterator[Hosts]:
    made = make_hosts([*NATS_NODES, *BROKERS, "c"])
    try:
        yield made
    finally:
        made.delete()


def read_records(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def sessions_of(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A client's sessions: endpoint, opened, subscribed (None: never), closed (None: open
    at the end)."""
    sessions: list[dict[str, Any]] = []
    for record in records:
        if record["kind"] != "session":
            continue
        if record["event"] == "open":
            sessions.append(
                {"endpoint": record["endpoint"], "open": record["at"], "subscribed": None,
                 "closed": None}
            )  # fmt: skip
        elif sessions and record["event"] == "subscribed" and sessions[-1]["subscribed"] is None:
            sessions[-1]["subscribed"] = record["at"]
        elif sessions and record["event"] == "closed":
            sessions[-1]["closed"] = record["at"]
    return sessions


def check(
    out: Path, windows: list[Window], broker_of: dict[str, str]
) -> tuple[dict[str, Any], list[str]]:
    """The checker (see the module's text): what it counted, and every anomaly."""
    anomalies: list[str] = []
    clients = {
        int(path.stem.split("-")[1]): read_records(path) for path in out.glob("client-*.jsonl")
    }
    sessions = {index: sessions_of(records) for index, records in clients.items()}
    received: dict[int, set[tuple[int, int]]] = {}
    for index, records in clients.items():
        got = Counter((r["from"], r["seq"]) for r in records if r["kind"] == "got")
        twice = sorted(message for message, n in got.items() if n > 1)
        if twice:
            anomalies.append(f"client {index} received {len(twice)} messages twice: {twice[:5]}")
        received[index] = set(got)

    def excused(broker: str, start: float, end: float) -> Window | None:
        for window in windows:
            touches = window.everywhere or window.host == broker
            if touches and window.start <= end and window.settled >= start:
                return window
        return None

    answers: Counter[str] = Counter()
    owed = lost = excused_by_fault = 0
    for publisher, records in clients.items():
        for put in (r for r in records if r["kind"] == "put"):
            answers[put["answer"] if put["answer"] in ("OK", "lost") else put["answer"][:40]] += 1
            if put["answer"] != "OK":
                continue
            for subscriber, held in sessions.items():
                session = next(
                    (
                        s
                        for s in held
                        if s["subscribed"] is not None
                        and s["subscribed"] <= put["sent"] - INTEREST_SLACK
                        and (s["closed"] is None or s["closed"] >= put["answered"] + GRACE)
                    ),
                    None,
                )
                if session is None:
                    continue
                broker = broker_of[session["endpoint"]]
                if excused(broker, put["sent"], put["answered"] + GRACE) is not None:
                    excused_by_fault += 1
                    continue
                owed += 1
                if (publisher, put["seq"]) not in received[subscriber]:
                    lost += 1
                    if lost <= 10:
                        anomalies.append(
                            f"PUT {publisher}/{put['seq']} (sent {put['sent']:.3f}, OK "
                            f"{put['answered']:.3f}) never reached client {subscriber}, "
                            f"subscribed at {broker} from {session['subscribed']:.3f}"
                        )
    if lost > 10:
        anomalies.append(f"... {lost} acknowledged deliveries lost in all")
    counts = {
        "answers": dict(answers),
        "owed": owed,
        "excused_by_fault": excused_by_fault,
        "received": sum(len(r) for r in received.values()),
        "sessions": sum(len(s) for s in sessions.values()),
    }
    return counts, anomalies


def test_nothing_acknowledged_is_lost_and_nothing_comes_twice_through_rounds_of_faults(
    hosts: Hosts, tmp_path: Path
) -> None:
    rng = random.Random(SEED)
    print(f"mc0 nemesis: {ROUNDS} rounds, NEMESIS_SEED={SEED}")
    keys = Keys(tmp_path / "keys")
    nats = nats_on_hosts(hosts, NATS_NODES, tmp_path / "nats")
    urls = nats.urls
    brokers = {
        # Each broker on another server first: messages cross the cluster's routes.
        name: Broker(hosts, name, ",".join(urls[i:] + urls[:i]), tmp_path, keys)
        for i, name in enumerate(BROKERS)
    }
    broker_of = {broker.endpoint: name for name, broker in brokers.items()}
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
                *hosts.prefix("c"), sys.executable, "-m", "tests.mc0_nemesis_clients",
                "--broker", brokers["b1"].endpoint, "--broker", brokers["b2"].endpoint,
                f"--server-key={keys.server.public.decode()}", "--out", str(out),
            ],
            tmp_path / "clients.log",
        )  # fmt: skip
        clients.wait_for("PROGRESS", timeout=START_BOUND, ready=True)

        def acked() -> int:
            progress = clients.events("PROGRESS") if clients is not None else []
            return int(progress[-1]["acked"]) if progress else 0

        kinds = rng.sample(KINDS, len(KINDS))
        for round_ in range(ROUNDS):
            kind = kinds[round_] if round_ < len(kinds) else rng.choice(KINDS)
            window = fault(kind, rng, hosts, nats, brokers)
            windows.append(window)
            print(f"round {round_ + 1}: {kind} {window.host}")
            # The checker excuses what a fault may have touched, up to GRACE past its
            # settling: the next fault comes after that, and after PUTs acknowledged since
            # (the system recovered), so that every round leaves PUTs that must be delivered.
            quiet = window.settled + GRACE + INTEREST_SLACK
            poll_until(lambda q=quiet: time.time() > q, 60, f"{kind}'s window over")
            before = acked()
            poll_until(lambda b=before: acked() > b + 40, 90, f"progress after {kind}")
        clients.send({"cmd": "finish"})
        finished = clients.wait_for("FINISHED", timeout=START_BOUND)
        counts, anomalies = check(out, windows, broker_of)
        print(f"mc0 nemesis: {finished}; {counts}")
        for anomaly in anomalies:
            print("ANOMALY", anomaly)
        assert anomalies == []
        assert counts["owed"] > 0 and counts["answers"].get("OK", 0) > 0
    finally:
        if clients is not None:
            clients.stop()
        hosts.heal()
        for broker in brokers.values():
            broker.stop()
        for node in nats.nodes:
            if node.process is not None and node.process.poll() is None:
                node.process.send_signal(signal.SIGCONT)
        nats.stop()


def fault(
    kind: str, rng: random.Random, hosts: Hosts, nats: NatsCluster, brokers: dict[str, Broker]
) -> Window:
    """Do one fault, hold it FAULT_SECONDS, undo it (a process killed is serving again):
    its window."""
    if kind == "kill-nats":
        node = rng.choice(nats.nodes)
        window = Window(kind, node.name, time.time(), settle=NATS_SETTLE, everywhere=True)
        nats.kill(node)
        time.sleep(FAULT_SECONDS)
        nats.start(node, timeout=30)
    elif kind in ("kill-broker", "stop-broker"):
        broker = brokers[rng.choice(BROKERS)]
        window = Window(kind, broker.name, time.time(), settle=BROKER_SETTLE)
        broker.signal(signal.SIGKILL if kind == "kill-broker" else signal.SIGSTOP)
        time.sleep(FAULT_SECONDS)
        if kind == "kill-broker":
            broker.start()
            poll_until(broker.ready, START_BOUND, f"{broker.name} serving again")
        else:
            broker.signal(signal.SIGCONT)
    else:
        host = rng.choice([*NATS_NODES, *BROKERS])
        on_nats = host in NATS_NODES
        window = Window(
            kind,
            host,
            time.time(),
            settle=NATS_SETTLE if on_nats else BROKER_SETTLE,
            everywhere=on_nats,
        )
        hosts.cut([host])
        time.sleep(FAULT_SECONDS)
        hosts.heal()
    window.end = time.time()
    return window
