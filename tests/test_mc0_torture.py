"""mc0d's torture tool, faked (tests/mc0_torture.py: 50 CURVE clients, each CONNECT and then
1000 NOOPs with IDs in lockstep, as ``mc0torture`` sends them, and a PUT every tenth
command), split across two brokers of one topic space over NATS, one of them killed (-9)
mid-run: its clients go on at the other, and the checker finds every NOOP acknowledged,
no answer for another ID, no message delivered twice, and every acknowledged PUT received
by every subscriber whose session held its topic around it, whichever broker either was at.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from tests.curve_helpers import Keys
from tests.mc0_cluster import ClusterBroker
from tests.mc0_torture import check
from tests.netns import LinePeer, poll_until
from tests.ports import nats_cluster
from tests.processes import START_BOUND

pytest.importorskip("nats")

CLIENTS, COUNT, PUT_EVERY = 50, 1000, 10


def test_the_torture_split_across_two_brokers_goes_on_when_one_is_killed(tmp_path: Path) -> None:
    keys = Keys(tmp_path / "keys")
    nats = nats_cluster(tmp_path / "nats", size=1)
    nats.start()
    brokers = [
        ClusterBroker(
            tmp_path / name, nats.urls[0], "--mc0-nats-without-tls", server_cert=keys.server_cert
        )
        for name in ("a", "b")
    ]
    torture: LinePeer | None = None
    try:
        poll_until(lambda: all(b.ready() for b in brokers), START_BOUND, "brokers serving")
        out = tmp_path / "records.json"
        torture = LinePeer(
            [
                sys.executable, "-m", "tests.mc0_torture",
                f"--server-key={keys.server.public.decode()}", "--broker", brokers[0].endpoint, "--broker",
                brokers[1].endpoint, "--clients", str(CLIENTS), "--count", str(COUNT),
                "--put-every", str(PUT_EVERY), "--out", str(out),
            ],
            tmp_path / "torture.log",
        )  # fmt: skip
        total = CLIENTS * COUNT

        def acked() -> int:
            progress = torture.events("PROGRESS") if torture is not None else []
            return int(progress[-1]["acked"]) if progress else 0

        poll_until(lambda: acked() >= 0.3 * total, START_BOUND, "a third of the run")
        brokers[0].kill()
        killed_at = acked()
        done = torture.wait_for("DONE", timeout=START_BOUND * 2)
        counts, anomalies = check(json.loads(out.read_text()))
        print(
            f"fake mc0torture: {done['seconds']} s, broker a killed after {killed_at} of "
            f"{total} commands; {counts}"
        )
        assert anomalies == []
        # Its clients moved (those still at work when it died), and all of it was done.
        assert done["moves"] >= 1 and counts["noops_acked"] == total - total // PUT_EVERY
        assert counts["puts"] == total // PUT_EVERY
        # Two subscribers of each topic at least stay at the broker left all along (and
        # their sessions outlast every PUT's grace): each PUT is owed, most more than once.
        assert counts["deliveries_owed"] >= counts["puts_acknowledged"] > 0
        status = brokers[1].status()
        assert status["cluster"]["connected"] and status["errors"] == {}
    finally:
        if torture is not None:
            torture.stop()
        for broker in brokers:
            broker.stop()
        nats.stop()
