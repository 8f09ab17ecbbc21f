"""Retention as clients see it, against the server as users run it (twistd): a subscriber
resuming from a cursor that retention has passed, a snapshot that retention trims under, a
snapshot of a log compacted to each topic's latest event.

What each mode keeps is tested on the store (test_eventbus_store.py, with a model); here, that
the answers on the wire are the documented ones while retention runs (docs/eventbus.md,
"Retention"). Every wait follows what the server reports in its status.json (sequence, events
retention removed)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgpack
import pytest_twisted
import zmq

from bus.eventbus.client import EventBusPublisher, EventBusSubscriber, FileCursor
from bus.eventbus.codec import SEQUENCE
from bus.testing import wait_until
from tests.eventbus_helpers import pub
from tests.processes import CLEAN_EXIT, START_BOUND, ServerProcess, reported, wait_for


def removed_at_least(server: ServerProcess, sequence: int, removed: int) -> bool:
    """The server stored up to ``sequence`` and its retention removed ``removed`` events."""
    status = server.status()
    return status.get("sequence") == sequence and status.get("retention_removed", 0) >= removed


@pytest_twisted.inlineCallbacks
def test_a_subscriber_resuming_below_what_retention_kept_gets_every_event_still_held(
    tmp_path: Path,
) -> Any:
    data = tmp_path / "data"
    data.mkdir()
    server = ServerProcess(data, "--retention-max-count", "100", "--retention-interval", "0.1s")
    cursor = FileCursor(tmp_path / "cursor")
    publisher = subscriber = None
    try:
        yield reported(server.ready, what="server start")
        publisher = EventBusPublisher(server.address, producer_id="resume")
        first: list[Any] = []
        subscriber = EventBusSubscriber([server.address], [], first.append, cursor=cursor)
        subscriber.startService()
        yield wait_until(lambda: not subscriber.core.syncing, what="subscribed")
        for n in range(50):
            publisher.publish("/resume/", n)
        yield wait_until(lambda: len(first) == 50, what="the first 50 events")
        yield subscriber.stopService()
        assert cursor.load() == 50
        # Meanwhile 400 more: retention keeps the newest 100, 351..450.
        for n in range(50, 450):
            publisher.publish("/resume/", n)
        yield wait_until(lambda: removed_at_least(server, 450, 350), what="retention")
        again: list[Any] = []
        subscriber = EventBusSubscriber([server.address], [], again.append, cursor=cursor)
        subscriber.startService()
        yield wait_until(lambda: len(again) >= 100, what="the events still held")
        for n in range(450, 455):
            publisher.publish("/resume/", n)
        yield wait_until(lambda: len(again) >= 105, what="live events after the resume")
        # What retention removed above the cursor (51..350) is gone: the snapshot starts at
        # the first event held, then live events follow, each once, in order.
        assert [e.sequence for e in again] == list(range(351, 456))
        assert [e.value() for e in again] == list(range(350, 455))
        assert subscriber.core.stats.gaps == 0
    finally:
        if subscriber is not None and subscriber.running:
            yield subscriber.stopService()
        if publisher is not None:
            publisher.close()
        assert server.stop() in CLEAN_EXIT


def test_a_snapshot_that_retention_trims_under_ends_where_the_log_was_trimmed(
    tmp_path: Path,
) -> None:
    """The client stops reading after 100 SYNCs; retention then removes everything its
    snapshot had not sent: it gets the events it was sent, contiguous, each the one
    published there, then SYNCEND at the highest sent (``--syncend highest``)."""
    data = tmp_path / "data"
    data.mkdir()
    server = ServerProcess(data, "--retention-max-count", "2000", "--retention-interval", "0.1s")
    context = zmq.Context()
    # Events of 8 KiB: the 2000 the snapshot asks for (16 MiB) cannot all wait in the
    # sockets' queues and buffers (about 550 of them) while the client does not read.
    pad = b"x" * 8192
    try:
        wait_for(server.ready, timeout=START_BOUND, what="server start")
        endpoints = server.status()["endpoints"]
        producer = context.socket(zmq.DEALER)
        producer.linger = 5000
        producer.connect(endpoints["collector"])

        def publish(first: int, count: int) -> None:
            for n in range(first, first + count):
                producer.send_multipart(pub(f"/trim/{n % 10}/", {"n": n, "pad": pad}))

        publish(0, 5000)
        wait_for(lambda: removed_at_least(server, 5000, 3000), START_BOUND, what="retention")
        client = context.socket(zmq.DEALER)
        client.rcvhwm = 10
        client.setsockopt(zmq.RCVBUF, 65536)
        client.linger = 0
        client.rcvtimeo = int(START_BOUND * 1000)
        client.connect(endpoints["snapshot"])
        client.send_multipart([b"SYNCSTART", b"", SEQUENCE.pack(0)])
        received = [client.recv_multipart() for _ in range(100)]
        # 3000 more, while the client reads nothing: retention keeps 6001..8000.
        publish(5000, 3000)
        wait_for(lambda: removed_at_least(server, 8000, 6000), START_BOUND, what="retention")
        while received[-1][0] != b"SYNCEND":
            received.append(client.recv_multipart())
        syncs, end = received[:-1], received[-1]
        sequences = [SEQUENCE.unpack(m[2])[0] for m in syncs]
        last = sequences[-1]
        assert sequences == list(range(3001, last + 1))
        assert 3100 <= last < 5000  # the rest was removed before it was sent
        assert [msgpack.unpackb(m[6])["n"] for m in syncs] == [s - 1 for s in sequences]
        assert [m[1] for m in syncs] == [b"/trim/%d/" % ((s - 1) % 10) for s in sequences]
        assert SEQUENCE.unpack(end[2])[0] == last
    finally:
        context.destroy(linger=0)
        assert server.stop() in CLEAN_EXIT


@pytest_twisted.inlineCallbacks
def test_a_snapshot_of_a_compacted_log_is_each_topics_latest_event(tmp_path: Path) -> Any:
    data = tmp_path / "data"
    data.mkdir()
    server = ServerProcess(data, "--retention-latest-per-topic", "--retention-interval", "0.1s")
    publisher = subscriber = None
    try:
        yield reported(server.ready, what="server start")
        publisher = EventBusPublisher(server.address, producer_id="latest")
        for n in range(100):
            publisher.publish(f"/latest/{n % 5}/", n)
        yield wait_until(lambda: removed_at_least(server, 100, 95), what="compaction")
        got: list[Any] = []
        subscriber = EventBusSubscriber([server.address], ["/latest/"], got.append)
        subscriber.startService()
        yield wait_until(lambda: len(got) >= 5 and not subscriber.core.syncing, what="snapshot")
        assert [(e.topic, e.sequence, e.value()) for e in got] == [
            (f"/latest/{n % 5}/".encode(), n + 1, n) for n in range(95, 100)
        ]
    finally:
        if subscriber is not None:
            yield subscriber.stopService()
        if publisher is not None:
            publisher.close()
        assert server.stop() in CLEAN_EXIT


@pytest_twisted.inlineCallbacks
def test_with_secure_delete_the_removed_events_leave_no_bytes_in_the_data_directory(
    tmp_path: Path,
) -> Any:
    """``--secure-delete``: once retention removed them and the server stopped, no file of
    its data directory holds the removed events' data (freed pages zeroed, the WAL
    checkpointed into the database)."""
    data = tmp_path / "data"
    data.mkdir()
    server = ServerProcess(
        data, "--secure-delete", "--retention-max-count", "10", "--retention-interval", "0.1s"
    )
    secret = "secret-of-issue-46-" * 8
    publisher = None
    try:
        yield reported(server.ready, what="server start")
        publisher = EventBusPublisher(server.address, producer_id="secure")
        for n in range(100):
            publisher.publish("/secure/", {"n": n, "secret": secret})
        for n in range(100, 120):
            publisher.publish("/secure/", {"n": n})
        yield wait_until(lambda: removed_at_least(server, 120, 110), what="retention")
    finally:
        if publisher is not None:
            publisher.close()
        assert server.stop() in CLEAN_EXIT
    files = [path for path in data.rglob("*") if path.is_file()]
    assert any(path.name.endswith(".sqlite3") for path in files)
    assert [path.name for path in files if secret.encode() in path.read_bytes()] == []
