"""The HTTP port's channel: only what the port serves gets past the request's headers, and
a peer that sends slowly or nothing at all cannot keep the operator out.

The port serves GET and HEAD (the console, its API, ``/status``, ``/metrics``), none of
which has a body, and POST to a site that admits it (an operator's actions, whose small
body is read only once their headers passed every check: see :mod:`bus.web.actions`).
twisted.web reads a request's whole body before any resource sees it, and spools one over 100 kB to a temporary file: a stranger without the bearer token could
make the process hold gigabytes on disk before the guard ever ran. Here a request with
another method is answered 405 and one announcing a body 413 as soon as its headers are
in, before a byte of the body is read, and the connection is closed. Headers are bounded
(count and total size).

Bounds (:class:`ConnectionBounds`), against a slow flood (slowloris) as much as a fast one:

- A request's headers must be complete within :data:`HEADER_DEADLINE` seconds of its
  first byte (408 and closed otherwise): a header line now and then does not extend it.
  A connection with no request in progress is closed after :data:`IDLE_TIMEOUT` seconds.
- A connection is *waiting* from its accept until its request's headers are complete, and
  again while it idles between keep-alive requests; it is *serving* while a request is in
  progress (the console's event stream is one).
- Every connection is read from its accept. At most :data:`MAX_WAITING` connections wait
  in all and :data:`MAX_WAITING_PER_ADDRESS` from one address: beyond, the oldest waiting
  one (of that address, for its bound) is closed as soon as it has had :data:`GRACE`
  seconds to send its request. A slow flood thus holds only places that the next honest
  connection takes, and a burst of honest requests is read, each one in its grace.
- At most :data:`MAX_CONNECTIONS` are open: one more takes the place of the oldest waiting
  connection past its grace, or is closed at once when there is none (a flood of more
  than 512 new connections in :data:`GRACE` seconds, or every place serving).
- A request in progress does not count against its address: a reverse proxy or a
  Prometheus with many jobs sends many from one address. Requests without the bearer
  token (on a port that wants one) count against their client, at most
  :data:`MAX_REQUESTS_PER_CLIENT` in progress (503 beyond); behind a trusted proxy
  (:class:`TrustedProxies`) the client is the one the proxy names, and the proxy's own
  connections are not bounded by address.
"""

from __future__ import annotations

import ipaddress
import json
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
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
#: Seconds from a request's first byte to the end of its headers (a browser sends them in
#: one packet; 10 s leaves room for a link that loses a few).
HEADER_DEADLINE = 10.0
#: Seconds a waiting connection keeps its place whatever comes: an honest client's request
#: arrives well within them, one round trip after the connection.
GRACE = 2.0
#: Most connections open at once (the console's event streams are at most 200 of them).
MAX_CONNECTIONS = 1024
#: Most waiting connections (no request in progress) in all, and from one address.
MAX_WAITING = 512
MAX_WAITING_PER_ADDRESS = 64
#: Most requests without the bearer token in progress from one client.
MAX_REQUESTS_PER_CLIENT = 64


@dataclass(frozen=True)
class Limits:
    """The bounds (the module's constants by default; tests make them small)."""

    connections: int = MAX_CONNECTIONS
    waiting: int = MAX_WAITING
    waiting_per_address: int = MAX_WAITING_PER_ADDRESS
    requests_per_client: int = MAX_REQUESTS_PER_CLIENT
    grace: float = GRACE
    header_deadline: float = HEADER_DEADLINE


class RefusalCounts(RefusalCounter):
    """Requests refused at their headers and connections the bounds closed, by reason,
    logged at most every 10 s."""

    def __init__(self, clock: Any) -> None:
        super().__init__(
            log,
            "refused {count} HTTP request(s) or connection(s) ({reason}); latest from {client}",
            clock,
        )


# -- the client behind a reverse proxy ----------------------------------------------------------

#: The headers a proxy may name its client in, as ``--http-forwarded-header`` spells them.
FORWARDED_HEADERS = ("x-forwarded-for", "forwarded")


