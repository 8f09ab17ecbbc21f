"""ZeroMQ sockets for Twisted, built on txzmq with its measured defects fixed.

txzmq 1.0.0 (see docs/operations.md, "transport"):

* drains a socket without bound in ``doRead``, starving timers under load:
  here reads are budgeted and the rest is resumed on the next reactor turn;
* loses frames of multipart messages on SUB sockets: here every socket type reads
  whole messages (frame by frame, reading ``Frame.more``);
* defaults HWMs to 0 (unbounded memory): here each socket gets explicit send and
  receive HWMs, and ``zmq.Again`` on send is reported as backpressure;
* sends through the global reactor and raises on a second factory shutdown: here
  the reactor is injected and shutdown is idempotent.

Importing this module imports txzmq, which imports the global reactor: only
service modules import it, lazily, never plugin files or conftest.
"""

from __future__ import annotations

import contextlib
import itertools
import random
import struct
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import zmq
from twisted.internet.base import DelayedCall
from twisted.logger import Logger
from txzmq import ZmqConnection, ZmqEndpoint, ZmqEndpointType, ZmqFactory

from bus.errors import StartupError
from bus.transport.frames import Frames
from bus.transport.frames import native as _native_frames
from bus.transport.inbound import InboundGuard
from bus.transport.inbound import policy as inbound_policy

log = Logger()

_NOBLOCK = zmq.NOBLOCK
_MORE = zmq.NOBLOCK | zmq.SNDMORE
_SEND_ONLY = frozenset({zmq.PUB, zmq.PUSH, zmq.XPUB})
# pyzmq's Python-level Socket.send wrapper costs about as much as the send itself;
# hot paths bind the Cython method directly (see ZmqSocket.raw_send).
_BACKEND_SEND = zmq.backend.Socket.send

# Monitor messages start with the event as a 16-bit number in host order.
_MONITOR_EVENT = struct.Struct("=H")
# ... and its value (a descriptor for ACCEPTED and DISCONNECTED) as 32 bits.
_MONITOR_EVENT_VALUE = struct.Struct("=HI")
_CONNECTED = zmq.EVENT_ACCEPTED | zmq.EVENT_CONNECTED
_CONNECTION_EVENTS = _CONNECTED | zmq.EVENT_DISCONNECTED
#: What a socket monitor reports: connections, and handshakes (CURVE refusals among them).
#: One monitor per socket serves every listener, so it watches all of them at once.
WATCHED_EVENTS = (
    _CONNECTION_EVENTS
    | zmq.EVENT_HANDSHAKE_SUCCEEDED
    | zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL
    | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
    | zmq.EVENT_HANDSHAKE_FAILED_AUTH
)

_GUARDED = zmq.EVENT_ACCEPTED | zmq.EVENT_DISCONNECTED

_MONITOR_NUMBERS = itertools.count(1)

MessageBatchHandler = Callable[[list[list[bytes]]], None]


class PeerUnreachable(Exception):
    """A ROUTER with ROUTER_MANDATORY was asked to send to an identity it does not know."""


