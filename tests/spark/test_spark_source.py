"""The ``eventbus`` data source: batch and streaming reads through a real SparkSession."""

from __future__ import annotations

import pickle
import shutil
import tempfile
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgpack
import pyarrow as pa
import pytest

from bus.eventbus.codec import Event
from bus.spark import decode_payload
from bus.spark.journal import JournalWriter, segment_name
from bus.spark.options import SourceOptions
from bus.spark.payload import msgpack_to_json
from bus.spark.source import EventBusStreamReader
from bus.spark.synthetic import TOPICS, events, expected_counts, write_journal

from .helpers import end_seq, wait_for

pytestmark = pytest.mark.spark

BIG = 40_000


@pytest.fixture(scope="module")
def big_journal() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="bus-spark-journal-"))
    try:
        write_journal(path, BIG, per_segment=8000)  # five segments; batches straddle them
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def read(spark: Any, path: Path, **options: str) -> Any:
    reader = spark.read.format("eventbus").option("path", str(path))
    for key, value in options.items():
        reader = reader.option(key, value)
    return reader.load()


def read_stream(spark: Any, path: Path, **options: str) -> Any:
    reader = spark.readStream.format("eventbus").option("path", str(path))
    for key, value in options.items():
        reader = reader.option(key, value)
    return reader.load()


def topic_counts(frame: Any) -> dict[str, int]:
    return {row["topic"]: row["count"] for row in frame.groupBy("topic").count().collect()}


def land(spark: Any, path: Path, out: Path, **options: str) -> Any:
    """Run an AvailableNow query landing the journal in Parquet; return the query."""
    query = (
        read_stream(spark, path, **options)
        .writeStream.format("parquet")
        .option("path", str(out / "data"))
        .option("checkpointLocation", str(out / "checkpoint"))
        .trigger(availableNow=True)
        .start()
    )
    return query


def landed_seqs(spark: Any, out: Path) -> list[int]:
    return sorted(r["seq"] for r in spark.read.parquet(str(out / "data")).select("seq").collect())


# -- streaming ------------------------------------------------------------------------------


def test_streaming_counts_per_topic_are_exact(spark: Any, big_journal: Path, workdir: Path) -> None:
    query = (
        read_stream(spark, big_journal, startingOffsets="earliest", maxOffsetsPerTrigger="10000")
        .groupBy("topic")
        .count()
        .writeStream.format("memory")
        .queryName("counts_big")
        .outputMode("complete")
        .option("checkpointLocation", str(workdir / "checkpoint"))
        .start()
    )
    try:
        wait_for(lambda: end_seq(query) == BIG, timeout=150, what="the query to reach the end")
        counts = {r["topic"]: r["count"] for r in spark.table("counts_big").collect()}
        batches = [p["numInputRows"] for p in query.recentProgress if p["numInputRows"]]
    finally:
        query.stop()
    assert counts == dict(expected_counts(1, BIG))
    assert batches == [10000] * 4


def test_available_now_reads_everything_then_stops(spark: Any, workdir: Path) -> None:
    journal = workdir / "journal"
    write_journal(journal, 5000, per_segment=1000)
    query = land(spark, journal, workdir, startingOffsets="earliest", maxOffsetsPerTrigger="2000")
    assert query.awaitTermination(120), "AvailableNow query did not stop by itself"
    assert [p["numInputRows"] for p in query.recentProgress] == [2000, 2000, 1000]
    assert landed_seqs(spark, workdir) == list(range(1, 5001))
    # A later run from the same checkpoint takes only what arrived since.
    with JournalWriter(journal) as writer:
        writer.append(list(events(5001, 1500)), 0.0)
    query = land(spark, journal, workdir, maxOffsetsPerTrigger="2000")
    assert query.awaitTermination(120)
    assert landed_seqs(spark, workdir) == list(range(1, 6501))