def _address(text: str) -> str:
    """An address as a hop of a forwarding header writes it, without quotes or port."""
    hop = text.strip().strip('"')
    if hop.startswith("["):  # [v6] or [v6]:port
        hop = hop[1:].partition("]")[0]
    elif hop.count(":") == 1:  # v4:port
        hop = hop.partition(":")[0]
    try:
        return str(ipaddress.ip_address(hop))
    except ValueError:
        return hop  # "unknown", an obfuscated name: kept as the proxy wrote it


def forwarded_hops(header: str, values: Iterable[bytes]) -> list[str]:
    """The addresses a forwarding header names, the client first and the latest proxy's
    peer last (every ``X-Forwarded-For`` or ``Forwarded`` line of the request, in order)."""
    hops: list[str] = []
    for value in values:
        for element in value.decode("latin-1").split(","):
            if header == "forwarded":
                pairs = (pair.partition("=") for pair in element.split(";"))
                element = next((v for k, _, v in pairs if k.strip().lower() == "for"), "")
            if element.strip():
                hops.append(_address(element))
    return hops


class TrustedProxies:
    """Reverse proxies (addresses or networks) whose forwarding header names the client.

    The client is the last hop, from the right, that is not a trusted proxy: what a proxy
    appends is trusted, what the client wrote before it is not. The header is the one the
    proxies set (``X-Forwarded-For`` by default; ``Forwarded``, RFC 7239, on demand): the
    other one is the client's to forge, so it is never read."""

    def __init__(self, networks: Iterable[str] = (), header: str = "x-forwarded-for") -> None:
        """``networks``: ``127.0.0.1``, ``10.0.0.0/8``, ``::1`` (ValueError for others);
        ``header``: one of :data:`FORWARDED_HEADERS`."""
        if header not in FORWARDED_HEADERS:
            raise ValueError(f"not a forwarding header: {header!r}")
        self.header = header
        self.networks = tuple(ipaddress.ip_network(n.strip(), strict=False) for n in networks)

    @classmethod
    def parse(cls, text: str | None, header: str = "x-forwarded-for") -> TrustedProxies:
        """From ``ADDR[,ADDR...]`` as the option gives it (None or empty: none)."""
        return cls([part for part in (text or "").split(",") if part.strip()], header)

    def __bool__(self) -> bool:
        return bool(self.networks)

    def trusts(self, host: str) -> bool:
        """Whether ``host`` is one of the proxies."""
        try:
            address = ipaddress.ip_address(host)
        except ValueError:
            return False
        return any(address in network for network in self.networks)

    def client(self, peer: str, headers: Any) -> str:
        """The client of a request from ``peer`` with ``headers`` (twisted.web Headers)."""
        if not self.trusts(peer):
            return peer
        hops = forwarded_hops(self.header, headers.getRawHeaders(self.header.encode(), []))
        for hop in reversed(hops):
            if not self.trusts(hop):
                return hop
        return hops[0] if hops else peer

    def describe(self) -> dict[str, Any]:
        """The proxies and their header, as ``/status`` shows them."""
        return {"networks": [str(n) for n in self.networks], "header": self.header}


# -- the bounds ----------------------------------------------------------------------------------


