"""Whether a timer's wake may judge its peers' silence, sans I/O.

A timer that fires well after its time says this process did not run meanwhile (SIGSTOP, a
VM's pause, a starved machine). What its peers sent during that time may be waiting unread
in its sockets, and a peer stalled with it (the same VM) speaks again only once it runs: a
wake that judged them silent then would expire, forget or fail over from peers that spoke
all along. So a late wake judges nothing, nor does any wake within ``settle`` seconds of it
(the reactor reads what waited, the peers' own late timers send); the first wake after that
judges, late or not. A process late at every wake still judges at every other one: a stall
delays a judgement by about a period and ``settle``, and never keeps a dead peer for ever.
"""

from __future__ import annotations

from collections.abc import Callable


class Wakes:
    """The wakes of one timer on ``clock``: a periodic one of ``period`` seconds, whose wake
    is late when it comes more than ``period + slack`` after the one before, or one armed for
    a deadline, whose wake is late when it comes more than ``slack`` after the ``due`` time it
    is given. ``slack`` and ``settle`` are half a period unless given; ``period`` may be
    changed between wakes (a configuration reloaded)."""

    def __init__(
        self,
        period: float,
        clock: Callable[[], float],
        slack: float | None = None,
        settle: float | None = None,
    ) -> None:
        self.period = period
        self.clock = clock
        self._slack = slack
        self._settle = settle
        self._last: float | None = None
        #: When the wake that came late came, until a wake judges again.
        self.late_at: float | None = None
        #: Wakes, and those that came late (and judged nothing).
        self.woken = self.held = 0

    @property
    def settle(self) -> float:
        """Seconds after a late wake in which no wake judges."""
        return self.period / 2 if self._settle is None else self._settle

    def judging(self, due: float | None = None) -> bool:
        """Call once at each wake (with the time it was armed for, if a deadline's): whether
        it may judge silence now."""
        now = self.clock()
        last, self._last = self._last, now
        self.woken += 1
        slack = self.period / 2 if self._slack is None else self._slack
        if due is None:
            late = last is not None and now - last > self.period + slack
        else:
            late = now - due > slack
        if self.late_at is None:
            if not late:
                return True
            self.late_at = now
            self.held += 1
            return False
        if now < self.late_at + self.settle:
            return False  # settling after a late wake
        self.late_at = None
        return True
