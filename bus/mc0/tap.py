"""``twistd -n mc0``: the mc0 broker alone; composed as the ``mc0`` service of ``twistd -n
eventbus`` (options prefixed ``--mc0-``). Options also come from ``MC0_<OPTION>`` variables and
the ``[mc0]`` table of a ``--config`` file."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from twisted.python import usage

from bus.extension import (
    CurveSettings,
    ServiceOptions,
    curve_options,
    curve_settings,
    parse_duration,
)
from bus.mc0.codec import MAX_TTL_MS
from bus.mc0.config import DEFAULT_BIND, DEFAULT_DATA_DIR, DEFAULT_PORT, Mc0Config

if TYPE_CHECKING:
    from bus.extension import Composition, ProductService
    from bus.mc0.server import Mc0Service


#: Started after the Event BUS when both run: composed, it publishes its activity
#: onto the local bus (the bridge journals it), which the Event BUS's build provides.
AFTER = ("eventbus",)


class Options(ServiceOptions):
    """``twistd mc0``'s options (``--mc0-*`` of ``twistd eventbus``)."""

    service = "mc0"
    env_prefix = "MC0"
    synopsis = "[--bind ADDR] [--port P] [--server-cert FILE] [--client-certs DIR] [--plain]"
    longdesc = (
        "Serve mc0 (Marionette Collective 0MQ v0.3): topic pub/sub over one CURVE-secured "
        "ROUTER. Without --server-cert the key pair is kept in DATA-DIR (made on first start)."
    )
    optFlags = [
        ["plain", None, "Turn CURVE off: no encryption, no client authentication."],
        ["mirror", None, "Mirror PUTs onto the Event BUS of this process under /mc0/<topic>/."],
    ]
    optParameters = [
        ["bind", "b", DEFAULT_BIND, "Address to bind."],
        ["port", "p", DEFAULT_PORT, "Port (0: pick a free one).", int],
        ["data-dir", "d", DEFAULT_DATA_DIR, "Directory of the server's own key pair."],
        *curve_options(kept_key=True),
        ["default-ttl", None, "30s", "TTL of a client whose CONNECT names none."],
        ["min-ttl", None, "100ms", "Smallest TTL a CONNECT may ask for."],
        ["max-ttl", None, "1d", "Largest TTL a CONNECT may ask for."],
        ["max-message-size", None, 1024 * 1024, "Largest message in bytes (ERROR above).", int],
        ["max-clients", None, 100_000, "Most clients known at once.", int],
        ["max-topics-per-client", None, 10_000, "Most topics one client may hold.", int],
        ["send-hwm", None, 10_000, "Messages queued per client before MESSAGEs are dropped.", int],
    ]

    def postOptions(self) -> None:
        if self["plain"] and self["client-certs"]:
            raise usage.UsageError("--client-certs needs CURVE: it cannot go with --plain")
        self["mc0-config"] = config_from_options(self)


def _ms(options: usage.Options | dict[str, Any], name: str) -> int:
    milliseconds = round(parse_duration(options[name]) * 1000)
    if not 0 < milliseconds <= MAX_TTL_MS:
        raise usage.UsageError(f"--{name} must be between 1ms and {MAX_TTL_MS}ms")
    return milliseconds


def config_from_options(options: usage.Options | dict[str, Any]) -> Mc0Config:
    """The broker's settings from its options; a usage error names the option at fault."""
    from bus.mc0.core import BrokerSettings

    port = int(options["port"])
    if not 0 <= port <= 65535:
        raise usage.UsageError("--port must be 0..65535")
    settings = BrokerSettings(
        default_ttl_ms=_ms(options, "default-ttl"),
        min_ttl_ms=_ms(options, "min-ttl"),
        max_ttl_ms=_ms(options, "max-ttl"),
        max_message_bytes=int(options["max-message-size"]),
        max_clients=int(options["max-clients"]),
        max_topics_per_client=int(options.get("max-topics-per-client", 10_000)),
    )
    if not settings.min_ttl_ms <= settings.default_ttl_ms <= settings.max_ttl_ms:
        raise usage.UsageError("--default-ttl must lie between --min-ttl and --max-ttl")
    if settings.max_message_bytes < 256:
        raise usage.UsageError("--max-message-size must be at least 256 bytes")
    if min(settings.max_clients, settings.max_topics_per_client, int(options["send-hwm"])) < 1:
        raise usage.UsageError(
            "--max-clients, --max-topics-per-client and --send-hwm must be positive"
        )
    data_dir = Path(options["data-dir"])
    plain = bool(options.get("plain"))
    return Mc0Config(
        bind=options["bind"],
        port=port,
        data_dir=data_dir,
        curve=CurveSettings() if plain else curve_settings(options, key_dir=data_dir),
        mirror=bool(options.get("mirror")),
        broker=settings,
        send_hwm=int(options["send-hwm"]),
    )


def build(options: usage.Options | dict[str, Any], composition: Composition) -> Mc0Service:
    """The broker; composed with the Event BUS, it may mirror PUTs onto it (``--mirror``)."""
    from bus.mc0.server import Mc0Service

    config = options.get("mc0-config") or config_from_options(options)
    return Mc0Service(config, composition.activity("mc0"))


def makeService(options: usage.Options | dict[str, Any]) -> ProductService:
    """The broker alone (``twistd -n mc0``)."""
    from bus.extension import standalone

    return standalone("mc0", build, options)
