"""The pipeline job: in process on a small journal, and as a driver killed mid-stream."""

from __future__ import annotations

import re
import subprocess
import sys
from collections import Counter
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from bus.spark.journal import JournalReader, segment_name
from bus.spark.pipeline import (
    COUNTS,
    EVENTS,
    PipelineConfig,
    progress_line,
    run_queries,
    start_queries,
)
from bus.spark.synthetic import expected_counts, write_journal

from .driver import run_killed_then_resumed
from .helpers import SPARKS_OWN_GUESS

pytestmark = pytest.mark.spark


def closed_window_counts(
    journal: Path, window_seconds: int, watermark_seconds: int
) -> Counter[tuple[datetime, str]]:
    """Counts per (window start, topic) over ``received_at`` for the windows a watermark
    of ``watermark_seconds`` has closed once everything in the journal is read."""
    table = JournalReader(journal).read(0, JournalReader(journal).latest_sequence())
    times = table.column("received_at").to_pylist()
    watermark = max(times).timestamp() - watermark_seconds
    counts: Counter[tuple[datetime, str]] = Counter()
    for moment, topic in zip(times, table.column("topic").to_pylist(), strict=True):
        start = moment.timestamp() // window_seconds * window_seconds
        if start + window_seconds <= watermark:
            counts[(datetime.fromtimestamp(start, moment.tzinfo), topic)] += 1
    return counts


def landed_counts(spark: Any, output: Path) -> Counter[tuple[datetime, str]]:
    rows = spark.read.parquet(str(output / COUNTS)).collect()
    pairs = [(r["window_start"], r["topic"]) for r in rows]
    assert len(pairs) == len(set(pairs)), "a window was written twice"
    return Counter({(r["window_start"].astimezone(), r["topic"]): r["count"] for r in rows})


def as_local(counts: Counter[tuple[datetime, str]]) -> Counter[tuple[datetime, str]]:
    return Counter({(start.astimezone(), topic): n for (start, topic), n in counts.items()})


def check_landed_events(spark: Any, output: Path, count: int) -> None:
    events = spark.read.parquet(str(output / EVENTS))
    assert events.count() == count
    assert events.select("seq").distinct().count() == count
    assert {r["topic"]: r["count"] for r in events.groupBy("topic").count().collect()} == dict(
        expected_counts(1, count)
    )


def test_pipeline_end_to_end_on_a_small_journal(spark: Any, workdir: Path) -> None:
    journal, output = workdir / "journal", workdir / "out"
    write_journal(journal, 3000, per_segment=500, per_append=100)  # 30 s of event time
    config = PipelineConfig(
        journal=str(journal),
        output=str(output),
        checkpoint=str(workdir / "checkpoint"),
        available_now=True,
        max_offsets_per_trigger=1000,
        window="5 seconds",
        watermark="2 seconds",
    )
    for query in start_queries(spark, config):
        assert query.awaitTermination(120), f"{query.name} did not finish"
        assert query.exception() is None
        assert "lag 0" in progress_line(query.lastProgress)
    check_landed_events(spark, output, 3000)
    partitions = {
        (date.name, root.name)
        for date in (output / EVENTS).glob("date=*")
        for root in date.iterdir()
    }
    assert partitions == {
        ("date=2024-05-01", "topic_root=orders"),
        ("date=2024-05-01", "topic_root=users"),
        ("date=2024-05-01", "topic_root=metrics"),
    }
    expected = closed_window_counts(journal, 5, 2)
    assert len({start for start, _ in expected}) == 5  # 0-25 s closed, 25-30 s still open
    assert landed_counts(spark, output) == as_local(expected)


def test_pipeline_help_names_every_option() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "bus.spark.pipeline", "--help"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    for option in ("--journal", "--output", "--checkpoint", "--master", "--available-now"):
        assert option in result.stdout


