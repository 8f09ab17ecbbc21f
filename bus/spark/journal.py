"""A durable journal of bus events: immutable Parquet segments in one directory.

One writer (the bridge) appends events in strictly increasing bus sequence and rolls
them into segments; any number of readers (the PySpark source, on any process) read
sequence ranges. Everything a reader needs is in the directory:

``seg-<first>-<last>.parquet``
    Events ``first..last``, contiguous (a known gap always ends a segment), written to a
    temp file, fsynced, renamed, then the directory fsynced. Numbers are zero-padded to
    20 digits, so lexical order is sequence order. Segments are never modified.
``gaps.jsonl``
    Sequence ranges the writer was told are missing (``note_gap``), one JSON object a
    line, fsynced before any segment above the gap exists.
``journal.json``
    ``origin`` (the journal holds events after it; earlier ones were never written
    here) and ``retained_after`` (events up to it were removed by retention), replaced
    atomically.

So a sequence ``s <= latest_sequence()`` is exactly one of: before the origin, removed by
retention, in a known gap, in a segment; anything else is an unknown hole (for
instance a segment deleted by hand), which readers report as data loss.
"""

from __future__ import annotations

import bisect
import fcntl
import json
import logging
import os
import re
import threading
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, Final

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from bus.eventbus.codec import Event

log = logging.getLogger(__name__)

SEGMENT_NAME: Final = re.compile(r"seg-(\d{20})-(\d{20})\.parquet")
GAPS_FILE: Final = "gaps.jsonl"
STATE_FILE: Final = "journal.json"
LOCK_FILE: Final = ".writer.lock"
TEMP_SUFFIX: Final = ".tmp"
FORMAT_VERSION: Final = 1
#: Parquet stores seq as int64.
MAX_JOURNAL_SEQUENCE: Final = 2**63 - 1

UTC_MICROS: Final = pa.timestamp("us", tz="UTC")
ARROW_SCHEMA: Final = pa.schema(
    [
        pa.field("topic", pa.string()),
        pa.field("seq", pa.int64()),
        pa.field("producer", pa.string()),
        pa.field("timestamp", UTC_MICROS),
        pa.field("event_id", pa.string()),
        pa.field("payload", pa.binary()),
        pa.field("received_at", UTC_MICROS),
    ]
)

_EPOCH: Final = datetime(1970, 1, 1, tzinfo=UTC)
_MICROSECOND: Final = timedelta(microseconds=1)


class JournalError(Exception):
    """The journal cannot do what was asked."""


class SequenceError(JournalError):
    """An append would break the journal's sequence: a duplicate, a step back, or an
    unannounced jump forward."""


class DataLossError(JournalError):
    """Part of a requested range is gone: removed by retention or an unknown hole."""


def segment_name(first: int, last: int) -> str:
    """The file name of the segment holding ``first..last`` (zero-padded: lexical order is sequence
    order)."""
    return f"seg-{first:020d}-{last:020d}.parquet"


def parse_timestamp(raw: bytes) -> int | None:
    """Microseconds since the epoch for an ISO-8601 timestamp; naive means UTC.

    Producers send what they like, so anything unparseable is ``None``, never an error.
    """
    try:
        moment = datetime.fromisoformat(raw.decode("ascii"))
        if moment.tzinfo is None:
            moment = moment.replace(tzinfo=UTC)
        return (moment - _EPOCH) // _MICROSECOND
    except (UnicodeDecodeError, ValueError, OverflowError):
        return None


@dataclass(frozen=True, slots=True, order=True)
class Segment:
    """One segment file: events ``first..last`` inclusive."""

    first: int
    last: int
    name: str = field(compare=False)


@dataclass(frozen=True, slots=True, order=True)
class Gap:
    """Sequences ``first..last`` the writer was told will never be journaled."""

    first: int
    last: int
    reason: str = field(compare=False, default="")
    recorded_at: float = field(compare=False, default=0.0)


