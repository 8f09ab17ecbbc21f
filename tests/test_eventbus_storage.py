"""The Event BUS when its store cannot write: the collector pauses, nothing is broadcast
that is not stored, the refused batch is retried until it is stored, and a stop never
hangs. Here SQLite's real SQLITE_FULL comes from ``PRAGMA max_page_count``; the full
filesystem (a tmpfs) is in test_eventbus_full_disk.py."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import pytest_twisted
from twisted.logger import LogEvent, formatEvent, globalLogPublisher

from bus.eventbus.codec import HEARTBEAT_TOPIC, SEQUENCE
from bus.eventbus.store import EventStore
from bus.testing import RawPeer, start_bus, wait_until
from tests.eventbus_helpers import pub


@pytest.fixture
def bus_log() -> Iterator[list[str]]:
    """The bus's log lines (level and text) while the test runs."""
    lines: list[str] = []

    def observe(event: LogEvent) -> None:
        if event.get("log_namespace") == "bus.eventbus":
            lines.append(f"{event['log_level'].name}: {formatEvent(event)}")

    globalLogPublisher.addObserver(observe)
    yield lines
    globalLogPublisher.removeObserver(observe)


def cap_store(server: Any, pages: int | None) -> None:
    """Let the server's database grow no further (None: lift the cap)."""
    db = server.store._db
    if pages is None:
        pages = 2**30
    db.execute(f"PRAGMA max_page_count = {pages}")


def pages_in_use(server: Any) -> int:
    return int(server.store._db.execute("PRAGMA page_count").fetchone()[0])


def broadcasts(sub: RawPeer) -> list[list[bytes]]:
    return [m for m in sub.messages if m[0] != HEARTBEAT_TOPIC]


def lines_with(lines: list[str], text: str) -> list[str]:
    return [line for line in lines if text in line]


@pytest_twisted.inlineCallbacks
def test_a_store_that_cannot_write_pauses_the_collector_then_catches_up(
    tmp_path: Path, peers: list[Any], bus_log: list[str]
) -> Any:
    server = start_bus(
        tmp_path / "bus", storage_retry_min=0.02, storage_retry_max=0.1, read_budget=64
    )
    try:
        sub = RawPeer.sub(server.endpoints["publisher"])
        producer = RawPeer.dealer(server.endpoints["collector"])
        peers += [sub, producer]
        yield wait_until(lambda: any(m[0] == HEARTBEAT_TOPIC for m in sub.messages))
        sent = [pub(f"/full/{i}/", "x" * 300) for i in range(2000)]
        for frames in sent[:20]:
            producer.send(frames)
        yield wait_until(lambda: server.store.last_sequence == 20, what="first events stored")

        cap_store(server, pages_in_use(server))
        for frames in sent[20:]:
            producer.send(frames)
        yield wait_until(lambda: server.core.collector_paused, what="collector paused")
        yield wait_until(lambda: server.storage_errors >= 3, what="retries")
        status = server.status()
        assert status["collector_paused"] is True
        assert status["refused_storage"] >= status["storage_waiting"] > 0
        assert "full" in status["storage_error"]
        assert server.collector_socket.reading_paused
        # Nothing broadcast that is not stored: every broadcast sequence is in the log.
        stored_uuids = {e.uuid for e in server.store.read(0, limit=10_000)}
        assert server.store.last_sequence < 2000
        assert all(m[4] in stored_uuids for m in broadcasts(sub))
        assert len(broadcasts(sub)) <= server.store.last_sequence
        # One error line, not one per failed attempt, and no traceback.
        refusals = lines_with(bus_log, "cannot write")
        assert refusals and refusals[0].startswith("error: ")
        assert "collector paused" in refusals[0]
        assert len(refusals) < server.storage_errors
        assert not lines_with(bus_log, "Traceback")

        cap_store(server, None)
        yield wait_until(lambda: len(broadcasts(sub)) == 2000, what="every event broadcast")
        got = broadcasts(sub)
        assert [SEQUENCE.unpack(m[1])[0] for m in got] == list(range(1, 2001))
        assert [m[4] for m in got] == [frames[4] for frames in sent]  # in order, once each
        status = server.status()
        assert status["collector_paused"] is False
        assert status["storage_waiting"] == 0
        assert status["storage_error"] is None
        assert status["accepted"] == 2000
        assert not server.collector_socket.reading_paused
        assert lines_with(bus_log, "writes again")
    finally:
        yield server.stopService()


@pytest_twisted.inlineCallbacks
def test_stop_while_the_store_cannot_write_finishes_and_keeps_what_was_stored(
    tmp_path: Path, peers: list[Any], bus_log: list[str]
) -> Any:
    server = start_bus(tmp_path / "bus", storage_retry_min=0.02, storage_retry_max=0.1)
    stopped = False
    try:
        sub = RawPeer.sub(server.endpoints["publisher"])
        producer = RawPeer.dealer(server.endpoints["collector"])
        peers += [sub, producer]
        yield wait_until(lambda: any(m[0] == HEARTBEAT_TOPIC for m in sub.messages))
        cap_store(server, pages_in_use(server))
        for i in range(1000):
            producer.send(pub(f"/stop/{i}/", "y" * 300))
        yield wait_until(lambda: server.core.collector_paused, what="collector paused")
        stored = server.store.last_sequence
        yield server.stopService()
        stopped = True
    finally:
        if not stopped:
            yield server.stopService()
    assert lines_with(bus_log, "received events not stored")
    assert lines_with(bus_log, f"event bus stopped at sequence {stored}")
    store = EventStore(tmp_path / "bus")
    try:
        assert store.last_sequence == stored
        stored_uuids = {e.uuid for e in store.read(0, limit=10_000)}
        assert all(m[4] in stored_uuids for m in broadcasts(sub))
    finally:
        store.close()
