"""An Event BUS pair as users run it: two ``twistd -n eventbus --services eventbus
--ha-role ...`` processes, clients given both addresses, kill -9 and SIGSTOP.

* kill -9 of the active under load, in rounds (the killed one restarts and rejoins as the
  backup, then the next round kills the new active): every event a subscriber received
  is in the surviving log under the same sequence with the same content, subscribers see
  every sequence once (no duplicate, no hole), the two logs end equal;
* SIGSTOP of the active (a partition of the peer link from its side): never two actives
  at once; the stopped one, continued, becomes passive and catches up;
* SIGSTOP of the passive: the active goes on alone, and the pair heals after SIGCONT.
"""

from __future__ import annotations

import contextlib
import json
import re
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest_twisted
from twisted.internet import defer, reactor, task

from bus.eventbus.client import EventBusPublisher, EventBusSubscriber
from bus.eventbus.codec import Event
from bus.eventbus.store import EventStore
from bus.testing import wait_until
from tests.ports import free_ports
from tests.processes import CLEAN_EXIT, ServerProcess

END = b"/load/end/"
CLI = str(Path(sys.executable).with_name("eventbus-cli"))
#: Two status files written this close (seconds, by the servers' clocks) are one moment:
#: the servers write one every 0.1 s (``--stats-interval``).
WINDOW = 0.15
TIMEOUT = "2s"  # --ha-failover-timeout and --ha-alone-timeout: generous on shared CPUs


class Half:
    """One server of the pair, restartable on the same ports and data directory."""

    def __init__(
        self, root: Path, role: str, port: int, peer_port: int, http_port: int = 0
    ) -> None:
        self.role = role
        self.port = port
        self.data = root / role
        self.data.mkdir(parents=True, exist_ok=True)
        self.args = [
            "--services", "eventbus", "--http-port", str(http_port), "--ha-role", role,
            "--ha-peer", f"127.0.0.1:{peer_port + 3}",
            "--ha-failover-timeout", TIMEOUT, "--ha-alone-timeout", TIMEOUT,
        ]  # fmt: skip
        self.process: ServerProcess | None = None
        self.starts = 0

    def start(self) -> None:
        self.starts += 1
        self.process = ServerProcess(
            self.data,
            *self.args,
            port=self.port,
            log_path=self.data.parent / f"{self.role}-{self.starts}.log",
        )

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def ha(self) -> dict[str, Any]:
        assert self.process is not None
        return dict(self.process.status().get("ha") or {})

    def state(self) -> str | None:
        return self.ha().get("state")

    def stop(self, sig: int = signal.SIGTERM) -> int:
        assert self.process is not None
        code = self.process.stop(sig)
        self.process = None
        return code


def make_pair(root: Path, http_port: int = 0) -> tuple[Half, Half]:
    first, second = free_ports(4), free_ports(4)  # each: P..P+2 and the pair link on P+3
    return Half(root, "primary", first, second, http_port), Half(root, "backup", second, first)


def formed(active: Half, passive: Half) -> bool:
    a, p = active.ha(), passive.ha()
    return bool(
        a.get("state") == "active"
        and a.get("paired")
        and p.get("state") == "passive"
        and p.get("in_sync")
        and p.get("behind") == 0
    )


def settled(active: Half, passive: Half, received: list[Event]) -> bool:
    """Load finished: the subscriber got the end marker (sent after every other event of
    the publisher's), the passive has handed over what it had to (events it took in
    while it did not run may reach the active after the marker, under new sequences),
    and both logs end at the last event the subscriber received."""
    if active.process is None or passive.process is None or not received:
        return False
    if not any(event.topic == END for event in received):
        return False
    a, p = active.process.status(), passive.process.status()
    ha_a, ha_p = a.get("ha") or {}, p.get("ha") or {}
    last = received[-1].sequence
    return bool(
        ha_p.get("orphans") == 0
        and ha_p.get("held") == 0
        and ha_a.get("forwards_received", 0) >= ha_p.get("forwarded", 1)
        and a.get("sequence") == last
        and p.get("sequence") == last
    )


def log_of(data: Path) -> list[Event]:
    store = EventStore(data)
    try:
        return list(store.read(0, limit=10**8))
    finally:
        store.close()


