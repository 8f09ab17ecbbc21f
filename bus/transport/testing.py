"""A raw ZeroMQ peer on the reactor for tests of any service that speaks ZeroMQ (like
``twisted.internet.testing``): it connects (or binds), sends whole messages and records
every message it receives. Third-party services get it from :mod:`bus.extension`;
:mod:`bus.testing` adds real Event BUS and eMQP servers on free ports."""

from __future__ import annotations

from typing import Any


class RawPeer:
    """A raw ZeroMQ socket on the reactor that records every message it receives."""

    def __init__(
        self,
        socket_type: int,
        endpoint: str,
        reactor: Any = None,
        curve: tuple[bytes, Any] | None = None,
        bind: bool = False,
        **options: Any,
    ) -> None:
        """``curve``: (the server's Z85 public key, this peer's ``CurveKeyPair``) to
        connect as a CURVE client; ``bind``: bind ``endpoint`` (a fake server) rather
        than connect to it."""
        from bus.transport.curve import make_curve_client
        from bus.transport.zmqsocket import SocketFactory, SocketOptions
        from bus.util.reactor import reactor_of

        self.factory = SocketFactory(reactor_of(reactor))
        self.messages: list[list[bytes]] = []
        # Tests send bursts without yielding to the reactor: queue them rather than fail.
        options.setdefault("send_hwm", 100_000)
        self.socket = self.factory.socket(
            socket_type, self.messages.extend, SocketOptions(linger_ms=0, **options)
        )
        if curve is not None:
            make_curve_client(self.socket, *curve)
        if bind:
            self.socket.bind(endpoint)
        else:
            self.socket.connect(endpoint)

    @classmethod
    def sub(cls, endpoint: str, prefixes: tuple[bytes, ...] = (b"",), **options: Any) -> RawPeer:
        """A SUB peer connected to ``endpoint``, subscribed to each of ``prefixes``."""
        import zmq

        peer = cls(zmq.SUB, endpoint, **options)
        for prefix in prefixes:
            peer.socket.subscribe(prefix)
        return peer

    @classmethod
    def dealer(cls, endpoint: str, **options: Any) -> RawPeer:
        """A DEALER peer connected to ``endpoint``."""
        import zmq

        return cls(zmq.DEALER, endpoint, **options)

    def send(self, frames: list[bytes]) -> None:
        """Send one multipart message (queued, never refused: tests send bursts)."""
        if not self.socket.send_frames(frames):
            raise RuntimeError("raw peer would block")

    def close(self) -> None:
        """Close the socket and its context."""
        self.factory.shutdown()
