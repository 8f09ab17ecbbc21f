"""The catalog's settings and its allow file (no transport import: used at option-parsing time)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from bus.extension import CurveSettings
from bus.nats.settings import NatsSettings

DEFAULT_PORT = 5246
DEFAULT_BEACON_PORT = 5245
#: Assumed heartbeat of services registered in Hermes' form (bus.dbp.codec.HERMES_HEARTBEAT).
DEFAULT_HERMES_HEARTBEAT = 10.0
HERMES_SERVICES = ("expire", "keep")
#: The shared catalog's bucket unless ``--nats-bucket`` says otherwise.
DEFAULT_BUCKET = "DBP_CATALOG"
#: Seconds between an instance's writes that it still hears a service, by default.
DEFAULT_REFRESH = 5.0


@dataclass(frozen=True, slots=True)
class CatalogNatsSettings(NatsSettings):
    """Where the shared catalog is (``--nats``): the servers, the bucket, its replicas, and
    how often an instance writes that it still hears a service (see :mod:`bus.dbp.shared`)."""

    bucket: str = DEFAULT_BUCKET
    refresh: float = DEFAULT_REFRESH

    def __post_init__(self) -> None:
        NatsSettings.__post_init__(self)
        if not self.bucket or not all(c.isalnum() or c in "-_" for c in self.bucket):
            raise ValueError("--nats-bucket must be letters, digits, - and _")
        if not 0.1 <= self.refresh <= 3600:
            raise ValueError("--nats-refresh must be between 100ms and 3600s")


@dataclass(slots=True)
class CatalogConfig:
    """The catalog's addresses, beacon, heartbeats, allow file, data directory and bounds."""

    bind: str = "127.0.0.1"
    port: int = DEFAULT_PORT
    beacon_interface: str = "lo"
    #: 0: no beacon.
    beacon_port: int = DEFAULT_BEACON_PORT
    beacon_interval: float = 1.0
    heartbeat_interval: float = 1.0
    liveness: int = 3
    grace: float = 60.0
    allow: Mapping[str, str | None] | None = None
    data_dir: str = "dbp-data"
    #: Services registered in Hermes' form: "expire" like any silent service, or "keep"
    #: until they unregister (their updates then accepted by name from any connection).
    hermes_services: str = "expire"
    hermes_heartbeat: float = DEFAULT_HERMES_HEARTBEAT
    max_services: int = 10_000
    #: CURVE on the ROUTER, the allow-list, and the names each key may register.
    curve: CurveSettings = field(default_factory=CurveSettings)
    #: The shared catalog (``--nats``), None: this instance's own, saved in ``data_dir``.
    nats: CatalogNatsSettings | None = None


def read_allow_file(path: str | Path) -> dict[str, str | None]:
    """One allowed service name a line, optionally followed by whitespace and its shared
    token; blank lines and lines starting with ``#`` are ignored. Raises ValueError."""
    allowed: dict[str, str | None] = {}
    text = Path(path).read_text(encoding="utf-8")
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        parts = line.split()
        if len(parts) > 2:
            raise ValueError(f"{path}:{number}: want NAME [TOKEN], got {line!r}")
        allowed[parts[0]] = parts[1] if len(parts) == 2 else None
    return allowed
