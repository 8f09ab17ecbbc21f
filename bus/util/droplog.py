"""Counted, rate-limited reporting: of bad input from peers, and of repeating faults.

A peer that floods the server with garbage must not flood the log too: every drop is
counted by reason, and a warning per reason is written at most once per ``interval``
seconds, carrying how many were dropped since the last one. A fault that repeats on
every retry (a full disk) is reported the same way, through :class:`RateLimit`.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable

from twisted.logger import Logger


class RateLimit:
    """At most one report per key every ``interval`` seconds.

    :meth:`due` is called for every occurrence; it returns how many occurrences the
    report now due stands for (this one and those held back since the last report), or
    ``None`` when this one is held back. :meth:`reset` makes the next occurrence of a key
    due at once (e.g. once a fault has cleared, its next episode is news).
    """

    def __init__(self, clock: Callable[[], float], interval: float = 10.0) -> None:
        self._clock = clock
        self.interval = interval
        self._held_back: Counter[str] = Counter()
        self._last_report: dict[str, float] = {}

    def due(self, key: str) -> int | None:
        """Note one occurrence of ``key``: the number of occurrences the report now due stands for,
        or None while it is held back."""
        self._held_back[key] += 1
        now = self._clock()
        last = self._last_report.get(key)
        if last is not None and now - last < self.interval:
            return None
        self._last_report[key] = now
        return self._held_back.pop(key)

    def reset(self, key: str) -> None:
        """Forget ``key``: its next occurrence is reported at once."""
        self._last_report.pop(key, None)
        self._held_back.pop(key, None)


class RefusalCounter:
    """Refusals counted by reason; each reason logged at most once per ``interval`` with
    ``message`` (a format given ``count``, ``reason`` and the fields of :meth:`refuse`)."""

    def __init__(
        self, log: Logger, message: str, clock: Callable[[], float], interval: float = 10.0
    ) -> None:
        self._log = log
        self._message = message
        self.counts: Counter[str] = Counter()
        self._limit = RateLimit(clock, interval)

    def refuse(self, reason: str, **fields: object) -> None:
        """Count a refusal for ``reason``, and log it unless that reason was logged within the
        interval; ``fields`` fill the message."""
        self.counts[reason] += 1
        count = self._limit.due(reason)
        if count is not None:
            self._log.warn(self._message, count=count, reason=reason, **fields)


class DropCounter:
    """Bad input from peers (``what``: "frames", "datagrams") dropped and counted by reason; each
    reason logged at most once per ``interval``, with how many since the last line."""

    def __init__(
        self,
        log: Logger,
        what: str,
        clock: Callable[[], float],
        interval: float = 10.0,
    ) -> None:
        self._log = log
        self._what = what
        self.counts: Counter[str] = Counter()
        self._limit = RateLimit(clock, interval)

    @property
    def total(self) -> int:
        """Drops counted, over every reason."""
        return sum(self.counts.values())

    def drop(self, reason: str, detail: str = "", peer: bytes | str = b"") -> None:
        """Count a drop; ``peer`` is a ZeroMQ identity (bytes, logged as hex) or a network
        address (text, logged as it is)."""
        self.counts[reason] += 1
        count = self._limit.due(reason)
        if count is None:
            return
        self._log.warn(
            "dropped {count} bad {what} ({reason}): {detail}; peer {peer}",
            count=count,
            what=self._what,
            reason=reason,
            detail=detail,
            peer=peer[:60] if isinstance(peer, str) else peer.hex()[:40],
        )
