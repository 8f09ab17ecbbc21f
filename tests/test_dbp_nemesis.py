"""DBP on the cluster under a nemesis: six hosts as network namespaces (three nats-servers
with an R3 bucket, two ``twistd -n dbp --nats`` instances each with its UDP heartbeat port
and its SHALOM beacon on its host's interface, one host of clients), and rounds of faults:
kill -9 of an instance (started again), SIGSTOP of an instance, a catalog host's link cut,
each healed before the next round.

The clients (tests/dbp_peers): our service library given both instances, heartbeating every
200 ms over UDP from the clients' host; Hermes' client asking each instance for the whole
list in turn; Hermes' service registering a new name every second at one instance, then the
other (kept: ``--hermes-services keep``).

The checker reads every answer: none that lists services (rather than saying it is not
current) may miss the heartbeating service or show it inactive, nor miss a Hermes service
whose registration was approved :data:`PROPAGATION` seconds before the question was sent,
unless the instance that answered was inside its own fault then (cut or stopped: the
answers of an instance whose link is cut may be stale until it finds out; after the heal,
never). Every anomaly is listed, with the rounds.

``DBP_NEMESIS_ROUNDS`` (default 3: one of each kind) sets the rounds, ``DBP_NEMESIS_SEED``
their order; ``make nemesis-dbp`` runs 12, and adds kill -9 of a nats-server to the kinds.
"""

from __future__ import annotations

import os
import random
import signal
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests import netns
from tests.nemesis import BIN, Window
from tests.netns import Hosts, HostService, LinePeer, nats_on_hosts, poll_until
from tests.processes import START_BOUND

pytest.importorskip("nats")

PEERS = Path(__file__).parent / "dbp_peers"
PORT = 5246
CATALOGS = ["d1", "d2"]
NATS_NODES = ["n1", "n2", "n3"]
KINDS = ["kill-catalog", "stop-catalog", "cut-catalog"]
#: More kinds once more rounds are asked for than one of each.
MORE_KINDS = ["kill-nats"]
#: Seconds after a registration is approved by which every instance lists it.
PROPAGATION = 2.0
FAULT_SECONDS = 4.0
ROUNDS = int(os.environ.get("DBP_NEMESIS_ROUNDS", "3"))
SEED = int(os.environ.get("DBP_NEMESIS_SEED", str(random.randrange(1 << 30))))


class Catalog(HostService):
    """``twistd -n dbp --nats`` on its host: the ROUTER and UDP port 5246 on its address,
    the beacon on its interface; it serves once its watch has caught up."""

    #: Its catalog is on NATS once it says what the bucket holds.
    ready_line = "services in bucket DBP_CATALOG"

    def __init__(self, hosts: Hosts, name: str, urls: str, root: Path) -> None:
        index = hosts.names.index(name)
        self.endpoint = f"tcp://{hosts.addresses[name]}:{PORT}"
        argv = [
            str(BIN / "twistd"), "-n", "--pidfile=", "dbp", "--bind", hosts.addresses[name],
            "--port", str(PORT), "--beacon-interface", f"h{index}{hosts.tag}",
            "--beacon-interval", "500ms", "--data-dir", str(root / name),
            "--heartbeat-interval", "200ms", "--nats", urls, "--nats-replicas", "3",
            "--hermes-services", "keep",
        ]  # fmt: skip
        super().__init__(hosts, name, root, argv)


@pytest.fixture
def hosts() -> Iterator[Hosts]:
    yield from netns.hosts_while_used([*NATS_NODES, *CATALOGS, "c"])


def check(
    seen: list[dict[str, Any]], windows: list[Window], sensor_from: float
) -> tuple[dict[str, int], list[str]]:
    """What the clients saw, against the rules above: the counts, and each anomaly."""
    acked = sorted((r["acked"], r["name"]) for r in seen if r["kind"] == "register" and r["acked"])
    anomalies: list[str] = []
    counts = {"answers": 0, "lists": 0, "not_current": 0, "unanswered": 0, "in_fault": 0}
    for record in (r for r in seen if r["kind"] == "info"):
        counts["answers"] += 1
        answer = record.get("answer")
        if answer is None:
            counts["unanswered"] += 1
            continue
        if "Error" in answer:
            counts["not_current"] += 1
            continue
        counts["lists"] += 1
        sent, at = record["sent"], CATALOGS[record["at"]]
        if any(w.host == at and w.start <= sent <= w.end for w in windows):
            counts["in_fault"] += 1
            continue
        if sent >= sensor_from and answer.get("sensor") is not True:
            anomalies.append(f"{at} at {sent:.3f}: the heartbeating service missing or inactive")
        missing = [
            name for when, name in acked if when + PROPAGATION <= sent and name not in answer
        ]
        if missing:
            anomalies.append(f"{at} at {sent:.3f}: stale, without {missing[:5]}")
    counts["registrations_approved"] = len(acked)
    return counts, anomalies


