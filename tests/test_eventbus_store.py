"""EventStore (SQLite event log): appends, prefix reads, durability of the sequence, retention,
and a hypothesis state machine that compares the store with a plain in-memory model."""

from __future__ import annotations

import shutil
import sqlite3
import tempfile
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import pytest_twisted
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    invariant,
    rule,
    run_state_machine_as_test,
)

from bus.eventbus.codec import Event
from bus.eventbus.logbatch import BATCH_BYTES, BATCH_EVENTS
from bus.eventbus.store import (
    DB_NAME,
    READ_BETWEEN_CHECKS,
    REGION,
    EventStore,
    LogExport,
    Retention,
    prefix_upper_bound,
)
from bus.eventbus.upkeep import LogUpkeep, RetentionPass


def event(topic: bytes, n: int = 0, sequence: int = 0) -> Event:
    """An event as the collector hands it over (its own sequence is ignored by the store)."""
    return Event(topic, sequence, b"producer", b"2026-11-21T10:00:00.000Z", b"%036d" % n, b"\x01")


def topics_of(events: list[Event]) -> list[bytes]:
    return [e.topic for e in events]


def seqs(events: list[Event]) -> list[int]:
    return [e.sequence for e in events]


@pytest.fixture
def store(tmp_path: Path) -> Iterator[EventStore]:
    opened = EventStore(tmp_path / "store")
    yield opened
    opened.close()


def fill(store: EventStore, topics: list[bytes], received: float = 1000.0) -> list[Event]:
    return store.append([event(t, i) for i, t in enumerate(topics)], received)


# -- prefix_upper_bound --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("prefix", "upper"),
    [
        (b"a", b"b"),
        (b"/a/", b"/a0"),
        (b"\x00", b"\x01"),
        (b"a\xfe", b"a\xff"),
        (b"a\xff", b"b"),
        (b"ab\xff\xff", b"ac"),
        (b"\xfe\xff", b"\xff"),
        (b"\xff", None),
        (b"\xff\xff\xff", None),
        (b"", None),
    ],
)
def test_prefix_upper_bound(prefix: bytes, upper: bytes | None) -> None:
    assert prefix_upper_bound(prefix) == upper


small_bytes = st.binary(max_size=5) | st.lists(
    st.sampled_from([b"\x00", b"a", b"\xfe", b"\xff"]), max_size=5
).map(b"".join)


@settings(max_examples=500, deadline=None)
@given(prefix=small_bytes, topic=small_bytes)
def test_prefix_upper_bound_range_is_exactly_startswith(prefix: bytes, topic: bytes) -> None:
    upper = prefix_upper_bound(prefix)
    in_range = prefix <= topic and (upper is None or topic < upper)
    assert in_range == topic.startswith(prefix)


# -- append and read ------------------------------------------------------------------------------


def test_new_store_is_empty(store: EventStore) -> None:
    assert store.last_sequence == 0
    assert store.count() == 0
    assert store.first_sequence() is None
    assert store.read(0) == []
    assert store.path == store.directory / DB_NAME
    assert store.path.exists()


def test_append_assigns_consecutive_sequences_ignoring_the_events_own(store: EventStore) -> None:
    first = store.append([event(b"/a/", 1, sequence=99), event(b"/b/", 2, sequence=7)], 1.0)
    assert seqs(first) == [1, 2]
    assert first[0] == event(b"/a/", 1, sequence=1)
    second = store.append([event(b"/c/", 3)], 2.0)
    assert seqs(second) == [3]
    assert store.last_sequence == 3
    assert store.count() == 3
    assert store.first_sequence() == 1
    assert store.read(0) == first + second  # every field is stored as given


@pytest.mark.parametrize("sizes", [[31, 32, 33], [64, 1, 100], [BATCH_EVENTS * 3 + 5]])
def test_batches_of_every_size_are_stored_event_for_event(
    store: EventStore, sizes: list[int]
) -> None:
    # A commit of more than a batch's events goes in several batches: every event stays itself.
    expected = []
    for size in sizes:
        fields = [
            (b"/t/%d/" % n, b"p%d" % n, b"ts%d" % n, b"u%d" % n, bytes([n % 256]) * (n % 7))
            for n in range(len(expected), len(expected) + size)
        ]
        first = store.append_fields(fields, float(size))
        assert first == len(expected) + 1
        expected += [Event(t, first + i, p, ts, u, d) for i, (t, p, ts, u, d) in enumerate(fields)]
    copied = [
        (len(expected) + 10 + 2 * i, (b"/c/", b"p", b"ts", b"u%d" % i, b"")) for i in range(70)
    ]
    store.append_at(copied, 9.0)
    expected += [Event(f[0], seq, *f[1:]) for seq, f in copied]
    assert store.read(0) == expected
    assert store.last_sequence == expected[-1].sequence


def test_append_nothing_changes_nothing(store: EventStore) -> None:
    assert store.append([], 1.0) == []
    assert store.last_sequence == 0
    fill(store, [b"/a/"])
    assert store.append([], 2.0) == []
    assert store.last_sequence == 1


def test_append_fields_returns_the_first_new_sequence(store: EventStore) -> None:
    fields = [
        (b"/a/", b"p", b"2026-01-01", b"u1", b"\x01"),
        (b"/b/", b"q", b"2026-01-02", b"u2", b"\x02"),
    ]
    assert store.append_fields(fields, 1.0) == 1
    assert store.append_fields(fields[:1], 2.0) == 3
    assert store.append_fields([], 3.0) == 4  # nothing committed: the next one would be 4
    assert store.last_sequence == 3
    assert store.read(0) == [
        Event(b"/a/", 1, b"p", b"2026-01-01", b"u1", b"\x01"),
        Event(b"/b/", 2, b"q", b"2026-01-02", b"u2", b"\x02"),
        Event(b"/a/", 3, b"p", b"2026-01-01", b"u1", b"\x01"),
    ]


def test_read_after_upto_and_limit(store: EventStore) -> None:
    fill(store, [b"/t/%d/" % i for i in range(10)])
    assert seqs(store.read(0)) == list(range(1, 11))
    assert seqs(store.read(4)) == list(range(5, 11))
    assert seqs(store.read(4, upto=7)) == [5, 6, 7]
    assert seqs(store.read(4, upto=4)) == []
    assert seqs(store.read(7, upto=3)) == []
    assert seqs(store.read(10)) == []
    assert seqs(store.read(2, limit=3)) == [3, 4, 5]
    assert seqs(store.read(2, upto=4, limit=3)) == [3, 4]
    assert seqs(store.read(0, limit=0)) == []
    assert seqs(store.read(-5, upto=1)) == [1]


def test_read_by_prefix_is_a_plain_byte_prefix(store: EventStore) -> None:
    fill(store, [b"/a/", b"/a/b/", b"/ab/", b"/b/", b"/a", b"/a/\xff", b"/a0"])
    assert topics_of(store.read(0, prefixes=[b"/a/"])) == [b"/a/", b"/a/b/", b"/a/\xff"]
    assert topics_of(store.read(0, prefixes=[b"/a"])) == [
        b"/a/",
        b"/a/b/",
        b"/ab/",
        b"/a",
        b"/a/\xff",
        b"/a0",
    ]
    assert topics_of(store.read(0, prefixes=[b"/a/b/"])) == [b"/a/b/"]
    assert store.read(0, prefixes=[b"/z/"]) == []
    assert topics_of(store.read(0, prefixes=[b"/a/b/c/"])) == []


def test_read_prefixes_with_0xff_bytes(store: EventStore) -> None:
    topics = [
        b"\xff",
        b"\xff\x00",
        b"\xfe\xff",
        b"\xff\xff\xff",
        b"a\xff",
        b"a\xff\xff",
        b"b",
        b"a\xfe",
    ]
    fill(store, topics)
    assert topics_of(store.read(0, prefixes=[b"\xff"])) == [b"\xff", b"\xff\x00", b"\xff\xff\xff"]
    assert topics_of(store.read(0, prefixes=[b"\xff\xff"])) == [b"\xff\xff\xff"]
    assert topics_of(store.read(0, prefixes=[b"a\xff"])) == [b"a\xff", b"a\xff\xff"]
    assert topics_of(store.read(0, prefixes=[b"\xfe"])) == [b"\xfe\xff"]
    assert topics_of(store.read(0, prefixes=[b"a"])) == [b"a\xff", b"a\xff\xff", b"a\xfe"]


def test_read_several_prefixes_is_a_union_in_sequence_order(store: EventStore) -> None:
    fill(store, [b"/a/1", b"/b/1", b"/c/1", b"/a/2", b"/b/2", b"/c/2"])
    got = store.read(0, prefixes=[b"/c/", b"/a/"])
    assert seqs(got) == [1, 3, 4, 6]
    # overlapping prefixes do not duplicate events
    assert seqs(store.read(0, prefixes=[b"/a/", b"/a/1", b"/"])) == [1, 2, 3, 4, 5, 6]
    assert seqs(store.read(0, prefixes=[b"/a/", b"/a/"])) == [1, 4]
    # any iterable will do
    assert seqs(store.read(0, prefixes=(p for p in [b"/b/"]))) == [2, 5]
    assert seqs(store.read(2, upto=5, prefixes=[b"/a/", b"/b/"], limit=1)) == [4]


