"""The broker's job store (bus.emqp.store): a row per committed batch of requests
(bus.emqp.jobbatch), restored by position whatever order requests are put, re-put and removed
in, across reopenings; a store written before with a row per request (keyed by msgid, or by
position) is moved over, in order, with nothing lost."""

from __future__ import annotations

import sqlite3
import struct
from pathlib import Path
from unittest import mock

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bus.emqp import jobbatch
from bus.emqp import store as store_module
from bus.emqp.store import DB_NAME, JobStore, StoredJob, StoreExport

#: The table as stores keyed by msgid wrote it.
_OLD_JOBS = """
CREATE TABLE jobs (
    msgid BLOB PRIMARY KEY,
    position INTEGER NOT NULL,
    client BLOB NOT NULL,
    queue BLOB NOT NULL,
    headers BLOB NOT NULL,
    body BLOB NOT NULL,
    received REAL NOT NULL,
    attempts INTEGER NOT NULL,
    retries_left INTEGER NOT NULL
) WITHOUT ROWID;
"""


def job(msgid: bytes, position: int, attempts: int = 0) -> StoredJob:
    return StoredJob(msgid, position, b"client", b"q", b"guarantee", b'"' + msgid + b'"', 1.5,
                     attempts, 3)  # fmt: skip


#: The table as stores keyed by position wrote it (a row per request).
_JOBS_BY_POSITION = (
    _OLD_JOBS.replace("msgid BLOB PRIMARY KEY", "msgid BLOB NOT NULL")
    .replace("position INTEGER NOT NULL", "position INTEGER PRIMARY KEY")
    .replace(") WITHOUT ROWID", ")")
)


