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


# -- whether a CURVE server takes a key --------------------------------------------------------

#: What a CURVE server did with a client's key: took it (the handshake succeeded), refused
#: it (its ZAP handler answered 400: not on its allow-list, or a policy such as a role), or
#: neither within the time (nothing listens, not CURVE, a wrong server key, a busy server).
KeyVerdict = Literal["accepted", "refused", "no-handshake"]


def probe_key(
    reactor: Any, endpoint: str, curve: Any, seconds: float, socket_type: int | None = None
) -> defer.Deferred[KeyVerdict]:
    """Whether the CURVE server at ``endpoint`` takes the key of ``curve`` (a
    :class:`bus.transport.curve.ClientCurve`), judged by a handshake of a fresh socket of
    ``socket_type`` (DEALER when None) through a socket monitor: libzmq reports the
    server's refusal (ZMTP's ERROR after ZAP said no) as a failed authentication. Fires
    within ``seconds``; never fails. (The server counts the probe like any client.)"""
    import zmq

    from bus.transport.zmqsocket import SocketFactory, SocketOptions

    verdict: defer.Deferred[KeyVerdict] = defer.Deferred()
    factory = SocketFactory(reactor, curve=curve)

    def judged(outcome: KeyVerdict) -> None:
        if verdict.called:
            return
        if timer.active():
            timer.cancel()
        # After this event's handling: the monitor that reported it is closed with it.
        reactor.callLater(0, factory.shutdown)
        verdict.callback(outcome)

    def on_event(event: int) -> None:
        if event & zmq.EVENT_HANDSHAKE_SUCCEEDED:
            judged("accepted")
        elif event & zmq.EVENT_HANDSHAKE_FAILED_AUTH:
            judged("refused")

    timer = reactor.callLater(seconds, judged, "no-handshake")
    try:
        sock = factory.socket(
            zmq.DEALER if socket_type is None else socket_type,
            options=SocketOptions(linger_ms=0),
            name="key-probe",
        )
        sock.watch_connections(on_event=on_event)
        sock.connect(endpoint)
    except zmq.ZMQError:
        judged("no-handshake")
    return verdict


def refused_key(endpoint: str, curve: Any, role: str | None = None) -> str:
    """The sentence for a key the server at ``endpoint`` refused (``curve``: the
    :class:`bus.transport.curve.ClientCurve` it was offered): which key, and where the
    server's allow-list is (its ``--client-certs`` directory). ``role``: the role the port
    wants, when the server gives keys roles (eMQP)."""
    public = curve.keys.public.decode("ascii")
    if curve.origin == "fresh":
        whose = "a fresh key (no --cert was given)"
        remedy = "give --cert with a key whose public certificate is in that directory"
    elif curve.origin:
        whose = f"the key of --cert {curve.origin} ({public})"
        remedy = "add its public certificate (NAME.key, made by bus-keys) there"
    else:
        whose = f"this key ({public})"
        remedy = "add its public certificate (NAME.key, made by bus-keys) there"
    where = "it is not on the server's allow-list (the directory of its --client-certs)"
    if role is not None:
        where += f", or its certificate there gives it roles without {role}"
        remedy += f", with role = {role} or no role"
    return f"the server at {endpoint} refused {whose}: {where}; {remedy} (docs/security.md)"


def tcp_address(endpoint: str) -> tuple[str, int] | None:
    """``(host, port)`` of a ``tcp://HOST:PORT`` endpoint; None for another transport or a
    port that is not a number."""
    scheme, _, address = endpoint.partition("://")
    host, _, port = address.rpartition(":")
    host = host.rpartition(";")[2].strip("[]")
    if scheme != "tcp" or not host or not port.isdigit():
        return None
    return host, int(port)
