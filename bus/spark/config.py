"""The Spark bridge's settings (no transport import: the tap uses them at option-parsing time)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True, slots=True)
class BridgeConfig:
    """The bridge's journal, when it rolls segments and removes old ones, and how it reads
    the bus."""

    journal_dir: Path
    roll_events: int = 20_000
    roll_seconds: float = 0.1
    retention_max_age: float | None = None
    retention_max_bytes: int | None = None
    retention_interval: float = 60.0
    heartbeat_timeout: float = 3.5
    #: How the bus speaks: "spec", or "original" for the Node.js server (no heartbeats).
    dialect: str = "spec"
    fsync: bool = True
    #: Events held in memory for the writer before the bridge stops reading the bus
    #: (ZeroMQ then drops at the HWM and the gap is healed from the bus's log later).
    max_pending: int = 1_000_000
    #: While the journal cannot be written (a full disk), the write is retried after
    #: this many seconds, doubling up to ``storage_retry_max``.
    storage_retry_min: float = 0.5
    storage_retry_max: float = 5.0
