"""A peer's heartbeat period as its HEARTBEATs show it (sans-I/O).

eventmq's peers each count silence by their own settings: a worker whose ``--heartbeat-interval``
x ``--heartbeat-liveness`` is shorter than its broker's heartbeat interval finds the broker
silent between two of its HEARTBEATs and connects again, over and over, losing what it runs
(seen with a worker at 0.2 s beside a broker at 3 s: a new connection every 0.7-0.8 s). A
:class:`HeardPeriod` learns the period the peer actually keeps, so that silence is counted
against the longer of the two.
"""

from __future__ import annotations

from collections import deque

#: Gaps kept: the period is the shortest of them (a HEARTBEAT missed, say one sent while this
#: side was connecting again, or a late one only lengthens a gap).
KEEP = 4
#: A gap longer than this (seconds) is not a period (a peer that was stopped, a clock set).
LONGEST = 3600.0


class HeardPeriod:
    """The shortest of the last :data:`KEEP` gaps between a peer's HEARTBEATs: by the
    sender's own clock where a HEARTBEAT carries one (eventmq's form; what its arrival went
    through does not count), else by their arrival."""

    def __init__(self) -> None:
        self._gaps: deque[float] = deque(maxlen=KEEP)
        #: The last HEARTBEAT's time, and whether it was the sender's clock.
        self._last: tuple[float, bool] | None = None

    @property
    def period(self) -> float | None:
        """Seconds between the peer's HEARTBEATs; None until two were heard."""
        return min(self._gaps) if self._gaps else None

    def heard(self, sent_at: bytes, arrived: float) -> None:
        """A HEARTBEAT carrying ``sent_at`` (the sender's time as text, or empty) arrived
        at ``arrived`` (this side's clock)."""
        try:
            at, senders = float(sent_at), True
        except ValueError:
            at, senders = arrived, False
        last, self._last = self._last, (at, senders)
        if last is None or last[1] != senders:
            return  # the first, or another clock: no gap to measure
        gap = at - last[0]
        if 0 < gap <= LONGEST:
            self._gaps.append(gap)

    def forget(self) -> None:
        """Start over (another peer)."""
        self._gaps.clear()
        self._last = None
