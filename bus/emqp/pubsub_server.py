"""eventmq's PUBLISH service (``emq-pubsub``) as a Twisted service: a ROUTER publishers send
PUBLISH to (``--incoming-port``) and a PUB subscribers connect to (``--outgoing-port``),
around a :class:`bus.emqp.pubsub_core.Relay`.

The ROUTER is read in budgeted batches; each batch's publications go out on the PUB in one
call, in order. A PUB never blocks: a subscriber whose queue is full (``--subscriber-hwm``)
misses messages, as with eventmq's own service. Both ports take CURVE through
:class:`bus.transport.serving.ServerPorts`, like every server of the product.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import zmq
from twisted.application.service import Service
from twisted.internet import defer
from twisted.logger import Logger

from bus.application.statusjson import config_json
from bus.emqp.pubsub_core import PubsubConfig, Relay
from bus.extension import (
    NO_ACTIVITY,
    ActivitySink,
    Metric,
    SocketFactory,
    SocketOptions,
    ZmqSocket,
    counter,
    counters_by,
    gauge,
    reactor_of,
)
from bus.transport.curve import role_policy
from bus.transport.security import ServerCurve
from bus.transport.serving import ServerPorts
from bus.transport.zmqsocket import bind_failure

if TYPE_CHECKING:
    from bus.emqp.pubsub_nats import PubsubLink

log = Logger(namespace="bus.emqp.pubsub")

#: The ports a key may connect to, by the ``role`` of its certificate (comma-separated).
_role_policy = role_policy({"emqp-publish": "publisher", "emqp-subscribe": "subscriber"})


class PubsubService(Service):
    """eventmq's PUBLISH service: PUBLISH in on the incoming ROUTER, ``[topic, message]`` out on the
    outgoing PUB (and onto the local bus when composed)."""

    name = "emqp-pubsub"

    def __init__(
        self,
        config: PubsubConfig,
        activity: ActivitySink = NO_ACTIVITY,
        reactor: Any = None,
    ) -> None:
        self.config = config
        self.reactor: Any = reactor_of(reactor)
        self.relay = Relay(self.reactor.seconds, log, activity)
        self.endpoints: dict[str, str] = {}
        self.incoming: ZmqSocket | None = None
        self.outgoing: ZmqSocket | None = None
        #: Publications the PUB socket would not take (it was closing).
        self.unsent = 0
        self._started_at = 0.0
        self._reported = -1
        self.curve = ServerCurve(
            "emqp-pubsub", config.curve, self.reactor.seconds, policy=_role_policy
        )
        self.ports = ServerPorts(self.reactor, self.curve, log)
        #: The other brokers (``--nats``), None when alone.
        self.link: PubsubLink | None = None
        if config.nats is not None:
            from bus.emqp.pubsub_nats import PubsubLink

            self.link = PubsubLink(self.reactor, config.nats, self._on_remote)

    # -- lifecycle -------------------------------------------------------------------------------

    def startService(self) -> defer.Deferred[None] | None:
        if self.running:
            return None
        self.ports.open(self._bind_all, undo=self._close_sockets)
        Service.startService(self)
        config = self.config
        self.ports.announce(config.bind, self.endpoints.values())
        self._started_at = self.reactor.seconds()
        if config.stats_interval > 0:
            self.ports.periodic.every(config.stats_interval, self._report)
        log.info(
            "eMQP PUBLISH service: publishers to {incoming}, subscribers on {outgoing}",
            incoming=self.endpoints["incoming"],
            outgoing=self.endpoints["outgoing"],
        )
        if self.link is not None:
            return self.link.open()
        return None

    def _bind_all(self, factory: SocketFactory) -> None:
        config = self.config
        self.incoming = factory.socket(
            zmq.ROUTER,
            self._on_publishers,
            SocketOptions(
                receive_hwm=config.publisher_hwm,
                tcp_keepalive_idle=config.tcp_keepalive_idle,
                max_message_size=config.max_message_size,
                linger_ms=0,  # nothing is ever sent to a publisher
            ),
            read_budget=config.read_budget,
            name="emqp-pubsub-incoming",
        )
        # With other brokers, an XPUB: its subscribers' prefixes say what to listen to.
        link = self.link
        self.outgoing = factory.socket(
            zmq.PUB if link is None else zmq.XPUB,
            None if link is None else self._on_subscriptions,
            SocketOptions(
                send_hwm=config.subscriber_hwm,
                tcp_keepalive_idle=config.tcp_keepalive_idle,
                linger_ms=200,  # time for the last publications of a stop to leave
            ),
            name="emqp-pubsub-outgoing",
        )
        for name, sock, port, domain in (
            ("incoming", self.incoming, config.incoming_port, "emqp-publish"),
            ("outgoing", self.outgoing, config.outgoing_port, "emqp-subscribe"),
        ):
            address = f"tcp://{config.bind}:{port or '*'}"
            self.curve.secure(sock, domain)
            try:
                self.endpoints[name] = sock.bind(address)
            except zmq.ZMQError as error:
                raise bind_failure(error, f"{name}-port", address) from None
            sock.watch_connections()

    def _close_sockets(self) -> None:
        for sock in (self.incoming, self.outgoing):
            if sock is not None:
                sock.shutdown()
        self.incoming = self.outgoing = None

    def stopService(self) -> defer.Deferred[None]:
        if not self.running:
            return defer.succeed(None)
        Service.stopService(self)
        if self.incoming is not None:  # what has arrived goes out first
            self.incoming.doRead()
        self._close_sockets()
        self.ports.close()
        if self.link is not None:
            self.link.close()
        log.info(
            "eMQP PUBLISH service stopped: {published} published, {dropped} dropped",
            published=self.relay.published,
            dropped=self.relay.drops.total,
        )
        return defer.succeed(None)

    # -- traffic ---------------------------------------------------------------------------------

    def _on_publishers(self, batch: list[list[bytes]]) -> None:
        out = self.relay.receive_batch(batch)
        if not out:
            return
        sock = self.outgoing
        if sock is None or sock.closed:
            self.unsent += len(out)
            return
        self.unsent += len(out) - sock.send_many(out)
        if self.link is not None:
            self.link.publish(out)

    def _on_remote(self, out: list[list[bytes]]) -> None:
        """Publications of the other brokers' publishers, to this one's subscribers."""
        sock = self.outgoing
        if sock is None or sock.closed:
            self.unsent += len(out)
            return
        self.unsent += len(out) - sock.send_many(out)

    def _on_subscriptions(self, batch: list[list[bytes]]) -> None:
        if self.link is not None:
            self.link.subscriptions(batch)

    # -- status ----------------------------------------------------------------------------------

    def connections(self) -> dict[str, int]:
        """Peers connected to each port, by port."""
        sockets = (("incoming", self.incoming), ("outgoing", self.outgoing))
        return {name: sock.connections for name, sock in sockets if sock is not None}

    #: The console's charts (see :mod:`bus.web.console.view`).
    console_rates = {"publications": "published"}

    def status(self) -> dict[str, Any]:
        """Ports, connections, counts, the busiest topics, CURVE and the settings, for
        ``/status``."""
        relay = self.relay
        return {
            "endpoints": self.endpoints,
            "uptime_s": round(self.reactor.seconds() - self._started_at, 3),
            "connections": self.connections(),
            "received": relay.received,
            "published": relay.published,
            "heartbeats": relay.heartbeats,
            "dropped": dict(relay.drops.counts),
            "unsent": self.unsent,
            "mirrored": relay.mirrored,
            "unmirrored": relay.unmirrored,
            "topics": dict(sorted(relay.topics.items(), key=lambda item: -item[1])[:100]),
            "curve": self.curve.status(),
            "cluster": self.link.status() if self.link is not None else None,
            "config": config_json(self.config),
        }

    def metrics(self) -> list[Metric]:
        """The service's counts and connections, and its CURVE, for ``/metrics``."""
        relay = self.relay
        connected = self.connections()
        families = self.curve.metrics()
        families += [
            counter("emqp_pubsub_received", "PUBLISH service: messages from publishers", relay.received),
            counter("emqp_pubsub_published", "PUBLISH service: publications sent to subscribers", relay.published),
            counter("emqp_pubsub_heartbeats", "PUBLISH service: HEARTBEATs from publishers", relay.heartbeats),
            counters_by(
                "emqp_pubsub_messages_dropped",
                "PUBLISH service: bad messages from publishers dropped, by reason",
                "reason",
                relay.drops.counts,
            ),
            counter("emqp_pubsub_unsent", "PUBLISH service: publications the PUB port would not take", self.unsent),
            counter("emqp_pubsub_unmirrored", "PUBLISH service: publications the local bus refused", relay.unmirrored),
            gauge("emqp_pubsub_publishers", "PUBLISH service: publishers connected", connected.get("incoming", 0)),
            gauge("emqp_pubsub_subscribers", "PUBLISH service: subscribers connected", connected.get("outgoing", 0)),
        ]  # fmt: skip
        if self.link is not None:
            families += self.link.metrics()
        return families

    def _report(self) -> None:
        relay = self.relay
        if relay.received == self._reported:
            return  # nothing new: no line
        self._reported = relay.received
        connected = self.connections()
        log.info(
            "received {received}; published {published}; heartbeats {heartbeats}; dropped "
            "{dropped}; publishers {publishers}; subscribers {subscribers}",
            received=relay.received,
            published=relay.published,
            heartbeats=relay.heartbeats,
            dropped=relay.drops.total,
            publishers=connected.get("incoming", 0),
            subscribers=connected.get("outgoing", 0),
        )
