"""``twistd -n dbp``: the Core Catalog Service; composed, the ``dbp`` service of
``twistd -n eventbus`` (options prefixed ``--dbp-``), publishing the catalog's changes on the
bus under ``/dbp/services/<name>/``. Options also come from ``DBP_<OPTION>`` variables and the
``[dbp]`` table of a ``--config`` file."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from twisted.python import usage

from bus.dbp.config import (
    DEFAULT_BEACON_PORT,
    DEFAULT_BUCKET,
    DEFAULT_PORT,
    DEFAULT_REFRESH,
    HERMES_SERVICES,
    CatalogConfig,
    CatalogNatsSettings,
    read_allow_file,
)
from bus.extension import ServiceOptions, curve_settings, parse_duration
from bus.nats.options import cluster_options, cluster_settings
from bus.transport.curve_settings import CURVE_OPTIONS

if TYPE_CHECKING:
    from bus.dbp.server import CatalogService
    from bus.extension import Composition, ProductService


#: Started after the Event BUS when both run: composed, it publishes its activity
#: onto the local bus (the bridge journals it), which the Event BUS's build provides.
AFTER = ("eventbus",)


class Options(ServiceOptions):
    """``twistd dbp``'s options (``--dbp-*`` of ``twistd eventbus``)."""

    service = "dbp"
    env_prefix = "DBP"
    synopsis = "[--bind 127.0.0.1] [--port 5246] [--allow FILE] [--data-dir DIR]"
    longdesc = (
        "Serve the DBP Core Catalog: registrations, updates and info requests on a ROUTER, "
        "UDP heartbeats on the same port number (with a ZeroMQ fallback), and a SHALOM "
        "beacon on the beacon interface's broadcast address (loopback by default)."
    )
    optParameters = [
        ["bind", None, "127.0.0.1", "Address of the ROUTER and the UDP heartbeat port."],
        ["port", None, DEFAULT_PORT, "ROUTER port, and UDP heartbeat port (0: pick one).", int],
        ["beacon-interface", None, "lo", "Interface whose broadcast address gets the beacon."],
        ["beacon-port", None, DEFAULT_BEACON_PORT, "UDP port of the SHALOM beacon (0: off).", int],
        ["beacon-interval", None, "1s", "Time between beacons."],
        ["heartbeat-interval", None, "1s", "Time between the catalog's heartbeats."],
        ["liveness", None, 3, "Heartbeat intervals a service may miss before it expires.", int],
        ["grace", None, "60s", "How long an expired service stays listed as inactive."],
        ["allow", None, None, "File of allowed service names, each with an optional token."],
        ["data-dir", None, "dbp-data", "Directory of the registry (survives restarts)."],
        ["max-services", None, 10_000, "Most services listed (active or expired).", int],
        [
            "hermes-services",
            None,
            "expire",
            "Services registered in Hermes' form (they never beat): expire, or keep "
            "until they unregister (their updates accepted by name).",
        ],
        ["hermes-heartbeat", None, "10s", "Heartbeat assumed for Hermes-form services."],
        *cluster_options(
            "the catalog is a JetStream key-value bucket that every instance given it shares "
            "(not --data-dir)"
        ),
        ["nats-bucket", None, DEFAULT_BUCKET, "With --nats: the bucket's name."],
        [
            "nats-replicas",
            None,
            1,
            "With --nats: the bucket's replicas when it is made (3 in a cluster).",
            int,
        ],
        [
            "nats-refresh",
            None,
            f"{DEFAULT_REFRESH:g}s",
            "With --nats: how often an instance writes that it still hears a service (one "
            "write per service per refresh, not per heartbeat; an instance that does not hear "
            "it waits that much longer before expiring it).",
        ],
        *CURVE_OPTIONS,
    ]

    def postOptions(self) -> None:
        self["dbp-config"] = config_from_options(self)


def config_from_options(options: usage.Options | dict[str, Any]) -> CatalogConfig:
    """The catalog's settings from its options; a usage error names the option at fault."""
    allow = None
    if options.get("allow"):
        try:
            allow = read_allow_file(options["allow"])
        except (OSError, ValueError) as error:
            raise usage.UsageError(f"--allow {options['allow']}: {error}") from None
    for name in ("port", "beacon-port"):
        if not 0 <= int(options[name]) <= 65535:
            raise usage.UsageError(f"--{name} must be 0-65535")
    liveness = int(options["liveness"])
    if liveness < 1:
        raise usage.UsageError("--liveness must be at least 1")
    if int(options["max-services"]) < 1:
        raise usage.UsageError("--max-services must be at least 1")
    if options["hermes-services"] not in HERMES_SERVICES:
        raise usage.UsageError(f"--hermes-services must be one of {', '.join(HERMES_SERVICES)}")
    hermes_heartbeat = parse_duration(options["hermes-heartbeat"])
    if not 0.05 <= hermes_heartbeat <= 3600:
        raise usage.UsageError("--hermes-heartbeat must be between 50ms and 3600s")
    config = CatalogConfig(
        bind=options["bind"],
        port=int(options["port"]),
        beacon_interface=options["beacon-interface"],
        beacon_port=int(options["beacon-port"]),
        beacon_interval=parse_duration(options["beacon-interval"]),
        heartbeat_interval=parse_duration(options["heartbeat-interval"]),
        liveness=liveness,
        grace=parse_duration(options["grace"]),
        allow=allow,
        data_dir=options["data-dir"],
        max_services=int(options["max-services"]),
        hermes_services=options["hermes-services"],
        hermes_heartbeat=hermes_heartbeat,
        curve=curve_settings(options),
        nats=cluster_settings(
            options,
            CatalogNatsSettings,
            bucket=str(options.get("nats-bucket") or DEFAULT_BUCKET),
            replicas=int(options.get("nats-replicas") or 1),
            refresh=parse_duration(str(options.get("nats-refresh") or DEFAULT_REFRESH)),
        ),
    )
    if config.beacon_interval <= 0 or config.heartbeat_interval <= 0:
        raise usage.UsageError("--beacon-interval and --heartbeat-interval must be above 0")
    return config


def build(options: usage.Options | dict[str, Any], composition: Composition) -> CatalogService:
    """The catalog; composed with the Event BUS, its changes go onto the bus."""
    from bus.dbp.server import CatalogService

    config = options.get("dbp-config") or config_from_options(options)
    return CatalogService(config, activity=composition.activity("dbp"))


def makeService(options: usage.Options | dict[str, Any]) -> ProductService:
    """The catalog alone (``twistd -n dbp``)."""
    from bus.extension import standalone

    return standalone("dbp", build, options)
