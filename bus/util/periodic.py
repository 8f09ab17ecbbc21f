"""Periodic work on an injected reactor, started and stopped together."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from twisted.internet import task
from twisted.logger import Logger


class Periodic:
    """A service's LoopingCalls: each runs on the given reactor, a failure is logged
    (the loop then ends, as LoopingCall does), and :meth:`stop_all` is idempotent."""

    def __init__(self, reactor: Any, log: Logger) -> None:
        self.reactor = reactor
        self._log = log
        self._loops: list[task.LoopingCall] = []

    def every(
        self, interval: float, function: Callable[[], object], now: bool = False
    ) -> task.LoopingCall:
        """Call ``function`` every ``interval`` seconds (first at once when ``now``) until
        :meth:`stop_all`."""
        loop = task.LoopingCall(function)
        loop.clock = self.reactor
        name = getattr(function, "__name__", repr(function))
        loop.start(interval, now=now).addErrback(
            lambda failure: self._log.failure("periodic {name} failed", failure, name=name)
        )
        self._loops.append(loop)
        return loop

    def stop_all(self) -> None:
        """Stop every loop started here; calling it again does nothing."""
        for loop in self._loops:
            if loop.running:
                loop.stop()
        self._loops.clear()
