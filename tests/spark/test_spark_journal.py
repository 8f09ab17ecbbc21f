"""The journal on its own: no SparkSession needed."""

from __future__ import annotations

import itertools
import json
import os
import pickle
import subprocess
import sys
from pathlib import Path

import msgpack
import pyarrow as pa
import pytest

from bus.eventbus.codec import Event
from bus.spark.journal import (
    ARROW_SCHEMA,
    GAPS_FILE,
    STATE_FILE,
    DataLossError,
    JournalError,
    JournalReader,
    JournalWriter,
    SequenceError,
    parse_timestamp,
    segment_name,
)
from bus.spark.options import OptionError, SourceOptions, split_range
from bus.spark.synthetic import events, expected_counts, make_event, write_journal


def event(seq: int, topic: str = "/t/a", timestamp: bytes = b"2024-05-01T12:00:00+00:00") -> Event:
    return Event(
        topic.encode(),
        seq,
        b"producer",
        timestamp,
        b"00000000-0000-0000-0000-%012d" % seq,
        msgpack.packb({"n": seq}),
    )


def seqs(table: pa.Table) -> list[int]:
    return table.column("seq").to_pylist()


# -- format -------------------------------------------------------------------------------


def test_round_trip_keeps_every_field_with_the_exact_schema(workdir: Path) -> None:
    with JournalWriter(workdir) as writer:
        writer.append([event(1), event(2, "/u/b", b"2024-05-01T14:00:00+02:00")], 1714564800.5)
    table = JournalReader(workdir).read(0, 2)
    assert table.schema.equals(ARROW_SCHEMA)
    rows = table.to_pylist()
    assert [r["seq"] for r in rows] == [1, 2]
    assert rows[1]["topic"] == "/u/b"
    assert rows[0]["producer"] == "producer"
    assert rows[0]["event_id"] == "00000000-0000-0000-0000-000000000001"
    assert msgpack.unpackb(rows[1]["payload"]) == {"n": 2}
    assert rows[0]["timestamp"] == rows[1]["timestamp"]  # 14:00+02:00 is 12:00 UTC
    assert rows[0]["received_at"].timestamp() == 1714564800.5


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        (b"1970-01-01T00:00:01", 1_000_000),  # naive means UTC
        (b"1970-01-01T00:00:01Z", 1_000_000),
        (b"1970-01-01T01:00:01+01:00", 1_000_000),
        (b"1970-01-01T00:00:00.000123", 123),
        (b"yesterday", None),
        (b"2024-13-01T00:00:00", None),
        (b"\xff\xfe", None),
        (b"", None),
    ],
)
def test_timestamps_parse_or_become_null(raw: bytes, expected: int | None) -> None:
    assert parse_timestamp(raw) == expected


def test_unparseable_timestamp_is_stored_as_null(workdir: Path) -> None:
    with JournalWriter(workdir) as writer:
        writer.append([event(1, timestamp=b"not a time")], 0.0)
    assert JournalReader(workdir).read(0, 1).column("timestamp").to_pylist() == [None]


def test_segment_names_sort_in_sequence_order() -> None:
    names = [segment_name(f, f + 9) for f in (1, 11, 91, 101, 10**12)]
    assert sorted(names) == names


def test_rolls_by_count_and_by_age(workdir: Path) -> None:
    writer = JournalWriter(workdir, roll_events=10, roll_seconds=1.0)
    writer.append(list(events(1, 25)), received_at=100.0)  # 25 >= 10: rolled at once
    assert [s.name for s in JournalReader(workdir).segments()] == [segment_name(1, 25)]
    writer.append(list(events(26, 3)), received_at=100.0)
    assert not writer.maybe_roll(100.5)
    assert writer.maybe_roll(101.0)
    assert [(s.first, s.last) for s in JournalReader(workdir).segments()] == [(1, 25), (26, 28)]
    writer.close()


# -- sequence discipline ------------------------------------------------------------------


