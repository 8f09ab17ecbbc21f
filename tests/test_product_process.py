"""`twistd -n eventbus` as operators run it: composition, config file and precedence, /status
and /metrics, one-line start failures, and SIGTERM stopping the services in reverse order."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import pytest_twisted

from bus.application.services import SERVICE_NAMES
from bus.eventbus.client import EventBusPublisher
from bus.testing import wait_until
from tests.ports import free_port

from .processes import CLEAN_EXIT, TWISTD, TwistdProcess, reported

CLI = str(Path(sys.executable).with_name("eventbus-cli"))


def environment(**extra: str) -> dict[str, str]:
    prefixes = ("EVENTBUS_", "SPARK_BRIDGE_", "MC0_", "DBP_", "ZRE_")
    env = {k: v for k, v in os.environ.items() if not k.startswith(prefixes)}
    # The composed mc0 broker and DBP catalog on free ports (their data in the working directory).
    env.update(PYTHONUNBUFFERED="1", MC0_PORT="0", DBP_PORT="0", **extra)
    return env


class Product(TwistdProcess):
    """``twistd -n eventbus ARGS`` in a child process, watched through its /status."""

    def __init__(self, workdir: Path, *args: str, env: dict[str, str] | None = None) -> None:
        self.http_port = free_port()
        command = [TWISTD, "-n", "--pidfile=", "eventbus", "--http-port", str(self.http_port)]
        super().__init__([*command, *args], workdir / "twistd.log", env or environment(), workdir)

    def get(self, path: str) -> str:
        url = f"http://127.0.0.1:{self.http_port}{path}"
        with urllib.request.urlopen(url, timeout=5) as response:
            return str(response.read().decode())

    def status(self) -> dict[str, Any]:
        return dict(json.loads(self.get("/status")))

    def ready(self) -> bool:
        if self.process.poll() is not None:
            raise AssertionError(f"exited with {self.process.returncode}: {self.output()}")
        try:
            return all(s["running"] for s in self.status()["services"].values())
        except OSError:
            return False


def metric_samples(text: str) -> dict[str, float]:
    from prometheus_client.parser import text_string_to_metric_families

    return {
        sample.name
        + "".join(f"{{{k}={v}}}" for k, v in sorted(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


@pytest_twisted.inlineCallbacks
def test_composed_product_with_config_file_environment_and_command_line(tmp_path: Path) -> Any:
    config = tmp_path / "bus.toml"
    config.write_text(
        """
        [eventbus]
        services = ["eventbus", "spark-bridge"]
        data-dir = "bus-data"
        publish-hwm = 4321
        stats-interval = "5s"
        heartbeat-interval = "2s"

        [spark-bridge]
        journal-dir = "file-journal"
        roll-seconds = "50ms"
        """
    )
    env = environment(EVENTBUS_HEARTBEAT_INTERVAL="200ms", SPARK_BRIDGE_JOURNAL_DIR="env-journal")
    product = Product(
        tmp_path,
        "--config", str(config), "--port", "0", "--stats-interval", "0.2s",
        "--spark-bridge-journal-dir", "cli-journal",
        env=env,
    )  # fmt: skip
    publisher = None
    try:
        yield reported(product.ready, what="product started")
        status = product.status()
        assert set(status["services"]) == {"eventbus", "spark-bridge", "http"}
        bus = status["services"]["eventbus"]
        assert bus["config"]["publish_hwm"] == 4321  # from the file
        assert bus["config"]["heartbeat_interval"] == 0.2  # environment over file
        assert bus["config"]["stats_interval"] == 0.2  # command line over file
        assert bus["config"]["data_dir"] == "bus-data"
        address = bus["endpoints"]["snapshot"].removeprefix("tcp://")
        publisher = EventBusPublisher(address, producer_id="composed")
        for n in range(300):
            publisher.publish("/composed/", n)
        yield wait_until(
            lambda: product.status()["services"]["spark-bridge"]["journaled"] == 300,
            timeout=60,
            what="all 300 journaled",
        )
        # The command line won: the segment rolls into cli-journal.
        yield wait_until(lambda: list((tmp_path / "cli-journal").glob("seg-*.parquet")))
        assert not (tmp_path / "env-journal").exists()
        assert not (tmp_path / "file-journal").exists()
        samples = metric_samples(product.get("/metrics"))
        assert samples["eventbus_events_accepted_total"] == 300
        assert samples["eventbus_sequence"] == 300
        assert samples["spark_bridge_events_journaled_total"] == 300
        assert samples["spark_bridge_journal_lag_events"] == 0
        assert samples["eventbus_connections{socket=collector}"] == 1
        assert samples["bus_service_up{service=spark-bridge}"] == 1
        cli = subprocess.run(
            [CLI, "status", "--http", f"127.0.0.1:{product.http_port}"],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert cli.returncode == 0, cli.stderr
        assert json.loads(cli.stdout)["services"]["eventbus"]["accepted"] == 300
    finally:
        if publisher is not None:
            publisher.close()
        code = product.stop()
    assert code in CLEAN_EXIT, product.output()
    lines = [line for line in product.output().splitlines() if "[bus#info] stop" in line]
    order = [line.rsplit(" ", 1)[-1] for line in lines]
    assert order == [
        "http", "http", "spark-bridge", "spark-bridge", "eventbus", "eventbus",
    ], lines  # fmt: skip
    assert "event bus stopped at sequence 300" in product.output()


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["--prot", "5556"], "twistd eventbus: unknown option --prot; did you mean --port?"),
        (
            ["--services", "eventbus,zree"],
            f"no service named 'zree'; valid: {', '.join(SERVICE_NAMES)}",
        ),
    ],
)
def test_bad_options_give_one_clear_line_and_a_failure_status(
    tmp_path: Path, args: list[str], expected: str
) -> None:
    run = subprocess.run(
        [TWISTD, "-n", "--pidfile=", "eventbus", *args],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=environment(),
        timeout=60,
    )
    assert run.returncode != 0
    assert expected in run.stderr
    assert "Traceback" not in run.stdout + run.stderr
    assert "Options:" not in run.stdout + run.stderr  # not the whole --help


@pytest.mark.parametrize("busy", ["port", "http-port"])
def test_a_busy_port_stops_the_process_with_one_line_naming_the_option(
    tmp_path: Path, busy: str
) -> None:
    holder = socket.socket()
    holder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    holder.bind(("127.0.0.1", 0))
    holder.listen()
    port = holder.getsockname()[1]
    try:
        bus_port = str(port) if busy == "port" else "0"
        http_port = str(port) if busy == "http-port" else "0"
        run = subprocess.run(
            [
                TWISTD, "-n", "--pidfile=", "eventbus", "--port", bus_port,
                "--http-port", http_port, "--data-dir", str(tmp_path / "data"),
                "--mc0-port", "0",
            ],
            capture_output=True, text=True, cwd=tmp_path, env=environment(), timeout=60,
        )  # fmt: skip
    finally:
        holder.close()
    output = run.stdout + run.stderr
    assert run.returncode == 1, output
    service = "eventbus" if busy == "port" else "http"
    [line] = [line for line in output.splitlines() if "cannot start" in line]
    assert f"cannot start {service}: --{busy} {port}: " in line
    assert "in use" in line
    assert "Traceback" not in output


def test_a_journal_held_by_another_bridge_names_the_prefixed_option(tmp_path: Path) -> None:
    from bus.spark.journal import JournalWriter

    held = JournalWriter(tmp_path / "journal")  # another writer holds its lock
    try:
        run = subprocess.run(
            [
                TWISTD, "-n", "--pidfile=", "eventbus", "--port", "0", "--http-port", "0",
                "--data-dir", str(tmp_path / "data"), "--spark-bridge",
                "--spark-bridge-journal-dir", str(tmp_path / "journal"),
            ],
            capture_output=True, text=True, cwd=tmp_path, env=environment(), timeout=60,
        )  # fmt: skip
    finally:
        held.close()
    output = run.stdout + run.stderr
    assert run.returncode == 1, output
    [line] = [line for line in output.splitlines() if "cannot start" in line]
    assert "cannot start spark-bridge: --spark-bridge-journal-dir " in line
    assert "another writer holds the journal" in line
    assert "stopped eventbus" in output  # the bus, started first, was stopped cleanly
