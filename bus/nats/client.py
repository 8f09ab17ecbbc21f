"""A NATS client on the reactor: :mod:`bus.nats`'s sans-I/O wire under a Twisted
protocol, with no thread and no asyncio loop.

:class:`NatsClient` keeps one connection to the first of its servers that admits it and,
when that connection is lost, connects again (the next server first), subscribing again
to what it was subscribed to. What cannot wait for a connection fails at once
(:class:`NotConnected`): the caller decides whether to retry, as a store that refuses
would. A server that stops answering PINGs is left after two intervals, so a half-open
TCP connection (a host cut off by a partition) costs seconds, not minutes.

The eMQP broker's JetStream store and the Event BUS's stream management use it; see
docs/cluster.md.
"""

from __future__ import annotations

import base64
import heapq
import itertools
import json
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from twisted.internet import defer
from twisted.internet.base import DelayedCall
from twisted.internet.protocol import ClientFactory, Protocol, connectionDone
from twisted.logger import Logger
from twisted.python.failure import Failure

from bus.nats import codec, handshake, jsapi
from bus.nats.codec import Control, Msg, ProtocolError
from bus.nats.handshake import ConnectError, Server
from bus.nats.settings import NatsSettings
from bus.util.extras import MissingExtra, require_tls

log = Logger(namespace="bus.nats")

#: Back-off between connection attempts: from the first, doubling up to the last.
RETRY_FIRST = 0.1
RETRY_LAST = 2.0
#: How often requests past their timeout are failed (their timeouts are this coarse).
SWEEP_INTERVAL = 0.1


class NotConnected(Exception):
    """No connection to any server now; the client is trying to make one."""


class NoResponders(Exception):
    """A request to a subject nobody listens to (the server's 503)."""


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


class _Wire(Protocol):
    """One connection: the handshake, then messages to the client."""

    def __init__(self, client: NatsClient, address: Server) -> None:
        self.client = client
        self.address = address
        self.parser = codec.Parser()
        self.ready = False
        self.info: dict[str, Any] = {}
        self.unanswered_pings = 0

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
        for item in items:
            if type(item) is Msg:
                self.client._deliver(item)
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
        elif op == b"INFO":
            first = not self.info
            self.info = codec.info(item)
            if first:
                self._hello()
        elif op == b"-ERR":
            text = item.argument.decode("utf-8", "replace")
            if not self.ready or "violation" in text.lower():
                self.client._refused(self, text)
            else:
                log.warn("NATS server {server} says: {text}", server=self.address.url, text=text)

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
                self.address, self.info, client.name, tls, client.creds
            )
        except (ConnectError, OSError) as error:
            client._refused(self, str(error))
            return
        self.out(codec.connect(options) + codec.PING)

    def ping(self) -> None:
        if self.unanswered_pings >= 2:
            log.warn(
                "NATS server {server} did not answer two PINGs: leaving it",
                server=self.address.url,
            )
            self.drop(abort=True)
            return
        self.unanswered_pings += 1
        self.out(codec.PING)

    def connectionLost(self, reason: Failure = connectionDone) -> None:
        self.client._lost(self, reason)