@dataclass(frozen=True, slots=True)
class SocketOptions:
    """Options chosen on purpose for each socket (txzmq's 0 = unbounded is never used)."""

    send_hwm: int = 1000
    receive_hwm: int = 1000
    router_mandatory: bool = False
    tcp_keepalive_idle: int | None = 60
    tcp_keepalive_interval: int = 10
    tcp_keepalive_count: int = 6
    max_message_size: int = -1
    linger_ms: int = 1000
    identity: bytes | None = None
    reconnect_ms: int = 100
    reconnect_max_ms: int = 2000
    #: The kernel's send buffer per connection in bytes (SO_SNDBUF); -1: the OS default,
    #: which Linux grows up to tcp_wmem's maximum (4 MiB) for a peer that reads slowly.
    send_buffer: int = -1
    #: ZMQ_IMMEDIATE: queue messages only to completed connections, so that nothing
    #: waits in a pipe to a peer that is not there (sends fail instead).
    immediate: bool = False
    #: ZMTP heartbeats (libzmq's own PING/PONG, no protocol change): a peer whose process
    #: stopped answering (SIGSTOP, a hang: TCP alone keeps such a connection up) is
    #: disconnected after ``heartbeat_timeout_ms``. 0: off.
    heartbeat_ms: int = 0
    heartbeat_timeout_ms: int = 0
    #: Keep each message's ``Peer-Address`` (libzmq's metadata of the TCP connection it
    #: came on) in :attr:`ZmqSocket.peer_addresses` while its batch is handed over.
    peer_addresses: bool = False
    #: Keep each message's ``User-Id`` (the Z85 public key ZAP accepted on a CURVE socket)
    #: in :attr:`ZmqSocket.peer_user_ids` while its batch is handed over.
    peer_user_ids: bool = False
    #: Connections the kernel completes for a bound port before libzmq accepts them
    #: (ZMQ_BACKLOG; the kernel caps it at net.core.somaxconn). libzmq's 100 filled under
    #: a flood of connections, and a real client's SYN waited for a retransmission.
    backlog: int = 1024


class SocketFactory:
    """Owns one ZeroMQ context; the reactor is injected and shutdown is idempotent.

    ``curve`` (a :class:`bus.transport.curve.ClientCurve`): every socket made here connects
    as a CURVE client of that server (a client's sockets all go to one server or pair)."""

    def __init__(self, reactor: Any, io_threads: int = 1, curve: Any = None) -> None:
        self.reactor = reactor
        self.curve = curve
        self._factory = ZmqFactory()
        self._factory.reactor = reactor
        self._factory.lingerPeriod = 1000
        if io_threads != 1:
            self._factory.context.set(zmq.IO_THREADS, io_threads)
        self._closed = False

    @property
    def txzmq_factory(self) -> ZmqFactory:
        """The txzmq factory (and its ZeroMQ context) the sockets are made with."""
        return self._factory

    @property
    def closed(self) -> bool:
        """:meth:`shutdown` was called: its sockets and context are closed."""
        return self._closed

    def socket(
        self,
        socket_type: int,
        on_messages: MessageBatchHandler | None = None,
        options: SocketOptions | None = None,
        read_budget: int = 256,
        name: str = "",
        secure: bool = True,
        eager_reads: bool = False,
    ) -> ZmqSocket:
        """A :class:`ZmqSocket` of ``socket_type``; batches of whole messages go to
        ``on_messages``. ``secure`` False: never a CURVE client (in-process sockets).
        ``eager_reads``: see :attr:`ZmqSocket.eager_reads`."""
        if self._closed:
            raise RuntimeError("socket factory is shut down")
        sock = ZmqSocket(
            self,
            socket_type,
            on_messages,
            options or SocketOptions(),
            read_budget,
            name,
            eager_reads,
        )
        if secure and self.curve is not None:
            self.curve.apply(sock)
        return sock

    def shutdown(self) -> None:
        """Close every socket (each lingers up to its linger period) and the context."""
        if self._closed:
            return
        self._closed = True
        # Monitored sockets first: each stops its monitor before the monitor's reader
        # closes. libzmq sends an event to a monitor with a blocking send, holding a lock
        # that stopping the monitor takes: with the reader closed first, an event (a peer
        # leaving) would block libzmq's I/O thread, and the stop after it, for good.
        connections = list(self._factory.connections)
        readers = [c for c in connections if getattr(c, "monitors", None) is not None]
        for connection in connections:
            if connection not in readers:
                connection.shutdown()
        for connection in readers:
            connection.shutdown()
        self._factory.shutdown()


