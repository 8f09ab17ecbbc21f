"""``twistd -n spark-bridge --server HOST:PORT --journal-dir DIR``: the bridge on its own,
against a remote bus; composed into ``twistd -n eventbus --spark-bridge`` it journals the local
bus. Options also come from ``SPARK_BRIDGE_<OPTION>`` variables and the ``[spark-bridge]``
table of a ``--config`` file."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from twisted.python import usage

from bus.extension import ServiceOptions, parse_duration
from bus.spark.config import BridgeConfig
from bus.transport.curve_settings import CLIENT_CURVE_OPTIONS, client_curve_from
from bus.util.extras import require
from bus.util.values import optional_duration

if TYPE_CHECKING:
    from bus.extension import Composition, ProductService
    from bus.spark.bridge import SparkBridgeService

DEFAULT_SERVER = "127.0.0.1:5556"


#: Started after the Event BUS when both run: composed, it publishes its activity
#: onto the local bus (the bridge journals it), which the Event BUS's build provides.
AFTER = ("eventbus",)


class Options(ServiceOptions):
    """``twistd spark-bridge``'s options (also ``--spark-bridge-*`` of ``twistd eventbus``)."""

    service = "spark-bridge"
    env_prefix = "SPARK_BRIDGE"
    synopsis = "--server HOST:PORT [--server BACKUP:PORT] --journal-dir DIR [options]"
    longdesc = "Journal an Event BUS's feed into Parquet segments that PySpark reads exactly once."
    optParameters = [
        ["journal-dir", "j", "spark-journal", "Journal directory."],
        ["roll-events", None, 20_000, "Events per segment at most.", int],
        ["roll-seconds", None, "100ms", "Age of a segment's first event before it is written."],
        ["retention-max-age", None, None, "Remove segments older than this (e.g. 7d)."],
        ["retention-max-bytes", None, None, "Keep at most this many bytes of segments.", int],
        [
            "storage-retry-max",
            None,
            "5s",
            "Longest wait between attempts to write when the journal's disk refuses.",
        ],
        [
            "dialect",
            None,
            "spec",
            "spec, or original for the original Node.js server (no heartbeats: probed).",
        ],
        [
            "heartbeat-timeout",
            None,
            "3.5s",
            "Fail over after this long without word from the bus.",
        ],
        *CLIENT_CURVE_OPTIONS,
    ]
    optMulti = [
        [
            "server",
            None,
            f"host:port of the bus (base port P; default {DEFAULT_SERVER}, or the bus of "
            "this process when composed); repeat for failover servers.",
        ],
    ]

    def postOptions(self) -> None:
        self["bridge-config"] = config_from_options(self)


def config_from_options(options: usage.Options | dict[str, Any]) -> BridgeConfig:
    """The bridge's settings; a usage error for a bad value, and MissingExtra (one line at
    start, bus.util.extras) without pyarrow, which writes the journal's segments."""
    max_bytes = options.get("retention-max-bytes")
    if (options.get("dialect") or "spec") not in ("spec", "original"):
        raise usage.UsageError("--dialect must be spec or original")
    config = BridgeConfig(
        journal_dir=Path(options["journal-dir"]),
        roll_events=int(options["roll-events"]),
        roll_seconds=parse_duration(options["roll-seconds"]),
        retention_max_age=optional_duration(options.get("retention-max-age")),
        retention_max_bytes=None if not max_bytes else int(max_bytes),
        heartbeat_timeout=parse_duration(options["heartbeat-timeout"]),
        storage_retry_max=parse_duration(options.get("storage-retry-max", "5s")),
        dialect=options.get("dialect") or "spec",
    )
    require("pyarrow.parquet", "spark", "the bridge's Parquet journal", "journal-dir")
    return config


def build(options: usage.Options | dict[str, Any], composition: Composition) -> SparkBridgeService:
    """The bridge; composed with the Event BUS and given no ``--server``, it journals the
    local bus."""
    from bus.spark.bridge import SparkBridgeService

    config = options.get("bridge-config") or config_from_options(options)
    servers = list(options.get("server") or [])
    curve = client_curve_from(options)
    local = composition.local_bus
    if not servers and local is not None:
        # Composed: journal this process's bus, whose port is known once it has bound;
        # over CURVE with the bus's own key pair unless given one (see ServerCurve).
        return SparkBridgeService(local.client_addresses, config, curve=curve or local.client_curve)
    return SparkBridgeService(servers or [DEFAULT_SERVER], config, curve=curve)


def makeService(options: usage.Options | dict[str, Any]) -> ProductService:
    """The bridge alone (``twistd -n spark-bridge``)."""
    from bus.extension import standalone

    return standalone("spark-bridge", build, options)
