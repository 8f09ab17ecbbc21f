"""``twistd -n spark-bridge --server HOST:PORT --journal-dir DIR``: the bridge on its own,
against a remote bus. Options also come from ``SPARK_BRIDGE_<OPTION>`` variables."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from twisted.application.service import MultiService
from twisted.python import usage

from bus.tap import parse_duration


def _env(name: str, default: Any) -> Any:
    return os.environ.get("SPARK_BRIDGE_" + name.upper().replace("-", "_"), default)


class Options(usage.Options):
    synopsis = "--server HOST:PORT [--server BACKUP:PORT] --journal-dir DIR [options]"
    longdesc = "Journal an Event BUS's feed into Parquet segments that PySpark reads exactly once."
    optParameters = [
        ["journal-dir", "j", _env("journal-dir", "spark-journal"), "Journal directory."],
        ["roll-events", None, _env("roll-events", 20_000), "Events per segment at most.", int],
        [
            "roll-seconds",
            None,
            _env("roll-seconds", "100ms"),
            "Age of a segment's first event before it is written.",
        ],
        [
            "retention-max-age",
            None,
            _env("retention-max-age", None),
            "Remove segments older than this (e.g. 7d).",
        ],
        [
            "retention-max-bytes",
            None,
            _env("retention-max-bytes", None),
            "Keep at most this many bytes of segments.",
            int,
        ],
        [
            "heartbeat-timeout",
            None,
            _env("heartbeat-timeout", "3.5s"),
            "Fail over after this long without word from the bus.",
        ],
    ]

    def __init__(self) -> None:
        usage.Options.__init__(self)
        self["servers"] = []

    def opt_server(self, address: str) -> None:
        """host:port of the bus (base port P); repeat for failover servers."""
        self["servers"].append(address)

    def postOptions(self) -> None:
        if not self["servers"]:
            env = _env("server", "")
            self["servers"] = [s for s in env.split(",") if s] or ["127.0.0.1:5556"]


def makeService(options: usage.Options | dict[str, Any]) -> MultiService:
    from bus.spark.bridge import BridgeConfig, SparkBridgeService

    max_age = options.get("retention-max-age")
    max_bytes = options.get("retention-max-bytes")
    config = BridgeConfig(
        journal_dir=Path(options["journal-dir"]),
        roll_events=int(options["roll-events"]),
        roll_seconds=parse_duration(str(options["roll-seconds"])),
        retention_max_age=None if not max_age else parse_duration(str(max_age)),
        retention_max_bytes=None if not max_bytes else int(max_bytes),
        heartbeat_timeout=parse_duration(str(options["heartbeat-timeout"])),
    )
    top = MultiService()
    top.addService(SparkBridgeService(list(options["servers"]), config))
    return top
