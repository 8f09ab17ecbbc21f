"""The Spark job: land journaled events in a Parquet table and keep windowed counts.

Run it with ``python -m bus.spark.pipeline --journal DIR --output DIR --checkpoint DIR``
or ``spark-submit bus/spark/pipeline.py --journal DIR ...`` (``bus`` must be importable
by the driver and executors: installed, or shipped with ``--py-files``).
Two streaming queries read the journal independently:

``events``
    every event, appended to ``OUTPUT/events`` partitioned by ``date`` (UTC) and
    ``topic_root`` (the first topic segment: ``/orders/eu/1`` -> ``orders``);
``topic_counts``
    events per topic per window, appended to ``OUTPUT/topic_counts`` once the
    watermark closes the window.

Each has its own checkpoint under ``CHECKPOINT``; the journal is replayable and the
Parquet file sink commits each batch once, so output is exactly once across restarts.
Read the output with Spark (which honours ``_spark_metadata``), not with a plain Parquet
reader that would also see files of batches that failed.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bus.util.cliargs import add_version, fail
from bus.util.extras import MissingExtra, require

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.streaming.query import StreamingQuery

EVENTS = "events"
COUNTS = "topic_counts"


@dataclass(frozen=True, slots=True)
class PipelineConfig:
    """What the pipeline reads (a journal or a stream), where it writes and checkpoints, and how it
    triggers, windows and restarts (``python -m bus.spark.pipeline --help``)."""

    journal: str
    output: str
    checkpoint: str
    subscribe: str = ""
    starting_offsets: str = "earliest"
    max_offsets_per_trigger: int | None = None
    fail_on_data_loss: bool = True
    min_partitions: int | None = None
    available_now: bool = False
    trigger_seconds: float = 1.0
    time_column: str = "received_at"
    window: str = "1 minute"
    watermark: str = "10 minutes"
    counts: bool = True
    #: Read a JetStream-backed bus (comma-separated NATS URLs) instead of ``journal``.
    nats: str = ""
    stream: str = "EVENTBUS"
    subject_prefix: str = "eventbus"
    #: With ``nats``: the source's ``natsRetryTimeout`` (None: its default).
    nats_retry_timeout: float | None = None
    #: A query that fails is started again from its checkpoint this many times (exactly
    #: once still: the checkpoint says what was committed) before the pipeline fails.
    max_restarts: int = 3
    #: The first wait before a restart; each next one waits twice as long.
    restart_delay: float = 5.0

    def output_path(self, name: str) -> str:
        """Query ``name``'s output directory."""
        return str(Path(self.output) / name)

    def checkpoint_path(self, name: str) -> str:
        """Query ``name``'s checkpoint directory."""
        return str(Path(self.checkpoint) / name)


def read_events(spark: SparkSession, config: PipelineConfig) -> DataFrame:
    """The ``eventbus`` source as a stream, with the config's options."""
    reader = spark.readStream.format("eventbus")
    if config.nats:
        reader = (
            reader.option("nats", config.nats)
            .option("stream", config.stream)
            .option("subjectPrefix", config.subject_prefix)
        )
        if config.nats_retry_timeout is not None:
            reader = reader.option("natsRetryTimeout", f"{config.nats_retry_timeout:g}s")
    else:
        reader = reader.option("path", config.journal)
    reader = (
        reader.option("subscribe", config.subscribe)
        .option("startingOffsets", config.starting_offsets)
        .option("failOnDataLoss", str(config.fail_on_data_loss).lower())
    )
    if config.max_offsets_per_trigger:
        reader = reader.option("maxOffsetsPerTrigger", str(config.max_offsets_per_trigger))
    if config.min_partitions:
        reader = reader.option("minPartitions", str(config.min_partitions))
    return reader.load()


def with_event_time(events: DataFrame, time_column: str) -> DataFrame:
    """Adds ``event_time``. The producer's ``timestamp`` may be null (unparseable), so
    it falls back to ``received_at``."""
    from pyspark.sql import functions as F

    if time_column == "timestamp":
        return events.withColumn("event_time", F.coalesce("timestamp", "received_at"))
    return events.withColumn("event_time", F.col("received_at"))


def landed(events: DataFrame, time_column: str) -> DataFrame:
    """Events with the partition columns of the landed table."""
    from pyspark.sql import functions as F

    root = F.regexp_extract("topic", r"^/*([^/]+)", 1)
    return (
        with_event_time(events, time_column)
        .withColumn("date", F.to_date("event_time"))
        .withColumn("topic_root", F.when(root == "", F.lit("_")).otherwise(root))
        .drop("event_time")
    )


