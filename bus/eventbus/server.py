"""The Event BUS server: SNAPSHOT (ROUTER) on P, PUBLISHER (PUB) on P+1, COLLECTOR (ROUTER) on P+2.

Flow of an event: COLLECTOR reads a batch (budgeted) -> codec validates each PUB ->
the store assigns sequences and commits the batch (group commit per reactor turn) ->
the PUB socket broadcasts them. Nothing is broadcast before it is committed.
"""

from __future__ import annotations

import json
import os
import random
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

import zmq
from twisted.application.service import Service
from twisted.internet import defer, threads
from twisted.logger import Logger
from twisted.python.failure import Failure

from bus.droplog import DropCounter
from bus.eventbus import codec
from bus.eventbus.codec import EventBusError
from bus.eventbus.config import EventBusConfig
from bus.eventbus.snapshots import SnapshotScheduler, SnapshotStream
from bus.eventbus.store import EventStore
from bus.periodic import Periodic
from bus.transport.zmqsocket import (
    SocketFactory,
    SocketOptions,
    ZmqSocket,
    reactor_of,
)

log = Logger(namespace="bus.eventbus")

_BIND_ATTEMPTS = 50


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
        self.store: EventStore
        self.snapshot_socket: ZmqSocket | None = None
        self.publisher_socket: ZmqSocket | None = None
        self.collector_socket: ZmqSocket | None = None
        self._snapshot_monitor: ZmqSocket | None = None
        self.port = config.port
        self.endpoints: dict[str, str] = {}
        self.drops = DropCounter(log, "message", clock)
        self.accepted = 0
        self.snapshots: SnapshotScheduler
        self.max_lag = 0.0
        self._lag_expected = 0.0
        self._factory: SocketFactory | None = None
        self._periodic = Periodic(self.reactor, log)
        self._retention_task: Any = None
        self._started_at = 0.0
        self._stopping: defer.Deferred[None] | None = None
        self._checkpointing: defer.Deferred[Any] | None = None

    # -- lifecycle -----------------------------------------------------------------------

    def startService(self) -> None:
        config = self.config
        self.store = EventStore(
            config.data_dir,
            durability=config.durability,
            topic_index=config.retention.latest_per_topic,
        )
        self.snapshots = SnapshotScheduler(
            self.reactor, self.store, config, lambda: self.snapshot_socket
        )
        try:
            self._factory = SocketFactory(self.reactor)
            self._bind_all()
        except BaseException:
            self._close_sockets()
            self.store.close()
            raise
        Service.startService(self)
        self._started_at = self.clock()
        every = self._periodic.every
        if config.heartbeat_interval > 0:
            every(config.heartbeat_interval, self._heartbeat, now=True)
        if config.stats_interval > 0:
            self._write_status()
            every(config.stats_interval, self._report)
        if config.retention.enabled and config.retention_interval > 0:
            every(config.retention_interval, self._start_retention, now=True)
        every(config.checkpoint_interval, self._checkpoint)
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

    def _bind_all(self) -> None:
        assert self._factory is not None
        config = self.config
        if config.port:
            self._open_sockets(config.port)
            return
        rng = random.Random()
        for _ in range(_BIND_ATTEMPTS):
            base = rng.randrange(20000, 60000)
            try:
                self._open_sockets(base)
                return
            except zmq.ZMQError as error:
                if error.errno != zmq.EADDRINUSE:
                    raise
                self._close_sockets(keep_factory=True)
        raise RuntimeError("no free port triple found")

    def _open_sockets(self, port: int) -> None:
        assert self._factory is not None
        config = self.config
        keepalive = config.tcp_keepalive_idle
        host = config.bind
        self.snapshot_socket = self._factory.socket(
            zmq.ROUTER,
            self._on_snapshot_requests,
            SocketOptions(
                send_hwm=config.snapshot_hwm,
                send_buffer=config.snapshot_send_buffer,
                receive_hwm=1000,
                router_mandatory=True,
                tcp_keepalive_idle=keepalive,
                max_message_size=codec.MAX_SUBTREE_SPEC_BYTES + 1024,
                linger_ms=0,
            ),
            read_budget=config.read_budget,
            name="snapshot",
        )
        self.publisher_socket = self._factory.socket(
            zmq.PUB,
            None,
            SocketOptions(send_hwm=config.publish_hwm, tcp_keepalive_idle=keepalive),
            name="publisher",
        )
        self.collector_socket = self._factory.socket(
            zmq.ROUTER,
            self._on_collected,
            SocketOptions(
                receive_hwm=config.collector_hwm,
                tcp_keepalive_idle=keepalive,
                max_message_size=config.max_data_bytes + codec.MAX_TOPIC_BYTES + 4096,
                linger_ms=0,
            ),
            read_budget=config.read_budget,
            name="collector",
        )
        self.endpoints = {
            "snapshot": self.snapshot_socket.bind(f"tcp://{host}:{port}"),
            "publisher": self.publisher_socket.bind(f"tcp://{host}:{port + 1}"),
            "collector": self.collector_socket.bind(f"tcp://{host}:{port + 2}"),
        }
        self.port = port
        self.snapshot_socket.on_signal = self.snapshots.writable
        self._monitor_snapshot_clients()

    def _monitor_snapshot_clients(self) -> None:
        """Learn when snapshot clients disconnect: the memory of their pipes is free then."""
        assert self._factory is not None and self.snapshot_socket is not None
        address = f"inproc://eventbus-snapshot-monitor-{id(self):x}-{self.port}"
        self.snapshot_socket.socket.monitor(address, zmq.EVENT_DISCONNECTED)
        self._snapshot_monitor = self._factory.socket(
            zmq.PAIR,
            lambda events: self.snapshots.client_left(),
            SocketOptions(tcp_keepalive_idle=None, linger_ms=0),
            name="snapshot-monitor",
        )
        self._snapshot_monitor.connect(address)

    def _close_sockets(self, keep_factory: bool = False) -> None:
        sockets = (
            self._snapshot_monitor,
            self.snapshot_socket,
            self.publisher_socket,
            self.collector_socket,
        )
        for sock in sockets:
            if sock is not None:
                sock.shutdown()
        self.snapshot_socket = self.publisher_socket = self.collector_socket = None
        self._snapshot_monitor = None
        if not keep_factory and self._factory is not None:
            self._factory.shutdown()
            self._factory = None

    def stopService(self) -> defer.Deferred[None]:
        if self._stopping is not None:
            return self._stopping
        Service.stopService(self)
        self._periodic.stop_all()
        if self._retention_task is not None:
            self._retention_task.stop()
            self._retention_task = None
        self.snapshots.stop()
        self._drain_collector()
        self._close_sockets()
        self._stopping = defer.Deferred()
        # The store closes once a checkpoint running in its thread is done.
        running = self._checkpointing or defer.succeed(None)
        running.addBoth(lambda _: self._close_store())
        return self._stopping

    def _close_store(self) -> None:
        self.store.close()
        log.info("event bus stopped at sequence {sequence}", sequence=self.store.last_sequence)
        assert self._stopping is not None
        self._stopping.callback(None)

    def _drain_collector(self, limit: int = 1_000_000) -> None:
        """Store and broadcast what the collector already holds, so a clean stop loses
        nothing that reached this process."""
        sock = self.collector_socket
        if sock is None or sock.closed:
            return
        recv = sock.socket.recv_multipart
        drained = 0
        while drained < limit:
            batch: list[list[bytes]] = []
            try:
                while len(batch) < self.config.read_budget:
                    batch.append(recv(zmq.NOBLOCK))
            except zmq.Again:
                self._on_collected(batch)
                return
            self._on_collected(batch)
            drained += len(batch)

    # -- the collector: PUB in, store, BROADCAST out ------------------------------------------

    def _on_collected(self, batch: list[list[bytes]]) -> None:
        parse = codec.parse_pub_fields
        max_data = self.config.max_data_bytes
        accepted: list[codec.EventFields] = []
        for frames in batch:
            body = frames[1:]
            if len(body) == 7 and not body[0]:
                body = body[1:]  # a REQ-style empty delimiter
            try:
                accepted.append(parse(body, max_data))
            except EventBusError as error:
                self.drops.drop(error.reason, str(error), frames[0])
        if not accepted:
            return
        # Committed before anything is broadcast: a subscriber never sees an event
        # that a crash could take back.
        first = self.store.append_fields(accepted, self.clock())
        self.accepted += len(accepted)
        pub = self.publisher_socket
        if pub is not None:
            pub.send_many(codec.broadcast_messages(first, accepted, self.config.sequence_encoding))

    # -- the snapshot port: SYNCSTART in, SYNC... SYNCEND out ------------------------------

    def _on_snapshot_requests(self, batch: list[list[bytes]]) -> None:
        for frames in batch:
            try:
                request = codec.parse_sync_start(frames[1:])
            except EventBusError as error:
                self.drops.drop(error.reason, str(error), frames[0])
                continue
            self.snapshots.request(frames[0], request)

    @property
    def streams(self) -> set[SnapshotStream]:
        """The snapshot streams running now."""
        return self.snapshots.streams

    @property
    def snapshots_served(self) -> int:
        return self.snapshots.served

    @property
    def snapshots_aborted(self) -> int:
        return self.snapshots.aborted

    # -- periodic work ---------------------------------------------------------------------

    def _heartbeat(self) -> None:
        pub = self.publisher_socket
        if pub is not None and not pub.closed:
            pub.send_frames(
                codec.heartbeat_frames(
                    self.store.last_sequence, self.store.store_id, self.config.sequence_encoding
                )
            )

    def _checkpoint(self) -> None:
        """Move the WAL into the database on a worker thread (SQLite releases the GIL)."""
        if self._checkpointing is not None:
            return

        def done(result: Any) -> None:
            self._checkpointing = None
            if isinstance(result, Failure):
                log.failure("WAL checkpoint failed", result)

        self._checkpointing = threads.deferToThreadPool(
            self.reactor, self.reactor.getThreadPool(), self.store.checkpoint
        )
        self._checkpointing.addBoth(done)

    def _measure_lag(self) -> None:
        now = self.reactor.seconds()
        self.max_lag = max(self.max_lag, now - self._lag_expected)
        self._lag_expected = now + 0.01

    def _start_retention(self) -> None:
        if self._retention_task is not None:
            return  # the previous pass is still running
        from twisted.internet.task import Cooperator

        cooperator = Cooperator(scheduler=lambda work: self.reactor.callLater(0, work))
        self._retention_task = cooperator.cooperate(self._retention_steps())

    def _retention_steps(self) -> Any:
        retention = self.config.retention
        deleted = 0
        try:
            if retention.max_age is not None:
                cutoff = self.clock() - retention.max_age
                while (n := self.store.expire_older_than(cutoff)) > 0:
                    deleted += n
                    yield None
            if retention.max_count is not None:
                while (n := self.store.trim_to_count(retention.max_count)) > 0:
                    deleted += n
                    yield None
            if retention.latest_per_topic:
                while True:
                    n, finished = self.store.compact_step()
                    deleted += n
                    if finished:
                        break
                    yield None
        finally:
            self._retention_task = None
        if deleted:
            log.info("retention removed {deleted} events", deleted=deleted)

    def status(self) -> dict[str, Any]:
        """What the bus is doing, for logs, status.json and tests."""
        snapshots = self.snapshots
        return {
            "store_id": self.store.store_id,
            "sequence": self.store.last_sequence,
            "accepted": self.accepted,
            "dropped": dict(self.drops.counts),
            "snapshots_served": snapshots.served,
            "snapshots_aborted": snapshots.aborted,
            "snapshots_stalled": snapshots.stalled,
            "snapshots_queued": snapshots.queued,
            "snapshots_refused": snapshots.refused,
            "snapshots_active": len(snapshots.streams),
            "snapshots_waiting": len(snapshots.waiting),
            "snapshot_messages_sent": snapshots.messages_sent,
            "max_timer_lag_ms": round(self.max_lag * 1000, 3),
            "uptime_s": round(self.clock() - self._started_at, 3),
            "endpoints": self.endpoints,
            "config": {k: str(v) for k, v in asdict(self.config).items()},
        }

    def _report(self) -> None:
        status = self.status()
        log.info(
            "sequence {sequence}; accepted {accepted}; dropped {dropped}; snapshots "
            "{snapshots_served} served, {snapshots_active} active; max timer lag "
            "{max_timer_lag_ms} ms",
            **{k: v for k, v in status.items() if k != "config"},
        )
        self.max_lag = 0.0
        self._write_status(status)

    def _write_status(self, status: dict[str, Any] | None = None) -> None:
        try:
            write_json_atomically(
                Path(self.config.data_dir) / "status.json", status or self.status()
            )
        except OSError as error:
            log.warn("cannot write status.json: {error}", error=error)


def write_json_atomically(path: Path, value: Any) -> None:
    temporary = path.with_suffix(".tmp")
    with open(temporary, "w") as out:
        json.dump(value, out, indent=1, sort_keys=True)
    os.replace(temporary, path)
