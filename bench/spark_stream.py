"""Catch-up speed of the ``eventbus`` source reading a JetStream stream, beside the same
source reading a journal of the same events, and beside raw nats-py reading the stream in
one process; and how it scales from one Spark worker to two.

    python bench/spark_stream.py [--events 200000] [--repeat 3] [--spark standalone|local]
                                 [--sink parquet|noop]

Starts one nats-server on 127.0.0.1 (R1), fills a stream with synthetic events the way a
front-end does (same subjects and body), writes a journal of the same events, then, in a
child process (the driver) per cluster size, times batch reads of everything into a
Parquet sink (``--sink noop``: Spark's ``noop`` sink, every column materialised, nothing
written), median of ``--repeat`` warm runs. The cluster (``--spark standalone``, the
default) is Spark's standalone master and one, then two, workers of one core each, all on
127.0.0.1; ``--spark local`` runs ``local[1]`` and ``local[2]`` in the driver instead.

* stream source (``.option("nats", ...)``, ``minPartitions`` = cores);
* journal source (``.option("path", ...)``), same events: the baseline;
* raw nats-py, one process, a pull consumer decoding every message: what one reader
  gets from the server with the NATS client of the registry;
* raw ``bus.nats``, one process: the ranged read the executors use, without Spark.

Targets: stream >= 1.0 x journal with two workers; two workers >= 1.6 x one.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

TARGET_VS_JOURNAL = 1.0
TARGET_SCALING = 1.6
STREAM = "BENCH"


def timed(run: Callable[[], None], repeat: int) -> tuple[float, float]:
    """Median seconds of ``repeat`` warm runs, and the median CPU seconds the whole
    machine was busy during one (every process: Spark's JVMs, its Python workers, the
    nats-server)."""
    from _common import machine_busy_seconds

    run()  # warm-up: JIT, Python workers, connections
    samples, busy = [], []
    for _ in range(repeat):
        before = machine_busy_seconds()
        start = time.perf_counter()
        run()
        samples.append(time.perf_counter() - start)
        busy.append(machine_busy_seconds() - before)
    return statistics.median(samples), statistics.median(busy)


def fill(url: str, count: int) -> None:
    import nats
    from nats.js.api import StreamConfig

    from bus.eventbus import subjects
    from bus.eventbus.stream_read import encode
    from bus.spark.synthetic import events

    async def go() -> None:
        nc = await nats.connect(url)
        js = nc.jetstream()
        await js.add_stream(StreamConfig(name=STREAM, subjects=["bench.>"]))
        batch = list(events(1, count))
        for start in range(0, count, 5000):
            futures = [
                await js.publish_async(
                    subjects.subject("bench", e.topic),
                    encode((e.topic, e.producer, e.timestamp, e.uuid, e.data)),
                )
                for e in batch[start : start + 5000]
            ]
            await asyncio.gather(*futures)
        await nc.close()

    asyncio.run(go())


def raw_read(url: str, count: int) -> None:
    """nats-py alone: a pull consumer fetched 1000 at a time, each message decoded."""
    import nats
    from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

    from bus.eventbus.stream_read import decode

    async def go() -> int:
        nc = await nats.connect(url)
        js = nc.jetstream()
        config = ConsumerConfig(
            deliver_policy=DeliverPolicy.ALL, ack_policy=AckPolicy.NONE, inactive_threshold=30.0
        )
        sub = await js.pull_subscribe("bench.>", stream=STREAM, config=config)
        read = 0
        while read < count:
            for message in await sub.fetch(1000, timeout=5):
                _ = message.metadata  # the stream sequence and time, as a reader needs them
                decode("bench", message.subject, message.data)
                read += 1
        await sub.unsubscribe()
        await nc.close()
        return read

    assert asyncio.run(go()) == count


def wire_read(url: str, count: int) -> None:
    """bus.nats alone: the ranged read the source's executors use, each row decoded."""
    from bus.eventbus.config import JetStreamSettings
    from bus.eventbus.stream_read import RangeReader

    settings = JetStreamSettings((url,), stream=STREAM, subject_prefix="bench")
    reader = RangeReader(settings, 0, count).open()
    read = 0
    while events := reader.next_events(20_000):
        read += len(events)
    reader.close()
    assert read == count


