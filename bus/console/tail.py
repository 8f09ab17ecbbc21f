"""A live tail of an Event BUS subtree for the console, bounded at every step.

One SUB socket on the bus's PUB port serves every open tail (subscribed to the union of
their subtrees, each prefix counted), and exists only while a tail is open. It reads at
most ``read_budget`` events every ``pause`` seconds: a fire-hose subtree is sampled, the
rest dropped by ZeroMQ at its receive high-water mark, never queued here. Each tail sends
its browser at most ``rate`` events a second and then says how many it skipped.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable
from typing import Any

from twisted.internet import task
from twisted.logger import Logger

from bus.console.stream import Stream, sse
from bus.droplog import DropCounter
from bus.eventbus import codec
from bus.eventbus.client import ServerAddress

log = Logger(namespace="bus.console")

#: Where the tail reads from: the bus's ``host:port`` and the ClientCurve to connect with
#: (None: plain), or None when no Event BUS runs in this process.
Source = Callable[[], tuple[str, Any] | None]

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
    """One console's tail of the subtree ``prefix``."""

    def __init__(self, prefix: bytes, stream: Stream, rate: int) -> None:
        self.prefix = prefix
        self.stream = stream
        self.rate = rate
        self.allowance = rate
        self.sent = 0
        self.skipped = 0  # since the last "skipped" event

    def offer(self, event: codec.Event) -> None:
        if self.allowance > 0 and self.stream.send(sse("event", shown(event))):
            self.allowance -= 1
            self.sent += 1
        else:
            self.skipped += 1

    def refill(self) -> None:
        if self.skipped and self.stream.send(sse("skipped", {"events": self.skipped})):
            self.skipped = 0
        self.allowance = self.rate


class TailHub:
    """Every open tail, and the one SUB socket they share."""

    def __init__(
        self,
        reactor: Any,
        source: Source,
        rate: int = 20,
        limit: int = 100,
        read_budget: int = 200,
        pause: float = 0.05,
    ) -> None:
        self.reactor = reactor
        self.source = source
        self.rate = rate
        self.limit = limit
        self.read_budget = read_budget
        self.pause = pause
        self.tails: list[Tail] = []
        self.received = 0
        self.refused = 0
        self.drops = DropCounter(log, "event on the console's tail", reactor.seconds)
        self._prefixes: Counter[bytes] = Counter()
        self._factory: Any = None
        self._sock: Any = None
        self._resume: Any = None
        self._loop: task.LoopingCall | None = None

    def open(self, request: Any, prefix: bytes) -> str | None:
        """Answer ``request`` with a tail of ``prefix``; else why not (the status is set)."""
        source = self.source()
        if source is None:
            request.setResponseCode(404)
            return "no Event BUS runs in this process"
        if len(self.tails) >= self.limit:
            self.refused += 1
            request.setResponseCode(503)
            return f"{self.limit} tails are open already"
        if self._sock is None:
            self._connect(*source)
        tail = Tail(prefix, Stream(request, lambda stream: self._closed(tail)), self.rate)
        tail.stream.send(sse("tail", {"topic": prefix.decode("utf-8", "replace")}))
        self.tails.append(tail)
        self._prefixes[prefix] += 1
        if self._prefixes[prefix] == 1:
            self._sock.subscribe(prefix)
        return None

    def _connect(self, address: str, curve: Any) -> None:
        import zmq

        from bus.transport.zmqsocket import SocketFactory, SocketOptions

        self._factory = SocketFactory(self.reactor, curve=curve)
        # A small receive queue: what the console cannot show is dropped by ZeroMQ.
        options = SocketOptions(receive_hwm=self.read_budget * 2, linger_ms=0)
        self._sock = self._factory.socket(
            zmq.SUB,
            self._on_messages,
            options,
            read_budget=self.read_budget,
            name="console-tail",
        )
        self._sock.connect(ServerAddress.parse(address).publisher)
        self._loop = task.LoopingCall(self._refill)
        self._loop.clock = self.reactor
        self._loop.start(1.0, now=False)

    def _on_messages(self, batch: list[list[bytes]]) -> None:
        self.received += len(batch)
        for frames in batch:
            try:
                message = codec.parse_published(frames)
            except codec.EventBusError as error:
                self.drops.drop(error.reason, str(error))
                continue
            if isinstance(message, codec.Heartbeat):
                continue
            for tail in self.tails:
                if message.topic.startswith(tail.prefix):
                    tail.offer(message)
        # Sample, never chase: the next read waits a little.
        sock = self._sock
        if sock is not None and self._resume is None:
            sock.pause_reading()
            self._resume = self.reactor.callLater(self.pause, self._read_again)

    def _read_again(self) -> None:
        self._resume = None
        if self._sock is not None:
            self._sock.resume_reading()

    def _refill(self) -> None:
        for tail in self.tails:
            tail.refill()

    def _closed(self, tail: Tail) -> None:
        if tail not in self.tails:
            return
        self.tails.remove(tail)
        self._prefixes[tail.prefix] -= 1
        if self._prefixes[tail.prefix] == 0:
            del self._prefixes[tail.prefix]
            if self._sock is not None:
                self._sock.unsubscribe(tail.prefix)
        if not self.tails:
            self.close()

    def close(self) -> None:
        """Close every tail and the socket (the last tail closed, or the server stops)."""
        tails, self.tails = self.tails, []
        self._prefixes.clear()
        for tail in tails:
            tail.stream.close()
        if self._resume is not None and self._resume.active():
            self._resume.cancel()
        self._resume = None
        if self._loop is not None and self._loop.running:
            self._loop.stop()
        self._loop = None
        sock, self._sock = self._sock, None
        factory, self._factory = self._factory, None
        if sock is not None:
            sock.shutdown()
        if factory is not None:
            factory.shutdown()

    def status(self) -> dict[str, Any]:
        return {
            "tails": len(self.tails),
            "received": self.received,
            "sent": sum(t.sent for t in self.tails),
            "refused": self.refused,
            "dropped": dict(self.drops.counts),
        }
