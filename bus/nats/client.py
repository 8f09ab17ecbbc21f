"""A NATS client on the reactor: :mod:`bus.nats`'s sans-I/O wire under a Twisted
protocol, with no thread and no asyncio loop.

:class:`NatsClient` keeps one connection to the first of its servers that admits it and,
when that connection is lost, connects again (the next server first), subscribing again
to what it was subscribed to. What cannot wait for a connection fails at once
(:class:`NotConnected`): the caller decides whether to retry, as a store that refuses
would. A server that stops answering PINGs is left after two intervals, so a half-open
TCP connection (a host cut off by a partition) costs seconds, not minutes.

What nats-py's users rely on is here too: the servers the cluster names in its INFO
(``connect_urls``) join the rotation (:class:`bus.nats.rotation.Rotation`); a server
that says it is in lame-duck mode (``ldm``) is left for another before it closes, the
subscriptions moved with it; a message larger than the server's ``max_payload`` is refused
here (:class:`MessageTooLarge`) instead of costing the connection; ``echo=False`` is
nats-py's ``no_echo``; and each subscription has pending limits: a callback slower than
its messages gets them a budget per reactor turn, the rest waiting up to its limits and
dropped (counted) beyond, so that it never holds up the others or the PINGs.

The eMQP broker's JetStream store and the Event BUS's stream management use it; see
docs/cluster.md.
"""

from __future__ import annotations

import base64
import heapq
import itertools
import json
import os
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from twisted.internet import defer
from twisted.internet.base import DelayedCall
from twisted.internet.protocol import ClientFactory, Protocol, connectionDone
from twisted.logger import Logger
from twisted.python.failure import Failure

from bus.errors import StartupError
from bus.nats import codec, handshake, jsapi
from bus.nats.blocking import DEFAULT_PENDING, Limits
from bus.nats.codec import Control, Msg, ProtocolError
from bus.nats.credentials import Credentials
from bus.nats.handshake import ConnectError, Server
from bus.nats.rotation import Rotation
from bus.nats.settings import NatsSettings
from bus.util.extras import MissingExtra, require_tls

log = Logger(namespace="bus.nats")

#: Back-off between connection attempts: from the first, doubling up to the last.
RETRY_FIRST = 0.1
RETRY_LAST = 2.0
#: How often requests past their timeout are failed (their timeouts are this coarse).
SWEEP_INTERVAL = 0.1
#: Messages handed to subscriptions' callbacks in one reactor turn, at most: the rest wait
#: (within each subscription's pending limits) for the next turns.
DELIVERY_BUDGET = 1000
#: Seconds a connection left for lame-duck mode stays open for the answers on their way.
LEAVING_GRACE = 1.0


class NotConnected(Exception):
    """No connection to any server now; the client is trying to make one."""


class NoResponders(Exception):
    """A request to a subject nobody listens to (the server's 503)."""


class MessageTooLarge(ValueError):
    """A message (headers and payload) larger than the server's ``max_payload``: sent, it
    would cost the connection (nats-py's ``MaxPayloadError``)."""


@dataclass(frozen=True, slots=True)
class NatsTLS:
    """TLS to the servers: the CA that signed them and this client's certificate."""

    ca: Path | None = None
    cert: Path | None = None
    key: Path | None = None

    def options(self, hostname: str) -> Any:
        """Twisted's client TLS options for the server at ``hostname``; :class:`ConnectError` when
        the ``cluster`` extra's TLS is not installed."""
        # The options that ask for TLS had it checked at start (bus.nats.options); a server
        # that requires TLS unasked finds out here.
        try:
            require_tls("TLS to the NATS servers")
        except MissingExtra as error:
            raise ConnectError(str(error)) from None
        from twisted.internet import ssl

        trust = ssl.Certificate.loadPEM(self.ca.read_bytes()) if self.ca is not None else None
        client = None
        if self.cert is not None:
            pem = self.cert.read_bytes()
            if self.key is not None:
                pem += b"\n" + self.key.read_bytes()
            client = ssl.PrivateCertificate.loadPEM(pem)
        return ssl.optionsForClientTLS(hostname, trustRoot=trust, clientCertificate=client)


