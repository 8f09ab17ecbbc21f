"""The SQLite event log's rows: a row per batch of events.

A batch is what one commit appended, cut at :data:`BATCH_EVENTS` events or about
:data:`BATCH_BYTES` packed bytes. One INSERT of one blob per batch costs SQLite and Python's
``sqlite3`` about a sixth of a row of seven columns per event (bench/README.md, "A row per
batch"), and storing was two fifths of the server's CPU per event.

Table ``batches``:

- ``id``: the first sequence the batch was written with. It never changes, so retention that
  removes part of a batch leaves it in its place, and a count that went by ``id`` stays right.
- ``first``, ``last``: its lowest and highest sequence still held; ``held``: how many.
- ``received``: when its events were received (epoch seconds; never goes backwards).
- ``seqs``: NULL when it holds every sequence from ``first`` to ``last``; otherwise the
  sequences it holds, as little-endian int64s (a pair's passive copies holes; compaction
  makes them).
- ``events``: a msgpack array of ``[topic, producer, timestamp, uuid, data]`` per event.

Batches never overlap and are ordered by ``id``: every sequence of a batch is at or above
its ``id`` and below the next batch's. Removing events from a batch writes it again with the
rest (or deletes it when none is left).

Logs of release 0.1.1 and earlier held a row per event (table ``events``): :func:`migrate`
moves them over, in one transaction, at their first open; those releases cannot read a log
of batches.
"""

from __future__ import annotations

import contextlib
import sqlite3
import sys
from array import array
from collections.abc import Callable, Generator, Iterable, Iterator, Sequence, Set
from typing import Any, TypeVar

import msgpack

from bus.eventbus.codec import EventFields
from bus.util import sqlitewal

SCHEMA = """
CREATE TABLE IF NOT EXISTS batches (
    id INTEGER PRIMARY KEY,
    first INTEGER NOT NULL,
    last INTEGER NOT NULL,
    held INTEGER NOT NULL,
    received REAL NOT NULL,
    seqs BLOB,
    events BLOB NOT NULL
);
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value);
"""
COLUMNS = "id, first, last, held, received, seqs, events"
INSERT = "INSERT INTO batches VALUES (?, ?, ?, ?, ?, ?, ?)"
UPDATE = "UPDATE batches SET first = ?, last = ?, held = ?, seqs = ?, events = ? WHERE id = ?"

#: Events a batch holds at most: bounds what removing one event from it costs (the batch is
#: written again), and what a read of one event decodes.
BATCH_EVENTS = 256
#: Packed bytes a batch of more than one event holds at most (a larger event has a batch
#: of its own).
BATCH_BYTES = 256 * 1024

#: A stored batch as read: ``(id, first, last, held, received, seqs, events)``.
Stored = tuple[int, int, int, int, float, bytes | None, bytes]

_packer: Callable[[object], bytes] = msgpack.Packer(use_bin_type=True).pack
_LITTLE = sys.byteorder == "little"


def _pack(fields: Sequence[Any]) -> bytes:
    """``fields`` (tuples of bytes) as msgpack: compiled where it can be (the same bytes)."""
    native = sqlitewal.native_rows
    if native is not None:
        try:
            packed: bytes = native.pack_arrays(fields)
            return packed
        except TypeError:  # not tuples of bytes (a bytearray, a memoryview): msgpack's own
            pass
    return _packer(fields)


def unpack(events: bytes) -> tuple[EventFields, ...]:
    """A batch's events: ``(topic, producer, timestamp, uuid, data)`` each."""
    unpacked: tuple[EventFields, ...] = msgpack.unpackb(events, use_list=False)
    return unpacked


def topics(packed: bytes) -> Sequence[bytes]:
    """A batch's events' topics, in order: compiled, without making their other fields,
    where it can be (the same topics)."""
    native = sqlitewal.native_rows
    if native is not None:
        try:
            found: list[bytes] = native.topics(packed)
            return found
        except ValueError:  # a form the helper does not read: msgpack reads it
            pass
    return [fields[0] for fields in unpack(packed)]


def _kept(packed: bytes, marks: bytes) -> bytes:
    """``packed`` with only the events whose mark is not zero (one mark per event), their
    bytes as they were where the compiled helper can copy them."""
    native = sqlitewal.native_rows
    if native is not None:
        try:
            copied: bytes = native.keep(packed, marks)
            return copied
        except ValueError:
            pass
    return _pack([fields for fields, mark in zip(unpack(packed), marks, strict=True) if mark])


def _seqs_blob(sequences: Sequence[int]) -> bytes | None:
    """The ``seqs`` column for a batch holding ``sequences`` (increasing)."""
    if sequences[-1] - sequences[0] + 1 == len(sequences):
        return None
    numbers = array("q", sequences)
    if not _LITTLE:
        numbers.byteswap()
    return numbers.tobytes()


def sequences_of(first: int, last: int, seqs: bytes | None) -> Sequence[int]:
    """The sequences a batch holds, in order."""
    if seqs is None:
        return range(first, last + 1)
    numbers = array("q")
    numbers.frombytes(seqs)
    if not _LITTLE:
        numbers.byteswap()
    return numbers