@defer.inlineCallbacks
def wind_down(
    loop: Any, load: Load | None, subscribers: list[EventBusSubscriber], halves: list[Half]
) -> Any:
    """The end of a pair test, however it went: the sampler, the load, the clients, then
    both servers; returns the servers' exit codes."""
    if loop.running:
        loop.stop()
    if load is not None:
        load.stop()
    for subscriber in subscribers:
        yield subscriber.stopService()
    return [half.stop() for half in halves if half.process is not None]


def one_history(
    violations: list[str], codes: list[int], received: list[Event], survivor: Half, other: Half
) -> list[Event]:
    """Never two actives, clean exits, every sequence received once in order (no duplicate,
    no hole), and the two logs equal; returns the survivor's log."""
    assert violations == [], violations[:3]
    assert all(code in CLEAN_EXIT for code in codes), codes
    assert [e.sequence for e in received] == list(range(1, len(received) + 1))
    final = log_of(survivor.data)
    assert log_of(other.data) == final
    return final


class Load:
    """Publishes ``rate`` events a second to both addresses until stopped."""

    def __init__(self, addresses: list[str], rate: int = 2000) -> None:
        self.publisher = EventBusPublisher(addresses, producer_id="load", failover_after=0.5)
        self.sent = 0
        self.per_tick = rate // 100
        self.loop = task.LoopingCall(self._tick)
        self.loop.clock = reactor
        self.loop.start(0.01)

    def _tick(self) -> None:
        for _ in range(self.per_tick):
            parity = "odd" if self.sent % 2 else "even"
            self.publisher.publish(f"/load/{parity}/", self.sent)
            self.sent += 1

    def finish(self) -> None:
        """Stop, and send the end marker behind everything sent."""
        if self.loop.running:
            self.loop.stop()
        self.publisher.publish(END.decode(), "end")

    def stop(self) -> None:
        if self.loop.running:
            self.loop.stop()
        self.publisher.close()


def start_pair(root: Path, http_port: int = 0) -> Any:
    primary, backup = make_pair(root, http_port)
    primary.start()
    backup.start()
    return primary, backup


@pytest_twisted.inlineCallbacks
def test_kill_9_of_the_active_under_load_in_rounds(tmp_path: Path) -> Any:
    primary, backup = start_pair(tmp_path)
    halves = [primary, backup]
    addresses = [primary.address, backup.address]
    full: list[Event] = []
    odd: list[Event] = []
    subscribers = [
        EventBusSubscriber(addresses, [], full.append, heartbeat_timeout=1.5),
        EventBusSubscriber(addresses, ["/load/odd/"], odd.append, heartbeat_timeout=1.5),
    ]
    load: Load | None = None
    takeovers: list[float] = []
    violations, loop = sampler(halves)
    try:
        yield wait_until(lambda: formed(primary, backup), timeout=60, what="pair formed")
        for subscriber in subscribers:
            subscriber.startService()
        load = Load(addresses)
        active, passive = primary, backup
        for round_number in range(3):
            yield wait_until(lambda a=active, p=passive: formed(a, p), timeout=60, what="in sync")
            target = len(full) + 1000
            yield wait_until(lambda t=target: len(full) >= t, timeout=30, what="load flowing")
            killed_at = time.monotonic()
            active.stop(signal.SIGKILL)
            yield wait_until(lambda p=passive: p.state() == "active", timeout=30,
                             what=f"takeover in round {round_number}")  # fmt: skip
            takeovers.append(time.monotonic() - killed_at)
            reason = passive.ha()["changes"][-1]["reason"]
            assert "silent" in reason and "client" in reason, reason
            target = len(full) + 1000
            yield wait_until(lambda t=target: len(full) >= t, timeout=30, what="load after")
            active.start()  # the killed one comes back: it must become the backup
            yield wait_until(lambda a=active: a.state() == "passive", timeout=30,
                             what="rejoined as passive")  # fmt: skip
            active, passive = passive, active
        yield wait_until(lambda: formed(active, passive), timeout=60, what="final pair")
        load.finish()
        yield wait_until(lambda: settled(active, passive, full), timeout=30, what="settled")
    finally:
        codes = yield wind_down(loop, load, subscribers, halves)
    print(f"takeover times: {', '.join(f'{t:.2f}s' for t in takeovers)}")
    # The backup is a correct copy.
    final = one_history(violations, codes, full, active, passive)
    # Everything any subscriber received is in the surviving log, same sequence, same content.
    by_sequence = {e.sequence: e for e in final}
    assert all(by_sequence.get(e.sequence) == e for e in full)
    assert all(by_sequence.get(e.sequence) == e for e in odd)
    assert [e.sequence for e in odd] == [e.sequence for e in full if e.topic == b"/load/odd/"]
    # No sequence was ever given to two events.
    assert len({e.uuid for e in final}) == len(final)
    assert len(full) > 6000 and full[-1].sequence == final[-1].sequence


