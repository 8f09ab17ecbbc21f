"""Where a service's JetStream store is and how to reach it: what the Event BUS's log and
eMQP's guaranteed requests share (``--store jetstream --nats ...``). Plain data: Spark's
executors build it too."""

from __future__ import annotations

import ssl
from dataclasses import dataclass, field
from pathlib import Path

from bus.nats.credentials import Credentials, split


@dataclass(frozen=True, slots=True)
class NatsSettings:
    """The JetStream store's settings: servers, stream, subjects, replicas, credentials, TLS and the
    duplicate window."""

    #: The servers' URLs, without credentials: a ``user:password@`` or ``token@`` given in
    #: them is moved to :attr:`credentials` as the settings are made, so that the servers
    #: may be printed anywhere.
    servers: tuple[str, ...]
    stream: str = ""
    subject_prefix: str = ""
    replicas: int = 1
    #: Who the client is (``--nats-user`` and ``--nats-password-file``, ``--nats-token-file``,
    #: ``--nats-nkey``, ``--nats-creds``, or what the URLs carried); TLS (``--nats-tls-*``).
    credentials: Credentials = field(default_factory=Credentials)
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
        servers, credentials = split(self.servers, self.credentials)
        object.__setattr__(self, "servers", servers)
        object.__setattr__(self, "credentials", credentials)
        if not 1 <= self.replicas <= 5:
            raise ValueError("--nats-replicas must be 1..5 (JetStream's limit)")


def tls_context(settings: NatsSettings) -> ssl.SSLContext | None:
    """The TLS context the settings ask for (``--nats-tls-*``), None for none."""
    if not (settings.tls_ca or settings.tls_cert):
        return None
    context = ssl.create_default_context(cafile=str(settings.tls_ca) if settings.tls_ca else None)
    if settings.tls_cert is not None:
        context.load_cert_chain(
            str(settings.tls_cert), str(settings.tls_key) if settings.tls_key else None
        )
    return context