def test_empty_prefix_means_all_topics(store: EventStore) -> None:
    fill(store, [b"/a/", b"\xff", b"\x00"])
    assert seqs(store.read(0, prefixes=[])) == [1, 2, 3]
    assert seqs(store.read(0, prefixes=[b""])) == [1, 2, 3]
    assert seqs(store.read(0, prefixes=[b"/a/", b""])) == [1, 2, 3]


# -- durability of the log and the sequence -----------------------------------------------------------


def test_events_sequence_and_store_id_survive_reopen(tmp_path: Path) -> None:
    first = EventStore(tmp_path)
    stored = fill(first, [b"/a/", b"/b/", b"/c/"])
    store_id = first.store_id
    first.close()
    first.close()  # idempotent

    second = EventStore(tmp_path)
    try:
        assert second.store_id == store_id
        assert second.last_sequence == 3
        assert second.read(0) == stored
        assert seqs(fill(second, [b"/d/"])) == [4]
    finally:
        second.close()


def test_store_id_is_a_uuid_and_differs_between_stores(tmp_path: Path) -> None:
    one, two = EventStore(tmp_path / "one"), EventStore(tmp_path / "two")
    try:
        assert str(uuid.UUID(one.store_id)) == one.store_id
        assert one.store_id != two.store_id
    finally:
        one.close()
        two.close()


@pytest.mark.parametrize("durability", ["normal", "full"])
def test_durability_modes_store_and_reopen(tmp_path: Path, durability: str) -> None:
    store = EventStore(tmp_path, durability=durability)  # type: ignore[arg-type]
    fill(store, [b"/a/", b"/b/"])
    store.close()
    again = EventStore(tmp_path, durability=durability)  # type: ignore[arg-type]
    try:
        assert seqs(again.read(0)) == [1, 2]
    finally:
        again.close()


def test_high_water_survives_retention_deleting_everything(tmp_path: Path) -> None:
    store = EventStore(tmp_path)
    fill(store, [b"/a/"] * 5)
    assert trim_fully(store, 0) == 5
    assert store.count() == 0
    assert store.first_sequence() is None
    assert store.last_sequence == 5
    store.close()

    store = EventStore(tmp_path)
    try:
        assert store.last_sequence == 5
        assert seqs(fill(store, [b"/b/"])) == [6]
        # and again, after a second round of deleting everything
        assert store.expire_older_than(cutoff=10_000.0) == 1
        store.close()
        store = EventStore(tmp_path)
        assert store.last_sequence == 6
        assert seqs(fill(store, [b"/c/"])) == [7]
    finally:
        store.close()


def test_high_water_after_expiry_of_everything(tmp_path: Path) -> None:
    store = EventStore(tmp_path)
    fill(store, [b"/a/", b"/b/", b"/c/"], received=10.0)
    assert store.expire_older_than(cutoff=11.0) == 3
    store.close()
    store = EventStore(tmp_path)
    try:
        assert store.last_sequence == 3
        assert store.read(0) == []
    finally:
        store.close()


# -- retention -------------------------------------------------------------------------------------


def test_expire_older_than_deletes_by_receipt_time(store: EventStore) -> None:
    fill(store, [b"/a/", b"/b/"], received=100.0)
    fill(store, [b"/c/"], received=200.0)
    fill(store, [b"/d/"], received=300.0)
    assert store.expire_older_than(cutoff=100.0) == 0  # strictly older only
    assert store.expire_older_than(cutoff=250.0) == 3
    assert topics_of(store.read(0)) == [b"/d/"]
    assert store.expire_older_than(cutoff=250.0) == 0
    assert store.last_sequence == 4


def test_expire_older_than_works_in_chunks(store: EventStore) -> None:
    for i in range(7):
        fill(store, [b"/t/"], received=float(i))
    assert store.expire_older_than(cutoff=5.0, chunk=2) == 2
    assert seqs(store.read(0)) == [3, 4, 5, 6, 7]
    assert store.expire_older_than(cutoff=5.0, chunk=2) == 2
    assert store.expire_older_than(cutoff=5.0, chunk=2) == 1  # only seq 5 (received 4.0) left
    assert store.expire_older_than(cutoff=5.0, chunk=2) == 0
    assert seqs(store.read(0)) == [6, 7]


def test_receipt_times_never_go_backwards(store: EventStore) -> None:
    fill(store, [b"/a/"], received=300.0)
    fill(store, [b"/b/"], received=100.0)  # the clock stepped back: stored as 300
    assert store.expire_older_than(cutoff=250.0) == 0
    assert store.expire_older_than(cutoff=301.0) == 2


def test_receipt_times_never_go_backwards_across_reopen(tmp_path: Path) -> None:
    store = EventStore(tmp_path)
    fill(store, [b"/before-restart/"], received=1000.0)
    store.close()
    store = EventStore(tmp_path)
    try:
        fill(store, [b"/after-restart/"], received=500.0)  # the clock stepped back meanwhile
        store.expire_older_than(cutoff=800.0)
        # The event received at 1000 is not older than 800 and must be kept.
        assert b"/before-restart/" in topics_of(store.read(0))
    finally:
        store.close()


def test_trim_to_count_counts_the_log_first_then_keeps_the_newest(store: EventStore) -> None:
    for i in range(10):  # a batch each
        fill(store, [b"/t/%d" % i])
    # The first steps count the events held, the batches of 8 sequences per event of the
    # chunk, deleting nothing: a step's cost follows its chunk, not the size of the log.
    assert store.trim_to_count(3, chunk=1) == (0, False)  # sequences 1..8
    assert seqs(store.read(0)) == list(range(1, 11))
    assert store.trim_to_count(3, chunk=1) == (0, False)  # 9..10: 10 events held
    assert store.trim_to_count(20) == (0, True)
    assert store.trim_to_count(10) == (0, True)
    assert store.trim_to_count(3, chunk=2) == (2, False)
    assert seqs(store.read(0)) == list(range(3, 11))
    assert store.trim_to_count(3) == (5, True)
    assert seqs(store.read(0)) == [8, 9, 10]
    assert store.trim_to_count(3) == (0, True)
    assert store.last_sequence == 10 and store.count() == 3


def test_trim_to_count_keeps_max_count_events_across_gaps_in_the_sequence(
    store: EventStore,
) -> None:
    fill(store, [b"a", b"b", b"a", b"b"])  # 1..4
    store.skip_to(100)  # an async pair's new active steps over what it may have missed
    fill(store, [b"c", b"a"])  # 101, 102
    assert compact_fully(store) == 3  # 1, 3 (a) and 2 (b): holes below the newest
    assert seqs(store.read(0)) == [4, 101, 102]
    assert trim_fully(store, 2) == 1
    assert seqs(store.read(0)) == [101, 102]
    fill(store, [b"d", b"e"])  # counted as they come: 4 held
    assert trim_fully(store, 2) == 2
    assert seqs(store.read(0)) == [103, 104] and store.count() == 2


def test_count_retention_counts_again_when_the_log_holds_fewer_than_it_counted(
    store: EventStore,
) -> None:
    fill(store, [b"/t/%d" % i for i in range(10)])
    assert trim_fully(store, 8) == 2
    # Something else than the store (an operator's sqlite3 shell) deletes events.
    store._db.execute("DELETE FROM batches")
    fill(store, [b"/t/new"] * 3)
    assert trim_fully(store, 2) == 1  # counted 11 held, found 3: counted again
    assert seqs(store.read(0)) == [12, 13] and store.count() == 2


def test_compact_step_keeps_the_latest_event_per_topic(store: EventStore) -> None:
    fill(store, [b"a", b"b", b"a", b"c", b"b", b"a"])
    assert store.compact_step() == (0, False)  # the first step reads what the log holds
    assert store.compact_step() == (3, True)
    assert [(e.topic, e.sequence) for e in store.read(0)] == [(b"c", 4), (b"b", 5), (b"a", 6)]
    assert store.last_sequence == 6
    # a second pass over a compacted log deletes nothing
    assert store.compact_step() == (0, True)


def test_compact_step_in_chunks_reads_three_events_a_chunk_then_deletes_a_chunk(
    store: EventStore,
) -> None:
    fill(store, [b"a", b"b", b"a", b"c", b"b", b"a"])
    assert store.compact_step(chunk=1) == (0, False)  # reads 1..3: 1 (a) superseded
    assert store.compact_step(chunk=1) == (0, False)  # reads 4..6: 2 (b) and 3 (a) too
    assert seqs(store.read(0)) == [1, 2, 3, 4, 5, 6]
    assert store.compact_step(chunk=1) == (1, False)
    assert store.compact_step(chunk=2) == (2, True)
    assert seqs(store.read(0)) == [4, 5, 6]