def test_fail_on_data_loss_after_retention(spark: Any, workdir: Path) -> None:
    journal = workdir / "journal"
    write_journal(journal, 2000, per_segment=1000)
    query = land(spark, journal, workdir, startingOffsets="earliest")
    assert query.awaitTermination(120)
    # While the query is down, the journal moves on and retention removes 1..5000,
    # of which 2001..5000 were never read.
    with JournalWriter(journal, roll_events=1000) as writer:
        for first in range(2001, 10001, 1000):
            writer.append(list(events(first, 1000)), 0.0)
        size = (journal / segment_name(9001, 10000)).stat().st_size
        writer.prune(max_bytes=5 * size + size // 2)
    failing = land(spark, journal, workdir)
    with pytest.raises(Exception, match=r"sequences 2001\.\.5000 were removed by retention"):
        failing.awaitTermination(120)
    assert landed_seqs(spark, workdir) == list(range(1, 2001))
    query = land(spark, journal, workdir, failOnDataLoss="false")
    assert query.awaitTermination(120)
    assert query.exception() is None
    assert landed_seqs(spark, workdir) == [*range(1, 2001), *range(5001, 10001)]
    # The same rules for a batch read.
    with pytest.raises(Exception, match="removed by retention"):
        read(spark, journal, startingOffsets='{"seq": 0}').count()
    assert (
        read(spark, journal, startingOffsets='{"seq": 0}', failOnDataLoss="false").count() == 5000
    )


def test_known_gaps_and_unknown_holes_are_data_loss(spark: Any, workdir: Path) -> None:
    # A known gap is events the bus had and Spark will never see: loss, with its reason.
    with JournalWriter(workdir / "gap") as writer:
        writer.append(list(events(1, 100)), 0.0)
        writer.note_gap(101, 150, "bus retention overtook the bridge")
        writer.append(list(events(151, 50)), 0.0)
    with pytest.raises(Exception, match=r"101\.\.150 were never journaled \(bus retention"):
        read(spark, workdir / "gap").count()
    assert read(spark, workdir / "gap", failOnDataLoss="false").count() == 150
    write_journal(workdir / "hole", 3000, per_segment=1000)
    (workdir / "hole" / segment_name(1001, 2000)).unlink()
    with pytest.raises(Exception, match=r"1001\.\.2000 are missing \(unknown hole\)"):
        read(spark, workdir / "hole").count()
    assert read(spark, workdir / "hole", failOnDataLoss="false").count() == 2000


# -- batch --------------------------------------------------------------------------------------


def test_batch_read_between_offsets(spark: Any, big_journal: Path) -> None:
    frame = read(spark, big_journal, startingOffsets='{"seq": 100}', endingOffsets='{"seq": 250}')
    assert [r["seq"] for r in frame.orderBy("seq").select("seq").collect()] == list(range(101, 251))
    assert read(spark, big_journal, endingOffsets='{"seq": 10}').count() == 10
    everything = read(spark, big_journal, minPartitions="5")
    assert everything.rdd.getNumPartitions() == 5
    assert everything.count() == BIG
    with pytest.raises(Exception, match=f"beyond the journal's latest sequence {BIG}"):
        read(spark, big_journal, endingOffsets=f'{{"seq": {BIG + 1}}}').count()


def test_subscribe_filters_by_topic_prefix(spark: Any, big_journal: Path) -> None:
    frame = read(spark, big_journal, subscribe="/orders/, /users/login")
    wanted = ("/orders/", "/users/login")
    expected = {t: n for t, n in expected_counts(1, BIG).items() if t.startswith(wanted)}
    assert topic_counts(frame) == expected


def test_rows_have_the_declared_schema_and_payload_decodes(spark: Any, workdir: Path) -> None:
    journal = workdir / "journal"
    with JournalWriter(journal) as writer:
        writer.append(list(events(1, 3)), 1714564800.0)
        bad = Event(b"/bad", 4, b"p", b"garbage", b"x", b"\xc1")
        writer.append([bad], 1714564800.0)
    frame = read(spark, journal)
    assert [f.name for f in frame.schema.fields] == [
        "topic", "seq", "producer", "timestamp", "event_id", "payload", "received_at"
    ]  # fmt: skip
    decoded = frame.select(
        "seq", "timestamp", decode_payload("payload", "n BIGINT, tags ARRAY<STRING>").alias("p")
    ).orderBy("seq")
    rows = decoded.collect()
    assert [(r["seq"], r["p"]["n"] if r["p"] else None) for r in rows] == [
        (1, 1), (2, 2), (3, 3), (4, None)
    ]  # fmt: skip
    assert rows[0]["p"]["tags"] == ["a", "b"]
    assert rows[3]["timestamp"] is None


def test_msgpack_to_json_never_fails() -> None:
    stamp = msgpack.Timestamp(0, 0)
    packed = msgpack.packb({1: b"\x00\x01", "t": stamp, "f": float("nan"), "l": [1, "x"]})
    assert (
        msgpack_to_json(packed)
        == '{"1": "AAE=", "t": "1970-01-01T00:00:00+00:00", "f": null, "l": [1, "x"]}'
    )
    assert msgpack_to_json(b"\xc1") is None
    assert msgpack_to_json(None) is None


# -- the reader object itself (no query) ----------------------------------------------------------


def stream_reader(path: Path, **options: str) -> EventBusStreamReader:
    return EventBusStreamReader(SourceOptions.parse({"path": str(path), **options}, streaming=True))


def read_range(reader: EventBusStreamReader, start: int, end: int) -> pa.Table:
    batches = [
        batch
        for partition in reader.partitions({"seq": start}, {"seq": end})
        for batch in reader.read(partition)
    ]
    return pa.Table.from_batches(batches)


def test_a_range_reads_the_same_rows_until_committed(workdir: Path) -> None:
    write_journal(workdir, 3000, per_segment=1000)
    reader = stream_reader(workdir, startingOffsets="earliest", minPartitions="3")
    first = read_range(reader, 500, 2500)
    with JournalWriter(workdir) as writer:
        writer.append(list(events(3001, 500)), 0.0)
    # Re-planned after a restart, in a fresh (unpickled) reader: identical rows.
    again = read_range(pickle.loads(pickle.dumps(reader)), 500, 2500)
    assert again.equals(first)
    assert first.column("seq").to_pylist() == list(range(501, 2501))


def test_offsets_honour_limits_and_available_now(workdir: Path) -> None:
    from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows, ReadMinRows

    write_journal(workdir, 1000, per_segment=100)
    reader = stream_reader(workdir, startingOffsets="earliest", maxOffsetsPerTrigger="300")
    assert reader.initialOffset() == {"seq": 0}
    assert reader.getDefaultReadLimit() == ReadMaxRows(300)
    assert reader.latestOffset({"seq": 0}, ReadMaxRows(300)) == {"seq": 300}
    assert reader.latestOffset({"seq": 900}, ReadMaxRows(300)) == {"seq": 1000}
    assert reader.latestOffset({"seq": 0}, ReadAllAvailable()) == {"seq": 1000}
    assert reader.latestOffset({"seq": 950}, ReadMinRows(100)) == {"seq": 950}
    reader.prepareForTriggerAvailableNow()
    with JournalWriter(workdir) as writer:
        writer.append(list(events(1001, 50)), 0.0)
    assert reader.latestOffset({"seq": 900}, ReadAllAvailable()) == {"seq": 1000}
    assert reader.reportLatestOffset() == {"seq": 1050}
    latest = stream_reader(workdir)
    assert latest.initialOffset() == {"seq": 1050}
    with JournalWriter(workdir) as writer:
        writer.append(list(events(1051, 5)), 0.0)
    assert latest.initialOffset() == {"seq": 1050}  # asked twice, answers the same
    clone = pickle.loads(pickle.dumps(latest))
    assert clone.access._journal is None and clone.initialOffset() == {"seq": 1050}


def test_topics_used_by_the_tests_cover_several_roots() -> None:
    assert len(Counter(t.split("/")[1] for t in TOPICS)) == 3
