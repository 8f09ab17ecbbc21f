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
    work, not other processes' turns on the CPU): :meth:`spent` says once it is over, and
    from then on (:attr:`over`). A step that checks it between parts of its work stops at the
    first part that ends past it: its length is bounded by what its work costs now, where a
    chunk is sized by what it cost before."""

    def __init__(self, seconds: float, clock: Callable[[], float] = time.thread_time) -> None:
        self.clock = clock
        self._end = clock() + seconds
        #: The budget ran out at a check.
        self.over = False

    def spent(self) -> bool:
        """The budget is spent (checked now, unless it was already)."""
        if not self.over:
            self.over = self.clock() >= self._end
        return self.over
