"""The SQLite log's batches (bus/eventbus/logbatch.py): what a batch packs is msgpack, compiled
or not; rows cut a commit into bounded batches and read back every event under its sequence.
The log built on them is tested in test_eventbus_store.py."""

from __future__ import annotations

import sqlite3
from typing import Any

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bus.eventbus import logbatch
from bus.util import sqlitewal

field = st.binary(max_size=300) | st.sampled_from([b"", b"x" * 255, b"y" * 256, b"z" * 70_000])
event = st.tuples(field, field, field, field, field)


@settings(max_examples=200, deadline=None)
@given(
    st.lists(event, max_size=40)
    | st.lists(st.just((b"a", b"", b"b", b"", b"c")), min_size=15, max_size=17)
)
def test_packed_events_are_msgpack_byte_for_byte_compiled_or_not(events: list[Any]) -> None:
    expected = msgpack.Packer(use_bin_type=True).pack(events)
    assert logbatch._pack(events) == expected
    saved = sqlitewal.native_rows
    try:
        sqlitewal.native_rows = None
        assert logbatch._pack(events) == expected
    finally:
        sqlitewal.native_rows = saved
    assert logbatch.unpack(expected) == tuple(events)


def test_the_compiled_packer_counts_a_long_list_and_leaves_what_it_cannot_pack_to_msgpack() -> None:
    native = sqlitewal.native_rows
    if native is None:
        pytest.skip("the compiled row builder is not built")
    many = [(b"t", b"p")] * 70_000  # a list header of 32 bits
    assert native.pack_arrays(many) == msgpack.packb(many, use_bin_type=True)
    for odd in ([(bytearray(b"t"),)], [("text",)], [5], [[b"a", 1]]):
        with pytest.raises(TypeError):
            native.pack_arrays(odd)
    assert logbatch._pack([(bytearray(b"t"), b"p")]) == msgpack.packb(
        [(b"t", b"p")], use_bin_type=True
    )


def _without_native(call: Any, *args: Any) -> Any:
    saved = sqlitewal.native_rows
    try:
        sqlitewal.native_rows = None
        return call(*args)
    finally:
        sqlitewal.native_rows = saved


text_field = st.text(max_size=40) | st.sampled_from(["", "é" * 20, "x" * 40])


@settings(max_examples=300, deadline=None)
@given(
    st.lists(event, max_size=40)
    | st.lists(st.just((b"a", b"", b"b", b"", b"c")), min_size=15, max_size=17)
    | st.lists(st.tuples(field, text_field, field) | st.tuples(text_field, field), max_size=20),
    st.data(),
)
def test_topics_and_a_batch_kept_in_part_read_back_as_msgpack_reads_them(
    events: list[Any], data: st.DataObject
) -> None:
    """What compaction reads of a batch (its topics) and writes of it again (the events it
    keeps): compiled, the same as msgpack's way, for events of bin fields, of 16 or more, of
    any length, and of str fields (which the compiled topics leave to msgpack)."""
    packed = msgpack.packb(events, use_bin_type=True)
    marks = bytes(
        data.draw(st.lists(st.integers(0, 1), min_size=len(events), max_size=len(events)))
    )
    expected_topics = [fields[0] for fields in msgpack.unpackb(packed, use_list=False)]
    kept = tuple(fields for fields, mark in zip(events, marks, strict=True) if mark)
    assert list(logbatch.topics(packed)) == expected_topics
    assert list(_without_native(logbatch.topics, packed)) == expected_topics
    for way in (logbatch._kept, lambda *args: _without_native(logbatch._kept, *args)):
        assert msgpack.unpackb(way(packed, marks), use_list=False) == tuple(
            tuple(fields) for fields in kept
        )


@settings(max_examples=500, deadline=None)
@given(st.binary(max_size=200), st.binary(max_size=20))
def test_the_compiled_batch_reader_refuses_what_is_not_a_batch_and_never_reads_past_it(
    garbage: bytes, marks: bytes
) -> None:
    """A damaged blob, cut short or of another form, is refused with ValueError (the caller
    then reads it with msgpack, which says what is wrong): never a crash, never bytes from
    past its end."""
    native = sqlitewal.native_rows
    if native is None:
        pytest.skip("the compiled row builder is not built")
    whole = msgpack.packb([(b"/t", b"p", b"x" * 300)] * 3, use_bin_type=True)
    for blob in (garbage, whole[: len(garbage) % len(whole)], whole + garbage[:1]):
        try:
            listed = msgpack.unpackb(blob, use_list=False)
        except ValueError:  # a str that is not UTF-8, for one: the helper may copy it
            listed = None
        try:
            found = native.topics(blob)
        except ValueError:
            pass
        else:
            if listed is not None:
                assert found == [f[0] for f in listed]
        try:
            copied = native.keep(blob, marks)
        except ValueError:
            pass
        else:
            if listed is None:
                continue
            assert len(marks) == len(listed)
            assert msgpack.unpackb(copied, use_list=False) == tuple(
                item for item, mark in zip(listed, marks, strict=True) if mark
            )


