"""The HTTP port's channel: only what the port serves gets past the request's headers.

The port serves GET and HEAD (the console, its API, ``/status``, ``/metrics``), none of
which has a body. twisted.web reads a request's whole body before any resource sees it,
and spools one over 100 kB to a temporary file: a stranger without the bearer token could
make the process hold gigabytes on disk before the guard ever ran. Here a request with
another method is answered 405 and one announcing a body 413 as soon as its headers are
in, before a byte of the body is read, and the connection is closed. Headers are bounded
(count and total size) and an idle connection is closed after :data:`IDLE_TIMEOUT`
seconds; a response in progress (the console's event stream) is not idle.
"""

from __future__ import annotations

import json
from collections import Counter
from typing import Any

from twisted.logger import Logger
from twisted.web import http

from bus.util.droplog import RefusalCounter

log = Logger(namespace="bus.web.channel")

#: The methods the port serves.
METHODS = frozenset({b"GET", b"HEAD"})
#: Most header lines in one request (a browser sends about twenty).
MAX_HEADERS = 100
#: Most bytes of a request line and its headers together.
MAX_HEADER_BYTES = 16 * 1024
#: Seconds a connection may stay open without a request in progress.
IDLE_TIMEOUT = 60
#: Most connections open at once (the console's event streams are at most 200 of them),
#: and from one address; one more is closed as soon as it is accepted.
MAX_CONNECTIONS = 512
MAX_CONNECTIONS_PER_ADDRESS = 64


class RefusalCounts(RefusalCounter):
    """Requests refused at their headers, and connections beyond :data:`MAX_CONNECTIONS`
    (``connections``), by reason, logged at most every 10 s."""

    def __init__(self, clock: Any) -> None:
        super().__init__(
            log,
            "refused {count} HTTP request(s) or connection(s) ({reason}); latest from {client}",
            clock,
        )
        #: Connections open now, in all and by peer address (see :data:`MAX_CONNECTIONS`).
        self.open = 0
        self.open_by_address: Counter[str] = Counter()

    def admits(self, address: str) -> bool:
        """Whether one more connection from ``address`` may open (counted if not)."""
        if self.open >= MAX_CONNECTIONS:
            self.refuse("connections", client=address)
            return False
        if self.open_by_address[address] >= MAX_CONNECTIONS_PER_ADDRESS:
            self.refuse("connections-per-address", client=address)
            return False
        return True

    def opened(self, address: str, change: int) -> None:
        """A connection from ``address`` opened (``change`` +1) or closed (-1)."""
        self.open += change
        self.open_by_address[address] += change
        if self.open_by_address[address] <= 0:
            del self.open_by_address[address]


class HeadersFirstChannel(http.HTTPChannel):
    """An HTTP/1.1 channel that refuses, at the end of the headers, a request the port
    does not serve (see the module's text), counted in its site's ``header_refusals``
    (a :class:`RefusalCounts`) where it has one."""

    maxHeaders = MAX_HEADERS
    totalHeadersSize = MAX_HEADER_BYTES

    def connectionMade(self) -> None:
        _opened(self, +1)
        super().connectionMade()  # type: ignore[no-untyped-call]

    def connectionLost(self, reason: Any = None) -> None:
        _opened(self, -1)
        super().connectionLost(reason)  # type: ignore[no-untyped-call]

    def allHeadersReceived(self) -> None:
        """Answer 413 to a request announcing a body and 405 to a method not served, before any of a
        body is read; let the others on."""
        method = getattr(self, "_command", b"")
        request = self.requests[-1]
        chunked = request.requestHeaders.getRawHeaders(b"transfer-encoding")
        if self.length or chunked:
            self._refuse(request, 413, "body", "this port takes no request body")
            return
        if method not in METHODS:
            self._refuse(request, 405, "method", f"{method.decode('latin-1')} is not served")
            return
        super().allHeadersReceived()  # type: ignore[no-untyped-call]

    def _refuse(self, request: Any, code: int, reason: str, text: str) -> None:
        """Answer ``code`` and close, reading nothing more from this connection."""
        transport: Any = self.transport
        refusals = _counts_of(self)
        if refusals is not None:
            refusals.refuse(reason, client=_peer_host(self))
        body = json.dumps({"error": reason, "message": text}).encode() + b"\n"
        phrase = http.RESPONSES.get(code, b"Refused")
        head = [
            b"HTTP/1.1 %d %s" % (code, phrase),
            b"Content-Type: application/json",
            b"Content-Length: %d" % len(body),
            b"Connection: close",
        ]
        if code == 405:
            head.append(b"Allow: " + b", ".join(sorted(METHODS)))
        transport.write(b"\r\n".join(head) + b"\r\n\r\n" + body)
        # Nothing more is parsed: the request never reaches a resource (a length that is not
        # 0 keeps LineReceiver from finishing it), the rest of the input is dropped unread.
        request.gotLength(0)
        self.length = None
        self.persistent = False
        self.dataReceived = self.lineReceived = self.rawDataReceived = _ignore  # type: ignore[method-assign,assignment]
        self.loseConnection()  # type: ignore[no-untyped-call]


def _ignore(*_: Any) -> None:
    pass


def _counts_of(channel: HeadersFirstChannel) -> RefusalCounts | None:
    """The counts of the channel's site, where it keeps some."""
    refusals = getattr(getattr(channel, "site", None), "header_refusals", None)
    return refusals if isinstance(refusals, RefusalCounts) else None


def _peer_host(channel: HeadersFirstChannel) -> str:
    transport: Any = channel.transport
    return str(getattr(transport.getPeer(), "host", "?"))


def _opened(channel: HeadersFirstChannel, change: int) -> None:
    refusals = _counts_of(channel)
    if refusals is not None:
        refusals.opened(_peer_host(channel), change)
