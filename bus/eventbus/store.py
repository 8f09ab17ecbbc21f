"""The durable event log: SQLite in WAL mode in the data directory.

Every accepted event is committed before it is broadcast. With ``synchronous=NORMAL``
(the default) a commit reaches the operating system before ``append`` returns, so
events survive ``kill -9`` of the server; ``durability="full"`` also fsyncs every
commit, so they survive a power loss too, at the cost of one fsync per batch.

The sequence is the table's integer primary key and never goes backwards: the highest
sequence ever assigned is kept in ``meta`` before retention deletes anything.
Snapshot reads are chunked by sequence, so nothing is ever loaded whole in memory.
"""

from __future__ import annotations

import contextlib
import sqlite3
import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from bus.eventbus.codec import Event, EventFields

Durability = Literal["normal", "full"]
DB_NAME = "events.sqlite3"

_SCHEMA = """
CREATE TABLE IF NOT EXISTS events (
    seq INTEGER PRIMARY KEY,
    topic BLOB NOT NULL,
    producer BLOB NOT NULL,
    timestamp BLOB NOT NULL,
    uuid BLOB NOT NULL,
    data BLOB NOT NULL,
    received REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value);
"""
_INSERT = "INSERT INTO events VALUES (?, ?, ?, ?, ?, ?, ?)"
_COLUMNS = "seq, topic, producer, timestamp, uuid, data"


def prefix_upper_bound(prefix: bytes) -> bytes | None:
    """The smallest byte string greater than every string starting with ``prefix``."""
    stripped = prefix.rstrip(b"\xff")
    if not stripped:
        return None
    return stripped[:-1] + bytes([stripped[-1] + 1])


@dataclass(frozen=True, slots=True)
class Retention:
    """What to keep. ``None`` means no limit; everything is kept by default."""

    max_age: float | None = None
    max_count: int | None = None
    latest_per_topic: bool = False

    @property
    def enabled(self) -> bool:
        return self.max_age is not None or self.max_count is not None or self.latest_per_topic


