"""The Event BUS server: SNAPSHOT (ROUTER) on P, PUBLISHER (PUB) on P+1, COLLECTOR (ROUTER) on P+2.

Flow of an event: COLLECTOR reads a batch (budgeted) -> codec validates each PUB ->
the store assigns sequences and commits the batch (group commit per reactor turn) ->
the PUB socket broadcasts them. Nothing is broadcast before it is committed. Half of a
primary/backup pair (``config.pair``, :mod:`bus.eventbus.pair`), the bus releases a stored
batch (broadcast, snapshots, heartbeats all stop at ``released``) only as the pair allows,
and serves nobody while it is not the active.

When the store cannot write (a full disk), the batch it refused waits in memory (one read
batch), the collector stops reading (ZeroMQ queues up to its receive HWM, then publishers
feel backpressure), and a timer retries the batch with backoff until it is stored; then
the collector reads again. One rate-limited error line says so, one line says when it
recovers, and ``refused_storage`` counts the events that had to wait.

The core decides (:mod:`bus.eventbus.core`: what is stored, broadcast, held, retried when,
what a key may receive); the log's checkpoints, retention and close are the store's
(:class:`bus.eventbus.upkeep.LogUpkeep`). This service reads the sockets into them, sends
what they produced, and keeps the timers.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import zmq
from twisted.application.service import Service
from twisted.internet import defer
from twisted.internet.base import DelayedCall
from twisted.logger import Logger

from bus.application.contract import Action, ActionRefused
from bus.application.statusjson import config_json
from bus.eventbus import codec
from bus.eventbus.config import EventBusConfig, PortSocket
from bus.eventbus.core import Broadcast, EventBusCore, Watcher, Watchers
from bus.eventbus.eventlog import PairLog
from bus.eventbus.pair import Pair
from bus.eventbus.snapshots import SnapshotScheduler
from bus.eventbus.store import EventStore
from bus.eventbus.upkeep import LogUpkeep
from bus.extension import (
    Metric,
    SocketFactory,
    StartupError,
    StorageError,
    ZmqSocket,
    counter,
    gauge,
    gauges_by,
    reactor_of,
)
from bus.transport.curve import ClientCurve
from bus.transport.security import ServerCurve
from bus.transport.serving import ServerPorts
from bus.transport.zmqsocket import bind_consecutive
from bus.util.droplog import RateLimit
from bus.util.files import write_status_json
from bus.util.metrics import wal_metrics

#: Snapshot clients ``/status`` lists (the longest running first).
_LISTED_SNAPSHOT_CLIENTS = 20

log = Logger(namespace="bus.eventbus")


class EventBusService(Service):
    """The bus as a Twisted service. ``stopService`` drains what the collector already
    received, stores and broadcasts it, then closes sockets and the store."""

    name = "eventbus"

    def __init__(
        self,
        config: EventBusConfig,
        reactor: Any = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.config = config
        self.reactor: Any = reactor_of(reactor)
        self.clock = clock
        self.snapshot_socket: ZmqSocket | None = None
        self.publisher_socket: ZmqSocket | None = None
        self.collector_socket: ZmqSocket | None = None
        self.port = config.port
        self.endpoints: dict[str, str] = {}
        #: The rules (sans I/O): made at start, with the log it stores into.
        self.core: EventBusCore[PairLog]
        self._local_flush: DelayedCall | None = None
        self.snapshots: SnapshotScheduler
        self.max_lag = 0.0
        self._lag_expected = 0.0
        self._started_at = 0.0
        self._stopping: defer.Deferred[None] | None = None
        #: The log's checkpoints, retention passes and close (into whichever log the core has).
        self.upkeep = LogUpkeep(
            self.reactor, lambda: self.core.log, config.retention, clock=clock, logger=log
        )
        #: Where the product serves ``/status`` (``host:port``), if it does: recorded in
        #: status.json, so that ``eventbus-cli status --data-dir`` finds this process.
        self.status_address: Callable[[], str | None] = lambda: None
        #: The retry of events the log refused (when: the core says).
        self._retry: DelayedCall | None = None
        self._faults = RateLimit(clock)
        #: Half of a primary/backup pair (None: a server alone).
        self.pair: Pair | None = None
        #: CURVE on the three ports and the pair link (``--server-cert``), and what each
        #: client key may publish and receive (``--client-certs``, :mod:`bus.eventbus.rights`).
        self.curve = ServerCurve("eventbus", config.curve, clock, policy=self._may_connect)
        #: CURVE, the socket factory and the periodic work, as every server keeps them.
        self.ports = ServerPorts(self.reactor, self.curve, log)
        self._rights = config.curve.client_certs is not None
        #: Whether PUBs are checked against their key's publish subtrees: only while some
        #: certificate of the allow-list names ``publish`` (reading each message's User-Id
        #: and looking its rights up is a cost on the collector's hot path).
        self._publish_rights = False
        self.curve.on_reload.append(self._rights_changed)
        #: Told every batch broadcast (see :meth:`watch`).
        self.watchers = Watchers(log)

    # -- lifecycle -----------------------------------------------------------------------

    def startService(self) -> None:
        """Open the log, bind the ports (a StartupError names the option), start the timers."""
        config = self.config
        try:
            store = EventStore(
                config.data_dir, config.durability, config.wal_limit, config.secure_delete
            )
        except StorageError as error:
            raise StartupError("data-dir", f"cannot open the event log: {error}") from None
        if store.migrated:
            log.info(
                "event log {path}: moved {count} events of an older release's log (a row per "
                "event) into batches; earlier releases cannot read it now",
                path=str(store.path),
                count=store.migrated,
            )
        self.core = EventBusCore.of_bus(store, config, clock=self.clock, logger=log)
        self.core.woken = self._pair_acted
        self.snapshots = SnapshotScheduler(
            self.reactor,
            store,
            config,
            lambda: self.snapshot_socket,
            released=lambda: self.core.released,
        )
        self.ports.open(self._open_ports, undo=self._undo_start)
        Service.startService(self)
        self.ports.announce(config.bind, self.endpoints.values())
        self.upkeep.start()
        self._started_at = self.clock()
        every = self.ports.periodic.every
        if config.heartbeat_interval > 0:
            every(config.heartbeat_interval, self._heartbeat, now=True)
        if config.stats_interval > 0:
            self._write_status()
            every(config.stats_interval, self._report)
        if config.retention.enabled and config.retention_interval > 0:
            every(config.retention_interval, self.upkeep.retain, now=True)
        every(config.checkpoint_interval, self.upkeep.checkpoint)
        self._lag_expected = self.reactor.seconds() + 0.01
        every(0.01, self._measure_lag)
        log.info(
            "event bus serving snapshot {snapshot}, publisher {publisher}, collector "
            "{collector}; store {path} at sequence {sequence}",
            snapshot=self.endpoints["snapshot"],
            publisher=self.endpoints["publisher"],
            collector=self.endpoints["collector"],
            path=str(self.store.path),
            sequence=self.store.last_sequence,
        )

    def _open_ports(self, factory: SocketFactory) -> None:
        self._rights_changed()
        config = self.config
        # Port 0: P, P+1 and P+2 free at some random P (another process may hold P+1).
        bind_consecutive(
            self._open_sockets, self._close_sockets, base=config.port, count=3, host=config.bind
        )
        if self.config.pair is not None:
            self._start_pair()

    def _undo_start(self) -> None:
        if self.pair is not None:
            self.pair.stop()
        self._close_sockets()
        self.store.close()

    def _start_pair(self) -> None:
        assert self.ports.factory is not None
        self.pair = Pair.of_bus(
            self.core,
            self.config,
            base_port=self.port,
            reactor=self.reactor,
            factory=self.ports.factory,
            clock=self.clock,
            curve=self.curve,
        )
        self.core.pair = self.pair
        self.pair.start()  # a StartupError names --ha-port
        self.endpoints["pair"] = self.pair.endpoint

    def _open_sockets(self, port: int) -> None:
        """Open the three ports' sockets as the settings make them, bound to P, P+1, P+2."""
        rights_on = self._rights
        snapshot, publisher, collector = self.config.port_sockets(
            rights=rights_on, publish_rights=self._publish_rights
        )
        self.snapshot_socket = self._socket(snapshot, self._on_snapshot_requests)
        self.publisher_socket = self._socket(
            publisher, self._on_subscriptions if rights_on else None
        )
        self.collector_socket = self._socket(collector, self._on_collected)
        self.endpoints = {
            name: sock.bind(f"tcp://{self.config.bind}:{port + offset}")
            for offset, (name, sock) in enumerate(self._sockets())
        }
        self.port = port
        self.snapshot_socket.on_signal = self.snapshots.writable
        # A snapshot client gone frees the memory of its pipe: the scheduler hears of it.
        self.snapshot_socket.watch_connections(zmq.EVENT_DISCONNECTED, self._snapshot_event)
        self.publisher_socket.watch_connections(zmq.EVENT_ACCEPTED, self._subscriber_event)
        self.collector_socket.watch_connections()

    def _socket(self, port: PortSocket, on_messages: Callable[..., None] | None) -> ZmqSocket:
        assert self.ports.factory is not None
        options, budget = port.options, port.read_budget
        sock = self.ports.factory.socket(port.kind, on_messages, options, budget, port.name)
        if port.manual_subscriptions:
            sock.socket.set(zmq.XPUB_MANUAL, 1)
        self.curve.secure(sock, f"eventbus-{port.name}")
        return sock

    def _sockets(self) -> list[tuple[str, ZmqSocket]]:
        """The ports' sockets open now, by name, in port order."""
        sockets = (
            ("snapshot", self.snapshot_socket),
            ("publisher", self.publisher_socket),
            ("collector", self.collector_socket),
        )
        return [(name, sock) for name, sock in sockets if sock is not None]

    # -- what a client key may do (CURVE with --client-certs) -------------------------------

    def _may_connect(self, domain: str, key: bytes, metadata: Any) -> str | None:
        # The pair link takes only the other half's key; the client ports take the
        # allow-list's keys (or any key without one), whose rights apply per message.
        if domain == "eventbus-pair":
            return None if self.pair is not None and key == self.pair.peer_key() else "not-peer"
        return None

    def _on_subscriptions(self, batch: list[list[bytes]]) -> None:
        sock = self.publisher_socket
        if sock is None or sock.socket is None:
            return
        user_ids = sock.peer_user_ids
        for index, frames in enumerate(batch):
            user_id = user_ids[index] if index < len(user_ids) else ""
            wanted = self.core.subscription(frames[0], user_id)
            if wanted is not None:
                subscribe, prefixes = wanted
                apply = sock.socket.subscribe if subscribe else sock.socket.unsubscribe
                for prefix in prefixes:
                    apply(prefix)

    def _subscriber_event(self, event: int) -> None:
        # A subscriber connecting to a server that is not active turned to it: a vote.
        if event & zmq.EVENT_ACCEPTED and self.pair is not None:
            self.pair.vote()

    def _snapshot_event(self, event: int) -> None:
        if event & zmq.EVENT_DISCONNECTED:
            self.snapshots.client_left()

    def connections(self) -> dict[str, int]:
        """TCP peers connected now, by socket."""
        return {name: sock.connections for name, sock in self._sockets()}

    def _close_sockets(self) -> None:
        for _, sock in self._sockets():
            sock.shutdown()
        self.snapshot_socket = self.publisher_socket = self.collector_socket = None

    def stopService(self) -> defer.Deferred[None]:
        """Store and broadcast what was received, close the sockets, then the log; fires
        once it is closed (the same Deferred to every call)."""
        if self._stopping is not None:
            return self._stopping
        Service.stopService(self)
        self.ports.periodic.stop_all()
        if self.pair is not None:
            self.pair.tick()
        self.snapshots.stop()
        if self._retry is not None and self._retry.active():
            self._retry.cancel()
        self._retry = None
        core = self.core
        if core.waiting:
            core.retry_waiting()  # one last attempt, no more
            self._carry_out()
        if not core.waiting:
            self._drain_collector()
            self._flush_local()
        if core.waiting:
            log.error(
                "stopping with {count} received events not stored ({error}): they were "
                "never broadcast",
                count=len(core.waiting),
                error=core.storage_error,
            )
        if self.pair is not None:
            self.pair.stop()
        self._close_sockets()
        self.ports.close()
        self._stopping = self.upkeep.close(self.config.stop_timeout).addCallback(self._stopped)
        return self._stopping

    def _stopped(self, _: None) -> None:
        log.info("event bus stopped at sequence {sequence}", sequence=self.store.last_sequence)

    def _drain_collector(self, limit: int = 1_000_000) -> None:
        """Store and broadcast what the collector already holds, so a clean stop loses
        nothing that reached this process."""
        sock = self.collector_socket
        if sock is None or sock.closed:
            return
        # Read as the socket reads (each PUB's key with it, for its rights); once the store
        # refuses a batch, reading more would only pile it up in memory.
        sock.drain(limit, lambda: not self.core.waiting)

    # -- the collector: PUB in, store, BROADCAST out ------------------------------------------

    def _on_collected(self, batch: list[list[bytes]]) -> None:
        sock = self.collector_socket
        user_ids = sock.peer_user_ids if self._publish_rights and sock is not None else None
        self.core.collect(batch, user_ids)
        self._carry_out()

    def _rights_changed(self) -> None:
        """The allow-list was re-read: check PUBs against subtrees if a certificate names
        some now (between two reactor turns: no batch is half handled)."""
        self._publish_rights = self.curve.uses("publish")
        if self.collector_socket is not None:
            self.collector_socket.keep_user_ids = self._publish_rights
        self.core.use_rights(self.curve.rights, check_publish=self._publish_rights)

    def _carry_out(self) -> None:
        """Do what the core decided: broadcast what clients may see, in order; pause the
        collector while the core says so (and retry when it says while the log refuses)."""
        core = self.core
        if core.broadcasts:
            self._broadcast(core.take_broadcasts())
        self._read_collector_as_core_says()
        if core.waiting and self._retry is None:
            delay = core.next_retry()
            if self.running:
                self._retry = self.reactor.callLater(delay, self._retry_waiting)

    def _retry_waiting(self) -> None:
        self._retry = None
        self.core.retry_waiting()  # once stored, the collector is read again
        self._carry_out()

    def _read_collector_as_core_says(self) -> None:
        sock = self.collector_socket
        if sock is None:
            return
        if self.core.collector_paused:
            sock.pause_reading()
        elif sock.reading_paused and self.running:
            sock.resume_reading()

    def _broadcast(self, batches: list[Broadcast]) -> None:
        pub = self.publisher_socket
        encoding = self.config.sequence_encoding
        for batch in batches:
            if pub is not None:
                pub.send_many(codec.broadcast_messages(batch.first, batch.fields, encoding))
            if self.watchers.watchers:
                self.watchers.tell(batch)

    def watch(self, watcher: Watcher) -> Callable[[], None]:
        """Call ``watcher(first_sequence, fields)`` with every batch as it is broadcast, in
        this process (see :class:`bus.eventbus.core.Watchers`); returns the function that stops it."""
        return self.watchers.watch(watcher)

    # -- what the pair did through the core ---------------------------------------------------

    def _pair_acted(self) -> None:
        """The pair changed the core (a turn, a release, events forwarded, the collector
        held, the log replaced): serve, or stop serving, and send what is due."""
        core = self.core
        if self.snapshots.store is not core.log:
            self.snapshots.store = core.log  # replaced: snapshots read the new one
        turns = core.take_turns()
        for turn in turns:
            if turn.state == "active":
                self._heartbeat(turn.released)
        self._carry_out()
        for turn in turns:
            if turn.state == "active":
                # SYNCSTARTs held while it did not serve, whose clients still wait.
                assert self.config.pair is not None
                max_age = self.config.pair.failover_timeout * 2
                for identity, request in core.take_held_requests(max_age):
                    self.snapshots.request(identity, request)
            else:
                # Streams in progress end: their clients ask the active.
                self.snapshots.abandon_all()

    # -- in-process publishing: composed services' activity ---------------------------------

    def activity_sink(self, producer: str) -> LocalPublisher:
        """What composition hands another service of this process (see bus.application.activity)."""
        return LocalPublisher(self, producer)

    def client_curve(self) -> ClientCurve | None:
        """How a client in this process connects: with the bus's own key pair."""
        return self.curve.own_client()

    def client_addresses(self) -> list[str]:
        """``host:port`` a client in this process connects to."""
        host = "127.0.0.1" if self.config.bind in ("0.0.0.0", "*") else self.config.bind
        return [f"{host}:{self.port}"]

    def publish_activity(self, producer: bytes, topic: str, value: object) -> None:
        """Queue an event made in this process (see :meth:`EventBusCore.publish_activity`);
        the queue is stored and broadcast as one batch on the next reactor turn, like a
        batch read from the collector."""
        if self.core.publish_activity(producer, topic, value) and self._local_flush is None:
            self._local_flush = self.reactor.callLater(0, self._flush_local)

    def _flush_local(self) -> None:
        if self._local_flush is not None and self._local_flush.active():
            self._local_flush.cancel()
        self._local_flush = None
        self.core.flush_local()
        self._carry_out()

    # -- the snapshot port: SYNCSTART in, SYNC... SYNCEND out ------------------------------

    def _on_snapshot_requests(self, batch: list[list[bytes]]) -> None:
        sock = self.snapshot_socket
        user_ids = sock.peer_user_ids if sock is not None else []
        for index, frames in enumerate(batch):
            # Parsed, narrowed to the key's rights, or held while the pair does not serve.
            request = self.core.snapshot_request(frames, user_ids[index] if user_ids else None)
            if request is not None:
                self.snapshots.request(frames[0], request)

    # -- the log and its errors ----------------------------------------------------------------

    @property
    def store(self) -> PairLog:
        """The event log (the pair may replace it: always the core's)."""
        return self.core.log

    @property
    def storage_errors(self) -> int:
        """Failed store operations: appends (each attempt), checkpoints, retention steps,
        the final checkpoint at close."""
        return self.core.append_failures + self.upkeep.failures

    # -- periodic work ---------------------------------------------------------------------

    def _heartbeat(self, sequence: int | None = None) -> None:
        """Tell clients the highest sequence they may have (``released`` unless given)."""
        if self.pair is not None and not self.pair.serves():
            return  # silence tells clients to try the other server
        pub = self.publisher_socket
        if pub is not None and not pub.closed:
            pub.send_frames(
                codec.heartbeat_frames(
                    self.core.released if sequence is None else sequence,
                    self.store.store_id,
                    self.config.sequence_encoding,
                )
            )

    def _measure_lag(self) -> None:
        now = self.reactor.seconds()
        self.max_lag = max(self.max_lag, now - self._lag_expected)
        self._lag_expected = now + 0.01
        if self.pair is not None:
            self.pair.tick()

    #: The console's charts (see :mod:`bus.web.console.view`): events stored, snapshot traffic.
    console_rates = {"events": "sequence", "snapshot messages": "snapshot_messages_sent"}

    def actions(self) -> Mapping[str, Action]:
        """An operator's actions (see bus.web.actions): drop a snapshot client."""
        return {"drop-snapshot": self._drop_snapshot}

    def _drop_snapshot(self, params: Mapping[str, Any]) -> dict[str, Any]:
        """``{"client": HEX}`` (its ``snapshot_clients`` entry): its snapshot streams
        ended, its waiting requests forgotten."""
        if not self.running:
            raise ActionRefused(409, "the Event BUS is not running")
        client = params.get("client")
        try:
            identity = bytes.fromhex(client) if isinstance(client, str) else b""
        except ValueError:
            identity = b""
        if not identity or len(identity) > 255:
            raise ActionRefused(400, "client: a snapshot client's id (hex), as /status lists it")
        dropped = self.snapshots.drop_client(identity)
        if not dropped:
            raise ActionRefused(404, f"no snapshot of client {client} runs or waits")
        return {"client": client, "dropped": dropped}

    def status(self) -> dict[str, Any]:
        """What the bus is doing, for logs, status.json and tests."""
        core, store = self.core, self.store
        if self.pair is not None:
            self.pair.tick()
        return {
            "store_id": store.store_id,
            "sequence": store.last_sequence,
            "released": self.core.released,
            "ha": None if self.pair is None else self.pair.status(),
            **core.status(),
            "storage_errors": self.storage_errors,
            "storage_waiting": len(core.waiting),
            **self.upkeep.status(),
            **(store.wal_status().as_status() if isinstance(store, EventStore) else {}),
            "clients": self.connections(),
            **self.snapshots.status(),
            "snapshot_clients": self.snapshots.clients(_LISTED_SNAPSHOT_CLIENTS),
            "max_timer_lag_ms": round(self.max_lag * 1000, 3),
            "uptime_s": self._uptime(),
            "time": round(self.clock(), 3),
            "http": self.status_address(),
            "curve": {
                **self.curve.status(),
                "narrowed_subscriptions": core.narrowed_subscriptions,
                "narrowed_snapshots": core.narrowed_snapshots,
            },
            "endpoints": self.endpoints,
            "config": config_json(self.config),
        }

    def metrics(self) -> list[Metric]:
        """Prometheus families of the counters above (see bus.web.server)."""
        store = self.store
        return [
            *self.curve.metrics(),
            gauge("eventbus_sequence", "Highest sequence in the event log", store.last_sequence),
            *self.core.metrics(),
            counter(
                "eventbus_storage_errors",
                "Failed store operations (appends, checkpoints, retention)",
                self.storage_errors,
            ),
            *self.snapshots.metrics(),
            *self.upkeep.metrics(),
            *(wal_metrics("eventbus", store.wal_status()) if isinstance(store, EventStore) else []),
            gauges_by(
                "eventbus_connections",
                "TCP peers connected now, by socket",
                "socket",
                self.connections(),
            ),
            gauge(
                "eventbus_store_bytes", "Event log size on disk (database and WAL)", store.size()
            ),
            gauge(
                "eventbus_timer_lag_max_seconds",
                "Largest lateness of a 10 ms timer in the current stats window",
                self.max_lag,
            ),
            gauge("eventbus_uptime_seconds", "Seconds since the bus started", self._uptime()),
            gauge(
                "eventbus_released_sequence",
                "Highest sequence clients may see (in a pair: what the passive holds)",
                self.core.released,
            ),
            *(self.pair.metrics() if self.pair is not None else []),
        ]

    def _uptime(self) -> float:
        return round(self.clock() - self._started_at, 3)

    def _report(self) -> None:
        status = self.status()
        log.info(
            "sequence {sequence}; accepted {accepted}; dropped {dropped}; refused (storage) "
            "{refused_storage}; clients {clients}; snapshots {snapshots_served} served, "
            "{snapshots_active} active; max timer lag {max_timer_lag_ms} ms",
            **{k: v for k, v in status.items() if k != "config"},
        )
        self.max_lag = 0.0
        self._write_status(status)

    def _write_status(self, status: dict[str, Any] | None = None) -> None:
        try:
            write_status_json(Path(self.config.data_dir) / "status.json", status or self.status())
        except OSError as error:
            failures = self._faults.due("status")
            if failures is not None:
                log.warn(
                    "cannot write status.json: {error} ({failures} failures since the last report)",
                    error=error,
                    failures=failures,
                )


class LocalPublisher:
    """An :class:`bus.application.activity.ActivitySink` on a bus of the same process: events go into
    its log under the next sequences, with no socket between."""

    def __init__(self, bus: EventBusService, producer: str) -> None:
        self._bus = bus
        self.producer = producer.encode("utf-8")

    def publish(self, topic: str, value: object) -> None:
        """Queue ``value`` under ``topic`` (ValueError when it cannot be an event)."""
        self._bus.publish_activity(self.producer, topic, value)
