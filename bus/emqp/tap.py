"""``twistd -n emqp``: the eMQP broker alone; composed into ``twistd -n eventbus`` as the
``emqp`` service (options prefixed ``--emqp-``). Options also come from ``EMQP_<OPTION>``
variables and the ``[emqp]`` table of a ``--config`` file, and, under those, from eventmq's
own settings as its router reads them (``-C``/``--config`` of its INI file,
``EVENTMQ_CONFIG_FILE``, ``EVENTMQ_<NAME>``). SIGHUP reads them all again."""

from __future__ import annotations

import math
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from twisted.logger import Logger
from twisted.python import usage

from bus.application.options import config_path_in
from bus.application.sighup import on_sighup
from bus.emqp.config import (
    DEFAULT_ADMIN_PORT,
    DEFAULT_BIND,
    DEFAULT_CLIENT_PORT,
    DEFAULT_DATA_DIR,
    DEFAULT_WORKER_PORT,
    EmqpConfig,
    JetStreamSettings,
)
from bus.emqp.core import BrokerSettings
from bus.emqp.eventmq_settings import (
    ROUTER,
    EventmqSettings,
    is_eventmq_config,
    read_eventmq_settings,
    value_in,
)
from bus.extension import ServiceOptions, curve_settings, parse_duration, parse_size
from bus.nats.options import nats_options, nats_settings
from bus.transport.curve_settings import CURVE_OPTIONS

if TYPE_CHECKING:
    from bus.emqp.server import EmqpService
    from bus.extension import Composition, ProductService


log = Logger(namespace="bus.emqp")

#: Started after the Event BUS when both run: composed, it publishes its activity
#: onto the local bus (the bridge journals it), which the Event BUS's build provides.
AFTER = ("eventbus",)


