"""SQLite in WAL mode, as the services' stores keep it: commits on the reactor thread,
checkpoints on a worker thread, one error type.

An automatic checkpoint would run inside a commit on the reactor thread (10-90 ms stalls
were measured), so it is off; the owner runs :meth:`Checkpointer.run` from a worker thread,
on a connection of its own, and :func:`final_checkpoint` when it closes.
"""

from __future__ import annotations

import sqlite3
import threading
from pathlib import Path
from typing import Literal
from urllib.parse import quote

from bus.errors import StorageError

Durability = Literal["normal", "full"]


def bind_bytes_directly() -> None:
    """Have :mod:`sqlite3` bind ``bytes`` parameters as they are, without its adapter search.

    Python's sqlite3 looks every ``bytes`` parameter up as a type to adapt (int, float, str
    and bytearray are exempt): a registry miss, then ``__adapt__`` asked of its protocol
    type, which raises and discards an AttributeError with a formatted message each time.
    That was half the CPU of an insert of an event's five blobs (measured with py-spy on the
    collector's path). Registered, the adapter is found at once and hands back the same
    object (``bytes.__bytes__`` of an exact bytes is itself), so what is bound does not
    change; subclasses of bytes are adapted as before (the registry is by exact type).
    Process-wide and idempotent."""
    sqlite3.register_adapter(bytes, bytes.__bytes__)


def open_wal(path: Path, durability: Durability) -> sqlite3.Connection:
    """The database at ``path`` (its directory made if need be) in WAL mode, committing with
    ``synchronous=NORMAL`` (survives ``kill -9``) or ``FULL`` (survives a power loss), with
    automatic checkpoints off (and ``bytes`` bound directly: :func:`bind_bytes_directly`)."""
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


class Checkpointer:
    """PASSIVE checkpoints on a connection of their own: they copy committed WAL pages into
    the database without blocking the writer. Call :meth:`run` from one worker thread."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._db: sqlite3.Connection | None = None
        # Held while a checkpoint runs: close() never waits for it (a slow disk must not
        # stall the reactor), it leaves the connection for the checkpoint to close.
        self._lock = threading.Lock()
        self._closed = False

    def run(self) -> tuple[int, int]:
        """(pages in the WAL, pages copied); (0, 0) once closed. A checkpoint that cannot
        write (the database cannot grow on a full disk) raises :class:`StorageError`; the
        WAL keeps every commit, so nothing is lost."""
        with self._lock:
            if self._closed:
                return 0, 0
            try:
                if self._db is None:
                    self._db = sqlite3.connect(
                        self.path, isolation_level=None, check_same_thread=False
                    )
                row = self._db.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
            except sqlite3.Error as error:
                raise StorageError(error) from error
            finally:
                if self._closed:  # closed while it ran: the connection is its to close
                    self._disconnect()
            return int(row[1]), int(row[2])

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
