"""``bus-cluster`` (``make cluster``): three nats-server processes and two front-ends come
up, an event published at one front-end is broadcast by the other, and Ctrl-C stops
every process it started, saying so in one line, with exit status 130."""

from __future__ import annotations

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