class Options(ServiceOptions):
    """``twistd emqp``'s options (``--emqp-*`` of ``twistd eventbus``), eventmq's router settings
    beneath them."""

    service = "emqp"
    env_prefix = "EMQP"
    synopsis = "[options]"
    longdesc = (
        "Serve the eMQP job broker: workers on --worker-port, clients on --client-port, "
        "STATUS and SCHEDULE on --admin-port; guaranteed requests kept in DATA-DIR."
    )
    optFlags = [
        [
            "no-haste",
            None,
            "A new cron schedule first runs at its next cron time, not at once as eventmq's "
            "scheduler runs it (interval schedules run at once either way).",
        ],
    ]
    optParameters = [
        ["bind", "b", DEFAULT_BIND, "Address to bind."],
        ["worker-port", None, DEFAULT_WORKER_PORT, "Port of the workers (0: a free one).", int],
        ["client-port", None, DEFAULT_CLIENT_PORT, "Port of the clients (0: a free one).", int],
        ["admin-port", None, DEFAULT_ADMIN_PORT, "Port of STATUS/SCHEDULE (0: a free one).", int],
        ["data-dir", "d", DEFAULT_DATA_DIR, "Directory of the guaranteed-request store."],
        ["heartbeat-interval", None, "3s", "HEARTBEAT period to workers and schedulers."],
        [
            "heartbeat-liveness",
            None,
            3,
            "Heartbeat periods of silence after which a worker is forgotten.",
            int,
        ],
        ["queue-limit", None, 10_000, "Requests waiting per queue; past it: an error reply.", int],
        ["max-queues", None, 1_000, "Queues known at once.", int],
        [
            "guarantee-retries",
            None,
            5,
            "Re-dispatches of a guaranteed request that has no retry-count header.",
            int,
        ],
        [
            "durability",
            None,
            "normal",
            "normal (survives kill -9) or full (fsync: survives power loss).",
        ],
        ["max-message-size", None, 1024 * 1024, "Largest message a peer may send.", int],
        *nats_options("the guaranteed requests", "EMQP", "emqp"),
        [
            "nats-broker-id",
            None,
            None,
            "With --store jetstream: this broker's name among the brokers (default: one "
            "made once and kept in --data-dir).",
        ],
        [
            "reply-linger",
            None,
            "10s",
            "How long answers wait for a client that takes none (gone, or not reading).",
        ],
        [
            "client-queue-bytes",
            None,
            "16MiB",
            "Answers waiting per client at most, in bytes; past it they are dropped.",
        ],
        [
            "client-queue-messages",
            None,
            10_000,
            "Answers waiting per client at most, in messages; past it they are dropped.",
            int,
        ],
        ["client-hwm", None, 1000, "Messages ZeroMQ itself queues per client.", int],
        ["stats-interval", None, "10s", "How often status is logged and status.json written."],
        [
            "scheduler",
            None,
            "builtin",
            "builtin: the broker keeps SCHEDULEs in its store and fires them; external: "
            "it forwards them to a connected eventmq scheduler peer.",
        ],
        ["max-schedules", None, 100_000, "Schedules kept at once.", int],
        *CURVE_OPTIONS,
        [
            "eventmq-config",
            "C",
            None,
            "eventmq's INI file, read as its router reads it ([global], then [router]; "
            "default: $EVENTMQ_CONFIG_FILE, else /etc/eventmq.conf when it exists), under "
            "these options; --config FILE too when FILE is one, as emq-router takes it.",
        ],
    ]

    def __init__(self) -> None:
        ServiceOptions.__init__(self)
        self.eventmq = EventmqSettings(program=ROUTER)
        #: This service's own command line (the whole of it when run alone).
        self._args: list[str] = []
        #: Run alone (``twistd -n emqp``): the whole command line, to read again at SIGHUP.
        self._alone: list[str] | None = None
        #: The settings as the last SIGHUP read them (changes that wait for the next start
        #: are told once, not at every SIGHUP).
        self.last_read: Options | None = None

    def parse_layered(self, options: Sequence[str] | None = None) -> None:
        args = router_args(sys.argv[1:] if options is None else options)
        self._alone = args
        ServiceOptions.parse_layered(self, args)

    def parse_command_line(self, args: Sequence[str]) -> None:
        """eventmq's settings under the config file's and the environment's values taken
        already, then the command line over everything (alone or composed alike)."""
        args = router_args(args)
        self._args = list(args)
        path = value_in(args, "--eventmq-config", "-C") or self["eventmq-config"] or None
        self.eventmq = read_eventmq_settings(
            None if path is None else str(path), os.environ, ROUTER
        )
        specs = {spec.name: spec for spec in self.option_specs()}
        for name, (value, source) in router_options(self.eventmq).items():
            if name not in self.sources:
                self[name] = self._coerced(specs[name], value, source)
        ServiceOptions.parse_command_line(self, args)

    def postOptions(self) -> None:
        self["emqp-config"] = config_from_options(self)

    def read_again(self) -> Options:
        """These options as they read now: the same command line over the files and the
        variables as they are (a SIGHUP); a usage error when they cannot be read."""
        fresh = type(self)()
        if self._alone is not None:
            fresh.parse_layered(self._alone)
            return fresh
        # Composed into the product: its --config file, then this service's own options.
        from bus.application.options import load_config_file

        path = config_path_in(sys.argv[1:]) or os.environ.get("EVENTBUS_CONFIG") or ""
        tables = load_config_file(path) if path else {}
        ServiceOptions.apply_defaults(fresh, tables, os.environ, path, also_known=self.also_known)
        fresh.parse_command_line(self._args)
        return fresh


def router_args(args: Sequence[str]) -> list[str]:
    """``--config FILE`` of eventmq's INI file (emq-router's long form of ``-C``) as
    ``--eventmq-config FILE``; the rest as it is."""
    translated = list(args)
    for index, arg in enumerate(translated):
        if arg == "--":
            break
        name, equals, value = arg.partition("=")
        if name != "--config":
            continue
        path = value if equals else (translated[index + 1] if index + 1 < len(args) else "")
        if path and is_eventmq_config(path, "emqp", ROUTER.sections):
            translated[index] = f"--eventmq-config={path}" if equals else "--eventmq-config"
    return translated


def _address(name: str, value: str, source: str) -> tuple[str, str]:
    """(host, port) of eventmq's ``tcp://HOST:PORT``."""
    scheme, _, rest = value.partition("://")
    host, _, port = rest.rpartition(":")
    if scheme != "tcp" or not host or not port.isdigit():
        raise usage.UsageError(
            f"{source}: eventmq's {name}={value}: this broker binds tcp://HOST:PORT only"
        )
    return host.strip("[]"), port


