"""A pair whose peer link is cut while clients reach both halves: two network namespaces
joined by a veth pair, the primary in one and the backup in the other, and the link's
TCP traffic (only it) blackholed both ways by policy routing.

Clients (``eventbus-cli tail`` given both addresses, and a raw publisher) stay with the
active, which keeps beating: the backup gets no vote, so it never takes over; the active
goes on alone after its timeout. Status files of both halves are sampled throughout: never
two actives. Once the link is back the pair heals, and the subscriber saw every sequence
once, and both logs are equal.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest_twisted
from twisted.internet import reactor, task

from bus.eventbus.store import EventStore
from bus.testing import wait_until
from tests.netns import NamespacePair, netns_pair
from tests.processes import CLEAN_EXIT, TWISTD, TwistdProcess

__all__ = ["netns_pair"]

CLI = str(Path(sys.executable).with_name("eventbus-cli"))
PORT = 5556  # each half in its own namespace: no other process shares these ports
LINK = PORT + 3

PUBLISHER = """
import sys, time, uuid, msgpack, zmq
dealer = zmq.Context().socket(zmq.DEALER)
dealer.connect(sys.argv[1])
n = 0
while True:
    dealer.send_multipart([b"/cut/", b"", b"cut", b"2026-01-01T00:00:00Z",
                           str(uuid.uuid4()).encode(), msgpack.packb(n)])
    n += 1
    time.sleep(0.005)
"""


def ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, timeout=20)


def cut(pair: NamespacePair, on: bool) -> None:
    """Blackhole (or restore) TCP to the peer's link port, from both namespaces."""
    verb = "add" if on else "del"
    for ns in (pair.a, pair.b):
        if on:
            ip("-n", ns, "route", "replace", "blackhole", "default", "table", "101")
        ip("-n", ns, "rule", verb, "ipproto", "tcp", "dport", str(LINK), "table", "101")


class Half:
    def __init__(self, root: Path, role: str, ns: str, address: str, peer: str) -> None:
        self.role = role
        self.data = root / role
        self.data.mkdir(parents=True)
        command = [
            "ip", "netns", "exec", ns, TWISTD, "-n", "--pidfile=", "eventbus",
            "--services", "eventbus", "--http-port", "0", "--bind", address,
            "--port", str(PORT), "--data-dir", str(self.data), "--stats-interval", "0.1s",
            "--heartbeat-interval", "0.1s", "--ha-role", role, "--ha-peer", f"{peer}:{LINK}",
            "--ha-failover-timeout", "2s", "--ha-alone-timeout", "2s",
        ]  # fmt: skip
        self.process = TwistdProcess(
            command, root / f"{role}.log", dict(os.environ, PYTHONUNBUFFERED="1")
        )

    def status(self) -> dict[str, Any]:
        try:
            return dict(json.loads((self.data / "status.json").read_text()))
        except (FileNotFoundError, json.JSONDecodeError):
            return {}

    def ha(self) -> dict[str, Any]:
        return dict(self.status().get("ha") or {})


def formed(active: Half, passive: Half) -> bool:
    a, p = active.ha(), passive.ha()
    return bool(
        a.get("state") == "active"
        and a.get("paired")
        and p.get("state") == "passive"
        and p.get("in_sync")
    )


def sequences(path: Path) -> list[int]:
    found = []
    for line in path.read_text().splitlines():
        with contextlib.suppress(ValueError, KeyError):
            found.append(int(json.loads(line)["seq"]))
    return found


def log_of(data: Path) -> list[Any]:
    store = EventStore(data)
    try:
        return list(store.read(0, limit=10**8))
    finally:
        store.close()


@pytest_twisted.inlineCallbacks
def test_a_cut_peer_link_never_makes_two_actives_and_heals(
    netns_pair: NamespacePair, tmp_path: Path
) -> Any:
    pair = netns_pair
    primary = Half(tmp_path, "primary", pair.a, pair.addr_a, pair.addr_b)
    backup = Half(tmp_path, "backup", pair.b, pair.addr_b, pair.addr_a)
    tail_path = tmp_path / "tail.jsonl"
    clients: list[subprocess.Popen[bytes]] = []
    states: list[tuple[str | None, str | None]] = []

    def sample() -> None:
        states.append((primary.ha().get("state"), backup.ha().get("state")))

    sampler = task.LoopingCall(sample)
    sampler.clock = reactor
    link_cut = False
    try:
        yield wait_until(lambda: formed(primary, backup), timeout=60, what="pair formed")
        sampler.start(0.05)
        servers = [f"{pair.addr_a}:{PORT}", f"{pair.addr_b}:{PORT}"]
        with open(tail_path, "wb") as out:
            clients.append(subprocess.Popen(
                ["ip", "netns", "exec", pair.a, CLI, "tail",
                 "--server", servers[0], "--server", servers[1]],
                stdout=out, stderr=subprocess.DEVNULL))  # fmt: skip
        clients.append(subprocess.Popen(
            ["ip", "netns", "exec", pair.a, sys.executable, "-c", PUBLISHER,
             f"tcp://{pair.addr_a}:{PORT + 2}"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))  # fmt: skip
        yield wait_until(lambda: len(sequences(tail_path)) >= 200, timeout=30, what="flowing")
        cut(pair, True)
        link_cut = True
        yield wait_until(lambda: primary.ha().get("alone") is True, timeout=30, what="alone")
        count = len(sequences(tail_path))
        # The backup hears nothing for three failover timeouts, yet no client turns to it.
        yield wait_until(
            lambda: (backup.ha().get("peer") or {}).get("heard_s_ago", 0) > 6.0,
            timeout=30,
            what="a long silence on the backup",
        )
        assert backup.ha()["state"] == "passive"
        assert len(sequences(tail_path)) > count + 200  # served alone all along
        cut(pair, False)
        link_cut = False
        yield wait_until(lambda: formed(primary, backup), timeout=60, what="healed")
        assert primary.ha()["went_alone"] >= 1 and primary.ha()["healed"] >= 1
        clients[1].send_signal(signal.SIGTERM)
        clients[1].wait(10)

        def settled() -> bool:
            got = sequences(tail_path)
            return bool(got) and (
                primary.status().get("sequence") == backup.status().get("sequence") == got[-1]
            )

        yield wait_until(settled, timeout=30, what="settled")
    finally:
        if sampler.running:
            sampler.stop()
        if link_cut:
            cut(pair, False)
        for client in clients:
            if client.poll() is None:
                client.send_signal(signal.SIGINT)
                client.wait(10)
        codes = [half.process.stop() for half in (primary, backup)]
    assert all(code in CLEAN_EXIT for code in codes), codes
    assert states and not [s for s in states if s == ("active", "active")]
    assert ("active", "passive") in states
    got = sequences(tail_path)
    assert got == list(range(1, len(got) + 1))
    assert log_of(primary.data) == log_of(backup.data)
    assert len(got) == len(log_of(primary.data))
