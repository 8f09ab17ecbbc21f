"""``bus-cluster`` (``make cluster``): three nats-server processes and two front-ends come
up, an event published at one front-end is broadcast by the other, and Ctrl-C stops
every process it started, saying so in one line, with exit status 130."""

from __future__ import annotations

import contextlib
import json
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
import zmq

from bus.eventbus.codec import HEARTBEAT_TOPIC
from tests.eventbus_helpers import pub
from tests.ports import free_ports

pytest.importorskip("nats")

HERMES_SERVICE = Path(__file__).parent / "dbp_peers" / "hermes_service.py"


def test_a_cluster_on_this_machine_serves_and_stops_on_ctrl_c(tmp_path: Path) -> None:
    # Two front-ends on PORT..PORT+5, /status on HTTP and HTTP+1, three NATS nodes.
    base, http, nats, routes = free_ports(6), free_ports(2), free_ports(3), free_ports(3)
    command = [
        str(Path(sys.executable).parent / "bus-cluster"),
        "--dir", str(tmp_path / "c"), "--port", str(base), "--http-port", str(http),
        "--nats-port", str(nats), "--nats-route-port", str(routes),
    ]  # fmt: skip
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    context = zmq.Context()
    try:
        assert process.stdout is not None
        lines = []
        while not lines or lines[-1] != b"ready; Ctrl-C stops everything\n":
            line = process.stdout.readline()
            assert line, b"".join(lines).decode()
            lines.append(line)
        # "ready" is said once both front-ends serve: their /status says so at once.
        for port in (http, http + 1):
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/status", timeout=10) as answer:
                status = json.load(answer)
            assert status["services"]["eventbus"]["jetstream"]["connected"], status
        sub = context.socket(zmq.SUB)
        sub.setsockopt(zmq.SUBSCRIBE, b"")
        sub.connect(f"tcp://127.0.0.1:{base + 3 + 1}")
        dealer = context.socket(zmq.DEALER)
        dealer.connect(f"tcp://127.0.0.1:{base + 2}")
        deadline = time.monotonic() + 60
        got: list[list[bytes]] = []
        while not any(m[0] == b"/demo/" for m in got):
            assert time.monotonic() < deadline, got[-3:]
            if sub.poll(200):
                got.append(sub.recv_multipart())
                if got[-1][0] == HEARTBEAT_TOPIC and not any(m[0] == b"/x" for m in got):
                    dealer.send_multipart(pub("/demo/"))
                    got.append([b"/x"])
        sub.close(0)
        dealer.close(0)
    finally:
        process.send_signal(signal.SIGINT)
        out = process.communicate(timeout=60)[0]
        context.term()
    last = out.decode().splitlines()[-1]
    assert process.returncode == 130, out.decode()
    assert last.startswith("bus-cluster: interrupted after "), out.decode()
    assert last.endswith(
        f"serving; stopped 2 front-end(s) and the 3 NATS servers; the data stays in {tmp_path / 'c'}"
    )
    leftover = subprocess.run(
        ["pgrep", "-f", str(tmp_path / "c")], capture_output=True, text=True
    ).stdout
    assert leftover == "", "every process it started stopped"


def read_until_ready(process: subprocess.Popen[bytes]) -> list[str]:
    """``bus-cluster``'s lines up to its ``ready`` (its output so far if it ends first)."""
    assert process.stdout is not None
    lines: list[str] = []
    while not lines or lines[-1] != "ready; Ctrl-C stops everything":
        line = process.stdout.readline()
        assert line, "\n".join(lines)
        lines.append(line.decode().rstrip("\n"))
    return lines


