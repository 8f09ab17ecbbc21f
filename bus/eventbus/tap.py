"""``twistd -n eventbus`` options of the Event BUS itself, and its service.

The product's plugin (:mod:`bus.tap`) offers these options without a prefix, beside those of
the other services; every option can also be set as ``EVENTBUS_<OPTION>`` or in the
``[eventbus]`` table of a ``--config`` file (see :mod:`bus.application.options`).
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from twisted.python import usage

from bus.eventbus.codec import SequenceEncoding
from bus.eventbus.config import (
    DEFAULT_BIND,
    DEFAULT_DATA_DIR,
    DEFAULT_PORT,
    DEFAULT_SNAPSHOT_HWM,
    EventBusConfig,
    JetStreamSettings,
    PairConfig,
    original_dialect,
)
from bus.eventbus.store import Retention
from bus.extension import ServiceOptions, curve_settings, parse_duration, parse_size
from bus.nats.options import nats_options, nats_settings
from bus.transport.curve_settings import CURVE_OPTIONS
from bus.util.sqlitewal import DEFAULT_WAL_LIMIT
from bus.util.values import optional_duration

if TYPE_CHECKING:
    from bus.eventbus.server import EventBusService
    from bus.extension import Composition, ProductService


class Options(ServiceOptions):
    """The Event BUS's options (``twistd -n eventbus`` offers them unprefixed)."""

    service = "eventbus"
    env_prefix = "EVENTBUS"
    synopsis = "[options]"
    longdesc = (
        "Serve the Event BUS: SNAPSHOT (ROUTER) on PORT, PUBLISHER (PUB) on PORT+1 and "
        "COLLECTOR (ROUTER) on PORT+2, with a durable event log in DATA-DIR."
    )
    optFlags = [
        ["retention-latest-per-topic", None, "Compact the log to the latest event per topic."],
        [
            "secure-delete",
            None,
            "Zero the pages removed events held: none stays readable in the file (about "
            "three times retention's writes).",
        ],
    ]
    optParameters = [
        ["bind", "b", DEFAULT_BIND, "Address to bind."],
        ["port", "p", DEFAULT_PORT, "Base port P (0: pick a free one).", int],
        ["data-dir", "d", DEFAULT_DATA_DIR, "Directory of the event log."],
        [
            "dialect",
            None,
            "spec",
            "spec (8-byte sequences, SYNCEND = highest SYNC) or original (the Node.js "
            "implementation: decimal text sequences, SYNCEND = current sequence).",
        ],
        ["sequence-encoding", None, None, "binary or text (overrides --dialect)."],
        ["syncend", None, None, "highest or current (overrides --dialect)."],
        ["heartbeat-interval", None, "1s", "Heartbeat period on the PUB socket (0: off)."],
        ["retention-max-age", None, None, "Drop events older than this (e.g. 7d)."],
        ["retention-max-count", None, None, "Keep at most this many events.", int],
        ["retention-interval", None, "60s", "How often retention runs."],
        [
            "durability",
            None,
            "normal",
            "normal (survives kill -9) or full (fsync: survives power loss).",
        ],
        ["max-event-size", None, 1024 * 1024, "Largest event data in bytes.", int],
        ["publish-hwm", None, 200_000, "PUB queue per subscriber, in messages.", int],
        [
            "snapshot-stall-timeout",
            None,
            "60s",
            "Abandon a snapshot whose client took no message for this long (0: never); the "
            "client sees no SYNCEND and asks again.",
        ],
        [
            "max-snapshots",
            None,
            256,
            "Snapshot streams running at once; further SYNCSTARTs wait in a queue.",
            int,
        ],
        [
            "max-snapshots-per-client",
            None,
            4,
            "Snapshot streams running at once for one client identity.",
            int,
        ],
        [
            "snapshot-queue",
            None,
            1024,
            "SYNCSTARTs that may wait for a free stream; beyond, dropped unanswered (counted).",
            int,
        ],
        [
            "snapshot-hwm",
            None,
            DEFAULT_SNAPSHOT_HWM,
            "Messages queued per snapshot client: what a client that stopped reading costs.",
            int,
        ],
        [
            "storage-retry-max",
            None,
            "5s",
            "Longest wait between attempts to store refused events (full disk).",
        ],
        [
            "wal-limit",
            None,
            "64MiB",
            "Bound of the store's WAL file: above it a checkpoint starts the WAL over (0: none).",
        ],
        [
            "stop-timeout",
            None,
            "3s",
            "How long a stop waits for a running WAL checkpoint before closing without it.",
        ],
        [
            "stats-interval",
            None,
            "10s",
            "How often status is logged and status.json written (0: off).",
        ],
        [
            "ha-role",
            None,
            None,
            "primary or backup: run as half of a pair that fails over (needs --ha-peer).",
        ],
        ["ha-peer", None, None, "The other half's peer link, HOST:PORT (its --ha-port)."],
        ["ha-port", None, 0, "This server's peer-link port (0: the base port + 3).", int],
        [
            "ha-peer-key",
            None,
            None,
            "With --server-cert: the other half's public key (Z85, or its .key file); by "
            "default this server's own (both halves given the same --server-cert).",
        ],
        [
            "ha-replication",
            None,
            "sync",
            "sync (broadcast only what the passive stored) or async (broadcast first; up to "
            "--ha-async-window events may be lost at a failover).",
        ],
        [
            "ha-failover-timeout",
            None,
            "1s",
            "The passive takes over once the active was silent this long and a client "
            "turned to it.",
        ],
        [
            "ha-alone-timeout",
            None,
            "1s",
            "The active goes on without a passive that took nothing for this long.",
        ],
        [
            "ha-async-window",
            None,
            10_000,
            "async: events broadcast ahead of the passive at most.",
            int,
        ],
        *nats_options("the log", "EVENTBUS", "eventbus"),
        *CURVE_OPTIONS,
    ]

    def postOptions(self) -> None:
        self["eventbus-config"] = config_from_options(self)
        self["eventbus-stream"] = stream_from_options(self)


