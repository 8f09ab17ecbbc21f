"""Guaranteed requests on disk: SQLite in WAL mode in the broker's data directory.

The broker's schedules live here too (table ``schedules``, one row per
:class:`bus.emqp.schedules.Schedule`), changed and committed the same way.

A request with the ``guarantee`` header is put here when the broker accepts it and removed
once its worker replies or the broker gives up on it. Changes made while handling one batch
of messages are collected (the last change per request wins) and committed in one
transaction by :meth:`JobStore.commit`, which the service calls before it sends anything
that batch produced: a guaranteed request is on disk before any worker sees it. With
``synchronous=NORMAL`` a commit survives ``kill -9`` of the broker; ``durability="full"``
also survives a power loss (one fsync per commit).
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
from pathlib import Path
from typing import NamedTuple

from bus.extension import StorageError
from bus.util.files import replace_atomically
from bus.util.sqlitewal import (
    Checkpointer,
    Durability,
    WalStatus,
    bindable_rows,
    execute_grouped,
    final_checkpoint,
    open_exclusive,
    open_wal,
)

DB_NAME = "emqp.sqlite3"

#: Requests keyed by their position, which only grows: a commit's new rows go at the right
#: edge of the table's B-tree and the rows its replies remove are mostly at the left. Keyed by
#: msgid (a client's uuid4: random), each commit changed pages all over the table, and SQLite
#: writes every page a commit changes to the WAL (bench/README.md, "The job store's key": the
#: broker's CPU per guaranteed job 47.3 -> 36.0 us). :class:`JobStore` keeps each row's msgid
#: in memory.
_JOBS = """
CREATE TABLE IF NOT EXISTS jobs (
    msgid BLOB NOT NULL,
    position INTEGER PRIMARY KEY,
    client BLOB NOT NULL,
    queue BLOB NOT NULL,
    headers BLOB NOT NULL,
    body BLOB NOT NULL,
    received REAL NOT NULL,
    attempts INTEGER NOT NULL,
    retries_left INTEGER NOT NULL
);
"""
#: A store written before: the same columns, keyed by msgid.
_JOBS_BY_MSGID = "WITHOUT ROWID"
_SCHEMA = """
CREATE TABLE IF NOT EXISTS schedules (
    id TEXT PRIMARY KEY,
    queue BLOB NOT NULL,
    headers BLOB NOT NULL,
    interval REAL,
    cron TEXT,
    body BLOB NOT NULL,
    created REAL NOT NULL,
    next_due REAL NOT NULL,
    runs INTEGER NOT NULL,
    last_run REAL
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS paused_queues (queue BLOB PRIMARY KEY) WITHOUT ROWID;
"""
_PUT = "INSERT OR REPLACE INTO jobs VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)"
_DELETE = "DELETE FROM jobs WHERE position = ?"
#: Rows one statement writes or deletes, largest first: SQLite steps a statement once for a
#: group, where executemany binds, steps and resets one per row (a commit takes any count,
#: from a few to hundreds; each size is compiled once, in sqlite3's statement cache).
_GROUPS = (64, 16, 4)
_PUTS = {
    n: "INSERT OR REPLACE INTO jobs VALUES " + ", ".join(["(?, ?, ?, ?, ?, ?, ?, ?, ?)"] * n)
    for n in _GROUPS
}
_DELETES = {n: f"DELETE FROM jobs WHERE position IN ({', '.join('?' * n)})" for n in _GROUPS}
_PUT_SCHEDULE = "INSERT OR REPLACE INTO schedules VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
_DELETE_SCHEDULE = "DELETE FROM schedules WHERE id = ?"
#: A schedule as the store keeps it: the values of :class:`bus.emqp.schedules.ScheduleRow`.
ScheduleValues = tuple[
    str, bytes, bytes, float | None, str | None, bytes, float, float, int, float | None
]


class StoredJob(NamedTuple):
    """A guaranteed request as a row of the store: enough to dispatch it again after a restart.

    A named tuple: the row itself, bound as it is (a broker puts one per guaranteed job)."""

    msgid: bytes
    position: int
    client: bytes
    queue: bytes
    headers: bytes
    body: bytes
    received: float
    attempts: int
    retries_left: int


class JobStore:
    """The broker's guaranteed requests and schedules in SQLite: changes collected as a batch is
    handled, committed together by :meth:`commit` before anything of the batch is sent."""

    def __init__(self, directory: Path | str, durability: Durability = "normal") -> None:
        self.directory = Path(directory)
        self.path = self.directory / DB_NAME
        self._db = open_wal(self.path, durability)
        try:
            self._db.executescript(_SCHEMA)
            _jobs_by_position(self._db)
            #: msgid -> the position of its committed row.
            self._positions: dict[bytes, int] = {
                bytes(msgid): position
                for msgid, position in self._db.execute("SELECT msgid, position FROM jobs")
            }
        except sqlite3.Error as error:
            self._db.close()
            raise StorageError(error) from error
        self._next_position = max(self._positions.values(), default=0) + 1
        #: msgid -> the row to write, or None to delete it; applied by commit().
        self._pending: dict[bytes, StoredJob | None] = {}
        #: schedule id -> its row to write, or None to delete it.
        self._pending_schedules: dict[str, ScheduleValues | None] = {}
        #: queue -> paused (True) or resumed (False) by an operator.
        self._pending_paused: dict[bytes, bool] = {}
        self._checkpointer = Checkpointer(self.path)
        self.stored = 0
        self.commits = 0
        self._closed = False

    @property
    def dirty(self) -> bool:
        """Changes wait for :meth:`commit`."""
        return bool(self._pending or self._pending_schedules or self._pending_paused)

    def next_position(self) -> int:
        """A new position (the order requests are dispatched again in after a restart)."""
        position = self._next_position
        self._next_position += 1
        return position

    def put(self, job: StoredJob) -> None:
        """Keep ``job``, at the next :meth:`commit`."""
        self._pending[job.msgid] = job

    def remove(self, msgid: bytes) -> None:
        """Forget request ``msgid``, at the next :meth:`commit`."""
        self._pending[msgid] = None

    def put_schedule(self, row: ScheduleValues) -> None:
        """Keep a schedule's row, at the next :meth:`commit`."""
        self._pending_schedules[row[0]] = row

    def remove_schedule(self, schedule_id: str) -> None:
        """Forget schedule ``schedule_id``, at the next :meth:`commit`."""
        self._pending_schedules[schedule_id] = None

    def set_paused(self, queue: bytes, paused: bool) -> None:
        """Keep whether an operator paused ``queue``, at the next :meth:`commit`."""
        self._pending_paused[queue] = paused

    def load_paused(self) -> list[bytes]:
        """The queues an operator paused and did not resume (as last committed)."""
        return [bytes(row[0]) for row in self._db.execute("SELECT queue FROM paused_queues")]

    def load_schedules(self) -> list[ScheduleValues]:
        """Every schedule kept, soonest due first."""
        return list(self._db.execute("SELECT * FROM schedules ORDER BY next_due").fetchall())

    def discard(self, msgid: bytes) -> None:
        """Forget a pending change not yet committed (a request refused before it was)."""
        self._pending.pop(msgid, None)

    def commit(self) -> None:
        """Write every pending change in one transaction. On failure nothing is written,
        the changes stay pending for the next call, and :class:`StorageError` is raised."""
        if not self.dirty:
            return
        positions = self._positions
        kept: list[StoredJob] = []
        deletes: list[tuple[int]] = []
        for msgid, job in self._pending.items():
            position = positions.get(msgid)
            if job is not None:
                kept.append(job)
                if position is None or position == job.position:
                    continue
            if position is not None:
                deletes.append((position,))
        # Each non-empty blob as a bytearray where the helper is built: bound without
        # sqlite3's adapter search (a sixth of a guaranteed job's store work), same BLOBs.
        puts = bindable_rows(kept)
        schedules = self._pending_schedules
        paused = self._pending_paused
        db = self._db
        try:
            db.execute("BEGIN")
            if deletes:
                execute_grouped(db, _DELETES, _DELETE, deletes)
            if puts:
                execute_grouped(db, _PUTS, _PUT, puts)
            if schedules:
                db.executemany(_PUT_SCHEDULE, [r for r in schedules.values() if r is not None])
                db.executemany(_DELETE_SCHEDULE, [(i,) for i, r in schedules.items() if r is None])
            if paused:
                db.executemany(
                    "INSERT OR IGNORE INTO paused_queues VALUES (?)",
                    [(q,) for q, held in paused.items() if held],
                )
                db.executemany(
                    "DELETE FROM paused_queues WHERE queue = ?",
                    [(q,) for q, held in paused.items() if not held],
                )
            db.execute("COMMIT")
        except sqlite3.Error as error:
            if db.in_transaction:
                with contextlib.suppress(sqlite3.Error):
                    db.execute("ROLLBACK")
            raise StorageError(error) from error
        for msgid, job in self._pending.items():
            if job is None:
                positions.pop(msgid, None)
            else:
                positions[msgid] = job.position
        self._pending.clear()
        schedules.clear()
        paused.clear()
        self.commits += 1

    def load(self) -> list[StoredJob]:
        """Every stored request, oldest first."""
        rows = self._db.execute(
            "SELECT msgid, position, client, queue, headers, body, received, attempts, "
            "retries_left FROM jobs ORDER BY position"
        ).fetchall()
        return [StoredJob(*row) for row in rows]

    def count(self) -> int:
        """Requests kept (as last committed)."""
        return len(self._positions)

    def checkpoint(self) -> int:
        """Copy committed WAL pages into the database without blocking the writer (PASSIVE,
        on a connection of its own): safe from one worker thread while the owner commits.
        Once the WAL holds more than its bound (:data:`bus.util.sqlitewal.DEFAULT_WAL_LIMIT`),
        a RESTART checkpoint starts it over (commits wait while it copies the last frames).
        Returns the pages copied; raises :class:`StorageError` when SQLite cannot."""
        return self._checkpointer.run()[1]

    def wal_status(self) -> WalStatus:
        """The WAL's size (bounded: see :class:`bus.util.sqlitewal.Checkpointer`) and what
        the checkpoints did."""
        return self._checkpointer.status()

    def close(self) -> None:
        """Commit what is pending, empty the WAL and close (call it once no checkpoint()
        runs). Raises :class:`StorageError` when the last commit fails; closed anyway."""
        if self._closed:
            return
        self._closed = True
        try:
            self.commit()
            with contextlib.suppress(StorageError):
                final_checkpoint(self._db)
        finally:
            self._checkpointer.close()
            self._db.close()


def _jobs_by_position(db: sqlite3.Connection) -> None:
    """Make the table ``jobs`` keyed by position (:data:`_JOBS`); a store written before,
    keyed by msgid, moves its rows there in one transaction, in their order (positions
    numbered again from 1 where two rows shared one)."""
    row = db.execute(
        "SELECT sql FROM sqlite_master WHERE type = 'table' AND name = 'jobs'"
    ).fetchone()
    if row is None:
        db.executescript(_JOBS)
        return
    if _JOBS_BY_MSGID not in str(row[0]).upper():
        return
    columns = "client, queue, headers, body, received, attempts, retries_left"
    try:
        db.execute("BEGIN")
        db.execute("ALTER TABLE jobs RENAME TO jobs_by_msgid")
        db.execute(_JOBS)
        shared = db.execute(
            "SELECT count(*) - count(DISTINCT position) FROM jobs_by_msgid"
        ).fetchone()[0]
        position = "row_number() OVER (ORDER BY position, msgid)" if shared else "position"
        db.execute(f"INSERT INTO jobs SELECT msgid, {position}, {columns} FROM jobs_by_msgid")
        db.execute("DROP TABLE jobs_by_msgid")
        db.execute("COMMIT")
    except sqlite3.Error:
        if db.in_transaction:
            with contextlib.suppress(sqlite3.Error):
                db.execute("ROLLBACK")
        raise


#: The file in the data directory that keeps a broker's id among the brokers of a stream.
BROKER_ID_FILE = "broker-id"


def kept_broker_id(data_dir: Path | str) -> bytes:
    """The id a broker on ``data_dir`` has among the brokers of a stream
    (``--store jetstream``): the one kept there, or one made now and kept (so that a
    broker restarted there still gets its clients' answers). OSError when it cannot be
    read or written."""
    path = Path(data_dir) / BROKER_ID_FILE
    try:
        kept = path.read_text().strip()
    except FileNotFoundError:
        kept = ""
    if not kept:
        kept = os.urandom(6).hex()
        replace_atomically(path, kept + "\n", fsync=True)
    return kept.encode()


class StoreExport:
    """A broker's store read whole, and emptied of what was moved, by a process that has it
    alone (``emqp-cli import-store``): no broker may have it open
    (:class:`bus.util.sqlitewal.InUse` says so at once), and none can open it meanwhile."""

    def __init__(self, directory: Path | str) -> None:
        self.directory = Path(directory)
        self.path = self.directory / DB_NAME
        self._db = open_exclusive(self.path)
        try:
            tables = {row[0] for row in self._db.execute("SELECT name FROM sqlite_master")}
        except sqlite3.Error as error:
            self._db.close()
            raise StorageError(sqlite3.DatabaseError(f"{self.path}: {error}")) from error
        if not {"jobs", "schedules"} <= tables:
            self._db.close()
            raise StorageError(sqlite3.DatabaseError(f"{self.path} is not an eMQP broker's store"))
        try:
            _jobs_by_position(self._db)  # as the broker would at its next start
        except sqlite3.Error as error:
            self._db.close()
            raise StorageError(sqlite3.DatabaseError(f"{self.path}: {error}")) from error

    def jobs(self) -> list[StoredJob]:
        """Every stored request, in the order the broker dispatches them."""
        rows = self._db.execute(
            "SELECT msgid, position, client, queue, headers, body, received, attempts, "
            "retries_left FROM jobs ORDER BY position"
        ).fetchall()
        return [StoredJob(*row) for row in rows]

    def schedules(self) -> list[ScheduleValues]:
        """Every schedule, soonest due first."""
        return list(self._db.execute("SELECT * FROM schedules ORDER BY next_due").fetchall())

    def remove(self, msgids: list[bytes], schedule_ids: list[str]) -> None:
        """Forget those requests and schedules, in one transaction (:class:`StorageError`
        when it cannot: then nothing is forgotten)."""
        db = self._db
        try:
            wanted = set(msgids)
            positions = [
                (position,)
                for msgid, position in db.execute("SELECT msgid, position FROM jobs")
                if bytes(msgid) in wanted
            ]
            db.execute("BEGIN")
            db.executemany(_DELETE, positions)
            db.executemany(_DELETE_SCHEDULE, [(each,) for each in schedule_ids])
            db.execute("COMMIT")
        except sqlite3.Error as error:
            if db.in_transaction:
                with contextlib.suppress(sqlite3.Error):
                    db.execute("ROLLBACK")
            raise StorageError(sqlite3.DatabaseError(f"{self.path}: {error}")) from error

    def close(self) -> None:
        """Close the store (and its lock)."""
        self._db.close()