@dataclass(frozen=True, slots=True)
class Coverage:
    """What a reader finds in a sequence range ``(start, end]``."""

    segments: tuple[Segment, ...]
    gaps: tuple[Gap, ...]
    #: Part of the range at or before the origin: never written to this journal.
    unjournaled: tuple[int, int] | None
    #: Part of the range removed by retention.
    removed: tuple[int, int] | None
    #: Ranges covered by nothing: data lost without the writer knowing.
    holes: tuple[tuple[int, int], ...]

    @property
    def lost(self) -> bool:
        """Events the bus had that a reader of this range will never get: removed by
        retention, in a gap the writer recorded (the bus no longer had them), or in an
        unknown hole."""
        return self.removed is not None or bool(self.holes) or bool(self.gaps)

    def describe_loss(self, directory: Path) -> str:
        """One sentence saying which sequences of ``directory``'s journal are lost, and why."""
        parts = []
        if self.removed is not None:
            lo, hi = self.removed
            parts.append(f"sequences {lo}..{hi} were removed by retention")
        parts.extend(
            f"sequences {g.first}..{g.last} were never journaled ({g.reason or 'no reason given'})"
            for g in self.gaps
        )
        parts.extend(f"sequences {lo}..{hi} are missing (unknown hole)" for lo, hi in self.holes)
        return f"journal {directory}: " + "; ".join(parts)


# -- shared file helpers ----------------------------------------------------------------


