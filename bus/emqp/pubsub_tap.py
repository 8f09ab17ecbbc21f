"""``twistd -n emqp-pubsub``: eventmq's PUBLISH service (``emq-pubsub``) alone; composed into
``twistd -n eventbus`` as the ``emqp-pubsub`` service (options prefixed ``--emqp-pubsub-``).
Options also come from ``EMQP_PUBSUB_<OPTION>`` variables and the ``[emqp-pubsub]`` table of
a ``--config`` file."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from twisted.python import usage

from bus.emqp.pubsub_cluster import DEFAULT_SUBJECT_PREFIX
from bus.emqp.pubsub_core import DEFAULT_INCOMING_PORT, DEFAULT_OUTGOING_PORT, PubsubConfig
from bus.extension import ServiceOptions, curve_settings, parse_duration
from bus.nats.options import cluster_options, cluster_settings
from bus.nats.settings import NatsSettings
from bus.transport.curve_settings import CURVE_OPTIONS

if TYPE_CHECKING:
    from bus.emqp.pubsub_server import PubsubService
    from bus.extension import Composition, ProductService


#: Started after the Event BUS when both run: composed, it mirrors each publication onto
#: the local bus, which the Event BUS's build provides.
AFTER = ("eventbus",)


class Options(ServiceOptions):
    """``twistd emqp-pubsub``'s options (``--emqp-pubsub-*`` of ``twistd eventbus``)."""

    service = "emqp-pubsub"
    env_prefix = "EMQP_PUBSUB"
    synopsis = "[options]"
    longdesc = (
        "Serve eventmq's PUBLISH service (emq-pubsub): publishers send PUBLISH to "
        "--incoming-port (eventmq's PUBLISHER_INCOMING_ADDR), subscribers connect a SUB to "
        "--outgoing-port (PUBLISHER_OUTGOING_ADDR) and receive [topic, message]."
    )
    optParameters = [
        ["bind", "b", "127.0.0.1", "Address to bind."],
        [
            "incoming-port",
            None,
            DEFAULT_INCOMING_PORT,
            "Port publishers send PUBLISH to (0: a free one).",
            int,
        ],
        [
            "outgoing-port",
            None,
            DEFAULT_OUTGOING_PORT,
            "Port subscribers connect to (0: a free one).",
            int,
        ],
        ["max-message-size", None, 1024 * 1024, "Largest message a publisher may send.", int],
        [
            "publisher-hwm",
            None,
            10_000,
            "Messages ZeroMQ queues from publishers before it pushes back.",
            int,
        ],
        [
            "subscriber-hwm",
            None,
            10_000,
            "Messages queued per subscriber; a slower one misses those beyond.",
            int,
        ],
        ["stats-interval", None, "10s", "How often counts are logged (when they changed)."],
        *cluster_options("a PUBLISH at any broker reaches the subscribers of all, once"),
        [
            "nats-subject-prefix",
            None,
            DEFAULT_SUBJECT_PREFIX,
            "With --nats: the publications' subjects' first token (brokers that share it "
            "share their publications).",
        ],
        *CURVE_OPTIONS,
    ]

    def postOptions(self) -> None:
        self["emqp-pubsub-config"] = config_from_options(self)


def config_from_options(options: usage.Options | dict[str, Any]) -> PubsubConfig:
    """The service's settings from its options; a usage error names the option at fault."""
    ports = []
    for name in ("incoming-port", "outgoing-port"):
        port = int(options[name])
        if not 0 <= port <= 65535:
            raise usage.UsageError(f"--{name} must be a port number (0 picks a free one)")
        ports.append(port)
    if ports[0] and ports[0] == ports[1]:
        raise usage.UsageError("--incoming-port and --outgoing-port must differ")
    for name in ("max-message-size", "publisher-hwm", "subscriber-hwm"):
        if int(options[name]) < 1:
            raise usage.UsageError(f"--{name} must be at least 1")
    prefix = str(options.get("nats-subject-prefix") or DEFAULT_SUBJECT_PREFIX)
    tokens = prefix.split(".")
    if not all(t and not set(t) & set("*> \t\r\n") for t in tokens):
        raise usage.UsageError(
            "--nats-subject-prefix must be NATS subject tokens (no empty token, no *, > "
            "or whitespace)"
        )
    return PubsubConfig(
        bind=options["bind"],
        incoming_port=ports[0],
        outgoing_port=ports[1],
        max_message_size=int(options["max-message-size"]),
        publisher_hwm=int(options["publisher-hwm"]),
        subscriber_hwm=int(options["subscriber-hwm"]),
        stats_interval=parse_duration(options["stats-interval"]),
        curve=curve_settings(options),
        nats=cluster_settings(options, NatsSettings, subject_prefix=prefix),
    )


def build(options: usage.Options | dict[str, Any], composition: Composition) -> PubsubService:
    """The service; composed with the Event BUS, its publications go onto the bus too."""
    from bus.emqp.pubsub_server import PubsubService

    config = options.get("emqp-pubsub-config") or config_from_options(options)
    return PubsubService(config, activity=composition.activity("emqp-pubsub"))


def makeService(options: usage.Options | dict[str, Any]) -> ProductService:
    """The PUBLISH service alone (``twistd -n emqp-pubsub``)."""
    from bus.extension import standalone

    return standalone("emqp-pubsub", build, options)