def tables(directory: Path) -> set[str]:
    db = sqlite3.connect(directory / DB_NAME)
    try:
        return {row[0] for row in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    finally:
        db.close()


def test_a_store_keyed_by_msgid_is_moved_over_in_order(tmp_path: Path) -> None:
    db = sqlite3.connect(tmp_path / DB_NAME)
    db.executescript(_OLD_JOBS)
    old = [job(b"c", 7), job(b"a", 3), job(b"b", 3, attempts=1), job(b"d", 9)]
    db.executemany("INSERT INTO jobs VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)", old)
    db.commit()
    db.close()
    store = JobStore(tmp_path)
    try:
        loaded = store.load()
        # Two rows shared position 3: numbered again, in the order they had.
        assert [j.msgid for j in loaded] == [b"a", b"b", b"c", b"d"]
        assert [j.position for j in loaded] == [1, 2, 3, 4]
        assert [j[2:] for j in loaded] == [j[2:] for j in sorted(old, key=lambda j: (j[1], j[0]))]
        assert "jobs" not in tables(tmp_path) and "job_batches" in tables(tmp_path)
        assert store.next_position() == 5 and store.count() == 4
        store.remove(b"b")
        store.commit()
    finally:
        store.close()
    store = JobStore(tmp_path)
    try:
        assert [j.msgid for j in store.load()] == [b"a", b"c", b"d"]
    finally:
        store.close()


def test_the_export_moves_an_old_store_over_and_removes_what_it_is_told(tmp_path: Path) -> None:
    db = sqlite3.connect(tmp_path / DB_NAME)
    db.executescript(_OLD_JOBS + "CREATE TABLE schedules (id TEXT PRIMARY KEY);")
    db.executemany(
        "INSERT INTO jobs VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)", [job(b"x", 1), job(b"y", 2)]
    )
    db.commit()
    db.close()
    export = StoreExport(tmp_path)
    try:
        assert [j.msgid for j in export.jobs()] == [b"x", b"y"]
        export.remove([b"x"], [])
        assert [j.msgid for j in export.jobs()] == [b"y"]
    finally:
        export.close()


def test_a_store_with_a_row_per_request_is_moved_over_in_order(tmp_path: Path) -> None:
    db = sqlite3.connect(tmp_path / DB_NAME)
    db.executescript(_JOBS_BY_POSITION)
    old = [job(b"m%d" % n, position, attempts=n % 3) for n, position in
           enumerate([900, 4, *range(10, 610)])]  # fmt: skip
    db.executemany("INSERT INTO jobs VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)", old)
    db.commit()
    db.close()
    store = JobStore(tmp_path)
    try:
        assert store.load() == sorted(old, key=lambda j: j.position)  # positions kept
        assert store.count() == len(old) and store.next_position() == 901
        for each in old[::2]:
            store.remove(each.msgid)
        store.commit()
    finally:
        store.close()
    assert "jobs" not in tables(tmp_path)
    store = JobStore(tmp_path)
    try:
        assert store.load() == sorted(old[1::2], key=lambda j: j.position)
    finally:
        store.close()


def test_a_new_request_is_put_at_the_next_position(tmp_path: Path) -> None:
    store = JobStore(tmp_path)
    try:
        store.put(job(b"a", store.next_position()))
        assert store.put_new(b"b", b"client", b"q", b"guarantee", b'"b"', 1.5, 3) == 2
        store.commit()
        assert store.load() == [job(b"a", 1), job(b"b", 2)]
        assert store.next_position() == 3
    finally:
        store.close()


jobs_of = st.lists(
    st.builds(
        StoredJob,
        st.binary(max_size=40),
        st.integers(-(2**63), 2**63 - 1),
        st.binary(max_size=20),
        st.binary(max_size=20),
        st.binary(max_size=40),
        st.binary(max_size=300),
        st.floats(allow_nan=False),
        st.integers(-(2**63), 2**63 - 1),
        st.integers(-(2**63), 2**63 - 1),
    ),
    max_size=20,
)


@given(jobs_of)
def test_a_batch_is_unpacked_as_it_was_packed(jobs: list[StoredJob]) -> None:
    packed = jobbatch.pack(jobs)
    assert packed == jobbatch.pack_python(jobs)  # the compiled packer, where built
    assert list(jobbatch.unpack(packed)) == jobs


@st.composite
def changes(draw: st.DrawFn) -> tuple[dict[bytes, StoredJob | None], dict[bytes, int]]:
    """A commit's pending changes (a row, or None: removed) and the committed requests'
    slots, over a few msgids: some committed, some changed, some both."""
    msgids = draw(st.lists(st.binary(min_size=1, max_size=3), unique=True, max_size=40))
    places = draw(
        st.lists(
            st.tuples(st.integers(0, 2**40), st.integers(0, jobbatch.BATCH_JOBS - 1)),
            unique=True,
            min_size=len(msgids),
            max_size=len(msgids),
        )
    )
    slots: dict[bytes, int] = {}
    pending: dict[bytes, StoredJob | None] = {}
    for n, (msgid, (batch, index)) in enumerate(zip(msgids, places, strict=True)):
        if draw(st.booleans()):
            slots[msgid] = batch << jobbatch.SLOT_BITS | index
        if draw(st.booleans()):
            pending[msgid] = draw(st.sampled_from([None, job(msgid, n)]))
    return pending, slots


@settings(max_examples=500, deadline=None)
@given(changes())
def test_a_commit_s_changes_are_sorted_alike_compiled_or_not(
    given_changes: tuple[dict[bytes, StoredJob | None], dict[bytes, int]],
) -> None:
    pending, slots = given_changes
    kept, marked, dropped = jobbatch.settle_python(pending, slots)
    assert jobbatch.settle(pending, slots) == (kept, marked, dropped)  # compiled, where built
    assert kept == [row for row in pending.values() if row is not None]
    assert dropped == [m for m, row in pending.items() if row is None and m in slots]
    gone = sorted(slots[m] for m in pending if m in slots)
    assert (
        sorted(
            batch << jobbatch.SLOT_BITS | index
            for batch, bits in marked.items()
            for index in range(jobbatch.BATCH_JOBS)
            if bits >> index & 1
        )
        == gone
    )


@settings(max_examples=300, deadline=None)
@given(changes(), st.integers(1, 2**40))
def test_a_commit_s_slots_are_kept_alike_compiled_or_not(
    given_changes: tuple[dict[bytes, StoredJob | None], dict[bytes, int]], first: int
) -> None:
    pending, slots = given_changes
    kept, _, dropped = jobbatch.settle_python(pending, slots)
    batches = [kept[:3], kept[3:]] if len(kept) > 3 else [kept]
    expected, made = dict(slots), dict(slots)
    jobbatch.committed_python(expected, dropped, batches, first)
    jobbatch.committed(made, dropped, batches, first)  # compiled, where built
    assert made == expected
    assert all(m not in made for m in dropped)
    assert [made[row.msgid] for row in kept[:3]] == [
        first << jobbatch.SLOT_BITS | i for i in range(len(kept[:3]))
    ]


#: A broker's changes: a new request (msgid, retries left), a removal, a position taken.
_change = st.one_of(
    st.tuples(st.just("put_new"), st.binary(max_size=3), st.integers(0, 2**40)),
    st.tuples(st.just("remove"), st.binary(max_size=3)),
    st.tuples(st.just("next_position")),
)


@settings(max_examples=300, deadline=None)
@given(st.integers(1, 2**40), st.lists(_change, max_size=30))
def test_a_broker_s_changes_are_kept_alike_compiled_or_not(
    first: int, steps: list[tuple[object, ...]]
) -> None:
    kept: list[dict[bytes, StoredJob | None]] = [{}, {}]
    made = [jobbatch.changes(kept[0], first), jobbatch.ChangesPython(StoredJob, kept[1], first)]
    for step in steps:
        answers = []
        for changes in made:
            if step[0] == "put_new":
                msgid, retries = step[1], step[2]
                assert isinstance(msgid, bytes) and isinstance(retries, int)
                answers.append(changes.put_new(msgid, b"c", b"q", b"guarantee", b"1", 2.5, retries))
            elif step[0] == "remove":
                assert isinstance(step[1], bytes)
                answers.append(changes.remove(step[1]))
            else:
                answers.append(changes.next_position())
        assert answers[0] == answers[1]
    assert kept[0] == kept[1]
    assert list(kept[0]) == list(kept[1])  # the same order: a commit's rows are in it
    assert all(type(row) is StoredJob for row in kept[0].values() if row is not None)


@pytest.mark.parametrize("blob", [b"", b"\x02", jobbatch.pack([job(b"a", 1)])[:-1]])
def test_a_blob_that_is_no_batch_is_refused(blob: bytes) -> None:
    with pytest.raises(ValueError):
        list(jobbatch.unpack(blob))


def test_a_value_the_format_cannot_hold_is_refused() -> None:
    with pytest.raises((OverflowError, struct.error)):
        jobbatch.pack([job(b"a", 2**63)])


@settings(max_examples=50, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 700), st.integers(0, 2**32)), min_size=1, max_size=4))
def test_batches_of_any_size_keep_what_is_not_removed(
    tmp_path_factory: pytest.TempPathFactory, rounds: list[tuple[int, int]]
) -> None:
    """Commits of more requests than a batch holds, each followed by a commit removing a
    random subset (by a mask) of all that is kept; what is left survives a reopening."""
    directory = tmp_path_factory.mktemp("store")
    store = JobStore(directory)
    kept: dict[bytes, StoredJob] = {}
    try:
        for count, mask in rounds:
            for _ in range(count):
                position = store.next_position()
                stored = job(b"j%d" % position, position)
                store.put(stored)
                kept[stored.msgid] = stored
            store.commit()
            for n, msgid in enumerate(sorted(kept)):
                if mask >> (n % 33) & 1:
                    store.remove(msgid)
                    del kept[msgid]
            store.commit()
            assert store.count() == len(kept)
        store.close()
        store = JobStore(directory)
        assert store.load() == sorted(kept.values(), key=lambda j: j.position)
        assert store.count() == len(kept)
    finally:
        store.close()