def test_every_protocol_runs_on_the_one_cluster_with_with(tmp_path: Path) -> None:
    """``bus-cluster --with mc0,dbp,emqp,emqp-pubsub``: each front-end's process composes
    the four beside the Event BUS on the same three nats-servers, says where each serves, and
    is ready once every one is on the cluster; then what one front-end's service takes, the
    other's gives: an mc0 PUT at broker 1 reaches a subscriber at broker 2, an eMQP PUBLISH
    at service 1 a SUB at service 2, a DBP registration at instance 1 is listed by instance
    2."""
    base, http, nats, routes = free_ports(6), free_ports(2), free_ports(3), free_ports(3)
    command = [
        str(Path(sys.executable).parent / "bus-cluster"),
        "--dir", str(tmp_path / "c"), "--port", str(base), "--http-port", str(http),
        "--nats-port", str(nats), "--nats-route-port", str(routes),
        "--with", "mc0,dbp,emqp,emqp-pubsub", "--with-port", "0",
    ]  # fmt: skip
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    context = zmq.Context()
    bin_ = Path(sys.executable).parent
    try:
        lines = read_until_ready(process)
        statuses = []
        for port in (http, http + 1):
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/status", timeout=10) as answer:
                statuses.append(json.load(answer)["services"])
        for services in statuses:
            assert services["eventbus"]["jetstream"]["connected"]
            assert services["emqp"]["jetstream"]["connected"]
            assert services["emqp"]["jetstream"]["replicas"] == 3
            assert services["mc0"]["cluster"]["connected"]
            assert services["emqp-pubsub"]["cluster"]["connected"]
            assert services["dbp"]["shared"]["current"]
        one, two = statuses
        for index, services in ((1, one), (2, two)):
            assert f"front-end {index}'s mc0: broker {services['mc0']['endpoint']}" in "\n".join(
                lines
            )
        # mc0: a subscriber at broker 2, PUTs at broker 1 until one comes through.
        subscriber = subprocess.Popen(
            [bin_ / "mc0-cli", "--server", two["mc0"]["endpoint"].removeprefix("tcp://"),
             "--server-key", two["mc0"]["server_public_key"], "sub", "demo", "--count", "1"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        )  # fmt: skip
        deadline = time.monotonic() + 60
        while subscriber.poll() is None:
            assert time.monotonic() < deadline, "mc0: nothing reached broker 2's subscriber"
            subprocess.run(
                [bin_ / "mc0-cli", "--server", one["mc0"]["endpoint"].removeprefix("tcp://"),
                 "--server-key", one["mc0"]["server_public_key"], "put", "demo", "crossed"],
                check=True, capture_output=True, timeout=60,
            )  # fmt: skip
            with contextlib.suppress(subprocess.TimeoutExpired):
                subscriber.wait(1)
        out, err = subscriber.communicate(timeout=30)
        assert subscriber.returncode == 0 and b"crossed" in out, (out, err)
        # eMQP pub/sub: PUBLISH at service 1, a SUB at service 2.
        sub = context.socket(zmq.SUB)
        sub.setsockopt(zmq.SUBSCRIBE, b"demo")
        sub.connect(two["emqp-pubsub"]["endpoints"]["outgoing"])
        dealer = context.socket(zmq.DEALER)
        dealer.connect(one["emqp-pubsub"]["endpoints"]["incoming"])
        deadline = time.monotonic() + 60
        while not sub.poll(200):
            assert time.monotonic() < deadline, "eMQP: nothing reached service 2's subscriber"
            dealer.send_multipart([b"", b"eMQP/1.0", b"PUBLISH", b"m", b"demo", b"crossed"])
        assert sub.recv_multipart() == [b"demo", b"crossed"]
        sub.close(0)
        dealer.close(0)
        # DBP: registered at instance 1 (as Hermes' Service does), listed by instance 2.
        registered = subprocess.run(
            [sys.executable, str(HERMES_SERVICE), one["dbp"]["endpoint"], "demo-service"],
            input="", capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert '"OwO"' in registered.stdout, (registered.stdout, registered.stderr)
        listed = subprocess.run(
            [bin_ / "dbp-cli", "services", "--catalog", two["dbp"]["endpoint"]],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert "demo-service" in listed.stdout, (listed.stdout, listed.stderr)
    finally:
        process.send_signal(signal.SIGINT)
        out = process.communicate(timeout=90)[0]
        context.term()
    assert process.returncode == 130, out.decode()
    leftover = subprocess.run(
        ["pgrep", "-f", str(tmp_path / "c")], capture_output=True, text=True
    ).stdout
    assert leftover == "", "every process it started stopped"
