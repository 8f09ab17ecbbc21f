"""Floods of connections on every service's ZeroMQ port, through ``twistd -n eventbus``
started under a hard descriptor limit of 1024 (as a hostile tester ran ``twistd -n zre``
under ``ulimit -n 1024`` and pinned it there with 1,500 idle connections).

For each service: a thousand idle connections (a finished ZMTP handshake) and a thousand
handshaking ones (TCP only) from one address, held. The port keeps at most its
per-address bound of them and closes the rest as they are accepted (counted by reason),
the process's descriptors stay far from the limit, libzmq's I/O thread does not spin, a
real client from another address is served on that port, the HTTP port answers, and once
the flood leaves every descriptor is given back. Then the same over CURVE, every port at
once, with handshakes left hanging after a CURVE greeting.
"""

from __future__ import annotations

import json
import os
import resource
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.curve_helpers import Keys
from tests.flood import Flood, cpu_share, open_descriptors
from tests.ports import free_port
from tests.processes import CLEAN_EXIT, START_BOUND, TWISTD, own_bound, wait_for

LIMIT = 1024
BIN = Path(sys.executable).parent


class LimitedProduct:
    """``twistd -n eventbus`` with a hard descriptor limit of :data:`LIMIT`."""

    def __init__(self, tmp_path: Path, services: str, *args: str) -> None:
        self.http_port = free_port()
        self.log_path = tmp_path / "product.log"
        per_service = {
            "eventbus": ["--port", "0", "--data-dir", str(tmp_path / "bus")],
            "emqp": [
                "--emqp-worker-port", "0", "--emqp-client-port", "0", "--emqp-admin-port", "0",
                "--emqp-data-dir", str(tmp_path / "emqp"),
            ],
            "mc0": ["--mc0-port", "0", "--mc0-data-dir", str(tmp_path / "mc0")],
            "dbp": [
                "--dbp-port", "0", "--dbp-data-dir", str(tmp_path / "dbp"),
                "--dbp-beacon-port", "0",
            ],
            "zre": ["--zre-port", "0"],
        }  # fmt: skip
        chosen = [a for name in services.split(",") for a in per_service[name]]
        # No console history: its ring files open as series first appear (a descriptor
        # each), which would blur the count of what the flood took and gave back.
        command = [
            TWISTD, "-n", "--pidfile=", "eventbus", "--services", services,
            "--http-port", str(self.http_port), "--http-history-keep", "0", *chosen, *args,
        ]  # fmt: skip

        def limited() -> None:
            resource.setrlimit(resource.RLIMIT_NOFILE, (LIMIT, LIMIT))

        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(
                command, stdout=log, stderr=subprocess.STDOUT, preexec_fn=limited
            )

    def status(self) -> dict[str, Any]:
        url = f"http://127.0.0.1:{self.http_port}/status"
        with urllib.request.urlopen(url, timeout=10) as response:
            return dict(json.loads(response.read()))

    def up(self) -> bool:
        if self.process.poll() is not None:
            raise AssertionError(f"exited: {self.log_path.read_text()}")
        try:
            return bool(self.status()["services"])
        except OSError:
            return False

    def inbound(self) -> dict[str, Any]:
        # While a flood's connections wait for the guard to close them, the process can be
        # out of descriptors for a moment and the HTTP port reset one request: ask again.
        for attempt in range(20):
            try:
                return dict(self.status()["services"]["http"]["process"]["inbound_connections"])
            except OSError:
                if attempt == 19:
                    raise
                time.sleep(0.1)
        raise AssertionError("unreachable")

    def held(self, port: int) -> int:
        return sum(n for name, n in self.inbound()["ports"].items() if name.endswith(f":{port}"))

    def stop(self) -> int:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        return self.process.wait(timeout=30)


def port_of(endpoint: str) -> int:
    return int(endpoint.rpartition(":")[2])


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    """The tool ``args[0]`` run to its end, within its own --timeout (and its start)."""
    timeout = START_BOUND + own_bound(args[0], args[1:])
    return subprocess.run(
        [str(BIN / args[0]), *args[1:]], capture_output=True, text=True, timeout=timeout
    )


