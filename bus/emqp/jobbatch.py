"""The job store's rows: a row per batch of guaranteed requests (sans-I/O).

A batch is the requests one commit put, cut at :data:`BATCH_JOBS` or :data:`BATCH_BYTES`. One INSERT of one blob
per batch replaces an INSERT of nine columns per request and its DELETE once replied: binding
a request's nine parameters and stepping its rows were most of SQLite's share of a guaranteed
job (bench/README.md, "A row per batch of jobs"). A removal sets the request's bit in the
batch's row of ``job_gone``, a small row of its own (an UPDATE writes a whole row again,
and a batch's blob spans several pages); once every request of a batch is gone, both rows go.

Tables:

- ``job_batches``: ``id`` (the order batches were committed in), ``jobs`` (:func:`pack`).
- ``job_gone``: ``batch`` (a ``job_batches.id``), ``bits`` (bit ``i % 8`` of byte ``i // 8``
  set: the batch's request ``i`` was removed, or put again in a later batch). No row: none.

Packed requests (:func:`pack`): a format byte (1), then per request the little-endian header
``position, received, attempts, retries_left`` (int64, float64, int64, int64) and the lengths
of ``msgid, client, queue, headers, body`` (uint32 each), then those five values' bytes.
Restored requests are ordered by position, whichever batch holds them.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator, Sequence
from operator import itemgetter
from typing import Any, NamedTuple

from bus.util.compiled import compiled


class StoredJob(NamedTuple):
    """A guaranteed request as the store keeps it: enough to dispatch it again after a restart.

    A named tuple: packed as it is (a broker puts one per guaranteed job)."""

    msgid: bytes
    position: int
    client: bytes
    queue: bytes
    headers: bytes
    body: bytes
    received: float
    attempts: int
    retries_left: int


SCHEMA = """
CREATE TABLE IF NOT EXISTS job_batches (id INTEGER PRIMARY KEY, jobs BLOB NOT NULL);
CREATE TABLE IF NOT EXISTS job_gone (batch INTEGER PRIMARY KEY, bits BLOB NOT NULL);
"""
INSERT = "INSERT INTO job_batches VALUES (?, ?)"
MARK = "INSERT OR REPLACE INTO job_gone VALUES (?, ?)"
DELETE_BATCH = "DELETE FROM job_batches WHERE id = ?"
DELETE_MARKS = "DELETE FROM job_gone WHERE batch = ?"
SELECT = (
    "SELECT job_batches.id, jobs, bits FROM job_batches "
    "LEFT JOIN job_gone ON job_gone.batch = job_batches.id ORDER BY job_batches.id"
)

#: Requests a batch holds at most: bounds the bits a removal writes again (32 bytes).
BATCH_JOBS = 256
#: Bodies' bytes a batch holds at most (but one larger request): a blob stays far below
#: SQLite's limit (1e9 bytes) whatever --emqp-max-message-size allows.
BATCH_BYTES = 1 << 20
#: A request's place in memory, ``batch << SLOT_BITS | index``: one int per stored request.
SLOT_BITS = 8
assert 1 << SLOT_BITS == BATCH_JOBS

FORMAT = 1
_MSGID = itemgetter(0)
_BODY = itemgetter(5)
_HEAD = struct.Struct("<qdqqIIIII")

#: The compiled packer (bus/emqp/_jobscan.c), or None (not built, or ``BUS_NATIVE_EMQP=0``).
_native: Any = compiled("bus.emqp._jobscan", "BUS_NATIVE_EMQP")
_native_pack = getattr(_native, "pack_jobs", None)
_native_settle = getattr(_native, "settle", None)
_native_changes = getattr(_native, "Changes", None)
_native_committed = getattr(_native, "committed", None)


def pack(jobs: Sequence[StoredJob]) -> bytes:
    """``jobs`` as one blob (the module's format): compiled where built, else in Python,
    the same bytes. ``struct.error`` or ``OverflowError`` for a value the format cannot hold."""
    if _native_pack is not None:
        try:
            packed: bytes = _native_pack(jobs)
            return packed
        except TypeError:  # a value other than bytes, int or float: Python decides
            pass
    return pack_python(jobs)


def pack_python(jobs: Sequence[StoredJob]) -> bytes:
    """:func:`pack` without the compiled helper."""
    head = _HEAD.pack
    parts: list[bytes] = [bytes((FORMAT,))]
    for msgid, position, client, queue, headers, body, received, attempts, retries in jobs:
        parts.append(
            head(position, received, attempts, retries,
                 len(msgid), len(client), len(queue), len(headers), len(body))
        )  # fmt: skip
        parts += (msgid, client, queue, headers, body)
    return b"".join(parts)


def unpack(blob: bytes) -> Iterator[StoredJob]:
    """The requests of a :func:`pack`'ed blob, in their order. ValueError when it is not one."""
    view = memoryview(blob)
    if len(view) < 1 or view[0] != FORMAT:
        raise ValueError("not a batch of requests (format byte)")
    offset, end = 1, len(view)
    size = _HEAD.size
    while offset < end:
        if offset + size > end:
            raise ValueError("a batch of requests cut short")
        position, received, attempts, retries, *lengths = _HEAD.unpack_from(view, offset)
        offset += size
        values = []
        for length in lengths:
            if offset + length > end:
                raise ValueError("a batch of requests cut short")
            values.append(bytes(view[offset : offset + length]))
            offset += length
        msgid, client, queue, headers, body = values
        yield StoredJob(msgid, position, client, queue, headers, body, received, attempts, retries)


def is_gone(bits: bytes | bytearray | None, index: int) -> bool:
    """Whether ``bits`` (a ``job_gone`` row's, None: no row) mark request ``index`` removed."""
    return bits is not None and index >> 3 < len(bits) and bool(bits[index >> 3] >> (index & 7) & 1)


def batches_of(jobs: list[StoredJob]) -> Iterator[list[StoredJob]]:
    """``jobs`` cut into batches of at most :data:`BATCH_JOBS` requests and about
    :data:`BATCH_BYTES` of bodies (a request larger than that alone)."""
    if len(jobs) <= BATCH_JOBS and sum(map(len, map(_BODY, jobs))) <= BATCH_BYTES:
        if jobs:
            yield jobs  # the common case: no Python per request
        return
    batch: list[StoredJob] = []
    size = 0
    for job in jobs:
        if batch and (len(batch) == BATCH_JOBS or size + len(job.body) > BATCH_BYTES):
            yield batch
            batch, size = [], 0
        batch.append(job)
        size += len(job.body)
    if batch:
        yield batch


def settle_python(
    pending: dict[bytes, StoredJob | None], slots: dict[bytes, int]
) -> tuple[list[StoredJob], dict[int, int], list[bytes]]:
    """A commit's pending changes sorted: ``pending`` maps a msgid to its new row or None
    (removed), ``slots`` a committed msgid to its slot (``batch << SLOT_BITS | index``).
    Returns the rows to write (in ``pending``'s order), the bits of the committed requests
    that go (removed or put again) by batch (bit ``index`` set), and the committed msgids
    removed."""
    kept: list[StoredJob] = []
    marked: dict[int, int] = {}
    dropped: list[bytes] = []
    for msgid, job in pending.items():
        if job is not None:
            kept.append(job)
        slot = slots.get(msgid)
        if slot is None:
            continue
        if job is None:
            dropped.append(msgid)
        batch = slot >> SLOT_BITS
        marked[batch] = marked.get(batch, 0) | 1 << (slot & (BATCH_JOBS - 1))
    return kept, marked, dropped


def settle(
    pending: dict[bytes, StoredJob | None], slots: dict[bytes, int]
) -> tuple[list[StoredJob], dict[int, int], list[bytes]]:
    """:func:`settle_python`, compiled where built (a commit's loop over its changes, two a
    guaranteed job, was a fifth of its cost)."""
    if _native_settle is not None:
        settled: tuple[list[StoredJob], dict[int, int], list[bytes]] = _native_settle(
            pending, slots
        )
        return settled
    return settle_python(pending, slots)


def committed_python(
    slots: dict[bytes, int], dropped: list[bytes], batches: list[list[StoredJob]], first: int
) -> None:
    """A commit succeeded: the msgids it removed leave ``slots`` (msgid -> ``batch <<
    SLOT_BITS | index``), the requests of the batches it wrote (numbered from ``first``)
    get theirs."""
    for msgid in dropped:
        del slots[msgid]
    for n, jobs in enumerate(batches):
        base = (first + n) << SLOT_BITS
        slots.update(zip(map(_MSGID, jobs), range(base, base + len(jobs)), strict=True))


def committed(
    slots: dict[bytes, int], dropped: list[bytes], batches: list[list[StoredJob]], first: int
) -> None:
    """:func:`committed_python`, compiled where built (two slots changed a guaranteed job)."""
    if _native_committed is not None:
        _native_committed(slots, dropped, batches, first)
        return
    committed_python(slots, dropped, batches, first)


class ChangesPython:
    """A job store's pending changes as a broker makes them (``pending``: msgid -> its new
    row, or None: removed) and the positions it hands out, from ``next_position`` on."""

    def __init__(self, row_type: type[StoredJob], pending: dict[bytes, StoredJob | None],
                 next_position: int) -> None:  # fmt: skip
        self._row_type = row_type
        self._pending = pending
        self._next = next_position

    def put_new(self, msgid: bytes, client: bytes, queue: bytes, headers: bytes, body: bytes,
                received: float, retries_left: int) -> int:  # fmt: skip
        """A new request's row (never dispatched) at the next position; returns it."""
        position = self._next
        self._next = position + 1
        self._pending[msgid] = tuple.__new__(
            self._row_type,
            (msgid, position, client, queue, headers, body, received, 0, retries_left),
        )
        return position

    def remove(self, msgid: bytes) -> None:
        """Forget request ``msgid``."""
        self._pending[msgid] = None

    def next_position(self) -> int:
        """A new position."""
        position = self._next
        self._next = position + 1
        return position


def changes(pending: dict[bytes, StoredJob | None], next_position: int) -> ChangesPython:
    """:class:`ChangesPython` over ``pending``, compiled where built (two calls a guaranteed
    job: a frame each in Python, and put_new's named tuple built through ``tuple.__new__``)."""
    if _native_changes is not None:
        made: ChangesPython = _native_changes(StoredJob, pending, next_position)
        return made
    return ChangesPython(StoredJob, pending, next_position)