def events_of(
    first: int, last: int, seqs: bytes | None, packed: bytes
) -> Iterator[tuple[int, EventFields]]:
    """A batch's events under their sequences, in order."""
    return zip(sequences_of(first, last, seqs), unpack(packed), strict=True)


def _spans(fields: Sequence[Any]) -> list[tuple[int, int, bytes]]:
    """``fields`` packed in batches: (where each starts and ends in ``fields``, its events)."""
    spans = []
    start = 0
    while start < len(fields):
        count = min(BATCH_EVENTS, len(fields) - start)
        packed = _pack(fields[start : start + count])
        while len(packed) > BATCH_BYTES and count > 1:
            count //= 2
            packed = _pack(fields[start : start + count])
        spans.append((start, start + count, packed))
        start += count
    return spans


def consecutive_rows(first: int, fields: Sequence[EventFields], received: float) -> list[Stored]:
    """Rows for ``fields`` under ``first`` and the sequences after it."""
    return [
        (first + start, first + start, first + end - 1, end - start, received, None, packed)
        for start, end, packed in _spans(fields)
    ]


def numbered_rows(events: Sequence[tuple[int, EventFields]], received: float) -> list[Stored]:
    """Rows for ``events`` under the sequences given (increasing)."""
    numbers = [sequence for sequence, _ in events]
    rows = []
    for start, end, packed in _spans([fields for _, fields in events]):
        part = numbers[start:end]
        rows.append((part[0], part[0], part[-1], len(part), received, _seqs_blob(part), packed))
    return rows


def batches_from(
    db: sqlite3.Connection, after: int, upto: int | None = None, columns: str = COLUMNS
) -> sqlite3.Cursor:
    """A cursor over the batches that may hold a sequence in ``(after, upto]``, in order
    (the caller closes it: an open statement holds back checkpoints)."""
    # From the batch that would hold after + 1 (the last one whose id is not above it) on.
    start = "(SELECT IFNULL(MAX(id), 0) FROM batches WHERE id <= ?)"
    if upto is None:
        return db.execute(
            f"SELECT {columns} FROM batches WHERE id >= {start} AND last > ? ORDER BY id",
            (after + 1, after),
        )
    return db.execute(
        f"SELECT {columns} FROM batches WHERE id >= {start} AND id <= ? AND last > ? ORDER BY id",
        (after + 1, upto, after),
    )


_Item = TypeVar("_Item")


def _numbered(
    db: sqlite3.Connection,
    after: int,
    upto: int | None,
    decode: Callable[[bytes], Sequence[_Item]],
) -> Generator[tuple[int, _Item], None, None]:
    """``(sequence, decode(batch)[i])`` of the events in ``(after, upto]``, in order."""
    cursor = batches_from(db, after, upto, "first, last, seqs, events")
    try:
        for first, last, seqs, packed in cursor:
            for sequence, item in zip(sequences_of(first, last, seqs), decode(packed), strict=True):
                if sequence <= after:
                    continue
                if upto is not None and sequence > upto:
                    return
                yield sequence, item
    finally:
        cursor.close()


def events_from(
    db: sqlite3.Connection, after: int, upto: int | None = None
) -> Generator[tuple[int, EventFields], None, None]:
    """``(sequence, fields)`` of the events in ``(after, upto]``, in order."""
    return _numbered(db, after, upto, unpack)


def topics_from(
    db: sqlite3.Connection, after: int, upto: int | None = None
) -> Generator[tuple[int, bytes], None, None]:
    """``(sequence, topic)`` of the events in ``(after, upto]``, in order: what compaction
    reads of the log (:func:`events_from` without the rest of each event)."""
    return _numbered(db, after, upto, topics)


class Rows(list[tuple[int, bytes, bytes, bytes, bytes, bytes]]):
    """Rows read; :attr:`scanned` says where a read under topic prefixes stopped when it
    looked at its bound of events before it found ``limit`` rows."""

    #: The highest sequence looked at when the read stopped at its bound (None: it did not;
    #: fewer rows than asked then means none is left): the next read goes on above it.
    scanned: int | None = None


def read_rows(
    db: sqlite3.Connection,
    after: int,
    upto: int | None,
    prefixes: Iterable[bytes],
    limit: int,
    scan: int | None = None,
) -> Rows:
    """At most ``limit`` rows with ``after < sequence <= upto`` whose topic starts with one of
    ``prefixes`` (every topic when empty, or when one of them is empty), in order. With
    ``scan``, a read under prefixes looks at no more than about that many events (whole
    batches) and says where it stopped (:attr:`Rows.scanned`): a subtree that few events
    match does not hold the reactor for a read of the whole log."""
    wanted = tuple(prefixes)
    match = wanted if wanted and all(wanted) else None
    rows = Rows()
    if limit <= 0:
        return rows
    looked = 0
    previous = after  # every event up to here was looked at
    cursor = batches_from(db, after, upto, "first, last, seqs, events")
    try:
        for first, last, seqs, packed in cursor:
            if scan is not None and match is not None and looked >= scan:
                rows.scanned = previous
                break
            numbers = sequences_of(first, last, seqs)
            events = unpack(packed)
            looked += len(events)
            if match is None and first > after and (upto is None or last <= upto):
                room = limit - len(rows)  # the whole batch: no test per event
                rows.extend([(s, *e) for s, e in zip(numbers[:room], events[:room], strict=True)])
            else:
                for sequence, event in zip(numbers, events, strict=True):
                    if sequence <= after or (match is not None and not event[0].startswith(match)):
                        continue
                    if upto is not None and sequence > upto:
                        break
                    rows.append((sequence, *event))
                    if len(rows) == limit:
                        break
            if len(rows) >= limit:
                break
            previous = last
    finally:
        cursor.close()
    return rows


