"""The Spark bridge against a real bus: exact journals across restarts, loss and retention."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest_twisted

from bus.eventbus.client import EventBusPublisher
from bus.eventbus.store import Retention
from bus.spark.bridge import SparkBridgeService
from bus.spark.config import BridgeConfig
from bus.spark.journal import JournalReader
from bus.testing import start_bus, wait_until

TWISTD = str(Path(sys.executable).with_name("twistd"))


def journaled_sequences(directory: Path) -> list[int]:
    reader = JournalReader(directory)
    # Known gaps are checked by the tests themselves (reader.gaps()).
    table = reader.read(0, reader.latest_sequence(), fail_on_data_loss=False)
    return [int(s) for s in table.column("seq").to_pylist()]


def latest(directory: Path) -> int:
    """The journal's last sequence, 0 before the bridge has created it."""
    if not directory.exists():
        return 0
    return JournalReader(directory).latest_sequence() or 0


def bridge_for(server: Any, journal: Path, **settings: Any) -> SparkBridgeService:
    config = BridgeConfig(journal_dir=journal, roll_seconds=0.05, **settings)
    return SparkBridgeService([f"127.0.0.1:{server.port}"], config)


@pytest_twisted.inlineCallbacks
def test_bridge_journals_every_event_once_through_a_lossy_feed(tmp_path: Path) -> Any:
    # Tiny PUB/SUB queues: ZeroMQ drops broadcasts, the bridge must heal from the log.
    server = start_bus(tmp_path / "bus", publish_hwm=50)
    bridge = bridge_for(server, tmp_path / "journal", roll_events=3000)
    bridge.startService()
    publisher = EventBusPublisher(f"127.0.0.1:{server.port}", producer_id="bridge-test")
    try:
        # Live first: the flood must go through the lossy feed, not into the first snapshot.
        core = bridge.subscriber.core
        yield wait_until(lambda: core.stats.snapshots >= 1 and not core.syncing, what="live")
        for i in range(20_000):
            publisher.publish(f"/load/{i % 5}/", {"i": i})
        yield publisher.flush()
        yield wait_until(lambda: bridge.journaled >= 20_000, timeout=60, what="journaled")
        yield bridge.stopService()
        assert journaled_sequences(tmp_path / "journal") == list(range(1, 20_001))
        assert bridge.subscriber.core.stats.gaps > 0, "the feed lost nothing: healing untested"
        table = JournalReader(tmp_path / "journal").read(0, 3)
        assert table.column("topic").to_pylist() == ["/load/0/", "/load/1/", "/load/2/"]
        assert table.column("producer").to_pylist() == ["bridge-test"] * 3
        assert table.schema.field("timestamp").type.tz == "UTC"
    finally:
        if bridge.running:
            yield bridge.stopService()
        publisher.close()
        yield server.stopService()


@pytest_twisted.inlineCallbacks
def test_bridge_restart_resumes_without_duplicates_or_holes(tmp_path: Path) -> Any:
    server = start_bus(tmp_path / "bus")
    journal = tmp_path / "journal"
    publisher = EventBusPublisher(f"127.0.0.1:{server.port}", producer_id="restart")
    try:
        bridge = bridge_for(server, journal)
        bridge.startService()
        for i in range(3000):
            publisher.publish("/r/", i)
        yield wait_until(lambda: bridge.journaled >= 1000, timeout=30)
        yield bridge.stopService()
        for i in range(3000, 6000):  # published while the bridge is down
            publisher.publish("/r/", i)
        yield publisher.flush()
        yield wait_until(lambda: server.store.last_sequence == 6000, timeout=30)
        bridge = bridge_for(server, journal)
        bridge.startService()
        yield wait_until(lambda: latest(journal) >= 6000, timeout=30)
        yield bridge.stopService()
        assert journaled_sequences(journal) == list(range(1, 6001))
    finally:
        publisher.close()
        yield server.stopService()


@pytest_twisted.inlineCallbacks
def test_range_removed_by_bus_retention_is_recorded_as_a_known_gap(tmp_path: Path) -> Any:
    server = start_bus(tmp_path / "bus", retention=Retention(max_count=10), retention_interval=0.05)
    publisher = EventBusPublisher(f"127.0.0.1:{server.port}", producer_id="retention")
    journal = tmp_path / "journal"
    try:
        for i in range(100):
            publisher.publish("/old/", i)
        yield wait_until(lambda: server.store.count() == 10 and server.store.last_sequence == 100)
        bridge = bridge_for(server, journal)
        bridge.startService()
        yield wait_until(lambda: bridge.journaled == 10, timeout=30)
        yield bridge.stopService()
        reader = JournalReader(journal)
        [gap] = reader.gaps()
        assert (gap.first, gap.last) == (1, 90)
        assert "retention" in gap.reason
        assert journaled_sequences(journal) == list(range(91, 101))
    finally:
        publisher.close()
        yield server.stopService()


