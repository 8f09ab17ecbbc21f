"""Twisted clients of the Event BUS: a subscriber (SUB + snapshot DEALER) and a publisher.

subscriber = EventBusSubscriber(["127.0.0.1:5556"], ["/orders/"], on_event)
subscriber.startService()          # or setServiceParent(application)

publisher = EventBusPublisher("127.0.0.1:5556", producer_id="billing")
publisher.publish("/orders/42/", {"total": 12.5})
"""

from __future__ import annotations

import random
import time
import uuid
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import msgpack
import zmq
from twisted.application.service import Service
from twisted.internet import defer
from twisted.internet.base import DelayedCall
from twisted.logger import Logger

from bus.eventbus import codec
from bus.eventbus.codec import Dialect, Event, EventBusError, Heartbeat, SnapshotEnd
from bus.eventbus.subscriber import SubscriberCore, snapshot_patience
from bus.extension import SocketFactory, SocketOptions, ZmqSocket, reactor_of
from bus.transport.curve import ClientCurve
from bus.util.droplog import DropCounter
from bus.util.files import replace_atomically
from bus.util.periodic import Periodic
from bus.util.wakes import Wakes

log = Logger(namespace="bus.eventbus.client")


@dataclass(frozen=True, slots=True)
class ServerAddress:
    """A bus server: its host and base port P (snapshot P, publisher P+1, collector P+2)."""

    host: str
    port: int

    @classmethod
    def parse(cls, text: str | ServerAddress) -> ServerAddress:
        """``host:port`` (or ``tcp://host:port``, ``[v6]:port``) as an address; a ServerAddress as
        it is."""
        if isinstance(text, ServerAddress):
            return text
        address = text.removeprefix("tcp://")
        host, _, port = address.rpartition(":")
        if not host or not port.isdigit():
            raise ValueError(f"not a bus address (host:port): {text!r}")
        return cls(host.strip("[]"), int(port))

    @property
    def snapshot(self) -> str:
        """The endpoint of the server's snapshot ROUTER."""
        return f"tcp://{self.host}:{self.port}"

    @property
    def publisher(self) -> str:
        """The endpoint of the server's PUB."""
        return f"tcp://{self.host}:{self.port + 1}"

    @property
    def collector(self) -> str:
        """The endpoint of the server's collector."""
        return f"tcp://{self.host}:{self.port + 2}"

    def __str__(self) -> str:
        return f"{self.host}:{self.port}"


