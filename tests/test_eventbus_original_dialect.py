"""Our client, the Spark bridge's feed and eventbus-cli against the original Node.js server's
behaviour (tests/fake_original.py): decimal SYNCSTART, ',' between subtrees, a UTF-8 snapshot
identity, and liveness without heartbeats; with the default dialect, one line that says so."""

from __future__ import annotations

import signal
from collections.abc import Iterator
from typing import Any

import pytest
import pytest_twisted
from twisted.internet import reactor
from twisted.logger import LogEvent, formatEvent, globalLogPublisher

from bus.eventbus.codec import Event
from bus.testing import wait_until
from tests.processes import reported

from .fake_original import FakeOriginalBus
from .test_eventbus_cli import Command


@pytest.fixture
def original() -> Iterator[FakeOriginalBus]:
    bus = FakeOriginalBus(reactor)
    yield bus
    bus.close()


@pytest.fixture
def log_lines() -> Iterator[list[str]]:
    lines: list[str] = []

    def observe(event: LogEvent) -> None:
        lines.append(formatEvent(event))

    globalLogPublisher.addObserver(observe)
    yield lines
    globalLogPublisher.removeObserver(observe)


def publish(original: FakeOriginalBus, *values: int) -> Any:
    from bus.eventbus.client import EventBusPublisher

    publisher = EventBusPublisher(original.address, producer_id="old-app", dialect="original")
    for value in values:
        publisher.publish(f"/orders/{value % 2}/", value)
    return publisher


@pytest_twisted.inlineCallbacks
def test_subscriber_gets_snapshot_live_events_and_heals_without_heartbeats(
    original: FakeOriginalBus,
) -> Any:
    from bus.eventbus.client import EventBusSubscriber

    publisher = publish(original, 1, 2, 3, 4)
    yield wait_until(lambda: original.sequence == 4, what="stored by the original")
    received: list[Event] = []
    subscriber = EventBusSubscriber(
        [original.address], [], received.append, heartbeat_timeout=0.6, dialect="original"
    )
    subscriber.startService()
    try:
        yield wait_until(lambda: len(received) == 4, what="the snapshot")
        assert original.log[0] == "Sending snapshot=0"  # decimal, not NaN
        publisher.publish("/orders/1/", 5)
        yield wait_until(lambda: len(received) == 5, what="a live event")
        # A broadcast lost in the middle shows as a jump; one lost at the tail only shows
        # through the probes' SYNCENDs (there is no heartbeat to announce it).
        original.lose_broadcasts.update({6, 8})
        for value in (6, 7):
            publisher.publish("/orders/0/", value)
        yield wait_until(lambda: len(received) == 7, timeout=10, what="healed jump")
        assert subscriber.core.stats.gaps == 1
        publisher.publish("/orders/0/", 8)
        yield wait_until(lambda: len(received) == 8, timeout=10, what="healed tail")
        assert [e.sequence for e in received] == list(range(1, 9))
        assert [e.value() for e in received] == list(range(1, 9))
        assert subscriber.core.stats.gaps >= 2
        assert subscriber.failovers == 0  # probes kept the silent server alive
        probes = sum(1 for line in original.log if line.startswith("Sending snapshot="))
        assert probes > subscriber.core.stats.snapshots  # probes as well as snapshots
    finally:
        publisher.close()
        yield subscriber.stopService()


@pytest_twisted.inlineCallbacks
def test_subtree_subscriber_asks_with_commas(original: FakeOriginalBus) -> Any:
    from bus.eventbus.client import EventBusSubscriber

    publisher = publish(original, 1, 2, 3)
    yield wait_until(lambda: original.sequence == 3)
    received: list[Event] = []
    subscriber = EventBusSubscriber(
        [original.address], ["/orders/1/", "/none/"], received.append, dialect="original"
    )
    subscriber.startService()
    try:
        yield wait_until(lambda: len(received) == 2, what="subtree snapshot")
        assert [e.value() for e in received] == [1, 3]
    finally:
        publisher.close()
        yield subscriber.stopService()


