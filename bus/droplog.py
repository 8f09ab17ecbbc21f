"""Counted, rate-limited reporting of bad input from peers.

A peer that floods the server with garbage must not flood the log too: every drop is
counted by reason, and a warning per reason is written at most once per ``interval``
seconds, carrying how many were dropped since the last one.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable

from twisted.logger import Logger


class DropCounter:
    def __init__(
        self,
        log: Logger,
        what: str,
        clock: Callable[[], float],
        interval: float = 10.0,
    ) -> None:
        self._log = log
        self._what = what
        self._clock = clock
        self._interval = interval
        self.counts: Counter[str] = Counter()
        self._unreported: Counter[str] = Counter()
        self._last_report: dict[str, float] = {}

    @property
    def total(self) -> int:
        return sum(self.counts.values())

    def drop(self, reason: str, detail: str = "", peer: bytes = b"") -> None:
        self.counts[reason] += 1
        self._unreported[reason] += 1
        now = self._clock()
        last = self._last_report.get(reason)
        if last is not None and now - last < self._interval:
            return
        self._last_report[reason] = now
        self._log.warn(
            "dropped {count} bad {what} ({reason}): {detail}; peer {peer}",
            count=self._unreported.pop(reason),
            what=self._what,
            reason=reason,
            detail=detail,
            peer=peer.hex()[:40],
        )
