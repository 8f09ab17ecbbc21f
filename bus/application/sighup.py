"""SIGHUP: read the settings again, in every service of the process that can.

twistd installs handlers for SIGINT and SIGTERM (a stop) but none for SIGHUP, whose default
ends the process at once, without a line in the log and without stopping its services
(eventmq's programs read their settings again at SIGHUP, and operators send it). A service
that can read its settings again registers a callback with :func:`on_sighup`; the first
registration installs one handler at once (twistd starts services before its reactor runs:
a SIGHUP then must not end the process either), which calls every callback in the
reactor's thread, in the order registered. A callback that raises is logged and the others
still run: a SIGHUP never ends the process.
"""

from __future__ import annotations

import signal
from collections.abc import Callable
from types import FrameType
from typing import Any

from twisted.logger import Logger

log = Logger(namespace="bus.application.sighup")

_callbacks: list[Callable[[], object]] = []
_installed: list[Any] = []


def on_sighup(reactor: Any, callback: Callable[[], object]) -> Callable[[], None]:
    """Call ``callback`` (in the reactor's thread) at every SIGHUP from now on; the
    function returned stops that (a service's stop)."""
    _callbacks.append(callback)
    if reactor not in _installed:
        _installed.append(reactor)
        try:
            _install(reactor)
        except ValueError:  # not the main thread: once the reactor runs (in it)
            reactor.callWhenRunning(_install, reactor)

    def forget() -> None:
        if callback in _callbacks:
            _callbacks.remove(callback)

    return forget


def _install(reactor: Any) -> None:
    def handle(signum: int, frame: FrameType | None) -> None:
        reactor.callFromThread(_run_all)

    signal.signal(signal.SIGHUP, handle)


def _run_all() -> None:
    for callback in list(_callbacks):
        try:
            callback()
        except Exception:
            log.failure("SIGHUP: reading the settings again failed; going on as before")


__all__ = ["on_sighup"]