def test_duplicates_and_steps_back_are_refused(workdir: Path) -> None:
    with JournalWriter(workdir) as writer:
        writer.append([event(5), event(6)], 0.0)
        with pytest.raises(SequenceError, match="duplicate or out of order"):
            writer.append([event(6)], 0.0)
        with pytest.raises(SequenceError, match="not above 6"):
            writer.append([event(3)], 0.0)
        with pytest.raises(SequenceError):
            writer.append([event(7), event(7)], 0.0)
        assert writer.last_sequence() == 6


def test_a_jump_needs_a_recorded_gap(workdir: Path) -> None:
    with JournalWriter(workdir) as writer:
        writer.append([event(1)], 0.0)
        with pytest.raises(SequenceError, match=r"skips 2\.\.4: record the missing range"):
            writer.append([event(5)], 0.0)
        with pytest.raises(SequenceError, match="does not start right after 1"):
            writer.note_gap(3, 4, "lost")
        writer.note_gap(2, 4, "publisher HWM drop")
        writer.append([event(5)], 0.0)
    reader = JournalReader(workdir)
    with pytest.raises(DataLossError, match=r"2\.\.4 were never journaled \(publisher HWM drop\)"):
        reader.read(0, 5)
    assert seqs(reader.read(0, 5, fail_on_data_loss=False)) == [1, 5]
    assert [(g.first, g.last, g.reason) for g in reader.gaps()] == [(2, 4, "publisher HWM drop")]
    coverage = reader.coverage(0, 5)
    assert coverage.lost and len(coverage.gaps) == 1 and not coverage.holes


def test_a_refused_batch_leaves_nothing_behind(workdir: Path) -> None:
    with JournalWriter(workdir) as writer:
        writer.append([event(1)], 0.0)
        with pytest.raises(SequenceError):
            writer.append([event(2), event(3), event(9)], 0.0)
        writer.append([event(2)], 0.0)
    assert seqs(JournalReader(workdir).read(0, 10)) == [1, 2]


def test_a_gap_flushes_what_came_before_it(workdir: Path) -> None:
    writer = JournalWriter(workdir, roll_seconds=3600)
    writer.append([event(1), event(2)], 0.0)
    writer.note_gap(3, 10, "bus retention")
    # A reader that sees the gap also sees everything before it.
    reader = JournalReader(workdir)
    assert reader.latest_sequence() == 10
    assert seqs(reader.read(0, 10, fail_on_data_loss=False)) == [1, 2]
    writer.close()


def test_only_one_writer_per_directory(workdir: Path) -> None:
    with JournalWriter(workdir), pytest.raises(JournalError, match="another writer"):
        JournalWriter(workdir)


# -- restart and crash leftovers ------------------------------------------------------------


def test_last_sequence_survives_a_restart(workdir: Path) -> None:
    writer = JournalWriter(workdir, roll_seconds=3600)
    writer.append(list(events(1, 100)), 0.0)
    writer.flush()
    writer.append(list(events(101, 5)), 0.0)  # buffered only: lost with the process
    assert (writer.last_sequence(), writer.durable_sequence()) == (105, 100)
    writer._lock_handle.close()  # what a crash does to the lock
    writer = JournalWriter(workdir)
    assert writer.last_sequence() == 100
    writer.append(list(events(101, 5)), 0.0)
    writer.note_gap(106, 110, "lost in transit")
    writer.close()
    assert JournalWriter(workdir).last_sequence() == 110


def test_origin_is_kept_when_the_first_events_are_not_sequence_1(workdir: Path) -> None:
    with JournalWriter(workdir) as writer:
        writer.append(list(events(1001, 10)), 0.0)
    reader = JournalReader(workdir)
    assert reader.origin() == 1000
    assert reader.start_offset() == 1000
    coverage = reader.coverage(0, 1010)
    assert coverage.unjournaled == (1, 1000)
    assert not coverage.lost  # never written here is not lost
    assert seqs(reader.read(0, 1010)) == list(range(1001, 1011))


