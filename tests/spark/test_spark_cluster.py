"""Spark reads the bus where it is replicated, on a cluster of hosts: every piece is a
process on a host of its own (a network namespace on one switch): a nats-server, an
Event BUS front-end on it, a Spark standalone master, two workers, and a driver running
``python -m bus.spark.pipeline --nats ... --master spark://...`` beside a confirming
publisher. Events are published through the front-end while the query runs; one worker
is killed (kill -9, with its executor) mid-stream, then the driver (kill -9, with a batch
in flight), which is started again. Checked: the pipeline's output holds every event of
the stream exactly once, and every confirmed event where it was confirmed."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from bus.nats.servers import NatsCluster
from tests.jvm import java_tool_options, spark_submit_args
from tests.netns import Hosts, LinePeer, make_hosts, poll_until
from tests.spark.driver import landed_seq

pytest.importorskip("nats")
pytestmark = pytest.mark.spark

BIN = Path(sys.executable).parent
PORT = 7000


def spark_class() -> str:
    import pyspark

    return str(Path(pyspark.__file__).parent / "bin" / "spark-class")


@pytest.fixture
def hosts() -> Iterator[Hosts]:
    made = make_hosts(["n1", "f1", "m", "w1", "w2", "d"])
    try:
        yield made
    finally:
        made.delete()


class Processes:
    """Every process the test starts, each in its own session so that a kill takes its
    children (a worker's executor) too; all stopped at the end."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.started: dict[str, subprocess.Popen[bytes]] = {}

    def start(self, name: str, argv: list[str], env: dict[str, str]) -> None:
        with (self.root / f"{name}.log").open("ab") as log:
            self.started[name] = subprocess.Popen(
                argv, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True
            )

    def log(self, name: str) -> str:
        return (self.root / f"{name}.log").read_text(errors="replace")

    def kill(self, name: str, sig: int = signal.SIGKILL) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.started[name].pid, sig)
        self.started[name].wait(30)

    def stop_all(self) -> None:
        for name in list(self.started):
            if self.started[name].poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.started[name].pid, signal.SIGTERM)
        for process in self.started.values():
            try:
                process.wait(30)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, signal.SIGKILL)
                process.wait(10)