def windowed_counts(events: DataFrame, time_column: str, window: str, watermark: str) -> DataFrame:
    """Events per topic per ``window`` of event time, late events accepted within ``watermark``."""
    from pyspark.sql import functions as F

    return (
        with_event_time(events, time_column)
        .withWatermark("event_time", watermark)
        .groupBy(F.window("event_time", window), "topic")
        .count()
        .select(
            F.col("window.start").alias("window_start"),
            F.col("window.end").alias("window_end"),
            "topic",
            "count",
        )
    )


def start_queries(spark: SparkSession, config: PipelineConfig) -> list[StreamingQuery]:
    """Start the landing query (and the counting one) and return them running."""
    from bus.spark import register

    register(spark)
    names = [EVENTS, COUNTS] if config.counts else [EVENTS]
    return [start_query(spark, config, name) for name in names]


def start_query(spark: SparkSession, config: PipelineConfig, name: str) -> StreamingQuery:
    """Start one of the pipeline's queries (:data:`EVENTS` or :data:`COUNTS`), from its
    checkpoint when it has one."""
    trigger: dict[str, Any] = (
        {"availableNow": True}
        if config.available_now
        else {"processingTime": f"{config.trigger_seconds} seconds"}
    )
    if name == EVENTS:
        writer = (
            landed(read_events(spark, config), config.time_column)
            .writeStream.format("parquet")
            .partitionBy("date", "topic_root")
        )
    else:
        writer = windowed_counts(
            read_events(spark, config), config.time_column, config.window, config.watermark
        ).writeStream.format("parquet")
    return (
        writer.queryName(name)
        .option("path", config.output_path(name))
        .option("checkpointLocation", config.checkpoint_path(name))
        .outputMode("append")
        .trigger(**trigger)
        .start()
    )


def run_queries(
    spark: SparkSession,
    config: PipelineConfig,
    queries: list[StreamingQuery],
    stopping: Callable[[], bool],
    sleep: Callable[[float], None] = time.sleep,
) -> bool:
    """Wait for the queries to end (``availableNow``), for a failure, or for ``stopping()``
    (looked at every :data:`STOP_POLL` seconds: the caller stops the queries then); a
    query that fails is started again from its checkpoint up to ``config.max_restarts``
    times, after a wait that doubles each time (Spark's own start-up guesses fail a query
    on a busy host: a Python worker that takes over 10 s to connect back). True when every
    query ended well, or it was told to stop."""
    restarts = 0
    while True:
        try:
            while not stopping() and not _ended(spark, config, queries, STOP_POLL):
                pass
        except Exception as error:  # a query's failure, already reported by the listener
            failed = [i for i, q in enumerate(queries) if not q.isActive and q.exception()]
            if stopping() or not failed or restarts >= config.max_restarts:
                print(f"pipeline failed: {_first_line(error)}", file=sys.stderr, flush=True)
                return False
            delay = config.restart_delay * 2**restarts
            restarts += 1
            names = ", ".join(queries[i].name or "?" for i in failed)
            print(
                f"query {names} failed ({_first_line(error)}): started again from its "
                f"checkpoint in {delay:g}s (restart {restarts} of {config.max_restarts})",
                file=sys.stderr,
                flush=True,
            )
            sleep(delay)
            if stopping():
                return False
            spark.streams.resetTerminated()
            for i in failed:
                queries[i] = start_query(spark, config, queries[i].name or EVENTS)
            continue
        return stopping() or not any(q.exception() is not None for q in queries)


#: How often a wait on the queries looks whether it was told to stop (whole seconds, as
#: Spark's waits take them).
STOP_POLL = 1


def _ended(
    spark: SparkSession, config: PipelineConfig, queries: list[StreamingQuery], timeout: int
) -> bool:
    """Wait up to ``timeout`` for the queries to end (``availableNow``: all; else any);
    raises a query's failure."""
    if config.available_now:
        return all(query.awaitTermination(timeout) for query in queries)
    return bool(spark.streams.awaitAnyTermination(timeout))


def _first_line(error: BaseException) -> str:
    return (str(error).strip().splitlines() or [type(error).__name__])[0][:500]


# -- progress on the console -------------------------------------------------------------