def zre_peer_met(mailbox: str, node_uuid: str) -> bool:
    """A zre-ping that greets the node's mailbox hears the node enter."""
    ping = subprocess.Popen(
        [str(BIN / "zre-ping"), "--port", "0", "--peer", mailbox, "--name", "probe"],
        stdout=subprocess.PIPE,
        text=True,
    )
    gives_up = threading.Timer(20, ping.kill)
    gives_up.start()
    try:
        assert ping.stdout is not None
        for line in ping.stdout:
            event = json.loads(line)
            if event.get("event") == "ENTER" and node_uuid.startswith(
                str(event.get("peer", ""))[:6]
            ):
                return True
        return False
    finally:
        gives_up.cancel()
        ping.kill()
        ping.wait()


# service -> (extra options, the flooded port from /status, the ZMTP socket type a peer
# of that port has, a real client's check)
Probe = Callable[[dict[str, Any]], bool]
SERVICES: dict[str, tuple[list[str], Callable[[dict[str, Any]], str], bytes, Probe]] = {
    "eventbus": (
        [],
        lambda s: s["eventbus"]["endpoints"]["snapshot"],
        b"DEALER",
        lambda s: (
            cli(
                "eventbus-cli",
                "publish",
                "--server",
                s["eventbus"]["endpoints"]["snapshot"].removeprefix("tcp://"),
                "/flood/",
                "{}",
            ).returncode
            == 0
        ),
    ),
    "emqp": (
        [],
        lambda s: s["emqp"]["endpoints"]["admin"],
        b"DEALER",
        lambda s: (
            cli("emqp-cli", "status", "--admin", s["emqp"]["endpoints"]["admin"]).returncode == 0
        ),
    ),
    "dbp": (
        [],
        lambda s: s["dbp"]["endpoint"],
        b"DEALER",
        lambda s: cli("dbp-cli", "services", "--catalog", s["dbp"]["endpoint"]).returncode == 0,
    ),
    "mc0": (
        ["--mc0-plain"],
        lambda s: s["mc0"]["endpoint"],
        b"DEALER",
        lambda s: (
            cli(
                "mc0-cli", "--server", s["mc0"]["endpoint"], "--plain", "ping", "--count", "3"
            ).returncode
            == 0
        ),
    ),
    "zre": (
        [],
        lambda s: s["zre"]["endpoint"],
        b"DEALER",
        lambda s: zre_peer_met(s["zre"]["endpoint"], s["zre"]["uuid"]),
    ),
}


@pytest.fixture
def flood_cleanup() -> Iterator[list[Any]]:
    held: list[Any] = []
    yield held
    for thing in held:
        if isinstance(thing, Flood):
            thing.close()
        else:
            assert thing.stop() in CLEAN_EXIT


def hold_and_check(product: LimitedProduct, port: int, floods: list[Flood], probe: Probe) -> None:
    """While ``floods`` are held on ``port``: the bounds, the descriptors, the CPU, a real
    client, the HTTP port; once they leave: everything given back."""
    bounds = product.inbound()
    wait_for(
        lambda: (
            product.inbound()["refused"]["address"] > 0
            and product.held(port) <= bounds["per_address"]
        ),
        timeout=30,
        what="the excess closed",
    )
    pid = product.process.pid
    # Far from the limit: what the bound lets in, and the process's own.
    assert open_descriptors(pid) < LIMIT // 2
    # libzmq's I/O thread is not spinning on accepts it cannot make.
    assert cpu_share(pid, 2.0) < 0.5
    services = product.status()["services"]
    assert probe(services), "a real client was not served during the flood"
    assert product.held(port) <= bounds["per_address"] + 2  # the flood's, and the client's
    for flood in floods:
        flood.close()
    wait_for(
        lambda: product.held(port) == 0,
        timeout=30,
        what=f"every connection given back ({product.inbound()})",
    )


@pytest.mark.parametrize("service", sorted(SERVICES))
def test_a_flood_on_a_port_leaves_the_service_serving(
    tmp_path: Path, flood_cleanup: list[Any], service: str
) -> None:
    options, flooded, socket_type, probe = SERVICES[service]
    product = LimitedProduct(tmp_path, service, *options)
    flood_cleanup.append(product)
    wait_for(product.up, timeout=60, what="the product")
    services = product.status()["services"]
    if service == "zre":
        wait_for(lambda: product.status()["services"]["zre"].get("uuid"), what="zre's uuid")
    before = open_descriptors(product.process.pid)
    port = port_of(flooded(services))
    floods = [Flood(port, 1000, "idle", socket_type=socket_type), Flood(port, 1000, "silent")]
    flood_cleanup.extend(floods)
    hold_and_check(product, port, floods, probe)
    wait_for(
        lambda: open_descriptors(product.process.pid) <= before + 4,
        timeout=30,
        what="the descriptors back",
    )
    assert "beyond the per-address" in product.log_path.read_text()


