"""An mc0 broker's settings (no transport import: the tap uses them at option-parsing time)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from bus.extension import CurveSettings
from bus.mc0.core import BrokerSettings
from bus.nats.settings import NatsSettings

DEFAULT_BIND = "127.0.0.1"
DEFAULT_PORT = 61616
DEFAULT_DATA_DIR = "mc0-data"


@dataclass(frozen=True, slots=True)
class Mc0ClusterSettings(NatsSettings):
    """Brokers of several hosts as one topic space over NATS core subjects (``--nats``; see
    :mod:`bus.mc0.relay` and docs/mc0.md): the servers, credentials and TLS, the subjects'
    prefix, what is held while the link is down."""

    subject_prefix: str = "mc0"
    #: A server silent for two pings is left for another: the longest a dead link goes
    #: unnoticed (what is relayed to this broker meanwhile is lost).
    ping_interval: float = 1.0
    #: PUTs held while the link is down, at most, and their bytes.
    hold_messages: int = 10_000
    hold_bytes: int = 64 * 1024 * 1024
    #: Carry CURVE clients' topics over NATS connections without TLS (``--nats-without-tls``).
    without_tls: bool = False
    #: This broker's name among the brokers (empty: its host's name and a random part).
    broker_id: str = ""


@dataclass(frozen=True, slots=True)
class Mc0Config:
    """The broker's port, data directory, CURVE, mirroring onto the Event BUS, the rules of its core
    and its sockets' bounds."""

    bind: str = DEFAULT_BIND
    port: int = DEFAULT_PORT
    data_dir: Path = Path(DEFAULT_DATA_DIR)
    #: The ROUTER's CURVE. The tap gives the key pair kept in ``data_dir`` unless
    #: ``--server-cert`` names one; disabled (this default, and ``--plain``): plain text.
    curve: CurveSettings = field(default_factory=CurveSettings)
    mirror: bool = False
    broker: BrokerSettings = field(default_factory=BrokerSettings)
    send_hwm: int = 10_000
    #: The brokers of other hosts, over NATS (None: this broker alone).
    cluster: Mc0ClusterSettings | None = None
    receive_hwm: int = 10_000
    read_budget: int = 512