class ConnectionBounds:
    """Which of the port's connections gives way to others, and how many requests without
    the token each client has in progress (see the module's text)."""

    def __init__(
        self,
        refusals: RefusalCounts,
        reactor: Any,
        proxies: TrustedProxies | None = None,
        limits: Limits | None = None,
    ) -> None:
        """``reactor``: its ``seconds`` and ``callLater`` time the grace."""
        self.refusals = refusals
        self.reactor = reactor
        self.proxies = proxies or TrustedProxies()
        self.limits = limits or Limits()
        #: Waiting connections -> since when, the oldest first; and by address.
        self._waiting: dict[HeadersFirstChannel, float] = {}
        self._waiting_by: dict[str, dict[HeadersFirstChannel, float]] = {}
        self._serving: set[HeadersFirstChannel] = set()
        self._requests_by_client: Counter[str] = Counter()
        #: The next trim, when a bound is passed by connections still in their grace.
        self._trim_call: Any = None

    @property
    def open(self) -> int:
        """Connections open now, waiting and serving."""
        return len(self._waiting) + len(self._serving)

    # A connection's address for the per-address bound: None for a trusted proxy (its
    # clients are bounded by their requests instead).
    def _key(self, channel: HeadersFirstChannel) -> str | None:
        return None if self.proxies.trusts(channel.address) else channel.address

    def arrived(self, channel: HeadersFirstChannel) -> None:
        """A connection was accepted: it waits for its request, or, when every place is
        taken and no waiting connection has had its grace, it is closed at once."""
        if self.open >= self.limits.connections and not self._displace_oldest(self._waiting):
            self.refusals.refuse("connections", client=channel.address)
            channel.state = "gone"
            channel.drop()
            return
        self._wait(channel)

    def serving(self, channel: HeadersFirstChannel) -> None:
        """Its request's headers are complete: it no longer counts as waiting."""
        if channel.state == "waiting":
            self._forget(channel)
            channel.state = "serving"
            self._serving.add(channel)

    def idle(self, channel: HeadersFirstChannel) -> None:
        """Its response is complete and it stays open for another request."""
        if channel.state == "serving":
            self._forget(channel)
            self._wait(channel)

    def left(self, channel: HeadersFirstChannel) -> None:
        """It closed (or was closed)."""
        self.request_ended(channel)
        self._forget(channel)
        channel.state = "gone"

    def request_started(self, channel: HeadersFirstChannel, bearer: bool) -> bool:
        """Count a request in progress against its client unless it bears the token; False
        when that client has its most in progress already."""
        if bearer:
            return True
        client = channel.client
        if self._requests_by_client[client] >= self.limits.requests_per_client:
            return False
        self._requests_by_client[client] += 1
        channel.counted_client = client
        return True

    def request_ended(self, channel: HeadersFirstChannel) -> None:
        """The request counted by :meth:`request_started` (if it was) ended."""
        client, channel.counted_client = channel.counted_client, None
        if client is not None:
            self._requests_by_client[client] -= 1
            if self._requests_by_client[client] <= 0:
                del self._requests_by_client[client]

    def status(self) -> dict[str, Any]:
        """What ``/status`` says of the bounds."""
        return {
            "waiting": len(self._waiting),
            "serving": len(self._serving),
            "limits": {
                "connections": self.limits.connections,
                "waiting": self.limits.waiting,
                "waiting_per_address": self.limits.waiting_per_address,
                "requests_per_client": self.limits.requests_per_client,
                "header_deadline_s": self.limits.header_deadline,
                "grace_s": self.limits.grace,
            },
            "trusted_proxies": self.proxies.describe(),
        }

    def stop(self) -> None:
        """No more trims (the port closed)."""
        call, self._trim_call = self._trim_call, None
        if call is not None and call.active():
            call.cancel()

    def _wait(self, channel: HeadersFirstChannel) -> None:
        channel.state = "waiting"
        since = self.reactor.seconds()
        self._waiting[channel] = since
        key = self._key(channel)
        if key is not None:
            self._waiting_by.setdefault(key, {})[channel] = since
        self._trim()

    def _forget(self, channel: HeadersFirstChannel) -> None:
        self._serving.discard(channel)
        if self._waiting.pop(channel, None) is not None:
            key = self._key(channel)
            if key is not None:
                of_address = self._waiting_by.get(key, {})
                of_address.pop(channel, None)
                if not of_address:
                    self._waiting_by.pop(key, None)

    def _displace_oldest(self, pool: dict[HeadersFirstChannel, float]) -> bool:
        """Close the oldest connection of ``pool`` if it has had its grace."""
        for victim, since in pool.items():  # the oldest first
            if self.reactor.seconds() - since < self.limits.grace:
                return False
            self._forget(victim)
            victim.state = "gone"
            self.refusals.refuse("displaced", client=victim.address)
            victim.drop()
            return True
        return False

    def _trim(self) -> None:
        """Close the oldest waiting connections past their grace while a waiting bound is
        passed; when the rest are still in their grace, come back once the oldest's ends."""
        self.stop()
        per_address = self.limits.waiting_per_address
        for pool in [p for p in self._waiting_by.values() if len(p) > per_address]:
            while len(pool) > per_address and self._displace_oldest(pool):
                pass
        while len(self._waiting) > self.limits.waiting and self._displace_oldest(self._waiting):
            pass
        over = [p for p in self._waiting_by.values() if len(p) > per_address]
        if len(self._waiting) > self.limits.waiting:
            over.append(self._waiting)
        if over and self._trim_call is None:
            oldest = min(next(iter(pool.values())) for pool in over)
            wait = max(0.0, oldest + self.limits.grace - self.reactor.seconds())
            self._trim_call = self.reactor.callLater(wait, self._trim)


