"""A real full disk under a real server (twistd) and a real Spark bridge: a small tmpfs
the test mounts, fills with a filler file, then frees.

Nothing is broadcast that is not stored, nothing is journaled twice or lost, both pause
with one clear line and catch up by themselves, and SIGTERM stops the server while full.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import pytest_twisted
from twisted.internet import reactor, task
from twisted.logger import LogEvent, formatEvent, globalLogPublisher

from bus.eventbus.client import EventBusPublisher, EventBusSubscriber
from bus.eventbus.store import EventStore
from bus.spark.bridge import SparkBridgeService
from bus.spark.config import BridgeConfig
from bus.spark.journal import JournalReader
from bus.testing import start_bus, wait_until
from tests.processes import CLEAN_EXIT, ServerProcess, reported
from tests.small_disk import fill, small_tmpfs


def log_lines(path: Path, text: str) -> list[str]:
    return [line for line in path.read_text(errors="replace").splitlines() if text in line]


@pytest_twisted.inlineCallbacks
def test_server_on_a_full_disk_pauses_catches_up_and_stops_on_sigterm(tmp_path: Path) -> Any:
    with small_tmpfs(tmp_path / "disk", "8m") as disk:
        data = disk / "data"
        data.mkdir()
        log = tmp_path / "server.log"  # off the small disk, so that it is complete
        server = ServerProcess(data, log_path=log, http=True)
        received: list[Any] = []
        subscriber = publisher = None
        try:
            yield reported(server.ready, what="server start")
            subscriber = EventBusSubscriber(
                [server.address], [], received.append, heartbeat_timeout=None
            )
            subscriber.startService()
            yield wait_until(lambda: not subscriber.core.syncing, what="subscribed")
            filler = fill(disk, leave=512 * 1024)
            publisher = EventBusPublisher(server.address, producer_id="full-disk")
            payload = os.urandom(150).hex()
            for i in range(6000):
                publisher.publish("/disk/", [i, payload])
            # /status, not log lines, says when: the log's storage lines are rate-limited
            # (and status.json is on the full disk).
            yield wait_until(
                lambda: server.live_status().get("collector_paused"), timeout=30, what="paused"
            )
            paused = server.live_status()
            assert log_lines(log, "cannot write")
            assert paused["refused_storage"] > 0
            assert "full" in paused["storage_error"]
            assert paused["sequence"] < 6000

            filler.unlink()  # space returns
            yield wait_until(lambda: len(received) == 6000, timeout=60, what="caught up")
            yield wait_until(
                lambda: (
                    server.live_status().get("sequence") == 6000
                    and not server.live_status().get("collector_paused")
                ),
                timeout=30,
                what="status after recovery",
            )
            assert log_lines(log, "writes again")
            assert [e.sequence for e in received] == list(range(1, 6001))
            assert [e.value()[0] for e in received] == list(range(6000))
            refused = server.live_status()["refused_storage"]

            # Full again, and SIGTERM while full. SQLite reuses its write-ahead log's space
            # once checkpointed, so it may take that much before a write fails: publish
            # until the store refuses.
            fill(disk, leave=64 * 1024)

            def full_again() -> bool:
                status = server.live_status()
                return bool(status.get("collector_paused")) and status["refused_storage"] > refused

            published = 6000
            while not full_again():
                assert published < 60_000, "the store never refused on a full disk"
                for i in range(published, published + 1000):
                    publisher.publish("/disk/", [i, payload])
                published += 1000
                yield task.deferLater(reactor, 0.5, lambda: None)
        finally:
            if subscriber is not None:
                yield subscriber.stopService()
            if publisher is not None:
                publisher.close()
            code = server.stop(signal.SIGTERM)  # raises if it hangs
        assert code in CLEAN_EXIT
        assert log_lines(log, "event bus stopped at sequence")
        assert not log_lines(log, "Traceback")

        # A restart on the still-full disk serves, and stops on SIGTERM.
        again = ServerProcess(data, log_path=tmp_path / "restart.log")
        try:
            yield reported(again.ready, what="restart on a full disk")
        finally:
            assert again.stop(signal.SIGTERM) in CLEAN_EXIT

        # Everything ever broadcast is stored, under the sequence it was broadcast with.
        (disk / "filler").unlink()
        store = EventStore(data)
        try:
            stored = {e.sequence: e.uuid for e in store.read(0, limit=100_000)}
        finally:
            store.close()
        assert sorted(stored) == list(range(1, len(stored) + 1))
        assert all(stored.get(e.sequence) == e.uuid for e in received)


@pytest.fixture
def bridge_log() -> Iterator[list[str]]:
    lines: list[str] = []

    def observe(event: LogEvent) -> None:
        if event.get("log_namespace") == "bus.spark.bridge":
            lines.append(f"{event['log_level'].name}: {formatEvent(event)}")

    globalLogPublisher.addObserver(observe)
    yield lines
    globalLogPublisher.removeObserver(observe)


def journaled(directory: Path) -> list[int]:
    reader = JournalReader(directory)
    latest = reader.latest_sequence()
    if latest is None:
        return []
    table = reader.read(0, latest, fail_on_data_loss=False)
    return [int(s) for s in table.column("seq").to_pylist()]


@pytest_twisted.inlineCallbacks
def test_bridge_on_a_full_disk_pauses_loses_nothing_and_catches_up(
    tmp_path: Path, bridge_log: list[str]
) -> Any:
    count = 8000
    with small_tmpfs(tmp_path / "disk", "8m") as disk:
        journal = disk / "journal"
        server = start_bus(tmp_path / "bus")
        address = f"127.0.0.1:{server.port}"
        config = BridgeConfig(
            journal_dir=journal,
            roll_events=500,
            roll_seconds=0.05,
            storage_retry_min=0.05,
            storage_retry_max=0.2,
        )
        bridge = SparkBridgeService([address], config)
        publisher = EventBusPublisher(address, producer_id="full-journal")
        try:
            bridge.startService()
            publisher.publish("/j/", [0, ""])
            yield wait_until(lambda: bridge.journaled == 1, timeout=30, what="bridge running")
            filler = fill(disk, leave=256 * 1024)
            payload = os.urandom(200).hex()  # does not compress: the journal grows
            for i in range(1, count):
                publisher.publish("/j/", [i, payload])
            yield publisher.flush()
            yield wait_until(lambda: bridge.journal_blocked, timeout=30, what="blocked")
            yield wait_until(lambda: bridge.journal_errors >= 3, timeout=30, what="retries")
            status = bridge.status()
            assert status["paused"] and bridge.subscriber.paused
            assert status["failed"] is None
            assert "No space left" in status["journal_error"]
            errors = [line for line in bridge_log if "cannot be written" in line]
            assert errors and errors[0].startswith("error: ")
            assert len(errors) < bridge.journal_errors  # rate-limited
            written = journaled(journal)
            assert written == list(range(1, len(written) + 1))
            assert len(written) < count

            filler.unlink()
            yield wait_until(
                lambda: (
                    JournalReader(journal).latest_sequence() == count and not bridge.journal_blocked
                ),
                timeout=60,
                what="caught up",
            )
            assert [line for line in bridge_log if "written again" in line]
            assert not bridge.status()["paused"]
            yield bridge.stopService()
            assert journaled(journal) == list(range(1, count + 1))  # each exactly once
            assert JournalReader(journal).gaps() == []
        finally:
            if bridge.running:
                yield bridge.stopService()
            publisher.close()
            yield server.stopService()


@pytest_twisted.inlineCallbacks
def test_bridge_stops_while_its_disk_is_full_and_resumes_after_a_restart(tmp_path: Path) -> Any:
    count = 6000
    with small_tmpfs(tmp_path / "disk", "8m") as disk:
        journal = disk / "journal"
        server = start_bus(tmp_path / "bus")
        address = f"127.0.0.1:{server.port}"
        config = BridgeConfig(journal_dir=journal, roll_events=500, roll_seconds=0.05)
        bridge = SparkBridgeService([address], config)
        publisher = EventBusPublisher(address, producer_id="full-stop")
        try:
            bridge.startService()
            publisher.publish("/s/", [0, ""])
            yield wait_until(lambda: bridge.journaled == 1, timeout=30, what="bridge running")
            filler = fill(disk, leave=128 * 1024)
            payload = os.urandom(200).hex()
            for i in range(1, count):
                publisher.publish("/s/", [i, payload])
            yield publisher.flush()
            yield wait_until(lambda: bridge.journal_blocked, timeout=30, what="blocked")
            yield bridge.stopService()  # returns although nothing can be written
            filler.unlink()
            bridge = SparkBridgeService([address], config)
            bridge.startService()
            yield wait_until(
                lambda: JournalReader(journal).latest_sequence() == count,
                timeout=60,
                what="caught up after the restart",
            )
            yield bridge.stopService()
            assert journaled(journal) == list(range(1, count + 1))
            assert JournalReader(journal).gaps() == []
        finally:
            if bridge.running:
                yield bridge.stopService()
            publisher.close()
            yield server.stopService()
