"""Worker threads for disk work (SQLite checkpoints, journal writes), kept off the reactor.

A pool made here has one daemon thread: work stays in order, and a thread stuck in a
system call (a dying disk) never keeps the process from exiting once its service has
given up waiting for it.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from twisted.internet import defer
from twisted.internet.threads import deferToThreadPool
from twisted.python.failure import Failure
from twisted.python.threadpool import ThreadPool


class _DaemonThread(threading.Thread):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, daemon=True, **kwargs)


def worker_pool(name: str, threads: int = 1) -> ThreadPool:
    """A pool of ``threads`` daemon threads (one by default: work stays in order);
    ``start()`` it, ``stop()`` it once its work is done (stop joins the threads)."""
    pool = ThreadPool(minthreads=min(1, threads), maxthreads=threads, name=name)
    pool.threadFactory = _DaemonThread
    return pool


class _OneThread:
    """Blocking work on one daemon thread of its own (:func:`worker_pool`), its failures
    handed to ``on_failure``: :meth:`start` before the first call, :meth:`stop` once idle."""

    def __init__(self, reactor: Any, name: str, on_failure: Callable[[Failure], object]) -> None:
        self.reactor = reactor
        self._pool = worker_pool(name)
        self._on_failure = on_failure

    def start(self) -> None:
        """Start the thread; idempotent."""
        if not self._pool.started:
            self._pool.start()

    def stop(self) -> None:
        """Join the thread; call once no call runs (a stuck thread is a daemon: leave it
        rather than stop)."""
        if self._pool.started:
            self._pool.stop()


class SerialWork(_OneThread):
    """Periodic blocking work (a WAL checkpoint) on one daemon thread, one call at a time:
    a call asked for while one runs is skipped, and the next period catches up."""

    def __init__(self, reactor: Any, name: str, on_failure: Callable[[Failure], object]) -> None:
        super().__init__(reactor, name, on_failure)
        self._running: defer.Deferred[Any] | None = None

    @property
    def running(self) -> bool:
        """A call is on the thread now."""
        return self._running is not None

    def run(self, function: Callable[[], object]) -> None:
        """Run ``function`` on the thread, unless a call is still running (then skip it); a failure
        goes to ``on_failure``."""
        if self._running is not None:
            return

        def done(result: object) -> None:
            self._running = None
            if isinstance(result, Failure):
                self._on_failure(result)

        self._running = deferToThreadPool(self.reactor, self._pool, function)
        self._running.addBoth(done)

    def idle(self, timeout: float | None = None) -> defer.Deferred[bool]:
        """Fires True once no call runs, or False if one still runs after ``timeout``
        seconds (None: wait for it however long it takes)."""
        running = self._running
        if running is None:
            return defer.succeed(True)
        finished: defer.Deferred[bool] = defer.Deferred()

        def settle(value: bool) -> None:
            if not finished.called:
                finished.callback(value)

        timer = None if timeout is None else self.reactor.callLater(timeout, settle, False)

        def ended(result: object) -> object:
            if timer is not None and timer.active():
                timer.cancel()
            settle(True)
            return result

        running.addBoth(ended)
        return finished


class NewestWins(_OneThread):
    """Blocking work (a status file's rewrite) on one daemon thread, where only the newest
    call matters: a call asked for while one runs waits, and a newer one replaces it. The
    reactor never waits for the disk (here, on ext4, renaming a status.json over the old one
    took 0.25-0.45 ms on average and 4-7 ms at worst, every time a service rewrote it)."""

    def __init__(self, reactor: Any, name: str, on_failure: Callable[[Failure], object]) -> None:
        super().__init__(reactor, name, on_failure)
        self._running = False
        self._waiting: Callable[[], object] | None = None
        self._idle: list[defer.Deferred[None]] = []

    def run(self, function: Callable[[], object]) -> None:
        """Run ``function`` on the thread once the call running (if any) ends, unless a newer
        call comes first; a failure goes to ``on_failure``."""
        if self._running:
            self._waiting = function
            return
        self._running = True
        deferToThreadPool(self.reactor, self._pool, function).addBoth(self._ended)

    def _ended(self, result: object) -> None:
        self._running = False
        if isinstance(result, Failure):
            self._on_failure(result)
        waiting, self._waiting = self._waiting, None
        if waiting is not None:
            self.run(waiting)
            return
        idle, self._idle = self._idle, []
        for waiter in idle:
            waiter.callback(None)

    def idle(self) -> defer.Deferred[None]:
        """Fires once no call runs or waits."""
        if not self._running:
            return defer.succeed(None)
        waiter: defer.Deferred[None] = defer.Deferred()
        self._idle.append(waiter)
        return waiter