# -- the channel ---------------------------------------------------------------------------------


class HeadersFirstChannel(http.HTTPChannel):
    """An HTTP/1.1 channel that refuses, at the end of the headers, a request the port
    does not serve, and keeps its site's :class:`ConnectionBounds` (see the module's text)
    where it has some, its refusals counted in their :class:`RefusalCounts`."""

    maxHeaders = MAX_HEADERS
    totalHeadersSize = MAX_HEADER_BYTES
    #: ``waiting``, ``serving`` or ``gone`` (see :class:`ConnectionBounds`).
    state = "new"
    #: The peer's address, and the client's (the one a trusted proxy names, else the peer).
    address = "?"
    client = "?"
    #: The client a request in progress without the token is counted against.
    counted_client: str | None = None
    _deadline: Any = None

    def connectionMade(self) -> None:
        super().connectionMade()  # type: ignore[no-untyped-call]
        transport: Any = self.transport
        self.address = self.client = str(getattr(transport.getPeer(), "host", "?"))
        bounds = _bounds_of(self)
        if bounds is not None:
            bounds.arrived(self)

    def connectionLost(self, reason: Any = None) -> None:
        self._cancel_deadline()
        bounds = _bounds_of(self)
        if bounds is not None:
            bounds.left(self)
        super().connectionLost(reason)  # type: ignore[no-untyped-call]

    # -- what the bounds do to it

    def drop(self) -> None:
        """Close at once, unanswered (a place is needed now, not once a reply is out)."""
        self._cancel_deadline()
        transport: Any = self.transport
        transport.abortConnection()

    # -- the headers' deadline

    def dataReceived(self, data: bytes) -> None:
        if data and not self._handlingRequest:
            self._start_deadline()
        super().dataReceived(data)  # type: ignore[no-untyped-call]

    def _start_deadline(self) -> None:
        if self._deadline is None:
            deadline = _limits_of(self).header_deadline
            self._deadline = self.callLater(deadline, self._headers_late)  # type: ignore[no-untyped-call]

    def _cancel_deadline(self) -> None:
        deadline, self._deadline = self._deadline, None
        if deadline is not None and deadline.active():
            deadline.cancel()

    def _headers_late(self) -> None:
        self._deadline = None
        counts = _counts_of(self)
        if counts is not None:
            counts.refuse("header-deadline", client=self.client)
        self._answer_and_close(408, "header-deadline", "the request's headers came too slowly")

    def allContentReceived(self) -> None:
        """The request is complete: no deadline any more, and it is serving."""
        self._cancel_deadline()
        bounds = _bounds_of(self)
        if bounds is not None:
            bounds.serving(self)
        super().allContentReceived()  # type: ignore[no-untyped-call]

    def requestDone(self, request: Any) -> None:
        bounds = _bounds_of(self)
        if bounds is not None:
            bounds.request_ended(self)
            bounds.idle(self)  # before the next pipelined request, if any, is read
        super().requestDone(request)  # type: ignore[no-untyped-call]
        # Part of a pipelined request came with the last one: its deadline runs already.
        if not self._handlingRequest and (self.requests or self._buffer):
            self._start_deadline()

    def timeoutConnection(self) -> None:
        # Idle for IDLE_TIMEOUT: closed without twisted.web's log line (one per connection
        # of a flood would drown the log).
        self._abortingCall = self.callLater(self.abortTimeout, self.forceAbortClient)  # type: ignore[no-untyped-call]
        self.loseConnection()  # type: ignore[no-untyped-call]

    # -- the request's headers

    def allHeadersReceived(self) -> None:
        """Answer 413 to a request announcing a body, 405 to a method not served and 503 to a
        client with too many requests in progress without the token, before any of a body is
        read; a POST goes to the site's ``admit_body`` (an action's checks) instead of the
        first two; let the others on."""
        method = getattr(self, "_command", b"")
        request = self.requests[-1]
        bounds = _bounds_of(self)
        if bounds is not None:
            self.client = bounds.proxies.client(self.address, request.requestHeaders)
        chunked = request.requestHeaders.getRawHeaders(b"transfer-encoding")
        admit = getattr(_site(self), "admit_body", None)
        if method == b"POST" and admit is not None:
            # An action (bus.web.actions): its small body is read once its headers passed.
            path = getattr(self, "_path", b"")
            refusal = admit(request, path, self.length, bool(chunked), _bears_token(self, request))
            if refusal is not None:
                self._refuse(request, *refusal)
                return
        elif self.length or chunked:
            self._refuse(request, 413, "body", "this port takes no request body")
            return
        elif method not in METHODS:
            self._refuse(request, 405, "method", f"{method.decode('latin-1')} is not served")
            return
        if bounds is not None and not bounds.request_started(self, _bears_token(self, request)):
            self._refuse(
                request, 503, "requests-per-client", "too many requests in progress from here"
            )
            return
        super().allHeadersReceived()  # type: ignore[no-untyped-call]

    def _refuse(self, request: Any, code: int, reason: str, text: str) -> None:
        """Answer ``code`` and close, reading nothing more from this connection."""
        refusals = _counts_of(self)
        if refusals is not None:
            refusals.refuse(reason, client=self.client)
        # Nothing more is parsed: the request never reaches a resource (a length that is not
        # 0 keeps LineReceiver from finishing it), the rest of the input is dropped unread.
        request.gotLength(0)
        self.length = None
        self._answer_and_close(code, reason, text)

    def _answer_and_close(self, code: int, reason: str, text: str) -> None:
        self._cancel_deadline()
        transport: Any = self.transport
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
        if code == 401:
            head.append(b'WWW-Authenticate: Bearer realm="bus"')
        if code == 503:
            head.append(b"Retry-After: 1")
        transport.write(b"\r\n".join(head) + b"\r\n\r\n" + body)
        self.persistent = False
        self.dataReceived = self.lineReceived = self.rawDataReceived = _ignore  # type: ignore[method-assign,assignment]
        self.loseConnection()  # type: ignore[no-untyped-call]


def _ignore(*_: Any) -> None:
    pass


def _site(channel: HeadersFirstChannel) -> Any:
    return getattr(channel, "site", None)


def _bounds_of(channel: HeadersFirstChannel) -> ConnectionBounds | None:
    bounds = getattr(_site(channel), "bounds", None)
    return bounds if isinstance(bounds, ConnectionBounds) else None


def _counts_of(channel: HeadersFirstChannel) -> RefusalCounts | None:
    bounds = _bounds_of(channel)
    return bounds.refusals if bounds is not None else None


def _limits_of(channel: HeadersFirstChannel) -> Limits:
    bounds = _bounds_of(channel)
    return bounds.limits if bounds is not None else Limits()


def _bears_token(channel: HeadersFirstChannel, request: Any) -> bool:
    """Whether ``request`` bears the site's token (every request, where it wants none)."""
    bears = getattr(_site(channel), "bears_token", None)
    return True if bears is None else bool(bears(request))


def client_of(request: Any) -> str:
    """The client of a request: the one a trusted proxy names, else the peer's address."""
    channel = getattr(request, "channel", None)
    client = getattr(channel, "client", None)
    if isinstance(client, str) and client != "?":
        return client
    return str(getattr(request.getClientAddress(), "host", "?"))
