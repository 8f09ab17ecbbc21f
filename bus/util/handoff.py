"""Lists handed from a thread of our own to the reactor's thread, in order.

``reactor.callFromThread`` writes to the reactor's waker pipe on every call. A reader
thread that hands over what each read of its socket brought (the Event BUS front-end's
JetStream feed) would wake the reactor hundreds of times a second; :class:`Handoff` wakes
it once per burst: what arrives before the reactor runs joins the list already waiting.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any, Generic, TypeVar

T = TypeVar("T")


class Handoff(Generic[T]):
    """:meth:`put` from any thread; ``receive`` gets everything put since its last call,
    in order, in the reactor's thread."""

    def __init__(self, reactor: Any, receive: Callable[[list[T]], None]) -> None:
        self._reactor = reactor
        self._receive = receive
        self._lock = threading.Lock()
        self._items: list[T] = []
        self._posted = False

    def put(self, items: list[T]) -> None:
        """Queue ``items`` for the reactor's thread; callable from any thread."""
        with self._lock:
            self._items.extend(items)
            if self._posted:
                return  # the call already on its way takes these too
            self._posted = True
        self._reactor.callFromThread(self._deliver)

    def _deliver(self) -> None:
        with self._lock:
            items, self._items = self._items, []
            self._posted = False
        if items:
            self._receive(items)