def test_crash_leftovers_are_ignored_and_removed(workdir: Path) -> None:
    with JournalWriter(workdir) as writer:
        writer.append(list(events(1, 10)), 0.0)
    leftover = workdir / f".{segment_name(11, 20)}.tmp"
    leftover.write_bytes(b"half a parquet file")
    with open(workdir / GAPS_FILE, "ab") as handle:
        handle.write(b'{"first": 11, "la')  # torn line: the gap was never recorded
    reader = JournalReader(workdir)
    assert reader.latest_sequence() == 10
    assert [s.last for s in reader.segments()] == [10]
    writer = JournalWriter(workdir)
    assert not leftover.exists()
    assert writer.last_sequence() == 10
    assert (workdir / GAPS_FILE).read_bytes() == b""
    writer.append(list(events(11, 5)), 0.0)
    writer.close()
    assert seqs(JournalReader(workdir).read(0, 15)) == list(range(1, 16))


def test_an_interrupted_prune_is_finished_on_restart(workdir: Path) -> None:
    write_journal(workdir, 30, per_segment=10, per_append=10)
    state = json.loads((workdir / STATE_FILE).read_text())
    state["retained_after"] = 10  # recorded, but the crash came before the unlink
    (workdir / STATE_FILE).write_text(json.dumps(state))
    reader = JournalReader(workdir)
    assert reader.earliest_sequence() == 11
    assert reader.coverage(0, 30).removed == (1, 10)
    JournalWriter(workdir).close()
    assert not (workdir / segment_name(1, 10)).exists()


# -- retention --------------------------------------------------------------------------------


