"""A live tail of an Event BUS subtree for the console, bounded at every step.

The tail watches the bus of this process as it broadcasts (``LocalBus.watch``: no socket,
no queue, nothing old), and only while a tail is open. Tails of one subtree form a group:
an event is encoded once for all of them, at most ``rate`` events a second go to each
console, and once every console of the group has had its share the next events only add
to one count, told to each console as ``skipped`` when the second ends. Under a fire-hose
bus an open tail costs a prefix test per event and group, and nothing when none is open.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from twisted.internet import task

from bus.eventbus import codec
from bus.web.console.stream import Stream, sse

#: The Event BUS of this process (a ``bus.application.activity.LocalBus``), or None when none runs.
Source = Callable[[], Any]

#: The most characters of an event's value sent to the browser.
VALUE_CHARS = 2000


def shown(event: codec.Event) -> dict[str, Any]:
    """An event as the console shows it: its value as JSON text, cut to VALUE_CHARS."""
    try:
        text = json.dumps(event.value(), default=repr, ensure_ascii=False)
    except Exception:  # any payload a publisher sent: not msgpack, or not JSON-able
        text = f"<{len(event.data)} bytes, not msgpack>"
    if len(text) > VALUE_CHARS:
        text = text[:VALUE_CHARS] + f"... ({len(event.data)} bytes)"
    return {
        "sequence": event.sequence,
        "topic": event.topic.decode("utf-8", "replace"),
        "producer": event.producer.decode("utf-8", "replace"),
        "timestamp": event.timestamp.decode("ascii", "replace"),
        "value": text,
    }


class Tail:
    """One console's tail: what it may still be sent this second, and what it missed."""

    def __init__(self, stream: Stream, rate: int) -> None:
        self.stream = stream
        self.allowance = rate
        self.sent = 0
        self.skipped = 0  # since the last "skipped" event


class Group:
    """The tails of one subtree."""

    def __init__(self, prefix: bytes, rate: int) -> None:
        self.prefix = prefix
        self.rate = rate
        self.tails: list[Tail] = []
        #: Tails with allowance left this second.
        self.open = 0
        #: Events none of them could be sent this second.
        self.skipped = 0

    def offer(self, frame: bytes) -> None:
        """Send an encoded event to each tail with allowance left this second; the others count it
        as skipped."""
        for tail in self.tails:
            if tail.allowance > 0 and tail.stream.send(frame):
                tail.allowance -= 1
                tail.sent += 1
                if tail.allowance == 0:
                    self.open -= 1
            else:
                tail.skipped += 1

    def refill(self) -> None:
        """A new second: tell each tail what it skipped, and give it its allowance again."""
        for tail in self.tails:
            tail.skipped += self.skipped
            if tail.skipped and tail.stream.send(sse("skipped", {"events": tail.skipped})):
                tail.skipped = 0
            tail.allowance = self.rate
        self.skipped = 0
        self.open = len(self.tails)


class TailHub:
    """Every open tail, and the one watch of the bus they share."""

    def __init__(self, reactor: Any, source: Source, rate: int = 20, limit: int = 100) -> None:
        self.reactor = reactor
        self.source = source
        self.rate = rate
        self.limit = limit
        self.groups: dict[bytes, Group] = {}
        self.watched = 0
        self.refused = 0
        self._unwatch: Callable[[], None] | None = None
        self._loop: task.LoopingCall | None = None

    @property
    def tails(self) -> list[Tail]:
        """Every open tail, over every subtree."""
        return [tail for group in self.groups.values() for tail in group.tails]

    @property
    def watching(self) -> bool:
        """The hub watches the bus (a tail is open)."""
        return self._unwatch is not None

    def open(self, request: Any, prefix: bytes) -> str | None:
        """Answer ``request`` with a tail of ``prefix``; else why not (the status is set)."""
        bus = self.source()
        if bus is None:
            request.setResponseCode(404)
            return "no Event BUS runs in this process"
        if len(self.tails) >= self.limit:
            self.refused += 1
            request.setResponseCode(503)
            return f"{self.limit} tails are open already"
        if self._unwatch is None:
            self._unwatch = bus.watch(self._on_batch)
            self._loop = task.LoopingCall(self._refill)
            self._loop.clock = self.reactor
            self._loop.start(1.0, now=False)
        group = self.groups.get(prefix)
        if group is None:
            group = self.groups[prefix] = Group(prefix, self.rate)
        tail = Tail(Stream(request, lambda stream: self._closed(group, tail)), self.rate)
        tail.stream.send(sse("tail", {"topic": prefix.decode("utf-8", "replace")}))
        group.tails.append(tail)
        group.open += 1
        return None

    def _on_batch(self, first: int, fields: list[codec.EventFields]) -> None:
        self.watched += len(fields)
        for group in self.groups.values():
            prefix = group.prefix
            if not group.open:  # every console had its share: count, nothing more
                if prefix == b"/":
                    group.skipped += len(fields)
                else:
                    group.skipped += sum(1 for event in fields if event[0].startswith(prefix))
                continue
            for index, event in enumerate(fields):
                if not event[0].startswith(prefix):
                    continue
                if not group.open:
                    group.skipped += 1
                    continue
                # Encoded once for every console of the group.
                group.offer(sse("event", shown(codec.Event(event[0], first + index, *event[1:]))))

    def _refill(self) -> None:
        for group in self.groups.values():
            group.refill()

    def _closed(self, group: Group, tail: Tail) -> None:
        if tail not in group.tails:
            return
        group.tails.remove(tail)
        group.open = sum(1 for t in group.tails if t.allowance > 0)
        if not group.tails:
            del self.groups[group.prefix]
        if not self.groups:
            self.close()

    def close(self) -> None:
        """Close every tail and stop watching (the last tail closed, or the server stops)."""
        groups, self.groups = self.groups, {}
        for group in groups.values():
            tails, group.tails = group.tails, []
            for tail in tails:
                tail.stream.close()
        if self._loop is not None and self._loop.running:
            self._loop.stop()
        self._loop = None
        unwatch, self._unwatch = self._unwatch, None
        if unwatch is not None:
            unwatch()

    def status(self) -> dict[str, Any]:
        """Tails open, subtrees, events watched and sent, tails refused: for ``/status``."""
        tails = self.tails
        return {
            "tails": len(tails),
            "subtrees": len(self.groups),
            "watched": self.watched,
            "sent": sum(t.sent for t in tails),
            "refused": self.refused,
        }
