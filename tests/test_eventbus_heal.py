"""A follower's link cut, then healed, under a front-end and its clients, each on a host
of its own (network namespaces): nothing is lost, and each round prints how long the
subscriber heard nothing after the heal and what nats-server did then.

After a cut-off follower's link comes back, its Raft term (raised by its campaigns while
cut off) makes the stream's leader step down; a new one leads within a second, or only
after an election timeout (4-9 s) when the followers had no vote request to answer:
nats-server's Raft has no pre-vote (docs/cluster.md, "When a partition heals"). The
front-end's part is checked here: every event its publisher was told is stored reaches
the subscriber once, at its sequence, with no hole, and the healed replica is current
again each round. ``HEAL_ROUNDS`` (default 2) sets the rounds; the figures in
docs/cluster.md are from 16.
"""

from __future__ import annotations

import itertools
import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from bus.nats.jsapi import JetStreamError
from bus.nats.roll import group_of
from tests.jetstream_helpers import stream_info
from tests.nemesis import FrontEnd
from tests.netns import Hosts, LinePeer, hosts_while_used, nats_on_hosts, poll_until, read_records

pytest.importorskip("nats")

ROUNDS = int(os.environ.get("HEAL_ROUNDS", "2"))
NODES = ["n1", "n2", "n3"]
#: Long enough for the cut follower to campaign at least once (an election timeout is
#: 4-9 s): its term is then above the leader's.
CUT = 10.0
STEPPED_DOWN = "Detected another leader with higher term, will stepdown"


@pytest.fixture
def hosts() -> Iterator[Hosts]:
    yield from hosts_while_used([*NODES, "f1", "c"])


def longest_silence(times: list[float], start: float, end: float) -> tuple[float, float]:
    """The longest gap between two deliveries that ends after ``start`` and begins before
    ``end``, and when it began (from ``start``)."""
    gaps = [(b - a, a - start) for a, b in itertools.pairwise(times) if b > start and a < end]
    return max(gaps, default=(0.0, 0.0))


def check(out: Path) -> int:
    """Every confirmed event delivered once at its sequence; the deliveries 1..N in order."""
    delivered = read_records(out / "sub-0.jsonl")
    sequences = [row["seq"] for row in delivered]
    assert sequences == list(range(1, len(delivered) + 1)), "a hole, a repeat or disorder"
    at: dict[str, list[int]] = {}
    for row in delivered:
        at.setdefault(row["uuid"], []).append(row["seq"])
    confirmed = read_records(out / "pub-0.jsonl")
    for row in confirmed:
        assert at.get(row["uuid"]) == [row["seq"]], row
    return len(confirmed)


@pytest.mark.netns
@pytest.mark.slow
def test_a_followers_link_healed_loses_nothing_and_its_pause_is_printed(
    hosts: Hosts, tmp_path: Path
) -> None:
    nats = nats_on_hosts(hosts, NODES, tmp_path / "nats")
    end = FrontEnd(hosts, "f1", ",".join(nats.urls), tmp_path)
    out = tmp_path / "records"
    clients: LinePeer | None = None
    try:
        nats.start(timeout=30)
        end.start()
        poll_until(lambda: end.ready() and end.stream_led(), 90, "the front-end")
        clients = LinePeer(
            [
                *hosts.prefix("c"), sys.executable, "-m", "tests.nemesis_clients",
                "--server", end.address, "--out", str(out), "--publishers", "1",
                "--subscribers", "1", "--rate", "200",
            ],
            tmp_path / "clients.log",
        )  # fmt: skip
        clients.wait_for("PROGRESS", timeout=60, ready=True)

        def confirmed() -> int:
            progress = clients.events("PROGRESS") if clients else []
            return int(progress[-1]["confirmed"]) if progress else 0

        def stepped_down() -> int:
            return sum(
                node.log.read_text(errors="replace").count(STEPPED_DOWN)
                for node in nats.nodes
                if node.log is not None and node.log.exists()
            )

        def current(name: str) -> bool:
            # Right after a heal the stream may be between leaders: its INFO goes
            # unanswered or answers an error for a while, which is "not yet".
            try:
                info = hosts.inside("c", lambda: stream_info(nats.urls[0], "EVENTBUS"))
            except (TimeoutError, JetStreamError):
                return False
            return group_of(info, "EVENTBUS").current_on(name)

        for round_ in range(ROUNDS):
            before = confirmed()
            poll_until(lambda b=before: confirmed() > b + 200, 60, "events flowing")
            leader = (end.status().get("jetstream") or {}).get("leader")
            follower = [name for name in NODES if name != leader][round_ % 2]
            deposed = stepped_down()
            hosts.cut([follower])
            time.sleep(CUT)
            healed = time.monotonic()
            hosts.heal()
            after = confirmed()
            poll_until(lambda a=after: confirmed() > a + 400, 90, f"events after {follower}'s heal")
            poll_until(lambda f=follower: current(f), 60, f"{follower}'s replica current")
            times = [row["t"] for row in read_records(out / "sub-0.jsonl")]
            silence, began = longest_silence(times, healed, healed + 10)
            print(
                f"\nround {round_ + 1}: {follower} (a follower of {leader}) cut {CUT:g} s, "
                f"healed: the subscriber's longest silence {silence:.2f} s from "
                f"{began:+.2f} s; leaders that stepped down at a heartbeat's answer (then "
                f"no early campaign) {stepped_down() - deposed}; now led by "
                f"{(end.status().get('jetstream') or {}).get('leader')}"
            )
        clients.send({"cmd": "finish"})
        finished = clients.wait_for("FINISHED", timeout=180)
        assert finished["failed"] == 0
        print(f"{check(out)} confirmed events, each delivered once, no hole")
    finally:
        if clients is not None:
            clients.stop()
        hosts.heal()
        end.stop()
        nats.stop()


def test_the_longest_silence_is_the_gap_that_spans_the_heal() -> None:
    times: list[Any] = [0.0, 0.1, 0.2, 5.0, 5.1, 9.0]
    assert longest_silence(times, 0.15, 6.0) == (pytest.approx(4.8), pytest.approx(0.05))
    assert longest_silence(times, 5.05, 5.06) == (pytest.approx(0.1), pytest.approx(-0.05))
