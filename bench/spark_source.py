"""Catch-up speed of the ``eventbus`` source, beside Spark's own Parquet reader.

    python bench/spark_source.py [--events 500000] [--master local[2]] [--repeat 3]

Writes a journal of synthetic events to a temp directory, then times, on one warm
SparkSession, reading all of it into Spark's ``noop`` sink (every column materialised):

* source, streaming: ``Trigger.AvailableNow`` with ``maxOffsetsPerTrigger``, from a
  fresh checkpoint each time: what a pipeline does when it catches up;
* source, batch: ``spark.read.format("eventbus")``;
* baselines, in the same run and session: Spark's own Parquet reader over the same
  segment files, as a stream (the file source, ``maxFilesPerTrigger`` giving batches of
  the same size) and as a batch (``spark.read.parquet``).

The ratio is the source's rate over the baseline's.

Each figure is the median of ``--repeat`` timed runs after one untimed warm-up.
"""

from __future__ import annotations

import argparse
import os
import shlex
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

TARGET_ROWS_PER_SECOND = 40_000


def timed(run: Callable[[], None], repeat: int) -> float:
    run()  # warm-up: JIT, Python workers, codegen
    samples = []
    for _ in range(repeat):
        start = time.perf_counter()
        run()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--events", type=int, default=500_000)
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--per-trigger", type=int, default=100_000, help="maxOffsetsPerTrigger")
    args = parser.parse_args()
    print("command:", shlex.join([sys.executable, *sys.argv]))

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    from bus.spark import register
    from bus.spark.journal import JournalReader
    from bus.spark.source import SCHEMA
    from bus.spark.synthetic import write_journal

    scratch = Path(tempfile.mkdtemp(prefix="bus-bench-spark-"))
    # Keep the JVM's temp files (Spark leaves some behind) in the scratch directory.
    os.environ["JAVA_TOOL_OPTIONS"] = f"-Djava.io.tmpdir={scratch}"
    os.environ["SPARK_LOCAL_DIRS"] = str(scratch)
    try:
        journal = scratch / "journal"
        start = time.perf_counter()
        write_journal(journal, args.events)
        elapsed = time.perf_counter() - start
        segments = JournalReader(journal).segments()
        print(
            f"journal: {args.events} events in {len(segments)} segments, "
            f"written in {elapsed:.1f} s ({args.events / elapsed:,.0f} events/s)"
        )
        spark: Any = (
            SparkSession.builder.master(args.master)
            .appName("bench-spark-source")
            .config("spark.driver.bindAddress", "127.0.0.1")
            .config("spark.driver.host", "127.0.0.1")
            .config("spark.ui.enabled", "false")
            .config("spark.ui.showConsoleProgress", "false")
            .getOrCreate()
        )
        spark.sparkContext.setLogLevel("ERROR")
        register(spark)
        files = [str(journal / s.name) for s in segments]
        rows_per_file = args.events // len(files)
        runs = iter(range(1_000_000))

        def stream() -> None:
            query = (
                spark.readStream.format("eventbus")
                .option("path", str(journal))
                .option("startingOffsets", "earliest")
                .option("maxOffsetsPerTrigger", str(args.per_trigger))
                .load()
                .writeStream.format("noop")
                .option("checkpointLocation", str(scratch / f"checkpoint-{next(runs)}"))
                .trigger(availableNow=True)
                .start()
            )
            query.awaitTermination()
            rows = sum(p["numInputRows"] for p in query.recentProgress)
            assert rows == args.events, f"streamed {rows} rows"

        def stream_baseline() -> None:
            # Spark's file source over the same segments, in batches of as many rows.
            query = (
                spark.readStream.schema(SCHEMA)
                .option("pathGlobFilter", "seg-*.parquet")
                .option("maxFilesPerTrigger", str(max(1, args.per_trigger // rows_per_file)))
                .parquet(str(journal))
                .writeStream.format("noop")
                .option("checkpointLocation", str(scratch / f"checkpoint-{next(runs)}"))
                .trigger(availableNow=True)
                .start()
            )
            query.awaitTermination()
            rows = sum(p["numInputRows"] for p in query.recentProgress)
            assert rows == args.events, f"streamed {rows} rows"

        def batch() -> None:
            frame = spark.read.format("eventbus").option("path", str(journal)).load()
            frame.write.format("noop").mode("overwrite").save()

        def batch_baseline() -> None:
            spark.read.parquet(*files).write.format("noop").mode("overwrite").save()

        seconds = {
            "streaming, AvailableNow": (
                timed(stream, args.repeat),
                timed(stream_baseline, args.repeat),
            ),
            "batch": (timed(batch, args.repeat), timed(batch_baseline, args.repeat)),
        }
        spark.stop()
    finally:
        shutil.rmtree(scratch, ignore_errors=True)

    print(f"\n{args.events:,} rows on {args.master}, noop sink, median of {args.repeat} warm runs")
    print(f"  {'':24s} {'eventbus source':>17s} {'Spark parquet':>17s} {'ratio':>6s}")
    for name, (ours, theirs) in seconds.items():
        print(
            f"  {name:24s} {args.events / ours:>12,.0f} r/s {args.events / theirs:>12,.0f} r/s"
            f" {theirs / ours:5.2f}x"
        )
    streaming = args.events / seconds["streaming, AvailableNow"][0]
    verdict = "meets" if streaming >= TARGET_ROWS_PER_SECOND else "MISSES"
    print(
        f"source catch-up {streaming:,.0f} rows/s: {verdict} the {TARGET_ROWS_PER_SECOND:,} target"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