def test_count_and_age_steps_delete_in_parts_and_stop_after_one_out_of_time(
    store: EventStore,
) -> None:
    """An age or count step deletes its chunk in parts, each committed: a sixth of the
    chunk, 128 events at least, ending where a batch ends while that stays within the chunk.
    Out of time, a step stops after its first part; the next one goes on from there."""
    for n in range(10):
        fill(store, [b"/t/"] * 50, received=100.0 + n)  # 1..500, batches of 50
    assert store.trim_to_count(100, chunk=800) == (0, False)  # counts
    # A part of 133 (800 / 6), rounded up to whole batches: 150; then out of time.
    assert store.trim_to_count(100, chunk=800, out_of_time=lambda: True) == (150, False)
    assert store.first_sequence() == 151
    # Parts of 128 and 2: rounded up, the first would pass the chunk (130), so both cut a batch.
    assert store.expire_older_than(cutoff=200.0, chunk=130) == 130
    assert seqs(store.read(0, limit=1000)) == list(range(281, 501))
    assert store.trim_to_count(100, chunk=800) == (120, True)
    assert seqs(store.read(0, limit=1000)) == list(range(401, 501))
    assert store.last_sequence == 500


def test_counting_after_an_open_goes_in_parts_too(tmp_path: Path) -> None:
    store = EventStore(tmp_path)
    for _ in range(10):
        fill(store, [b"/t/"] * 50)
    store.close()
    store = EventStore(tmp_path)
    try:
        # 800 sequences a step, from the oldest batch's last (50) in parts of 133: the
        # budget spent, four steps count 51..500 a part each, then the next one deletes.
        out = [store.trim_to_count(400, chunk=100, out_of_time=lambda: True) for _ in range(4)]
        assert out == [(0, False)] * 4
        assert store.trim_to_count(400, chunk=100, out_of_time=lambda: True) == (100, True)
        assert store.count() == 400 and store.first_sequence() == 101
    finally:
        store.close()


