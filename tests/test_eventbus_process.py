"""The server as users run it: twistd plugin, tac file, SIGTERM and kill -9."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest_twisted

from bus.eventbus.client import EventBusPublisher, EventBusSubscriber
from bus.eventbus.store import EventStore
from bus.testing import wait_until

TWISTD = str(Path(sys.executable).with_name("twistd"))
ROOT = Path(__file__).resolve().parent.parent
# twistd re-raises the signal that stopped the reactor once shutdown is complete.
CLEAN_EXIT = (0, -signal.SIGTERM)


class ServerProcess:
    """twistd in a child process; its endpoints come from the status.json it writes."""

    def __init__(self, data_dir: Path, *args: str, tac: bool = False, port: int = 0) -> None:
        self.data_dir = data_dir
        self.status_path = data_dir / "status.json"
        self.status_path.unlink(missing_ok=True)  # a killed server's last word
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        if tac:
            env.update(
                EVENTBUS_PORT=str(port),
                EVENTBUS_DATA_DIR=str(data_dir),
                EVENTBUS_STATS_INTERVAL="0.1s",
                EVENTBUS_HEARTBEAT_INTERVAL="0.1s",
            )
            command = [TWISTD, "-n", "--pidfile=", "-y", str(ROOT / "examples" / "eventbus.tac")]
        else:
            command = [
                TWISTD, "-n", "--pidfile=", "eventbus", "--port", str(port),
                "--data-dir", str(data_dir), "--stats-interval", "0.1s",
                "--heartbeat-interval", "0.1s", *args,
            ]  # fmt: skip
        self.log = open(data_dir.parent / f"{data_dir.name}.log", "ab")
        self.process = subprocess.Popen(command, stdout=self.log, stderr=subprocess.STDOUT, env=env)

    def status(self) -> dict[str, Any]:
        try:
            return dict(json.loads(self.status_path.read_text()))
        except (FileNotFoundError, json.JSONDecodeError):
            return {}

    def ready(self) -> bool:
        if self.process.poll() is not None:
            raise AssertionError(f"server exited with {self.process.returncode}")
        return bool(self.status().get("endpoints"))

    @property
    def address(self) -> str:
        return self.status()["endpoints"]["snapshot"].removeprefix("tcp://")

    def stop(self, sig: int = signal.SIGTERM) -> int:
        if self.process.poll() is None:
            self.process.send_signal(sig)
        code = self.process.wait(timeout=30)
        self.log.close()
        return code


@pytest_twisted.inlineCallbacks
def test_events_a_subscriber_received_survive_kill_9(tmp_path: Path) -> Any:
    data = tmp_path / "data"
    data.mkdir()
    server = ServerProcess(data)
    received: list[Any] = []
    subscriber = publisher = None
    try:
        yield wait_until(server.ready, timeout=30, what="server start")
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
        yield wait_until(again.ready, timeout=30, what="restart")
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
        yield wait_until(server.ready, timeout=30, what="server start")
        publisher = EventBusPublisher(server.address, producer_id="term")
        for i in range(500):
            publisher.publish("/term/", i)
        yield wait_until(lambda: server.status().get("sequence") == 500, what="stored")
        assert "text" in server.status()["config"]["sequence_encoding"].lower()
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
        yield wait_until(server.ready, timeout=30, what="tac server start")
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