def test_hanging_curve_handshakes_on_every_port(tmp_path: Path, flood_cleanup: list[Any]) -> None:
    keys = Keys(tmp_path)
    cert, certs = str(keys.server_cert), str(keys.allowed)
    secret = keys.secret_file("publisher")
    product = LimitedProduct(
        tmp_path,
        "eventbus,emqp,mc0,dbp",
        "--server-cert", cert, "--client-certs", certs,
        "--emqp-server-cert", cert, "--emqp-client-certs", certs,
        "--mc0-server-cert", cert, "--mc0-client-certs", certs,
        "--dbp-server-cert", cert, "--dbp-client-certs", certs,
    )  # fmt: skip
    flood_cleanup.append(product)
    wait_for(product.up, timeout=60, what="the product")
    services = product.status()["services"]
    ports = [
        port_of(services["eventbus"]["endpoints"]["snapshot"]),
        port_of(services["emqp"]["endpoints"]["client"]),
        port_of(services["mc0"]["endpoint"]),
        port_of(services["dbp"]["endpoint"]),
    ]
    floods = [Flood(port, 500, "curve-greeting") for port in ports]
    flood_cleanup.extend(floods)
    bounds = product.inbound()
    wait_for(
        lambda: (
            all(product.held(port) <= bounds["per_address"] for port in ports)
            and product.inbound()["refused"]["address"] > 0
        ),
        timeout=30,
        what="the excess closed on every port",
    )
    # Far from the limit once the excess on all four ports is closed (the floods' refused
    # connections come and go: a count read while four are being refused at once was 512).
    wait_for(
        lambda: open_descriptors(product.process.pid) < LIMIT // 2,
        timeout=30,
        what=f"the descriptors under {LIMIT // 2}",
    )
    assert cpu_share(product.process.pid, 2.0) < 0.5
    published = cli(
        "eventbus-cli", "publish", "--server",
        services["eventbus"]["endpoints"]["snapshot"].removeprefix("tcp://"),
        "--server-key", str(keys.server_key), "--cert", str(secret), "/flood/", "{}",
    )  # fmt: skip
    assert published.returncode == 0, published.stderr
    for flood in floods:
        flood.close()
    wait_for(
        lambda: all(product.held(port) == 0 for port in ports),
        timeout=30,
        what="every connection given back",
    )


def test_the_descriptor_limit_is_raised_to_the_hard_one_at_start(tmp_path: Path) -> None:
    """Started with a soft limit under its hard one, the process raises it and says so."""
    http = free_port()

    def low_soft() -> None:
        _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        resource.setrlimit(resource.RLIMIT_NOFILE, (256, hard))

    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard <= 256:
        pytest.skip("the hard descriptor limit is 256 or less here")
    log_path = tmp_path / "log"
    command = [
        TWISTD, "-n", "--pidfile=", "eventbus", "--services", "eventbus", "--port", "0",
        "--data-dir", str(tmp_path / "bus"), "--http-port", str(http),
        "--max-connections", "300", "--max-connections-per-address", "40",
    ]  # fmt: skip
    with open(log_path, "ab") as log:
        process = subprocess.Popen(
            command, stdout=log, stderr=subprocess.STDOUT, preexec_fn=low_soft, env=dict(os.environ)
        )
    try:
        wait_for(lambda: "started eventbus" in log_path.read_text(), timeout=60, what="start")
        line = next(x for x in log_path.read_text().splitlines() if "started eventbus" in x)
        assert f"soft limit {hard} (raised from 256), hard {hard}" in line
        assert "at most 300 a port, 40 an address" in line
        with urllib.request.urlopen(f"http://127.0.0.1:{http}/status", timeout=10) as answer:
            process_status = json.loads(answer.read())["services"]["http"]["process"]
        assert process_status["descriptors"]["soft_limit"] == hard
        assert process_status["inbound_connections"]["per_port"] == 300
    finally:
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=30) in CLEAN_EXIT
