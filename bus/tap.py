"""twistd plugin support: ``twistd -n eventbus [options]`` and tac files.

Every option can also come from the environment as ``EVENTBUS_<OPTION>`` (upper case,
dashes as underscores), e.g. ``EVENTBUS_PORT=6000``; the command line wins.
"""

from __future__ import annotations

import os
import re
from dataclasses import replace
from pathlib import Path
from typing import Any

from twisted.application.service import MultiService
from twisted.python import usage

from bus.eventbus.codec import SequenceEncoding
from bus.eventbus.config import (
    DEFAULT_BIND,
    DEFAULT_DATA_DIR,
    DEFAULT_PORT,
    EventBusConfig,
    original_dialect,
)
from bus.eventbus.store import Retention

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)?\s*$")
_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, None: 1.0}


def parse_duration(text: str) -> float:
    """Seconds from ``90``, ``1.5s``, ``10m``, ``12h`` or ``7d``."""
    match = _DURATION.match(text)
    if not match:
        raise usage.UsageError(f"not a duration: {text!r} (try 30s, 10m, 12h, 7d)")
    return float(match.group(1)) * _UNITS[match.group(2)]


def _env(name: str, default: Any) -> Any:
    return os.environ.get("EVENTBUS_" + name.upper().replace("-", "_"), default)


class Options(usage.Options):
    synopsis = "[options]"
    longdesc = (
        "Serve the Event BUS: SNAPSHOT (ROUTER) on PORT, PUBLISHER (PUB) on PORT+1 and "
        "COLLECTOR (ROUTER) on PORT+2, with a durable event log in DATA-DIR."
    )
    optFlags = [
        ["retention-latest-per-topic", None, "Compact the log to the latest event per topic."],
        ["spark-bridge", None, "Also journal this bus's feed for PySpark (needs the spark extra)."],
    ]
    optParameters = [
        ["bind", "b", _env("bind", DEFAULT_BIND), "Address to bind."],
        ["port", "p", _env("port", DEFAULT_PORT), "Base port P (0: pick a free one).", int],
        ["data-dir", "d", _env("data-dir", DEFAULT_DATA_DIR), "Directory of the event log."],
        [
            "dialect",
            None,
            _env("dialect", "spec"),
            "spec (8-byte sequences, SYNCEND = highest SYNC) or original (the Node.js "
            "implementation: decimal text sequences, SYNCEND = current sequence).",
        ],
        [
            "sequence-encoding",
            None,
            _env("sequence-encoding", None),
            "binary or text (overrides --dialect).",
        ],
        ["syncend", None, _env("syncend", None), "highest or current (overrides --dialect)."],
        [
            "heartbeat-interval",
            None,
            _env("heartbeat-interval", "1s"),
            "Heartbeat period on the PUB socket (0: off).",
        ],
        [
            "retention-max-age",
            None,
            _env("retention-max-age", None),
            "Drop events older than this (e.g. 7d).",
        ],
        [
            "retention-max-count",
            None,
            _env("retention-max-count", None),
            "Keep at most this many events.",
            int,
        ],
        [
            "retention-interval",
            None,
            _env("retention-interval", "60s"),
            "How often retention runs.",
        ],
        [
            "durability",
            None,
            _env("durability", "normal"),
            "normal (survives kill -9) or full (fsync: survives power loss).",
        ],
        [
            "max-event-size",
            None,
            _env("max-event-size", 1024 * 1024),
            "Largest event data in bytes.",
            int,
        ],
        [
            "publish-hwm",
            None,
            _env("publish-hwm", 200_000),
            "PUB queue per subscriber, in messages.",
            int,
        ],
        [
            "journal-dir",
            None,
            _env("journal-dir", "spark-journal"),
            "With --spark-bridge: the journal directory PySpark reads.",
        ],
        [
            "stats-interval",
            None,
            _env("stats-interval", "10s"),
            "How often status is logged and status.json written (0: off).",
        ],
    ]

    def postOptions(self) -> None:
        self["config"] = config_from_options(self)
        if not self["spark-bridge"] and os.environ.get("EVENTBUS_SPARK_BRIDGE"):
            self["spark-bridge"] = True


def config_from_options(options: usage.Options | dict[str, Any]) -> EventBusConfig:
    dialect = options["dialect"]
    if dialect not in ("spec", "original"):
        raise usage.UsageError("--dialect must be spec or original")
    max_age = options.get("retention-max-age")
    max_count = options.get("retention-max-count")
    config = EventBusConfig(
        bind=options["bind"],
        port=int(options["port"]),
        data_dir=Path(options["data-dir"]),
        heartbeat_interval=parse_duration(str(options["heartbeat-interval"])),
        retention=Retention(
            max_age=None if max_age in (None, "") else parse_duration(str(max_age)),
            max_count=None if max_count in (None, "") else int(max_count),
            latest_per_topic=bool(options.get("retention-latest-per-topic")),
        ),
        retention_interval=parse_duration(str(options["retention-interval"])),
        durability=options["durability"],
        max_data_bytes=int(options["max-event-size"]),
        publish_hwm=int(options["publish-hwm"]),
        stats_interval=parse_duration(str(options["stats-interval"])),
    )
    if config.durability not in ("normal", "full"):
        raise usage.UsageError("--durability must be normal or full")
    if not 0 <= config.port <= 65533:
        raise usage.UsageError("--port must leave room for PORT+2")
    if dialect == "original":
        config = original_dialect(config)
    encoding = options.get("sequence-encoding")
    if encoding:
        try:
            config = replace(config, sequence_encoding=SequenceEncoding(encoding))
        except ValueError:
            raise usage.UsageError("--sequence-encoding must be binary or text") from None
    syncend = options.get("syncend")
    if syncend:
        if syncend not in ("highest", "current"):
            raise usage.UsageError("--syncend must be highest or current")
        config = replace(config, syncend=syncend)
    return config


def makeService(options: usage.Options | dict[str, Any]) -> MultiService:
    """The whole product as one MultiService (used by twistd and by tac files)."""
    from bus.eventbus.server import EventBusService

    config = options["config"] if "config" in options else config_from_options(options)
    top = MultiService()
    bus = EventBusService(config)
    top.addService(bus)  # started first: the bridge needs its bound port
    if options.get("spark-bridge"):
        from bus.spark.bridge import BridgeConfig, SparkBridgeService

        host = "127.0.0.1" if config.bind in ("0.0.0.0", "*") else config.bind
        top.addService(
            SparkBridgeService(
                lambda: [f"{host}:{bus.port}"],
                BridgeConfig(journal_dir=Path(options["journal-dir"])),
            )
        )
    return top
