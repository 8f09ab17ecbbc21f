"""Server-Sent Events to open consoles.

Each open response is a streaming producer registered with its request, so twisted.web
says when the client's TCP buffer is full: what comes meanwhile is not written (and is
counted), which is right for frames that are each whole (the next state replaces the last)
and for a tail that says how much it skipped. A hub ticks only while a stream is open.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from twisted.internet import task
from twisted.internet.interfaces import IPushProducer
from twisted.logger import Logger
from twisted.python.failure import Failure
from zope.interface import implementer  # type: ignore[import-untyped]

log = Logger(namespace="bus.web.console")


def sse(event: str, data: Any) -> bytes:
    """One Server-Sent Event: ``event: NAME`` and its data as one line of JSON."""
    body = json.dumps(data, separators=(",", ":"), default=str)
    return f"event: {event}\ndata: {body}\n\n".encode()


@implementer(IPushProducer)
class Stream:
    """One open ``text/event-stream`` response."""

    def __init__(self, request: Any, on_close: Callable[[Stream], None]) -> None:
        self.request = request
        self.paused = False
        self.closed = False
        #: Frames not written because the client was not reading.
        self.skipped = 0
        self._on_close = on_close
        request.setHeader(b"content-type", b"text/event-stream; charset=utf-8")
        request.setHeader(b"cache-control", b"no-store")
        request.setHeader(b"x-accel-buffering", b"no")  # a proxy in front must not buffer
        request.registerProducer(self, True)
        request.notifyFinish().addBoth(self._finished)
        request.write(b": bus console stream\n\n")  # headers out now, not with the first frame

    def send(self, frame: bytes) -> bool:
        """Write ``frame`` unless the client is behind (then it is counted as skipped)."""
        if self.closed:
            return False
        if self.paused:
            self.skipped += 1
            return False
        self.request.write(frame)
        return True

    def pauseProducing(self) -> None:
        self.paused = True

    def resumeProducing(self) -> None:
        self.paused = False

    def stopProducing(self) -> None:
        self.close()

    def close(self) -> None:
        """End the response (the server is stopping, or the client went away)."""
        if self.closed:
            return
        self.closed = True
        self._on_close(self)
        if not self.request.finished and not getattr(self.request, "_disconnected", False):
            self.request.unregisterProducer()
            self.request.finish()

    def _finished(self, result: Failure | None) -> None:
        # The client closed the connection (or the response ended): stop writing to it.
        if not self.closed:
            self.closed = True
            self._on_close(self)


class StreamHub:
    """Open streams of one kind: ``welcome()`` goes to a stream when it opens, ``tick()``
    to all of them every ``period`` seconds, from one encoding; nothing runs when none is
    open. At most ``limit`` at once: beyond, 503."""

    def __init__(
        self,
        reactor: Any,
        period: float,
        tick: Callable[[], bytes],
        welcome: Callable[[], bytes],
        limit: int = 200,
    ) -> None:
        self.reactor = reactor
        self.period = period
        self.limit = limit
        self.streams: set[Stream] = set()
        self.opened = 0
        self.refused = 0
        self._skipped_closed = 0
        self._tick = tick
        self._welcome = welcome
        self._loop: task.LoopingCall | None = None

    def open(self, request: Any) -> bool:
        """Answer ``request`` with a stream; False (503 set) when too many are open."""
        if len(self.streams) >= self.limit:
            self.refused += 1
            request.setResponseCode(503)
            request.setHeader(b"retry-after", b"10")
            return False
        stream = Stream(request, self._closed)
        self.streams.add(stream)
        self.opened += 1
        stream.send(self._welcome())
        if self._loop is None:
            self._loop = task.LoopingCall(self._each)
            self._loop.clock = self.reactor
            self._loop.start(self.period, now=False).addErrback(
                lambda failure: log.failure("console stream tick failed", failure)
            )
        return True

    def _closed(self, stream: Stream) -> None:
        if stream in self.streams:
            self._skipped_closed += stream.skipped
        self.streams.discard(stream)
        if not self.streams:
            self._stop()

    def _stop(self) -> None:
        if self._loop is not None and self._loop.running:
            self._loop.stop()
        self._loop = None

    def _each(self) -> None:
        frame = self._tick()
        for stream in list(self.streams):
            stream.send(frame)

    @property
    def skipped(self) -> int:
        """Frames not written to consoles that were behind, since the start."""
        return self._skipped_closed + sum(stream.skipped for stream in self.streams)

    def close_all(self) -> None:
        """Close every open stream and stop ticking."""
        for stream in list(self.streams):
            stream.close()
        self._stop()
