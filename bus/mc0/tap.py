"""``twistd -n mc0``: the mc0 broker alone; composed as the ``mc0`` service of ``twistd -n
eventbus`` (options prefixed ``--mc0-``). Options also come from ``MC0_<OPTION>`` variables and
the ``[mc0]`` table of a ``--config`` file."""

from __future__ import annotations

import re
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
from bus.mc0.config import (
    DEFAULT_BIND,
    DEFAULT_DATA_DIR,
    DEFAULT_PORT,
    Mc0ClusterSettings,
    Mc0Config,
)
from bus.nats.options import cluster_options, cluster_settings, tls_assured

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
    synopsis = (
        "[--bind ADDR] [--port P] [--server-cert FILE] [--client-certs DIR] [--plain] [--nats URLS]"
    )
    longdesc = (
        "Serve mc0 (Marionette Collective 0MQ v0.3): topic pub/sub over one CURVE-secured "
        "ROUTER. Without --server-cert the key pair is kept in DATA-DIR (made on first start). "
        "With --nats, brokers of several hosts are one topic space over NATS."
    )
    optFlags = [
        ["plain", None, "Turn CURVE off: no encryption, no client authentication."],
        ["mirror", None, "Mirror PUTs onto the Event BUS of this process under /mc0/<topic>/."],
        [
            "nats-without-tls",
            None,
            "With --nats and CURVE: carry the topics over NATS connections without TLS "
            "(refused unless given: CURVE protects them only as far as this broker).",
        ],
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
        *cluster_options(
            "brokers of several hosts as one topic space (each subscribes to the topics its "
            "clients hold)"
        ),
        [
            "nats-subject-prefix",
            None,
            "mc0",
            "With --nats: the subjects' first token (the brokers of one topic space share it).",
        ],
        [
            "nats-hold",
            None,
            10_000,
            "With --nats: PUTs held while the link to NATS is down, at most (beyond: ERROR).",
            int,
        ],
        [
            "nats-broker-id",
            None,
            None,
            "With --nats: this broker's name among the brokers (default: host name and a "
            "random part).",
        ],
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
        cluster=_cluster(options, plain),
        bind=options["bind"],
        port=port,
        data_dir=data_dir,
        curve=CurveSettings() if plain else curve_settings(options, key_dir=data_dir),
        mirror=bool(options.get("mirror")),
        broker=settings,
        send_hwm=int(options["send-hwm"]),
    )


_PREFIX = re.compile(r"[A-Za-z0-9_-]+(\.[A-Za-z0-9_-]+)*")


def _cluster(options: usage.Options | dict[str, Any], plain: bool) -> Mc0ClusterSettings | None:
    """``--nats`` and its options; CURVE's topics over NATS only with TLS, or when told."""
    prefix = str(options.get("nats-subject-prefix") or "mc0")
    if not _PREFIX.fullmatch(prefix) or len(prefix) > 200:
        raise usage.UsageError(
            "--nats-subject-prefix must be NATS subject tokens (letters, digits, - and _, "
            "dot-separated; 200 characters at most)"
        )
    hold = int(options.get("nats-hold") or 10_000)
    if hold < 1:
        raise usage.UsageError("--nats-hold must be at least 1")
    broker_id = str(options.get("nats-broker-id") or "")
    if len(broker_id.encode()) > 255:
        raise usage.UsageError("--nats-broker-id is 255 bytes at most")
    without_tls = bool(options.get("nats-without-tls"))
    cluster = cluster_settings(
        options,
        Mc0ClusterSettings,
        subject_prefix=prefix,
        hold_messages=hold,
        without_tls=without_tls,
        broker_id=broker_id,
    )
    if cluster is None:
        if without_tls:
            raise usage.UsageError("--nats-without-tls needs --nats")
        return None
    if not plain and not without_tls and not tls_assured(cluster):
        raise usage.UsageError(
            "--nats: this broker's clients are CURVE clients, and their topics would go over "
            "NATS without TLS (readable on the network between the broker and the servers): "
            "give tls:// URLs or --nats-tls-ca, or --nats-without-tls to carry them anyway"
        )
    return cluster


def build(options: usage.Options | dict[str, Any], composition: Composition) -> Mc0Service:
    """The broker; composed with the Event BUS, it may mirror PUTs onto it (``--mirror``)."""
    from bus.mc0.server import Mc0Service

    config = options.get("mc0-config") or config_from_options(options)
    return Mc0Service(config, composition.activity("mc0"))


def makeService(options: usage.Options | dict[str, Any]) -> ProductService:
    """The broker alone (``twistd -n mc0``)."""
    from bus.extension import standalone

    return standalone("mc0", build, options)