def batch_rows(directory: Path) -> int:
    db = sqlite3.connect(directory / DB_NAME)
    try:
        return int(db.execute("SELECT count(*) FROM job_batches").fetchone()[0])
    finally:
        db.close()


def test_a_batch_holds_about_its_bound_of_bodies(tmp_path: Path) -> None:
    sizes = [40, 40, 40, 500, 10, 40, 40]
    jobs = [job(b"b%d" % n, n + 1)._replace(body=b"x" * size) for n, size in enumerate(sizes)]
    with mock.patch.object(jobbatch, "BATCH_BYTES", 100):
        assert [len(b) for b in jobbatch.batches_of(jobs)] == [2, 1, 1, 3]
        store = JobStore(tmp_path)
        try:
            for each in jobs:
                store.put(each)
            store.commit()
            assert batch_rows(tmp_path) == 4
            store.remove(b"b3")
            store.remove(b"b0")
            store.commit()
            assert batch_rows(tmp_path) == 3
        finally:
            store.close()
    store = JobStore(tmp_path)
    try:
        assert store.load() == [j for j in jobs if j.msgid not in (b"b0", b"b3")]
    finally:
        store.close()


def test_requests_left_in_old_batches_move_to_a_new_one(tmp_path: Path) -> None:
    """A request that waits long (here one of each commit's twenty) does not keep its
    batch's other requests on disk: once its batch is old, it moves to a new one."""
    store = JobStore(tmp_path)
    waiting: list[StoredJob] = []
    try:
        with mock.patch.multiple(store_module, _SWEEP_EVERY=4, _SWEEP_AGE=2):
            for _ in range(40):
                batch = [job(b"j%d" % p, p) for p in (store.next_position() for _ in range(20))]
                for each in batch:
                    store.put(each)
                store.commit()
                waiting.append(batch[0])
                for each in batch[1:]:
                    store.remove(each.msgid)
                store.commit()
        assert batch_rows(tmp_path) <= 8  # 40 without the move
        assert store.load() == waiting and store.count() == len(waiting)
    finally:
        store.close()
    store = JobStore(tmp_path)
    try:
        assert store.load() == waiting
    finally:
        store.close()