class ZmqSocket(ZmqConnection):  # type: ignore[misc]
    """One ZeroMQ socket in the reactor: budgeted multipart reads in batches, fast sends."""

    def __init__(
        self,
        factory: SocketFactory,
        socket_type: int,
        on_messages: MessageBatchHandler | None,
        options: SocketOptions,
        read_budget: int,
        name: str,
        eager_reads: bool = False,
    ) -> None:
        # Set before txzmq's constructor, which registers the reader and reads once.
        self.socketType = socket_type
        self.highWaterMark = options.receive_hwm
        self.reconnectInterval = options.reconnect_ms
        self.reconnectIntervalMax = options.reconnect_max_ms
        self.on_messages = on_messages
        self.read_budget = read_budget
        #: Read the messages that came while a batch was handled in the same reactor turn
        #: (within ``read_budget``), rather than on the next (see :meth:`_read`).
        self.eager_reads = eager_reads
        self.name = name or zmq.SocketType(socket_type).name
        self.reactor: Any = factory.reactor
        self.owner = factory
        #: TCP peers connected now, once :meth:`watch_connections` was called.
        self.connections = 0
        self._monitor: ZmqSocket | None = None
        self._listeners: list[Callable[[int], None]] = []
        #: The bounds on connections others open to this socket's TCP ports (bus.transport.inbound).
        self.inbound: InboundGuard | None = None
        #: For a monitor's reader: the socket it monitors.
        self.monitors: ZmqSocket | None = None
        #: Connections :meth:`cut_connections` cut.
        self.cuts = 0
        self.messages_received = 0
        #: With ``SocketOptions.peer_addresses``: the batch being handed over's peer
        #: addresses, one per message (None where the transport has none).
        self.peer_addresses: list[str | None] = []
        self._keep_peer_addresses = options.peer_addresses
        #: With ``SocketOptions.peer_user_ids``: the batch's User-Ids, one per message
        #: ("" where ZAP set none: a socket without CURVE).
        self.peer_user_ids: list[str] = []
        #: Keep the User-Ids of the next batches (``SocketOptions.peer_user_ids``; a
        #: service may turn it on and off between batches).
        self.keep_user_ids = options.peer_user_ids
        self.reading_paused = False
        self.read_scheduled: DelayedCall | None = None
        #: While a batch is handed over: sends made meanwhile only note that the socket
        #: must be looked at again (:meth:`_look_after_sends`), once, after the batch.
        self._handing_over = False
        self._sent_while_handing_over = False
        #: Set by :meth:`_look_after_sends` when a message waits; the reader takes it.
        self._input_waiting = False
        #: Called after the reactor saw the socket's descriptor signal. libzmq signals it
        #: for incoming messages and also when a peer's full pipe has drained to half
        #: (its low-water mark): the nearest thing to per-peer writability a ROUTER has.
        self.on_signal: Callable[[], None] | None = None
        self._options = options
        # txzmq's constructor reads once: through pyzmq, before the handle is known.
        self._native: Frames | None = None
        self._handle = 0
        ZmqConnection.__init__(self, factory.txzmq_factory, identity=options.identity)
        sock = self.socket
        #: ``raw_send(frame, flags)``: the socket's Cython send, for hot paths.
        self.raw_send: Callable[[bytes, int], Any] = _BACKEND_SEND.__get__(sock)
        #: Whole messages a batch per call (bus.transport.frames), when it was built.
        self._native = _native_frames
        self._handle = sock.underlying if self._native is not None else 0
        sock.set(zmq.SNDHWM, options.send_hwm)
        sock.set(zmq.RCVHWM, options.receive_hwm)
        sock.set(zmq.LINGER, options.linger_ms)
        sock.set(zmq.BACKLOG, options.backlog)
        if options.send_buffer >= 0:
            sock.set(zmq.SNDBUF, options.send_buffer)
        if options.max_message_size >= 0:
            sock.set(zmq.MAXMSGSIZE, options.max_message_size)
        if options.immediate:
            sock.set(zmq.IMMEDIATE, 1)
        if options.heartbeat_ms > 0:
            sock.set(zmq.HEARTBEAT_IVL, options.heartbeat_ms)
            sock.set(
                zmq.HEARTBEAT_TIMEOUT, options.heartbeat_timeout_ms or 3 * options.heartbeat_ms
            )
        if options.router_mandatory and socket_type == zmq.ROUTER:
            sock.set(zmq.ROUTER_MANDATORY, 1)
        if options.tcp_keepalive_idle is not None:
            sock.set(zmq.TCP_KEEPALIVE, 1)
            sock.set(zmq.TCP_KEEPALIVE_IDLE, options.tcp_keepalive_idle)
            sock.set(zmq.TCP_KEEPALIVE_INTVL, options.tcp_keepalive_interval)
            sock.set(zmq.TCP_KEEPALIVE_CNT, options.tcp_keepalive_count)

    # -- endpoints ---------------------------------------------------------------------

    def bind(self, address: str) -> str:
        """Bind and return the concrete endpoint (useful with port ``*``). A TCP port's
        inbound connections are bounded by the process's :mod:`bus.transport.inbound` policy."""
        self.addEndpoints([ZmqEndpoint(ZmqEndpointType.bind, address)])
        endpoint: str = self.socket.get(zmq.LAST_ENDPOINT).decode()
        self.guard_inbound(endpoint)
        return endpoint

    def guard_inbound(self, endpoint: str) -> None:
        """Bound the connections others open to ``endpoint``, a TCP port this socket is
        bound to (:meth:`bind` does it; a socket bound through pyzmq calls it itself)."""
        if endpoint.startswith("tcp://"):
            if self.inbound is None:
                self.inbound = inbound_policy().guard(self.name)
            self.inbound.ports.add(int(endpoint.rpartition(":")[2]))
            self.watch_connections()

    def cut_connections(self, address: str | None = None) -> int:
        """Close the connections others made to this socket's TCP ports (from ``address``
        only, when given): each is shut down under libzmq, which sees it end and closes it
        (libzmq has no call that closes one peer's connection). Peers connect again by
        themselves, through the handshake (and ZAP) again. Returns how many were cut."""
        if self.inbound is None:
            return 0
        cut = self.inbound.shut(address)
        self.cuts += cut
        return cut

    def connect(self, address: str) -> None:
        """Connect to ``address`` (and look for input: the descriptor may not signal)."""
        self.addEndpoints([ZmqEndpoint(ZmqEndpointType.connect, address)])
        # The socket's edge-triggered descriptor may have fired while connecting: look.
        self._schedule_read()

    def subscribe(self, prefix: bytes) -> None:
        """SUB: receive messages starting with ``prefix``."""
        self.socket.set(zmq.SUBSCRIBE, prefix)

    def unsubscribe(self, prefix: bytes) -> None:
        """SUB: stop receiving messages starting with ``prefix``."""
        self.socket.set(zmq.UNSUBSCRIBE, prefix)

    def watch_connections(
        self, events: int = 0, on_event: Callable[[int], None] | None = None
    ) -> None:
        """Keep :attr:`connections` current: a ZeroMQ socket monitor, read in the reactor,
        reports each peer accepted or connected, and each one gone. ``on_event`` is told of
        every monitored event (:data:`WATCHED_EVENTS`: connections and handshakes, CURVE
        refusals among them); each call adds a listener to the one monitor."""
        if events & ~WATCHED_EVENTS:
            raise ValueError(f"socket monitors report only WATCHED_EVENTS, not {events:#x}")
        if on_event is not None:
            self._listeners.append(on_event)
        if self._monitor is not None or self.socket is None:
            return
        # Not id(self): a socket closed a moment ago may still hold its monitor's address
        # (libzmq reaps it later) while a new object reuses the id.
        address = f"inproc://monitor-{next(_MONITOR_NUMBERS)}"
        self.socket.monitor(address, WATCHED_EVENTS)
        self._monitor = self.owner.socket(
            zmq.PAIR,
            self._on_monitor_events,
            SocketOptions(linger_ms=0, tcp_keepalive_idle=None, receive_hwm=100_000),
            name=f"{self.name}-monitor",
            secure=False,
        )
        self._monitor.monitors = self
        self._monitor.connect(address)

    def _on_monitor_events(self, batch: list[list[bytes]]) -> None:
        guard = self.inbound
        for frames in batch:
            event = _MONITOR_EVENT.unpack_from(frames[0])[0] if len(frames[0]) >= 2 else 0
            if not event:
                continue
            if guard is not None and event & _GUARDED and len(frames[0]) >= 6:
                fd = _MONITOR_EVENT_VALUE.unpack_from(frames[0])[1]
                if event & zmq.EVENT_ACCEPTED:
                    guard.accepted(fd)
                else:
                    guard.disconnected(fd)
            for listener in self._listeners:
                listener(event)
            if event & _CONNECTED:
                self.connections += 1
            elif event & zmq.EVENT_DISCONNECTED:
                self.connections = max(0, self.connections - 1)

    # -- reading -------------------------------------------------------------------------

    def doRead(self) -> None:
        """The reactor saw the descriptor signal: read, then tell ``on_signal``."""
        self._read()
        if self.on_signal is not None and self.socket is not None:
            self.on_signal()

    def _read(self) -> None:
        """Read at most ``read_budget`` whole messages, hand them over as one batch, and
        come back on the next reactor turn if more may be waiting, so that timers and
        other sockets keep their turn under load."""
        self.read_scheduled = None
        sock = self.socket
        if sock is None or self.reading_paused:
            return
        if self.socketType in _SEND_ONLY and self.on_messages is None:
            # An XPUB with a handler reads its subscriptions; otherwise nothing is read.
            # Asking ZMQ_EVENTS lets libzmq process pending commands (subscriptions): once
            # per turn that sent, through the helper where it is (pyzmq's get converts
            # the option to its enum first).
            native = self._native
            if native is not None and not sock.closed:
                native.readable(self._handle)
            else:
                sock.get(zmq.EVENTS)
            return
        # Again on the next turn if the budget ran out, or if messages came while the batch
        # was handled (its handler's sends made the socket look). A socket that reads
        # eagerly reads those at once instead, batch after batch within its budget for the
        # turn: for a service with one socket answering each message (mc0), where a turn
        # per batch costs more than the batch; a service that reads several sockets keeps
        # their turns (eMQP read eagerly had smaller batches and lost a fifth of its rate).
        budget = self.read_budget
        handed = 0
        while True:
            before = self.messages_received
            exhausted = self._read_batch(sock, budget - handed)
            read = self.messages_received - before
            handed += read
            waiting, self._input_waiting = self._input_waiting, False
            if exhausted and not waiting:
                return  # the descriptor signals the next message
            if (
                not exhausted
                or not self.eager_reads
                or read == 0
                or handed >= budget
                or self.socket is not sock
                or self.reading_paused
            ):
                self._schedule_read()
                return

    def drain(self, limit: int, go_on: Callable[[], bool] = lambda: True) -> int:
        """Hand over what the socket holds now, batch by batch as reading does (paused or
        not, with the same User-Ids and addresses), at most about ``limit`` messages and
        while ``go_on()``: what a clean stop still takes in. The number handed over."""
        handed = 0
        while self.socket is not None and handed < limit and go_on():
            before = self.messages_received
            exhausted = self._read_batch(self.socket, self.read_budget)
            read = self.messages_received - before
            handed += read
            waiting, self._input_waiting = self._input_waiting, False
            if exhausted and not (waiting and read):
                if waiting:
                    self._schedule_read()
                break
        return handed

    def _read_batch(self, sock: Any, budget: int) -> bool:
        """Read at most ``budget`` whole messages and hand them over as one batch;
        True when the socket had no more."""
        native = self._native
        if native is None or sock.closed:
            return self._read_batch_frames(sock, budget)
        batch, error, addresses, user_ids = native.read(
            self._handle, budget, self._keep_peer_addresses, self.keep_user_ids
        )
        if error and error != zmq.EAGAIN and self.socket is not None:
            log.error("read failed on {name}: {error}", name=self.name, error=zmq.strerror(error))
        if batch:
            self._hand_over(batch, addresses, user_ids)
        return error != 0

    def _read_batch_frames(self, sock: Any, budget: int) -> bool:
        """:meth:`_read_batch` through pyzmq, frame by frame."""
        # Frame by frame with copy=False: Frame.more is free, where recv_multipart asks
        # getsockopt(RCVMORE) through a Python wrapper after every frame.
        recv = sock.recv
        batch: list[list[bytes]] = []
        addresses: list[str | None] | None = [] if self._keep_peer_addresses else None
        user_ids: list[str] | None = [] if self.keep_user_ids else None
        exhausted = False
        try:
            for _ in range(budget):
                frame = recv(_NOBLOCK, copy=False)
                if addresses is not None:
                    addresses.append(_peer_address(frame))
                if user_ids is not None:
                    user_ids.append(_user_id(frame))
                parts = [frame.bytes]
                while frame.more:
                    frame = recv(_NOBLOCK, copy=False)
                    parts.append(frame.bytes)
                batch.append(parts)
        except zmq.Again:
            exhausted = True
        except zmq.ZMQError:
            # Whole messages read before the error are still handed over.
            exhausted = True
            if self.socket is not None:
                log.failure("read failed on {name}", name=self.name)
        if batch:
            self._hand_over(batch, addresses, user_ids)
        return exhausted

    def _hand_over(
        self,
        batch: list[list[bytes]],
        addresses: list[str | None] | None,
        user_ids: list[str] | None,
    ) -> None:
        """Give a batch to the handler, with its peers' addresses and User-Ids (each
        None unless kept) readable while it runs."""
        self.messages_received += len(batch)
        keep = addresses is not None or user_ids is not None
        if keep:
            self.peer_addresses = addresses or []
            self.peer_user_ids = user_ids or []
        self._handing_over = True
        try:
            self._deliver(batch)
        finally:
            self._handing_over = False
            if keep:
                self.peer_addresses = []
                self.peer_user_ids = []
            if self._sent_while_handing_over:
                self._sent_while_handing_over = False
                self._look_after_sends()

    def _look_after_sends(self) -> None:
        """The handler sent on this socket: a send may have taken in the signal of a message
        that came meanwhile (ZeroMQ's descriptor signals once, and a send processes the
        socket's pending commands). Ask the socket whether one waits; if none does, the
        descriptor signals the next one. Asking costs one call, where a read on the next
        turn costs a timer and a turn per batch; the reader (:meth:`_read`, :meth:`drain`)
        takes the answer."""
        native, sock = self._native, self.socket
        if sock is None or sock.closed:
            return
        try:
            if native is not None:
                waiting = native.readable(self._handle)
            else:
                waiting = bool(sock.get(zmq.EVENTS) & zmq.POLLIN)
        except (OSError, zmq.ZMQError):
            waiting = True  # the read that follows tells what is wrong, as before
        self._input_waiting = waiting

    def _deliver(self, batch: list[list[bytes]]) -> None:
        handler = self.on_messages
        if handler is None:
            return
        try:
            handler(batch)
        except Exception:
            # A handler bug must not stop the socket from being read.
            log.failure("message handler failed on {name}", name=self.name)

    def read_soon(self) -> None:
        """Read again on the next reactor turn (after a :meth:`drain` that stopped at its
        limit: the descriptor signals only once what waits has been read)."""
        self._schedule_read()

    def _schedule_read(self) -> None:
        if self._handing_over:
            # A send from the batch's handler: looked after once the batch is handled.
            self._sent_while_handing_over = True
            return
        if self.read_scheduled is None and self.socket is not None:
            self.read_scheduled = self.reactor.callLater(0, self._read)

    def messageReceived(self, message: list[bytes]) -> None:
        """txzmq's per-message callback (unused here): handed over as a batch of one."""
        self._deliver([message])

    # -- writing -------------------------------------------------------------------------

    def send_frames(self, frames: Sequence[bytes]) -> bool:
        """Send one multipart message without blocking.

        Returns False when the socket would block (HWM reached: backpressure; nothing was
        sent). Raises :class:`PeerUnreachable` for an unknown ROUTER peer with
        ROUTER_MANDATORY.
        """
        native, sock = self._native, self.socket
        try:
            if native is not None and sock is not None and not sock.closed:
                # One call for the whole message (the compiled helper), where a frame
                # costs a call through pyzmq.
                error = native.send(self._handle, (frames,))[1]
                if error:
                    if error == zmq.EAGAIN:
                        return False
                    if error == zmq.EHOSTUNREACH:
                        raise PeerUnreachable(frames[0])
                    raise zmq.ZMQError(error)
                return True
            send = self.raw_send
            try:
                for frame in frames[:-1]:
                    send(frame, _MORE)
                send(frames[-1], _NOBLOCK)
            except zmq.Again:
                return False
            except zmq.ZMQError as error:
                if error.errno == zmq.EHOSTUNREACH:
                    raise PeerUnreachable(frames[0]) from None
                raise
            return True
        finally:
            # ZeroMQ may not signal readable again after a send touched the socket; a
            # socket without a reader (a ZRE peer's DEALER) has nothing to miss, and its
            # descriptor's signals are still read.
            if self.on_messages is not None or self.socketType in _SEND_ONLY:
                self._schedule_read()

    def look_for_input(self) -> None:
        """Read on the next reactor turn: for callers that sent through :attr:`raw_send`
        (ZeroMQ may not signal readable again after a send touched the socket)."""
        self._schedule_read()

    def send_many(self, messages: Sequence[Sequence[bytes]]) -> int:
        """Send messages in order until one would block; return how many were sent."""
        sent, error = self.send_each(messages)
        if error == zmq.EHOSTUNREACH:
            raise PeerUnreachable(messages[sent][0])
        return sent

    def send_each(self, messages: Sequence[Sequence[bytes]]) -> tuple[int, int]:
        """Send messages in order until one is not sent: ``(sent, errno)``, the errno 0 when
        all went, EAGAIN when the next would block (HWM: nothing of it went), EHOSTUNREACH
        when a ROUTER with ROUTER_MANDATORY does not know its peer; the messages after it
        are not tried. Other errors raise."""
        native, sock = self._native, self.socket
        if native is None or sock is None or sock.closed:
            return self._send_each_frames(messages)
        try:
            sent, error = native.send(self._handle, messages)
        finally:
            self._schedule_read()
        if error and error != zmq.EAGAIN and error != zmq.EHOSTUNREACH:
            raise zmq.ZMQError(error)
        return sent, error

    def _send_each_frames(self, messages: Sequence[Sequence[bytes]]) -> tuple[int, int]:
        """:meth:`send_each` through pyzmq, frame by frame."""
        send = self.raw_send
        sent = 0
        try:
            for frames in messages:
                for frame in frames[:-1]:
                    send(frame, _MORE)
                send(frames[-1], _NOBLOCK)
                sent += 1
        except zmq.Again:
            return sent, zmq.EAGAIN
        except zmq.ZMQError as error:
            if error.errno == zmq.EHOSTUNREACH:
                return sent, zmq.EHOSTUNREACH
            raise
        finally:
            self._schedule_read()
        return sent, 0

    def send(self, message: Any) -> None:  # txzmq API: route through the injected reactor
        """txzmq's send: one message, through :meth:`send_frames` (raises at the HWM)."""
        frames = [message] if isinstance(message, bytes) else list(message)
        if not self.send_frames(frames):
            raise zmq.Again()

    # -- flow control ------------------------------------------------------------------

    def pause_reading(self) -> None:
        """Stop reading: ZeroMQ queues up to the receive HWM, then the peer's HWM applies."""
        if self.socket is not None and not self.reading_paused:
            self.reading_paused = True
            self.reactor.removeReader(self)

    def resume_reading(self) -> None:
        """Read again after :meth:`pause_reading` (at once: messages may be waiting)."""
        if self.socket is not None and self.reading_paused:
            self.reading_paused = False
            self.reactor.addReader(self)
            self._schedule_read()

    # -- closing -------------------------------------------------------------------------

    @property
    def closed(self) -> bool:
        """The socket was closed."""
        return self.socket is None

    def shutdown(self) -> None:
        """Close the socket; safe to call more than once."""
        if self.socket is None:
            return
        if self.read_scheduled is not None and self.read_scheduled.active():
            self.read_scheduled.cancel()
        self.read_scheduled = None
        if self.inbound is not None:
            self.inbound.close()
            self.inbound = None
        monitor, self._monitor = self._monitor, None
        if monitor is not None:
            # libzmq sends monitor events with a blocking send: events nobody read (a
            # flood of connections) could fill the pipe and block the I/O thread, holding
            # the lock that stopping the monitor takes. Empty it first.
            monitor.discard_pending()
            with contextlib.suppress(zmq.ZMQError):
                self.socket.disable_monitor()
            monitor.shutdown()
        ZmqConnection.shutdown(self)

    def discard_pending(self) -> int:
        """Read and drop every message waiting on this socket; how many frames."""
        sock, count = self.socket, 0
        if sock is None:
            return 0
        while True:
            try:
                sock.recv(zmq.NOBLOCK, copy=False)
            except zmq.ZMQError:
                return count
            count += 1


