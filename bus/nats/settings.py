"""Where a service's JetStream store is and how to reach it: what the Event BUS's log and
eMQP's guaranteed requests share (``--store jetstream --nats ...``). Plain data: Spark's
executors build it too."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True, slots=True)
class NatsSettings:
    """The JetStream store's settings: servers, stream, subjects, replicas, credentials, TLS and the
    duplicate window."""

    servers: tuple[str, ...]
    stream: str = ""
    subject_prefix: str = ""
    replicas: int = 1
    #: A NATS credentials file (``--nats-creds``), and TLS (``--nats-tls-*``).
    creds: Path | None = None
    tls_ca: Path | None = None
    tls_cert: Path | None = None
    tls_key: Path | None = None
    #: A message resent (same id) within this many seconds is stored once.
    duplicate_window: float = 120.0
    connect_timeout: float = 5.0
    #: An append not acknowledged this long is refused (and sent again).
    ack_timeout: float = 5.0
    #: Seconds between pings to the NATS server: a silent one is left after two.
    ping_interval: float = 2.0

    def __post_init__(self) -> None:
        if not self.servers:
            raise ValueError("--nats names no server")
        if not 1 <= self.replicas <= 5:
            raise ValueError("--nats-replicas must be 1..5 (JetStream's limit)")
