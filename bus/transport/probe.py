"""What listens at a TCP port, for a command-line tool's explanation of a silence: nothing, a
ZeroMQ peer (and whether it speaks CURVE), or something else.

Judged from the ZMTP greeting (RFC 23/37) over a plain TCP connection, without libzmq.
"""

from __future__ import annotations

from typing import Any, Literal

from twisted.internet import defer, error, protocol
from twisted.python.failure import Failure

Listener = Literal["nothing", "unreachable", "zeromq", "curve", "other", "silent", "unknown"]

#: A ZMTP 3.0 greeting naming CURVE: a ZMTP 3 server of that mechanism answers with the rest
#: of its own (64 bytes); one of another mechanism closes the connection on the mismatch
#: (libzmq never sends its greeting's rest then), which leaves it "zeromq".
_ZMTP3_GREETING = (
    b"\xff" + b"\x00" * 8 + b"\x7f" + b"\x03\x00" + b"CURVE".ljust(20, b"\x00") + b"\x00" * 32
)


class _Greeting(protocol.Protocol):
    """The first bytes a server sends: a ZeroMQ peer (ZMTP 2 and 3) opens with 0xFF, eight
    bytes and 0x7F, without waiting for the client; given ours, a CURVE server then sends the
    rest of its greeting (64 bytes in all), naming its mechanism. (The server counts the
    probe as a handshake that failed.)"""

    def __init__(self) -> None:
        self.received = b""
        self.heard: defer.Deferred[bytes] = defer.Deferred()
        self._greeted = False

    def dataReceived(self, data: bytes) -> None:
        self.received += data
        if len(self.received) < 10:
            return
        first = self.received
        if not self._greeted and first[0] == 0xFF and first[9] == 0x7F:
            self._greeted = True
            transport: Any = self.transport
            transport.write(_ZMTP3_GREETING)
        if not self._greeted or len(self.received) >= 64:
            self._done()

    def connectionLost(self, reason: Failure = protocol.connectionDone) -> None:
        self._done()

    def _done(self) -> None:
        if not self.heard.called:
            self.heard.callback(self.received)
            if self.transport is not None:
                self.transport.abortConnection()


def probe_port(reactor: Any, host: str, port: int, seconds: float) -> defer.Deferred[Listener]:
    """What listens at ``host:port``, judged by a plain TCP connection within ``seconds``."""
    from twisted.internet.endpoints import HostnameEndpoint, connectProtocol

    target = HostnameEndpoint(reactor, host, port, timeout=seconds)
    outcome: defer.Deferred[Listener] = defer.Deferred()

    def connected(greeting: _Greeting) -> None:
        timer = reactor.callLater(seconds, greeting._done)
        greeting.heard.addCallback(judged, timer)

    def judged(first: bytes, timer: Any) -> None:
        if timer.active():
            timer.cancel()
        if len(first) >= 10 and first[0] == 0xFF and first[9] == 0x7F:
            curve = len(first) >= 32 and first[12:32].rstrip(b"\x00") == b"CURVE"
            outcome.callback("curve" if curve else "zeromq")
        else:
            outcome.callback("other" if first else "silent")

    def refused(failure: Failure) -> None:
        outcome.callback(
            "nothing" if failure.check(error.ConnectionRefusedError) else "unreachable"
        )

    connectProtocol(target, _Greeting()).addCallbacks(connected, refused)
    return outcome