def stored(rows: list[logbatch.Stored]) -> list[tuple[int, Any]]:
    """Every event of ``rows`` under its sequence, as read back."""
    return [
        (sequence, fields)
        for _, first, last, _, _, seqs, packed in rows
        for sequence, fields in logbatch.events_of(first, last, seqs, packed)
    ]


@settings(max_examples=100, deadline=None)
@given(
    st.integers(1, 2**40),
    st.lists(st.tuples(st.integers(1, 3), st.integers(0, 40_000)), min_size=1, max_size=600),
)
def test_rows_cut_a_commit_into_bounded_batches_and_keep_each_event_s_sequence(
    first: int, plan: list[tuple[int, int]]
) -> None:
    fields = [
        (b"/t/%d" % i, b"p", b"ts", b"u%d" % i, b"d" * size) for i, (_, size) in enumerate(plan)
    ]
    numbers, sequence = [], first
    for gap, _ in plan:
        numbers.append(sequence)
        sequence += gap
    for rows, expected in (
        (logbatch.consecutive_rows(first, fields, 5.0), list(enumerate(fields, first))),
        (logbatch.numbered_rows(list(zip(numbers, fields, strict=True)), 5.0),
         list(zip(numbers, fields, strict=True))),
    ):  # fmt: skip
        assert stored(rows) == expected
        for batch, first_held, last, held, received, seqs, packed in rows:
            assert batch == first_held and received == 5.0
            assert (
                held == len(logbatch.sequences_of(first_held, last, seqs)) <= logbatch.BATCH_EVENTS
            )
            assert held == 1 or len(packed) <= logbatch.BATCH_BYTES
            assert (seqs is None) == (last - first_held + 1 == held)
        assert [row[0] for row in rows] == sorted({row[0] for row in rows})


def test_a_batch_rewritten_keeps_its_id_and_the_events_it_keeps() -> None:
    db = sqlite3.connect(":memory:", isolation_level=None)
    db.executescript(logbatch.SCHEMA)
    fields = [(b"/t/%d" % i, b"p", b"ts", b"u", b"d") for i in range(6)]
    db.executemany(logbatch.INSERT, logbatch.consecutive_rows(10, fields, 1.0))
    row = db.execute(f"SELECT {logbatch.REWRITTEN} FROM batches").fetchone()
    gone = logbatch.rewrite(db, row, lambda sequence: sequence % 2 == 0)
    assert gone == [(11, b"/t/1"), (13, b"/t/3"), (15, b"/t/5")]
    assert db.execute("SELECT id, first, last, held FROM batches").fetchall() == [(10, 10, 14, 3)]
    assert [r[0] for r in logbatch.read_rows(db, 0, None, (), 100)] == [10, 12, 14]
    assert [r[0] for r in logbatch.read_rows(db, 10, 14, (b"/t/4",), 100)] == [14]
    row = db.execute(f"SELECT {logbatch.REWRITTEN} FROM batches").fetchone()
    assert len(logbatch.rewrite(db, row, lambda sequence: False)) == 3
    assert db.execute("SELECT COUNT(*) FROM batches").fetchone() == (0,)


def test_a_read_under_prefixes_stops_at_its_scan_bound_and_says_where() -> None:
    db = sqlite3.connect(":memory:", isolation_level=None)
    db.executescript(logbatch.SCHEMA)
    fields = [
        (b"/rare/" if i % 700 == 0 else b"/common/", b"p", b"ts", b"u", b"d") for i in range(5000)
    ]
    for start in range(0, 5000, 100):  # batches of 100
        db.executemany(
            logbatch.INSERT, logbatch.consecutive_rows(start + 1, fields[start : start + 100], 1.0)
        )
    found: list[int] = []
    after, reads = 0, 0
    while True:
        rows = logbatch.read_rows(db, after, None, (b"/rare/",), 500, scan=1000)
        reads += 1
        found += [row[0] for row in rows]
        if rows.scanned is None:
            break
        assert rows.scanned > after and (not rows or rows.scanned >= rows[-1][0])
        after = rows.scanned
    assert found == [i + 1 for i in range(5000) if i % 700 == 0]
    assert reads == 5  # 1,000 events a read, whole batches
    everything = logbatch.read_rows(db, 0, None, (b"/rare/",), 500)
    assert [row[0] for row in everything] == found and everything.scanned is None
    unfiltered = logbatch.read_rows(db, 0, None, (), 3000, scan=1000)
    assert len(unfiltered) == 3000 and unfiltered.scanned is None  # the bound is for prefixes
