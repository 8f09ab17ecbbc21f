"""Event BUS server settings (plain data: no sockets, no reactor)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Literal

import zmq

from bus.eventbus.codec import (
    DEFAULT_MAX_DATA_BYTES,
    MAX_SUBTREE_SPEC_BYTES,
    MAX_TOPIC_BYTES,
    SequenceEncoding,
)
from bus.eventbus.store import Retention
from bus.extension import CurveSettings
from bus.nats.settings import NatsSettings
from bus.util.sqlitewal import DEFAULT_WAL_LIMIT, Durability

if TYPE_CHECKING:  # txZMQ's socket module: not for the settings Spark's executors read
    from bus.extension import SocketOptions

SyncEndSequence = Literal["highest", "current"]
Replication = Literal["sync", "async"]

DEFAULT_BIND = "127.0.0.1"
DEFAULT_PORT = 5556
DEFAULT_DATA_DIR = "eventbus-data"
#: Messages the snapshot ROUTER queues per client (see EventBusConfig.snapshot_hwm).
DEFAULT_SNAPSHOT_HWM = 500


@dataclass(frozen=True, slots=True)
class PairConfig:
    """One half of a primary/backup pair (see docs/eventbus.md, "A primary/backup pair")."""

    role: Literal["primary", "backup"]
    #: The peer's link endpoint, host:port (its ``--ha-port``).
    peer: str
    #: Our link port (0: the base port + 3).
    port: int = 0
    replication: Replication = "sync"
    #: A passive takes over once the active was silent this long and a client turned to it.
    failover_timeout: float = 1.0
    #: An active whose passive takes no event for this long goes on without it.
    alone_timeout: float = 1.0
    #: async: events the active may broadcast ahead of the passive's acknowledgement (the
    #: loss window at a failover); a new active steps its sequence over it.
    async_window: int = 10_000
    #: The other half's public key (Z85) when the link speaks CURVE; None: the same key
    #: pair as this server's (both halves given one --server-cert).
    peer_key: bytes | None = None

    def __post_init__(self) -> None:
        if self.failover_timeout <= 0 or self.alone_timeout <= 0:
            raise ValueError("ha_failover_timeout and ha_alone_timeout must be positive")
        if self.async_window < 1:
            raise ValueError("ha_async_window must be at least 1")

    @property
    def window(self) -> int:
        """Events broadcast ahead of the passive at most, while paired."""
        return self.async_window if self.replication == "async" else 0

    @property
    def beat_interval(self) -> float:
        """Seconds between ``STATE`` beats: a quarter of the shorter timeout."""
        return min(self.failover_timeout, self.alone_timeout) / 4


@dataclass(frozen=True, slots=True)
class JetStreamSettings(NatsSettings):
    """Where the stream is and how it is made (see docs/cluster.md)."""

    stream: str = "EVENTBUS"
    subject_prefix: str = "eventbus"


@dataclass(frozen=True, slots=True)
class PortSocket:
    """What one of the three ports' sockets is, as the settings make it
    (:meth:`EventBusConfig.port_sockets`): plain data, opened by the service."""

    #: ``snapshot``, ``publisher`` or ``collector`` (the socket's name, its ZAP domain's tail).
    name: str
    #: The ZeroMQ socket type.
    kind: int
    options: SocketOptions
    #: Messages read per reactor turn.
    read_budget: int
    #: XPUB_MANUAL: the server applies each subscription itself (narrowed to its key's rights).
    manual_subscriptions: bool = False


@dataclass(frozen=True, slots=True)
class EventBusConfig:
    """Where and how the bus serves. ``port`` 0 picks a free base port P such that
    P, P+1 and P+2 are all free (handy in tests)."""

    bind: str = DEFAULT_BIND
    port: int = DEFAULT_PORT
    data_dir: Path = Path(DEFAULT_DATA_DIR)
    #: How BROADCAST (and replies to a SYNCSTART without a sequence) encode sequences.
    sequence_encoding: SequenceEncoding = SequenceEncoding.BINARY
    #: SYNCEND carries the highest SYNC sent (the text) or the bus's current sequence
    #: (the original implementation).
    syncend: SyncEndSequence = "highest"
    heartbeat_interval: float = 1.0
    retention: Retention = field(default_factory=Retention)
    retention_interval: float = 60.0
    durability: Durability = "normal"
    #: Zero the pages removed events held (SQLite's ``secure_delete=ON``) rather than free
    #: them as they are (``FAST``): no removed event stays readable in the file, at about
    #: three times the writes of a retention pass.
    secure_delete: bool = False
    #: The WAL file's bound (bytes): above it a checkpoint starts the WAL over, holding
    #: appends for its last frames (:class:`bus.util.sqlitewal.Checkpointer`). 0: no bound.
    wal_limit: int = DEFAULT_WAL_LIMIT
    max_data_bytes: int = DEFAULT_MAX_DATA_BYTES
    #: Messages the PUB socket queues per subscriber before ZeroMQ drops (then clients heal
    #: from the store).
    publish_hwm: int = 200_000
    collector_hwm: int = 10_000
    #: Messages the snapshot ROUTER queues per client (~0.7 KiB each in libzmq): what a
    #: client that stopped reading costs in memory. The server's main thread hands the
    #: pipe to libzmq's I/O thread every half pipe: on a busy machine each handover waits
    #: for a CPU, and 250 made a 200k snapshot a third slower there than 500 (issue 20).
    snapshot_hwm: int = DEFAULT_SNAPSHOT_HWM
    #: The kernel's send buffer per snapshot client (bytes): a client that stopped reading
    #: would otherwise hold up to 4 MiB there. -1: the OS default.
    snapshot_send_buffer: int = 256 * 1024
    read_budget: int = 512
    #: Events read from the store at a time for a snapshot, and messages all snapshot
    #: streams together send per reactor turn.
    snapshot_chunk: int = 500
    #: A snapshot whose client took no message for this long (seconds) is abandoned
    #: (the client sees no SYNCEND and asks again). 0: never.
    snapshot_stall_timeout: float = 60.0
    #: Snapshot streams running at once, in all and per client identity; further
    #: SYNCSTARTs wait in a queue of ``snapshot_queue`` and beyond it are dropped.
    max_snapshots: int = 256
    max_snapshots_per_client: int = 4
    snapshot_queue: int = 1024
    stats_interval: float = 10.0
    #: How often the WAL is copied into the database, on a worker thread.
    checkpoint_interval: float = 1.0
    tcp_keepalive_idle: int | None = 60
    #: While the event log cannot write (a full disk), the batch it refused is retried
    #: after this many seconds, doubling up to ``storage_retry_max``.
    storage_retry_min: float = 0.5
    storage_retry_max: float = 5.0
    #: How long a stop waits for a WAL checkpoint still running on its thread before
    #: closing the store without it (the WAL is kept; nothing committed is lost).
    stop_timeout: float = 3.0
    #: Half of a primary/backup pair, or None for a server alone.
    pair: PairConfig | None = None
    #: CURVE on every port and the pair link, and the allow-list of client keys.
    curve: CurveSettings = field(default_factory=CurveSettings)

    def __post_init__(self) -> None:
        if self.wal_limit < 0:
            raise ValueError("wal_limit must be 0 (no bound) or more")
        if self.snapshot_hwm < 1 or self.snapshot_chunk < 1:
            raise ValueError("snapshot_hwm and snapshot_chunk must be at least 1")
        if self.max_snapshots < 1 or self.max_snapshots_per_client < 1:
            raise ValueError("max_snapshots and max_snapshots_per_client must be at least 1")
        if self.snapshot_queue < 0 or self.snapshot_stall_timeout < 0:
            raise ValueError("snapshot_queue and snapshot_stall_timeout cannot be negative")

    @property
    def snapshot_port(self) -> int:
        """The ROUTER that answers SYNCSTART: ``port``."""
        return self.port

    @property
    def publisher_port(self) -> int:
        """The PUB of broadcasts and heartbeats: ``port`` + 1."""
        return self.port + 1

    @property
    def collector_port(self) -> int:
        """The ROUTER that takes PUBs: ``port`` + 2."""
        return self.port + 2

    def port_sockets(
        self, *, rights: bool, publish_rights: bool
    ) -> tuple[PortSocket, PortSocket, PortSocket]:
        """The sockets of ports P, P+1 and P+2. ``rights``: an allow-list of client keys
        applies (each message's User-Id is kept, subscriptions are the server's to apply);
        ``publish_rights``: PUBs are checked against their key's publish subtrees."""
        from bus.extension import SocketOptions

        keepalive = self.tcp_keepalive_idle
        snapshot = SocketOptions(
            send_hwm=self.snapshot_hwm,
            send_buffer=self.snapshot_send_buffer,
            receive_hwm=1000,
            router_mandatory=True,
            tcp_keepalive_idle=keepalive,
            max_message_size=MAX_SUBTREE_SPEC_BYTES + 1024,
            linger_ms=0,
            peer_user_ids=rights,
        )
        # With an allow-list, subscriptions are the server's to apply (XPUB_MANUAL): one at
        # a time (read_budget 1), since libzmq applies ours to the pipe last read from.
        publisher = SocketOptions(
            send_hwm=self.publish_hwm, tcp_keepalive_idle=keepalive, peer_user_ids=rights
        )
        collector = SocketOptions(
            receive_hwm=self.collector_hwm,
            tcp_keepalive_idle=keepalive,
            max_message_size=self.max_data_bytes + MAX_TOPIC_BYTES + 4096,
            linger_ms=0,
            peer_user_ids=publish_rights,
        )
        return (
            PortSocket("snapshot", zmq.ROUTER, snapshot, self.read_budget),
            PortSocket("publisher", zmq.XPUB if rights else zmq.PUB, publisher, 1, rights),
            PortSocket("collector", zmq.ROUTER, collector, self.read_budget),
        )


def original_dialect(config: EventBusConfig) -> EventBusConfig:
    """The settings that make the original Node.js clients work against this server."""
    from dataclasses import replace

    return replace(config, sequence_encoding=SequenceEncoding.TEXT, syncend="current")
