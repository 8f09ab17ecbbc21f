"""A third-party service in the product: examples/echo-service, installed as its own
distribution (``make test`` installs it), found through the ``bus.services`` entry points.
Through real sockets: its prefixed options from the command line and its environment, start
order after the Event BUS and reverse stop, /status, /metrics, its activity on the bus, and
``twistd -n echo`` alone. A broken declaration is one line naming its distribution."""

from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path
from typing import Any

import msgpack
import pytest_twisted
from twisted.internet import defer, reactor, task

from bus.testing import RawPeer, wait_until
from bus.transport import frames
from tests.ports import free_port

from .processes import CLEAN_EXIT, ROOT, TWISTD, TwistdProcess, reported
from .test_product_process import Product, environment


def echo_environment(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in environment(**extra).items() if not k.startswith("ECHO_")}
    env.update({k: v for k, v in extra.items() if k.startswith("ECHO_")})
    return env


@defer.inlineCallbacks
def echoes_then_stops(process: TwistdProcess, ready_line: str, port: int, payload: bytes) -> Any:
    """Once ``process`` logged ``ready_line``, its echo service on ``port`` answers; then it
    stops cleanly on SIGTERM."""
    client = None
    try:
        yield wait_until(lambda: ready_line in process.output(), timeout=30, what=ready_line)
        client = RawPeer.dealer(f"tcp://127.0.0.1:{port}")
        client.send([b"ECHO", payload])
        yield wait_until(lambda: client.messages, what="the answer")
        assert client.messages == [[b"ECHO-OK", payload]]
    finally:
        if client is not None:
            client.close()
        code = process.stop(signal.SIGTERM)
    assert code in CLEAN_EXIT, process.output()


@pytest_twisted.inlineCallbacks
def test_a_declared_service_runs_in_the_product_like_a_built_in_one(tmp_path: Path) -> Any:
    product = Product(
        tmp_path,
        "--services", "echo,eventbus", "--port", "0", "--data-dir", str(tmp_path / "data"),
        "--echo-port", "0",
        env=echo_environment(ECHO_MAX_BYTES="8"),  # its own variable, as for built-in ones
    )  # fmt: skip
    peers: list[RawPeer] = []
    try:
        yield reported(product.ready, what="the product")
        services = product.status()["services"]
        assert list(services) == ["eventbus", "echo", "http"]  # after what it needs (its AFTER)
        feed = RawPeer.sub(services["eventbus"]["endpoints"]["publisher"], (b"/echo/",))
        client = RawPeer.dealer(services["echo"]["endpoint"])
        peers += [feed, client]
        # Echo until the bus's feed shows one: then the SUB has joined (no slow-joiner loss).
        warmups = 0
        while not feed.messages:
            client.send([b"ECHO", b"warm"])
            warmups += 1
            yield task.deferLater(reactor, 0.1, lambda: None)
        yield wait_until(lambda: len(client.messages) == warmups, what="the warm-up answers")
        del client.messages[:], feed.messages[:]
        client.send([b"ECHO", b"hello"])
        client.send([b"ECHO", b"123456789"])  # over ECHO_MAX_BYTES
        client.send([b"NOPE"])
        yield wait_until(lambda: len(client.messages) == 3, what="three answers")
        assert client.messages == [
            [b"ECHO-OK", b"hello"],
            [b"ERROR", b"oversized"],
            [b"ERROR", b"unknown-command"],
        ]
        status = product.status()["services"]["echo"]
        refused = {"oversized": 1, "unknown-command": 1}
        assert (status["echoed"], status["refused"]) == (warmups + 1, refused)
        metrics = product.get("/metrics")
        assert f"echo_requests_total {warmups + 1}.0" in metrics
        assert 'echo_refused_total{reason="oversized"} 1.0' in metrics
        # The console charts what it names in console_rates, beside the drops it counts.
        console = {s["name"]: s for s in json.loads(product.get("/api/v1/state"))["services"]}
        assert console["echo"]["running"]
        assert console["echo"]["counters"] == {"echoes": warmups + 1}
        # Its activity on the bus, as the built-in services publish theirs.
        yield wait_until(lambda: feed.messages, what="the echo's event on the bus")
        topic, _, producer, _, _, data = feed.messages[0]
        assert (topic, producer) == (b"/echo/requests/", b"echo")
        assert msgpack.unpackb(data) == {"bytes": 5}
    finally:
        for peer in peers:
            peer.close()
        code = product.stop()
    assert code in CLEAN_EXIT, product.output()
    log = product.output()
    assert "started eventbus, echo" in log
    # Which way ZeroMQ messages go, as the transport decided (bus.transport.frames).
    how = "by the compiled helper" if frames.native is not None else "through pyzmq"
    assert f"(ZeroMQ messages read and sent {how})" in log
    assert log.index("stopped echo") < log.index("stopped eventbus")
    assert "Traceback" not in log