def _fsync_path(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_atomically(path: Path, data: bytes) -> None:
    temp = path.with_name(f".{path.name}.{os.getpid()}{TEMP_SUFFIX}")
    try:
        with open(temp, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temp, path)
    except BaseException:
        temp.unlink(missing_ok=True)  # a full disk: the old file stands, nothing is left over
        raise
    _fsync_path(path.parent)


def _read_state(directory: Path) -> dict[str, Any]:
    try:
        state = json.loads((directory / STATE_FILE).read_bytes())
    except FileNotFoundError:
        return {}
    if not isinstance(state, dict) or state.get("format") != FORMAT_VERSION:
        raise JournalError(f"{directory / STATE_FILE}: unknown journal format")
    return state


def _parse_gap_lines(data: bytes) -> tuple[list[Gap], int]:
    """Gaps in complete lines, and how many bytes they span (a torn last line is not)."""
    gaps = []
    end = data.rfind(b"\n") + 1
    for line in data[:end].splitlines():
        if line.strip():
            try:
                record = json.loads(line)
                gap = Gap(
                    int(record["first"]),
                    int(record["last"]),
                    str(record.get("reason", "")),
                    float(record.get("recorded_at", 0.0)),
                )
            except (ValueError, KeyError, TypeError):
                raise JournalError(f"corrupt line in {GAPS_FILE}: {line[:200]!r}") from None
            gaps.append(gap)
    return gaps, end


def _list_segments(directory: Path, known: dict[str, Segment]) -> dict[str, Segment]:
    """Segments in the directory, reusing parsed names (listing is the hot path)."""
    found = {}
    for name in os.listdir(directory):
        segment = known.get(name)
        if segment is None:
            match = SEGMENT_NAME.fullmatch(name)
            if match is None:
                continue
            segment = Segment(int(match[1]), int(match[2]), name)
        found[name] = segment
    return found


# -- writer -----------------------------------------------------------------------------


# Timestamps of this shape parse identically in Arrow (in C, a column at a time) and in
# parse_timestamp; anything else takes the Python path.
_ARROW_ISO = r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(\.\d{3}|\.\d{6})?(Z|[+-]\d{2}:\d{2})$"


def _text_column(raw: Sequence[bytes]) -> pa.Array:
    try:
        return pa.array(raw, pa.binary()).cast(pa.string())
    except pa.ArrowInvalid:  # not UTF-8: keep the row, mark the bad bytes
        return pa.array([value.decode("utf-8", "replace") for value in raw], pa.string())


def _timestamp_column(raw: Sequence[bytes]) -> pa.Array:
    try:
        strings = pa.array(raw, pa.binary()).cast(pa.string())
        if pc.all(pc.match_substring_regex(strings, _ARROW_ISO)).as_py():
            return pc.cast(strings, UTC_MICROS)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        pass
    return pa.array([parse_timestamp(value) for value in raw], UTC_MICROS)


class _Buffer:
    """Columns of the segment being built: raw fields in plain lists (cheapest to append
    to, under the GIL the reactor shares); decoding happens column-wise in Arrow."""

    def __init__(self) -> None:
        self.topic: list[bytes] = []
        self.seq: list[int] = []
        self.producer: list[bytes] = []
        self.timestamp: list[bytes] = []
        self.event_id: list[bytes] = []
        self.payload: list[bytes] = []
        self.received_at: list[int] = []
        self.opened_at: float | None = None

    def __len__(self) -> int:
        return len(self.seq)

    def add(self, events: Sequence[Event], received_us: int) -> None:
        topic, seq, producer, timestamp, event_id, payload = zip(*events, strict=True)
        self.topic.extend(topic)
        self.seq.extend(seq)
        self.producer.extend(producer)
        self.timestamp.extend(timestamp)
        self.event_id.extend(event_id)
        self.payload.extend(payload)
        self.received_at.extend([received_us] * len(events))

    def table(self) -> pa.Table:
        return events_table(
            self.topic,
            self.seq,
            self.producer,
            self.timestamp,
            self.event_id,
            self.payload,
            self.received_at,
        )


def events_table(
    topic: Sequence[bytes],
    seq: Sequence[int],
    producer: Sequence[bytes],
    timestamp: Sequence[bytes],
    event_id: Sequence[bytes],
    payload: Sequence[bytes],
    received_at: Sequence[int | None] | pa.Array,
) -> pa.Table:
    """Raw event columns as a table of :data:`ARROW_SCHEMA` (``received_at`` in
    microseconds since the epoch, or already an array of its type), decoded column-wise."""
    arrays = [
        _text_column(topic),
        pa.array(seq, pa.int64()),
        _text_column(producer),
        _timestamp_column(timestamp),
        _text_column(event_id),
        pa.array(payload, pa.binary()),
        received_at if isinstance(received_at, pa.Array) else pa.array(received_at, UTC_MICROS),
    ]
    return pa.Table.from_arrays(arrays, schema=ARROW_SCHEMA)


class JournalWriter:
    """Appends events to a journal directory. One writer per directory (a lock file
    enforces it across processes).

    Thread-safety: every public method takes an internal lock, so calls from several
    threads are serialized. They block on disk I/O and fsync, so call them from a
    worker thread (``deferToThread`` or a one-thread pool), never on the reactor.
    """

    def __init__(
        self,
        directory: Path | str,
        roll_events: int = 20000,
        roll_seconds: float = 0.1,
        *,
        compression: str = "snappy",
        fsync: bool = True,
    ) -> None:
        if roll_events < 1 or roll_seconds < 0:
            raise ValueError("roll_events must be >= 1 and roll_seconds >= 0")
        self.directory = Path(directory)
        self.roll_events = roll_events
        self.roll_seconds = roll_seconds
        self.compression = compression
        self.fsync = fsync
        self._lock = threading.Lock()
        self._buffer = _Buffer()
        self.directory.mkdir(parents=True, exist_ok=True)
        self._lock_handle = open(self.directory / LOCK_FILE, "a+b")  # noqa: SIM115
        try:
            fcntl.flock(self._lock_handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            self._lock_handle.close()
            raise JournalError(f"{self.directory}: another writer holds the journal") from None
        self._closed = False
        self._recover()

    # -- recovery

    def _recover(self) -> None:
        for name in os.listdir(self.directory):
            if name.endswith(TEMP_SUFFIX):  # a crash between write and rename
                log.warning("removing leftover temp file %s", name)
                (self.directory / name).unlink()
        state = _read_state(self.directory)
        self._origin: int | None = state.get("origin")
        self._retained_after: int | None = state.get("retained_after")
        segments = sorted(_list_segments(self.directory, {}).values())
        if self._retained_after is not None:
            # A crash during prune: the state is written first, so finish the removal.
            leftovers = [s for s in segments if s.last <= self._retained_after]
            for segment in leftovers:
                (self.directory / segment.name).unlink()
            if leftovers:
                _fsync_path(self.directory)
            segments = segments[len(leftovers) :]
        self._gaps = self._recover_gaps()
        candidates = [
            segments[-1].last if segments else None,
            self._gaps[-1].last if self._gaps else None,
            self._retained_after,
            self._origin,
        ]
        known = [c for c in candidates if c is not None]
        self._last: int | None = max(known) if known else None
        self._durable = self._last
        if self._origin is None and (segments or self._gaps):
            # A journal written before journal.json existed: derive the origin once.
            firsts = [s.first for s in segments[:1]] + [g.first for g in self._gaps[:1]]
            self._set_origin(min(firsts) - 1)

    def _recover_gaps(self) -> list[Gap]:
        path = self.directory / GAPS_FILE
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            return []
        gaps, end = _parse_gap_lines(data)
        if end != len(data):  # torn last line from a crash: the gap was never recorded
            log.warning("truncating a torn line at the end of %s", path)
            with open(path, "r+b") as handle:
                handle.truncate(end)
                os.fsync(handle.fileno())
        return sorted(gaps)

    # -- state

    def _set_origin(self, origin: int) -> None:
        state = {"format": FORMAT_VERSION, "origin": origin, "retained_after": self._retained_after}
        # Remembered once written: a write the disk refused is made again next time.
        _write_atomically(self.directory / STATE_FILE, json.dumps(state).encode())
        self._origin = origin
        if self._durable is None:
            self._durable = origin

    def last_sequence(self) -> int | None:
        """The highest sequence appended or declared missing (buffered ones included)."""
        with self._lock:
            return self._last

    def durable_sequence(self) -> int | None:
        """The highest sequence on disk (in a segment, a gap or the state): what a restart
        would recover. Events above it are still buffered."""
        with self._lock:
            return self._durable

    def gaps(self) -> list[Gap]:
        """The gaps recorded so far, in order."""
        with self._lock:
            return list(self._gaps)

    # -- appending

    def append(self, events: Sequence[Event], received_at: float) -> None:
        """Buffer events; all or none of them are accepted.

        Sequences must continue the journal exactly: after the last one appended, or
        after a gap recorded with :meth:`note_gap`. Rolls a segment when the buffer
        reaches ``roll_events``.
        """
        if not events:
            return
        with self._lock:
            self._check_open()
            expected = None if self._last is None else self._last + 1
            for event in events:
                sequence = event.sequence
                if sequence < 1 or sequence > MAX_JOURNAL_SEQUENCE:
                    raise SequenceError(f"sequence {sequence} is outside 1..2**63-1")
                if expected is not None and sequence != expected:
                    if sequence < expected:
                        raise SequenceError(
                            f"sequence {sequence} is not above {expected - 1}, the last one "
                            "journaled: duplicate or out of order"
                        )
                    raise SequenceError(
                        f"sequence {sequence} skips {expected}..{sequence - 1}: "
                        "record the missing range with note_gap() first"
                    )
                expected = sequence + 1
            if self._origin is None:
                self._set_origin(events[0].sequence - 1)
            if not self._buffer:
                self._buffer.opened_at = received_at
            self._buffer.add(events, round(received_at * 1_000_000))
            self._last = events[-1].sequence
            if len(self._buffer) >= self.roll_events:
                self._write_segment()

    def note_gap(self, first_missing: int, last_missing: int, reason: str) -> None:
        """Record that ``first_missing..last_missing`` will never be journaled.

        It must start right after the last sequence (anywhere if the journal is empty).
        Buffered events are written first, so a reader that sees the gap sees
        everything before it.
        """
        with self._lock:
            self._check_open()
            if not 1 <= first_missing <= last_missing <= MAX_JOURNAL_SEQUENCE:
                raise SequenceError(f"bad gap {first_missing}..{last_missing}")
            if self._last is not None and first_missing != self._last + 1:
                raise SequenceError(
                    f"gap {first_missing}..{last_missing} does not start right after "
                    f"{self._last}, the last sequence journaled"
                )
            self._write_segment()
            if self._origin is None:
                self._set_origin(first_missing - 1)
            gap = Gap(first_missing, last_missing, reason, time.time())
            line = json.dumps(
                {
                    "first": gap.first,
                    "last": gap.last,
                    "reason": reason,
                    "recorded_at": gap.recorded_at,
                }
            )
            path = self.directory / GAPS_FILE
            created = not path.exists()
            with open(path, "ab") as handle:
                size = handle.tell()
                try:
                    handle.write(line.encode() + b"\n")
                    handle.flush()
                    if self.fsync:
                        os.fsync(handle.fileno())
                except BaseException:
                    handle.truncate(size)  # no torn line for the next gap to follow
                    raise
            if created and self.fsync:
                _fsync_path(self.directory)
            self._gaps.append(gap)
            self._last = self._durable = last_missing
            log.warning("journal gap %d..%d recorded: %s", first_missing, last_missing, reason)

    def maybe_roll(self, now: float) -> bool:
        """Write the buffer as a segment if it is full or ``roll_seconds`` old."""
        with self._lock:
            self._check_open()
            buffer = self._buffer
            if not buffer:
                return False
            assert buffer.opened_at is not None
            if len(buffer) < self.roll_events and now - buffer.opened_at < self.roll_seconds:
                return False
            self._write_segment()
            return True

    def flush(self) -> None:
        """Write whatever is buffered as a segment now."""
        with self._lock:
            self._check_open()
            self._write_segment()

    def _write_segment(self) -> None:
        if not self._buffer:
            return
        first, last = self._buffer.seq[0], self._buffer.seq[-1]
        final = self.directory / segment_name(first, last)
        temp = self.directory / f".{final.name}{TEMP_SUFFIX}"
        try:
            pq.write_table(
                self._buffer.table(),
                temp,
                compression=self.compression,
                row_group_size=len(self._buffer),
            )
            if self.fsync:
                _fsync_path(temp)
            os.rename(temp, final)
        except BaseException:
            temp.unlink(missing_ok=True)  # keep the buffer: the caller may retry
            raise
        if self.fsync:
            _fsync_path(self.directory)
        self._durable = last
        self._buffer = _Buffer()

    # -- retention

    def prune(
        self,
        max_age_seconds: float | None = None,
        max_bytes: int | None = None,
        *,
        now: float | None = None,
    ) -> list[Segment]:
        """Remove whole oldest segments older than ``max_age_seconds`` (by the time the
        segment was written) or beyond ``max_bytes`` in total. Returns what was removed.

        The new retained start is recorded before any file goes, so a reader never
        mistakes removed data for an unknown hole.
        """
        with self._lock:
            self._check_open()
            now = time.time() if now is None else now
            segments = sorted(_list_segments(self.directory, {}).values())
            stats = [os.stat(self.directory / s.name) for s in segments]
            total = sum(s.st_size for s in stats)
            doomed: list[Segment] = []
            for segment, stat in zip(segments, stats, strict=True):
                too_old = max_age_seconds is not None and now - stat.st_mtime > max_age_seconds
                too_big = max_bytes is not None and total > max_bytes
                if not (too_old or too_big):
                    break
                doomed.append(segment)
                total -= stat.st_size
            if not doomed:
                return []
            self._retained_after = max(doomed[-1].last, self._retained_after or 0)
            state = {
                "format": FORMAT_VERSION,
                "origin": self._origin,
                "retained_after": self._retained_after,
            }
            _write_atomically(self.directory / STATE_FILE, json.dumps(state).encode())
            for segment in doomed:
                (self.directory / segment.name).unlink()
            _fsync_path(self.directory)
            log.info(
                "retention removed %d segments; journal now starts after %d",
                len(doomed),
                self._retained_after,
            )
            return doomed

    # -- lifecycle

    def _check_open(self) -> None:
        if self._closed:
            raise JournalError("journal writer is closed")

    def close(self) -> None:
        """Flush and release the directory. Idempotent.

        Should the flush fail (a full disk), the directory is released all the same and
        the error raised: the buffered events are above :meth:`durable_sequence`, where
        the next writer resumes."""
        with self._lock:
            if self._closed:
                return
            try:
                self._write_segment()
            finally:
                self._closed = True
                self._lock_handle.close()

    def __enter__(self) -> JournalWriter:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


# -- reader -----------------------------------------------------------------------------


class JournalReader:
    """Reads sequence ranges. Cheap to create and picklable-friendly: it holds no open
    files, only a cached listing that is refreshed when the directory changes.

    Not thread-safe; use one reader per thread.
    """

    #: The listing is trusted while the directory's mtime is unchanged, unless it was
    #: taken within this many ns of that mtime (a later change in the same
    #: filesystem clock tick would not move the mtime).
    _SAME_TICK_NS: Final = 1_000_000_000

    def __init__(self, directory: Path | str) -> None:
        self.directory = Path(directory)
        self._by_name: dict[str, Segment] = {}
        self._segments: list[Segment] = []
        self._firsts: list[int] = []
        self._dir_mtime_ns = -1
        self._scanned_at_ns = 0
        self._gaps: list[Gap] = []
        self._gaps_read = 0
        self._gaps_identity: tuple[int, int] | None = None
        self._origin: int | None = None
        self._retained_after: int | None = None

    # -- listing

    def refresh(self, force: bool = False) -> None:
        """Bring the cached listing up to date (a stat or two when nothing changed)."""
        try:
            mtime_ns = os.stat(self.directory).st_mtime_ns
        except FileNotFoundError:
            raise JournalError(f"journal directory {self.directory} does not exist") from None
        stale = (
            force
            or mtime_ns != self._dir_mtime_ns
            or self._scanned_at_ns - mtime_ns < self._SAME_TICK_NS
        )
        # Order matters: the writer records the state before the first segment and a gap
        # before any segment above it, so reading the listing first, then gaps, then
        # state, never shows a segment without what must come with it.
        if stale:
            self._scanned_at_ns = time.time_ns()
            self._by_name = _list_segments(self.directory, self._by_name)
        self._refresh_gaps()
        if stale:
            state = _read_state(self.directory)
            self._origin = state.get("origin")
            self._retained_after = floor = state.get("retained_after")
            self._segments = sorted(
                s for s in self._by_name.values() if floor is None or s.last > floor
            )
            self._firsts = [s.first for s in self._segments]
            self._dir_mtime_ns = mtime_ns
            if self._origin is None and (self._segments or self._gaps):
                # Written before journal.json existed: the writer derives it the same way.
                firsts = [s.first for s in self._segments[:1]] + [g.first for g in self._gaps[:1]]
                self._origin = min(firsts) - 1

    def _refresh_gaps(self) -> None:
        path = self.directory / GAPS_FILE
        try:
            stat = os.stat(path)
        except FileNotFoundError:
            self._gaps, self._gaps_read, self._gaps_identity = [], 0, None
            return
        identity = (stat.st_ino, stat.st_dev)
        if identity != self._gaps_identity or stat.st_size < self._gaps_read:
            self._gaps, self._gaps_read, self._gaps_identity = [], 0, identity
        if stat.st_size == self._gaps_read:
            return
        with open(path, "rb") as handle:
            handle.seek(self._gaps_read)
            new, consumed = _parse_gap_lines(handle.read())
        self._gaps = sorted([*self._gaps, *new])
        self._gaps_read += consumed

    def segments(self) -> list[Segment]:
        """The segments on disk now, in sequence order."""
        self.refresh()
        return list(self._segments)

    def gaps(self, start_exclusive: int = 0, end_inclusive: int | None = None) -> list[Gap]:
        """Known gaps overlapping ``(start_exclusive, end_inclusive]``."""
        self.refresh()
        end = MAX_JOURNAL_SEQUENCE if end_inclusive is None else end_inclusive
        return [g for g in self._gaps if g.last > start_exclusive and g.first <= end]

    def origin(self) -> int | None:
        """The journal holds events after this sequence; ``None`` while it is empty."""
        self.refresh()
        return self._origin

    def retained_after(self) -> int | None:
        """Events up to this sequence were removed by retention (``None``: nothing was)."""
        self.refresh()
        return self._retained_after

    def start_offset(self) -> int:
        """The exclusive start of everything the journal still holds (0 when empty)."""
        self.refresh()
        return max(self._origin or 0, self._retained_after or 0)

    def earliest_sequence(self) -> int | None:
        """The lowest sequence held in a segment."""
        self.refresh()
        return self._segments[0].first if self._segments else None

    def latest_sequence(self) -> int:
        """The highest sequence the journal accounts for (0 when empty). Every range
        ending here reads the same rows for as long as retention keeps them."""
        self.refresh()
        return self._latest()

    def _latest(self) -> int:
        candidates = [self._retained_after or 0, self._origin or 0]
        if self._segments:
            candidates.append(self._segments[-1].last)
        if self._gaps:
            candidates.append(self._gaps[-1].last)
        return max(candidates)

    # -- ranges

    def coverage(self, start_exclusive: int, end_inclusive: int) -> Coverage:
        """Account for every sequence in ``(start_exclusive, end_inclusive]``. Sequences
        above :meth:`latest_sequence` are not written yet, which is no loss."""
        self.refresh()
        return self._coverage(start_exclusive, end_inclusive)

    def _coverage(self, start: int, end: int) -> Coverage:
        empty = Coverage((), (), None, None, ())
        end = min(end, self._latest())
        if end <= start:
            return empty
        origin = self._origin if self._origin is not None else end
        unjournaled = (start + 1, min(origin, end)) if start < origin else None
        cursor = max(start, origin)
        removed = None
        retained = self._retained_after
        if retained is not None and cursor < retained and cursor < end:
            removed = (cursor + 1, min(retained, end))
            cursor = min(retained, end)
        low = max(bisect.bisect_right(self._firsts, cursor) - 1, 0)
        segments = []
        for segment in self._segments[low:]:
            if segment.first > end:
                break
            if segment.last > cursor:
                segments.append(segment)
        gaps = [g for g in self._gaps if g.last > cursor and g.first <= end]
        holes = []
        for lo, hi in sorted(
            [(s.first, s.last) for s in segments] + [(g.first, g.last) for g in gaps]
        ):
            if lo > cursor + 1:
                holes.append((cursor + 1, lo - 1))
            cursor = max(cursor, hi)
            if cursor >= end:
                break
        if cursor < end:
            holes.append((cursor + 1, end))
        return Coverage(tuple(segments), tuple(gaps), unjournaled, removed, tuple(holes))

    def read(
        self,
        start_exclusive: int,
        end_inclusive: int,
        topic_prefixes: Iterable[str] = (),
        *,
        fail_on_data_loss: bool = True,
        segments: Sequence[Segment] | None = None,
    ) -> pa.Table:
        """Events with ``start_exclusive < seq <= end_inclusive`` (and a topic starting
        with one of ``topic_prefixes``, if any), in sequence order.

        ``segments`` is a plan from :meth:`coverage`; given, no listing is needed unless
        a planned file has gone. Lost data raises :class:`DataLossError`, or is logged and
        skipped when ``fail_on_data_loss`` is false.
        """
        prefixes = tuple(topic_prefixes)
        if segments is None:
            coverage = self.coverage(start_exclusive, end_inclusive)
            self._check_loss(coverage, fail_on_data_loss)
            segments = coverage.segments
        tables = list(
            self.iter_tables(
                start_exclusive,
                end_inclusive,
                prefixes,
                fail_on_data_loss=fail_on_data_loss,
                segments=segments,
            )
        )
        return pa.concat_tables(tables) if tables else ARROW_SCHEMA.empty_table()

    def iter_tables(
        self,
        start_exclusive: int,
        end_inclusive: int,
        topic_prefixes: Sequence[str],
        *,
        fail_on_data_loss: bool,
        segments: Sequence[Segment],
    ) -> Iterator[pa.Table]:
        """Like :meth:`read` with a plan, one segment at a time, so memory holds one
        segment rather than a whole partition."""
        for segment in segments:
            table = self._read_segment(segment, start_exclusive, end_inclusive, fail_on_data_loss)
            if table is not None:
                table = filter_topics(table, topic_prefixes)
                if table.num_rows:
                    yield table

    def _check_loss(self, coverage: Coverage, fail_on_data_loss: bool) -> None:
        if coverage.lost:
            message = coverage.describe_loss(self.directory)
            if fail_on_data_loss:
                raise DataLossError(message)
            log.warning("%s; skipped (failOnDataLoss=false)", message)

    def _read_segment(
        self, segment: Segment, start: int, end: int, fail_on_data_loss: bool
    ) -> pa.Table | None:
        try:
            table = pq.read_table(self.directory / segment.name, memory_map=True, use_threads=False)
        except FileNotFoundError:
            # Removed since it was planned: by retention, or by hand.
            self.refresh(force=True)
            lo, hi = max(start, segment.first - 1), min(end, segment.last)
            self._check_loss(self._coverage(lo, hi), fail_on_data_loss)
            return None
        lo = max(start + 1, segment.first)
        hi = min(end, segment.last)
        if table.num_rows == segment.last - segment.first + 1:
            # Segments are contiguous, so the row index is seq - first.
            table = table.slice(lo - segment.first, hi - lo + 1)
        else:
            seq = table.column("seq")
            mask = pc.and_(pc.greater_equal(seq, lo), pc.less_equal(seq, hi))
            table = table.filter(mask)
        return table.cast(ARROW_SCHEMA) if table.schema != ARROW_SCHEMA else table


def filter_topics(table: pa.Table, prefixes: Sequence[str]) -> pa.Table:
    """Rows whose topic starts with one of ``prefixes`` (all rows if there are none)."""
    if not prefixes:
        return table
    topic = table.column("topic")
    mask = pc.starts_with(topic, prefixes[0])
    for prefix in prefixes[1:]:
        mask = pc.or_(mask, pc.starts_with(topic, prefix))
    return table.filter(mask)