@pytest_twisted.inlineCallbacks
def test_bridge_refuses_a_bus_with_another_log(tmp_path: Path) -> Any:
    journal = tmp_path / "journal"
    first = start_bus(tmp_path / "one")
    publisher = EventBusPublisher(f"127.0.0.1:{first.port}", producer_id="a")
    bridge = bridge_for(first, journal)
    bridge.startService()
    publisher.publish("/a/", 1)
    yield wait_until(lambda: bridge.journaled == 1, timeout=30)
    yield bridge.stopService()
    publisher.close()
    yield first.stopService()

    other = start_bus(tmp_path / "two")
    publisher = EventBusPublisher(f"127.0.0.1:{other.port}", producer_id="b")
    try:
        for i in range(3):
            publisher.publish("/b/", i)
        bridge = bridge_for(other, journal)
        bridge.startService()
        yield wait_until(lambda: bridge.failed is not None, timeout=30)
        assert "another" in str(bridge.failed) or "belongs to" in str(bridge.failed)
        yield bridge.stopService()
        assert journaled_sequences(journal) == [1]
    finally:
        publisher.close()
        yield other.stopService()


@pytest_twisted.inlineCallbacks
def test_bridge_process_killed_mid_stream_loses_nothing(tmp_path: Path) -> Any:
    server = start_bus(tmp_path / "bus")
    journal = tmp_path / "journal"
    address = f"127.0.0.1:{server.port}"
    publisher = EventBusPublisher(address, producer_id="kill")
    command = [
        TWISTD,
        "-n",
        "--pidfile=",
        "spark-bridge",
        "--server",
        address,
        "--journal-dir",
        str(journal),
    ]
    log = open(tmp_path / "bridge.log", "ab")
    child = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=dict(os.environ))
    restarted = None
    try:
        total = 40_000
        for i in range(total):
            publisher.publish("/k/", i)
            if i % 2000 == 0:
                yield publisher.flush()
        yield publisher.flush()
        yield wait_until(lambda: latest(journal) > 2000, timeout=60)
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=30)
        restarted = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
        yield wait_until(lambda: latest(journal) >= total, timeout=90)
        assert journaled_sequences(journal) == list(range(1, total + 1))
        state = json.loads((journal / "bridge.json").read_text())
        assert state["store_id"] == server.store.store_id
    finally:
        for process in (child, restarted):
            if process is not None and process.poll() is None:
                process.send_signal(signal.SIGTERM)
                process.wait(timeout=30)
        log.close()
        publisher.close()
        yield server.stopService()


@pytest_twisted.inlineCallbacks
def test_twistd_eventbus_with_spark_bridge_composes_both(tmp_path: Path) -> Any:
    journal = tmp_path / "journal"
    data = tmp_path / "data"
    command = [
        TWISTD, "-n", "--pidfile=", "eventbus", "--port", "0", "--data-dir", str(data),
        "--stats-interval", "0.1s", "--spark-bridge", "--journal-dir", str(journal),
        "--services", "eventbus", "--http-port", "0",
    ]  # fmt: skip
    log = open(tmp_path / "composed.log", "ab")
    child = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
    publisher = None
    try:

        def endpoints() -> dict[str, str]:
            assert child.poll() is None, (tmp_path / "composed.log").read_text()
            try:
                return dict(json.loads((data / "status.json").read_text())["endpoints"])
            except (FileNotFoundError, ValueError, KeyError):
                return {}

        yield wait_until(endpoints, timeout=30, what="the bus")
        address = endpoints()["snapshot"].removeprefix("tcp://")
        publisher = EventBusPublisher(address, producer_id="composed")
        for i in range(500):
            publisher.publish("/composed/", i)
        yield publisher.flush()
        yield wait_until(lambda: latest(journal) >= 500, timeout=60, what="journaled")
        assert journaled_sequences(journal) == list(range(1, 501))
    finally:
        if publisher is not None:
            publisher.close()
        child.send_signal(signal.SIGTERM)
        child.wait(timeout=30)
        log.close()
    assert "spark bridge stopped at sequence 500" in (tmp_path / "composed.log").read_text()
