"""A fixed-size file of one series of numbers, one slot per tick of a fixed interval: the
newest ``capacity`` ticks are kept and the file never grows.

The file is a header (what it is, its interval and capacity, with a checksum) and
``capacity`` slots; tick ``n`` (``floor(time / interval)``) lives in slot
``n % capacity`` as the tick, the value and a check word (the tick inverted, exclusive-or
the value's bits): a slot torn anywhere (a sector of it written, the next not) or with any
one of its words damaged does not match itself, and the check is one operation on words
read at C speed, so a day of a series reads in milliseconds.
A write is one
``pwrite`` of one slot and nothing is synced: what a process wrote survives its being
killed (the kernel has it); a power failure may lose the last writes, which a chart can
miss. A slot whose checksum is wrong or whose tick does not belong there is not read
(and counted); a file cut short is extended again (its missing slots are empty); a file
whose header is not ours, or says another interval or capacity, is moved aside and
started afresh. Nothing here knows of Twisted or of time: callers pass the ticks.
"""

from __future__ import annotations

import math
import os
import struct
import sys
import zlib
from pathlib import Path
from typing import cast

MAGIC = b"BUSRING1"
#: magic, interval (seconds), capacity (slots), then the CRC-32 of those.
_HEADER = struct.Struct("<8sdI")
HEADER_SIZE = 64
#: tick, value, then the check word: ~tick ^ the value's bits.
_SLOT = struct.Struct("<qdq")
_WORDS = struct.Struct("<qqq")
_BITS = struct.Struct("<q")
_FLOAT = struct.Struct("<d")
SLOT_SIZE = _SLOT.size


def _header(interval: float, capacity: int) -> bytes:
    head = _HEADER.pack(MAGIC, interval, capacity)
    return (head + struct.pack("<I", zlib.crc32(head))).ljust(HEADER_SIZE, b"\0")


def _slot(tick: int, value: float) -> bytes:
    bits = _BITS.unpack(_FLOAT.pack(value))[0]
    return _SLOT.pack(tick, value, ~tick ^ bits)


class RingFile:
    """One series in a file at ``path``: ``capacity`` ticks of ``interval`` seconds.

    Opening repairs what it can and says what it did in :attr:`opened` (``"created"``,
    ``"opened"``, ``"extended"``: the file was cut short, or ``"reset"``: it was not a
    ring of this shape, and is kept beside as ``NAME.corrupt``)."""

    def __init__(self, path: Path, interval: float, capacity: int) -> None:
        if interval <= 0 or capacity < 1:
            raise ValueError("interval and capacity must be positive")
        self.path = path
        self.interval = interval
        self.capacity = capacity
        #: Slots read that did not match themselves or their place (skipped), since opened.
        self.invalid = 0
        #: What opening found: created, opened, extended or reset.
        self.opened = "opened"
        #: Why the file was reset or extended ("" when it was neither).
        self.why = ""
        self.size = HEADER_SIZE + capacity * SLOT_SIZE
        self._fd = self._open()

    def _open(self) -> int:
        header = _header(self.interval, self.capacity)
        try:
            fd = os.open(self.path, os.O_RDWR)
        except FileNotFoundError:
            return self._create(header, "created")
        try:
            found = os.pread(fd, HEADER_SIZE, 0)
            if found != header:
                self.why = self._header_problem(found)
                os.close(fd)
                os.replace(self.path, self.path.with_name(self.path.name + ".corrupt"))
                return self._create(header, "reset")
            size = os.fstat(fd).st_size
            if size != self.size:
                # Cut short (or longer than a ring: not ours past its end): empty slots
                # read as nothing, so the slots kept stay readable.
                self.why = f"{size} bytes, not {self.size}"
                os.ftruncate(fd, self.size)
                self.opened = "extended"
        except BaseException:
            os.close(fd)
            raise
        return fd

    def _header_problem(self, found: bytes) -> str:
        if len(found) < HEADER_SIZE:
            return f"header cut short ({len(found)} bytes)"
        magic, interval, capacity = _HEADER.unpack_from(found)
        (crc,) = struct.unpack_from("<I", found, _HEADER.size)
        if magic != MAGIC or crc != zlib.crc32(found[: _HEADER.size]):
            return "not a ring file (or its header was damaged)"
        return (
            f"a ring of {capacity} slots of {interval} s, not {self.capacity} of {self.interval} s"
        )

    def _create(self, header: bytes, opened: str) -> int:
        # Written whole under another name, then renamed: a crash leaves no half header.
        partial = self.path.with_name(self.path.name + ".new")
        fd = os.open(partial, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            os.pwrite(fd, header, 0)
            os.ftruncate(fd, self.size)
            os.replace(partial, self.path)
        except BaseException:
            os.close(fd)
            raise
        self.opened = opened
        return fd

    def write(self, tick: int, value: float) -> None:
        """Keep ``value`` for ``tick`` (in the slot of the tick ``capacity`` before it)."""
        os.pwrite(self._fd, _slot(tick, value), HEADER_SIZE + (tick % self.capacity) * SLOT_SIZE)

    def read(self, first: int, last: int) -> list[tuple[int, float]]:
        """The ticks kept from ``first`` to ``last`` (both included) and their values, in
        order; ticks older than the ring's capacity are gone."""
        first = max(first, last - self.capacity + 1)
        if first > last:
            return []
        start = first % self.capacity
        count = last - first + 1
        # At most two runs of slots: to the file's end, then from its start.
        head = min(count, self.capacity - start)
        data = os.pread(self._fd, head * SLOT_SIZE, HEADER_SIZE + start * SLOT_SIZE)
        if count > head:
            data += os.pread(self._fd, (count - head) * SLOT_SIZE, HEADER_SIZE)
        ticks: list[int]
        bits: list[int]
        checks: list[int]
        values: list[float]
        if sys.byteorder == "little":
            # The columns at C speed (a day of a series is 8,640 slots), then one pass.
            words = memoryview(data).cast("q")
            ticks, bits, checks = words[0::3].tolist(), words[1::3].tolist(), words[2::3].tolist()
            values = cast("list[float]", memoryview(data).cast("d")[1::3].tolist())
        else:
            ticks, bits, checks = (list(c) for c in zip(*_WORDS.iter_unpack(data), strict=True))
            values = [_FLOAT.unpack(_BITS.pack(b))[0] for b in bits]
        expected = range(first, first + len(ticks))
        kept: list[tuple[int, float]] = [
            (tick, value)
            for tick, want, bit, value, check in zip(
                ticks, expected, bits, values, checks, strict=True
            )
            if tick == want and check == ~tick ^ bit and math.isfinite(value)
        ]
        if len(kept) < len(ticks):
            self.invalid += self._damaged(expected, ticks, bits, checks)
        return kept

    def _damaged(
        self, expected: range, ticks: list[int], bits: list[int], checks: list[int]
    ) -> int:
        """How many of the slots read are neither empty, nor the tick asked, nor a tick of
        an earlier round: torn or damaged."""
        capacity, count = self.capacity, 0
        for tick, want, bit, check in zip(ticks, expected, bits, checks, strict=True):
            if check == ~tick ^ bit and tick % capacity == want % capacity:
                continue  # whole: this round's (not finite, then) or an earlier one's
            if tick or bit or check:
                count += 1
        return count

    def close(self) -> None:
        """Close the file (idempotent)."""
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