def child(args: argparse.Namespace) -> None:
    """One Spark master: time both sources, print JSON."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    from bus.spark import register

    spark: Any = (
        SparkSession.builder.master(args.master)
        .appName("bench-spark-stream")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.executor.cores", "1")
        .config("spark.executor.memory", "1g")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    register(spark)
    cores = args.cores
    out = Path(args.out)

    def sink(frame: Any, name: str) -> None:
        if args.sink == "noop":
            frame.write.format("noop").mode("overwrite").save()
        else:
            frame.write.mode("overwrite").parquet(str(out / name))

    def stream() -> None:
        frame = (
            spark.read.format("eventbus")
            .option("nats", args.nats)
            .option("stream", STREAM)
            .option("subjectPrefix", "bench")
            .option("minPartitions", str(cores))
            .load()
        )
        sink(frame, "stream")

    def journal() -> None:
        frame = (
            spark.read.format("eventbus")
            .option("path", args.journal)
            .option("minPartitions", str(cores))
            .load()
        )
        sink(frame, "journal")

    (stream_s, stream_cpu), (journal_s, journal_cpu) = (
        timed(stream, args.repeat),
        timed(journal, args.repeat),
    )
    result = {
        "stream": stream_s,
        "journal": journal_s,
        "stream_cpu": stream_cpu,
        "journal_cpu": journal_cpu,
    }
    spark.stop()
    print("RESULT " + json.dumps(result), flush=True)


class Standalone:
    """Spark's standalone master and workers of one core each, on 127.0.0.1."""

    def __init__(self, scratch: Path, env: dict[str, str]) -> None:
        import pyspark

        from bus.nats.servers import free_ports

        self.spark_class = str(Path(pyspark.__file__).parent / "bin" / "spark-class")
        self.scratch, self.env = scratch, {**env, "SPARK_LOCAL_IP": "127.0.0.1"}
        self.port, self.ui = free_ports(2)
        self.url = f"spark://127.0.0.1:{self.port}"
        self.processes: list[subprocess.Popen[bytes]] = []

    def _start(self, name: str, argv: list[str]) -> None:
        with (self.scratch / f"{name}.log").open("wb") as log:
            self.processes.append(
                subprocess.Popen(argv, env=self.env, stdout=log, stderr=subprocess.STDOUT)
            )

    def _log(self, name: str) -> str:
        return (self.scratch / f"{name}.log").read_text(errors="replace")

    def start(self) -> None:
        self._start("master", [self.spark_class, "org.apache.spark.deploy.master.Master",
                               "--host", "127.0.0.1", "--port", str(self.port),
                               "--webui-port", str(self.ui)])  # fmt: skip

    def workers(self, count: int) -> None:
        """Start workers until ``count`` are registered with the master."""
        from bus.nats.servers import free_ports

        while len(self.processes) - 1 < count:
            n = len(self.processes)
            (self.scratch / f"work-{n}").mkdir(exist_ok=True)
            self._start(f"worker-{n}", [
                self.spark_class, "org.apache.spark.deploy.worker.Worker", self.url,
                "--host", "127.0.0.1", "--cores", "1", "--memory", "1500m",
                "--webui-port", str(free_ports(1)[0]), "--work-dir", str(self.scratch / f"work-{n}"),
            ])  # fmt: skip
        deadline = time.monotonic() + 120
        while self._log("master").count("Registering worker") < count:
            if time.monotonic() > deadline:
                raise TimeoutError(f"{count} Spark workers did not register: {self._log('master')}")
            time.sleep(0.5)

    def stop(self) -> None:
        for process in self.processes:
            process.terminate()
        for process in self.processes:
            try:
                process.wait(10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--events", type=int, default=200_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument(
        "--spark", choices=("standalone", "local"), default="standalone",
        help="a standalone master with one, then two, one-core workers; or local[1], local[2]",
    )  # fmt: skip
    parser.add_argument("--sink", choices=("parquet", "noop"), default="parquet")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--cores", type=int, default=1, help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    parser.add_argument("--master", help=argparse.SUPPRESS)
    parser.add_argument("--nats", help=argparse.SUPPRESS)
    parser.add_argument("--journal", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args)
        return 0
    print("command:", shlex.join([sys.executable, *sys.argv]))

    from bus.nats.servers import NatsCluster
    from bus.spark.synthetic import write_journal

    scratch = Path(tempfile.mkdtemp(prefix="bus-bench-spark-stream-"))
    env = {
        **os.environ,
        "JAVA_TOOL_OPTIONS": f"-Djava.io.tmpdir={scratch}",
        "SPARK_LOCAL_DIRS": str(scratch),
        "PYTHONPATH": str(ROOT),
    }
    nats = NatsCluster(scratch / "nats", size=1)
    try:
        nats.start()
        url = nats.urls[0]
        start = time.perf_counter()
        fill(url, args.events)
        print(f"stream: {args.events:,} events in {time.perf_counter() - start:.1f} s")
        journal = scratch / "journal"
        write_journal(journal, args.events)
        raw = timed(lambda: raw_read(url, args.events), args.repeat)[0]
        wire = timed(lambda: wire_read(url, args.events), args.repeat)[0]
        seconds: dict[int, dict[str, float]] = {}
        cluster = Standalone(scratch, env) if args.spark == "standalone" else None
        try:
            if cluster is not None:
                cluster.start()
            for size in (1, 2):
                if cluster is not None:
                    cluster.workers(size)
                master = cluster.url if cluster is not None else f"local[{size}]"
                out = subprocess.run(
                    [sys.executable, __file__, "--child", "--master", master, "--nats", url,
                     "--journal", str(journal), "--repeat", str(args.repeat),
                     "--cores", str(size), "--sink", args.sink, "--out", str(scratch / "out")],
                    env=env, capture_output=True, text=True,
                )  # fmt: skip
                if out.returncode:
                    raise RuntimeError(f"the driver failed: {out.stderr[-3000:]}")
                line = next(x for x in out.stdout.splitlines() if x.startswith("RESULT "))
                seconds[size] = json.loads(line.removeprefix("RESULT "))
        finally:
            if cluster is not None:
                cluster.stop()
    finally:
        nats.stop()
        shutil.rmtree(scratch, ignore_errors=True)

    def rate(s: float) -> float:
        return args.events / s

    unit = "worker" if args.spark == "standalone" else "core"
    print(f"\n{args.events:,} rows, {args.sink} sink, median of {args.repeat} warm runs")
    print(f"  {'':10s} {'stream source':>15s} {'journal source':>15s} {'ratio':>6s}")
    for size, figures in seconds.items():
        print(
            f"  {size} {unit + 's' * (size > 1):8s} {rate(figures['stream']):>11,.0f} r/s"
            f" {rate(figures['journal']):>11,.0f} r/s"
            f" {figures['journal'] / figures['stream']:5.2f}x"
        )
    cores = os.cpu_count() or 1
    print(f"  CPU per row, every process of the machine ({cores} cores):")
    for size, figures in seconds.items():
        stream_us = figures["stream_cpu"] / args.events * 1e6
        journal_us = figures["journal_cpu"] / args.events * 1e6
        print(
            f"    {size} {unit + 's' * (size > 1):8s} stream {stream_us:5.2f} us, journal "
            f"{journal_us:5.2f} us: with every core busy the stream could reach "
            f"{journal_us / stream_us:.2f}x the journal here"
        )
    print(f"  raw nats-py, one process: {rate(raw):,.0f} r/s")
    print(f"  raw bus.nats (the executors' reader), one process: {rate(wire):,.0f} r/s")
    two, one = seconds[2], seconds[1]
    versus = two["journal"] / two["stream"]
    scaling = one["stream"] / two["stream"]
    print("SUMMARY")
    print(
        f"  stream vs journal, two {unit}s: {versus:.2f}x "
        f"({'PASS' if versus >= TARGET_VS_JOURNAL else 'MISS'} >= {TARGET_VS_JOURNAL})"
    )
    print(
        f"  one {unit} -> two: {scaling:.2f}x "
        f"({'PASS' if scaling >= TARGET_SCALING else 'MISS'} >= {TARGET_SCALING})"
    )
    print(f"  stream source vs raw nats-py: {raw / two['stream']:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
