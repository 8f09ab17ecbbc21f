"""Waiting on the reactor for a condition, with a deadline (never a fixed sleep)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from twisted.internet import defer


class ConditionTimeout(AssertionError):
    """A condition waited for did not come true in time."""


def wait_until(
    predicate: Callable[[], object],
    timeout: float = 10.0,
    interval: float = 0.005,
    reactor: Any = None,
    what: str = "",
) -> defer.Deferred[None]:
    """Fire once ``predicate()`` is true; fail with :class:`ConditionTimeout` after
    ``timeout`` seconds. Polls on the reactor, so servers keep running meanwhile."""
    from bus.util.reactor import reactor_of

    clock = reactor_of(reactor)
    deadline = time.monotonic() + timeout
    result: defer.Deferred[None] = defer.Deferred()

    def check() -> None:
        try:
            done = predicate()
        except Exception:
            result.errback()
            return
        if done:
            result.callback(None)
        elif time.monotonic() > deadline:
            result.errback(
                ConditionTimeout(f"timed out after {timeout:g}s waiting for {what or predicate}")
            )
        else:
            clock.callLater(interval, check)

    check()
    return result
