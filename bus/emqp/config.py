"""eMQP broker settings (plain data: no sockets, no reactor)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from bus.emqp.core import BrokerSettings
from bus.extension import CurveSettings
from bus.nats.settings import NatsSettings
from bus.util.sqlitewal import Durability

DEFAULT_BIND = "127.0.0.1"
#: The original's ports: workers, clients, administration.
DEFAULT_WORKER_PORT = 47290
DEFAULT_CLIENT_PORT = 47291
DEFAULT_ADMIN_PORT = 47293
DEFAULT_DATA_DIR = "emqp-data"


@dataclass(frozen=True, slots=True)
class EmqpConfig:
    """Where and how the broker serves. A port of 0 picks a free one (tests)."""

    bind: str = DEFAULT_BIND
    worker_port: int = DEFAULT_WORKER_PORT
    client_port: int = DEFAULT_CLIENT_PORT
    admin_port: int = DEFAULT_ADMIN_PORT
    data_dir: Path = Path(DEFAULT_DATA_DIR)
    durability: Durability = "normal"
    broker: BrokerSettings = field(default_factory=BrokerSettings)
    #: Largest message a peer may send; libzmq drops the connection of one that sends more.
    max_message_size: int = 1024 * 1024
    #: Messages queued per peer (both directions) before ZeroMQ pushes back.
    hwm: int = 100_000
    read_budget: int = 256
    #: How often expired ``timeout:N`` requests are looked for.
    timeout_check: float = 0.05
    stats_interval: float = 10.0
    #: How often the WAL is moved into the database, on a worker thread.
    checkpoint_interval: float = 1.0
    #: How long answers wait for a client that takes none (not connected, or not reading)
    #: before they are dropped.
    reply_linger: float = 10.0
    #: Messages libzmq queues per client (its send HWM on the client and admin ports); past
    #: it answers wait in the broker's outbox for that client, bounded by the two below.
    client_hwm: int = 1000
    client_queue_bytes: int = 16 * 1024 * 1024
    client_queue_messages: int = 10_000
    tcp_keepalive_idle: int | None = 60
    #: CURVE on the three ports, the allow-list, and the rights (role, queues) of its keys.
    curve: CurveSettings = field(default_factory=CurveSettings)
    #: Where guaranteed requests are kept: None for the SQLite file in ``data_dir``.
    jetstream: JetStreamSettings | None = None


@dataclass(frozen=True, slots=True)
class JetStreamSettings(NatsSettings):
    """Guaranteed requests in a JetStream stream shared by several brokers
    (``--store jetstream``; see :mod:`bus.emqp.jobstream` and docs/cluster.md)."""

    stream: str = "EMQP"
    subject_prefix: str = "emqp"
    #: A broker that stops telling the stream it works on a request (it died) loses it
    #: to another broker after this long.
    ack_wait: float = 4.0
    #: How long a pull waits at the server for requests before it is asked again.
    pull_expires: float = 5.0
    ping_interval: float = 1.0
    #: This broker's name among the brokers (answers to its clients go to it); empty:
    #: one kept in the data directory.
    broker_id: str = ""
