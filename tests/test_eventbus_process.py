"""The server as users run it: twistd plugin, tac file, SIGTERM and kill -9."""

from __future__ import annotations

import signal
import subprocess
from pathlib import Path
from typing import Any

import pytest_twisted

from bus.eventbus.client import EventBusPublisher, EventBusSubscriber
from bus.eventbus.store import EventStore
from bus.testing import wait_until
from tests.processes import CLEAN_EXIT, TWISTD, ServerProcess, reported


@pytest_twisted.inlineCallbacks
def test_events_a_subscriber_received_survive_kill_9(tmp_path: Path) -> Any:
    data = tmp_path / "data"
    data.mkdir()
    server = ServerProcess(data)
    received: list[Any] = []
    subscriber = publisher = None
    try:
        yield reported(server.ready, what="server start")
        address = server.address
        subscriber = EventBusSubscriber([address], [], received.append, heartbeat_timeout=None)
        subscriber.startService()
        publisher = EventBusPublisher(address, producer_id="durability")
        yield wait_until(lambda: not subscriber.core.syncing, what="subscribed")
        sent = 0
        # Keep publishing until the subscriber has seen plenty, then kill -9 mid-stream.
        while len(received) < 3000:
            for _ in range(200):
                publisher.publish("/durable/", sent)
                sent += 1
            yield wait_until(lambda: publisher.pending == 0, what="publisher queue drained")
            # Stay mid-stream: events are in flight, yet the subscriber is not left far behind.
            yield wait_until(lambda s=sent: len(received) >= s // 2, what="subscriber progress")
        server.stop(signal.SIGKILL)
        seen = {(e.sequence, e.event_id) for e in received}
    finally:
        if subscriber is not None:
            yield subscriber.stopService()
        if publisher is not None:
            publisher.close()
        server.stop(signal.SIGKILL)
    store = EventStore(data)
    try:
        stored = {(e.sequence, e.event_id) for e in store.read(0, limit=10**7)}
        assert seen <= stored, f"{len(seen - stored)} received events lost"
        assert store.last_sequence >= len(seen)
    finally:
        store.close()

    # A restarted server continues the sequence.
    again = ServerProcess(data, port=0)
    try:
        yield reported(again.ready, what="restart")
        assert again.status()["sequence"] == max(s for s, _ in stored)
    finally:
        assert again.stop() in CLEAN_EXIT


@pytest_twisted.inlineCallbacks
def test_sigterm_stops_cleanly_with_everything_stored(tmp_path: Path) -> Any:
    data = tmp_path / "data"
    data.mkdir()
    server = ServerProcess(data, "--dialect", "original")
    publisher = None
    try:
        yield reported(server.ready, what="server start")
        publisher = EventBusPublisher(server.address, producer_id="term")
        for i in range(500):
            publisher.publish("/term/", i)
        yield wait_until(lambda: server.status().get("sequence") == 500, what="stored")
        assert server.status()["config"]["sequence_encoding"] == "text"
    finally:
        if publisher is not None:
            publisher.close()
        code = server.stop(signal.SIGTERM)
    assert code in CLEAN_EXIT
    log = (tmp_path / "data.log").read_text()
    assert "event bus stopped at sequence 500" in log
    store = EventStore(data)
    try:
        assert [e.value() for e in store.read(0, limit=1000)] == list(range(500))
    finally:
        store.close()


@pytest_twisted.inlineCallbacks
def test_tac_file_serves_with_environment_settings(tmp_path: Path) -> Any:
    data = tmp_path / "tacdata"
    data.mkdir()
    server = ServerProcess(data, tac=True)
    publisher = None
    try:
        yield reported(server.ready, what="tac server start")
        publisher = EventBusPublisher(server.address, producer_id="tac")
        publisher.publish("/tac/", "hello")
        yield wait_until(lambda: server.status().get("sequence") == 1)
        assert server.status()["config"]["data_dir"] == str(data)
    finally:
        if publisher is not None:
            publisher.close()
        assert server.stop() in CLEAN_EXIT


def test_plugin_is_listed_and_bad_options_are_refused(tmp_path: Path) -> None:
    listed = subprocess.run([TWISTD, "--help"], capture_output=True, text=True, cwd=tmp_path)
    assert "eventbus" in listed.stdout
    bad = subprocess.run(
        [TWISTD, "-n", "--pidfile=", "eventbus", "--dialect", "klingon"],
        capture_output=True, text=True, cwd=tmp_path,
    )  # fmt: skip
    assert bad.returncode != 0
    assert "--dialect must be spec or original" in bad.stdout + bad.stderr
