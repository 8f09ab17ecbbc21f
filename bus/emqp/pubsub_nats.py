"""The PUBLISH service's link to the other brokers (``--nats``): core NATS on the reactor
through :class:`bus.nats.client.NatsClient`, around :mod:`bus.emqp.pubsub_cluster`.

Each batch of publications the service sends to its own subscribers goes to the cluster in
one write; what comes from the cluster goes to :attr:`PubsubLink.on_remote`. A publication
the servers cannot take (its message over their ``max_payload``, its subject over the
command line they read) is not sent, and counted by reason; so is one that finds no
connection. Its own subscribers have it either way.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import Any

from twisted.internet import defer, threads
from twisted.logger import Logger

from bus.emqp import pubsub_cluster
from bus.emqp.pubsub_cluster import BadPublication, Interest, Seen
from bus.extension import Metric, StartupError, counter, counters_by, gauge
from bus.nats import codec, jsapi
from bus.nats.blocking import connection
from bus.nats.client import NotConnected, Subscription, client_for, connect_at_start
from bus.nats.codec import Msg, ProtocolError
from bus.nats.handshake import ConnectError
from bus.nats.limits import DEFAULT_CONTROL_LINE, longest_control_line
from bus.nats.seen import ServerSeen, servers_seen
from bus.nats.settings import NatsSettings
from bus.util.droplog import DropCounter, RefusalCounter

log = Logger(namespace="bus.emqp.pubsub")

#: The longest subject probed for at start: a topic of 1 MiB of escaped bytes would need
#: more, and is refused (counted) when the servers do not take it.
PROBED_LINE = 65536


class PubsubLink:
    """One broker's connection to the others (see the module's text)."""

    def __init__(
        self,
        reactor: Any,
        settings: NatsSettings,
        on_remote: Callable[[list[list[bytes]]], None],
    ) -> None:
        self.reactor = reactor
        self.settings = settings
        self.prefix = settings.subject_prefix or pubsub_cluster.DEFAULT_SUBJECT_PREFIX
        self.on_remote = on_remote
        self.origin = pubsub_cluster.new_origin()
        self._sequence = itertools.count(1)
        self.client = client_for(reactor, settings, f"emqp-pubsub-{self.origin.hex()}", echo=False)
        self.interest = Interest(self.prefix)
        self.seen = Seen()
        self._subscriptions: dict[str, Subscription] = {}
        #: The longest command line the servers read (probed at start).
        self.max_control_line = DEFAULT_CONTROL_LINE
        #: Publications not sent to the cluster, by reason (its own subscribers had them).
        self.refused = RefusalCounter(
            log,
            "{count} publications not sent to the other brokers ({reason}): {detail}",
            reactor.seconds,
        )
        #: Messages from the cluster no broker made.
        self.bad = DropCounter(log, "messages from the other brokers", reactor.seconds)
        self.sent = 0
        self.received = 0
        #: This broker's own publications heard back from the cluster, dropped.
        self.own_returned = 0

    def open(self) -> defer.Deferred[None]:
        """Connect (an unreachable cluster is a start-up error) and ask the servers how long
        a command line they read."""
        waiting = connect_at_start(self.client, self.settings.connect_timeout)

        def connected(_: object) -> defer.Deferred[int]:
            return threads.deferToThread(
                longest_control_line,
                lambda: connection(self.settings, name=f"emqp-pubsub-probe-{self.origin.hex()}"),
                PROBED_LINE,
            )

        def probed(line: int) -> None:
            self.max_control_line = line
            log.info(
                "eMQP PUBLISH service {origin} on NATS {servers}: the servers take messages of "
                "up to {payload} bytes and subjects of up to {subject} bytes",
                origin=self.origin.hex(),
                servers=", ".join(self.settings.servers),
                payload=self.client.max_payload,
                subject=self.max_subject_bytes,
            )

        def failed(failure: Any) -> None:
            self.client.stop()
            error = failure.value
            if isinstance(error, (ConnectError, OSError, ProtocolError)):
                raise StartupError("nats", f"{', '.join(self.settings.servers)}: {error}")
            failure.raiseException()

        opening: defer.Deferred[Any] = waiting.addCallback(connected)
        return opening.addCallbacks(probed, failed)

    def close(self) -> None:
        """Leave the cluster."""
        self.client.stop()

    @property
    def max_subject_bytes(self) -> int:
        """The longest subject a publication may have (the rest of its line besides)."""
        return max(0, self.max_control_line - jsapi.PUBLISH_LINE_BEYOND_SUBJECT)

    # -- out -------------------------------------------------------------------------------------

    def publish(self, publications: list[list[bytes]]) -> None:
        """``[topic, message]`` each, as the service's own subscribers got them: to the other
        brokers in one write, each that fits."""
        client = self.client
        if not client.connected:
            for _ in publications:
                self.refused.refuse("not-connected", detail="no NATS server now")
            return
        limit = client.max_payload - pubsub_cluster.HEAD_BYTES
        longest = self.max_subject_bytes
        origin, sequence, prefix = self.origin, self._sequence, self.prefix
        lines = []
        for topic, message in publications:
            if len(topic) + len(message) > limit:
                self.refused.refuse(
                    "too-large-for-cluster",
                    detail=f"one of {len(topic) + len(message)} bytes (the NATS servers take "
                    f"{limit} beside its head)",
                )
                continue
            subject = pubsub_cluster.subject(prefix, topic)
            if len(subject) > longest:
                self.refused.refuse(
                    "subject-too-long",
                    detail=f"a topic whose subject is {len(subject)} bytes (the NATS servers "
                    f"take {longest})",
                )
                continue
            payload = pubsub_cluster.encode(origin, next(sequence), topic, message)
            lines.append(codec.pub(subject.encode(), payload))
        if not lines:
            return
        try:
            client.publish_raw(b"".join(lines))
        except NotConnected:
            for _ in lines:
                self.refused.refuse("not-connected", detail="no NATS server now")
            return
        self.sent += len(lines)

    # -- interest --------------------------------------------------------------------------------

    def subscriptions(self, messages: list[list[bytes]]) -> None:
        """The XPUB's subscription messages: listen to what the subscribers want now (the new
        filters before the old ones end, so that nothing is missed between)."""
        added, ended = self.interest.changed(messages)
        for subject in added:
            self._subscriptions[subject] = self.client.subscribe(subject, self._heard)
        for subject in ended:
            subscription = self._subscriptions.pop(subject, None)
            if subscription is not None:
                self.client.unsubscribe(subscription)

    def _heard(self, msg: Msg) -> None:
        try:
            origin, sequence, topic, message = pubsub_cluster.decode(msg.payload)
        except BadPublication as error:
            self.bad.drop(error.reason, str(error), msg.subject[:64])
            return
        if origin == self.origin:
            # ``echo: false`` holds for one connection only: what this broker published on a
            # connection it has since left can still come back on its new one (a server
            # cut off with it held the messages, then routed them once the cut healed).
            self.own_returned += 1
            return
        if not self.seen.first(origin, sequence):
            return
        self.received += 1
        self.on_remote([[topic, message]])

    # -- what it says ----------------------------------------------------------------------------

    def servers_seen(self) -> list[ServerSeen]:
        """Each server known, and whether this service's connection is on it."""
        url = self.client.server_url
        live = [("pubsub", url, self.client.info, True)] if url is not None else []
        return servers_seen(self.client.servers, live)

    def status(self) -> dict[str, Any]:
        """The cluster as this service sees it, for ``/status``."""
        return {
            "connected": self.client.connected,
            "origin": self.origin.hex(),
            "servers": [server.status() for server in self.servers_seen()],
            "authentication": self.settings.credentials.kind,
            "subject_prefix": self.prefix,
            "sent": self.sent,
            "received": self.received,
            "repeats_dropped": self.seen.repeats,
            "own_returned": self.own_returned,
            "refused": dict(self.refused.counts),
            "bad": dict(self.bad.counts),
            "prefixes": len(self.interest.prefixes),
            "filters": sorted(self.interest.filters)[:100],
            "max_payload": self.client.max_payload,
            "max_subject_bytes": self.max_subject_bytes,
            "disconnects": self.client.disconnects,
            "lame_duck_moves": self.client.lame_duck_moves,
            "slow_consumer_drops": self.client.slow_consumer_drops,
        }

    def metrics(self) -> list[Metric]:
        """The cluster's counts, for ``/metrics``."""
        servers = self.servers_seen()
        return [
            gauge(
                "emqp_pubsub_nats_connected",
                "PUBLISH service: 1 while connected to a NATS server (--nats)",
                int(self.client.connected),
            ),
            counter(
                "emqp_pubsub_nats_sent",
                "PUBLISH service: publications sent to the other brokers",
                self.sent,
            ),
            counter(
                "emqp_pubsub_nats_received",
                "PUBLISH service: publications from the other brokers sent to subscribers",
                self.received,
            ),
            counter(
                "emqp_pubsub_nats_repeats",
                "PUBLISH service: publications heard twice while the filters changed, dropped",
                self.seen.repeats,
            ),
            counter(
                "emqp_pubsub_nats_own_returned",
                "PUBLISH service: its own publications heard back from the cluster (sent on a "
                "connection it has left), dropped",
                self.own_returned,
            ),
            counters_by(
                "emqp_pubsub_nats_refused",
                "PUBLISH service: publications not sent to the other brokers, by reason",
                "reason",
                self.refused.counts,
            ),
            gauge(
                "emqp_pubsub_nats_filters",
                "PUBLISH service: NATS subject filters listened to for the subscribers",
                len(self.interest.filters),
            ),
            gauge(
                "emqp_pubsub_nats_servers",
                "PUBLISH service: NATS servers known (given or learnt)",
                len(servers),
            ),
        ]
