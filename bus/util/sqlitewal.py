"""SQLite in WAL mode, as the services' stores keep it: commits on the reactor thread,
checkpoints on a worker thread, one error type.

An automatic checkpoint would run inside a commit on the reactor thread (10-90 ms stalls
were measured), so it is off; the owner runs :meth:`Checkpointer.run` from a worker thread,
on a connection of its own, and :func:`final_checkpoint` when it closes.

The WAL is bounded: SQLite starts it over only at a commit that finds every frame already
copied into the database, which a PASSIVE checkpoint never achieves while commits keep
coming. Once the WAL holds more than :data:`DEFAULT_WAL_LIMIT` bytes of frames,
:meth:`Checkpointer.run` follows its PASSIVE copy with a RESTART checkpoint, which holds
writers while it copies the frames committed since (few: the PASSIVE one just ran) and syncs
the database; the next commit then writes the WAL from its start, over the file's pages.

The file is not cut back by the commits (no ``journal_size_limit``): the first commit after a
restart would cut it on the reactor thread, and dropping the cut pages costs the kernel about
0.5 us per 4 KiB frame (7-20 ms of one commit after a WAL of 130 MiB, measured), where
writing over the file's pages costs less than growing it again. The file keeps the size the
WAL reached, the limit and about what a checkpoint period writes; one above
:data:`CUT_ABOVE` times the limit (restarts kept from running by long reads, a burst) is cut
to nothing by the checkpoint thread (a TRUNCATE checkpoint in place of the RESTART).
"""

from __future__ import annotations

import os
import sqlite3
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from itertools import chain
from pathlib import Path
from typing import Any, Literal
from urllib.parse import quote

from bus.errors import StorageError
from bus.util.compiled import compiled

Durability = Literal["normal", "full"]

#: The WAL's bound by default (bytes): 64 MiB, about 11 s of the Event BUS's log at 3,000
#: events/s. A larger bound restarts the WAL less often (each restart holds writers for a
#: few ms); the WAL's size at rest stays below it.
DEFAULT_WAL_LIMIT = 64 * 1024 * 1024

#: A WAL file above this many times its limit is cut back (to nothing) by the checkpoint that
#: starts the WAL over; below it, the file is kept and written over.
CUT_ABOVE = 2

#: Bytes of a WAL frame's header (a frame is that and a page).
WAL_FRAME_HEADER = 24


def bind_bytes_directly() -> None:
    """Have the ``sqlite3`` module bind ``bytes`` parameters as they are, with no adapter search.

    Python's sqlite3 looks every ``bytes`` parameter up as a type to adapt (int, float, str
    and bytearray are exempt): a registry miss, then ``__adapt__`` asked of its protocol
    type, which raises and discards an AttributeError with a formatted message each time.
    That was half the CPU of an insert of an event's five blobs (measured with py-spy on the
    collector's path). Registered, the adapter is found at once and hands back the same
    object (``bytes.__bytes__`` of an exact bytes is itself), so what is bound does not
    change; subclasses of bytes are adapted as before (the registry is by exact type).
    Process-wide and idempotent."""
    sqlite3.register_adapter(bytes, bytes.__bytes__)


#: The compiled row builder (bus/util/_sqlrows.c), or None (not built, or
#: ``BUS_NATIVE_ROWS=0``); :func:`bindable_rows` gives the same rows without it.
native_rows: Any = compiled("bus.util._sqlrows", "BUS_NATIVE_ROWS")


def bindable_rows(rows: Sequence[Sequence[object]]) -> list[tuple[object, ...]]:
    """``rows`` as tuples to bind, the same values; compiled (bus/util/_sqlrows.c), each
    non-empty ``bytes`` as a ``bytearray`` of the same bytes: sqlite3 binds those with no
    adapter search at all (it exempts int, float, str and bytearray), and stores the same
    BLOB."""
    if native_rows is not None:
        built: list[tuple[object, ...]] = native_rows.bindable(rows)
        return built
    return [tuple(row) for row in rows]


