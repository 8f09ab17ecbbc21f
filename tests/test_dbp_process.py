"""``twistd -n dbp`` as operators run it: alone inside a network namespace (beacon and UDP
heartbeats across a veth pair), and composed into ``twistd -n eventbus`` with its activity on
the bus."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import pytest_twisted

from bus.dbp.client import ServiceRegistration
from tests.netns import (
    LinePeer,
    NamespacePair,
    netns_pair,
    poll_until,
    readdress_without_broadcast,
)
from tests.processes import START_BOUND, reported
from tests.test_product_process import CLEAN_EXIT, CLI, TWISTD, Product, environment
from tests.zre_helpers import free_udp_port

__all__ = ["netns_pair"]

DBP_CLI = str(Path(sys.executable).with_name("dbp-cli"))
SERVICE = Path(__file__).parent / "dbp_peers" / "service_peer.py"
LISTENER = Path(__file__).parent / "dbp_peers" / "beacon_listener.py"
HERMES_SERVICE = Path(__file__).parent / "dbp_peers" / "hermes_service.py"


def namespace_environment() -> dict[str, str]:
    """Defaults as shipped: in a namespace of its own, the catalog has 5246 and 5245 to itself."""
    env = environment()
    env.pop("DBP_PORT", None)
    return env


@pytest.mark.netns
def test_catalog_in_a_namespace_beacon_udp_heartbeats_fallback_and_expiry(
    netns_pair: NamespacePair, tmp_path: Path
) -> None:
    pair = netns_pair
    log = open(tmp_path / "dbp.log", "ab")
    catalog = subprocess.Popen(
        ["ip", "netns", "exec", pair.a, TWISTD, "-n", "--pidfile=", "dbp",
         "--bind", pair.addr_a, "--beacon-interface", pair.iface_a,
         "--data-dir", str(tmp_path / "data"), "--heartbeat-interval", "200ms",
         "--beacon-interval", "200ms", "--grace", "60s"],
        stdout=log, stderr=subprocess.STDOUT, env=namespace_environment(),
    )  # fmt: skip
    service = LinePeer(
        [sys.executable, str(SERVICE), "sensor", pair.addr_b, "7100"], tmp_path / "svc.log", pair.b
    )
    try:
        # Both just started: the catalog's twistd and the service's Python.
        found = service.wait_for("FOUND", timeout=START_BOUND)
        assert found["endpoint"] == f"tcp://{pair.addr_a}:5246"  # the beacon crossed the veth
        registered = service.wait_for("REGISTERED", timeout=30)
        assert registered["config"]["udp_port"] == 5246

        def status() -> dict[str, Any]:
            count = len(service.events("STATUS"))
            service.send({"status": True})
            poll_until(lambda: len(service.events("STATUS")) > count, 10, "STATUS")
            return service.events("STATUS")[-1]

        poll_until(
            lambda: status()["catalog_udp_seen"] and status()["sent_udp"] >= 5, 20, "UDP beats"
        )
        assert status()["path"] == "udp" and status()["sent_zmq"] == 0

        def ask(*args: str) -> Any:
            run = subprocess.run(
                ["ip", "netns", "exec", pair.b, DBP_CLI, "services", *args],
                capture_output=True, text=True, timeout=60, env=environment(),
            )  # fmt: skip
            return json.loads(run.stdout) if run.stdout else run.stderr

        listed = ask()
        assert (
            listed["sensor"]["address"] == pair.addr_b
            and listed["sensor"]["heartbeat_path"] == "udp"
        )
        service.kill()  # no DISCONNECT: the catalog must notice the silence
        poll_until(lambda: ask("sensor").get("state") == "expired", 30, "expiry")
    finally:
        service.stop()
        catalog.send_signal(signal.SIGTERM)
        assert catalog.wait(30) in CLEAN_EXIT
        log.close()
    registry = json.loads((tmp_path / "data" / "dbp-registry.json").read_text())
    assert "sensor" in registry  # kept through its grace period, on disk


@pytest.mark.netns
def test_beacon_on_an_address_added_without_brd_and_a_hermes_service_from_the_peer(
    netns_pair: NamespacePair, tmp_path: Path
) -> None:
    """`ip addr add A/24 dev X` (no brd): psutil reports the broadcast as A itself; the
    beacon must still reach the subnet. A Hermes service in the other namespace advertises
    127.0.0.1: the catalog lists the address its connection came from."""
    pair = netns_pair
    readdress_without_broadcast(pair.a, pair.iface_a, pair.addr_a)
    listener = LinePeer([sys.executable, str(LISTENER), "5245"], tmp_path / "listen.log", pair.b)
    log = open(tmp_path / "dbp.log", "ab")
    catalog = subprocess.Popen(
        ["ip", "netns", "exec", pair.a, TWISTD, "-n", "--pidfile=", "dbp",
         "--bind", pair.addr_a, "--beacon-interface", pair.iface_a,
         "--data-dir", str(tmp_path / "data"), "--beacon-interval", "200ms"],
        stdout=log, stderr=subprocess.STDOUT, env=namespace_environment(),
    )  # fmt: skip
    endpoint = f"tcp://{pair.addr_a}:5246"
    hermes = None
    try:
        listener.wait_for("READY", timeout=START_BOUND)
        heard = listener.wait_for("HEARD", timeout=START_BOUND)  # the catalog's start
        assert (heard["data"], heard["from"]) == ("SHALOM 5246", pair.addr_a)
        hermes = LinePeer(
            [sys.executable, str(HERMES_SERVICE), endpoint, "Rohan"], tmp_path / "h.log", pair.b
        )
        reply = hermes.wait_for("REPLY", timeout=START_BOUND)  # its start
        assert (reply["command"], reply["time_size"]) == ("OwO", 4)
        run = subprocess.run(
            ["ip", "netns", "exec", pair.b, DBP_CLI, "services", "Rohan", "--catalog", endpoint],
            capture_output=True, text=True, timeout=60, env=environment(),
        )  # fmt: skip
        assert run.returncode == 0, run.stderr
        listed = json.loads(run.stdout)["Rohan"]
        assert (listed["address"], listed["port"]) == (pair.addr_b, 5246)
    finally:
        if hermes is not None:
            hermes.stop()
        listener.stop()
        catalog.send_signal(signal.SIGTERM)
        assert catalog.wait(30) in CLEAN_EXIT
        log.close()


@pytest_twisted.inlineCallbacks
def test_composed_catalog_publishes_the_catalog_history_on_the_bus(tmp_path: Path) -> Any:
    beacon = free_udp_port()
    product = Product(
        tmp_path, "--port", "0", "--services", "eventbus,dbp",
        "--dbp-beacon-port", str(beacon), "--dbp-heartbeat-interval", "100ms",
        env=environment(),
    )  # fmt: skip
    service = None
    try:
        yield reported(product.ready, what="product started")
        status = product.status()
        catalog = status["services"]["dbp"]
        assert catalog["beacon"] == f"127.255.255.255:{beacon}"
        service = ServiceRegistration(
            catalog["endpoint"],
            {
                "name": "billing",
                "address": "127.0.0.1",
                "port": free_udp_port(),
                "function": "f",
                "heartbeat": 0.1,
            },
        )
        service.startService()
        yield service.registered
        yield service.update({"function": "invoices"})
        yield service.stopService()
        service = None
        server = status["services"]["eventbus"]["endpoints"]["snapshot"].removeprefix("tcp://")

        def stored() -> list[dict[str, Any]]:
            run = subprocess.run(
                [CLI, "snapshot", "/dbp/", "--server", server],
                capture_output=True,
                text=True,
                timeout=START_BOUND + 60,  # its own 60 s
            )
            return [json.loads(line) for line in run.stdout.splitlines() if line.strip()]

        # Each look starts an eventbus-cli: bounded by what it reports, not by its start.
        yield reported(lambda: len(stored()) >= 3, what="activity stored")
        events = stored()
        assert [e["topic"] for e in events] == [
            "/dbp/services/billing/registered/",
            "/dbp/services/billing/updated/",
            "/dbp/services/billing/disconnected/",
        ]
        assert events[1]["value"]["function"] == "invoices"
        assert "dbp_services 0.0" in product.get("/metrics")
    finally:
        if service is not None:
            yield service.stopService()
        code = product.stop()
    assert code in CLEAN_EXIT, product.output()