def sequence_at(first: int, last: int, seqs: bytes | None, index: int) -> int:
    """The ``index``-th sequence (from 0) a batch holds."""
    return first + index if seqs is None else sequences_of(first, last, seqs)[index]


#: The columns :func:`rewrite` takes, in its order.
REWRITTEN = "id, first, last, seqs, events"


def rewrite(
    db: sqlite3.Connection,
    stored: tuple[int, int, int, bytes | None, bytes],
    keep: Callable[[int], bool],
) -> list[tuple[int, bytes]]:
    """Keep only the events of the batch ``stored`` (its :data:`REWRITTEN` columns) whose
    sequence ``keep`` accepts, inside the caller's transaction: the batch is written again
    with them, or deleted when none is left. Returns the ``(sequence, topic)`` of the events
    removed."""
    batch, first, last, seqs, packed = stored
    kept_numbers: list[int] = []
    kept: list[EventFields] = []
    gone: list[tuple[int, bytes]] = []
    for sequence, fields in events_of(first, last, seqs, packed):
        if keep(sequence):
            kept_numbers.append(sequence)
            kept.append(fields)
        else:
            gone.append((sequence, fields[0]))
    if gone:
        _hold_only(db, batch, kept_numbers, lambda: _pack(kept))
    return gone


def _hold_only(
    db: sqlite3.Connection, batch: int, numbers: Sequence[int], packed: Callable[[], bytes]
) -> None:
    """Write the batch ``batch`` again holding only the events at ``numbers`` (``packed()``
    makes their blob), or delete it when none is left."""
    if not numbers:
        db.execute("DELETE FROM batches WHERE id = ?", (batch,))
        return
    db.execute(
        UPDATE, (numbers[0], numbers[-1], len(numbers), _seqs_blob(numbers), packed(), batch)
    )


def drop(
    db: sqlite3.Connection, stored: tuple[int, int, int, bytes | None, bytes], doomed: Set[int]
) -> int:
    """Remove the events of the batch ``stored`` (its :data:`REWRITTEN` columns) whose
    sequences are in ``doomed``, inside the caller's transaction, as :func:`rewrite` does,
    without reading the events it keeps (their bytes are copied): compaction's. Returns how
    many it removed."""
    batch, first, last, seqs, packed = stored
    numbers = sequences_of(first, last, seqs)
    marks = bytes([number not in doomed for number in numbers])
    kept = [number for number, mark in zip(numbers, marks, strict=True) if mark]
    if len(kept) < len(numbers):
        _hold_only(db, batch, kept, lambda: _kept(packed, marks))
    return len(numbers) - len(kept)


def has_old_rows(db: sqlite3.Connection) -> bool:
    """The database holds a log of release 0.1.1 or earlier (a row per event)."""
    row = db.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'events'")
    return row.fetchone() is not None


def migrate(db: sqlite3.Connection) -> int:
    """Move a log of a row per event into batches (inside the caller's transaction), in
    order, a batch per run of events received at the same time, and drop the old table.
    Returns how many events were moved."""
    moved = 0
    run: list[tuple[int, EventFields]] = []
    run_received = 0.0
    cursor = db.execute(
        "SELECT seq, topic, producer, timestamp, uuid, data, received FROM events ORDER BY seq"
    )
    try:
        for seq, topic, producer, timestamp, uuid, data, received in cursor:
            if run and (received != run_received or len(run) >= BATCH_EVENTS):
                moved += _insert_run(db, run, run_received)
                run = []
            run.append((int(seq), (bytes(topic), bytes(producer), bytes(timestamp),
                                   bytes(uuid), bytes(data))))  # fmt: skip
            run_received = float(received)
    finally:
        cursor.close()
    if run:
        moved += _insert_run(db, run, run_received)
    db.execute("DROP TABLE events")
    return moved


def reclaim(db: sqlite3.Connection) -> None:
    """After :func:`migrate`: give the old table's pages back (VACUUM; the file would keep
    them free for later events, at twice the log's size meanwhile). Best effort: without the
    room for a copy of the log it is left as it is, which is only larger."""
    with contextlib.suppress(sqlite3.Error):
        db.execute("VACUUM")


def _insert_run(db: sqlite3.Connection, run: list[tuple[int, EventFields]], received: float) -> int:
    db.executemany(INSERT, numbered_rows(run, received))
    return len(run)
