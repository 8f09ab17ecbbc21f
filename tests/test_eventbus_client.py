"""The Twisted client against a real server: snapshot + live, gap healing, resume, failover."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest_twisted
from twisted.internet import reactor

from bus.eventbus.client import EventBusPublisher, EventBusSubscriber, FileCursor, ServerAddress
from bus.eventbus.codec import Event
from bus.testing import start_bus, wait_until


def address(server: Any) -> str:
    return f"127.0.0.1:{server.port}"


@pytest_twisted.inlineCallbacks
def test_subscriber_gets_snapshot_then_live_events_of_its_subtrees(bus_server: Any) -> Any:
    publisher = EventBusPublisher(address(bus_server), producer_id="test")
    for i in range(10):
        publisher.publish(f"/orders/{i}/" if i % 2 else f"/users/{i}/", {"i": i})
    yield publisher.flush()
    yield wait_until(lambda: bus_server.store.last_sequence == 10)

    got: list[Event] = []
    subscriber = EventBusSubscriber([address(bus_server)], ["/orders/"], got.append)
    subscriber.startService()
    try:
        yield wait_until(lambda: len(got) == 5, what="snapshot")
        assert [e.value()["i"] for e in got] == [1, 3, 5, 7, 9]
        for i in range(10, 20):
            publisher.publish(f"/orders/{i}/" if i % 2 else f"/users/{i}/", {"i": i})
        yield wait_until(lambda: len(got) == 10, what="live events")
        assert [e.value()["i"] for e in got] == list(range(1, 20, 2))
        sequences = [e.sequence for e in got]
        assert sequences == sorted(sequences)
        event = got[0]
        assert event.producer_id == "test"
        assert event.topic_name == "/orders/1/"
        assert event.time.tzinfo is not None
        assert len(event.event_id) == 36
    finally:
        yield subscriber.stopService()
        publisher.close()


@pytest_twisted.inlineCallbacks
def test_gaps_from_a_lossy_pub_socket_are_healed_exactly_once(tmp_path: Path) -> Any:
    # Tiny PUB and SUB queues make ZeroMQ drop broadcasts; the client must notice the
    # holes (sequence jumps and heartbeats) and fill them from the store.
    server = start_bus(tmp_path, publish_hwm=20, heartbeat_interval=0.1)
    got: list[int] = []
    subscriber = EventBusSubscriber(
        [address(server)], [], lambda e: got.append(e.sequence), receive_hwm=20
    )
    subscriber.startService()
    publisher = EventBusPublisher(address(server), producer_id="flood")
    try:
        yield wait_until(lambda: not subscriber.core.syncing, what="first snapshot")
        total = 20_000
        for i in range(total):
            publisher.publish(f"/flood/{i % 13}/", i)
        yield publisher.flush()
        yield wait_until(lambda: len(got) >= total, timeout=60, what="all events")
        assert got == list(range(1, total + 1))
        assert subscriber.core.stats.gaps > 0, "the test did not exercise healing"
        assert subscriber.core.stats.healed_events > 0
    finally:
        yield subscriber.stopService()
        publisher.close()
        yield server.stopService()


@pytest_twisted.inlineCallbacks
def test_resume_from_a_stored_cursor(bus_server: Any, tmp_path: Path) -> Any:
    cursor = FileCursor(tmp_path / "cursor")
    publisher = EventBusPublisher(address(bus_server), producer_id="test")
    got: list[int] = []
    for i in range(3):
        publisher.publish("/c/", i)
    subscriber = EventBusSubscriber(
        [address(bus_server)], [], lambda e: got.append(e.value()), cursor=cursor
    )
    subscriber.startService()
    yield wait_until(lambda: len(got) == 3)
    yield subscriber.stopService()
    assert cursor.load() == 3

    for i in range(3, 6):
        publisher.publish("/c/", i)
    yield wait_until(lambda: bus_server.store.last_sequence == 6)
    resumed: list[int] = []
    subscriber = EventBusSubscriber(
        [address(bus_server)], [], lambda e: resumed.append(e.value()), cursor=cursor
    )
    subscriber.startService()
    try:
        yield wait_until(lambda: len(resumed) == 3)
        assert got == [0, 1, 2]
        assert resumed == [3, 4, 5]
    finally:
        yield subscriber.stopService()
        publisher.close()


@pytest_twisted.inlineCallbacks
def test_failover_to_the_next_server_when_heartbeats_stop(tmp_path: Path) -> Any:
    primary = start_bus(tmp_path / "a", heartbeat_interval=0.05)
    backup = start_bus(tmp_path / "b", heartbeat_interval=0.05)
    got: list[tuple[str, int]] = []
    subscriber = EventBusSubscriber(
        [address(primary), address(backup)],
        ["/f/"],
        lambda e: got.append((e.topic_name, e.value())),
        heartbeat_timeout=0.5,
    )
    subscriber.startService()
    to_primary = EventBusPublisher(address(primary), producer_id="p")
    to_backup = EventBusPublisher(address(backup), producer_id="b")
    try:
        to_primary.publish("/f/primary/", 1)
        yield wait_until(lambda: got == [("/f/primary/", 1)])
        # The heartbeat names the primary's log, so the backup's is known to be another.
        yield wait_until(lambda: subscriber.core.store_id == primary.store.store_id)
        yield primary.stopService()
        to_backup.publish("/f/backup/", 2)
        yield wait_until(lambda: subscriber.failovers == 1, timeout=10)
        assert subscriber.server == ServerAddress.parse(address(backup))
        yield wait_until(lambda: ("/f/backup/", 2) in got, timeout=10)
        assert subscriber.core.stats.store_changes == 1
    finally:
        yield subscriber.stopService()
        to_primary.close()
        to_backup.close()
        yield backup.stopService()


@pytest_twisted.inlineCallbacks
def test_a_stall_of_the_process_is_not_taken_for_the_server_s_silence(tmp_path: Path) -> Any:
    """Server and subscriber in one process, heartbeats every 50 ms, 0.5 s of silence a
    failover: stalled for 1.5 s (SIGSTOP, a VM's pause, a starved machine) three times, the
    subscriber's first checks after each come late with the heartbeats unread. It stays."""
    primary = start_bus(tmp_path / "a", heartbeat_interval=0.05)
    backup = start_bus(tmp_path / "b", heartbeat_interval=0.05)
    got: list[int] = []
    subscriber = EventBusSubscriber(
        [address(primary), address(backup)], ["/s/"], lambda e: got.append(e.value()),
        heartbeat_timeout=0.5,
    )  # fmt: skip
    subscriber.startService()
    publisher = EventBusPublisher(address(primary), producer_id="p")
    try:
        yield wait_until(lambda: subscriber.core.store_id == primary.store.store_id)
        for stall in range(1, 4):
            publisher.publish("/s/", stall)
            yield wait_until(lambda n=stall: got[-1:] == [n], what="the event before the stall")
            woken = subscriber.wakes.woken + 2
            yield wait_until(lambda n=woken: subscriber.wakes.woken >= n, what="its checks")
            reactor.callLater(0, time.sleep, 1.5)
            # Its late check held back, and a check after it judged.
            yield wait_until(
                lambda n=stall: subscriber.wakes.held >= n and subscriber.wakes.late_at is None,
                what="a check that judged after the stall",
            )
        publisher.publish("/s/", 4)
        yield wait_until(lambda: got[-1:] == [4], what="an event after the stalls")
        assert subscriber.failovers == 0 and got == [1, 2, 3, 4]
    finally:
        yield subscriber.stopService()
        publisher.close()
        yield primary.stopService()
        yield backup.stopService()


def test_server_address_parsing() -> None:
    assert ServerAddress.parse("tcp://10.1.2.3:6000") == ServerAddress("10.1.2.3", 6000)
    assert ServerAddress.parse("[::1]:5556").host == "::1"
    assert ServerAddress.parse("h:5556").collector == "tcp://h:5558"
    for bad in ("nohost", "h:", "h:port"):
        try:
            ServerAddress.parse(bad)
        except ValueError:
            continue
        raise AssertionError(f"{bad!r} was accepted")


@pytest_twisted.inlineCallbacks
def test_a_stopped_subscriber_starts_again_where_it_was(bus_server: Any) -> Any:
    publisher = EventBusPublisher(address(bus_server), producer_id="restart")
    got: list[int] = []
    subscriber = EventBusSubscriber([address(bus_server)], [], lambda e: got.append(e.value()))
    try:
        publisher.publish("/s/", 1)
        subscriber.startService()
        yield wait_until(lambda: got == [1])
        yield subscriber.stopService()
        publisher.publish("/s/", 2)
        yield wait_until(lambda: bus_server.store.last_sequence == 2)
        subscriber.startService()
        yield wait_until(lambda: got == [1, 2])
    finally:
        yield subscriber.stopService()
        publisher.close()
