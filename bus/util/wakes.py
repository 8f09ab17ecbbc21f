"""Whether a periodic wake may judge its peers' silence, sans I/O.

A timer that fires well after its time says this process did not run meanwhile (SIGSTOP, a
VM's pause, a starved machine). What its peers sent during that time may be waiting unread
in its sockets: a wake that judged them silent then would expire, forget or fail over from
peers that spoke all along. The reactor reads those sockets before the next wake, so that
one judges. A process late at every wake still judges at every other one: a stall delays a
judgement by one period at most, and never keeps a dead peer for ever.
"""

from __future__ import annotations

from collections.abc import Callable


class Wakes:
    """The wakes of one periodic timer of ``period`` seconds on ``clock``; a wake is late when
    it comes more than ``period + slack`` after the one before (``slack``: half a period unless
    given). ``period`` may be changed between wakes (a configuration reloaded)."""

    def __init__(
        self, period: float, clock: Callable[[], float], slack: float | None = None
    ) -> None:
        self.period = period
        self.clock = clock
        self._slack = slack
        self._last: float | None = None
        self._held = False
        #: Wakes that did not judge, having come late.
        self.held = 0

    def judging(self) -> bool:
        """Call once at each wake: whether it may judge silence now (False for a late wake
        that follows one that judged)."""
        now = self.clock()
        last, self._last = self._last, now
        slack = self.period / 2 if self._slack is None else self._slack
        late = last is not None and now - last > self.period + slack
        if late and not self._held:
            self._held = True
            self.held += 1
            return False
        self._held = False
        return True