def execute_grouped(
    db: sqlite3.Connection, groups: dict[int, str], one: str, rows: Sequence[Sequence[object]]
) -> None:
    """``rows`` through multi-row statements, the rest one by one through ``one``:
    ``groups`` maps a row count to the statement that takes that many rows, largest first.
    SQLite steps such a statement once for all its rows, where executemany binds, steps
    and resets one per row (bench/README.md, "The collector's path")."""
    start = 0
    for size, statement in groups.items():
        while len(rows) - start >= size:
            db.execute(statement, list(chain.from_iterable(rows[start : start + size])))
            start += size
    if start < len(rows):
        db.executemany(one, rows[start:])


def open_wal(path: Path, durability: Durability) -> sqlite3.Connection:
    """The database at ``path`` (its directory made if need be) in WAL mode, committing with
    ``synchronous=NORMAL`` (survives ``kill -9``) or ``FULL`` (survives a power loss), with
    automatic checkpoints off; its commits never cut the WAL file (:class:`Checkpointer`
    does). ``bytes`` parameters are bound directly (:func:`bind_bytes_directly`)."""
    bind_bytes_directly()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        db = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    except (OSError, sqlite3.Error) as error:
        raise StorageError(error) from error
    try:
        db.execute("PRAGMA journal_mode=WAL")
        db.execute(f"PRAGMA synchronous={'FULL' if durability == 'full' else 'NORMAL'}")
        db.execute("PRAGMA wal_autocheckpoint=0")
    except sqlite3.Error as error:
        db.close()
        raise StorageError(error) from error
    return db


@dataclass(frozen=True, slots=True)
class WalStatus:
    """What a :class:`Checkpointer` did, for status.json and /metrics."""

    #: The WAL file's size now (bytes) and its bound (None: no bound).
    wal_bytes: int
    limit: int | None
    #: PASSIVE checkpoints run, RESTART checkpoints that started the WAL over, and RESTART
    #: attempts that met a commit or a read in progress (given up at once, tried again).
    checkpoints: int
    restarts: int
    restarts_busy: int
    #: The longest RESTART attempt (seconds): how long it held writers at most.
    longest_hold: float

    def as_status(self) -> dict[str, Any]:
        """Its figures as status.json keys (``wal_bytes``, ``wal_restarts``, ...)."""
        return {
            "wal_bytes": self.wal_bytes,
            "wal_limit": self.limit,
            "wal_checkpoints": self.checkpoints,
            "wal_restarts": self.restarts,
            "wal_restarts_busy": self.restarts_busy,
            "wal_longest_hold_ms": round(self.longest_hold * 1000, 3),
        }