class _Factory(ClientFactory):
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
        creds: Path | None = None,
        tls: NatsTLS | None = None,
        ping_interval: float = 2.0,
        connect_timeout: float = 5.0,
    ) -> None:
        self.reactor = reactor
        self.addresses = [handshake.server(url) for url in servers]
        if not self.addresses:
            raise ConnectError("no NATS server given")
        self.name = name
        self.creds = creds
        self.tls = tls
        self.ping_interval = ping_interval
        self.connect_timeout = connect_timeout
        self._wire: _Wire | None = None
        self._next = 0
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
        #: Called with True when connected, False when the connection is lost.
        self.listeners: list[Callable[[bool], None]] = []
        self.connects = 0
        self.disconnects = 0
        self.server: str | None = None

    # -- life --------------------------------------------------------------------------------

    @property
    def connected(self) -> bool:
        """A connection is open and its handshake done."""
        return self._wire is not None and self._wire.ready

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
        for call in (self._attempt, self._pinger, self._sweeper):
            if call is not None and call.active():
                call.cancel()
        self._attempt = self._pinger = self._sweeper = None
        wire, self._wire = self._wire, None
        if wire is not None:
            wire.drop(abort=True)
        self._fail_waiting(NotConnected("the NATS client stopped"))

    # -- what callers use ----------------------------------------------------------------------

    def publish(
        self, subject: bytes, payload: bytes, headers: bytes = b"", reply: bytes = b""
    ) -> None:
        """Send now, or raise :class:`NotConnected`. ``headers``: a whole header block."""
        self._write(
            codec.hpub(subject, headers, payload, reply)
            if headers
            else codec.pub(subject, payload, reply)
        )

    def publish_raw(self, data: bytes) -> None:
        """Commands already framed (:mod:`bus.nats.codec`), in one write."""
        self._write(data)

    def publish_many(self, messages: list[tuple[bytes, bytes]]) -> None:
        """Several messages (subject, payload) in one write."""
        self._write(b"".join(codec.pub(subject, payload) for subject, payload in messages))

    def subscribe(
        self, subject: str, callback: Callable[[Msg], None], queue: str = ""
    ) -> Subscription:
        """Kept across reconnections: sent again to each new connection."""
        subscription = Subscription(subject, callback, queue, next(self._sids))
        self._subscriptions[subscription.sid] = subscription
        if self.connected:
            self._write(codec.sub(subject, subscription.sid, queue))
        return subscription

    def unsubscribe(self, subscription: Subscription) -> None:
        """End ``subscription``, here and (when connected) at the server."""
        if self._subscriptions.pop(subscription.sid, None) is not None and self.connected:
            self._write(codec.unsub(subscription.sid))

    def request(
        self, subject: bytes, payload: bytes, headers: bytes = b"", timeout: float = 5.0
    ) -> defer.Deferred[Msg]:
        """The one answer, or a failure: :class:`NotConnected`, :class:`NoResponders`,
        ``TimeoutError``."""
        inbox = f"{self._inbox}.{next(self._replies)}".encode()
        answer: defer.Deferred[Msg] = defer.Deferred()
        try:
            self.publish(subject, payload, headers, inbox)
        except NotConnected as error:
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
        address = self.addresses[self._next % len(self.addresses)]
        self._next += 1
        self.reactor.connectTCP(
            address.host, address.port, _Factory(self, address), self.connect_timeout
        )

    def _again(self) -> None:
        if not self._running or self._attempt is not None:
            return
        # Every server once in a row, then wait: a cluster being restarted gets time.
        delay = 0.0 if self._next % len(self.addresses) else self._retry
        if delay:
            self._retry = min(self._retry * 2, RETRY_LAST)
        self._attempt = self.reactor.callLater(delay, self._connect)

    def _failed(self, address: Server, reason: str) -> None:
        self._reasons[address.url] = reason
        self._again()

    def _refused(self, wire: _Wire, reason: str) -> None:
        self._reasons[wire.address.url] = reason
        log.warn(
            "NATS server {server} refused us: {reason}", server=wire.address.url, reason=reason
        )
        wire.drop()

    def _connected(self, wire: _Wire) -> None:
        if not self._running:
            wire.drop(abort=True)
            return
        self._wire = wire
        self._retry = RETRY_FIRST
        self._reasons.clear()
        self.connects += 1
        self.server = wire.address.url
        self._inbox_sid = next(self._sids)
        lines = [codec.sub(self._inbox + ".>", self._inbox_sid)]
        lines.extend(codec.sub(s.subject, s.sid, s.queue) for s in self._subscriptions.values())
        wire.out(b"".join(lines))
        self._schedule_ping()
        log.info("connected to NATS server {server}", server=wire.address.url)
        # Those listening now hear of it; one a waiter adds as it wakes has not missed it.
        listeners = list(self.listeners)
        first, self._first = self._first, []
        for waiting in first:
            waiting.callback(None)
        for listener in listeners:
            listener(True)

    def _schedule_ping(self) -> None:
        self._pinger = self.reactor.callLater(self.ping_interval, self._ping)

    def _ping(self) -> None:
        self._pinger = None
        if self._wire is not None:
            self._wire.ping()
            self._schedule_ping()

    def _lost(self, wire: _Wire, reason: Failure) -> None:
        if wire is not self._wire:
            if not wire.ready:
                self._reasons.setdefault(wire.address.url, reason.getErrorMessage())
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
                server=wire.address.url,
                reason=reason.getErrorMessage(),
            )
            for listener in list(self.listeners):
                listener(False)
            self._again()

    def _fail_waiting(self, error: Exception) -> None:
        waiting, self._waiting = self._waiting, {}
        self._deadlines.clear()
        for answer, _, _ in waiting.values():
            answer.errback(error)

    def _deliver(self, msg: Msg) -> None:
        if msg.sid == self._inbox_sid:
            waiting = self._waiting.pop(msg.subject, None)
            if waiting is None:
                return  # answered after its timeout
            answer = waiting[0]
            if codec.status(msg.headers) == 503:
                answer.errback(NoResponders(f"no responders for {msg.subject.decode()}"))
            else:
                answer.callback(msg)
            return
        subscription = self._subscriptions.get(msg.sid)
        if subscription is not None:
            try:
                subscription.callback(msg)
            except Exception:
                log.failure("a NATS subscriber of {subject} failed", subject=subscription.subject)


def client_for(reactor: Any, settings: NatsSettings, name: str) -> NatsClient:
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
        creds=settings.creds,
        tls=tls,
        ping_interval=settings.ping_interval,
        connect_timeout=settings.connect_timeout,
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
    cannot answer yet (a new cluster with no meta leader, replicas not all up); a
    refusal (400: the config, subjects another stream holds) is raised at once, and
    ``TimeoutError`` says why when the time is up."""
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
            if error.code == 400:
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
