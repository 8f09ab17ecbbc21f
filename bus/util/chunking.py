"""Work in chunks sized by their measured time: a step that holds a thread (the reactor's) for
about a target duration, whatever one item of the work costs on this machine today.

A chunk's size follows the median rate (items a second) of the last few steps of its kind, so
one step that the operating system kept off the CPU does not shrink the next; it grows at most
twofold from one step to the next, so that a rate measured on small steps cannot overshoot the
target by more than that. Nothing here knows of Twisted or of what the work is.
"""

from __future__ import annotations

import statistics
import time
from collections import deque
from collections.abc import Callable


class ChunkSizer:
    """How many items the next step of each kind of work should take, so that it lasts about
    ``target`` seconds: :meth:`chunk` before the step, :meth:`took` after it (only for a step
    that did a whole chunk: a short last step says little of the rate)."""

    def __init__(
        self,
        target: float,
        *,
        first: int = 256,
        smallest: int = 16,
        largest: int = 65_536,
        window: int = 8,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        if target <= 0 or not 0 < smallest <= first <= largest or window < 1:
            raise ValueError("need target > 0, 0 < smallest <= first <= largest, window >= 1")
        self.target = target
        self.first = first
        self.smallest = smallest
        self.largest = largest
        #: Measures the steps (monotonic seconds).
        self.clock = clock
        self._rates: dict[str, deque[float]] = {}
        self._last: dict[str, int] = {}
        self._window = window

    def chunk(self, kind: str) -> int:
        """The size of the next step of ``kind``."""
        rates = self._rates.get(kind)
        if not rates:
            size = self.first
        else:
            size = int(statistics.median(rates) * self.target)
            size = min(size, 2 * self._last.get(kind, self.first))
        size = max(self.smallest, min(self.largest, size))
        self._last[kind] = size
        return size

    def took(self, kind: str, items: int, seconds: float) -> None:
        """A step of ``kind`` did ``items`` in ``seconds``."""
        rates = self._rates.setdefault(kind, deque(maxlen=self._window))
        rates.append(items / max(seconds, 1e-7))


class Budget:
    """The time a step may take, by ``clock`` (by default the thread's CPU time: the step's
    work, not other processes' turns on the CPU): :meth:`spent` says once it is over, or once
    another stretch of work as long as the longest between two looks so far would take the
    step past it; and from then on (:attr:`over`). A step that checks it between parts of its
    work stops before a part that would not fit at the pace it measures now, where a chunk is
    sized by what its work cost before: on a shared virtual machine the same work sometimes
    runs ten times slower for milliseconds at a time (and counts as the thread's CPU), and a
    step that only stopped once past the end ran the part under way that much longer."""

    def __init__(self, seconds: float, clock: Callable[[], float] = time.thread_time) -> None:
        self.clock = clock
        self._looked = clock()
        self._end = self._looked + seconds
        #: The longest stretch between two looks at the clock (from the start, the first).
        self._longest = 0.0
        #: The budget ran out at a check.
        self.over = False

    def spent(self) -> bool:
        """The budget is spent, or the next stretch would spend it (checked now, unless it
        was already)."""
        if not self.over:
            now = self.clock()
            self._longest = max(self._longest, now - self._looked)
            self._looked = now
            self.over = now + self._longest >= self._end
        return self.over