def test_the_nats_retry_timeout_reaches_the_source_and_nonsense_is_one_line() -> None:
    from bus.spark.pipeline import build_parser, read_events

    class Reader:
        def __init__(self) -> None:
            self.options: dict[str, str] = {}

        def format(self, name: str) -> Reader:
            return self

        def option(self, key: str, value: str) -> Reader:
            self.options[key] = value
            return self

        def load(self) -> Reader:
            return self

    class Spark:
        readStream = Reader()

    given = ["--nats", "nats://h:4222", "--output", "o", "--checkpoint", "c"]
    args = build_parser().parse_args([*given, "--nats-retry-timeout", "2m"])
    assert args.nats_retry_timeout == 120.0
    config = PipelineConfig(
        journal="", output="o", checkpoint="c", nats="nats://h:4222", nats_retry_timeout=120.0
    )
    read_events(Spark(), config)  # type: ignore[arg-type]
    assert Spark.readStream.options["natsRetryTimeout"] == "120s"
    result = subprocess.run(
        [sys.executable, "-m", "bus.spark.pipeline", *given, "--nats-retry-timeout", "soon"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert result.returncode == 2
    assert "--nats-retry-timeout: not a duration: 'soon'" in result.stderr.strip().splitlines()[-1]


def test_a_driver_killed_mid_stream_resumes_exactly_once(spark: Any, workdir: Path) -> None:
    journal, output, checkpoint = workdir / "journal", workdir / "out", workdir / "checkpoint"
    # Four batches of 25 s of event time: two committed and one in flight at the kill,
    # the last after. Windows of 30 s span batches: [30 s, 60 s) is counted in the query's
    # state before the kill, on in the batch replayed, and closed after.
    total = 10_000
    write_journal(journal, total, per_segment=2500)  # 100 s of event time
    log = workdir / "pipeline.log"
    args = [
        *("--journal", str(journal), "--output", str(output), "--checkpoint", str(checkpoint)),
        *("--master", "local[2]", "--max-offsets-per-trigger", "2500", "--shuffle-partitions", "2"),
        *("--window", "30 seconds", "--watermark", "15 seconds"),
    ]
    commits, offsets = checkpoint / EVENTS / "commits", checkpoint / EVENTS / "offsets"
    run_killed_then_resumed(args, log, commits, offsets, batches=4)
    check_landed_events(spark, output, total)
    expected = closed_window_counts(journal, 30, 15)
    assert len({start for start, _ in expected}) == 2  # 0-60 s closed, 60-100 s still open
    assert landed_counts(spark, output) == as_local(expected)


def test_a_failed_query_is_started_again_from_its_checkpoint(
    spark: Any, workdir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A query that fails (here: a journal segment that cannot be read, made whole again
    during the wait before the restart; on a busy host, Spark's own 10 s guess of a Python
    worker's start) goes on from its checkpoint: every event lands once."""
    journal, output = workdir / "journal", workdir / "out"
    write_journal(journal, 3000, per_segment=1000, per_append=100)
    second = journal / segment_name(1001, 2000)
    whole = second.read_bytes()
    second.write_bytes(b"not parquet" * 100)
    config = PipelineConfig(
        journal=str(journal),
        output=str(output),
        checkpoint=str(workdir / "checkpoint"),
        available_now=True,
        max_offsets_per_trigger=1000,
        counts=False,
        max_restarts=2,
        restart_delay=7.0,
    )
    waits: list[float] = []

    def wait(seconds: float) -> None:
        waits.append(seconds)
        second.write_bytes(whole)  # the fault passes while the pipeline waits

    queries = start_queries(spark, config)
    finished = run_queries(spark, config, queries, lambda: False, sleep=wait)
    restarts = [line for line in capsys.readouterr().err.splitlines() if "started again" in line]
    if restarts and re.search(SPARKS_OWN_GUESS, restarts[0]):
        raise AssertionError(f"Spark's guess came before the fault: {restarts[0]}")
    assert len(restarts) == len(waits) >= 1 and "PYTHON_EXCEPTION" in restarts[0], restarts
    # Any later restart is Spark's own start-up guess running out on a busy machine, never
    # our fault again: restarting is what the pipeline does for it. Where it took every
    # restart, the conftest runs the test again.
    assert all(re.search(SPARKS_OWN_GUESS, line) for line in restarts[1:]), restarts
    if not finished and re.search(SPARKS_OWN_GUESS, str(queries[0].exception())):
        raise AssertionError(f"restarts {waits}: {queries[0].exception()}")
    assert finished
    assert waits[0] == 7.0
    assert queries[0].exception() is None
    check_landed_events(spark, output, 3000)


def test_a_query_that_keeps_failing_ends_the_pipeline_after_its_restarts(
    spark: Any, workdir: Path
) -> None:
    journal = workdir / "journal"
    write_journal(journal, 1000, per_segment=1000, per_append=100)
    (journal / segment_name(1, 1000)).write_bytes(b"not parquet" * 100)
    config = PipelineConfig(
        journal=str(journal),
        output=str(workdir / "out"),
        checkpoint=str(workdir / "checkpoint"),
        available_now=True,
        counts=False,
        max_restarts=2,
        restart_delay=1.0,
    )
    waits: list[float] = []
    queries = start_queries(spark, config)
    assert not run_queries(spark, config, queries, lambda: False, sleep=waits.append)
    assert waits == [1.0, 2.0]  # doubled each time, then given up
