"""An asyncio loop on a thread of its own, for an asyncio client (nats-py) in a Twisted
process whose reactor stays what it is. The product used it while the Event BUS's
stream management ran on nats-py; it now lives here, for bench/nats_loop.py only.

Measured before choosing (``bench/nats_loop.py``): nats-py driven from its own loop thread
publishes and replays as fast as nats-py alone, one thread hop each way per batch, and the
process's reactor (and with it every other service and the SQLite mode) is unchanged;
Twisted's asyncio reactor for the whole process was no faster for nats-py and would move
every service onto asyncio's loop.

:meth:`AsyncioThread.call` runs a coroutine on the loop and gives its result to the
reactor's thread as a Deferred; :meth:`AsyncioThread.to_reactor` is how code on the loop
hands something back (batched by the caller: one hop per batch, not per message).
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

from twisted.internet import defer

T = TypeVar("T")


class AsyncioThread:
    """One asyncio loop in a daemon thread, started and stopped with its owner."""

    def __init__(self, reactor: Any, name: str) -> None:
        self.reactor = reactor
        self.name = name
        self.loop = asyncio.new_event_loop()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)
            self._thread.start()

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_forever()

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def call(self, coroutine: Coroutine[Any, Any, T]) -> defer.Deferred[T]:
        """Run ``coroutine`` on the loop; its result (or failure) fires the Deferred in
        the reactor's thread."""
        result: defer.Deferred[T] = defer.Deferred()
        future = asyncio.run_coroutine_threadsafe(coroutine, self.loop)

        def done(finished: Any) -> None:
            if finished.cancelled():
                self.reactor.callFromThread(result.cancel)
                return
            error = finished.exception()
            if error is not None:
                self.reactor.callFromThread(result.errback, error)
            else:
                self.reactor.callFromThread(result.callback, finished.result())

        future.add_done_callback(done)
        return result

    def to_reactor(self, function: Callable[..., object], *args: object) -> None:
        """From the loop's thread: call ``function(*args)`` in the reactor's thread."""
        self.reactor.callFromThread(function, *args)

    def stop(self, timeout: float = 5.0) -> None:
        """Cancel what still runs on the loop, stop it and wait for its thread."""
        if self._thread is None:
            return

        async def cancel_all() -> None:
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

        if self._thread.is_alive():
            # A task that will not end: the loop is stopped anyway.
            with contextlib.suppress(Exception):
                asyncio.run_coroutine_threadsafe(cancel_all(), self.loop).result(timeout)
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join(timeout)
        self._thread = None
        if not self.loop.is_running():
            self.loop.close()