def test_a_spark_cluster_of_hosts_reads_the_stream_exactly_once_through_kills(
    hosts: Hosts, tmp_path: Path, spark: Any
) -> None:
    address = hosts.addresses
    nats = NatsCluster(
        tmp_path / "nats", size=1, hosts=[address["n1"]], client_ports=[4222],
        route_ports=[6222], prefix=lambda node: hosts.prefix("n1"),
    )  # fmt: skip
    url = nats.urls[0]
    settings = {
        "spark.executor.memory": "512m",
        "spark.executor.cores": "1",
        "spark.task.maxFailures": "8",
        "spark.sql.session.timeZone": "UTC",
    }
    scratch = tmp_path / "jvm"
    scratch.mkdir()
    base_env = {
        **os.environ,
        "PYSPARK_SUBMIT_ARGS": spark_submit_args(settings),
        "PYSPARK_PYTHON": sys.executable,
        "JAVA_TOOL_OPTIONS": java_tool_options(scratch),
        "SPARK_LOCAL_DIRS": str(scratch),
        "SPARK_LOG_DIR": str(tmp_path),
        "PYTHONUNBUFFERED": "1",
    }

    def env(host: str) -> dict[str, str]:
        return {**base_env, "SPARK_LOCAL_IP": address[host]}

    run = Processes(tmp_path)
    clients: LinePeer | None = None
    output, checkpoint = tmp_path / "out", tmp_path / "checkpoint"
    master = f"spark://{address['m']}:7077"
    try:
        nats.start(timeout=30)
        run.start(
            "front-end",
            [
                *hosts.prefix("f1"), str(BIN / "twistd"), "-n", "--pidfile=", "eventbus",
                "--services", "eventbus", "--bind", address["f1"], "--port", str(PORT),
                "--data-dir", str(tmp_path / "f1"), "--store", "jetstream", "--nats", url,
            ],
            {**base_env, "EVENTBUS_HTTP_PORT": "0"},
        )  # fmt: skip
        run.start(
            "master",
            [*hosts.prefix("m"), spark_class(), "org.apache.spark.deploy.master.Master",
             "--host", address["m"], "--port", "7077", "--webui-port", "8080"],
            env("m"),
        )  # fmt: skip
        for worker in ("w1", "w2"):
            run.start(
                worker,
                [*hosts.prefix(worker), spark_class(), "org.apache.spark.deploy.worker.Worker",
                 master, "--host", address[worker], "--cores", "1", "--memory", "1g",
                 "--webui-port", "8081", "--work-dir", str(tmp_path / f"{worker}-work")],
                env(worker),
            )  # fmt: skip
        poll_until(lambda: (tmp_path / "f1" / "status.json").exists(), 60, "the front-end serving")
        poll_until(lambda: run.log("master").count("Registering worker") >= 2, 120, "two workers")
        clients = LinePeer(
            [*hosts.prefix("d"), sys.executable, "-m", "tests.nemesis_clients",
             "--server", f"{address['f1']}:{PORT}", "--publishers", "1", "--subscribers", "0",
             "--rate", "50", "--out", str(tmp_path / "records")],
            tmp_path / "clients.log",
        )  # fmt: skip
        clients.wait_for("PROGRESS", timeout=60, ready=True)
        driver = [
            *hosts.prefix("d"), sys.executable, "-m", "bus.spark.pipeline", "--nats", url,
            "--master", master, "--output", str(output), "--checkpoint", str(checkpoint),
            "--no-counts", "--starting-offsets", "earliest", "--trigger-seconds", "0.5",
            "--max-offsets-per-trigger", "4000", "--min-partitions", "2",
        ]  # fmt: skip
        run.start("driver", driver, env("d"))
        commits, offsets = checkpoint / "events" / "commits", checkpoint / "events" / "offsets"

        def batches(directory: Path) -> int:
            return (
                sum(1 for p in directory.glob("*") if p.name.isdigit()) if directory.exists() else 0
            )

        poll_until(
            lambda: batches(commits) >= 2 or run.started["driver"].poll() is not None,
            240,
            "two micro-batches on the cluster",
        )
        assert run.started["driver"].poll() is None, run.log("driver")[-3000:]
        run.kill("w2")  # the worker and its executor, mid-stream
        before = batches(commits)
        poll_until(lambda: batches(commits) >= before + 2, 240, "batches after the worker kill")
        # kill -9 of the driver (and its JVM) while a planned batch is in flight; started
        # again, it replays that batch from the checkpoint on the worker left.
        poll_until(lambda: batches(offsets) > batches(commits), 60, "a batch in flight")
        run.kill("driver")
        run.start("driver-again", driver, env("d"))
        before = batches(commits)
        poll_until(lambda: batches(commits) > before, 240, "a batch after the driver kill")
        clients.send({"cmd": "finish"})
        finished = clients.wait_for("FINISHED", timeout=120)
        assert finished["failed"] == 0 and finished["confirmed"] == finished["sent"]
        confirmed = [
            json.loads(line)
            for line in (tmp_path / "records" / "pub-0.jsonl").read_text().splitlines()
        ]
        last = max(row["seq"] for row in confirmed)

        def landed() -> int:  # what the driver reports committed
            assert run.started["driver-again"].poll() is None, run.log("driver-again")[-3000:]
            return landed_seq(run.log("driver-again"))

        poll_until(lambda: landed() >= last, 240, f"sequence {last} landed")
        run.kill("driver-again", signal.SIGTERM)
        rows = spark.read.parquet(str(output / "events")).select("seq", "event_id").collect()
        sequences = sorted(r["seq"] for r in rows)
        assert sequences == list(range(1, last + 1)), "not every sequence exactly once"
        where = {r["event_id"]: r["seq"] for r in rows}
        assert all(where.get(row["uuid"]) == row["seq"] for row in confirmed)
        assert "Registering worker" in run.log("master")
        assert "w2" in run.started and run.started["w2"].returncode is not None
        print(f"spark cluster: {len(rows)} events landed once across a worker and a driver kill")
    finally:
        if clients is not None:
            clients.stop()
        run.stop_all()
        nats.stop()