def config_from_options(options: usage.Options | dict[str, Any]) -> EventBusConfig:
    """The server's settings from its options; a usage error names the option at fault."""
    dialect = options["dialect"]
    if dialect not in ("spec", "original"):
        raise usage.UsageError("--dialect must be spec or original")
    max_count = options.get("retention-max-count")
    try:
        config = _config(options, max_count)
    except ValueError as error:  # the config's own checks name fields as options spell them
        raise usage.UsageError(str(error).replace("_", "-")) from None
    if config.durability not in ("normal", "full"):
        raise usage.UsageError("--durability must be normal or full")
    if not 0 <= config.port <= 65533:
        raise usage.UsageError("--port must leave room for PORT+2")
    config = replace(config, pair=_pair_config(options, config.port), curve=curve_settings(options))
    if config.pair is not None and options.get("ha-peer-key"):
        if not config.curve.enabled:
            raise usage.UsageError("--ha-peer-key needs --server-cert (CURVE)")
        config = replace(config, pair=replace(config.pair, peer_key=_public_key(options)))
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


def stream_from_options(options: usage.Options | dict[str, Any]) -> JetStreamSettings | None:
    """The JetStream stream of ``--store jetstream`` (None: the SQLite log)."""
    settings = nats_settings(options, JetStreamSettings)
    if settings is not None and (options.get("ha-role") or options.get("ha-peer")):
        raise usage.UsageError("--store jetstream has no pair (--ha-*): the cluster replicates")
    return settings


