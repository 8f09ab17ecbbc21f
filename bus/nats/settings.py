"""Where a service's JetStream store is and how to reach it: what the Event BUS's log and
eMQP's guaranteed requests share (``--store jetstream --nats ...``). Plain data: Spark's
executors build it too."""

from __future__ import annotations

import ssl
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from bus.nats.credentials import Credentials, split

if TYPE_CHECKING:
    from bus.nats.blocking import Connection


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


def blocking_connection(settings: NatsSettings, name: str) -> Connection:
    """A blocking connection (:mod:`bus.nats.blocking`) to the first of the servers that
    admits it, as the settings say (timeouts, TLS, credentials)."""
    from bus.nats.blocking import Connection

    return Connection(
        settings.servers,
        timeout=settings.connect_timeout,
        tls=tls_context(settings),
        credentials=settings.credentials,
        name=name,
        echo=False,
    )
