"""Build the class archive the tests' JVMs share (``make test`` runs it once per venv):
``python -m tests.jvm_archive PATH``.

A JVM that starts Spark loads some 10,000 classes from Spark's jars, parsing and verifying
each; Java's dynamic class-data sharing (AppCDS) maps them from an archive instead. Measured
here, a local session's first query: 15-16 CPU-seconds with tests.jvm's options, 7-8 with the
archive. The archive is written at the exit of a JVM that ran ``-XX:ArchiveClassesAtExit``
through what the tests do (a session, Parquet written and read, an aggregation, a streaming
query with a watermark); a class it lacks is loaded as before, and a JVM whose class path
differs (Spark's launcher, a pyspark installed elsewhere) or whose JDK changed runs without
it (its warning silenced).
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

from tests.jvm import BASE_JVM_OPTIONS, spark_submit_args


def exercise(scratch: Path) -> None:
    """Start a local session and run what the Spark tests run, in small."""
    from pyspark import SparkContext
    from pyspark.sql import SparkSession
    from pyspark.sql.functions import window

    spark = (
        SparkSession.builder.master("local[2]")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.sql.shuffle.partitions", "2")
        .getOrCreate()
    )
    frame = spark.range(2000).selectExpr(
        "id AS seq", "CAST(id % 3 AS STRING) AS topic", "timestamp_seconds(id) AS received_at"
    )
    frame.write.partitionBy("topic").parquet(str(scratch / "table"))
    table = spark.read.parquet(str(scratch / "table"))
    table.groupBy("topic").count().collect()
    counts = (
        spark.readStream.schema(table.schema)
        .parquet(str(scratch / "table"))
        .withWatermark("received_at", "10 seconds")
        .groupBy(window("received_at", "30 seconds"), "topic")
        .count()
        .writeStream.outputMode("append")
        .format("parquet")
        .option("path", str(scratch / "counts"))
        .option("checkpointLocation", str(scratch / "checkpoint"))
        .trigger(availableNow=True)
        .start()
    )
    counts.awaitTermination(300)
    spark.stop()
    gateway = SparkContext._gateway
    if gateway is not None:  # the JVM writes the archive as it exits: wait for it
        gateway.shutdown()
        process = gateway.proc  # type: ignore[attr-defined]
        process.stdin.close()
        process.wait(timeout=300)


def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        sys.exit("usage: python -m tests.jvm_archive PATH")
    target = Path(args[0]).absolute()
    partial = target.with_suffix(".partial")
    partial.unlink(missing_ok=True)
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"
    os.environ.pop("SPARK_CONF_DIR", None)  # the tests' class path: Spark's jars alone
    with tempfile.TemporaryDirectory(prefix="bus-jvm-archive-") as scratch:
        os.environ["JAVA_TOOL_OPTIONS"] = f"{BASE_JVM_OPTIONS} -Djava.io.tmpdir={scratch}"
        # The driver's JVM alone writes it (not spark-submit's launcher, another class path).
        os.environ["PYSPARK_SUBMIT_ARGS"] = spark_submit_args(
            driver_options=f"-XX:ArchiveClassesAtExit={partial} -Xlog:cds*=off"
        )
        exercise(Path(scratch))
    if not partial.exists():
        sys.exit(f"the JVM wrote no class archive at {partial}")
    partial.rename(target)
    print(f"class archive for the tests' JVMs: {target} ({target.stat().st_size >> 20} MiB)")


if __name__ == "__main__":
    main()