def sampler(halves: list[Half]) -> tuple[list[str], Any]:
    """Polls both status files and records any two that say ``active`` and were written
    (by their servers' own clocks, which run while the server runs) within one status
    interval of each other. A stopped server writes nothing, so its last word cannot
    overlap the other's later takeover."""
    latest: dict[str, dict[str, Any]] = {}
    violations: list[str] = []

    def sample() -> None:
        for half in halves:
            if half.process is None:
                latest.pop(half.role, None)
                continue
            status = half.process.status()
            if status.get("time") is not None:
                latest[half.role] = status
        if len(latest) < 2:
            return
        first, second = latest.values()
        both = all((s.get("ha") or {}).get("state") == "active" for s in (first, second))
        if both and abs(first["time"] - second["time"]) < WINDOW:
            violations.append(
                "two actives: " + json.dumps({role: s["ha"] for role, s in latest.items()})
            )

    loop = task.LoopingCall(sample)
    loop.clock = reactor
    loop.start(0.02)
    return violations, loop


@pytest_twisted.inlineCallbacks
def test_a_stopped_active_never_makes_two_actives_and_rejoins(tmp_path: Path) -> Any:
    primary, backup = start_pair(tmp_path)
    addresses = [primary.address, backup.address]
    received: list[Event] = []
    subscriber = EventBusSubscriber(addresses, [], received.append, heartbeat_timeout=1.5)
    violations, loop = sampler([primary, backup])
    load: Load | None = None
    try:
        yield wait_until(lambda: formed(primary, backup), timeout=60, what="pair formed")
        subscriber.startService()
        load = Load(addresses, rate=500)
        yield wait_until(lambda: len(received) >= 500, timeout=30, what="load flowing")
        assert primary.process is not None
        primary.process.process.send_signal(signal.SIGSTOP)
        try:
            yield wait_until(lambda: backup.state() == "active", timeout=30, what="takeover")
            target = len(received) + 500
            yield wait_until(lambda: len(received) >= target, timeout=30, what="served by backup")
        finally:
            primary.process.process.send_signal(signal.SIGCONT)
        yield wait_until(lambda: primary.state() == "passive", timeout=30, what="demoted")
        changes = [c["to"] for c in primary.ha()["changes"]]
        assert changes[-2:] == ["doubt", "passive"], changes
        yield wait_until(lambda: formed(backup, primary), timeout=60, what="caught up")
        load.finish()
        yield wait_until(lambda: settled(backup, primary, received), timeout=30, what="settled")
    finally:
        codes = yield wind_down(loop, load, [subscriber], [primary, backup])
    final = one_history(violations, codes, received, backup, primary)
    by_sequence = {e.sequence: e for e in final}
    assert all(by_sequence.get(e.sequence) == e for e in received)