def test_no_registration_lost_and_no_stale_answer_through_rounds_of_faults(
    hosts: Hosts, tmp_path: Path
) -> None:
    print(f"dbp nemesis: {ROUNDS} rounds, DBP_NEMESIS_SEED={SEED}")
    nats = nats_on_hosts(hosts, NATS_NODES, tmp_path / "nats")
    catalogs = {name: Catalog(hosts, name, ",".join(nats.urls), tmp_path) for name in CATALOGS}
    rng = random.Random(SEED)
    out = tmp_path / "seen.jsonl"
    stop_file = tmp_path / "stop"
    peers: list[LinePeer] = []
    windows: list[Window] = []
    try:
        nats.start(timeout=30)
        for catalog in catalogs.values():
            catalog.start()
        poll_until(lambda: all(c.ready() for c in catalogs.values()), START_BOUND,
                   "catalog instances on the bucket")  # fmt: skip
        # Each instance's beacon reaches the clients' host.
        listener = LinePeer([*hosts.prefix("c"), sys.executable, str(PEERS / "beacon_listener.py"),
                             "5245"], tmp_path / "beacons.log")  # fmt: skip
        peers.append(listener)
        listener.wait_for("READY", timeout=START_BOUND)
        poll_until(
            lambda: (
                {e["from"] for e in listener.events("HEARD")}
                >= {hosts.addresses[n] for n in CATALOGS}
            ),
            30,
            "both beacons",
        )
        assert {e["data"] for e in listener.events("HEARD")} == {f"SHALOM {PORT}"}
        endpoints = [catalogs[n].endpoint for n in CATALOGS]
        sensor = LinePeer(
            [*hosts.prefix("c"), sys.executable, str(PEERS / "service_peer.py"), "sensor",
             hosts.addresses["c"], "7100", "5245", ",".join(endpoints)],
            tmp_path / "sensor.log",
        )  # fmt: skip
        peers.append(sensor)
        sensor.wait_for("REGISTERED", timeout=START_BOUND)
        sensor_from = time.time() + PROPAGATION
        clients = LinePeer(
            [*hosts.prefix("c"), sys.executable, str(PEERS / "nemesis_client.py"), str(out),
             str(stop_file), *endpoints],
            tmp_path / "clients.log",
        )  # fmt: skip
        peers.append(clients)
        clients.wait_for("READY", timeout=START_BOUND)

        def both_listing() -> bool:
            """Each instance's latest answer is a list naming every approved registration
            up to a moment ago: the system is back before the next fault."""
            seen = netns.read_records(out)
            latest: dict[int, dict[str, Any]] = {}
            for record in seen:
                if record["kind"] == "info" and "answer" in record:
                    latest[record["at"]] = record["answer"]
            return len(latest) == len(CATALOGS) and all(
                "Error" not in a and a.get("sensor") is True for a in latest.values()
            )

        poll_until(both_listing, 60, "both instances listing the sensor")
        kinds = rng.sample(KINDS, len(KINDS))
        for round_ in range(ROUNDS):
            kind = kinds[round_] if round_ < len(kinds) else rng.choice(KINDS + MORE_KINDS)
            window = fault(kind, rng, hosts, nats, catalogs)
            windows.append(window)
            print(f"round {round_ + 1}: {kind} {window.host}")
            poll_until(both_listing, 90, f"both instances listing again after {kind}")
        stop_file.touch()
        clients.wait_for("STOPPED", timeout=30)
        counts, anomalies = check(netns.read_records(out), windows, sensor_from)
        status = {}
        sensor.send({"status": True})
        status = sensor.wait_for("STATUS", timeout=30)
        print(f"dbp nemesis: {counts}; the service moved {status['moves']} times")
        assert counts["lists"] > 0 and counts["registrations_approved"] > 0
        assert not anomalies, "\n".join(
            [*anomalies[:40], f"({len(anomalies)} anomalies)", *map(str, windows)]
        )
    finally:
        stop_file.touch()
        for peer in peers:
            peer.stop()
        hosts.heal()
        for catalog in catalogs.values():
            catalog.stop()  # a stopped one is continued first
        nats.stop()
    for catalog in catalogs.values():
        catalog.assert_no_traceback()


def fault(
    kind: str, rng: random.Random, hosts: Hosts, nats: Any, catalogs: dict[str, Catalog]
) -> Window:
    """Do one fault, hold it FAULT_SECONDS, undo it; its window (to its host serving again)."""
    if kind == "kill-nats":
        node = rng.choice(nats.nodes)
        window = Window(kind, node.name, time.time(), everywhere=True)
        nats.kill(node)
        time.sleep(FAULT_SECONDS)  # the fault's length, not a wait for something
        nats.start(node, timeout=30)
        window.end = time.time()
        return window
    catalog = catalogs[rng.choice(CATALOGS)]
    window = Window(kind, catalog.name, time.time())
    if kind == "cut-catalog":
        hosts.cut([catalog.name])
        time.sleep(FAULT_SECONDS)
        hosts.heal()
    else:
        catalog.signal(signal.SIGKILL if kind == "kill-catalog" else signal.SIGSTOP)
        time.sleep(FAULT_SECONDS)
        if kind == "kill-catalog":
            catalog.start()
            poll_until(catalog.ready, START_BOUND, f"{catalog.name} on the bucket again")
        else:
            catalog.signal(signal.SIGCONT)
    window.end = time.time()
    return window
