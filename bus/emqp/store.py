"""Guaranteed requests on disk: SQLite in WAL mode in the broker's data directory.

Requests are kept a row per committed batch (:mod:`bus.emqp.jobbatch`: tables
``job_batches`` and ``job_gone``); a store of a row per request, as brokers wrote it before,
is moved over at its first open. The broker's schedules live here too (table ``schedules``, one row per
:class:`bus.emqp.schedules.Schedule`), changed and committed the same way.

A request with the ``guarantee`` header is put here when the broker accepts it and removed
once its worker replies or the broker gives up on it. Changes made while handling one batch
of messages are collected (the last change per request wins) and committed in one
transaction by :meth:`JobStore.commit`, which the service calls before it sends anything
that batch produced that the commit changes (:attr:`JobStore.changing`): a guaranteed request
is on disk before any worker sees it. With
``synchronous=NORMAL`` a commit survives ``kill -9`` of the broker; ``durability="full"``
also survives a power loss (one fsync per commit).
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path

from bus.emqp import jobbatch
from bus.emqp.jobbatch import StoredJob
from bus.extension import StorageError
from bus.util.files import replace_atomically
from bus.util.sqlitewal import (
    Checkpointer,
    Durability,
    WalStatus,
    final_checkpoint,
    open_exclusive,
    open_wal,
)

__all__ = ["BROKER_ID_FILE", "DB_NAME", "JobStore", "StoreExport", "StoredJob", "kept_broker_id"]

DB_NAME = "emqp.sqlite3"

#: Guaranteed requests: a row per committed batch (:mod:`bus.emqp.jobbatch`). Before, a row
#: per request (table ``jobs``), keyed by msgid and then by position: :func:`_jobs_in_batches`
#: moves such a store over at its first open.
_OLD_JOBS = """
CREATE TABLE jobs (
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
#: A store written before keyed by msgid: the same columns.
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
_PUT_SCHEDULE = "INSERT OR REPLACE INTO schedules VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
_DELETE_SCHEDULE = "DELETE FROM schedules WHERE id = ?"
#: A schedule as the store keeps it: the values of :class:`bus.emqp.schedules.ScheduleRow`.
ScheduleValues = tuple[
    str, bytes, bytes, float | None, str | None, bytes, float, float, int, float | None
]


class JobStore:
    """The broker's guaranteed requests and schedules in SQLite: changes collected as a batch is
    handled, committed together by :meth:`commit` before anything of the batch is sent."""

    def __init__(self, directory: Path | str, durability: Durability = "normal") -> None:
        self.directory = Path(directory)
        self.path = self.directory / DB_NAME
        self._db = open_wal(self.path, durability)
        #: msgid -> where its committed request is (``batch << SLOT_BITS | index``).
        self._slots: dict[bytes, int] = {}
        #: batch -> its requests removed (:mod:`bus.emqp.jobbatch`'s bits, as an int: bit i is
        #: request i), and how many are left.
        self._gone: dict[int, int] = {}
        self._left: dict[int, int] = {}
        last_position = 0
        last_batch = 0
        try:
            self._db.executescript(_SCHEMA)
            _jobs_in_batches(self._db)
            for batch, jobs, bits in _batches(self._db):
                last_batch = batch
                left = 0
                for index, job in enumerate(jobs):
                    if not jobbatch.is_gone(bits, index):
                        self._slots[job.msgid] = batch << _SLOT_BITS | index
                        last_position = max(last_position, job.position)
                        left += 1
                if left:
                    self._gone[batch] = int.from_bytes(bits or b"", "little")
                    self._left[batch] = left
        except (sqlite3.Error, ValueError) as error:
            self._db.close()
            raise StorageError(error) from error
        self._next_batch = last_batch + 1
        #: msgid -> the row to write, or None to delete it; applied by commit().
        self._pending: dict[bytes, StoredJob | None] = {}
        changes = jobbatch.changes(self._pending, last_position + 1)
        # The changes a broker makes per guaranteed job, bound here: compiled where built,
        # they cost no Python frame (bench/README.md, "The store's changes in C").
        #: A new request's row (not yet dispatched) kept at the next position, at the next
        #: :meth:`commit`: ``put_new(msgid, client, queue, headers, body, received,
        #: retries_left)`` returns that position.
        self.put_new: Callable[[bytes, bytes, bytes, bytes, bytes, float, int], int]
        self.put_new = changes.put_new
        #: ``remove(msgid)``: forget the request, at the next :meth:`commit`.
        self.remove: Callable[[bytes], None] = changes.remove
        #: ``next_position()``: a new position (the order requests are dispatched again in
        #: after a restart).
        self.next_position: Callable[[], int] = changes.next_position
        #: schedule id -> its row to write, or None to delete it.
        self._pending_schedules: dict[str, ScheduleValues | None] = {}
        #: queue -> paused (True) or resumed (False) by an operator.
        self._pending_paused: dict[bytes, bool] = {}
        self._checkpointer = Checkpointer(self.path)
        self._cursor = self._db.cursor()
        self.stored = 0
        self.commits = 0
        self._closed = False

    @property
    def dirty(self) -> bool:
        """Changes wait for :meth:`commit`."""
        return bool(self._pending or self._pending_schedules or self._pending_paused)

    @property
    def changing(self) -> Mapping[bytes, StoredJob | None]:
        """The requests whose rows the next :meth:`commit` writes or deletes, by msgid."""
        return self._pending

    @property
    def changing_requests_only(self) -> bool:
        """Changes wait, and all of them are requests' rows: no schedule's (a run fired,
        its next time), no paused queue's."""
        return bool(self._pending) and not self._pending_schedules and not self._pending_paused

    def put(self, job: StoredJob) -> None:
        """Keep ``job``, at the next :meth:`commit`."""
        self._pending[job.msgid] = job

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
        pending = self._pending
        if self.commits % _SWEEP_EVERY == _SWEEP_EVERY - 1:
            for straggler in self._stragglers():
                pending.setdefault(straggler.msgid, straggler)
        slots = self._slots
        gone = self._gone
        left = self._left
        # The rows to write, the bits this commit sets by batch (as an int: bit i is request
        # i, removed or put again) and the msgids removed.
        kept, marked, dropped = jobbatch.settle(pending, slots)
        emptied = [(batch,) for batch, bits in marked.items() if left[batch] == bits.bit_count()]
        # Only a batch marked before has a row in job_gone: no DELETE for the others (a
        # statement a commit where a batch's requests are all replied at once).
        with_marks = [each for each in emptied if gone[each[0]]]
        marks = [
            (batch, _bits_blob(gone[batch] | bits))
            for batch, bits in marked.items()
            if left[batch] != bits.bit_count()
        ]
        first = self._next_batch
        batches = list(jobbatch.batches_of(kept))
        rows = [(first + n, jobbatch.pack(jobs)) for n, jobs in enumerate(batches)]
        schedules = self._pending_schedules
        paused = self._pending_paused
        db = self._cursor  # one cursor: db.execute would make one a statement
        try:
            db.execute("BEGIN")
            if emptied:
                db.executemany(jobbatch.DELETE_BATCH, emptied)
                if with_marks:
                    db.executemany(jobbatch.DELETE_MARKS, with_marks)
            if marks:
                db.executemany(jobbatch.MARK, marks)
            if rows:
                db.executemany(jobbatch.INSERT, rows)
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
            if self._db.in_transaction:
                with contextlib.suppress(sqlite3.Error):
                    self._db.execute("ROLLBACK")
            raise StorageError(error) from error
        for batch, bits in marked.items():
            if left[batch] == bits.bit_count():
                del left[batch], gone[batch]
            else:
                left[batch] -= bits.bit_count()
                gone[batch] |= bits
        jobbatch.committed(slots, dropped, batches, first)
        for n, jobs in enumerate(batches):
            gone[first + n] = 0
            left[first + n] = len(jobs)
        self._next_batch = first + len(rows)
        self._pending.clear()
        schedules.clear()
        paused.clear()
        self.commits += 1

    def _stragglers(self) -> list[StoredJob]:
        """The requests left in old batches that hold few (:data:`_SPARSE`): put again, they
        move to this commit's batch and their old batch goes. Without this, a request that
        waits long (a queue nobody serves) would keep a whole batch's blob on disk."""
        young = self._next_batch - _SWEEP_AGE
        sparse = [b for b, n in self._left.items() if b < young and n <= _SPARSE]
        moved: list[StoredJob] = []
        try:
            for batch in sparse[:_SWEEP_BATCHES]:
                row = self._db.execute(
                    "SELECT jobs FROM job_batches WHERE id = ?", (batch,)
                ).fetchone()
                if row is None:
                    continue
                for index, job in enumerate(jobbatch.unpack(bytes(row[0]))):
                    if self._slots.get(job.msgid) == batch << _SLOT_BITS | index:
                        moved.append(job)
        except (sqlite3.Error, ValueError) as error:
            raise StorageError(error) from error
        return moved

    def load(self) -> list[StoredJob]:
        """Every stored request, oldest first."""
        try:
            return _stored_jobs(self._db)
        except (sqlite3.Error, ValueError) as error:
            raise StorageError(error) from error

    def count(self) -> int:
        """Requests kept (as last committed)."""
        return len(self._slots)

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


_SLOT_BITS = jobbatch.SLOT_BITS
#: Every so many commits, requests left in old, nearly emptied batches move to the commit's
#: new batch (:meth:`JobStore._stragglers`): batches older than ``_SWEEP_AGE`` batches that
#: hold at most ``_SPARSE`` requests, ``_SWEEP_BATCHES`` of them at most a time.
_SWEEP_EVERY = 256
_SWEEP_AGE = 256
_SPARSE = jobbatch.BATCH_JOBS // 8
_SWEEP_BATCHES = 4


def _bits_blob(bits: int) -> bytes:
    """A batch's bits as ``job_gone`` keeps them (bit i of the int: bit i % 8 of byte i // 8)."""
    return bits.to_bytes((bits.bit_length() + 7) >> 3, "little")


def _batches(db: sqlite3.Connection) -> Iterator[tuple[int, list[StoredJob], bytes | None]]:
    """Every batch: its id, its requests (removed ones too) and its bits (None: none gone).
    ValueError for a blob that is not a batch."""
    for batch, blob, bits in db.execute(jobbatch.SELECT).fetchall():
        yield batch, list(jobbatch.unpack(bytes(blob))), None if bits is None else bytes(bits)


def _stored_jobs(db: sqlite3.Connection) -> list[StoredJob]:
    """Every request not removed, by position (the order they are dispatched again in)."""
    stored = [
        job
        for _, jobs, bits in _batches(db)
        for index, job in enumerate(jobs)
        if not jobbatch.is_gone(bits, index)
    ]
    stored.sort(key=lambda job: job.position)
    return stored


def _jobs_in_batches(db: sqlite3.Connection) -> None:
    """Keep requests in batches (:mod:`bus.emqp.jobbatch`); a store written before, with a
    row per request (table ``jobs``, keyed by position or, earlier, by msgid), moves them
    there in one transaction, in their order (positions numbered again from 1 where two of
    a store keyed by msgid shared one)."""
    row = db.execute(
        "SELECT sql FROM sqlite_master WHERE type = 'table' AND name = 'jobs'"
    ).fetchone()
    if row is None:
        db.executescript(jobbatch.SCHEMA)
        return
    by_msgid = _JOBS_BY_MSGID in str(row[0]).upper()
    try:
        db.execute("BEGIN")
        for statement in jobbatch.SCHEMA.split(";"):
            if statement.strip():
                db.execute(statement)
        jobs = [
            StoredJob(bytes(msgid), int(position), bytes(client), bytes(queue), bytes(headers),
                      bytes(body), float(received), int(attempts), int(retries_left))
            for msgid, position, client, queue, headers, body, received, attempts, retries_left
            in db.execute(
                "SELECT msgid, position, client, queue, headers, body, received, attempts, "
                "retries_left FROM jobs ORDER BY position, msgid"
            )
        ]  # fmt: skip
        if by_msgid and len({job.position for job in jobs}) < len(jobs):
            jobs = [job._replace(position=n) for n, job in enumerate(jobs, 1)]
        first = db.execute("SELECT coalesce(max(id), 0) + 1 FROM job_batches").fetchone()[0]
        db.executemany(
            jobbatch.INSERT,
            [
                (first + n, jobbatch.pack(chunk))
                for n, chunk in enumerate(jobbatch.batches_of(jobs))
            ],
        )
        db.execute("DROP TABLE jobs")
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
        if "schedules" not in tables or not tables & {"job_batches", "jobs"}:  # or before
            self._db.close()
            raise StorageError(sqlite3.DatabaseError(f"{self.path} is not an eMQP broker's store"))
        try:
            _jobs_in_batches(self._db)  # as the broker would at its next start
        except sqlite3.Error as error:
            self._db.close()
            raise StorageError(sqlite3.DatabaseError(f"{self.path}: {error}")) from error

    def jobs(self) -> list[StoredJob]:
        """Every stored request, in the order the broker dispatches them."""
        try:
            return _stored_jobs(self._db)
        except ValueError as error:
            raise StorageError(sqlite3.DatabaseError(f"{self.path}: {error}")) from error

    def schedules(self) -> list[ScheduleValues]:
        """Every schedule, soonest due first."""
        return list(self._db.execute("SELECT * FROM schedules ORDER BY next_due").fetchall())

    def remove(self, msgids: list[bytes], schedule_ids: list[str]) -> None:
        """Forget those requests and schedules, in one transaction (:class:`StorageError`
        when it cannot: then nothing is forgotten)."""
        db = self._db
        wanted = set(msgids)
        try:
            emptied: list[tuple[int]] = []
            marks: list[tuple[int, bytes]] = []
            for batch, jobs, old in _batches(db):
                gone = int.from_bytes(old or b"", "little")  # as JobStore keeps them
                bits = gone
                for index, job in enumerate(jobs):
                    if job.msgid in wanted:
                        bits |= 1 << index
                if bits == gone:
                    continue
                every = (1 << len(jobs)) - 1
                if bits & every == every:
                    emptied.append((batch,))
                else:
                    marks.append((batch, _bits_blob(bits)))
            db.execute("BEGIN")
            db.executemany(jobbatch.DELETE_BATCH, emptied)
            db.executemany(jobbatch.DELETE_MARKS, emptied)
            db.executemany(jobbatch.MARK, marks)
            db.executemany(_DELETE_SCHEDULE, [(each,) for each in schedule_ids])
            db.execute("COMMIT")
        except (sqlite3.Error, ValueError) as error:
            if db.in_transaction:
                with contextlib.suppress(sqlite3.Error):
                    db.execute("ROLLBACK")
            raise StorageError(sqlite3.DatabaseError(f"{self.path}: {error}")) from error

    def close(self) -> None:
        """Close the store (and its lock)."""
        self._db.close()