@pytest_twisted.inlineCallbacks
def test_a_stopped_passive_leaves_the_active_alone_then_the_pair_heals(tmp_path: Path) -> Any:
    http_port = free_ports(4)
    primary, backup = start_pair(tmp_path, http_port)
    addresses = [primary.address, backup.address]
    received: list[Event] = []
    subscriber = EventBusSubscriber(addresses, [], received.append, heartbeat_timeout=1.5)
    violations, loop = sampler([primary, backup])
    load: Load | None = None
    try:
        yield wait_until(lambda: formed(primary, backup), timeout=60, what="pair formed")
        subscriber.startService()
        load = Load(addresses, rate=500)
        yield wait_until(lambda: len(received) >= 500, timeout=30, what="load flowing")
        assert backup.process is not None
        backup.process.process.send_signal(signal.SIGSTOP)
        try:
            yield wait_until(lambda: primary.ha().get("alone") is True, timeout=30, what="alone")
            target = len(received) + 1000
            yield wait_until(lambda: len(received) >= target, timeout=30, what="served alone")
        finally:
            backup.process.process.send_signal(signal.SIGCONT)
        yield wait_until(lambda: formed(primary, backup), timeout=60, what="healed")
        status = primary.ha()
        assert status["went_alone"] >= 1 and status["healed"] >= 1
        assert primary.process is not None
        assert "going on ALONE" in primary.process.output()
        # The same on the primary's /status and /metrics.
        base = f"http://127.0.0.1:{http_port}"
        with urllib.request.urlopen(f"{base}/metrics", timeout=10) as response:
            metrics = response.read().decode()
        assert 'eventbus_ha_state{state="active"} 1.0' in metrics
        assert re.search(r"^eventbus_ha_went_alone_total [1-9]", metrics, re.M), metrics
        assert re.search(r"^eventbus_ha_healed_total [1-9]", metrics, re.M)
        assert "eventbus_ha_paired 1.0" in metrics
        with urllib.request.urlopen(f"{base}/status", timeout=10) as response:
            served = json.loads(response.read())
        ha = served["services"]["eventbus"]["ha"]
        assert ha["state"] == "active" and ha["went_alone"] >= 1 and ha["healed"] >= 1
        assert ha["transitions"] == {"active": 1}
        assert ha["changes"][-1]["to"] == "active" and "log is newer" in ha["changes"][-1]["reason"]
        load.finish()
        yield wait_until(lambda: settled(primary, backup, received), timeout=30, what="settled")
    finally:
        codes = yield wind_down(loop, load, [subscriber], [primary, backup])
    one_history(violations, codes, received, primary, backup)


def cli_sequences(path: Path) -> list[int]:
    sequences = []
    for line in path.read_text().splitlines():
        with contextlib.suppress(ValueError):
            sequences.append(int(json.loads(line)["seq"]))
    return sequences


@pytest_twisted.inlineCallbacks
def test_the_spark_bridge_and_eventbus_cli_continue_across_a_failover(tmp_path: Path) -> Any:
    from bus.spark.bridge import SparkBridgeService
    from bus.spark.config import BridgeConfig
    from bus.spark.journal import JournalReader

    primary, backup = start_pair(tmp_path)
    addresses = [primary.address, backup.address]
    journal = tmp_path / "journal"
    bridge = SparkBridgeService(
        addresses, BridgeConfig(journal_dir=journal, roll_seconds=0.05, heartbeat_timeout=1.5)
    )
    output = tmp_path / "tail.jsonl"
    cli: subprocess.Popen[bytes] | None = None
    publisher = EventBusPublisher(addresses, producer_id="clients", failover_after=0.5)
    try:
        yield wait_until(lambda: formed(primary, backup), timeout=60, what="pair formed")
        bridge.startService()
        with open(output, "wb") as out:
            cli = subprocess.Popen(
                [CLI, "tail", "--server", addresses[0], "--server", addresses[1]],
                stdout=out,
                stderr=subprocess.DEVNULL,
            )
        # The CLI is subscribed once a first event reaches it.
        publisher.publish("/clients/", -1)
        yield wait_until(lambda: len(cli_sequences(output)) >= 1, timeout=30, what="cli tails")
        for i in range(1000):
            publisher.publish("/clients/", i)
        yield wait_until(lambda: bridge.journaled >= 1001 and len(cli_sequences(output)) >= 1001,
                         timeout=30, what="before")  # fmt: skip
        primary.stop(signal.SIGKILL)
        yield wait_until(lambda: backup.state() == "active", timeout=30, what="takeover")
        for i in range(1000, 2000):
            publisher.publish("/clients/", i)
        yield wait_until(lambda: bridge.journaled >= 2001 and len(cli_sequences(output)) >= 2001,
                         timeout=60, what="after")  # fmt: skip
    finally:
        publisher.close()
        if bridge.running:
            yield bridge.stopService()
        try:
            if cli is not None:
                cli.send_signal(signal.SIGINT)
                try:
                    cli.wait(30)
                except subprocess.TimeoutExpired:
                    cli.kill()
                    cli.wait()
                    raise AssertionError("eventbus-cli tail went on 30 s after SIGINT") from None
        finally:  # the pair is stopped whatever the CLI did
            codes = [half.stop() for half in (primary, backup) if half.process is not None]
    assert all(code in CLEAN_EXIT for code in codes), codes
    reader = JournalReader(journal)
    table = reader.read(0, reader.latest_sequence(), fail_on_data_loss=False)
    assert [int(s) for s in table.column("seq").to_pylist()] == list(range(1, 2002))
    assert cli_sequences(output) == list(range(1, 2002))