def router_options(settings: EventmqSettings) -> dict[str, tuple[str, str]]:
    """Our option -> (value, source) for the router settings we honour: the three
    addresses as ``bind`` and the ports (their hosts must agree: one --bind), ``HWM`` as
    ``queue-limit``, ``HEARTBEAT_INTERVAL``, and ``HEARTBEAT_TIMEOUT`` (seconds of a
    worker's silence) as ``heartbeat-liveness``, in eventmq's heartbeat intervals rounded up."""
    values = settings.values
    chosen: dict[str, tuple[str, str]] = {}
    hosts: dict[str, tuple[str, str]] = {}
    for name, option in (
        ("BACKEND_ADDR", "worker-port"),
        ("FRONTEND_ADDR", "client-port"),
        ("ADMINISTRATIVE_ADDR", "admin-port"),
    ):
        if name in values:
            value, source = values[name]
            host, port = _address(name, value, source)
            chosen[option] = (port, source)
            hosts[name] = (host, f"{name}={value} ({source})")
    if len({host for host, _ in hosts.values()}) > 1:
        given = "; ".join(where for _, where in hosts.values())
        raise usage.UsageError(
            f"eventmq's addresses bind different hosts ({given}): this broker binds its "
            "three ports on one address (--bind)"
        )
    if hosts:
        host, where = next(iter(hosts.values()))
        chosen["bind"] = (host, where.partition(" (")[2].rstrip(")"))
    if "HWM" in values:
        chosen["queue-limit"] = values["HWM"]
    interval = 3.0  # eventmq's HEARTBEAT_INTERVAL by default, as ours
    if "HEARTBEAT_INTERVAL" in values:
        chosen["heartbeat-interval"] = values["HEARTBEAT_INTERVAL"]
        interval = parse_duration(values["HEARTBEAT_INTERVAL"][0])
    if "HEARTBEAT_TIMEOUT" in values:
        value, source = values["HEARTBEAT_TIMEOUT"]
        try:
            timeout = float(value)
        except ValueError:
            raise usage.UsageError(
                f"{source}: eventmq's HEARTBEAT_TIMEOUT wants seconds, not {value!r}"
            ) from None
        if interval > 0 and timeout > 0:
            chosen["heartbeat-liveness"] = (str(max(1, math.ceil(timeout / interval))), source)
    return chosen


def config_from_options(options: usage.Options | dict[str, Any]) -> EmqpConfig:
    """The broker's settings from its options; a usage error names the option at fault."""
    durability = options["durability"]
    if durability not in ("normal", "full"):
        raise usage.UsageError("--durability must be normal or full")
    for name in ("worker-port", "client-port", "admin-port"):
        if not 0 <= int(options[name]) <= 65535:
            raise usage.UsageError(f"--{name} must be a port number (0 picks a free one)")
    ports = [int(options[n]) for n in ("worker-port", "client-port", "admin-port")]
    chosen = [p for p in ports if p]
    if len(chosen) != len(set(chosen)):
        raise usage.UsageError("--worker-port, --client-port and --admin-port must differ")
    interval = parse_duration(options["heartbeat-interval"])
    if interval <= 0:
        raise usage.UsageError("--heartbeat-interval must be above 0")
    positive = (
        "heartbeat-liveness",
        "queue-limit",
        "max-queues",
        "max-message-size",
        "client-queue-messages",
        "client-hwm",
        "max-schedules",
    )
    for name in positive:
        if int(options[name]) < 1:
            raise usage.UsageError(f"--{name} must be at least 1")
    if options["scheduler"] not in ("builtin", "external"):
        raise usage.UsageError("--scheduler must be builtin or external")
    if int(options["guarantee-retries"]) < 0:
        raise usage.UsageError("--guarantee-retries must be 0 or more")
    jetstream = nats_settings(
        options, JetStreamSettings, broker_id=str(options.get("nats-broker-id") or "")
    )
    return EmqpConfig(
        jetstream=jetstream,
        curve=curve_settings(options),
        bind=options["bind"],
        worker_port=ports[0],
        client_port=ports[1],
        admin_port=ports[2],
        data_dir=Path(options["data-dir"]),
        durability=durability,
        broker=BrokerSettings(
            heartbeat_interval=interval,
            heartbeat_liveness=int(options["heartbeat-liveness"]),
            queue_limit=int(options["queue-limit"]),
            max_queues=int(options["max-queues"]),
            guarantee_retries=int(options["guarantee-retries"]),
            scheduler=options["scheduler"],
            max_schedules=int(options["max-schedules"]),
            cron_haste=not options.get("no-haste", False),
        ),
        max_message_size=int(options["max-message-size"]),
        stats_interval=parse_duration(options["stats-interval"]),
        reply_linger=parse_duration(options.get("reply-linger", "10s")),
        client_hwm=int(options["client-hwm"]),
        client_queue_bytes=parse_size(options["client-queue-bytes"]),
        client_queue_messages=int(options["client-queue-messages"]),
    )


