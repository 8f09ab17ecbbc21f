"""eventbus-cli against a real server: publish (confirmed), snapshot, tail, status."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import pytest_twisted

from bus.testing import wait_until

CLI = str(Path(sys.executable).with_name("eventbus-cli"))


class Command:
    """The CLI in a child process, its output in files so the test can read it while
    the command runs (a pipe could fill up and block it)."""

    def __init__(self, *args: str) -> None:
        self.stdout = tempfile.TemporaryFile("w+")
        self.stderr = tempfile.TemporaryFile("w+")
        self.process = subprocess.Popen([CLI, *args], stdout=self.stdout, stderr=self.stderr)

    def _read(self, stream: Any) -> str:
        stream.seek(0)
        return str(stream.read())

    @property
    def out(self) -> str:
        return self._read(self.stdout)

    @property
    def err(self) -> str:
        return self._read(self.stderr)

    def finished(self) -> bool:
        return self.process.poll() is not None

    def lines(self) -> list[dict[str, Any]]:
        return [json.loads(line) for line in self.out.splitlines()]


@pytest_twisted.inlineCallbacks
def test_publish_snapshot_tail_and_status(bus_server: Any, tmp_path: Path) -> Any:
    server = f"127.0.0.1:{bus_server.port}"
    first = Command("publish", "--server", server, "/orders/1/", '{"total": 12.5}')
    yield wait_until(first.finished, timeout=30)
    assert first.process.returncode == 0, first.err
    assert first.lines()[0]["seq"] == 1
    second = Command("publish", "--server", server, "--producer", "me", "/users/1/", "bob")
    yield wait_until(second.finished, timeout=30)
    assert second.lines()[0]["seq"] == 2

    dump = Command("snapshot", "--server", server, "/orders/")
    yield wait_until(dump.finished, timeout=30)
    assert dump.process.returncode == 0, dump.err
    [event] = dump.lines()
    assert event["topic"] == "/orders/1/"
    assert event["value"] == {"total": 12.5}
    assert event["uuid"] == first.lines()[0]["uuid"]
    assert "complete at sequence 1" in dump.err

    tail = Command("tail", "--server", server, "--since", "1")
    try:
        yield wait_until(lambda: tail.out.count("\n") >= 1, timeout=30)
    finally:
        tail.process.send_signal(signal.SIGINT)
        yield wait_until(tail.finished, timeout=30)
    [user] = tail.lines()
    assert (user["seq"], user["producer"], user["value"]) == (2, "me", "bob")


@pytest_twisted.inlineCallbacks
def test_publish_to_a_dead_server_fails_clearly(tmp_path: Path) -> Any:
    dead = Command("publish", "--server", "127.0.0.1:9", "/x/", "1", "--timeout", "0.5")
    yield wait_until(dead.finished, timeout=30)
    assert dead.process.returncode == 1
    assert "timed out" in dead.err and "Traceback" not in dead.err
    missing = Command("status", "--data-dir", str(tmp_path))
    yield wait_until(missing.finished, timeout=30)
    assert missing.process.returncode == 1
    assert "no " in missing.err