def test_a_compaction_step_out_of_time_stops_after_a_region_and_the_next_goes_on(
    store: EventStore,
) -> None:
    """A step whose budget is spent (the machine slow right now) stops at the end of the first
    region of the log it deletes from, whatever its chunk; what is left waits for the next."""
    topics = [b"a", b"b"] * (3 * REGION // 2)  # sequences 1..768: regions 0, 1, 2 and 3
    fill(store, topics)
    assert store.compact_step(chunk=10_000) == (0, False)  # reads the log
    first = store.compact_step(chunk=10_000, out_of_time=lambda: True)
    assert first == (REGION - 1, False)  # 1..255 (region 0): all but 767 and 768 superseded
    assert seqs(store.read(0, limit=10_000))[:2] == [REGION, REGION + 1]
    assert store.compact_step(chunk=10_000, out_of_time=lambda: True) == (REGION, False)
    assert store.compact_step(chunk=10_000) == (len(topics) - 2 - 2 * REGION + 1, True)
    assert seqs(store.read(0)) == [len(topics) - 1, len(topics)]


@contextmanager
def write_failing(failing: int | None) -> Iterator[None]:
    """The store's ``failing``-th transaction from now (0: the first; None: none) fails
    before its commit, as a disk that fills up meanwhile: it is rolled back."""
    import bus.eventbus.store as store_module

    write = store_module._write
    writes = iter(range(1000))

    def fails(db: sqlite3.Connection, statements: Any) -> None:
        def then_fail() -> None:
            statements()
            raise sqlite3.OperationalError("database or disk is full")

        write(db, then_fail if next(writes) == failing else statements)

    store_module._write = fails  # type: ignore[assignment]
    try:
        yield
    finally:
        store_module._write = write


def test_a_compaction_step_commits_part_by_part_and_a_failed_part_loses_nothing(
    store: EventStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With a budget, a step deletes in parts of a sixth of its chunk (128 events at least),
    each its own transaction, ending after the batch that fills it, where a batch deleted
    whole counts a quarter of its events: a part that fails is rolled back alone, the step
    ends with what the parts before it deleted, and what it took and did not delete is
    deleted by later steps. A first part that fails raises, having deleted nothing, and
    loses nothing either. (Batch by batch: runs of superseded events are the next test's.)"""
    import bus.eventbus.store as store_module
    from bus.errors import StorageError

    monkeypatch.setattr(store_module, "RUN_EVENTS", 10**9)
    # A topic's one event at 1, then pairs from 2 (2..1537): each region of the log holds
    # whole batches (the region 0 to 255, 256 to 511, ...).
    fill(store, [b"x"])
    for _ in range(3 * REGION):
        fill(store, [b"a", b"b"])
    assert store.compact_step(chunk=10_000) == (0, False)  # reads the log
    never = lambda: False  # noqa: E731
    with write_failing(1):  # the first part (2..513: 4 x 128) is committed, the second fails
        assert store.compact_step(chunk=6 * 128, out_of_time=never) == (512, False)
    assert seqs(store.read(0, limit=10_000))[:3] == [1, 514, 515]
    with write_failing(0), pytest.raises(StorageError):
        store.compact_step(chunk=6 * 128, out_of_time=never)
    assert store.count() == 1 + 6 * REGION - 512
    # Out of time at once: it stops at the end of the region (514..767), then the rest.
    assert store.compact_step(chunk=6 * 128, out_of_time=lambda: True) == (254, False)
    assert store.compact_step(chunk=10_000) == (6 * REGION - 2 - 512 - 254, True)
    assert seqs(store.read(0)) == [1, 6 * REGION, 6 * REGION + 1]


def test_a_run_of_superseded_events_goes_unread_and_a_part_ends_after_the_run_that_fills_it(
    store: EventStore,
) -> None:
    """A region whose superseded events are next to each other (here each region's pairs, but
    the first's batch of one) is deleted by range, its batches unread, and counts as whole
    batches do: a part ends after the run that fills it (three regions of 256 whole events
    here, 192 of its 128), committed; a part that fails after it loses nothing."""
    from bus.errors import StorageError

    fill(store, [b"x"])
    for _ in range(3 * REGION):
        fill(store, [b"a", b"b"])
    assert store.compact_step(chunk=10_000) == (0, False)  # reads the log
    read: list[str] = []
    store._db.set_trace_callback(read.append)
    with write_failing(1):  # the first part (2..767: three runs) is committed, the next fails
        assert store.compact_step(chunk=6 * 128, out_of_time=lambda: False) == (766, False)
    store._db.set_trace_callback(None)
    # Only the batches at a run's ends are read (the first's is the one before 2, and none
    # goes past a run), never a region's batches one by one: but for the last two the chunk
    # took (768 and 769, too few to be a run).
    listed = [line for line in read if "ORDER BY id" in line and "DESC" not in line]
    assert len(listed) == 1 and "id <= 769" in listed[0], listed
    assert seqs(store.read(0, limit=3)) == [1, 768, 769]
    with write_failing(0), pytest.raises(StorageError):
        store.compact_step(chunk=6 * 128, out_of_time=lambda: False)
    assert store.count() == 1 + 6 * REGION - 766
    assert store.compact_step(chunk=10_000) == (6 * REGION - 2 - 766, True)
    assert seqs(store.read(0)) == [1, 6 * REGION, 6 * REGION + 1]


def test_a_part_counts_every_event_of_the_batches_it_writes_again(store: EventStore) -> None:
    """Batches that keep an event (a topic of their own) are written again: each counts all
    the events it held toward its part, so the first part of 128 ends after 43 batches of 3."""
    for n in range(100):
        fill(store, [b"a", b"b", b"own-%d" % n])
    assert store.compact_step(chunk=10_000) == (0, False)  # reads the log
    with write_failing(1):
        assert store.compact_step(chunk=6 * 128, out_of_time=lambda: False) == (86, False)
    assert store.compact_step(chunk=10_000) == (2 * 100 - 2 - 86, True)
    assert [e.topic for e in store.read(0, limit=1000)][-3:] == [b"a", b"b", b"own-99"]


def test_a_compaction_step_out_of_time_stops_after_the_first_batch_it_writes_again(
    store: EventStore,
) -> None:
    """Batches that each keep an event of their own are written again, a batch at a time: out
    of time, a step stops after the first (a region of them is ten times as long in a spell of
    the machine); the steps after it go on from there and end with each topic's latest."""
    for n in range(100):
        fill(store, [b"a", b"b", b"own-%d" % n])
    assert store.compact_step(chunk=10_000) == (0, False)  # reads the log
    assert store.compact_step(chunk=6 * 128, out_of_time=lambda: True) == (2, False)
    assert seqs(store.read(0, limit=3)) == [3, 4, 5]
    assert compact_fully(store) == 2 * 100 - 2 - 2
    assert [e.topic for e in store.read(0, limit=1000)][-3:] == [b"a", b"b", b"own-99"]


def test_a_compaction_step_takes_its_victims_a_region_at_a_time(store: EventStore) -> None:
    """Out of time after its first region, a step took only that region's superseded events
    from those waiting, not its whole chunk (most of which it would have given back)."""
    fill(store, [b"a", b"b"] * (3 * REGION // 2))  # 1..768: 766 superseded, regions 0..3
    assert store.compact_step(chunk=10_000) == (0, False)  # reads the log
    tracked = store._superseded
    assert tracked is not None
    handed: list[int] = []
    take = tracked.take

    def spy(most: int) -> list[int]:
        taken = take(most)
        handed.append(len(taken))
        return taken

    tracked.take = spy  # type: ignore[method-assign]
    assert store.compact_step(chunk=10_000, out_of_time=lambda: True) == (REGION - 1, False)
    assert handed == [REGION - 1]
    assert compact_fully(store) == 3 * REGION - 2 - (REGION - 1)


def test_retention_frees_pages_without_writing_them_again(store: EventStore) -> None:
    """Deleting batches puts their pages on the free list as they are: the WAL gets the few
    pages that say so, not each freed page zeroed (SQLITE_SECURE_DELETE's default, where
    these three batches of ~100 KiB wrote about 75 pages to the WAL, and the checkpoint
    copied them again)."""
    data = b"d" * 400
    for n in range(4):  # a batch of 256 events (~25 pages) each, received 1 s apart
        fields = [(b"/t/", b"p", b"ts", b"%036d" % (n * 256 + i), data) for i in range(256)]
        store.append_fields(fields, received=100.0 + n)
    store._db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    assert store.expire_older_than(cutoff=103.0, chunk=10_000) == 3 * 256
    frames = store._db.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()[1]
    assert 0 < frames < 20


def test_with_secure_delete_no_removed_event_stays_readable_in_the_files(tmp_path: Path) -> None:
    """``secure_delete``: the pages removed events held are zeroed, so once the WAL is
    checkpointed neither file holds their bytes; by default (``FAST``) they are freed as they
    are, and the secret is still in the file after the same steps."""
    secret = b"secret-%032d" % 46

    def left_behind(directory: Path, secure: bool) -> bool:
        store = EventStore(directory, secure_delete=secure)
        try:
            fields = [(b"/t/", b"p", b"ts", b"%036d" % i, secret * 20) for i in range(64)]
            store.append_fields(fields, received=100.0)
            store.append_fields([(b"/t/", b"p", b"ts", b"%036d" % 99, b"kept")], received=200.0)
            store._db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
            assert store.expire_older_than(cutoff=150.0, chunk=10_000) == 64
            store._db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
            assert [e.data for e in store.read(0)] == [b"kept"]
        finally:
            store.close()
        return any(secret in path.read_bytes() for path in directory.iterdir() if path.is_file())

    assert not left_behind(tmp_path / "secure", secure=True)
    assert left_behind(tmp_path / "fast", secure=False)


def test_a_compaction_step_deletes_whole_batches_before_it_asks_its_budget(
    store: EventStore,
) -> None:
    """The batches that a region's superseded events fill are deleted by the time the budget
    is asked at the region's end, so that it sees what they cost (left to the commit, the
    thousand rows of a part of batches of two went on past it)."""
    fill(store, [b"x"])
    for _ in range(REGION):
        fill(store, [b"a", b"b"])  # 2..513, batches of two: 2..255 superseded in region 0
    assert store.compact_step(chunk=10_000) == (0, False)  # reads the log
    left: list[int] = []

    def out_of_time() -> bool:
        query = "SELECT COUNT(*) FROM batches WHERE last < ?"
        left.append(store._db.execute(query, (REGION,)).fetchone()[0])
        return True

    assert store.compact_step(chunk=10_000, out_of_time=out_of_time) == (REGION - 2, False)
    assert left[0] == 1  # the batch of 1 alone


def test_a_compaction_step_out_of_time_reads_64_events(store: EventStore) -> None:
    """Reading the log after an open, a step asks its budget every 64 events (about 0.1 ms):
    out of time at once, 1,000 events take 16 steps."""
    fill(store, [b"t%d" % (n % 7) for n in range(1000)])
    steps = 0
    while store.compaction_reading:
        assert store.compact_step(chunk=10_000, out_of_time=lambda: True) == (0, False)
        steps += 1
    assert steps == -(-1000 // 64)
    assert compact_fully(store) == 1000 - 7


def test_a_compaction_step_out_of_time_reads_a_few_hundred_events(store: EventStore) -> None:
    fill(store, [b"t%d" % (n % 7) for n in range(2 * READ_BETWEEN_CHECKS + 10)])
    for _ in range(3):  # 256, 512 then the rest: the budget is asked every 256 events
        assert store.compaction_reading
        assert store.compact_step(chunk=10_000, out_of_time=lambda: True) == (0, False)
    assert not store.compaction_reading
    assert store.compact_step(chunk=10_000) == (2 * READ_BETWEEN_CHECKS + 10 - 7, True)


def test_a_compaction_pass_whose_steps_run_out_of_time_still_ends_with_the_latest(
    store: EventStore,
) -> None:
    """Every step's budget spent at its first check (a clock that jumps 1 s a reading): the
    pass takes more steps, each at least a region, and keeps each topic's latest event."""
    from bus.util.chunking import ChunkSizer

    fill(store, [b"t%d" % (n % 5) for n in range(4 * REGION)])
    ticks = iter(range(10**6))
    sizer = ChunkSizer(1.0, first=10_000, smallest=10_000, largest=10_000)
    passing = Retention(latest_per_topic=True).steps(
        lambda: store, 2000.0, sizer, budget_clock=lambda: float(next(ticks))
    )
    deleted = list(passing)
    assert sum(deleted) == 4 * REGION - 5 and len(deleted) >= 4
    assert [e.topic for e in store.read(0)] == [
        b"t%d" % (n % 5) for n in range(4 * REGION - 5, 4 * REGION)
    ]


def test_events_appended_once_compaction_began_are_seen_as_they_come(store: EventStore) -> None:
    fill(store, [b"a", b"b", b"c", b"d"])
    assert compact_fully(store) == 0
    fill(store, [b"a", b"c"])  # 5 supersedes 1, 6 supersedes 3
    assert store.compact_step(chunk=2) == (2, True)  # nothing to read again
    assert [(e.topic, e.sequence) for e in store.read(0)] == [
        (b"b", 2),
        (b"d", 4),
        (b"a", 5),
        (b"c", 6),
    ]
    assert store.compact_step(chunk=2) == (0, True)


def test_after_a_restart_compaction_reads_the_log_once_then_only_what_comes(
    tmp_path: Path,
) -> None:
    store = EventStore(tmp_path)
    try:
        fill(store, [b"/t/%d" % (i % 10) for i in range(100)])
        assert compact_fully(store, chunk=10) == 90
    finally:
        store.close()
    store = EventStore(tmp_path)
    try:
        fill(store, [b"/t/1", b"/t/2", b"/t/new"])
        # Compaction's first step after the open reads the 13 events held (from then on
        # it sees events as they are appended), then one step deletes two.
        assert store.compact_step(chunk=10) == (0, False)
        assert store.compact_step(chunk=10) == (2, True)
        assert len(store.read(0)) == 11
        fill(store, [b"/t/3"])
        assert store.compact_step(chunk=10) == (1, True)
    finally:
        store.close()


def test_a_truncated_tail_leaves_the_events_it_superseded(store: EventStore) -> None:
    fill(store, [b"a", b"b"])
    assert compact_fully(store) == 0
    fill(store, [b"a"])  # 3 supersedes 1
    assert store.truncate_after(2) == 1  # a pair's rejoining server drops 3
    assert compact_fully(store) == 0  # 1 is a's latest again
    assert seqs(store.read(0)) == [1, 2]
    fill(store, [b"b"])
    assert compact_fully(store) == 1
    assert seqs(store.read(0)) == [1, 3]


def test_compaction_forgets_the_topics_that_age_and_count_retention_removed(
    store: EventStore,
) -> None:
    for i in range(10):
        fill(store, [b"/session/%d" % i], received=100.0 + i)
    assert compact_fully(store) == 0
    assert expire_fully(store, cutoff=105.0) == 5
    assert trim_fully(store, 2) == 3
    assert compact_fully(store) == 0
    superseded = store._superseded
    assert superseded is not None
    assert sorted(superseded.latest) == [b"/session/8", b"/session/9"]


def test_superseded_events_that_count_or_age_retention_deleted_are_not_handed_out(
    store: EventStore,
) -> None:
    """Compaction saw events superseded, then a count step deleted some of them and an age
    step the rest: the next compaction step has nothing to delete, so it writes nothing
    (a write that fails would raise, with nothing stored superseded), and forgets them."""
    fill(store, [b"/a/", b"/b/"] * 300, received=100.0)  # 598 superseded
    fill(store, [b"/c/"] * 10, received=200.0)  # 9 more
    assert store.compact_step() == (0, False)  # read: every one seen superseded
    tracked = store._superseded
    assert tracked is not None and tracked.waiting == 607
    assert trim_fully(store, 210) == 400  # through sequence 400, inside a region
    assert tracked.waiting == 207 and min(min(r) for r in tracked.regions.values()) > 400
    assert expire_fully(store, cutoff=150.0) == 200
    assert tracked.waiting == 9 and store.count() == 10
    assert trim_fully(store, 0) == 10
    fill(store, [b"/d/", b"/e/"])
    with write_failing(0):
        assert store.compact_step() == (0, True)
    assert tracked.waiting == 0 and not tracked.regions and not tracked._order
    assert [e.topic for e in store.read(0)] == [b"/d/", b"/e/"]


def test_a_commit_of_large_events_is_cut_into_batches_of_bounded_size(store: EventStore) -> None:
    big = b"x" * (BATCH_BYTES // 3)
    fields = [(b"/big/%d" % i, b"p", b"ts", b"u%d" % i, big) for i in range(7)]
    fields.append((b"/huge/", b"p", b"ts", b"u-huge", b"y" * (BATCH_BYTES * 2)))
    assert store.append_fields(fields, 1.0) == 1
    sizes = store._db.execute("SELECT held, length(events) FROM batches ORDER BY id").fetchall()
    assert sum(held for held, _ in sizes) == 8 and len(sizes) > 3
    assert all(length <= BATCH_BYTES for held, length in sizes if held > 1)
    assert [(e.topic, e.data) for e in store.read(0)] == [(f[0], f[4]) for f in fields]


OLD_EVENTS = """
CREATE TABLE events (
    seq INTEGER PRIMARY KEY, topic BLOB NOT NULL, producer BLOB NOT NULL,
    timestamp BLOB NOT NULL, uuid BLOB NOT NULL, data BLOB NOT NULL, received REAL NOT NULL
);
CREATE INDEX events_topic ON events (topic, seq);
CREATE TABLE meta (key TEXT PRIMARY KEY, value);
"""


def old_release_log(path: Path, rows: list[tuple[int, bytes, float]], high_water: int) -> None:
    """A log as release 0.1.1 and earlier wrote it: a row per event (some with an index)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    db = sqlite3.connect(path)
    db.executescript(OLD_EVENTS)
    db.executemany(
        "INSERT INTO events VALUES (?, ?, ?, ?, ?, ?, ?)",
        [
            (seq, topic, b"p", b"ts", b"u%d" % seq, b"d%d" % seq, received)
            for seq, topic, received in rows
        ],
    )
    db.execute("INSERT INTO meta VALUES ('store_id', 'old-store')")
    db.execute("INSERT INTO meta VALUES ('high_water', ?)", (high_water,))
    db.commit()
    db.close()


def test_a_log_of_an_older_release_is_moved_to_batches_at_its_first_open(tmp_path: Path) -> None:
    rows = [(seq, b"/t/%d" % (seq % 3), 100.0 + seq // 10) for seq in (*range(1, 40), 45, 46, 90)]
    old_release_log(tmp_path / DB_NAME, rows, high_water=95)
    store = EventStore(tmp_path)
    try:
        assert store.migrated == len(rows)
        assert store.store_id == "old-store" and store.last_sequence == 95
        assert [(e.sequence, e.topic, e.uuid, e.data) for e in store.read(0)] == [
            (seq, topic, b"u%d" % seq, b"d%d" % seq) for seq, topic, _ in rows
        ]
        tables = store._db.execute(
            "SELECT name FROM sqlite_master WHERE type IN ('table', 'index')"
        )
        assert sorted(name for (name,) in tables if not name.startswith("sqlite_")) == [
            "batches",
            "meta",
        ]
        assert store._db.execute("PRAGMA freelist_count").fetchone()[0] == 0  # pages given back
        # Each event keeps its receipt time: age retention cuts where it cut before.
        assert store.expire_older_than(cutoff=102.0) == 19  # 1..19 received before 102
        assert store.first_sequence() == 20
        assert store.append_fields([(b"/new/", b"p", b"ts", b"u", b"d")], 500.0) == 96
    finally:
        store.close()
    store = EventStore(tmp_path)
    try:
        assert store.migrated == 0 and store.count() == len(rows) - 19 + 1
    finally:
        store.close()


def test_an_export_of_an_older_release_s_log_reads_it_in_batches(tmp_path: Path) -> None:
    rows = [(seq, b"/t/", 7.0) for seq in (2, 3, 5)]
    old_release_log(tmp_path / DB_NAME, rows, high_water=6)
    log = LogExport(tmp_path)
    try:
        assert (log.store_id, log.first_sequence, log.last_sequence, log.count) == (
            "old-store",
            2,
            6,
            3,
        )
        assert [row[0] for row in log.rows(0)] == [2, 3, 5]
        assert log.count_between(2, 5) == 2
        assert log.received_between() == (7.0, 7.0)
    finally:
        log.close()


def test_compact_step_on_an_empty_store(store: EventStore) -> None:
    assert store.compact_step() == (0, True)
    assert store.last_sequence == 0


def test_retention_settings() -> None:
    assert not Retention().enabled
    assert Retention(max_age=1.0).enabled
    assert Retention(max_count=0).enabled
    assert Retention(latest_per_topic=True).enabled


def compact_fully(store: EventStore, chunk: int = 5000) -> int:
    """One whole latest-per-topic pass, step by step as the server runs it."""
    deleted, finished = 0, False
    while not finished:
        n, finished = store.compact_step(chunk)
        deleted += n
    return deleted


def expire_fully(store: EventStore, cutoff: float, chunk: int = 5000) -> int:
    deleted = 0
    while n := store.expire_older_than(cutoff, chunk):
        deleted += n
    return deleted


def trim_fully(store: EventStore, max_count: int, chunk: int = 5000) -> int:
    """Count retention step by step until it is finished (counting first, after an open)."""
    deleted, finished = 0, False
    while not finished:
        n, finished = store.trim_to_count(max_count, chunk)
        deleted += n
    return deleted


def test_latest_per_topic_and_max_age_by_the_clock_of_the_core_that_stored_them(
    tmp_path: Path,
) -> None:
    from twisted.internet.task import Clock
    from twisted.logger import Logger

    from bus.eventbus import codec
    from bus.eventbus.core import EventBusCore

    def pub(topic: bytes) -> list[bytes]:
        event_id = str(uuid.uuid4()).encode()
        frames = codec.pub_frames(topic, b"p", b"2026-11-27T00:00:00Z", event_id, b"\xc0")
        return [b"peer", *frames]

    clock = Clock()
    clock.advance(1_000)
    store = EventStore(tmp_path)
    core = EventBusCore(store, max_data_bytes=1024, clock=clock.seconds, logger=Logger())
    try:
        core.collect([pub(t) for t in [b"/k/a/", b"/k/b/", b"/k/a/", b"/k/a/", b"/k/b/"]])
        assert store.last_sequence == 5
        assert compact_fully(store) == 3
        assert seqs(store.read(0)) == [4, 5]
        clock.advance(100)
        core.collect([pub(b"/k/c/")])
        # Received max_age ago exactly is not older than max_age: kept.
        assert expire_fully(store, clock.seconds() - 100) == 0
        clock.advance(1)
        assert expire_fully(store, clock.seconds() - 100) == 2
        assert compact_fully(store) == 0
        assert seqs(store.read(0)) == [6] and store.last_sequence == 6
    finally:
        store.close()


@settings(max_examples=100, deadline=None)
@given(
    events=st.lists(
        st.tuples(
            st.sampled_from([b"/a/", b"/b/", b"/c/", b"/a/b/"]),
            st.sampled_from([0.0, 1.0, 5.0, -3.0]),  # the wall clock may step back
        ),
        max_size=30,
    ),
    max_age=st.sampled_from([0.0, 1.0, 4.0, 10.0, 100.0]),
    latest_first=st.booleans(),
    chunk=st.integers(1, 7),
)
def test_latest_per_topic_and_max_age_keep_each_topics_latest_event_not_older_than_max_age(
    events: list[tuple[bytes, float]], max_age: float, latest_first: bool, chunk: int
) -> None:
    with tempfile.TemporaryDirectory(prefix="retention-") as directory:
        store = EventStore(directory)
        try:
            now, newest, received = 1000.0, 0.0, []
            for topic, elapsed in events:
                now += elapsed
                store.append([event(topic)], now)
                newest = max(newest, now)  # as the store keeps it: never backwards
                received.append(newest)
            cutoff = now - max_age
            if latest_first:
                compact_fully(store, chunk)
                expire_fully(store, cutoff, chunk)
            else:
                expire_fully(store, cutoff, chunk)
                compact_fully(store, chunk)
            latest = {topic: sequence for sequence, (topic, _) in enumerate(events, 1)}
            kept = [
                sequence
                for sequence, (topic, _) in enumerate(events, 1)
                if latest[topic] == sequence and received[sequence - 1] >= cutoff
            ]
            assert seqs(store.read(0, limit=1000)) == kept
            assert store.last_sequence == len(events)
        finally:
            store.close()


def _every(looks: int) -> Callable[[], bool]:
    """A budget that is spent at every ``looks``-th look."""
    count = iter(range(1, 10**9))
    return lambda: next(count) % looks == 0


@settings(max_examples=150, deadline=None)
@given(
    rounds=st.lists(
        st.tuples(
            st.lists(st.integers(1, 6), min_size=1, max_size=8),  # a round's commits' sizes
            st.integers(0, 3),  # sequences skipped before it (an async pair's new active)
            st.booleans(),  # topics in turn (runs of superseded events) or drawn
            st.booleans(),  # a compaction pass after it
        ),
        min_size=1,
        max_size=6,
    ),
    drawn=st.lists(st.integers(0, 5), min_size=40, max_size=40),
    topics=st.integers(1, 6),
    chunk=st.integers(1, 40),
    budget=st.sampled_from([None, 1, 3]),
)
def test_compaction_deletes_runs_of_superseded_events_unread_and_keeps_each_topics_latest(
    rounds: list[tuple[list[int], int, bool, bool]],
    drawn: list[int],
    topics: int,
    chunk: int,
    budget: int | None,
) -> None:
    """Runs of superseded events next to each other go by range, their batches unread (regions
    of 8 and runs of 2 here, so that a few events make many): across commits of any size,
    gaps in the sequence, batches written again by earlier passes, and steps that run out of
    time, the log ends with each topic's latest event, in order, and the count agrees."""
    import bus.eventbus.store as store_module

    with (
        tempfile.TemporaryDirectory(prefix="runs-") as directory,
        pytest.MonkeyPatch.context() as patch,
    ):
        patch.setattr(store_module, "REGION", 8)
        patch.setattr(store_module, "RUN_EVENTS", 2)
        patch.setattr(store_module, "PART_EVENTS", 1)
        store = EventStore(directory)
        try:
            written: dict[int, bytes] = {}
            n = 0
            for sizes, skipped, in_turn, compact in rounds:
                if skipped:
                    store.skip_to(store.last_sequence + skipped)
                for size in sizes:
                    names = []
                    for _ in range(size):
                        pick = n % topics if in_turn else drawn[n % len(drawn)] % topics
                        names.append(b"/t/%d" % pick)
                        n += 1
                    first = store.last_sequence + 1
                    fill(store, names)
                    written.update(enumerate(names, first))
                if compact:
                    out_of_time = None if budget is None else _every(budget)
                    finished = False
                    while not finished:
                        finished = store.compact_step(chunk, out_of_time)[1]
            compact_fully(store, chunk)
            latest = {topic: sequence for sequence, topic in sorted(written.items())}
            kept = sorted(latest.values())
            assert seqs(store.read(0, limit=10_000)) == kept
            assert store.count() == len(kept)
        finally:
            store.close()


# -- a model-based state machine ----------------------------------------------------------------------

TOPIC_PARTS = [b"/", b"a", b"b", b"\x00", b"\xfe", b"\xff"]
model_topics = st.lists(st.sampled_from(TOPIC_PARTS), min_size=1, max_size=4).map(b"".join)
model_prefixes = st.lists(st.sampled_from(TOPIC_PARTS), max_size=3).map(b"".join)


@dataclass
class Row:
    event: Event
    received: float


class StoreMachine(RuleBasedStateMachine):
    """The store against a list: appends, reads, reopen, the pair's writes (events under
    given sequences, a truncated tail, a skipped range) and every retention step and pass.

    The model states the contract (not the SQL): sequences rise by one per event and never
    go backwards, even when retention deleted everything; reads filter by byte prefix; after
    any interleaving, retention leaves exactly what its mode keeps, and a compaction step
    deletes only events a newer one of their topic supersedes."""

    def __init__(self) -> None:
        super().__init__()
        self.directory = Path(tempfile.mkdtemp(prefix="store-model-"))
        self.store = EventStore(self.directory)
        self.store_id = self.store.store_id
        self.rows: list[Row] = []
        self.last = 0
        #: Whether the store has counted its events since it opened (count retention).
        self.counted = False
        self.now = 1000.0
        self.n = 0

    def teardown(self) -> None:
        self.store.close()
        shutil.rmtree(self.directory, ignore_errors=True)

    def _new_events(self, topics: list[bytes]) -> list[Event]:
        batch = []
        for topic in topics:
            self.n += 1
            batch.append(event(topic, self.n, sequence=12345))
        return batch

    @rule(
        topics=st.lists(model_topics, min_size=0, max_size=5),
        elapsed=st.sampled_from([0.0, 0.5, 1.0, 10.0]),
        as_fields=st.booleans(),
    )
    def append(self, topics: list[bytes], elapsed: float, as_fields: bool) -> None:
        self.now += elapsed  # the caller's clock never goes backwards
        batch = self._new_events(topics)
        expected = [
            Event(e.topic, self.last + i, e.producer, e.timestamp, e.uuid, e.data)
            for i, e in enumerate(batch, 1)
        ]
        if as_fields:  # the collector's path
            fields = [(e.topic, e.producer, e.timestamp, e.uuid, e.data) for e in batch]
            assert self.store.append_fields(fields, self.now) == self.last + 1
        else:
            assert self.store.append(batch, self.now) == expected
        self.rows += [Row(e, self.now) for e in expected]
        self.last += len(batch)

    @rule(
        topics=st.lists(model_topics, min_size=1, max_size=4),
        gaps=st.lists(st.integers(1, 20), min_size=4, max_size=4),
    )
    def append_at(self, topics: list[bytes], gaps: list[int]) -> None:
        """A passive copies its active's events, sequences and holes as they are."""
        sequence, copied = self.last, []
        for e, gap in zip(self._new_events(topics), gaps, strict=False):
            sequence += gap
            copied.append(Event(e.topic, sequence, e.producer, e.timestamp, e.uuid, e.data))
        self.store.append_at(
            [(e.sequence, (e.topic, e.producer, e.timestamp, e.uuid, e.data)) for e in copied],
            self.now,
        )
        self.rows += [Row(e, self.now) for e in copied]
        self.last = sequence

    @rule(back=st.integers(0, 6))
    def truncate_after(self, back: int) -> None:
        """A server rejoining its pair drops the tail its new active never had."""
        sequence = max(0, self.last - back)
        gone = [r for r in self.rows if r.event.sequence > sequence]
        assert self.store.truncate_after(sequence) == (len(gone) if back else 0)
        if back:
            self.rows = [r for r in self.rows if r.event.sequence <= sequence]
            self.last = sequence

    @rule(ahead=st.integers(1, 30))
    def skip_to(self, ahead: int) -> None:
        self.last += ahead
        self.store.skip_to(self.last)

    @rule(
        after=st.integers(-1, 80),
        upto=st.none() | st.integers(0, 80),
        prefixes=st.lists(model_prefixes, max_size=3),
        limit=st.integers(0, 8),
    )
    def read(self, after: int, upto: int | None, prefixes: list[bytes], limit: int) -> None:
        def wanted(e: Event) -> bool:
            if e.sequence <= after or (upto is not None and e.sequence > upto):
                return False
            return not prefixes or b"" in prefixes or e.topic.startswith(tuple(prefixes))

        expected = [r.event for r in self.rows if wanted(r.event)][:limit]
        assert self.store.read(after, upto, prefixes, limit) == expected

    @rule()
    def reopen(self) -> None:
        self.store.close()
        self.store = EventStore(self.directory)
        self.counted = False  # count retention counts again

    @contextmanager
    def _parts(self, patience: int | None, failing: int | None) -> Iterator[None]:
        """A step whose budget is spent after ``patience`` looks at it (it stops after a part
        at any of them), and whose ``failing``-th write (0: the first) fails before its
        commit, as a disk that fills up meanwhile: that part is rolled back."""
        checks = iter(range(100))
        self.out_of_time = None if patience is None else lambda: next(checks) >= patience
        with write_failing(failing):
            yield

    @rule(
        age=st.sampled_from([0.0, 0.5, 1.0, 5.0, 20.0]),
        chunk=st.integers(1, 6),
        patience=st.none() | st.integers(0, 3),
        failing=st.none() | st.integers(0, 3),
    )
    def expire(self, age: float, chunk: int, patience: int | None, failing: int | None) -> None:
        """One step: the oldest events, at most a chunk (fewer where the sequence has
        holes), only some received before the cutoff, at least one while there is one.
        It deletes them in parts (a batch or an event each here), each committed: out of
        time, it stops after one; a part that fails ends it with what the parts before
        deleted, and the first one raises, having deleted nothing."""
        from bus.errors import StorageError

        cutoff = self.now - age
        older = len([r for r in self.rows if r.received < cutoff])  # the oldest ones
        with self._parts(patience, failing):
            try:
                deleted = self.store.expire_older_than(cutoff, chunk, self.out_of_time)
            except StorageError:
                assert failing == 0 and older
                return
        assert deleted <= min(chunk, older) and (deleted > 0) == (older > 0 and failing != 0)
        self.rows = self.rows[deleted:]

    @rule(
        max_count=st.integers(0, 8),
        chunk=st.integers(1, 6),
        patience=st.none() | st.integers(0, 3),
        failing=st.none() | st.integers(0, 3),
    )
    def trim(self, max_count: int, chunk: int, patience: int | None, failing: int | None) -> None:
        """One step: counting (after an open), or the oldest events beyond max_count, at
        most a chunk (fewer where the sequence has holes), at least one; in parts, as
        :meth:`expire` says."""
        from bus.errors import StorageError

        excess = max(0, len(self.rows) - max_count)
        with self._parts(patience, failing):
            try:
                deleted, finished = self.store.trim_to_count(max_count, chunk, self.out_of_time)
            except StorageError:  # only a step that deletes writes
                assert failing == 0 and excess
                self.counted = True
                return
        if (deleted, finished) == (0, False) and not self.counted:
            return  # counting (in parts too): nothing deleted
        self.counted = True
        assert deleted <= min(excess, chunk) and (deleted > 0) == (excess > 0 and failing != 0)
        assert finished == (deleted == excess)
        self.rows = self.rows[deleted:]

    @rule(max_count=st.integers(0, 8), chunk=st.integers(1, 6))
    def trim_to_the_end(self, max_count: int, chunk: int) -> None:
        """Steps until finished: the counting ends within its bound, then the newest stay
        (each step deletes a chunk, or up to a hole in the sequence)."""
        excess = max(0, len(self.rows) - max_count)
        holes = sum(
            1
            for a, b in zip(self.rows, self.rows[1:], strict=False)
            if b.event.sequence != a.event.sequence + 1
        )
        steps = -(-excess // chunk) + holes + 1
        if not self.counted:  # 8 sequences per event of the chunk, a step
            span = self.last - self.rows[0].event.sequence + 1 if self.rows else 0
            steps += -(-span // (8 * chunk)) + 1
        for _ in range(steps):
            if self.store.trim_to_count(max_count, chunk)[1]:
                break
        else:
            raise AssertionError(f"not finished in {steps} steps")
        self.counted = True
        self.rows = self.rows[max(0, len(self.rows) - max_count) :]

    def _superseded(self) -> set[int]:
        newest = {r.event.topic: r.event.sequence for r in self.rows}
        return {r.event.sequence for r in self.rows if newest[r.event.topic] != r.event.sequence}

    @rule(
        chunk=st.integers(1, 6),
        patience=st.none() | st.integers(0, 3),
        failing=st.none() | st.integers(0, 3),
    )
    def compact(self, chunk: int, patience: int | None, failing: int | None) -> None:
        """One step: it deletes at most a chunk, only superseded events; once finished,
        none is left. With ``patience``, its budget is spent after that many checks (it may
        stop at any of them, after a region or a few hundred events read). A write that
        fails loses nothing: what the step took and did not delete, later steps delete."""
        from bus.errors import StorageError

        superseded = self._superseded()
        with self._parts(patience, failing):
            try:
                deleted, finished = self.store.compact_step(chunk, self.out_of_time)
            except StorageError:
                assert failing == 0 and superseded
                return
        held = {e.sequence for e in self.store.read(0, limit=10_000)}
        gone = {r.event.sequence for r in self.rows} - held
        assert gone <= superseded and len(gone) == deleted <= chunk
        self.rows = [r for r in self.rows if r.event.sequence in held]
        if finished:
            assert not self._superseded()

    @rule(chunk=st.integers(1, 6))
    def compact_to_the_end(self, chunk: int) -> None:
        """Steps until finished, within a bound: reading what the log holds, 3 events per
        event of the chunk a step, then deleting what was seen superseded (some of it may
        be gone already: at most every event made so far), one at least a step (a step
        stops early once the batches it wrote again held a chunk of events)."""
        steps = -(-len(self.rows) // (3 * chunk)) + self.n + 2
        for _ in range(steps):
            if self.store.compact_step(chunk)[1]:
                break
        else:
            raise AssertionError(f"not finished in {steps} steps")
        newest = {r.event.topic: r.event.sequence for r in self.rows}
        self.rows = [r for r in self.rows if newest[r.event.topic] == r.event.sequence]

    @rule(
        max_age=st.none() | st.sampled_from([0.0, 1.0, 5.0, 20.0]),
        max_count=st.none() | st.integers(0, 8),
        latest_per_topic=st.booleans(),
        chunk=st.integers(1, 6),
    )
    def retention_pass(
        self, max_age: float | None, max_count: int | None, latest_per_topic: bool, chunk: int
    ) -> None:
        """A whole pass, as the service runs it: by age, by count, then latest per topic."""
        from bus.util.chunking import ChunkSizer

        retention = Retention(max_age, max_count, latest_per_topic)
        sizer = ChunkSizer(1.0, first=chunk, smallest=chunk, largest=chunk)
        deleted = sum(retention.steps(lambda: self.store, self.now, sizer))
        before = len(self.rows)
        if max_age is not None:
            self.rows = [r for r in self.rows if r.received >= self.now - max_age]
        if max_count is not None:
            self.rows = self.rows[max(0, len(self.rows) - max_count) :]
            self.counted = True
        if latest_per_topic:
            latest = {r.event.topic: r.event.sequence for r in self.rows}
            self.rows = [r for r in self.rows if latest[r.event.topic] == r.event.sequence]
        assert deleted == before - len(self.rows)

    @invariant()
    def agrees_with_the_model(self) -> None:
        assert self.store.last_sequence == self.last
        assert self.store.count() == len(self.rows)
        assert self.store.first_sequence() == (self.rows[0].event.sequence if self.rows else None)
        assert self.store.store_id == self.store_id
        assert self.store.read(0, limit=10_000) == [r.event for r in self.rows]

    @invariant()
    def every_prefix_of_a_stored_topic_reads_like_startswith(self) -> None:
        topics = {r.event.topic for r in self.rows}
        prefixes = {t[:i] for t in topics for i in range(1, len(t) + 1)}
        prefixes |= {p + b"\xff" for p in prefixes}
        for prefix in prefixes:
            expected = [r.event for r in self.rows if r.event.topic.startswith(prefix)]
            assert self.store.read(0, prefixes=[prefix], limit=10_000) == expected, prefix


@pytest.mark.parametrize("region", [REGION, 8])
def test_store_agrees_with_an_in_memory_model(monkeypatch: pytest.MonkeyPatch, region: int) -> None:
    import bus.eventbus.store as store_module

    # Age and count steps in parts of one event (or the batch it ends), so that the model's
    # few events make steps of several parts.
    monkeypatch.setattr(store_module, "PART_EVENTS", 1)
    if region != REGION:
        # Regions of a few events and runs of two: compaction deletes runs of superseded
        # events unread, across the batches of the model's appends, its gaps and rewrites.
        monkeypatch.setattr(store_module, "REGION", region)
        monkeypatch.setattr(store_module, "RUN_EVENTS", 2)
    run_state_machine_as_test(
        StoreMachine,
        settings=settings(
            max_examples=120,
            stateful_step_count=40,
            deadline=None,
            suppress_health_check=[HealthCheck.too_slow],
        ),
    )


# -- WAL checkpoints off the writer's thread --------------------------------------------------


def test_checkpoint_from_another_thread_moves_the_wal_while_appends_go_on(
    store: EventStore,
) -> None:
    import threading

    fill(store, [b"/w/%d" % i for i in range(2000)])
    wal_pages, done = store.checkpoint()
    assert wal_pages > 0 and done == wal_pages  # no automatic checkpoint ran before
    results: list[tuple[int, int]] = []
    worker = threading.Thread(target=lambda: results.append(store.checkpoint()))
    worker.start()
    fill(store, [b"/x/%d" % i for i in range(2000)])
    worker.join()
    assert results and results[0][1] <= results[0][0]
    assert store.last_sequence == 4000
    assert len(store.read(0, limit=10_000)) == 4000


# -- a store that cannot write ------------------------------------------------------------------


def limit_pages(store: EventStore, pages: int) -> None:
    """SQLite's own SQLITE_FULL, without a full filesystem: cap the database's size."""
    store._db.execute(f"PRAGMA max_page_count = {pages}")


def test_a_full_store_refuses_the_whole_batch_and_stays_consistent(tmp_path: Path) -> None:
    from bus.errors import StorageError

    store = EventStore(tmp_path / "full")
    try:
        fill(store, [b"/a/%d" % i for i in range(10)])
        used = store._db.execute("PRAGMA page_count").fetchone()[0]
        limit_pages(store, used)
        big = [event(b"/big/%d" % i, i) for i in range(500)]
        with pytest.raises(StorageError, match="full") as refused:
            store.append(big, 2000.0)
        assert isinstance(refused.value.cause, sqlite3.OperationalError)
        # Nothing of the refused batch is visible, the sequence did not move, and the
        # connection is not left inside a transaction.
        assert store.last_sequence == 10
        assert store.count() == 10
        assert not store._db.in_transaction
        # The same batch again once there is room: it gets the next sequences.
        limit_pages(store, 1_000_000)
        stored = store.append(big, 2000.0)
        assert seqs(stored) == list(range(11, 511))
    finally:
        store.close()
    reopened = EventStore(tmp_path / "full")
    try:
        assert reopened.last_sequence == 510
        assert seqs(reopened.read(0, limit=1000)) == list(range(1, 511))
    finally:
        reopened.close()


def test_opening_a_store_that_cannot_be_created_raises_storage_error(tmp_path: Path) -> None:
    from bus.errors import StorageError

    directory = tmp_path / "not-a-db"
    directory.mkdir()
    (directory / DB_NAME).write_bytes(b"this is not a database file, " * 100)
    with pytest.raises(StorageError, match="not a database"):
        EventStore(directory)


# -- a retention pass, and the log's upkeep on the reactor ---------------------------------------


def test_a_retention_pass_deletes_by_age_count_then_latest_per_topic_a_chunk_a_step(
    tmp_path: Path,
) -> None:
    from bus.util.chunking import ChunkSizer

    store = EventStore(tmp_path)
    try:
        store.append([event(b"/old/%d/" % (i % 3), i) for i in range(6000)], 1000.0)
        store.append([event(b"/new/%d/" % (i % 2), i) for i in range(5200)], 2000.0)
        retention = Retention(max_age=500.0, max_count=5100, latest_per_topic=True)
        fixed = ChunkSizer(1.0, first=5000, smallest=5000, largest=5000)
        # A budget that never runs out (a thread's CPU clock stopped): whole chunks.
        steps = list(retention.steps(lambda: store, 2400.0, fixed, budget_clock=lambda: 0.0))
        # Age: the 6000 old ones, 5000 a step; count: one step counting the 5200 left (40k
        # sequences a step), then 100 more; then a compaction pass, 5000 events a step.
        assert steps[:4] == [5000, 1000, 0, 100] and sum(steps) == 6000 + 100 + 5098
        assert seqs(store.read(0)) == [11199, 11200]
        assert sum(retention.steps(lambda: store, 2400.0)) == 0  # nothing more to do
    finally:
        store.close()


def test_a_retention_pass_sizes_its_steps_by_their_measured_time(tmp_path: Path) -> None:
    """Chunks follow what a step costs: on a clock that charges each step 1 us per event
    deleted plus 50 us, every step after the first few lasts about the target (1.5 ms)."""
    from bus.eventbus.store import STEP_TARGET, step_sizer

    store = EventStore(tmp_path)
    try:
        store.append([event(b"/t/", i) for i in range(60_000)], 1000.0)
        now = [0.0]
        sizer = step_sizer(lambda: now[0])

        class Charged:
            """The store, its retention steps charged to the fake clock."""

            def expire_older_than(
                self, cutoff: float, chunk: int = 5000, out_of_time: Any = None
            ) -> int:
                deleted = store.expire_older_than(cutoff, chunk)
                now[0] += 50e-6 + deleted * 1e-6
                return deleted

        passing = Retention(max_age=10.0).steps(lambda: Charged(), 2000.0, sizer)  # type: ignore[arg-type,return-value]
        durations, sizes = [], []
        for deleted in passing:
            durations.append(50e-6 + deleted * 1e-6)
            sizes.append(deleted)
        assert sum(sizes) == 60_000
        assert sizes[:3] == [256, 512, 1024]  # from the first chunk, at most twice as big
        assert all(STEP_TARGET * 0.9 <= d <= STEP_TARGET * 1.1 for d in durations[3:-1])
    finally:
        store.close()


def test_a_retention_pass_asks_for_the_log_at_every_step() -> None:
    from bus.testing import MemoryEventLog

    first, second = MemoryEventLog(), MemoryEventLog()
    for log in (first, second):
        log.append_fields([(b"/a/", b"p", b"t", b"u", b"\xc0")] * 3, 1.0)
    logs = [first, second]
    steps = Retention(max_count=1, latest_per_topic=True).steps(lambda: logs[0], 10.0)
    assert next(steps) == 2
    logs.pop(0)  # a pair replaced the log: the pass goes on in the new one
    assert list(steps) == [2]  # compaction, in the second log
    assert first.count() == 1 and second.count() == 1


class UpkeptLog:
    """An event log for LogUpkeep: its retention and checkpoints fail on demand, its
    checkpoint may block until released, and its close says how it was asked."""

    def __init__(self) -> None:
        from bus.testing import MemoryEventLog

        self.memory = MemoryEventLog()
        self.path = self.memory.path
        self.failing: str | None = None
        self.checkpoints = 0
        self.blocked: Any = None
        self.closed_with: list[bool] = []
        #: A clock its retention steps advance: 1 ms per event deleted.
        self.now = 0.0

    def _fail(self) -> None:
        from bus.errors import StorageError

        if self.failing is not None:
            raise StorageError(OSError(28, self.failing))

    def trim_to_count(
        self, max_count: int, chunk: int = 5000, out_of_time: Any = None
    ) -> tuple[int, bool]:
        """Two events a step at most."""
        self._fail()
        extra = min(2, max(0, self.memory.count() - max_count))
        del self.memory.rows[:extra]
        self.now += extra / 1000
        return extra, self.memory.count() <= max_count

    def checkpoint(self) -> tuple[int, int]:
        self.checkpoints += 1
        if self.blocked is not None:
            self.blocked.wait(10)
        self._fail()
        return 0, 0

    def close(self, checkpoint_running: bool = False) -> None:
        self.closed_with.append(checkpoint_running)
        self._fail()


def upkeep_of(log: UpkeptLog, reactor: Any, said: list[str], max_count: int = 0) -> LogUpkeep:
    from twisted.logger import Logger, formatEvent

    logger = Logger(
        namespace="test",
        observer=lambda e: said.append(f"{e['log_level'].name}: {formatEvent(e)}"),
    )
    retention = Retention(max_count=max_count)
    return LogUpkeep(
        reactor,
        lambda: log,
        retention,
        clock=reactor.seconds,
        logger=logger,
        timer=lambda: log.now,
        cpu_timer=lambda: log.now / 2,
    )


def test_retention_runs_on_the_reactor_one_pass_at_a_time_and_its_failures_are_counted() -> None:
    from twisted.internet.task import Clock

    clock, log, said = Clock(), UpkeptLog(), []
    log.memory.append_fields([(b"/a/", b"p", b"t", b"u", b"\xc0")] * 5, 1.0)
    upkeep = upkeep_of(log, clock, said)
    upkeep.retain()
    upkeep.retain()  # the pass has not ended: no second one
    assert log.memory.count() == 5  # it runs on the reactor, a step per turn
    held = []
    while clock.calls:  # one reactor turn: the first call due, alone
        call = clock.calls.pop(0)
        call.called = 1
        call.func(*call.args, **call.kw)
        held.append(log.memory.count())
    assert held == [3, 1, 0, 0]  # the last turn finds the pass over
    assert said == ["info: retention removed 5 events in 3 steps over 0.005 s, the longest 2.00 ms"]
    assert (upkeep.removed, upkeep.passes, upkeep.longest_step, upkeep.cpu) == (
        5,
        1,
        0.002,
        0.0025,
    )
    assert upkeep.longest_step_cpu == 0.001
    assert upkeep.last_pass == RetentionPass(
        started=0.0,
        seconds=0.005,
        removed=5,
        steps=3,
        longest_step=0.002,
        cpu=0.0025,
        longest_step_cpu=0.001,
    )
    # A step that fails ends the pass: counted, and said once in ten seconds.
    log.memory.append_fields([(b"/a/", b"p", b"t", b"u", b"\xc0")] * 5, 1.0)
    log.failing = "No space left on device"
    for _ in range(3):
        upkeep.retain()
        clock.advance(1)
    assert upkeep.failures == 3 and len(said) == 2
    assert said[1].startswith("warn: event log retention failed (")
    assert said[1].endswith(
        "1 failures since the last report; nothing stored is lost, it is retried"
    )


def test_the_close_ends_retention_and_closes_the_log_whatever_its_final_checkpoint_does() -> None:
    from twisted.internet.task import Clock

    clock, log, said = Clock(), UpkeptLog(), []
    log.memory.append_fields([(b"/a/", b"p", b"t", b"u", b"\xc0")] * 5, 1.0)
    upkeep = upkeep_of(log, clock, said)
    upkeep.retain()
    log.failing = "No space left on device"
    closed: list[object] = []
    upkeep.close(3.0).addCallback(closed.append)
    assert closed == [None] and log.closed_with == [False]
    clock.advance(0)
    assert log.memory.count() == 5  # the pass ended at the close, before its first step
    assert upkeep.failures == 1 and said[-1].startswith(
        "error: event log :memory: closed without its final checkpoint ("
    )


@pytest_twisted.inlineCallbacks
def test_checkpoints_run_on_a_thread_and_a_close_waits_for_one_only_so_long() -> Any:
    import threading

    from twisted.internet import reactor

    from bus.testing import wait_until

    log, said = UpkeptLog(), []
    upkeep = upkeep_of(log, reactor, said)
    upkeep.start()
    log.failing = "disk I/O error"
    upkeep.checkpoint()
    yield wait_until(lambda: upkeep.failures == 1, what="a failed checkpoint")
    assert said == [
        "warn: event log WAL checkpoint failed ([Errno 28] disk I/O error); 1 failures since "
        "the last report; nothing stored is lost, it is retried"
    ]
    log.failing = None
    log.blocked = threading.Event()
    upkeep.checkpoint()
    upkeep.checkpoint()  # one at a time: skipped while the first runs
    try:
        yield upkeep.close(0.05)
        assert log.checkpoints == 2 and log.closed_with == [True]
        assert said[-1] == "warn: a WAL checkpoint still runs after 0.05s: closing without it"
    finally:
        log.blocked.set()