class FileCursor:
    """Keeps the last delivered sequence in a file, written atomically, so a subscriber
    resumes where it stopped (at-least-once: events after the last save come again)."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)

    def load_position(self) -> tuple[int, str | None]:
        """The saved sequence and the store it belongs to."""
        try:
            fields = self.path.read_text().split()
        except FileNotFoundError:
            return 0, None
        return (int(fields[0]) if fields else 0), (fields[1] if len(fields) > 1 else None)

    def load(self) -> int:
        """The saved sequence (0 when nothing was saved)."""
        return self.load_position()[0]

    def save(self, sequence: int, store_id: str | None = None) -> None:
        """Keep ``sequence`` (of the store ``store_id``), durably, replacing what was saved."""
        replace_atomically(self.path, f"{sequence} {store_id or ''}".rstrip() + "\n", fsync=True)


class _Connection:
    """Whether a socket with one peer has a live connection (ZMTP handshake done), and
    since when it has had none: what tells a client to move to the next server sooner
    than silence would. A stopped process still accepts TCP, so only the handshake counts."""

    def __init__(self, sock: ZmqSocket, handshake_ivl: float, now: float) -> None:
        self.up = False
        self.down_since: float | None = now
        sock.socket.set(zmq.HANDSHAKE_IVL, max(int(handshake_ivl * 1000), 100))
        sock.watch_connections(zmq.EVENT_HANDSHAKE_SUCCEEDED, self._event)

    def _event(self, event: int) -> None:
        if event & zmq.EVENT_HANDSHAKE_SUCCEEDED:
            self.up = True
            self.down_since = None
        elif event & zmq.EVENT_DISCONNECTED:
            self.up = False

    def down_for(self, now: float) -> float:
        """Seconds without a connection (0 while up)."""
        if self.up:
            self.down_since = None
            return 0.0
        if self.down_since is None:
            self.down_since = now
        return now - self.down_since


class _Sockets:
    """Owns a socket factory unless one was given; an owned one is made anew after
    ``close`` so that a stopped service can be started again."""

    def __init__(
        self, reactor: Any, factory: SocketFactory | None, curve: ClientCurve | None = None
    ) -> None:
        self.reactor = reactor_of(reactor)
        self._own = factory is None
        self._factory = factory
        self.curve = curve

    def socket(
        self,
        socket_type: int,
        on_messages: Callable[[list[list[bytes]]], None] | None,
        options: SocketOptions,
        name: str,
    ) -> ZmqSocket:
        """A socket of the factory, a CURVE client when ``curve`` is given here (a given
        factory may carry its own, see :class:`SocketFactory`)."""
        sock = self.factory.socket(socket_type, on_messages, options, name=name)
        if self.curve is not None and self.factory.curve is None:
            self.curve.apply(sock)
        return sock

    @property
    def factory(self) -> SocketFactory:
        if self._factory is None or (self._own and self._factory.closed):
            self._factory = SocketFactory(self.reactor)
        return self._factory

    def close(self) -> None:
        if self._own and self._factory is not None:
            self._factory.shutdown()


class EventBusSubscriber(Service):
    """Subscribes to subtrees of one bus, failing over along a list of servers.

    ``on_event`` is called with each :class:`Event`, in sequence order (see
    :mod:`bus.eventbus.subscriber` for what a heal does to subtree subscribers).

    ``heartbeat_timeout``: seconds without any message before failing over to the next
    server (None: never, for servers with heartbeats off). ``since``: deliver events above
    this sequence (default: the cursor's, else everything); ``"head"``: only events
    stored after the first heartbeat. ``wait_for_heartbeat``: ask
    for the snapshot only once the server's first heartbeat named its log.

    ``dialect="original"`` speaks to the original Node.js server (see
    :class:`bus.eventbus.codec.Dialect`). It sends no heartbeat, so an idle connection is
    probed: every ``heartbeat_timeout / 3`` of silence a SYNCSTART for no topic goes to the
    snapshot port, and its SYNCEND (the server's current sequence) stands for a heartbeat:
    it shows the server alive and, one probe later, reveals lost tail events.

    ``curve``: connect as a CURVE client (servers run with ``--server-cert``).

    ``failover_after``: with several servers, seconds without a connection to the current
    one (its process died, its host is cut off) before moving to the next, sooner than
    ``heartbeat_timeout`` of silence would.
    """

    def __init__(
        self,
        servers: Sequence[str | ServerAddress],
        subtrees: Iterable[str | bytes] = (),
        on_event: Callable[[Event], object] = lambda event: None,
        *,
        since: int | Literal["head"] | None = None,
        cursor: FileCursor | None = None,
        heartbeat_timeout: float | None = 3.5,
        reconcile_interval: float = 5.0,
        receive_hwm: int = 200_000,
        reactor: Any = None,
        factory: SocketFactory | None = None,
        cursor_save_interval: float = 1.0,
        wait_for_heartbeat: bool = False,
        dialect: Dialect | str = Dialect.SPEC,
        curve: ClientCurve | None = None,
        failover_after: float = 1.0,
    ) -> None:
        if not servers:
            raise ValueError("at least one server address is needed")
        self.servers = [ServerAddress.parse(s) for s in servers]
        self.failover_after = failover_after
        self._link: _Connection | None = None
        self.subtrees = tuple(s.encode() if isinstance(s, str) else s for s in subtrees)
        self.on_event = on_event
        self.cursor = cursor
        start, store_id = cursor.load_position() if cursor else (0, None)
        from_head = since == "head"
        if from_head and heartbeat_timeout is None:
            raise ValueError('since="head" needs heartbeats (the first one names the head)')
        if isinstance(since, int):
            start = since
        self.heartbeat_timeout = heartbeat_timeout
        self.receive_hwm = receive_hwm
        self.cursor_save_interval = cursor_save_interval
        self.wait_for_heartbeat = from_head or (
            wait_for_heartbeat and heartbeat_timeout is not None
        )
        self.dialect = Dialect(dialect)
        self._io = _Sockets(reactor, factory, curve)
        self.reactor: Any = self._io.reactor
        self.core = SubscriberCore(
            deliver=self._deliver,
            request_snapshot=self._request_snapshot,
            full_feed=not any(self.subtrees),
            last=start,
            reconcile_interval=reconcile_interval,
            store_id=store_id,
            from_head=from_head,
        )
        self.server_index = 0
        self.failovers = 0
        self.paused = False
        self.drops = DropCounter(log, "message from server", time.monotonic)
        self._sub: ZmqSocket | None = None
        self._snapshot: ZmqSocket | None = None
        self._last_heard = 0.0
        self._connected_at = 0.0
        self._snapshot_activity = 0.0
        self._snapshot_patience = heartbeat_timeout or 0.0
        self._periodic = Periodic(self.reactor, log)
        checks = [heartbeat_timeout] if heartbeat_timeout is not None else []
        if len(self.servers) > 1:
            checks.append(failover_after)
        self._check_period = max(min(checks) / 4, 0.05) if checks else 0.0
        #: A check after a stall of this process judges no silence (bus.util.wakes).
        self.wakes = Wakes(self._check_period, self.reactor.seconds)
        self._waiters: list[tuple[int, defer.Deferred[int]]] = []
        self._saved = start
        self._saved_store = store_id
        self._probe: ZmqSocket | None = None
        self._probe_sent = 0.0
        self._probe_floor = 0
        self._heartbeat_seen = False
        #: When the last heartbeat came (reactor seconds; 0: none yet).
        self.heartbeat_at = 0.0
        self._decimal_seen = False
        self._hinted = False

    # -- lifecycle -----------------------------------------------------------------------

    @property
    def server(self) -> ServerAddress:
        """The server the subscriber uses now."""
        return self.servers[self.server_index]

    @property
    def last_sequence(self) -> int:
        """The sequence of the last event delivered."""
        return self.core.last

    def startService(self) -> None:
        Service.startService(self)
        self._connect()
        if self._check_period:
            self._periodic.every(self._check_period, self._check_alive)
        if self.cursor is not None:
            self._periodic.every(self.cursor_save_interval, self._save_cursor)

    def stopService(self) -> defer.Deferred[None]:
        Service.stopService(self)
        self._periodic.stop_all()
        self._disconnect()
        self._save_cursor()
        self._io.close()
        return defer.succeed(None)

    def _connect(self) -> None:
        server = self.server
        self._sub = self._io.socket(
            zmq.SUB,
            self._on_published,
            SocketOptions(receive_hwm=self.receive_hwm, linger_ms=0),
            name="subscriber",
        )
        for prefix in self.subtrees or (b"",):
            self._sub.subscribe(prefix)
        if any(self.subtrees):
            self._sub.subscribe(codec.HEARTBEAT_TOPIC)
        self._last_heard = self._connected_at = self.reactor.seconds()
        if len(self.servers) > 1:
            self._link = _Connection(self._sub, self.failover_after, self._connected_at)
        self._sub.connect(server.publisher)
        if not self.dialect.has_heartbeats and self.heartbeat_timeout is not None:
            self._probe = self._io.socket(
                zmq.DEALER,
                self._on_probe_reply,
                SocketOptions(linger_ms=0, identity=self._identity()),
                name="probe",
            )
            self._probe.connect(server.snapshot)
            self._probe_floor = 0
            self._send_probe(self._connected_at)
        log.info(
            "subscribing to {server} above sequence {since}",
            server=server,
            since=self.core.verified,
        )
        # By default the snapshot is asked at once and the first heartbeat then closes the
        # race with the subscription; wait_for_heartbeat first learns which log the
        # server serves (the Spark bridge needs that before it takes any event).
        self.core.start(self._connected_at, wait_for_heartbeat=self.wait_for_heartbeat)

    def _open_snapshot_socket(self) -> None:
        if self._snapshot is not None:
            self._snapshot.shutdown()
        # Unbounded receive queue: a snapshot is never cut short on our side.
        self._snapshot = self._io.socket(
            zmq.DEALER,
            self._on_snapshot_reply,
            SocketOptions(receive_hwm=0, linger_ms=0, identity=self._identity()),
            name="snapshot-client",
        )
        self._snapshot.connect(self.server.snapshot)

    def _identity(self) -> bytes | None:
        """The original server answers only identities that survive a trip through a
        string: a UUID, as its own client uses. The text's servers take libzmq's own."""
        return None if self.dialect is Dialect.SPEC else str(uuid.uuid4()).encode()

    def _disconnect(self) -> None:
        self._link = None
        for sock in (self._sub, self._snapshot, self._probe):
            if sock is not None:
                sock.shutdown()
        self._sub = self._snapshot = self._probe = None

    def pause(self) -> None:
        """Stop reading live events (e.g. while a slow consumer catches up). Whatever
        ZeroMQ drops meanwhile is healed from the server's log after :meth:`resume`."""
        self.paused = True
        if self._sub is not None:
            self._sub.pause_reading()

    def resume(self) -> None:
        """Read live events again after :meth:`pause`."""
        self.paused = False
        self._last_heard = self.reactor.seconds()
        if self._sub is not None:
            self._sub.resume_reading()

    def _check_alive(self) -> None:
        now = self.reactor.seconds()
        if not self.wakes.judging():
            return  # this process did not run: what the server sent may wait unread
        if self._link is not None:
            down = self._link.down_for(now)
            if down >= self.failover_after:
                self._switch(f"no connection to {{previous}} for {down:.1f}s")
                return
        if self.heartbeat_timeout is None or self.paused:
            return  # a paused subscriber's silence is its own, not the server's
        silent = now - self._last_heard
        if self._probe is not None and min(silent, now - self._probe_sent) >= (
            self.heartbeat_timeout / 3
        ):
            self._send_probe(now)
        if silent <= self.heartbeat_timeout:
            if self.core.awaiting_heartbeat and now - self._connected_at > self.heartbeat_timeout:
                self._hint_original()
                log.warn("no heartbeat from {server}: are its heartbeats off?", server=self.server)
                self.core.proceed_without_heartbeat()
            elif (
                self.core.syncing
                and not self.core.awaiting_heartbeat
                and now - self._snapshot_activity > self._snapshot_patience
            ):
                # The request or its answer was lost (e.g. the server restarted), or a busy
                # server refused or abandoned it: ask again, later each time, on a fresh
                # socket so a late answer to the old one cannot interleave.
                self._hint_original()
                log.warn(
                    "snapshot from {server} timed out after {patience:.1f}s: asking again",
                    server=self.server,
                    patience=self._snapshot_patience,
                )
                self.core.retry_snapshot()
            return
        self._hint_original()
        self._switch(f"no word from {{previous}} for {silent:.1f}s")

    def _switch(self, why: str) -> None:
        previous = self.server
        self.server_index = (self.server_index + 1) % len(self.servers)
        self.failovers += 1
        log.warn(
            why + ": switching to {server}",
            previous=previous,
            server=self.server,
        )
        if self.core.store_id is None and self.core.last:
            log.warn(
                "{previous} never named its log: assuming {server} serves the same sequences",
                previous=previous,
                server=self.server,
            )
        self._disconnect()
        self._connect()

    def _save_cursor(self) -> None:
        core = self.core
        if self.cursor is not None and (
            core.verified != self._saved or core.store_id != self._saved_store
        ):
            # The store too: a cursor saved before the first heartbeat named it is saved
            # again once one has, or it would never name its log.
            self._saved, self._saved_store = core.verified, core.store_id
            self.cursor.save(self._saved, core.store_id)

    # -- protocol --------------------------------------------------------------------------

    def _request_snapshot(self, since: int) -> None:
        # A fresh socket per request: answers to an abandoned request cannot interleave.
        self._open_snapshot_socket()
        self._snapshot_activity = self.reactor.seconds()
        if self.heartbeat_timeout is not None:
            # A little jitter, so that clients refused together do not ask again together.
            self._snapshot_patience = snapshot_patience(
                self.heartbeat_timeout, self.core.snapshot_retries
            ) * random.uniform(1.0, 1.25)
        if self._snapshot is not None:
            self._snapshot.send_frames(self.dialect.sync_start(self.subtrees, since))

    # -- liveness of a server without heartbeats (the original dialect) -------------------

    def _send_probe(self, now: float) -> None:
        if self._probe is not None:
            self._probe_sent = now
            self._probe.send_frames(self.dialect.sync_start([codec.PROBE_SUBTREE], self.core.last))

    def _on_probe_reply(self, batch: list[list[bytes]]) -> None:
        now = self._last_heard = self.reactor.seconds()
        for frames in batch:
            try:
                end = codec.parse_snapshot_reply(frames)
            except EventBusError as error:
                self.drops.drop(error.reason, str(error))
                continue
            if not isinstance(end, SnapshotEnd):
                continue
            # The SYNCEND raced the broadcasts in flight on the other socket: what the
            # previous probe announced is what we must hold by now.
            announced, self._probe_floor = min(end.sequence, self._probe_floor), end.sequence
            self.core.on_heartbeat(Heartbeat(announced, self.core.store_id or ""), now)

    def _hint_original(self) -> None:
        """With the default dialect, a server that never beats but numbers in decimal is
        most likely the original implementation: say so, once."""
        if self._hinted or self._heartbeat_seen or not self._decimal_seen:
            return
        if self.dialect is Dialect.SPEC:
            self._hinted = True
            log.warn(
                "{server} sends decimal sequences and no heartbeat: it looks like the original "
                "Node.js Event BUS; use dialect='original' (--dialect original)",
                server=self.server,
            )

    def _deliver(self, event: Event) -> None:
        self.on_event(event)
        if self._waiters:
            ready = [w for w in self._waiters if w[0] <= event.sequence]
            for waiter in ready:
                self._waiters.remove(waiter)
                waiter[1].callback(event.sequence)

    def _on_published(self, batch: list[list[bytes]]) -> None:
        self._last_heard = self.reactor.seconds()
        core = self.core
        for frames in batch:
            try:
                message = codec.parse_published(frames)
            except EventBusError as error:
                self.drops.drop(error.reason, str(error))
                continue
            if isinstance(message, Heartbeat):
                self._heartbeat_seen = True
                self.heartbeat_at = self._last_heard
                core.on_heartbeat(message, self._last_heard)
            else:
                if not self._heartbeat_seen and frames[1].isdigit():
                    self._decimal_seen = True
                core.on_broadcast(message)

    def _on_snapshot_reply(self, batch: list[list[bytes]]) -> None:
        self._last_heard = self._snapshot_activity = self.reactor.seconds()
        if self.heartbeat_timeout is not None:
            self._snapshot_patience = self.heartbeat_timeout
        core = self.core
        for frames in batch:
            try:
                message = codec.parse_snapshot_reply(frames)
            except EventBusError as error:
                self.drops.drop(error.reason, str(error))
                continue
            if isinstance(message, Event):
                core.on_sync(message)
            else:
                core.on_sync_end(message)

    def wait_for(self, sequence: int) -> defer.Deferred[int]:
        """A Deferred that fires once an event at or above ``sequence`` was delivered."""
        d: defer.Deferred[int] = defer.Deferred()
        if self.core.last >= sequence:
            d.callback(self.core.last)
        else:
            self._waiters.append((sequence, d))
        return d


class EventBusPublisher:
    """Publishes events to a bus's collector. ``publish`` never blocks: when ZeroMQ's
    queue is full the event waits in a local queue, drained as the socket frees up;
    ``flush()`` fires when everything was handed to ZeroMQ.

    Given several servers (the two halves of a pair), it sends to one at a time and moves
    to the next once it has had no connection for ``failover_after`` seconds; meanwhile
    events wait in the local queue (ZMQ_IMMEDIATE: none wait in a pipe to a server that
    is gone). A pair's passive hands what it receives to its active. ``curve``: connect
    as a CURVE client (servers run with ``--server-cert``)."""

    RETRY_DELAY = 0.005

    def __init__(
        self,
        server: str | ServerAddress | Sequence[str | ServerAddress],
        producer_id: str,
        *,
        reactor: Any = None,
        factory: SocketFactory | None = None,
        send_hwm: int = 10_000,
        linger_ms: int = 5000,
        dialect: Dialect | str = Dialect.SPEC,
        failover_after: float = 1.0,
        curve: ClientCurve | None = None,
    ) -> None:
        servers = [server] if isinstance(server, str | ServerAddress) else list(server)
        if not servers:
            raise ValueError("at least one server address is needed")
        self.servers = [ServerAddress.parse(s) for s in servers]
        self.server = self.servers[0]
        self.failovers = 0
        self.producer = producer_id.encode("utf-8")
        self._frames = Dialect(dialect).pub
        self._io = _Sockets(reactor, factory, curve)
        self.reactor: Any = self._io.reactor
        several = len(self.servers) > 1
        # With several servers, ZMTP heartbeats also drop a connection to a server whose
        # process stopped (TCP alone would keep it up), so the publisher moves on.
        beat_ms = max(int(failover_after * 1000 / 4), 50)
        self._socket_options = SocketOptions(
            send_hwm=send_hwm,
            linger_ms=linger_ms,
            immediate=several,
            heartbeat_ms=beat_ms if several else 0,
            heartbeat_timeout_ms=int(failover_after * 1000) if several else 0,
        )
        self._failover_after = failover_after
        self._link: _Connection | None = None
        self._socket = self._open()
        self._periodic = Periodic(self.reactor, log)
        if len(self.servers) > 1:
            self._periodic.every(max(failover_after / 4, 0.05), self._check_connected)
        self._queue: deque[list[bytes]] = deque()
        self._retry: DelayedCall | None = None
        self._flushes: list[defer.Deferred[None]] = []
        self.published = 0

    def _open(self) -> ZmqSocket:
        sock = self._io.socket(zmq.DEALER, None, self._socket_options, name="publisher")
        self._link = (
            _Connection(sock, self._failover_after, self.reactor.seconds())
            if len(self.servers) > 1
            else None
        )
        sock.connect(self.server.collector)
        return sock

    def _check_connected(self) -> None:
        if self._link is None:
            return
        if self._link.down_for(self.reactor.seconds()) >= self._failover_after:
            previous = self.server
            self.server = self.servers[(self.servers.index(previous) + 1) % len(self.servers)]
            self.failovers += 1
            log.warn(
                "publisher: no connection to {previous} for {seconds:.1f}s: switching to "
                "{server} ({pending} events queued)",
                previous=previous,
                seconds=self._failover_after,
                server=self.server,
                pending=len(self._queue),
            )
            self._socket.shutdown()
            self._socket = self._open()
            self._schedule()

    def publish(
        self,
        topic: str,
        value: Any,
        *,
        timestamp: str | None = None,
        event_id: str | None = None,
    ) -> str:
        """Queue one event; returns its UUID."""
        identifier, frames = self.event_frames(topic, value, timestamp=timestamp, event_id=event_id)
        self.publish_frames(frames)
        return identifier

    def event_frames(
        self,
        topic: str,
        value: Any,
        *,
        timestamp: str | None = None,
        event_id: str | None = None,
    ) -> tuple[str, list[bytes]]:
        """An event's uuid (``event_id``, else a new one) and its PUB, not yet sent."""
        identifier = event_id or str(uuid.uuid4())
        frames = self._frames(
            topic.encode("utf-8"),
            self.producer,
            timestamp.encode("ascii") if timestamp else codec.iso_timestamp(),
            identifier.encode("ascii"),
            msgpack.packb(value, use_bin_type=True),
        )
        return identifier, frames

    def publish_frames(self, frames: list[bytes]) -> None:
        """Send a PUB made by :meth:`event_frames`, or queue it behind those waiting for the
        socket."""
        if self._queue or not self._socket.send_frames(frames):
            self._queue.append(frames)
            self._schedule()
        else:
            self.published += 1

    def _schedule(self) -> None:
        if self._retry is None:
            self._retry = self.reactor.callLater(self.RETRY_DELAY, self._drain)

    def _drain(self) -> None:
        self._retry = None
        if self._socket.closed:
            return
        queue = self._queue
        while queue and self._socket.send_frames(queue[0]):
            queue.popleft()
            self.published += 1
        if queue:
            self._schedule()
            return
        flushes, self._flushes = self._flushes, []
        for d in flushes:
            d.callback(None)

    @property
    def pending(self) -> int:
        """PUBs queued, waiting for the socket to take them."""
        return len(self._queue)

    def flush(self) -> defer.Deferred[None]:
        """A Deferred that fires once every queued PUB was handed to ZeroMQ."""
        d: defer.Deferred[None] = defer.Deferred()
        if not self._queue:
            d.callback(None)
        else:
            self._flushes.append(d)
        return d

    def close(self) -> None:
        """Close the socket; ZeroMQ keeps trying to deliver for ``linger_ms``."""
        self._periodic.stop_all()
        if self._retry is not None and self._retry.active():
            self._retry.cancel()
        self._retry = None
        self._socket.shutdown()
        self._io.close()
