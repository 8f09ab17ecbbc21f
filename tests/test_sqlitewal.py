"""The WAL's bound (bus.util.sqlitewal.Checkpointer) on real SQLite files: a PASSIVE
checkpoint each run, a RESTART one once the WAL holds more than its limit of frames, given up
at once when a commit or a read is in progress (tried ``tries`` times a run); the file kept
and written over from its start after a restart (the commits never cut it), or cut to
nothing by the checkpoint (TRUNCATE) when it is above twice its limit. The clock and the
pause between attempts are injected."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bus.util import sqlitewal
from bus.util.sqlitewal import Checkpointer, bindable_rows, open_wal

LIMIT = 256 * 1024
ROW = b"x" * 1000


class Clock:
    """A timer that advances 5 ms a reading, and a sleep that records its pauses."""

    def __init__(self) -> None:
        self.now = 0.0
        self.pauses: list[float] = []

    def timer(self) -> float:
        self.now += 0.005
        return self.now

    def sleep(self, seconds: float) -> None:
        self.pauses.append(seconds)


@pytest.fixture
def db(tmp_path: Path) -> Iterator[sqlite3.Connection]:
    connection = open_wal(tmp_path / "t.sqlite3", "normal")
    connection.execute("CREATE TABLE t (n INTEGER PRIMARY KEY, data BLOB)")
    yield connection
    connection.close()


def fill(db: sqlite3.Connection, rows: int, start: int = 0) -> None:
    """One commit a row: a frame or more each in the WAL."""
    for n in range(start, start + rows):
        db.execute("INSERT INTO t VALUES (?, ?)", (n, ROW))


def wal_size(path: Path) -> int:
    return path.with_name(path.name + "-wal").stat().st_size


def checkpointer(path: Path, limit: int | None, clock: Clock) -> Checkpointer:
    return Checkpointer(path, limit, tries=3, pause=0.002, timer=clock.timer, sleep=clock.sleep)


def test_a_wal_file_above_twice_its_limit_is_started_over_and_cut_by_the_checkpoint(
    db: sqlite3.Connection, tmp_path: Path
) -> None:
    path = tmp_path / "t.sqlite3"
    fill(db, 1000)
    assert wal_size(path) > 4 * LIMIT
    clock = Clock()
    checking = checkpointer(path, LIMIT, clock)
    try:
        log, copied = checking.run()
        assert log > 0 and copied == log
        status = checking.status()
        assert (status.checkpoints, status.restarts, status.restarts_busy) == (1, 1, 0)
        assert status.longest_hold == pytest.approx(0.005)  # one timer step: one attempt
        assert clock.pauses == []
        assert wal_size(path) == 0  # cut by the checkpoint (TRUNCATE), not by a commit
        fill(db, 1, start=1000)
        assert 0 < wal_size(path) <= LIMIT
        assert checking.status().wal_bytes == wal_size(path)
        assert db.execute("SELECT count(*), sum(length(data)) FROM t").fetchone() == (
            1001,
            1001 * len(ROW),
        )
    finally:
        checking.close()


def test_a_wal_restarted_below_twice_its_limit_is_kept_and_written_over(
    db: sqlite3.Connection, tmp_path: Path
) -> None:
    """The commit after a restart does not cut the file (a cut costs the committing thread,
    the reactor's, the kernel's time): it writes the WAL from its start, over the file."""
    path = tmp_path / "t.sqlite3"
    rows = 0
    while wal_size(path) <= LIMIT:
        fill(db, 10, start=rows)
        rows += 10
    size = wal_size(path)
    assert size < 2 * LIMIT
    clock = Clock()
    checking = checkpointer(path, LIMIT, clock)
    try:
        checking.run()
        assert checking.status().restarts == 1
        assert wal_size(path) == size
        fill(db, 10, start=rows)
        assert wal_size(path) == size  # written from its start, not cut, not grown
        checking.run()
        assert checking.status().restarts == 1  # a few frames in it: below the limit
        assert db.execute("SELECT count(*) FROM t").fetchone() == (rows + 10,)
    finally:
        checking.close()


def test_a_wal_below_its_limit_gets_passive_checkpoints_only(
    db: sqlite3.Connection, tmp_path: Path
) -> None:
    path = tmp_path / "t.sqlite3"
    fill(db, 20)
    assert 0 < wal_size(path) < LIMIT
    clock = Clock()
    checking = checkpointer(path, LIMIT, clock)
    try:
        checking.run()
        checking.run()
        status = checking.status()
        assert (status.checkpoints, status.restarts, status.restarts_busy) == (2, 0, 0)
        assert status.longest_hold == 0.0 and clock.now == 0.0  # no RESTART was timed
    finally:
        checking.close()


def test_without_a_limit_the_wal_is_never_restarted(db: sqlite3.Connection, tmp_path: Path) -> None:
    path = tmp_path / "t.sqlite3"
    fill(db, 1000)
    clock = Clock()
    checking = checkpointer(path, None, clock)
    try:
        checking.run()
        assert checking.status().restarts == 0 and checking.status().limit is None
        assert wal_size(path) > 4 * LIMIT
    finally:
        checking.close()


@pytest.mark.parametrize("holder", ["reader", "writer"])
def test_a_restart_meeting_a_read_or_a_commit_in_progress_gives_up_and_tries_again(
    db: sqlite3.Connection, tmp_path: Path, holder: str
) -> None:
    """A read transaction on an older snapshot keeps frames the RESTART must wait for; a
    write transaction holds the writer's lock it needs. Either way it returns at once (no
    busy wait), ``tries`` times with the pause between, and succeeds once they end."""
    path = tmp_path / "t.sqlite3"
    other = sqlite3.connect(path, isolation_level=None)
    try:
        if holder == "reader":
            other.execute("BEGIN")
            assert other.execute("SELECT count(*) FROM t").fetchone() == (0,)
            fill(db, 1000)
        else:
            fill(db, 1000)
            other.execute("BEGIN IMMEDIATE")
        clock = Clock()
        checking = checkpointer(path, LIMIT, clock)
        try:
            checking.run()
            status = checking.status()
            assert (status.restarts, status.restarts_busy) == (0, 3)
            assert clock.pauses == [0.002, 0.002]
            other.execute("COMMIT")
            checking.run()
            status = checking.status()
            assert (status.restarts, status.restarts_busy) == (1, 3)
            fill(db, 1, start=1000)
            assert 0 < wal_size(path) <= LIMIT
            assert db.execute("SELECT count(*) FROM t").fetchone() == (1001,)
        finally:
            checking.close()
    finally:
        other.close()


def test_the_status_says_the_bound_and_what_the_checkpoints_did(
    db: sqlite3.Connection, tmp_path: Path
) -> None:
    path = tmp_path / "t.sqlite3"
    fill(db, 1000)
    checking = checkpointer(path, LIMIT, Clock())
    try:
        checking.run()
        keys = checking.status().as_status()
        assert keys == {
            "wal_bytes": wal_size(path),
            "wal_limit": LIMIT,
            "wal_checkpoints": 1,
            "wal_restarts": 1,
            "wal_restarts_busy": 0,
            "wal_longest_hold_ms": 5.0,
        }
    finally:
        checking.close()


# -- bindable_rows ---------------------------------------------------------------------

values = st.one_of(
    st.binary(max_size=40), st.integers(-(2**63), 2**63 - 1), st.floats(allow_nan=False),
    st.text(max_size=10), st.none(), st.binary(max_size=5).map(bytearray),
)  # fmt: skip


@settings(max_examples=200, deadline=None)
@given(st.lists(st.lists(values, max_size=9), max_size=8))
def test_bindable_rows_compiled_or_not_store_the_same_values(rows: list[list[Any]]) -> None:
    python_rows = [tuple(row) for row in rows]
    saved = sqlitewal.native_rows
    try:
        built = bindable_rows(rows)
        sqlitewal.native_rows = None
        assert bindable_rows(rows) == python_rows
    finally:
        sqlitewal.native_rows = saved
    assert built == python_rows and all(type(row) is tuple for row in built)
    db = sqlite3.connect(":memory:")
    for row in built:
        if row:
            stored = db.execute(f"SELECT {', '.join('?' * len(row))}", row).fetchone()
            assert stored == tuple(bytes(v) if isinstance(v, bytearray) else v for v in row)


def test_compiled_bindable_rows_hand_bytes_over_as_bytearray() -> None:
    if sqlitewal.native_rows is None:
        pytest.skip("the compiled row builder is not built")
    [row, empty] = bindable_rows([[b"msgid", b"", 3, "text", 1.5, None], ()])
    assert row == (bytearray(b"msgid"), b"", 3, "text", 1.5, None) and empty == ()
    assert [type(v) for v in row] == [bytearray, bytes, int, str, float, type(None)]
    with pytest.raises(TypeError):
        bindable_rows([5])  # a row must be a sequence
