"""``twistd -n zre`` alone and the ``zre`` service composed into ``twistd -n eventbus``, as
operators run them, against a ZRE node in the test process (loopback, private beacon port)."""

from __future__ import annotations

import json
import socket
import subprocess
from pathlib import Path
from typing import Any

import pytest_twisted

from bus.testing import wait_until
from bus.zre.node import ZreNode
from tests.processes import START_BOUND, reported
from tests.test_product_process import CLEAN_EXIT, CLI, TWISTD, Product, environment
from tests.zre_helpers import EventLog, fast_config, free_udp_port


def zre_environment() -> dict[str, str]:
    return {k: v for k, v in environment().items() if not k.startswith("ZRE_")}


@pytest_twisted.inlineCallbacks
def test_composed_zre_publishes_membership_on_the_bus(tmp_path: Path) -> Any:
    port = free_udp_port()
    product = Product(
        tmp_path,
        "--port", "0", "--services", "eventbus,zre",
        "--zre-port", str(port), "--zre-name", "composed", "--zre-group", "OPS",
        "--zre-beacon-interval", "100ms",
        env=zre_environment(),
    )  # fmt: skip
    node = ZreNode(fast_config(port, name="tester", groups=["OPS"]))
    events = EventLog()
    node.add_listener(events)
    node.startService()
    try:
        yield reported(product.ready, what="product started")
        yield wait_until(lambda: events.of("JOIN"), timeout=20, what="composed node's JOIN")
        [enter] = events.of("ENTER")
        assert enter.name == "composed"
        yield wait_until(
            lambda: product.status()["services"]["zre"]["peers"] == 1, what="peer at the product"
        )
        status = product.status()
        zre = status["services"]["zre"]
        assert zre["groups"] == ["OPS"] and zre["version"] == "36/ZRE"
        assert zre["beacon"] == f"127.255.255.255:{port}"
        server = status["services"]["eventbus"]["endpoints"]["snapshot"].removeprefix("tcp://")

        def stored() -> list[dict[str, Any]]:
            run = subprocess.run(
                [CLI, "snapshot", "/zre/", "--server", server],
                capture_output=True, text=True, timeout=START_BOUND + 60,  # its own 60 s
            )  # fmt: skip
            return [json.loads(line) for line in run.stdout.splitlines() if line.strip()]

        # Each look starts an eventbus-cli: bounded by what it reports, not by its start.
        yield reported(lambda: len(stored()) >= 2, what="activity stored")
        topics = {event["topic"]: event for event in stored()}
        enter_topic = f"/zre/peers/{node.uuid_hex}/enter/"
        assert enter_topic in topics, topics
        assert topics[enter_topic]["value"]["name"] == "tester"
        assert topics["/zre/groups/OPS/join/"]["value"]["peer"] == node.uuid_hex
        metrics = product.get("/metrics")
        assert "zre_peers 1.0" in metrics
    finally:
        code = product.stop()
        yield node.stopService()
    assert code in CLEAN_EXIT, product.output()


@pytest_twisted.inlineCallbacks
def test_twistd_zre_alone_leaves_with_its_beacon_on_sigterm(tmp_path: Path) -> Any:
    port = free_udp_port()
    log = open(tmp_path / "zre.log", "ab")
    process = subprocess.Popen(
        [TWISTD, "-n", "--pidfile=", "zre", "--port", str(port), "--name", "alone",
         "--beacon-interval", "100ms", "--expired", "60s", "--evasive", "30s"],
        stdout=log, stderr=subprocess.STDOUT, env=zre_environment(), cwd=tmp_path,
    )  # fmt: skip
    node = ZreNode(fast_config(port, expired=60.0, evasive=30.0))
    events = EventLog()
    node.add_listener(events)
    node.startService()
    try:
        yield reported(lambda: events.of("ENTER"), process, what="ENTER of twistd zre")
        assert events.of("ENTER")[0].name == "alone"
        process.terminate()
        yield wait_until(lambda: events.of("EXIT"), timeout=10, what="EXIT by leaving beacon")
        assert process.wait(30) in CLEAN_EXIT
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        log.close()
        yield node.stopService()


def test_a_udp_port_held_without_reuse_is_a_one_line_start_failure(tmp_path: Path) -> None:
    holder = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    holder.bind(("0.0.0.0", 0))
    port = holder.getsockname()[1]
    try:
        run = subprocess.run(
            [TWISTD, "-n", "--pidfile=", "zre", "--port", str(port)],
            capture_output=True, text=True, cwd=tmp_path, env=zre_environment(), timeout=60,
        )  # fmt: skip
    finally:
        holder.close()
    output = run.stdout + run.stderr
    assert run.returncode == 1, output
    [line] = [line for line in output.splitlines() if "cannot start" in line]
    assert f"cannot start zre: --port {port}: cannot listen on UDP {port}" in line
    assert "Traceback" not in output
