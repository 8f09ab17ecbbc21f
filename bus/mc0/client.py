"""The mc0 connector: a Twisted client of an mc0 broker (ours or the real mc0d), or of one
of several brokers that share a topic space over NATS (docs/mc0.md, "Brokers on several
hosts").

    connector = Mc0Connector("tcp://127.0.0.1:61616", on_message, server_key=public_key)
    yield connector.start()                 # CONNECT with TTL, until the broker's OK
    yield connector.subscribe(b"mcollective.discovery")
    yield connector.put(b"mcollective.discovery", b"body", {b"X-reply-to": b"me"})

Every command carries an ID and returns a Deferred that fires on the broker's OK or fails
with :class:`Mc0CommandError` on its ERROR. The connector sends a NOOP (with an ID, so the
broker's OK shows it alive) when it has sent nothing for ``heartbeat_factor`` x TTL, and when
it has heard nothing from the broker for
``silence_factor`` x TTL (its CONNECT unanswered, or the broker gone) it starts again on a
fresh socket (a new identity, so the broker sees a new client), CONNECTs, and SUBscribes
again to every topic it holds. Commands issued while not connected wait and are sent once
connected. A lost TCP connection also starts a new session at once (the broker's ROUTER
would see the reconnected socket as a new client, without its subscriptions). A PUT or NOOP
sent on a session that ended unanswered fails with :class:`Mc0ConnectionLost` (it may or may
not have reached the broker).

Given several endpoints, each new session goes to the next one: a broker that died, went
silent or does not answer CONNECT within ``connect_timeout`` is left for the next, and the
session there SUBscribes again to every topic held.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import zmq
from twisted.internet import defer
from twisted.logger import Logger

from bus.extension import SocketFactory, SocketOptions, ZmqSocket, reactor_of
from bus.mc0 import codec
from bus.mc0.codec import Framing, Mc0Error
from bus.transport.curve import CurveKeyPair, make_curve_client
from bus.util.droplog import DropCounter
from bus.util.wakes import Wakes

log = Logger(namespace="bus.mc0.client")

#: The least time a CONNECT is waited for before the session starts again (seconds).
CONNECT_WAIT = 1.0
#: With several brokers, how long a CONNECT is waited for before the next one is tried.
FAILOVER_CONNECT_WAIT = 2.0
#: At most this many messages still in a lost session's socket are handed over before it
#: closes (what the broker sent before the connection went: deliveries and answers).
DRAIN_LIMIT = 10_000

_HANDSHAKE_FAILED = (
    zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL
    | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
    | zmq.EVENT_HANDSHAKE_FAILED_AUTH
)


class Mc0CommandError(Exception):
    """The broker answered a command with ERROR."""

    def __init__(self, message: bytes, message_id: bytes | None) -> None:
        super().__init__(message.decode("utf-8", "replace"))
        self.message = message
        self.message_id = message_id


class Mc0ConnectionLost(Exception):
    """The session a command was sent on went silent before its answer came."""


@dataclass(frozen=True, slots=True)
class Delivery:
    """A MESSAGE: the PUT's topic, its headers (TOPIC among them, ID not) and body frames."""

    topic: bytes
    headers: Mapping[bytes, bytes]
    body: tuple[bytes, ...]


@dataclass(slots=True)
class _Pending:
    kind: str
    deferred: defer.Deferred[None]
    topics: tuple[bytes, ...] = ()