def build(options: usage.Options | dict[str, Any], composition: Composition) -> EmqpService:
    """The broker; composed with the Event BUS, its job life goes onto the bus."""
    from bus.emqp.server import EmqpService

    config = options.get("emqp-config") or config_from_options(options)
    settings: EventmqSettings | None = getattr(options, "eventmq", None)
    if settings is not None and settings.path is not None:
        log.info("eventmq settings read from {path} ([global], then [router])", path=settings.path)
    for line in settings.not_honoured() if settings is not None else ():
        log.warn("{line}", line=line)
    service = EmqpService(config, activity=composition.activity("emqp"))
    if isinstance(options, Options):  # a command line to read again (not a tac's mapping)
        on_sighup(service.reactor, lambda: reload_settings(service, options))
    return service


#: Options a SIGHUP applies to the running broker; any other that changed is logged as
#: taking effect at the next start (ports, bind, data directory, durability, the sockets'
#: options, the scheduler, the server's key).
RELOADED = frozenset(
    {
        "heartbeat-interval",
        "heartbeat-liveness",
        "queue-limit",
        "max-queues",
        "guarantee-retries",
        "max-schedules",
        "no-haste",
        "stats-interval",
        "reply-linger",
        "client-queue-bytes",
        "client-queue-messages",
        "client-certs",
    }
)


def reload_settings(service: EmqpService, options: Options) -> None:
    """At SIGHUP: read the settings again, apply what changed and can change while
    serving, log every change in one line; settings that cannot be read are one error
    line and change nothing. A SIGHUP never ends the broker."""
    prefix = "" if options._alone is not None else "emqp-"
    if not service.running:
        log.info("SIGHUP while the eMQP broker is stopped: ignored")
        return
    service.reread_client_certs()
    try:
        fresh = options.read_again()
    except (usage.UsageError, ValueError, OSError) as error:
        log.error(
            "SIGHUP: eMQP broker settings not read again, kept as they were: {error}",
            error=str(error),
        )
        return
    before = options.last_read or options
    changed = {
        spec.name: (before[spec.name], fresh[spec.name])
        for spec in Options.option_specs()
        if before.get(spec.name) != fresh.get(spec.name)
    }
    for line in fresh.eventmq.not_honoured():
        if line not in before.eventmq.not_honoured():
            log.warn("{line}", line=line)
    options.last_read = fresh
    if not changed:
        log.info("SIGHUP: eMQP broker settings read again, nothing changed")
        return
    curve_on = service.curve.enabled
    for name, (old, new) in sorted(changed.items()):
        now = name in RELOADED and (name != "client-certs" or curve_on)
        log.info(
            "SIGHUP: --{prefix}{name} {old} -> {new}{later}",
            prefix=prefix,
            name=name,
            old=old,
            new=new,
            later="" if now else " (takes effect when the broker starts again)",
        )
        if now:
            options[name] = new
    options["emqp-config"] = config_from_options(options)
    service.reconfigure(options["emqp-config"])


def makeService(options: usage.Options | dict[str, Any]) -> ProductService:
    """The broker alone (``twistd -n emqp``)."""
    from bus.extension import standalone

    return standalone("emqp", build, options)
