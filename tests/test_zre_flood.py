"""Forged UDP beacons against a ZRE node that shares its process (and its 256 file
descriptors) with an eMQP broker: the flood costs counters, never the broker's answers,
never a log line per datagram. Beacons go to 127.0.0.1 only."""

from __future__ import annotations

import json
import os
import random
import select
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest_twisted

from bus.emqp.client import query_status
from bus.testing import wait_until
from bus.zre import codec
from tests.zre_helpers import free_udp_port

TARGET = Path(__file__).parent / "zre_peers" / "flood_target.py"
FLOOD = 3000
BURST = 100  # well below what a loopback socket's receive buffer holds


class Target:
    """tests/zre_peers/flood_target.py in a child process."""

    def __init__(self, tmp_path: Path, port: int) -> None:
        self.log_path = tmp_path / "target.log"
        self.stderr = open(tmp_path / "target.stderr", "wb")
        env = dict(os.environ, PYTHONPATH=str(Path(__file__).parent.parent))
        self.process = subprocess.Popen(
            [sys.executable, str(TARGET), str(port), str(tmp_path / "data"), str(self.log_path)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self.stderr,
            env=env,
        )
        self.ready = self.read_line("READY")

    def read_line(self, event: str, timeout: float = 30.0) -> dict[str, Any]:
        """The next line of ``event`` (a bounded wait: the child has its own reactor)."""
        assert self.process.stdout is not None
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            readable, _, _ = select.select([self.process.stdout], [], [], max(0.0, left))
            if not readable:
                raise TimeoutError(f"no {event} from the target in {timeout}s: {self.output()}")
            line = self.process.stdout.readline()
            if not line:
                raise EOFError(f"the target exited: {self.output()}")
            decoded: dict[str, Any] = json.loads(line)
            if decoded.get("event") == event:
                return decoded

    def status(self) -> dict[str, Any]:
        assert self.process.stdin is not None
        self.process.stdin.write(b"status\n")
        self.process.stdin.flush()
        return self.read_line("STATUS")

    def output(self) -> str:
        text = self.log_path.read_text() if self.log_path.exists() else ""
        return text + (self.stderr.name and Path(self.stderr.name).read_text())

    def stop(self) -> int:
        if self.process.stdin is not None:
            self.process.stdin.close()
        try:
            return self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            return self.process.wait()
        finally:
            if self.process.stdout is not None:
                self.process.stdout.close()
            self.stderr.close()


@pytest_twisted.inlineCallbacks
def test_forged_beacon_flood_costs_counters_not_the_brokers_descriptors(tmp_path: Path) -> Any:
    port = free_udp_port()
    (tmp_path / "data").mkdir()
    target = Target(tmp_path, port)
    udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        before = yield query_status(target.ready["admin"], timeout=10)
        assert "queues" in before
        taken = set(target.ready["ports"])
        ports = random.sample([p for p in range(1024, 65536) if p not in taken], FLOOD)
        # In bursts the loopback buffer holds, each read before the next (kernel drops
        # would be nobody's count).
        for start in range(0, FLOOD, BURST):
            for forged_port in ports[start : start + BURST]:
                udp.sendto(codec.encode_beacon(os.urandom(16), forged_port), ("127.0.0.1", port))
            sent = start + BURST
            yield wait_until(
                lambda sent=sent: target.status()["beacons_received"] >= sent,
                what=f"{sent} beacons read",
            )
        status = target.status()
        # The broker in the same process still answers.
        answer = yield query_status(target.ready["admin"], timeout=10)
        assert "queues" in answer
        dropped = status["dropped"]
        refused = dropped.get("descriptor-budget", 0) + dropped.get("pending-full", 0)
        opened = status["peers_pending"] + dropped.get("no-hello", 0)
        assert status["beacons_received"] == FLOOD
        # Every forged beacon is accounted for: a pending peer (now or expired) or refused.
        assert opened + refused == FLOOD, status
        assert refused > FLOOD // 2 and dropped.get("socket-error", 0) == 0
        assert status["peer_sockets"] <= status["peer_sockets_capacity"] <= 256 // 4 // 2
        assert status["peers_pending"] <= status["peer_sockets_capacity"]
    finally:
        udp.close()
        code = target.stop()
    log = target.output()
    assert "Traceback" not in log and "Too many open files" not in log, log[-3000:]
    flood_lines = [line for line in log.splitlines() if "dropped" in line]
    assert 1 <= len(flood_lines) <= 5, flood_lines
    assert code == 0, log[-3000:]


def test_descriptor_budget_is_a_share_of_the_limit_and_refuses_past_it() -> None:
    from bus.transport.fdbudget import DescriptorBudget, descriptor_limit

    budget = DescriptorBudget(share=0.25, per_socket=2, limit=256)
    assert budget.capacity == 32
    assert all(budget.acquire() for _ in range(32))
    assert not budget.acquire() and budget.refused == 1 and budget.available == 0
    budget.release()
    assert budget.acquire() and budget.in_use == 32
    assert DescriptorBudget().limit == descriptor_limit() > 0


def test_pending_bound_options() -> None:
    import pytest
    from twisted.python import usage

    from bus.zre.tap import Options

    options = Options()
    options.parseOptions(["--max-pending-peers", "7", "--pending-expired", "2s"])
    config = options["zre-config"]
    assert (config.max_pending_peers, config.pending_expired) == (7, 2.0)
    defaults = Options()
    defaults.parseOptions([])
    assert defaults["zre-config"].max_pending_peers == 100
    for bad in (["--max-pending-peers", "0"], ["--pending-expired", "0s"]):
        with pytest.raises(usage.UsageError):
            Options().parseOptions(bad)
