"""eventbus-cli against a real server: publish (confirmed), snapshot, tail, status."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path
from typing import Any

import pytest_twisted

from bus.testing import start_bus, wait_until
from tests.ports import free_port
from tests.processes import CommandProcess, reported


class Command(CommandProcess):
    """eventbus-cli in a child process."""

    program = "eventbus-cli"


@pytest_twisted.inlineCallbacks
def test_publish_snapshot_tail_and_status(bus_server: Any, tmp_path: Path) -> Any:
    server = f"127.0.0.1:{bus_server.port}"
    first = Command("publish", "--server", server, "/orders/1/", '{"total": 12.5}')
    yield first.ended()
    assert first.process.returncode == 0, first.err
    assert first.lines()[0]["seq"] == 1
    second = Command("publish", "--server", server, "--producer", "me", "/users/1/", "bob")
    yield second.ended()
    assert second.lines()[0]["seq"] == 2

    dump = Command("snapshot", "--server", server, "/orders/")
    yield dump.ended()
    assert dump.process.returncode == 0, dump.err
    [event] = dump.lines()
    assert event["topic"] == "/orders/1/"
    assert event["value"] == {"total": 12.5}
    assert event["uuid"] == first.lines()[0]["uuid"]
    assert "complete at sequence 1" in dump.err

    tail = Command("tail", "--server", server, "--since", "1")
    try:
        yield reported(lambda: tail.out.count("\n") >= 1, tail.process, what="tail's event")
    finally:
        tail.process.send_signal(signal.SIGINT)
        yield wait_until(tail.finished, timeout=30)
    [user] = tail.lines()
    assert (user["seq"], user["producer"], user["value"]) == (2, "me", "bob")


@pytest_twisted.inlineCallbacks
def test_publish_to_a_dead_server_fails_clearly(tmp_path: Path) -> Any:
    dead = Command("publish", "--server", "127.0.0.1:9", "/x/", "1", "--timeout", "0.5")
    yield dead.ended()
    assert dead.process.returncode == 1
    assert "timed out" in dead.err and "Traceback" not in dead.err
    missing = Command("status", "--data-dir", str(tmp_path))
    yield missing.ended()
    assert missing.process.returncode == 1
    assert "no " in missing.err


def _status_file(data_dir: Path) -> dict[str, Any]:
    try:
        value: dict[str, Any] = json.loads((data_dir / "status.json").read_text())
    except (FileNotFoundError, ValueError):
        return {}
    return value


@pytest_twisted.inlineCallbacks
def test_status_shows_the_server_that_keeps_the_named_data_directory(tmp_path: Path) -> Any:
    from bus.tap import Options, compose

    # "x": the product, serving /status on a port of its own; "y": a bus serving none.
    x_dir, y_dir = tmp_path / "x", tmp_path / "y"
    options = Options()
    options.parseOptions(
        ["--services", "eventbus", "--port", "0", "--http-port", str(free_port()),
         "--data-dir", str(x_dir), "--stats-interval", "0.1s"]
    )  # fmt: skip
    product = compose(options)
    product.startService()
    y = start_bus(y_dir, stats_interval=0.1)
    try:
        yield product.when_started()
        yield wait_until(lambda: _status_file(x_dir).get("http") and _status_file(y_dir))
        x_http = _status_file(x_dir)["http"]
        x_store = _status_file(x_dir)["store_id"]

        # Named: y's own file, even with --http pointing at another live server.
        shown = Command("status", "--data-dir", str(y_dir), "--http", x_http)
        yield shown.ended()
        assert shown.process.returncode == 0, shown.err
        assert json.loads(shown.out)["store_id"] == y.store.store_id != x_store
        assert "serves no /status" in shown.err

        # Named, and its process serves /status: the live answer, from this process.
        # (This process's reactor answers: a loaded machine may hold it up past 3 s.)
        live = Command("status", "--data-dir", str(x_dir), "--timeout", "30")
        yield live.ended()
        assert live.process.returncode == 0, live.err
        answer = json.loads(live.out)
        assert answer["pid"] == os.getpid()
        assert answer["services"]["eventbus"]["store_id"] == x_store
    finally:
        yield y.stopService()
        yield product.stopService()

    # Stopped: what its file last said, and why.
    stale = Command("status", "--data-dir", str(x_dir))
    yield stale.ended()
    assert stale.process.returncode == 0, stale.err
    assert json.loads(stale.out)["store_id"] == x_store
    [line] = stale.err.strip().splitlines()
    assert f"no answer about {x_dir} from http://{x_http}/status" in line and "ago" in line