class Mc0Connector:
    """A client of an mc0 broker: a session kept alive with NOOPs and opened again (with its
    subscriptions) when the broker forgets it or goes; every command a Deferred of its OK."""

    def __init__(
        self,
        endpoint: str | Sequence[str],
        on_message: Callable[[Delivery], object] | None = None,
        *,
        server_key: bytes | None = None,
        client_keys: CurveKeyPair | None = None,
        ttl: float = 30.0,
        framing: Framing = Framing.DELIMITED,
        version: bytes = codec.PROTOCOL_VERSION,
        heartbeat_factor: float = 0.5,
        silence_factor: float = 1.05,
        send_hwm: int = 10_000,
        reactor: Any = None,
        connect_timeout: float | None = None,
        on_session: Callable[[str, str], object] | None = None,
    ) -> None:
        """``endpoint``: one broker, or several brokers of one topic space (each session at
        the next). ``server_key`` (Z85 public key) makes the connection CURVE; ``client_keys``
        default to a fresh pair. Without ``server_key`` the connection is plain (NULL).
        ``connect_timeout``: how long a CONNECT waits for its OK before the next session
        (None: ``silence_factor`` x TTL, at least :data:`CONNECT_WAIT`, with one endpoint;
        :data:`FAILOVER_CONNECT_WAIT` with several). ``on_session(event, endpoint)`` hears
        of each session: ``open`` (its CONNECT acknowledged), ``subscribed`` (the topics
        held SUBscribed again there, acknowledged), ``closed`` (it ended)."""
        self.on_session = on_session
        self.endpoints = [endpoint] if isinstance(endpoint, str) else list(endpoint)
        if not self.endpoints:
            raise ValueError("an mc0 connector needs an endpoint")
        self._index = 0
        if connect_timeout is None and len(self.endpoints) > 1:
            connect_timeout = FAILOVER_CONNECT_WAIT
        self.connect_timeout = connect_timeout
        self.on_message = on_message
        self.server_key = server_key
        self.client_keys = client_keys
        if server_key is not None and client_keys is None:
            self.client_keys = CurveKeyPair.generate()
        self.ttl = ttl
        self.framing = framing
        self.version = version
        self.heartbeat_factor = heartbeat_factor
        self.silence_factor = silence_factor
        self.send_hwm = send_hwm
        self.reactor: Any = reactor_of(reactor)
        #: Topics this connector wants, re-SUBscribed on every new session.
        self.topics: set[bytes] = set()
        self.connected = False
        self.sessions = 0
        self.reconnects = 0
        #: Sessions opened at another broker than the last one's.
        self.failovers = 0
        self.handshake_failures = 0
        self.received = 0
        self.errors = DropCounter(log, "message from the broker", time.time)
        self._factory: SocketFactory | None = None
        self._socket: ZmqSocket | None = None
        self._prefix = os.urandom(4).hex().encode()
        self._counter = 0
        self._connect_id: bytes | None = None
        self._resub_id: bytes | None = None
        #: commands sent on the current session, by ID
        self._pending: dict[bytes, _Pending] = {}
        #: IDs of our own heartbeat NOOPs awaiting their OK
        self._heartbeats: set[bytes] = set()
        #: commands waiting for a session: (frames without delimiter style, id, pending)
        self._queued: list[tuple[codec.ClientCommand, _Pending]] = []
        #: SUB/UNSUB whose outcome the next session's re-SUB settles
        self._carried: list[defer.Deferred[None]] = []
        self._waiters: list[defer.Deferred[None]] = []
        self._last_sent = 0.0
        self._last_heard = 0.0
        self._timer: Any = None
        #: The wake the timer is armed for; one more than 0.1 x TTL late (this process did
        #: not run) judges no silence, and the next comes 0.1 x TTL later (bus.util.wakes).
        self._due = 0.0
        self.wakes = Wakes(ttl, self.reactor.seconds, slack=0.1 * ttl, settle=0.1 * ttl)
        self._stopped = False
        self._draining = False
        self._refused: Mc0CommandError | None = None

    @property
    def endpoint(self) -> str:
        """The broker of the current (or next) session."""
        return self.endpoints[self._index]

    # -- lifecycle ------------------------------------------------------------------------------

    def start(self) -> defer.Deferred[None]:
        """Open the first session; fires once the broker has answered CONNECT with OK."""
        if self._factory is None and not self._stopped:
            self._factory = SocketFactory(self.reactor)
            self._open_session()
        return self.when_connected()

    def when_connected(self) -> defer.Deferred[None]:
        """A Deferred that fires once a session is open (fails if the broker refused CONNECT)."""
        if self._refused is not None:
            return defer.fail(self._refused)
        if self.connected:
            return defer.succeed(None)
        waiter: defer.Deferred[None] = defer.Deferred()
        self._waiters.append(waiter)
        return waiter

    def stop(self) -> defer.Deferred[None]:
        """DISCONNECT (best effort, not waited for) and close; pending commands fail."""
        if self._stopped:
            return defer.succeed(None)
        self._stopped = True
        if self._socket is not None and self.connected:
            self._socket.send_frames(codec.encode(codec.Disconnect(None, self.framing)))
        self._end_session(Mc0ConnectionLost("connector stopped"))
        for _command, pending in self._queued:
            pending.deferred.errback(Mc0ConnectionLost("connector stopped"))
        self._queued.clear()
        for carried in self._carried:
            carried.errback(Mc0ConnectionLost("connector stopped"))
        self._carried.clear()
        waiters, self._waiters = self._waiters, []
        for waiter in waiters:
            if not waiter.called:  # a caller may have given up (cancelled, timed out)
                waiter.errback(Mc0ConnectionLost("connector stopped"))
        if self._factory is not None:
            self._factory.shutdown()
            self._factory = None
        return defer.succeed(None)

    # -- commands -------------------------------------------------------------------------------

    def subscribe(self, *topics: bytes) -> defer.Deferred[None]:
        """SUB; the topics are held (and re-SUBscribed on a new session) unless refused."""
        self.topics.update(topics)
        return self._command(
            "sub", lambda i: codec.Subscribe(tuple(topics), i, self.framing), topics
        )

    def unsubscribe(self, *topics: bytes) -> defer.Deferred[None]:
        """UNSUB ``topics``; fires on the broker's OK."""
        self.topics.difference_update(topics)
        return self._command("unsub", lambda i: codec.Unsubscribe(tuple(topics), i, self.framing))

    def put(
        self,
        topic: bytes,
        body: bytes | Sequence[bytes],
        headers: Mapping[bytes, bytes] | Iterable[tuple[bytes, bytes]] = (),
    ) -> defer.Deferred[None]:
        """PUT ``body`` (one frame or several) to ``topic`` with ``headers``; fires on the broker's
        OK."""
        frames = (body,) if isinstance(body, bytes) else tuple(body)
        pairs = tuple(headers.items()) if isinstance(headers, Mapping) else tuple(headers)
        extra = tuple(pair for pair in pairs if pair[0] not in (codec.TOPIC, codec.ID))
        return self._command(
            "put",
            lambda i: codec.Put(topic, ((codec.TOPIC, topic), *extra), frames, i, self.framing),
        )

    def noop(self) -> defer.Deferred[None]:
        """A NOOP with an ID: fires when the broker acknowledges it (a round trip)."""
        return self._command("noop", lambda i: codec.Noop(i, self.framing))

    def _next_id(self) -> bytes:
        self._counter += 1
        return b"%s-%d" % (self._prefix, self._counter)

    def _command(
        self,
        kind: str,
        make: Callable[[bytes], codec.ClientCommand],
        topics: tuple[bytes, ...] = (),
    ) -> defer.Deferred[None]:
        if self._stopped:
            return defer.fail(Mc0ConnectionLost("connector stopped"))
        if self._refused is not None:
            return defer.fail(self._refused)
        command = make(self._next_id())
        pending = _Pending(kind, defer.Deferred(), topics)
        if self.connected:
            self._send_command(command, pending)
        else:
            self._queued.append((command, pending))
        return pending.deferred

    def _send_command(self, command: codec.ClientCommand, pending: _Pending) -> None:
        assert command.id is not None
        self._pending[command.id] = pending
        self._send(codec.encode(command))

    def _send(self, frames: list[bytes]) -> None:
        sock = self._socket
        if sock is None:
            return
        if not sock.send_frames(frames):
            # The broker's queue for us is full: the session is as good as silent.
            log.warn("mc0 connector: send queue to {endpoint} full", endpoint=self.endpoint)
            return
        self._last_sent = self.reactor.seconds()

    # -- sessions -------------------------------------------------------------------------------

    def _open_session(self) -> None:
        assert self._factory is not None
        sock = self._factory.socket(
            zmq.DEALER,
            self._on_messages,
            SocketOptions(
                send_hwm=self.send_hwm,
                receive_hwm=self.send_hwm,
                linger_ms=100,
                reconnect_ms=100,
                reconnect_max_ms=1000,
            ),
            name="mc0-connector",
        )
        if self.server_key is not None:
            assert self.client_keys is not None
            make_curve_client(sock, self.server_key, self.client_keys)
        sock.watch_connections(_HANDSHAKE_FAILED, self._on_socket_event)
        sock.connect(self.endpoint)
        self._socket = sock
        self.sessions += 1
        now = self.reactor.seconds()
        self._last_heard = now
        self._connect_id = self._next_id()
        ttl_ms = max(1, round(self.ttl * 1000))
        self._send(
            codec.encode(codec.Connect(ttl_ms, self.version, self._connect_id, self.framing))
        )
        self._arm()

    def _end_session(self, reason: Exception, drain: bool = False) -> None:
        """Close the current socket; what was sent on it and not answered is lost or carried.
        With ``drain`` (the connection was lost, not closed by us), what the socket already
        received is handled first: the broker sent it before it went."""
        sock = self._socket
        if drain and sock is not None and not self._draining:
            self._draining = True
            try:
                # Handling a message may stop the connector (a refused CONNECT): that ends
                # this session, and the drain with it.
                sock.drain(DRAIN_LIMIT, go_on=lambda: self._socket is sock)
            finally:
                self._draining = False
        if self.connected:
            self._told("closed")
        self.connected = False
        if self._timer is not None and self._timer.active():
            self._timer.cancel()
        self._timer = None
        if self._socket is not None:
            self._socket.shutdown()
            self._socket = None
        pending, self._pending = self._pending, {}
        for entry in pending.values():
            if entry.kind in ("sub", "unsub", "resub"):
                if entry.kind != "resub":
                    self._carried.append(entry.deferred)
            else:
                entry.deferred.errback(reason)
        self._connect_id = self._resub_id = None
        self._heartbeats.clear()

    def _reconnect_if_current(self, sock: ZmqSocket | None) -> None:
        if sock is not None and sock is self._socket and self.connected:
            self._reconnect("connection to the broker lost", lost=True)

    def _reconnect(self, why: str, lost: bool = False) -> None:
        left = self.endpoint
        if len(self.endpoints) > 1:
            self._index = (self._index + 1) % len(self.endpoints)
            self.failovers += 1
        log.info(
            "mc0 connector: {why} ({left}); a new session at {endpoint} on a fresh socket",
            why=why,
            left=left,
            endpoint=self.endpoint,
        )
        self.reconnects += 1
        self._end_session(Mc0ConnectionLost(why), drain=lost)
        self._retry_session()

    def _retry_session(self) -> None:
        if self._stopped or self._factory is None:
            return
        try:
            self._open_session()
        except Exception:
            # A socket that cannot be made now (e.g. out of file descriptors): try later.
            log.failure(
                "mc0 connector: cannot open a session to {endpoint}", endpoint=self.endpoint
            )
            if self._socket is not None:
                self._socket.shutdown()
                self._socket = None
            self._timer = self.reactor.callLater(self.ttl, self._retry_session)

    def _told(self, event: str) -> None:
        if self.on_session is not None:
            try:
                self.on_session(event, self.endpoint)
            except Exception:
                log.failure("mc0 connector: on_session failed")

    def _on_connected(self) -> None:
        self.connected = True
        self._told("open")
        self._arm()  # from now on the session's TTL, not CONNECT's wait
        if self.topics:
            self._resub_id = self._next_id()
            resub = codec.Subscribe(tuple(sorted(self.topics)), self._resub_id, self.framing)
            self._send_command(resub, _Pending("resub", defer.Deferred()))
        else:
            self._settle_carried()
        queued, self._queued = self._queued, []
        for command, pending in queued:
            self._send_command(command, pending)
        waiters, self._waiters = self._waiters, []
        for waiter in waiters:
            waiter.callback(None)

    def _settle_carried(self, error: Exception | None = None) -> None:
        carried, self._carried = self._carried, []
        for deferred in carried:
            if error is None:
                deferred.callback(None)
            else:
                deferred.errback(error)

    # -- input ----------------------------------------------------------------------------------

    def _on_messages(self, batch: list[list[bytes]]) -> None:
        if self._socket is None:
            return
        self._last_heard = self.reactor.seconds()
        for frames in batch:
            try:
                message = codec.decode_broker(frames)
            except Mc0Error as error:
                self.errors.drop(error.reason, str(error))
                continue
            match message:
                case codec.Message(headers, body):
                    self._deliver(message.topic or b"", dict(headers), body)
                case codec.Ok(message_id):
                    self._answered(message_id, None)
                case codec.Error(text, message_id):
                    self._answered(message_id, Mc0CommandError(text, message_id))
                case codec.Noop():
                    pass
            if self._socket is None:
                return  # the session ended while handling this batch

    def _deliver(self, topic: bytes, headers: dict[bytes, bytes], body: tuple[bytes, ...]) -> None:
        self.received += 1
        if self.on_message is None:
            return
        try:
            self.on_message(Delivery(topic, headers, body))
        except Exception:
            log.failure("mc0 connector: on_message failed")

    def _answered(self, message_id: bytes | None, error: Mc0CommandError | None) -> None:
        if message_id is not None and message_id == self._connect_id:
            if error is None:
                self._on_connected()
            else:
                log.error(
                    "mc0 broker {endpoint} refused CONNECT: {error}",
                    endpoint=self.endpoint,
                    error=str(error),
                )
                self._refused = error
                waiters, self._waiters = self._waiters, []
                for waiter in waiters:
                    waiter.errback(error)
                self.stop()
            return
        if message_id in self._heartbeats:
            self._heartbeats.discard(message_id)
            return
        entry = self._pending.pop(message_id, None) if message_id is not None else None
        if entry is None:
            if error is not None:
                self.errors.drop("error-reply", str(error))
            return
        if entry.kind == "resub":
            if error is None:
                self._told("subscribed")
            self._settle_carried(error)
        elif entry.kind == "sub" and error is not None:
            self.topics.difference_update(entry.topics)  # refused: not held
            entry.deferred.errback(error)
        elif error is None:
            entry.deferred.callback(None)
        else:
            entry.deferred.errback(error)

    def _on_socket_event(self, event: int) -> None:
        if event & zmq.EVENT_DISCONNECTED and self.connected and not self._stopped:
            # The broker's ROUTER gives a reconnecting DEALER a new identity: whatever this
            # session held there (subscriptions) is gone, even if libzmq reconnects by itself.
            self.reactor.callLater(0, self._reconnect_if_current, self._socket)
            return
        if event & _HANDSHAKE_FAILED:
            self.handshake_failures += 1
            if self.handshake_failures == 1:
                log.warn(
                    "mc0 connector: handshake with {endpoint} failed (wrong server key, or "
                    "this client's key not allowed?)",
                    endpoint=self.endpoint,
                )

    # -- time -----------------------------------------------------------------------------------

    def _silence_limit(self) -> float:
        """How long silence ends the session: ``silence_factor`` x TTL, and while CONNECT
        is unanswered ``connect_timeout`` when given, else at least :data:`CONNECT_WAIT`
        (the connection and its CURVE handshake come first, and the broker may refuse a TTL
        it cannot keep: a CONNECT sent again before its answer would only be refused
        again)."""
        limit = self.silence_factor * self.ttl
        if self.connected:
            return limit
        if self.connect_timeout is not None:
            return self.connect_timeout
        return max(limit, CONNECT_WAIT)

    def _arm(self) -> None:
        if self._timer is not None and self._timer.active():
            self._timer.cancel()
        deadline = self._last_heard + self._silence_limit()
        if self.connected:
            deadline = min(deadline, self._last_sent + self.heartbeat_factor * self.ttl)
        now = self.reactor.seconds()
        self._due = max(deadline, now)
        self._timer = self.reactor.callLater(self._due - now, self._wake)

    def _wake(self) -> None:
        self._timer = None
        if self._socket is None:
            return
        if not self.wakes.judging(due=self._due):
            self._timer = self.reactor.callLater(self.wakes.settle, self._wake)
            return
        now = self.reactor.seconds()
        if now >= self._last_heard + self._silence_limit():
            self._reconnect(
                "no answer to CONNECT" if not self.connected else "broker silent for 1.05 x TTL"
            )
            return
        if self.connected and now >= self._last_sent + self.heartbeat_factor * self.ttl:
            heartbeat = self._next_id()
            self._heartbeats.add(heartbeat)
            self._send(codec.encode(codec.Noop(heartbeat, self.framing)))
        self._arm()

    def status(self) -> dict[str, Any]:
        """The session, reconnections, topics and what waits, for a status page."""
        return {
            "endpoint": self.endpoint,
            "endpoints": list(self.endpoints),
            "connected": self.connected,
            "sessions": self.sessions,
            "reconnects": self.reconnects,
            "failovers": self.failovers,
            "topics": len(self.topics),
            "pending": len(self._pending),
            "queued": len(self._queued),
            "received": self.received,
            "handshake_failures": self.handshake_failures,
        }
