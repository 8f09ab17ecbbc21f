"""A TCP proxy in front of a nats-server, on the test's reactor, that loses what a client
publishes, or everything (:attr:`NatsProxy.cut`), when the test says so: the faults a cluster produces without a word (a consumer
leader elected anew forgets the pulls it held; a request reaches no leader), made on demand.

Only the client's side is read, as NATS's client protocol: control lines, and ``PUB`` /
``HPUB`` with their payloads. Everything else passes as it came.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from twisted.internet import protocol, reactor


def _frames(buffer: bytearray) -> list[tuple[bytes, bytes]]:
    """Whole client commands taken from ``buffer``: (subject or b"", raw bytes)."""
    out = []
    while True:
        end = buffer.find(b"\r\n")
        if end < 0:
            return out
        line = bytes(buffer[:end])
        verb = line.split(b" ", 1)[0].upper()
        size = end + 2
        subject = b""
        if verb in (b"PUB", b"HPUB"):
            parts = line.split()
            subject = parts[1]
            size += int(parts[-1]) + 2
            if len(buffer) < size:
                return out
        out.append((subject, bytes(buffer[:size])))
        del buffer[:size]


class _Server(protocol.Protocol):
    def __init__(self, client: _Client) -> None:
        self.client = client

    def connectionMade(self) -> None:
        self.client.server = self
        if self.client.pending:
            self.transport.write(b"".join(self.client.pending))
            self.client.pending.clear()

    def dataReceived(self, data: bytes) -> None:
        if not self.client.proxy.cut:
            self.client.transport.write(data)

    def connectionLost(self, reason: Any = None) -> None:
        self.client.transport.loseConnection()


class _Client(protocol.Protocol):
    def __init__(self, proxy: NatsProxy) -> None:
        self.proxy = proxy
        self.buffer = bytearray()
        self.server: _Server | None = None
        self.pending: list[bytes] = []

    def connectionMade(self) -> None:
        self.proxy.connections.append(self)
        factory = protocol.ClientFactory()
        factory.protocol = lambda: _Server(self)  # type: ignore[assignment]
        reactor.connectTCP("127.0.0.1", self.proxy.target_port, factory)  # type: ignore[attr-defined]

    def dataReceived(self, data: bytes) -> None:
        if self.proxy.cut:
            return  # a partition: nothing passes, nothing is said
        self.buffer += data
        for subject, raw in _frames(self.buffer):
            if subject and self.proxy.drop(subject):
                self.proxy.dropped.append(subject)
                continue
            if self.server is None:
                self.pending.append(raw)
            else:
                self.server.transport.write(raw)

    def connectionLost(self, reason: Any = None) -> None:
        if self.server is not None:
            self.server.transport.loseConnection()


class NatsProxy:
    """Listens on 127.0.0.1 (``url``) and forwards to ``target_port``; a message published
    to a subject for which ``drop`` answers True is lost (and listed in ``dropped``)."""

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.drop: Callable[[bytes], bool] = lambda _: False
        #: While True, nothing passes either way and no connection is closed (a host's
        #: link cut: each side finds out by its own timeouts).
        self.cut = False
        self.dropped: list[bytes] = []
        self.connections: list[_Client] = []
        factory = protocol.ServerFactory()
        factory.protocol = lambda: _Client(self)  # type: ignore[assignment]
        self.port = reactor.listenTCP(0, factory, interface="127.0.0.1")  # type: ignore[attr-defined]

    @property
    def url(self) -> str:
        return f"nats://127.0.0.1:{self.port.getHost().port}"

    def close(self) -> Any:
        for connection in self.connections:
            connection.transport.loseConnection()
        return self.port.stopListening()
