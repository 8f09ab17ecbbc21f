"""An mc0 broker's settings (no transport import: the tap uses them at option-parsing time)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from bus.extension import CurveSettings
from bus.mc0.core import BrokerSettings

DEFAULT_BIND = "127.0.0.1"
DEFAULT_PORT = 61616
DEFAULT_DATA_DIR = "mc0-data"


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
    receive_hwm: int = 10_000
    read_budget: int = 512