def _peer_address(frame: zmq.Frame) -> str | None:
    try:
        address = frame.get("Peer-Address")
    except (zmq.ZMQError, AttributeError, TypeError):
        return None  # not a TCP connection, or a libzmq without message properties
    return address if isinstance(address, str) and address else None


def _user_id(frame: zmq.Frame) -> str:
    try:
        user_id = frame.get("User-Id")
    except (zmq.ZMQError, AttributeError, TypeError):
        return ""  # no ZAP handler decided this connection (no CURVE)
    return user_id if isinstance(user_id, str) else ""


def bind_failure(error: zmq.ZMQError, port_option: str, what: str) -> StartupError:
    """A failed bind, told as the setting to blame: the port when it is in use, else the
    address to bind (no such interface or address here)."""
    option = port_option if error.errno == zmq.EADDRINUSE else "bind"
    return StartupError(option, f"cannot bind {what}: {error.strerror}")


def ephemeral_range() -> tuple[int, int]:
    """The ports the kernel hands out for a bind to port 0 (``ip_local_port_range``, both
    ends included; Linux's default where it cannot be read)."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as ports:
            low, high = (int(word) for word in ports.read().split()[:2])
    except (OSError, ValueError):
        return 32768, 60999
    return low, high


def bind_consecutive(
    open_at: Callable[[int], None],
    close: Callable[[], None],
    *,
    base: int,
    count: int,
    host: str,
    port_option: str = "port",
    attempts: int = 50,
) -> None:
    """Open ``count`` consecutive ports from ``base`` with ``open_at(base)`` (which raises
    zmq.ZMQError when a bind fails). ``base`` 0: a random free base in the kernel's own range
    for port 0 (:func:`ephemeral_range`: below it lie the ports services are configured on),
    calling ``close()`` after each base found in use, ``attempts`` times at most
    (RuntimeError).
    A given base that cannot bind is a :class:`bus.errors.StartupError` naming
    ``port_option`` (or ``bind``: see :func:`bind_failure`)."""
    if base:
        try:
            open_at(base)
        except zmq.ZMQError as error:
            what = f"{host}, ports {base}-{base + count - 1}"
            raise bind_failure(error, port_option, what) from None
        return
    rng = random.Random()
    low, high = ephemeral_range()
    for _ in range(attempts):
        try:
            open_at(rng.randrange(low, high - count + 2))
            return
        except zmq.ZMQError as error:
            if error.errno != zmq.EADDRINUSE:
                raise
            close()
    raise RuntimeError(f"no {count} consecutive free ports found on {host}")
