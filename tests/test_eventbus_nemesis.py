"""The Event BUS on a JetStream cluster under a nemesis: six hosts as network namespaces
(three nats-servers with an R3 stream, two ``twistd -n eventbus --store jetstream``
front-ends, one host of clients: confirming publishers and subscribers given both
front-ends), and rounds of faults while events flow: kill -9 of a NATS server, kill -9
of a front-end, SIGSTOP of a front-end, a partition that cuts one host from the rest, and
one that cuts a front-end together with a minority NATS server; each healed before the
next round.

A checker over everything the clients saw, and the final log read whole afterwards:
every event a publisher was told was stored is in the log exactly once, under the
sequence it was confirmed with; no sequence names two different events, for any client;
the log holds no event twice; every subscriber saw each sequence at most once, in order,
and a gapless run from 1 to the end.

``NEMESIS_ROUNDS`` (default 5: one of each kind) sets the rounds, ``NEMESIS_SEED`` the faults' order;
``make nemesis`` runs 24.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from bus.nats.servers import NatsCluster
from tests.nemesis import BIN, FrontEnd
from tests.netns import Hosts, LinePeer, hosts_while_used, nats_on_hosts, poll_until

pytest.importorskip("nats")

ROUNDS = int(os.environ.get("NEMESIS_ROUNDS", "5"))
SEED = int(os.environ.get("NEMESIS_SEED", str(random.randrange(1 << 30))))
FAULT_SECONDS = 4.0
NATS_NODES = ["n1", "n2", "n3"]
FRONT_ENDS = ["f1", "f2"]
KINDS = ["kill-nats", "kill-front-end", "stop-front-end", "cut-host", "cut-front-end-minority"]


@pytest.fixture
def hosts() -> Iterator[Hosts]:
    yield from hosts_while_used([*NATS_NODES, *FRONT_ENDS, "c"])


def read_lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def check(out: Path, final_log: list[dict[str, Any]]) -> dict[str, int]:
    """The checker: raises on any anomaly, returns what it checked."""
    log_sequences = [row["seq"] for row in final_log]
    assert log_sequences == list(range(1, len(final_log) + 1)), "the log has holes"
    by_sequence = {row["seq"]: row["uuid"] for row in final_log}
    where: dict[str, list[int]] = {}
    for row in final_log:
        where.setdefault(row["uuid"], []).append(row["seq"])
    twice = {u: s for u, s in where.items() if len(s) > 1}
    assert not twice, f"events stored more than once: {list(twice.items())[:5]}"
    confirmed = 0
    for path in sorted(out.glob("pub-*.jsonl")):
        for row in read_lines(path):
            confirmed += 1
            assert where.get(row["uuid"]) == [row["seq"]], (
                f"{path.name}: {row['uuid']} confirmed at {row['seq']}, "
                f"log has it at {where.get(row['uuid'])}"
            )
    delivered = 0
    for path in sorted(out.glob("sub-*.jsonl")):
        rows = read_lines(path)
        delivered += len(rows)
        sequences = [row["seq"] for row in rows]
        assert sequences == list(range(1, len(final_log) + 1)), (
            f"{path.name}: not each sequence once in order up to {len(final_log)} "
            f"(saw {len(sequences)}, first break near "
            f"{next((i for i, s in enumerate(sequences, 1) if s != i), None)})"
        )
        for row in rows:
            assert by_sequence[row["seq"]] == row["uuid"], (
                f"{path.name}: sequence {row['seq']} named {row['uuid']}, "
                f"the log has {by_sequence[row['seq']]}"
            )
    return {"log": len(final_log), "confirmed": confirmed, "delivered": delivered}


def test_nothing_confirmed_is_lost_or_forked_through_rounds_of_faults(
    hosts: Hosts, tmp_path: Path
) -> None:
    rng = random.Random(SEED)
    print(f"nemesis: {ROUNDS} rounds, NEMESIS_SEED={SEED}")
    nats = nats_on_hosts(hosts, NATS_NODES, tmp_path / "nats")
    urls = ",".join(nats.urls)
    ends = {name: FrontEnd(hosts, name, urls, tmp_path) for name in FRONT_ENDS}
    clients: LinePeer | None = None
    out = tmp_path / "records"
    try:
        nats.start(timeout=30)
        for end in ends.values():
            end.start()
        poll_until(lambda: all(e.ready() for e in ends.values()), 60, "front-ends serving")
        clients = LinePeer(
            [
                *hosts.prefix("c"), sys.executable, "-m", "tests.nemesis_clients",
                "--server", ends["f1"].address, "--server", ends["f2"].address,
                "--out", str(out),
            ],
            tmp_path / "clients.log",
        )  # fmt: skip
        clients.wait_for("PROGRESS", timeout=60, ready=True)

        def confirmed() -> int:
            progress = clients.events("PROGRESS")
            return int(progress[-1]["confirmed"]) if progress else 0

        kinds = rng.sample(KINDS, len(KINDS))
        for round_ in range(ROUNDS):
            kind = kinds[round_] if round_ < len(kinds) else rng.choice(KINDS)
            before = confirmed()
            detail = fault(kind, rng, hosts, nats, ends)
            print(f"round {round_ + 1}: {kind} {detail}")
            # Progress again after the heal: the system recovered before the next fault.
            poll_until(lambda b=before: confirmed() > b + 100, 90, f"progress after {kind}")
        clients.send({"cmd": "finish"})
        finished = clients.wait_for("FINISHED", timeout=180)
        assert finished["failed"] == 0
        # The log is read at f2 once its feed has broadcast everything any publisher was
        # told is stored (a feed may still be making its consumer again after the last
        # fault): reading it earlier would take a lagging front-end for a lost event.
        highest = max(
            (row["seq"] for path in out.glob("pub-*.jsonl") for row in read_lines(path)),
            default=0,
        )
        poll_until(
            lambda: ends["f2"].broadcast() >= highest, 90, f"f2 broadcasting up to {highest}"
        )
        dump = subprocess.run(
            [*hosts.prefix("c"), str(BIN / "eventbus-cli"), "snapshot", "--server",
             ends["f2"].address, "--timeout", "60"],
            capture_output=True, text=True, timeout=120, check=True,
        )  # fmt: skip
        final_log = [json.loads(line) for line in dump.stdout.splitlines()]
        checked = check(out, final_log)
        print(
            f"nemesis: {ROUNDS} rounds, {checked['log']} events in the log, "
            f"{checked['confirmed']} confirmations and {checked['delivered']} deliveries "
            f"checked, {finished['resent']} resent, failovers {finished['failovers']}: "
            "no anomaly"
        )
    finally:
        if clients is not None:
            clients.stop()
        hosts.heal()
        for end in ends.values():
            end.stop()
        for node in nats.nodes:
            if node.process is not None and node.process.poll() is None:
                node.process.send_signal(signal.SIGCONT)
        nats.stop()


def fault(
    kind: str, rng: random.Random, hosts: Hosts, nats: NatsCluster, ends: dict[str, FrontEnd]
) -> str:
    """Do one fault, hold it FAULT_SECONDS, undo it; say what was done."""
    if kind == "kill-nats":
        node = rng.choice(nats.nodes)
        nats.kill(node)
        time.sleep(FAULT_SECONDS)
        nats.start(node, timeout=30)
        return node.name
    if kind in ("kill-front-end", "stop-front-end"):
        end = ends[rng.choice(FRONT_ENDS)]
        end.signal(signal.SIGKILL if kind == "kill-front-end" else signal.SIGSTOP)
        time.sleep(FAULT_SECONDS)
        if kind == "kill-front-end":
            end.start()
            poll_until(end.ready, 60, f"{end.name} serving again")
        else:
            end.signal(signal.SIGCONT)
        return end.name
    side = (
        [rng.choice([*NATS_NODES, *FRONT_ENDS, "c"])]
        if kind == "cut-host"
        else [rng.choice(FRONT_ENDS), rng.choice(NATS_NODES)]
    )
    hosts.cut(side)
    time.sleep(FAULT_SECONDS)
    hosts.heal()
    return "+".join(side)