@pytest_twisted.inlineCallbacks
def test_a_declared_service_runs_alone_as_its_own_twistd_plugin(tmp_path: Path) -> Any:
    port = free_port()
    alone = TwistdProcess(
        [TWISTD, "-n", "--pidfile=", "echo", "--port", str(port)],
        tmp_path / "echo.log",
        echo_environment(),
        tmp_path,
    )
    yield echoes_then_stops(alone, "echo service on", port, b"alone")


def test_a_broken_declaration_is_one_line_and_the_rest_is_offered(tmp_path: Path) -> None:
    # A distribution declaring a service whose module is missing, and one named like a
    # built-in: found through PYTHONPATH as any installed distribution would be.
    info = tmp_path / "broken_dist-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: broken-dist\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(
        "[bus.services]\nbroken = no_such_module_anywhere\neventbus = bus.eventbus.tap\n"
    )
    env = echo_environment(PYTHONPATH=str(tmp_path))
    shown = subprocess.run(
        [TWISTD, "-n", "eventbus", "--help"], env=env, capture_output=True, text=True, timeout=60
    )
    assert shown.returncode == 0, shown.stderr
    problems = [line for line in shown.stderr.splitlines() if "broken-dist" in line]
    assert len(problems) == 2, shown.stderr
    assert "service 'broken' of broken-dist left out: ModuleNotFoundError" in problems[1]
    assert "service 'eventbus' of broken-dist: the name is taken" in problems[0]
    assert "Traceback" not in shown.stderr + shown.stdout
    for name in ("--port", "--emqp-", "--zre-", "--echo-port"):
        assert name in shown.stdout  # the built-in services and the working one are offered
    asked = subprocess.run(
        [TWISTD, "-n", "eventbus", "--services", "eventbus,broken"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
    )
    assert asked.returncode != 0
    assert "--services: service 'broken' of broken-dist left out" in asked.stdout + asked.stderr
    assert "Traceback" not in asked.stdout + asked.stderr
    assert os.listdir(tmp_path) == [info.name]  # nothing started, nothing written


@pytest_twisted.inlineCallbacks
def test_a_declared_service_runs_from_the_tac_file(tmp_path: Path) -> Any:
    port = free_port()
    env = echo_environment(
        EVENTBUS_SERVICES="eventbus,echo",
        EVENTBUS_PORT="0",
        EVENTBUS_HTTP_PORT="0",
        EVENTBUS_DATA_DIR=str(tmp_path / "data"),
        ECHO_PORT=str(port),
    )
    tac = TwistdProcess(
        [TWISTD, "-n", "--pidfile=", "-y", str(ROOT / "examples" / "eventbus.tac")],
        tmp_path / "tac.log",
        env,
        tmp_path,
    )
    yield echoes_then_stops(tac, "started eventbus, echo", port, b"tac")


def test_a_declared_services_table_of_the_config_file_is_read(tmp_path: Path) -> None:
    from bus.tap import Options

    config = tmp_path / "bus.toml"
    config.write_text("[echo]\nmax-bytes = 3\nport = 5999\n")
    options = Options()
    options.parseOptions(
        ["--services", "eventbus,echo", "--config", str(config), "--echo-port", "0"]
    )
    echo = options["service-options"]["echo"]
    assert (echo["max-bytes"], echo["port"]) == (3, 0)  # the table, then the command line


@pytest_twisted.inlineCallbacks
def test_a_declared_service_that_cannot_start_is_one_line_naming_its_option(
    tmp_path: Path,
) -> Any:
    import socket

    from bus.application.composition import StartFailed
    from bus.tap import Options, compose

    holder = socket.socket()
    holder.bind(("127.0.0.1", 0))
    holder.listen()
    busy = holder.getsockname()[1]
    options = Options()
    options.parseOptions(
        ["--services", "eventbus,echo", "--port", "0", "--http-port", "0",
         "--data-dir", str(tmp_path / "data"), "--echo-port", str(busy)]
    )  # fmt: skip
    product = compose(options)
    product.startService()
    try:
        failure = None
        try:
            yield product.when_started()
        except StartFailed as error:
            failure = error
        assert failure is not None
        assert str(failure).startswith(f"cannot start echo: --echo-port {busy}: cannot bind")
    finally:
        yield product.stopService()
        holder.close()
