"""The PUBLISH service's logic, sans-I/O: publishers' messages in, subscribers' out.

:class:`Relay` takes a batch of messages read from the incoming ROUTER (identity first) and
returns what goes out on the PUB port, ``[topic, message]`` each. What the codec refuses is
dropped and counted by reason (one rate-limited warning per reason). Composed with the Event
BUS, each publication also goes onto the bus under ``/emqp/publish/<topic>/`` (producer
``emqp-pubsub``): one that the bus cannot take (a topic it refuses) is counted, not lost for
the subscribers.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from twisted.logger import Logger

from bus.emqp import pubsub_codec
from bus.extension import NO_ACTIVITY, ActivitySink, CurveSettings, ProtocolError
from bus.nats.settings import NatsSettings
from bus.transport.names import peer_name
from bus.util.droplog import DropCounter

#: The bus topic a publication is mirrored under, around its eventmq topic.
ACTIVITY_TOPIC = "/emqp/publish/{topic}/"


class Relay:
    """Counts what it relays; :meth:`receive_batch` never raises for a peer's input."""

    def __init__(
        self,
        clock: Callable[[], float],
        log: Logger,
        activity: ActivitySink = NO_ACTIVITY,
    ) -> None:
        self.log = log
        self.activity = activity
        self._mirroring = activity is not NO_ACTIVITY
        self.drops = DropCounter(log, "publisher messages", clock)
        #: Publications relayed to subscribers that the bus would not take.
        self.mirror_drops = DropCounter(log, "bus mirrors", clock)
        self.received = 0
        self.published = 0
        self.heartbeats = 0
        self.mirrored = 0
        self.unmirrored = 0
        #: Publications by topic, for the console and /status (bounded: see :meth:`_count`).
        self.topics: dict[str, int] = {}

    def receive_batch(self, batch: list[list[bytes]]) -> list[list[bytes]]:
        """Messages as the ROUTER read them -> the subscribers' messages, in order."""
        out: list[list[bytes]] = []
        parse = pubsub_codec.parse
        for frames in batch:
            self.received += 1
            identity = frames[0] if frames else b""
            try:
                command = parse(frames[1:])
            except ProtocolError as error:
                self.drops.drop(error.reason, str(error), identity)
                continue
            if isinstance(command, pubsub_codec.Heartbeat):
                self.heartbeats += 1
                continue
            out.append(pubsub_codec.subscriber_frames(command))
            self.published += 1
            self._count(command.topic)
            if self._mirroring:
                self._mirror(command, identity)
        return out

    #: Topics counted by name at most; publications on others count under "(other)".
    max_topics = 1000

    def _count(self, topic: bytes) -> None:
        name = topic.decode("utf-8")
        topics = self.topics
        if name in topics or len(topics) < self.max_topics:
            topics[name] = topics.get(name, 0) + 1
        else:
            topics["(other)"] = topics.get("(other)", 0) + 1

    def _mirror(self, command: pubsub_codec.Publish, identity: bytes) -> None:
        topic = command.topic.decode("utf-8")
        try:
            self.activity.publish(
                ACTIVITY_TOPIC.format(topic=topic),
                {
                    "topic": topic,
                    "message": command.message.decode("utf-8"),
                    "msgid": command.msgid.decode("utf-8"),
                    "publisher": peer_name(identity),
                },
            )
        except ValueError as error:
            self.unmirrored += 1
            self.mirror_drops.drop("unmirrorable", str(error), identity)
            return
        self.mirrored += 1


#: eventmq's PUBLISHER_INCOMING_ADDR and PUBLISHER_OUTGOING_ADDR (conf.py of 0.3.13).
DEFAULT_INCOMING_PORT = 47298
DEFAULT_OUTGOING_PORT = 47299


@dataclass(frozen=True, slots=True)
class PubsubConfig:
    """Where and how the PUBLISH service serves. A port of 0 picks a free one (tests)."""

    bind: str = "127.0.0.1"
    incoming_port: int = DEFAULT_INCOMING_PORT
    outgoing_port: int = DEFAULT_OUTGOING_PORT
    #: Largest message a publisher may send; libzmq drops the connection of one that sends more.
    max_message_size: int = 1024 * 1024
    #: Messages queued from publishers before ZeroMQ pushes back on them.
    publisher_hwm: int = 10_000
    #: Messages queued per subscriber; past it a slow subscriber misses messages (PUB).
    subscriber_hwm: int = 10_000
    read_budget: int = 256
    stats_interval: float = 10.0
    tcp_keepalive_idle: int | None = 60
    #: CURVE on both ports, the allow-list, and its keys' ``role`` (publisher, subscriber).
    curve: CurveSettings = field(default_factory=CurveSettings)
    #: The NATS cluster whose other brokers' subscribers get this one's publications, and
    #: the other way round (``--nats``; None: this broker alone). See
    #: :mod:`bus.emqp.pubsub_cluster`.
    nats: NatsSettings | None = None