@dataclass(slots=True)
class Subscription:
    """A subscription of :meth:`NatsClient.subscribe`: what to pass to
    :meth:`NatsClient.unsubscribe`."""

    subject: str
    callback: Callable[[Msg], None]
    queue: str
    sid: int
    #: How much may wait for the callback (nats-py's pending limits).
    limits: Limits = DEFAULT_PENDING
    #: Messages waiting for the callback (past a turn's budget), and their bytes.
    waiting: deque[Msg] = field(default_factory=deque)
    waiting_bytes: int = 0
    #: Messages dropped because the pending limits were reached (a slow consumer).
    dropped: int = 0


class _Wire(Protocol):
    """One connection: the handshake, then messages to the client."""

    def __init__(self, client: NatsClient, address: Server) -> None:
        self.client = client
        self.address = address
        self.parser = codec.Parser()
        self.ready = False
        self.info: dict[str, Any] = {}
        self.unanswered_pings = 0
        #: One entry per PING sent since the handshake's, in order: the flush waiting for
        #: its PONG, or None for a keep-alive (a server answers PINGs in order).
        self.flushes: deque[defer.Deferred[None] | None] = deque()
        #: Where its messages go; once it is left for lame-duck mode, only answers.
        self.deliver: Callable[[Msg], None] = client._deliver

    def connectionMade(self) -> None:
        transport: Any = self.transport
        if hasattr(transport, "setTcpNoDelay"):
            transport.setTcpNoDelay(True)

    def out(self, data: bytes) -> None:
        transport: Any = self.transport
        transport.write(data)

    def drop(self, abort: bool = False) -> None:
        transport: Any = self.transport
        if transport is not None:
            (transport.abortConnection if abort else transport.loseConnection)()

    def dataReceived(self, data: bytes) -> None:
        try:
            items = self.parser.feed(data)
        except (ProtocolError, ValueError) as error:
            self.client._refused(self, f"not the NATS protocol: {error}")
            return
        deliver = self.deliver
        for item in items:
            if type(item) is Msg:
                deliver(item)
            else:
                assert isinstance(item, Control)
                self._control(item)

    def _control(self, item: Control) -> None:
        op = item.op
        if op == b"PING":
            self.out(codec.PONG)
        elif op == b"PONG":
            self.unanswered_pings = 0
            if not self.ready:
                self.ready = True
                self.client._connected(self)
            elif self.flushes:
                flushed = self.flushes.popleft()
                if flushed is not None:
                    flushed.callback(None)
        elif op == b"INFO":
            first = not self.info
            self.info = codec.info(item)
            if first:
                self._hello()
            elif self.ready:
                self.client._info(self)
        elif op == b"-ERR":
            text = item.argument.decode("utf-8", "replace")
            if not self.ready or "violation" in text.lower():
                self.client._refused(self, text)
            else:
                log.warn("NATS server {server} says: {text}", server=self.address.shown, text=text)

    def _hello(self) -> None:
        client = self.client
        tls = handshake.wants_tls(self.address, self.info, client.tls is not None)
        try:
            if tls:
                # The options first: without pyOpenSSL the transport has no startTLS at all.
                context = (client.tls or NatsTLS()).options(self.address.host)
                transport: Any = self.transport
                transport.startTLS(context)
            options = handshake.connect_options(
                self.address, self.info, client.name, tls, client.credentials, client.echo
            )
        except (ConnectError, OSError) as error:
            client._refused(self, str(error))
            return
        self.out(codec.connect(options) + codec.PING)

    def ping(self) -> None:
        if self.unanswered_pings >= 2:
            log.warn(
                "NATS server {server} did not answer two PINGs: leaving it",
                server=self.address.shown,
            )
            self.drop(abort=True)
            return
        self.unanswered_pings += 1
        self.flushes.append(None)
        self.out(codec.PING)

    def flush(self) -> defer.Deferred[None]:
        """A PING whose PONG says the server read everything written before it."""
        flushed: defer.Deferred[None] = defer.Deferred()
        self.flushes.append(flushed)
        self.out(codec.PING)
        return flushed

    @property
    def max_payload(self) -> int:
        return int(self.info.get("max_payload") or handshake.DEFAULT_MAX_PAYLOAD)

    def connectionLost(self, reason: Failure = connectionDone) -> None:
        flushes, self.flushes = self.flushes, deque()
        for flushed in flushes:
            if flushed is not None:
                flushed.errback(NotConnected("the connection to the NATS server was lost"))
        self.client._lost(self, reason)