def _seq(offset_json: str | None) -> int | None:
    try:
        value = json.loads(offset_json) if offset_json else None
    except ValueError:
        return None
    seq = value.get("seq") if isinstance(value, dict) else None
    return seq if isinstance(seq, int) else None


def progress_line(progress: Any) -> str:
    """One line for a ``StreamingQueryProgress``: batch, rows, rates, offsets, lag."""
    line = (
        f"[{progress.name}] batch {progress.batchId}: {progress.numInputRows} rows "
        f"({progress.inputRowsPerSecond:.0f} rows/s in, "
        f"{progress.processedRowsPerSecond:.0f} rows/s processed)"
    )
    if progress.sources:
        source = progress.sources[0]
        end, latest = _seq(source.endOffset), _seq(source.latestOffset)
        if end is not None:
            line += f", at seq {end}"
        if end is not None and latest is not None:
            line += f", log latest {latest}, lag {max(latest - end, 0)}"
    return line


def _progress_listener() -> Any:
    from pyspark.sql.streaming.listener import StreamingQueryListener

    class ConsoleProgress(StreamingQueryListener):
        def onQueryStarted(self, event: Any) -> None:
            print(f"[{event.name}] started (id {event.id})", flush=True)

        def onQueryProgress(self, event: Any) -> None:
            print(progress_line(event.progress), flush=True)

        def onQueryIdle(self, event: Any) -> None:
            pass

        def onQueryTerminated(self, event: Any) -> None:
            outcome = f"failed: {event.exception}" if event.exception else "stopped"
            print(f"[query {event.id}] {outcome}", flush=True)

    return ConsoleProgress()