class Checkpointer:
    """Checkpoints on a connection of their own: PASSIVE ones copy committed WAL pages into
    the database without blocking the writer and, once the WAL holds more than ``limit``
    bytes of frames, a RESTART one starts it over (a TRUNCATE one, which also cuts the file
    to nothing, when the file is above :data:`CUT_ABOVE` times the limit). Call :meth:`run`
    from one worker thread.

    A RESTART checkpoint waits for no one (busy timeout 0): one that meets a commit or a
    read in progress returns at once, and is tried again after ``pause`` seconds, ``tries``
    times in a run (then at the next run). While it runs, the owner's commits wait (their
    busy timeout): the copy of the frames committed since the PASSIVE one and a sync."""

    def __init__(
        self,
        path: Path,
        limit: int | None = DEFAULT_WAL_LIMIT,
        *,
        tries: int = 5,
        pause: float = 0.002,
        timer: Callable[[], float] = time.perf_counter,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.path = path
        #: The WAL file's bound (bytes), or None (0) for none.
        self.limit = limit or None
        self.wal_path = path.with_name(path.name + "-wal")
        self.tries = tries
        self.pause = pause
        self.timer = timer
        self.sleep = sleep
        self.checkpoints = 0
        self.restarts = 0
        self.restarts_busy = 0
        #: The longest RESTART checkpoint (seconds, by ``timer``).
        self.longest_hold = 0.0
        self._db: sqlite3.Connection | None = None
        #: Bytes of a WAL frame (a page and its header), read at the first run.
        self._frame = 0
        # Held while a checkpoint runs: close() never waits for it (a slow disk must not
        # stall the reactor), it leaves the connection for the checkpoint to close.
        self._lock = threading.Lock()
        self._closed = False

    def run(self) -> tuple[int, int]:
        """(pages in the WAL, pages copied) by the PASSIVE checkpoint; (0, 0) once closed.
        A checkpoint that cannot write (the database cannot grow on a full disk) raises
        :class:`StorageError`; the WAL keeps every commit, so nothing is lost."""
        with self._lock:
            if self._closed:
                return 0, 0
            try:
                if self._db is None:
                    self._db = sqlite3.connect(
                        self.path, isolation_level=None, timeout=0, check_same_thread=False
                    )
                    page = self._db.execute("PRAGMA page_size").fetchone()[0]
                    self._frame = int(page) + WAL_FRAME_HEADER
                row = self._db.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
                self.checkpoints += 1
                # By the frames it holds, not the file's size: the file is kept after a restart.
                if self.limit is not None and int(row[1]) * self._frame > self.limit:
                    cut = self.wal_bytes() > CUT_ABOVE * self.limit
                    self._restart(self._db, "TRUNCATE" if cut else "RESTART")
            except sqlite3.Error as error:
                raise StorageError(error) from error
            finally:
                if self._closed:  # closed while it ran: the connection is its to close
                    self._disconnect()
            return int(row[1]), int(row[2])

    def _restart(self, db: sqlite3.Connection, mode: Literal["RESTART", "TRUNCATE"]) -> None:
        for attempt in range(self.tries):
            if attempt:
                self.sleep(self.pause)
            started = self.timer()
            busy = db.execute(f"PRAGMA wal_checkpoint({mode})").fetchone()[0]
            self.longest_hold = max(self.longest_hold, self.timer() - started)
            if not busy:
                self.restarts += 1
                return
            self.restarts_busy += 1

    def wal_bytes(self) -> int:
        """The WAL file's size (bytes; 0 when there is none)."""
        try:
            return os.stat(self.wal_path).st_size
        except OSError:
            return 0

    def status(self) -> WalStatus:
        """The WAL's size and what the checkpoints did since the start."""
        return WalStatus(
            self.wal_bytes(),
            self.limit,
            self.checkpoints,
            self.restarts,
            self.restarts_busy,
            self.longest_hold,
        )

    def close(self) -> bool:
        """Close its connection; False when a checkpoint is running (it closes the
        connection when it ends)."""
        self._closed = True
        if not self._lock.acquire(blocking=False):
            return False
        try:
            self._disconnect()
        finally:
            self._lock.release()
        return True

    def _disconnect(self) -> None:
        if self._db is not None:
            self._db.close()
            self._db = None


def final_checkpoint(db: sqlite3.Connection) -> None:
    """Empty the WAL into the database (TRUNCATE) before closing ``db``; raises
    :class:`StorageError` when it cannot (the next open then reads the WAL)."""
    try:
        db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    except sqlite3.Error as error:
        raise StorageError(error) from error


class InUse(StorageError):
    """Another process has the database open (a service running on its data directory)."""


def open_exclusive(path: Path) -> sqlite3.Connection:
    """The database at ``path`` (which must exist) for a process that must have it alone:
    opened in SQLite's exclusive locking mode and read once, which takes a lock that is
    kept until the connection closes. :class:`InUse` at once when another process has it
    open (a service running); while the connection is open, another process cannot open
    it (a service started meanwhile fails to open its store, and says so)."""
    if not path.is_file():
        raise StorageError(sqlite3.DatabaseError(f"{path}: no such file"))
    try:
        db = sqlite3.connect(
            f"file:{quote(str(path.resolve()))}?mode=rw", uri=True,
            isolation_level=None, timeout=0, check_same_thread=False,
        )  # fmt: skip
    except sqlite3.Error as error:
        raise StorageError(sqlite3.DatabaseError(f"{path}: {error}")) from error
    try:
        db.execute("PRAGMA locking_mode=EXCLUSIVE")
        # The first read takes the lock (a WAL left by a crash is recovered here).
        db.execute("SELECT count(*) FROM sqlite_master").fetchone()
    except sqlite3.OperationalError as error:
        db.close()
        if "locked" in str(error) or "busy" in str(error):
            raise InUse(
                sqlite3.DatabaseError(
                    f"{path} is open in another process (is a server running on its data "
                    "directory? stop it first)"
                )
            ) from None
        raise StorageError(sqlite3.DatabaseError(f"{path}: {error}")) from error
    except sqlite3.Error as error:
        db.close()
        raise StorageError(sqlite3.DatabaseError(f"{path}: {error}")) from error
    return db