class _Factory(ClientFactory):
    noisy = False  # a line per attempt says nothing the client's own lines do not

    def __init__(self, client: NatsClient, address: Server) -> None:
        self.client = client
        self.address = address

    def buildProtocol(self, addr: Any) -> _Wire:
        return _Wire(self.client, self.address)

    def clientConnectionFailed(self, connector: Any, reason: Failure) -> None:
        self.client._failed(self.address, reason.getErrorMessage())


class NatsClient:
    """One live connection to one of ``servers``, made again whenever it is lost."""

    def __init__(
        self,
        reactor: Any,
        servers: Sequence[str],
        *,
        name: str = "bus",
        credentials: Credentials | None = None,
        tls: NatsTLS | None = None,
        ping_interval: float = 2.0,
        connect_timeout: float = 5.0,
        echo: bool = True,
        discover: bool = True,
    ) -> None:
        self.reactor = reactor
        #: The servers given, then those the cluster named; where the next attempt starts.
        self.rotation = Rotation(servers, discover)
        self.name = name
        self.credentials = credentials
        self.tls = tls
        self.ping_interval = ping_interval
        self.connect_timeout = connect_timeout
        #: False: nats-py's ``no_echo`` (the server keeps our own messages from our
        #: subscriptions).
        self.echo = echo
        self._wire: _Wire | None = None
        #: Leaving a server in lame-duck mode: the server being connected to and those to
        #: try after it; then the connection left, kept open a moment for the answers
        #: already on their way.
        self._moving_to: Server | None = None
        self._move_candidates: list[str] = []
        self._leaving: _Wire | None = None
        self._failures_in_row = 0
        self._retry = RETRY_FIRST
        self._attempt: DelayedCall | None = None
        self._pinger: DelayedCall | None = None
        self._running = False
        self._sids = itertools.count(1)
        self._subscriptions: dict[int, Subscription] = {}
        self._inbox = "_INBOX." + base64.urlsafe_b64encode(os.urandom(12)).decode()
        self._inbox_sid = 0
        self._replies = itertools.count(1)
        #: Requests waiting for their answer: inbox -> (answer, subject, timeout).
        self._waiting: dict[bytes, tuple[defer.Deferred[Msg], bytes, float]] = {}
        self._deadlines: list[tuple[float, bytes]] = []
        self._sweeper: DelayedCall | None = None
        self._first: list[defer.Deferred[None]] = []
        self._reasons: dict[str, str] = {}
        #: Messages handed to callbacks since the last turn began, and the subscriptions
        #: whose messages wait for a later turn (in the order they began waiting).
        self._budget_used = 0
        self._budget_reset: DelayedCall | None = None
        self._backlogged: deque[Subscription] = deque()
        self._drainer: DelayedCall | None = None
        #: Called with True when connected (also after a move off a server in lame-duck
        #: mode: a new connection), False when the connection is lost.
        self.listeners: list[Callable[[bool], None]] = []
        self.connects = 0
        self.disconnects = 0
        #: Connections left for another because their server went into lame-duck mode.
        self.lame_duck_moves = 0
        #: Messages dropped over subscriptions' pending limits, all subscriptions together.
        self.slow_consumer_drops = 0
        self.server: str | None = None

    # -- life --------------------------------------------------------------------------------

    @property
    def connected(self) -> bool:
        """A connection is open and its handshake done."""
        return self._wire is not None and self._wire.ready

    @property
    def servers(self) -> list[str]:
        """The servers given, then those discovered."""
        return self.rotation.servers

    @property
    def max_payload(self) -> int:
        """The most bytes (headers and payload) one message may hold on the connection now
        (the server's INFO; nats-server's default when not connected)."""
        wire = self._wire
        return wire.max_payload if wire is not None else handshake.DEFAULT_MAX_PAYLOAD

    @property
    def server_url(self) -> str | None:
        """The URL of the server connected to (None when none; credentials and all: print
        it through :func:`bus.nats.credentials.shown`)."""
        return self._wire.address.url if self._wire is not None and self._wire.ready else None

    @property
    def info(self) -> dict[str, Any]:
        """The latest INFO of the server connected to (empty when none)."""
        return dict(self._wire.info) if self._wire is not None else {}

    def start(self) -> None:
        """Connect, and keep connecting when the connection is lost, until :meth:`stop`."""
        if self._running:
            return
        self._running = True
        self._connect()

    def when_connected(self, timeout: float | None = None) -> defer.Deferred[None]:
        """Fires once connected; with ``timeout``, fails with :class:`ConnectError`
        naming each server's reason when no server admitted us by then."""
        if self.connected:
            return defer.succeed(None)
        waiting: defer.Deferred[None] = defer.Deferred()
        self._first.append(waiting)
        if timeout is not None:

            def give_up() -> None:
                if waiting in self._first:
                    self._first.remove(waiting)
                    reasons = "; ".join(f"{u}: {r}" for u, r in self._reasons.items())
                    waiting.errback(ConnectError(reasons or "no NATS server answered"))

            call = self.reactor.callLater(timeout, give_up)
            waiting.addBoth(lambda result: (call.cancel() if call.active() else None, result)[1])
        return waiting

    def stop(self) -> None:
        """Close the connection and stop reconnecting; whatever waits fails with
        :class:`NotConnected`."""
        self._running = False
        calls = (self._attempt, self._pinger, self._sweeper, self._drainer, self._budget_reset)
        for call in calls:
            if call is not None and call.active():
                call.cancel()
        self._attempt = self._pinger = self._sweeper = self._drainer = None
        self._budget_reset = None
        for wire in (self._wire, self._leaving):
            if wire is not None:
                wire.drop(abort=True)
        self._wire = self._leaving = self._moving_to = None
        self._fail_waiting(NotConnected("the NATS client stopped"))

    # -- what callers use ----------------------------------------------------------------------

    def publish(
        self, subject: bytes, payload: bytes, headers: bytes = b"", reply: bytes = b""
    ) -> None:
        """Send now, or raise :class:`NotConnected` (or :class:`MessageTooLarge`).
        ``headers``: a whole header block."""
        wire = self._wire
        if wire is not None and len(payload) + len(headers) > wire.max_payload:
            raise MessageTooLarge(
                f"a message of {len(payload) + len(headers)} bytes to "
                f"{subject[:80].decode('utf-8', 'replace')}: the NATS server takes at most "
                f"{wire.max_payload}"
            )
        self._write(
            codec.hpub(subject, headers, payload, reply)
            if headers
            else codec.pub(subject, payload, reply)
        )

    def flush(self) -> defer.Deferred[None]:
        """Fires once the server has read everything this client wrote before the call (a
        PING's PONG: a server reads a connection's commands in order, so what was published
        before it reached the server, and from there its subscribers' connections); fails
        with :class:`NotConnected` when there is no connection, or it is lost first."""
        wire = self._wire
        if wire is None or not wire.ready:
            return defer.fail(NotConnected("not connected to a NATS server"))
        return wire.flush()

    def publish_raw(self, data: bytes) -> None:
        """Commands already framed (:mod:`bus.nats.codec`), in one write: the caller
        keeps each message within :attr:`max_payload`."""
        self._write(data)

    def publish_many(self, messages: list[tuple[bytes, bytes]]) -> None:
        """Several messages (subject, payload) in one write."""
        limit = self.max_payload
        for subject, payload in messages:
            if len(payload) > limit:
                raise MessageTooLarge(
                    f"a message of {len(payload)} bytes to "
                    f"{subject[:80].decode('utf-8', 'replace')}: the NATS server takes at "
                    f"most {limit}"
                )
        self._write(b"".join(codec.pub(subject, payload) for subject, payload in messages))

    def subscribe(
        self,
        subject: str,
        callback: Callable[[Msg], None],
        queue: str = "",
        pending: Limits = DEFAULT_PENDING,
    ) -> Subscription:
        """Kept across reconnections: sent again to each new connection. ``pending``: how
        much may wait for ``callback`` when it is slower than its messages (beyond, they
        are dropped and counted: :attr:`Subscription.dropped`)."""
        subscription = Subscription(subject, callback, queue, next(self._sids), pending)
        self._subscriptions[subscription.sid] = subscription
        if self.connected:
            self._write(codec.sub(subject, subscription.sid, queue))
        return subscription

    def unsubscribe(self, subscription: Subscription) -> None:
        """End ``subscription``, here and (when connected) at the server."""
        if self._subscriptions.pop(subscription.sid, None) is not None and self.connected:
            self._write(codec.unsub(subscription.sid))
        subscription.waiting.clear()

    def request(
        self, subject: bytes, payload: bytes, headers: bytes = b"", timeout: float = 5.0
    ) -> defer.Deferred[Msg]:
        """The one answer, or a failure: :class:`NotConnected`, :class:`NoResponders`,
        :class:`MessageTooLarge`, ``TimeoutError``."""
        inbox = f"{self._inbox}.{next(self._replies)}".encode()
        answer: defer.Deferred[Msg] = defer.Deferred()
        try:
            self.publish(subject, payload, headers, inbox)
        except (NotConnected, MessageTooLarge) as error:
            return defer.fail(error)

        # One timer for every request (a DelayedCall each costs more than the request).
        deadline = self.reactor.seconds() + timeout
        self._waiting[inbox] = (answer, subject, timeout)
        heapq.heappush(self._deadlines, (deadline, inbox))
        if self._sweeper is None or not self._sweeper.active():
            self._sweeper = self.reactor.callLater(SWEEP_INTERVAL, self._sweep)
        return answer

    def _sweep(self) -> None:
        """Fail the requests whose time is up; again while some wait."""
        self._sweeper = None
        now = self.reactor.seconds()
        deadlines = self._deadlines
        while deadlines and deadlines[0][0] <= now:
            _, inbox = heapq.heappop(deadlines)
            waiting = self._waiting.pop(inbox, None)
            if waiting is not None:
                answer, subject, timeout = waiting
                answer.errback(
                    TimeoutError(
                        f"no answer to {subject.decode('utf-8', 'replace')} in {timeout:g}s"
                    )
                )
        if not self._waiting:
            deadlines.clear()  # answered ones' entries
        elif self._sweeper is None:
            self._sweeper = self.reactor.callLater(SWEEP_INTERVAL, self._sweep)

    def jetstream(
        self, subject: str, body: dict[str, Any] | None = None, timeout: float = 5.0
    ) -> defer.Deferred[dict[str, Any]]:
        """A JetStream API request's answer, or :class:`bus.nats.jsapi.JetStreamError`."""
        payload = json.dumps(body).encode() if body is not None else b""
        return self.request(subject.encode(), payload, timeout=timeout).addCallback(
            lambda msg: jsapi.answer(msg.payload)
        )

    # -- the connection ------------------------------------------------------------------------

    def _write(self, data: bytes) -> None:
        wire = self._wire
        if wire is None or not wire.ready:
            raise NotConnected("not connected to a NATS server")
        wire.out(data)

    def _connect(self) -> None:
        self._attempt = None
        if not self._running:
            return
        self._dial(handshake.server(self.rotation.take()))

    def _dial(self, address: Server) -> None:
        self.reactor.connectTCP(
            address.host, address.port, _Factory(self, address), self.connect_timeout
        )

    def _again(self) -> None:
        if not self._running or self._attempt is not None:
            return
        # Every server once in a row, then wait: a cluster being restarted gets time.
        self._failures_in_row += 1
        delay = 0.0
        if self._failures_in_row >= len(self.rotation.servers):
            self._failures_in_row = 0
            delay = self._retry
            self._retry = min(self._retry * 2, RETRY_LAST)
        self._attempt = self.reactor.callLater(delay, self._connect)

    def _failed(self, address: Server, reason: str) -> None:
        self._reasons[address.shown] = reason
        if not self._move_failed(address):
            self._again()

    def _refused(self, wire: _Wire, reason: str) -> None:
        self._reasons[wire.address.shown] = reason
        log.warn(
            "NATS server {server} refused us: {reason}", server=wire.address.shown, reason=reason
        )
        wire.drop()

    def _connected(self, wire: _Wire) -> None:
        if not self._running:
            wire.drop(abort=True)
            return
        left = None
        if wire.address is self._moving_to:
            self._moving_to, self._move_candidates = None, []
            left = self._leave(self._wire)
        self._wire = wire
        self._retry = RETRY_FIRST
        self._failures_in_row = 0
        self._reasons.clear()
        self.connects += 1
        self._learn(wire, reached=True)
        self._subscribe_all(wire)
        if self._pinger is None or not self._pinger.active():
            self._schedule_ping()
        if left is not None:
            self.lame_duck_moves += 1
            log.info(
                "moved to NATS server {server}, off {left} (lame-duck mode)",
                server=wire.address.shown,
                left=left.address.shown,
            )
        else:
            log.info("connected to NATS server {server}", server=wire.address.shown)
        # Those listening now hear of it; one a waiter adds as it wakes has not missed it.
        listeners = list(self.listeners)
        first, self._first = self._first, []
        for waiting in first:
            waiting.callback(None)
        for listener in listeners:
            listener(True)
        if wire.info.get("ldm"):
            self._lame_duck(wire)

    def _subscribe_all(self, wire: _Wire) -> None:
        self.server = wire.address.shown
        self._inbox_sid = next(self._sids)
        lines = [codec.sub(self._inbox + ".>", self._inbox_sid)]
        lines.extend(codec.sub(s.subject, s.sid, s.queue) for s in self._subscriptions.values())
        wire.out(b"".join(lines))

    def _learn(self, wire: _Wire, reached: bool = False) -> None:
        url = wire.address.url
        rotation = self.rotation
        added = rotation.reached(url, wire.info) if reached else rotation.learn(url, wire.info)
        if added:
            log.info(
                "NATS servers learnt from the cluster: {servers}",
                servers=", ".join(handshake.server(u).shown for u in added),
            )

    def _info(self, wire: _Wire) -> None:
        """A new INFO from a connected server: the cluster's servers, lame-duck mode."""
        self._learn(wire)
        if wire is self._wire and wire.info.get("ldm"):
            self._lame_duck(wire)

    # -- lame-duck mode ------------------------------------------------------------------------

    def _lame_duck(self, wire: _Wire) -> None:
        """The server is draining: connect to another before it closes this connection;
        once that one is ready (:meth:`_connected`), the subscriptions move to it."""
        if self._moving_to is not None or not self._running:
            return
        others = self.rotation.elsewhere(wire.address.url)
        if not others:
            log.warn(
                "NATS server {server} is in lame-duck mode and no other is known: staying "
                "until it closes",
                server=wire.address.shown,
            )
            return
        log.info(
            "NATS server {server} is in lame-duck mode: moving to another",
            server=wire.address.shown,
        )
        self._move_candidates = others
        self._move_next()

    def _move_next(self) -> None:
        if not self._move_candidates:
            self._moving_to = None  # none answered: stay until the server closes
            if self._wire is None:
                self._again()  # it closed meanwhile: connect as after any loss
            return
        self._moving_to = handshake.server(self._move_candidates.pop(0))
        self._dial(self._moving_to)

    def _move_failed(self, address: Server) -> bool:
        """Whether a connection attempt that failed was a move's (the next is tried)."""
        if address is not self._moving_to:
            return False
        self._move_next()
        return True

    def _leave(self, old: _Wire | None) -> _Wire | None:
        """The connection left for lame-duck mode: its subscriptions end there first (so
        that no message comes twice) before they are made on the new one; it stays open a
        moment for the answers on their way, then closes."""
        if old is None or not old.ready:
            return None
        old.out(b"".join(codec.unsub(sid) for sid in self._subscriptions))
        # Messages it still brings for the subscriptions may come on the new one too:
        # a moment's gap rather than a message twice.
        old.deliver = self._deliver_answer
        self._leaving = old
        self.reactor.callLater(LEAVING_GRACE, self._left, old)
        return old

    def _left(self, wire: _Wire) -> None:
        if self._leaving is wire:
            self._leaving = None
        wire.drop()

    # -- pings, losses -------------------------------------------------------------------------

    def _schedule_ping(self) -> None:
        self._pinger = self.reactor.callLater(self.ping_interval, self._ping)

    def _ping(self) -> None:
        self._pinger = None
        if self._wire is not None:
            self._wire.ping()
            self._schedule_ping()

    def _lost(self, wire: _Wire, reason: Failure) -> None:
        if wire is self._leaving:
            self._leaving = None
            return
        if wire is not self._wire:
            if not wire.ready:
                self._reasons.setdefault(wire.address.shown, reason.getErrorMessage())
                if not self._move_failed(wire.address):
                    self._again()
            return
        self._wire = None
        self.server = None
        self.disconnects += 1
        if self._pinger is not None and self._pinger.active():
            self._pinger.cancel()
        self._pinger = None
        self._fail_waiting(NotConnected("the connection to the NATS server was lost"))
        if self._running:
            log.warn(
                "lost NATS server {server}: {reason}",
                server=wire.address.shown,
                reason=reason.getErrorMessage(),
            )
            for listener in list(self.listeners):
                listener(False)
            if self._moving_to is None:
                self._again()

    def _fail_waiting(self, error: Exception) -> None:
        waiting, self._waiting = self._waiting, {}
        self._deadlines.clear()
        for answer, _, _ in waiting.values():
            answer.errback(error)

    # -- delivery ------------------------------------------------------------------------------

    def _deliver_answer(self, msg: Msg) -> None:
        """An answer to a request (one that came on a connection since left included)."""
        waiting = self._waiting.pop(msg.subject, None)
        if waiting is None:
            return  # answered after its timeout (or twice, over a move)
        answer = waiting[0]
        if codec.status(msg.headers) == 503:
            answer.errback(NoResponders(f"no responders for {msg.subject.decode()}"))
        else:
            answer.callback(msg)

    def _deliver(self, msg: Msg) -> None:
        if msg.sid == self._inbox_sid:
            self._deliver_answer(msg)
            return
        subscription = self._subscriptions.get(msg.sid)
        if subscription is None:
            return
        if subscription.waiting or self._budget_used >= DELIVERY_BUDGET:
            self._hold(subscription, msg)
            return
        self._spend()
        self._call(subscription, msg)

    def _spend(self) -> None:
        """One delivery of this turn's budget; the budget is whole again next turn."""
        self._budget_used += 1
        if self._budget_reset is None:
            self._budget_reset = self.reactor.callLater(0, self._new_turn)

    def _new_turn(self) -> None:
        self._budget_reset = None
        self._budget_used = 0

    def _call(self, subscription: Subscription, msg: Msg) -> None:
        try:
            subscription.callback(msg)
        except Exception:
            log.failure("a NATS subscriber of {subject} failed", subject=subscription.subject)

    def _hold(self, subscription: Subscription, msg: Msg) -> None:
        """Past the turn's budget: the message waits, within the subscription's limits."""
        size = len(msg.payload) + len(msg.headers)
        limits = subscription.limits
        if (
            len(subscription.waiting) >= limits.messages
            or subscription.waiting_bytes + size > limits.bytes
        ):
            subscription.dropped += 1
            self.slow_consumer_drops += 1
            if subscription.dropped & (subscription.dropped - 1) == 0:  # 1, 2, 4, 8, ...
                log.warn(
                    "NATS subscriber of {subject} is slower than its messages: {dropped} "
                    "dropped over its pending limits ({messages} messages, {bytes} bytes)",
                    subject=subscription.subject,
                    dropped=subscription.dropped,
                    messages=limits.messages,
                    bytes=limits.bytes,
                )
            return
        if not subscription.waiting:
            self._backlogged.append(subscription)
        subscription.waiting.append(msg)
        subscription.waiting_bytes += size
        if self._drainer is None:
            self._drainer = self.reactor.callLater(0, self._drain)

    def _drain(self) -> None:
        """A turn's budget of waiting messages, a subscription's share at a time in turn."""
        self._drainer = None
        backlogged = self._backlogged
        while backlogged and self._budget_used < DELIVERY_BUDGET:
            subscription = backlogged.popleft()
            if self._subscriptions.get(subscription.sid) is not subscription:
                subscription.waiting.clear()
                subscription.waiting_bytes = 0
                continue
            share = max(1, (DELIVERY_BUDGET - self._budget_used) // (len(backlogged) + 1))
            waiting = subscription.waiting
            while waiting and share:
                msg = waiting.popleft()
                subscription.waiting_bytes -= len(msg.payload) + len(msg.headers)
                share -= 1
                self._spend()
                self._call(subscription, msg)
            if waiting:
                backlogged.append(subscription)
        if backlogged:
            self._drainer = self.reactor.callLater(0, self._drain)


def connect_at_start(client: NatsClient, timeout: float) -> defer.Deferred[None]:
    """Start ``client`` and fire once it is connected: an unreachable cluster at a service's
    start is a start-up error naming each server's reason (``--nats``), not an endless
    wait; the client is stopped then."""
    client.start()

    def failed(failure: Failure) -> None:
        client.stop()
        if isinstance(failure.value, ConnectError):
            raise StartupError("nats", f"cannot reach the NATS servers: {failure.value}")
        failure.raiseException()

    return client.when_connected(timeout=timeout).addErrback(failed)


def client_for(reactor: Any, settings: NatsSettings, name: str, echo: bool = True) -> NatsClient:
    """The client a service's JetStream store settings ask for (servers, credentials,
    TLS, pings)."""
    tls = (
        NatsTLS(settings.tls_ca, settings.tls_cert, settings.tls_key)
        if settings.tls_ca or settings.tls_cert
        else None
    )
    return NatsClient(
        reactor,
        settings.servers,
        name=name,
        credentials=settings.credentials,
        tls=tls,
        ping_interval=settings.ping_interval,
        connect_timeout=settings.connect_timeout,
        echo=echo,
    )


async def stream_made(client: NatsClient, config: dict[str, Any]) -> tuple[dict[str, Any], bool]:
    """The stream ``config`` names, made as it says when missing: its info, and whether
    it was made now. JetStream's errors (:class:`bus.nats.jsapi.JetStreamError`) and
    the client's go to the caller."""
    name = config["name"]
    try:
        return await client.jetstream(jsapi.stream_info(name)), False
    except jsapi.JetStreamError as error:
        if error.err_code != jsapi.STREAM_NOT_FOUND:
            raise
    return await client.jetstream(f"{jsapi.API}.STREAM.CREATE.{name}", config), True


async def stream_ready(
    client: NatsClient, config: dict[str, Any], within: float
) -> tuple[dict[str, Any], bool]:
    """:func:`stream_made`, asked again for up to ``within`` seconds while JetStream
    cannot answer yet (a new cluster with no meta leader, replicas not all up: errors
    that :attr:`bus.nats.jsapi.JetStreamError.passes`); a refusal (the config, subjects
    another stream holds) is raised at once, and ``TimeoutError`` says why when the time
    is up."""
    reactor = client.reactor
    deadline = reactor.seconds() + within
    while True:
        try:
            info, made = await stream_made(client, config)
            if made:
                log.info(
                    "JetStream: made stream {stream} ({replicas} replicas, subjects {subjects})",
                    stream=config["name"],
                    replicas=config.get("num_replicas", 1),
                    subjects=", ".join(config.get("subjects", [])),
                )
            return info, made
        except jsapi.JetStreamError as error:
            if not error.passes:
                raise
            failure: Exception = error
        except (TimeoutError, NoResponders, NotConnected) as error:
            failure = error
        if reactor.seconds() > deadline:
            raise TimeoutError(f"JetStream did not answer for {config['name']}: {failure}")
        await pause(reactor, 0.25)


def pause(reactor: Any, seconds: float) -> defer.Deferred[None]:
    """A Deferred that fires after ``seconds`` on ``reactor``."""
    from twisted.internet.task import deferLater

    return deferLater(reactor, seconds, lambda: None)