class EventStore:
    """Append-only event log with sequence-range reads and chunked retention."""

    def __init__(
        self,
        directory: Path | str,
        durability: Durability = "normal",
        topic_index: bool = False,
    ) -> None:
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.path = self.directory / DB_NAME
        self._db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute(f"PRAGMA synchronous={'FULL' if durability == 'full' else 'NORMAL'}")
        # An automatic checkpoint would run inside a commit on the reactor thread (10-90 ms
        # stalls measured); the owner calls checkpoint() from a worker thread instead.
        self._db.execute("PRAGMA wal_autocheckpoint=0")
        self._checkpointer: sqlite3.Connection | None = None
        self._db.executescript(_SCHEMA)
        if topic_index:
            # Needed by latest-per-topic compaction; costs some insert speed.
            self._db.execute("CREATE INDEX IF NOT EXISTS events_topic ON events (topic, seq)")
        self.store_id = self._meta("store_id") or self._init_store_id()
        top = self._db.execute("SELECT MAX(seq) FROM events").fetchone()[0] or 0
        self._last = max(top, int(self._meta("high_water") or 0))
        newest = self._db.execute(
            "SELECT received FROM events ORDER BY seq DESC LIMIT 1"
        ).fetchone()
        self._last_received = 0.0 if newest is None else float(newest[0])
        self._compact_from = 0
        self._closed = False

    # -- meta ----------------------------------------------------------------------------

    def _meta(self, key: str) -> str | None:
        row = self._db.execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
        return None if row is None else str(row[0])

    def _init_store_id(self) -> str:
        store_id = str(uuid.uuid4())
        self._db.execute("INSERT INTO meta VALUES ('store_id', ?)", (store_id,))
        return store_id

    # -- writing -------------------------------------------------------------------------

    @property
    def last_sequence(self) -> int:
        """The highest sequence ever committed (survives restarts and retention)."""
        return self._last

    def append(self, events: Sequence[Event], received: float) -> list[Event]:
        """Assign the next sequences to ``events`` (whose own sequence is ignored), commit
        them in one transaction, and return them with their sequences."""
        fields = [(e.topic, e.producer, e.timestamp, e.uuid, e.data) for e in events]
        first = self.append_fields(fields, received)
        return [Event(t, seq, p, ts, u, d) for seq, (t, p, ts, u, d) in enumerate(fields, first)]

    def append_fields(self, fields: Sequence[EventFields], received: float) -> int:
        """Commit ``(topic, producer, timestamp, uuid, data)`` tuples in one transaction
        under consecutive new sequences; return the first one."""
        first = self._last + 1
        if not fields:
            return first
        # Receipt times never go backwards, so age retention can cut by sequence.
        received = max(received, self._last_received)
        rows = [(seq, *event, received) for seq, event in enumerate(fields, first)]
        db = self._db
        db.execute("BEGIN")
        try:
            db.executemany(_INSERT, rows)
            db.execute("COMMIT")
        except BaseException:
            db.execute("ROLLBACK")
            raise
        self._last = first + len(fields) - 1
        self._last_received = received
        return first

    # -- reading -------------------------------------------------------------------------

    def read(
        self,
        after: int,
        upto: int | None = None,
        prefixes: Iterable[bytes] = (),
        limit: int = 1000,
    ) -> list[Event]:
        """Events with ``after < seq <= upto`` whose topic starts with one of ``prefixes``
        (all topics when empty), in sequence order, at most ``limit`` of them."""
        clauses = ["seq > ?"]
        params: list[object] = [after]
        if upto is not None:
            clauses.append("seq <= ?")
            params.append(upto)
        wanted = list(prefixes)
        if wanted and all(wanted):  # an empty prefix matches every topic
            alternatives = []
            for prefix in wanted:
                upper = prefix_upper_bound(prefix)
                if upper is None:
                    alternatives.append("topic >= ?")
                    params.append(prefix)
                else:
                    alternatives.append("(topic >= ? AND topic < ?)")
                    params.extend((prefix, upper))
            clauses.append("(" + " OR ".join(alternatives) + ")")
        sql = f"SELECT {_COLUMNS} FROM events WHERE {' AND '.join(clauses)} ORDER BY seq LIMIT ?"
        params.append(limit)
        return [Event(t, s, p, ts, u, d) for s, t, p, ts, u, d in self._db.execute(sql, params)]

    def count(self) -> int:
        return int(self._db.execute("SELECT COUNT(*) FROM events").fetchone()[0])

    def first_sequence(self) -> int | None:
        row = self._db.execute("SELECT MIN(seq) FROM events").fetchone()
        return None if row[0] is None else int(row[0])

    def size(self) -> int:
        """Bytes on disk: the database and its write-ahead log."""
        total = 0
        for path in (self.path, self.path.with_name(self.path.name + "-wal")):
            with contextlib.suppress(FileNotFoundError):
                total += path.stat().st_size
        return total

    # -- retention -----------------------------------------------------------------------

    def _delete_upto(self, boundary: int, chunk: int) -> int:
        """Delete at most ``chunk`` of the oldest events with ``seq <= boundary``."""
        db = self._db
        db.execute("BEGIN")
        try:
            db.execute(
                "INSERT INTO meta VALUES ('high_water', ?) "
                "ON CONFLICT(key) DO UPDATE SET value = excluded.value",
                (self._last,),
            )
            cursor = db.execute(
                "DELETE FROM events WHERE seq IN "
                "(SELECT seq FROM events WHERE seq <= ? ORDER BY seq LIMIT ?)",
                (boundary, chunk),
            )
            db.execute("COMMIT")
        except BaseException:
            db.execute("ROLLBACK")
            raise
        return int(cursor.rowcount)

    def expire_older_than(self, cutoff: float, chunk: int = 5000) -> int:
        """Delete up to ``chunk`` events received before ``cutoff`` (epoch seconds)."""
        rows = self._db.execute(
            "SELECT seq FROM events WHERE received < ? AND seq IN "
            "(SELECT seq FROM events ORDER BY seq LIMIT ?) ORDER BY seq DESC LIMIT 1",
            (cutoff, chunk),
        ).fetchone()
        return 0 if rows is None else self._delete_upto(int(rows[0]), chunk)

    def trim_to_count(self, max_count: int, chunk: int = 5000) -> int:
        """Delete up to ``chunk`` of the oldest events beyond the newest ``max_count``."""
        row = self._db.execute(
            "SELECT seq FROM events ORDER BY seq DESC LIMIT 1 OFFSET ?", (max_count,)
        ).fetchone()
        return 0 if row is None else self._delete_upto(int(row[0]), chunk)

    def compact_step(self, chunk: int = 5000) -> tuple[int, bool]:
        """Latest-value-per-topic compaction over the next ``chunk`` sequences.

        Returns (deleted, finished_a_pass). Passes resume where the last one stopped."""
        db = self._db
        start = self._compact_from
        end_row = db.execute(
            "SELECT MAX(seq) FROM (SELECT seq FROM events WHERE seq > ? ORDER BY seq LIMIT ?)",
            (start, chunk),
        ).fetchone()
        if end_row[0] is None:
            self._compact_from = 0
            return 0, True
        end = int(end_row[0])
        db.execute("BEGIN")
        try:
            db.execute(
                "INSERT INTO meta VALUES ('high_water', ?) "
                "ON CONFLICT(key) DO UPDATE SET value = excluded.value",
                (self._last,),
            )
            cursor = db.execute(
                "DELETE FROM events WHERE seq > ? AND seq <= ? AND EXISTS "
                "(SELECT 1 FROM events AS newer WHERE newer.topic = events.topic "
                "AND newer.seq > events.seq)",
                (start, end),
            )
            db.execute("COMMIT")
        except BaseException:
            db.execute("ROLLBACK")
            raise
        self._compact_from = end
        return int(cursor.rowcount), False

    # -- lifecycle -----------------------------------------------------------------------

    def checkpoint(self) -> tuple[int, int]:
        """Copy committed WAL pages into the database without blocking the writer
        (PASSIVE, on a connection of its own). Safe to call from one worker thread while
        the owner appends. Returns (pages in the WAL, pages checkpointed)."""
        if self._checkpointer is None:
            self._checkpointer = sqlite3.connect(
                self.path, isolation_level=None, check_same_thread=False
            )
        row = self._checkpointer.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
        return int(row[1]), int(row[2])

    def close(self) -> None:
        """Close; call only once no checkpoint() is running."""
        if self._closed:
            return
        self._closed = True
        try:
            if self._checkpointer is not None:
                self._checkpointer.close()
            self._db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        finally:
            self._db.close()