# A step: put a request (new, or again with more attempts, or again at a new position),
# remove one, commit, or close and open the store again.
steps = st.lists(
    st.tuples(st.sampled_from(["put", "again", "moved", "remove", "commit", "reopen"]),
              st.integers(0, 3)),
    max_size=60,
)  # fmt: skip


@settings(max_examples=200, deadline=None)
@given(steps)
def test_what_is_committed_is_what_is_loaded(
    tmp_path_factory: pytest.TempPathFactory, plan: list[tuple[str, int]]
) -> None:
    what_is_committed_is_what_is_loaded(tmp_path_factory.mktemp("store"), plan)


@settings(max_examples=100, deadline=None)
@given(steps)
def test_what_is_committed_is_what_is_loaded_with_requests_moved_from_old_batches(
    tmp_path_factory: pytest.TempPathFactory, plan: list[tuple[str, int]]
) -> None:
    """Requests in old batches move at every other commit."""
    with mock.patch.multiple(store_module, _SWEEP_EVERY=2, _SWEEP_AGE=1, _SPARSE=4):
        what_is_committed_is_what_is_loaded(tmp_path_factory.mktemp("store"), plan)


def what_is_committed_is_what_is_loaded(directory: Path, plan: list[tuple[str, int]]) -> None:
    store = JobStore(directory)
    committed: dict[bytes, StoredJob] = {}
    pending: dict[bytes, StoredJob | None] = {}

    def current(msgid: bytes) -> StoredJob | None:
        return pending[msgid] if msgid in pending else committed.get(msgid)

    try:
        for word, n in plan:
            msgid = b"m%d" % n
            was = current(msgid)
            if word in ("put", "again", "moved", "remove"):
                if word == "put" and was is None:
                    pending[msgid] = job(msgid, store.next_position())
                elif word == "again" and was is not None:
                    pending[msgid] = was._replace(attempts=was.attempts + 1)
                elif word == "moved" and was is not None:
                    pending[msgid] = job(msgid, store.next_position())
                elif word == "remove":
                    pending[msgid] = None
                else:
                    continue
            else:
                if word == "commit":
                    store.commit()
                elif word == "reopen":
                    store.close()  # commits what is pending
                    store = JobStore(directory)
                for key, value in pending.items():
                    if value is None:
                        committed.pop(key, None)
                    else:
                        committed[key] = value
                pending.clear()
                expected = sorted(committed.values(), key=lambda j: j.position)
                assert store.load() == expected
                assert store.count() == len(expected)
                continue
            change = pending[msgid]
            if change is None:
                store.remove(msgid)
            else:
                store.put(change)
    finally:
        store.close()