# -- command line ------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    """The command line of ``python -m bus.spark.pipeline``."""
    parser = argparse.ArgumentParser(
        prog="python -m bus.spark.pipeline",
        description=(
            "Land Event BUS events from a journal into a Parquet table partitioned by date "
            "and top-level topic, exactly once, and keep windowed counts per topic. "
            "Writes DIR/events and DIR/topic_counts under --output, with one checkpoint "
            "each under --checkpoint. Read the output with Spark, which honours "
            "_spark_metadata."
        ),
        epilog=(
            "example: python -m bus.spark.pipeline --journal /data/spark-journal "
            "--output /data/lake --checkpoint /data/lake-checkpoints --available-now"
        ),
    )
    add_version(parser)
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--journal", metavar="DIR", help="journal directory (the bridge's)")
    source.add_argument(
        "--nats",
        metavar="URLS",
        help="or read a JetStream-backed bus: its NATS servers, comma-separated",
    )
    parser.add_argument("--stream", default="EVENTBUS", help="with --nats: the stream's name")
    parser.add_argument(
        "--subject-prefix", default="eventbus", help="with --nats: the stream's subject prefix"
    )
    parser.add_argument(
        "--nats-retry-timeout",
        type=_duration,
        metavar="DURATION",
        help="with --nats: how long a read or a request that fails while a NATS server is "
        "lost or JetStream elects a leader is tried again on the next server (default 60s)",
    )
    parser.add_argument("--output", required=True, metavar="DIR", help="output directory")
    parser.add_argument(
        "--checkpoint", required=True, metavar="DIR", help="checkpoint directory (keep it!)"
    )
    parser.add_argument(
        "--master",
        metavar="URL",
        help="Spark master, e.g. local[*] (default: spark-submit's, else local[*])",
    )
    parser.add_argument(
        "--available-now",
        action="store_true",
        help="process everything in the journal now, then exit (Trigger.AvailableNow)",
    )
    parser.add_argument(
        "--trigger-seconds",
        type=float,
        default=1.0,
        metavar="S",
        help="micro-batch interval (default 1)",
    )
    parser.add_argument(
        "--subscribe", default="", metavar="PREFIXES", help="topic prefixes, comma-separated"
    )
    parser.add_argument(
        "--starting-offsets",
        default="earliest",
        metavar="OFFSET",
        help='first run only: earliest (default), latest or {"seq": N}',
    )
    parser.add_argument(
        "--max-offsets-per-trigger", type=int, metavar="N", help="at most N sequences a batch"
    )
    parser.add_argument(
        "--min-partitions", type=int, metavar="N", help="split each batch into at least N tasks"
    )
    parser.add_argument(
        "--no-fail-on-data-loss",
        dest="fail_on_data_loss",
        action="store_false",
        help="skip lost ranges (removed by retention, known gaps, holes) instead of failing",
    )
    parser.add_argument(
        "--time-column",
        choices=("received_at", "timestamp"),
        default="received_at",
        help="event time for dates and windows: the bridge's receive time (default; "
        "monotone, so the watermark is safe) or the producer's timestamp",
    )
    parser.add_argument(
        "--window", default="1 minute", metavar="SPAN", help="count window (default 1 minute)"
    )
    parser.add_argument(
        "--watermark",
        default="10 minutes",
        metavar="SPAN",
        help="lateness allowed before a window is final (default 10 minutes)",
    )
    parser.add_argument("--no-counts", dest="counts", action="store_false", help="land only")
    parser.add_argument(
        "--max-restarts",
        type=int,
        default=3,
        metavar="N",
        help="a query that fails is started again from its checkpoint up to N times "
        "(default 3; 0: the first failure ends the pipeline)",
    )
    parser.add_argument(
        "--restart-delay",
        type=_duration,
        default=5.0,
        metavar="DURATION",
        help="the wait before the first restart, doubled for each next one (default 5s)",
    )
    parser.add_argument(
        "--shuffle-partitions",
        type=int,
        default=4,
        metavar="N",
        help="state partitions of the counting query (fixed once checkpointed; default 4)",
    )
    return parser


def _duration(text: str) -> float:
    """Seconds from ``30s``, ``2m``, ``0`` (argparse's type: its error in one line)."""
    from bus.extension import parse_duration

    try:
        return parse_duration(text)
    except Exception:  # twisted's UsageError
        raise argparse.ArgumentTypeError(f"not a duration: {text!r} (try 30s, 2m or 0)") from None


def build_session(master: str | None, shuffle_partitions: int) -> SparkSession:
    """A Spark session for the pipeline (on loopback when local) whose executors run this
    interpreter."""
    # Executors must run this interpreter: it is the one with bus and pyarrow installed.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    builder = SparkSession.builder.appName("eventbus-pipeline")
    if master:
        builder = builder.master(master)
    if not master or master.startswith("local"):
        # A local session talks to itself: keep it on loopback, not the host's address.
        builder = builder.config("spark.driver.bindAddress", "127.0.0.1").config(
            "spark.driver.host", "127.0.0.1"
        )
    return (
        builder.config("spark.sql.session.timeZone", "UTC")
        .config("spark.sql.shuffle.partitions", str(shuffle_partitions))
        .config("spark.ui.showConsoleProgress", "false")
        .getOrCreate()
    )


def main(argv: Sequence[str] | None = None) -> int:
    """Run the pipeline on ``argv`` (default: the command line); the exit status."""
    parser = build_parser()
    args = parser.parse_args(argv)
    try:  # the driver and the source's workers: one line now, not a worker's traceback later
        require("pyspark", "spark", "the Spark pipeline")
        require("pyarrow", "spark", "the Spark pipeline")
    except MissingExtra as error:
        fail(parser.prog, error)
    config = PipelineConfig(
        journal=args.journal or "",
        nats=args.nats or "",
        stream=args.stream,
        subject_prefix=args.subject_prefix,
        nats_retry_timeout=args.nats_retry_timeout,
        output=args.output,
        checkpoint=args.checkpoint,
        subscribe=args.subscribe,
        starting_offsets=args.starting_offsets,
        max_offsets_per_trigger=args.max_offsets_per_trigger,
        fail_on_data_loss=args.fail_on_data_loss,
        min_partitions=args.min_partitions,
        available_now=args.available_now,
        trigger_seconds=args.trigger_seconds,
        time_column=args.time_column,
        window=args.window,
        watermark=args.watermark,
        counts=args.counts,
        max_restarts=args.max_restarts,
        restart_delay=args.restart_delay,
    )
    if args.max_restarts < 0:
        parser.error("--max-restarts: give 0 or more")
    spark = build_session(args.master, args.shuffle_partitions)
    spark.sparkContext.setLogLevel("WARN")
    spark.streams.addListener(_progress_listener())
    queries = start_queries(spark, config)

    stopped: list[int] = []

    def stop(signum: int, frame: object) -> None:
        # Only noted: the main thread is inside a call to Spark (py4j) when the signal
        # comes, and a call from here would read py4j's socket inside that call's own read.
        # The wait looks at it every STOP_POLL s and returns; the queries stop below.
        print(f"signal {signum}: stopping queries", flush=True)
        stopped.append(signum)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    ok = run_queries(spark, config, queries, lambda: bool(stopped))
    for query in queries:
        if query.isActive:
            query.stop()
    spark.stop()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