@pytest_twisted.inlineCallbacks
def test_default_dialect_says_once_that_the_server_looks_original(
    original: FakeOriginalBus, log_lines: list[str]
) -> Any:
    from bus.eventbus.client import EventBusSubscriber

    publisher = publish(original, 1)
    yield wait_until(lambda: original.sequence == 1)
    subscriber = EventBusSubscriber([original.address], [], lambda e: None, heartbeat_timeout=0.5)
    subscriber.startService()
    try:
        yield wait_until(lambda: "Sending snapshot=NaN" in original.log)
        publisher.publish("/orders/0/", 2)  # a live, decimal broadcast
        hint = "looks like the original Node.js Event BUS; use dialect='original'"
        yield wait_until(lambda: any(hint in line for line in log_lines), timeout=10)
        yield wait_until(lambda: subscriber.core.stats.snapshots >= 3, timeout=10)
        assert sum(hint in line for line in log_lines) == 1
    finally:
        publisher.close()
        yield subscriber.stopService()


@pytest_twisted.inlineCallbacks
def test_cli_publish_snapshot_and_tail_with_the_original_dialect(
    original: FakeOriginalBus,
) -> Any:
    server = original.address
    first = Command("publish", "--server", server, "--dialect", "original", "/a/1/", '{"n": 1}')
    yield first.ended()
    assert first.process.returncode == 0, first.err
    assert first.lines()[0]["seq"] == 1
    publish(original, 2).close()
    yield wait_until(lambda: original.sequence == 2)

    dump = Command("snapshot", "--server", server, "--dialect", "original", "/a/", "/orders/")
    yield dump.ended()
    assert dump.process.returncode == 0, dump.err
    assert [line["seq"] for line in dump.lines()] == [1, 2]
    assert "2 events, snapshot complete at sequence 2" in dump.err

    tail = Command("tail", "--server", server, "--dialect", "original", "--since", "1")
    try:
        yield reported(lambda: tail.out.count("\n") >= 1, tail.process, what="tail's event")
        publish(original, 3).close()
        yield wait_until(lambda: tail.out.count("\n") >= 2, timeout=30)
    finally:
        tail.process.send_signal(signal.SIGINT)
        yield wait_until(tail.finished, timeout=30)
    assert [line["seq"] for line in tail.lines()] == [2, 3]


@pytest_twisted.inlineCallbacks
def test_cli_with_the_default_dialect_ends_with_one_line_that_suggests_original(
    original: FakeOriginalBus,
) -> Any:
    server = original.address
    commands = [
        Command("publish", "--server", server, "/a/", "1", "--timeout", "1"),
        Command("snapshot", "--server", server, "--timeout", "1"),
        Command("tail", "--server", server, "--timeout", "1"),
    ]
    for command in commands:
        yield command.ended()
    waited_for = ["a heartbeat from", "SYNCEND from", "the first snapshot from"]
    for command, what in zip(commands, waited_for, strict=True):
        assert command.process.returncode == 1, command.err
        [line] = command.err.strip().splitlines()
        assert f"timed out after 1s waiting for {what} {server}" in line
        assert "try --dialect original" in line
        assert "Traceback" not in command.err


@pytest_twisted.inlineCallbacks
def test_cli_against_nothing_ends_with_one_line_naming_the_server() -> Any:
    dead = "127.0.0.1:9"
    commands = [
        Command("snapshot", "--server", dead, "--timeout", "0.5"),
        Command(
            "publish", "--server", dead, "--dialect", "original", "/a/", "1", "--timeout", "0.5"
        ),
        Command("tail", "--server", dead, "--dialect", "original", "--timeout", "0.5"),
    ]
    for command in commands:
        yield command.ended()
        assert command.process.returncode == 1
        [line] = command.err.strip().splitlines()
        assert dead in line and "timed out" in line and "original" not in line.split(":")[-1]


@pytest_twisted.inlineCallbacks
def test_cli_recognises_the_originals_answer_as_it_arrives() -> Any:
    # With its in-memory store the original answers our binary SYNCSTART at once, with a
    # decimal SYNCEND: snapshot (60 s timeout) and publish (10 s) say so then, not after.
    original = FakeOriginalBus(reactor, nan_answers=True)
    try:
        publisher = publish(original, 1, 2)
        yield wait_until(lambda: original.sequence == 2, what="stored by the original")
        publisher.close()
        server = original.address
        commands = [
            Command("snapshot", "--server", server),
            Command("publish", "--server", server, "/a/", "1"),
        ]
        for command in commands:
            yield command.ended()
        for command in commands:
            assert command.process.returncode == 1, command.err
            [line] = command.err.strip().splitlines()
            assert f"{server} answers like the original Node.js Event BUS" in line, line
            assert "try --dialect original" in line and "timed out" not in line, line
            assert not command.out  # no half-truth: no events, no "complete at sequence 2"
        assert original.log.count("Sending snapshot=NaN") == 2
    finally:
        original.close()