def _pair_config(options: usage.Options | dict[str, Any], port: int) -> PairConfig | None:
    role = options.get("ha-role") or None
    peer = options.get("ha-peer") or None
    if role is None and peer is None:
        return None
    if role not in ("primary", "backup"):
        raise usage.UsageError("--ha-role must be primary or backup")
    if peer is None:
        raise usage.UsageError("--ha-role needs --ha-peer HOST:PORT (the other half's --ha-port)")
    host, _, peer_port = str(peer).removeprefix("tcp://").rpartition(":")
    if not host or not peer_port.isdigit() or not 0 < int(peer_port) < 65536:
        raise usage.UsageError(f"--ha-peer must be HOST:PORT, not {peer!r}")
    replication = options.get("ha-replication") or "sync"
    if replication not in ("sync", "async"):
        raise usage.UsageError("--ha-replication must be sync or async")
    ha_port = int(options.get("ha-port") or 0)
    if not 0 <= ha_port < 65536 or (ha_port == 0 and port > 65532):
        raise usage.UsageError("--ha-port must be a port (or 0 with --port at most 65532)")
    try:
        return PairConfig(
            role=role,
            peer=f"{host}:{peer_port}",
            port=ha_port,
            replication="async" if replication == "async" else "sync",
            failover_timeout=parse_duration(options.get("ha-failover-timeout") or "1s"),
            alone_timeout=parse_duration(options.get("ha-alone-timeout") or "1s"),
            async_window=int(_given(options.get("ha-async-window"), 10_000)),
        )
    except ValueError as error:
        raise usage.UsageError(str(error).replace("_", "-")) from None


def _public_key(options: usage.Options | dict[str, Any]) -> bytes:
    from bus.transport.curve import KeyFileError, load_public_key

    try:
        return load_public_key(options["ha-peer-key"])
    except KeyFileError as error:
        raise usage.UsageError(f"--ha-peer-key: {error}") from None


def _given(value: Any, default: Any) -> Any:
    return default if value in (None, "") else value


def _config(options: usage.Options | dict[str, Any], max_count: Any) -> EventBusConfig:
    return EventBusConfig(
        bind=options["bind"],
        port=int(options["port"]),
        data_dir=Path(options["data-dir"]),
        heartbeat_interval=parse_duration(options["heartbeat-interval"]),
        retention=Retention(
            max_age=optional_duration(options.get("retention-max-age")),
            max_count=None if max_count in (None, "") else int(max_count),
            latest_per_topic=bool(options.get("retention-latest-per-topic")),
        ),
        retention_interval=parse_duration(options["retention-interval"]),
        durability=options["durability"],
        secure_delete=bool(options.get("secure-delete")),
        wal_limit=parse_size(options.get("wal-limit", DEFAULT_WAL_LIMIT)),
        max_data_bytes=int(options["max-event-size"]),
        publish_hwm=int(options["publish-hwm"]),
        stats_interval=parse_duration(options["stats-interval"]),
        storage_retry_max=parse_duration(options.get("storage-retry-max", "5s")),
        snapshot_stall_timeout=parse_duration(options.get("snapshot-stall-timeout", "60s")),
        max_snapshots=int(options.get("max-snapshots", 256)),
        max_snapshots_per_client=int(options.get("max-snapshots-per-client", 4)),
        snapshot_queue=int(options.get("snapshot-queue", 1024)),
        snapshot_hwm=int(options.get("snapshot-hwm", DEFAULT_SNAPSHOT_HWM)),
        stop_timeout=parse_duration(options.get("stop-timeout", "3s")),
    )


def build(options: usage.Options | dict[str, Any], composition: Composition) -> EventBusService:
    """The Event BUS service; composed, it is the local bus other services publish onto."""
    from bus.eventbus.server import EventBusService

    config = options.get("eventbus-config") or config_from_options(options)
    stream = options.get("eventbus-stream") or stream_from_options(options)
    if stream is not None:
        from bus.eventbus.frontend import EventBusFrontEnd

        bus: EventBusService = EventBusFrontEnd(config, stream)
    else:
        bus = EventBusService(config)
    bus.status_address = lambda: composition.status_address
    composition.local_bus = bus
    return bus


def makeService(options: usage.Options | dict[str, Any]) -> ProductService:
    """The Event BUS alone (``twistd -n eventbus --services eventbus`` does the same)."""
    from bus.extension import standalone

    return standalone("eventbus", build, options)