def test_prune_by_bytes_records_the_retained_start(workdir: Path) -> None:
    write_journal(workdir, 50, per_segment=10, per_append=10)
    size = os.path.getsize(workdir / segment_name(1, 10))
    with JournalWriter(workdir) as writer:
        removed = writer.prune(max_bytes=3 * size + size // 2)
    assert [(s.first, s.last) for s in removed] == [(1, 10), (11, 20)]
    reader = JournalReader(workdir)
    assert reader.retained_after() == 20
    assert reader.start_offset() == 20
    assert reader.earliest_sequence() == 21
    coverage = reader.coverage(5, 30)
    assert coverage.removed == (6, 20) and coverage.holes == ()
    with pytest.raises(DataLossError, match=r"sequences 6\.\.20 were removed by retention"):
        reader.read(5, 30)
    assert seqs(reader.read(5, 30, fail_on_data_loss=False)) == list(range(21, 31))
    assert seqs(reader.read(20, 30)) == list(range(21, 31))


def test_prune_by_age_keeps_young_segments_and_the_sequence(workdir: Path) -> None:
    write_journal(workdir, 30, per_segment=10, per_append=10)
    for name, age in ((segment_name(1, 10), 500), (segment_name(11, 20), 300)):
        os.utime(workdir / name, (1000.0 - age, 1000.0 - age))
    os.utime(workdir / segment_name(21, 30), (990.0, 990.0))
    with JournalWriter(workdir) as writer:
        assert [s.last for s in writer.prune(max_age_seconds=200, now=1000.0)] == [10, 20]
        assert [s.last for s in writer.prune(max_age_seconds=5, now=1000.0)] == [30]
        assert writer.last_sequence() == 30
    reader = JournalReader(workdir)
    assert reader.segments() == []
    assert reader.latest_sequence() == 30
    with JournalWriter(workdir) as writer:
        assert writer.last_sequence() == 30
        writer.append(list(events(31, 3)), 0.0)


def test_a_deleted_segment_is_an_unknown_hole(workdir: Path) -> None:
    write_journal(workdir, 30, per_segment=10, per_append=10)
    (workdir / segment_name(11, 20)).unlink()
    reader = JournalReader(workdir)
    assert reader.coverage(0, 30).holes == ((11, 20),)
    with pytest.raises(DataLossError, match=r"11\.\.20 are missing \(unknown hole\)"):
        reader.read(0, 30)


def test_a_segment_pruned_after_planning_is_reported(workdir: Path) -> None:
    write_journal(workdir, 30, per_segment=10, per_append=10)
    reader = JournalReader(workdir)
    planned = reader.coverage(0, 30).segments
    with JournalWriter(workdir) as writer:
        writer.prune(max_bytes=0)
    with pytest.raises(DataLossError, match="removed by retention"):
        reader.read(0, 30, segments=planned)
    assert reader.read(0, 30, segments=planned, fail_on_data_loss=False).num_rows == 0


# -- reading ------------------------------------------------------------------------------------


def test_reader_sees_new_segments_at_once(workdir: Path) -> None:
    reader = JournalReader(workdir)
    writer = JournalWriter(workdir, roll_seconds=3600)
    assert reader.latest_sequence() == 0
    for first in range(1, 200, 10):  # same filesystem tick, over and over
        writer.append(list(events(first, 10)), 0.0)
        writer.flush()
        assert reader.latest_sequence() == first + 9
    writer.close()


def test_ranges_and_topic_prefixes(workdir: Path) -> None:
    write_journal(workdir, 1000, per_segment=100, per_append=50)
    reader = JournalReader(workdir)
    assert seqs(reader.read(150, 420)) == list(range(151, 421))
    table = reader.read(0, 1000, ["/orders/", "/users/login"])
    expected = expected_counts(1, 1000)
    wanted = sum(n for t, n in expected.items() if t.startswith(("/orders/", "/users/login")))
    assert table.num_rows == wanted
    assert set(table.column("topic").to_pylist()) == {
        t for t in expected if t.startswith(("/orders/", "/users/login"))
    }
    assert reader.read(1000, 1000).num_rows == 0


def test_reader_pickles_without_its_cache(workdir: Path) -> None:
    write_journal(workdir, 10)
    reader = JournalReader(workdir)
    reader.latest_sequence()
    clone = pickle.loads(pickle.dumps(reader))
    assert clone.latest_sequence() == 10


# -- planning and options --------------------------------------------------------------------


def test_split_range_covers_the_range_once(workdir: Path) -> None:
    write_journal(workdir, 1000, per_segment=100, per_append=100)
    coverage = JournalReader(workdir).coverage(37, 1000)
    parts = split_range(coverage, 37, 1000, min_partitions=4)
    assert len(parts) == 4
    assert parts[0].start == 37 and parts[-1].end == 1000
    assert all(a.end == b.start for a, b in itertools.pairwise(parts))
    # Cuts land on segment boundaries when one is near.
    assert all(p.end % 100 == 0 for p in parts)
    many = split_range(coverage, 37, 1000, min_partitions=1, partition_rows=100)
    assert len(many) == 10
    assert split_range(JournalReader(workdir).coverage(5, 7), 5, 7, min_partitions=9)[-1].end == 7


def test_options_follow_kafka_names_and_refuse_nonsense() -> None:
    parsed = SourceOptions.parse(
        {
            "path": "/j",
            "subscribe": "/orders/, /users/",
            "startingOffsets": '{"seq": 5}',
            "maxOffsetsPerTrigger": "100",
            "failOnDataLoss": "false",
            "minPartitions": "3",
        },
        streaming=True,
    )
    assert parsed.prefixes == ("/orders/", "/users/")
    assert parsed.starting == 5 and parsed.max_offsets_per_trigger == 100
    assert not parsed.fail_on_data_loss and parsed.min_partitions == 3
    assert SourceOptions.parse({"path": "/j"}, streaming=True).starting == "latest"
    assert SourceOptions.parse({"path": "/j"}, streaming=False).starting == "earliest"
    bad = [
        ({}, True, "needs option"),
        ({"path": "/j", "startingOffsets": "{seq: 1}"}, True, "startingOffsets must be"),
        ({"path": "/j", "endingOffsets": "latest"}, True, "batch queries only"),
        ({"path": "/j", "startingOffsets": "latest"}, False, "streaming queries only"),
        ({"path": "/j", "maxOffsetsPerTrigger": "0"}, True, "positive integer"),
        ({"path": "/j", "failOnDataLoss": "maybe"}, True, "true or false"),
    ]
    for options, streaming, message in bad:
        with pytest.raises(OptionError, match=message):
            SourceOptions.parse(options, streaming=streaming)


def test_importing_bus_spark_loads_neither_pyspark_nor_the_reactor() -> None:
    code = (
        "import sys, bus.spark, bus.spark.journal;"
        "bad = [m for m in ('pyspark', 'twisted.internet.reactor') if m in sys.modules];"
        "sys.exit(str(bad) if bad else 0)"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def test_synthetic_events_are_deterministic() -> None:
    assert make_event(7) == make_event(7)
    assert sum(expected_counts(1, 700).values()) == 700
