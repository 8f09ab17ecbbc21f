"""The mc0 broker's link to NATS: the :class:`bus.mc0.relay.Relay`'s uplink on the reactor.

One connection (:class:`bus.nats.client.NatsClient`, no echo: the server never hands a
broker its own PUTs, which its local subscribers had already), a subscription per topic
that has local subscribers, and a flush (PING, PONG) per batch of relayed PUTs. The
client reconnects to the next server (those the cluster names too), makes the
subscriptions again, and leaves a server in lame-duck mode for another before it closes.
"""

from __future__ import annotations

import os
import socket
from typing import Any

from twisted.internet import defer, threads
from twisted.logger import Logger

from bus.errors import StartupError
from bus.mc0.config import Mc0ClusterSettings
from bus.mc0.relay import Relay
from bus.nats.blocking import Connection
from bus.nats.client import NotConnected, Subscription, client_for
from bus.nats.codec import Msg, ProtocolError
from bus.nats.credentials import shown
from bus.nats.handshake import ConnectError
from bus.nats.limits import longest_control_line
from bus.nats.options import tls_assured
from bus.nats.seen import servers_seen
from bus.nats.settings import tls_context
from bus.util.metrics import Metric, counter, counters_by, gauge, gauges_by

log = Logger(namespace="bus.mc0.link")

#: What a PUB's command line holds beyond its subject (the sizes, the spaces).
_LINE_BEYOND_SUBJECT = 32


def broker_id(settings: Mc0ClusterSettings) -> bytes:
    """This broker's name among the brokers: given, else its host's name and a random part
    (a broker started again is another origin: nothing it relayed before comes back)."""
    if settings.broker_id:
        return settings.broker_id.encode()[:255]
    return f"{socket.gethostname()[:64]}-{os.urandom(4).hex()}".encode()


class NatsLink:
    """The relay's NATS side (:class:`bus.mc0.relay.Uplink`), and what ``/status`` and
    ``/metrics`` show of it."""

    def __init__(self, reactor: Any, settings: Mc0ClusterSettings, origin: bytes) -> None:
        self.reactor = reactor
        self.settings = settings
        self.origin = origin
        self.client = client_for(
            reactor, settings, f"mc0-{origin.decode('utf-8', 'replace')}", echo=False
        )
        self.client.listeners.append(self._changed)
        self.relay: Relay | None = None
        self._subscriptions: dict[bytes, Subscription] = {}
        self.flushes = 0
        self.flushes_failed = 0
        self.max_control_line = 0

    # -- the relay's uplink -------------------------------------------------------------------

    @property
    def connected(self) -> bool:
        """A connection is up and its handshake done."""
        return self.client.connected

    @property
    def max_payload(self) -> int:
        """The most bytes one message may hold (the server's INFO)."""
        return self.client.max_payload

    def publish(self, subject: bytes, payload: bytes) -> bool:
        """Send now; False without a connection."""
        try:
            self.client.publish(subject, payload)
        except NotConnected:
            return False
        return True

    def flush(self, token: int) -> None:
        """Ask the server's word on what was sent before; the relay hears of it."""
        self.flushes += 1
        self.client.flush().addCallbacks(
            self._flushed, self._flush_failed, callbackArgs=(token,), errbackArgs=(token,)
        )

    def _flushed(self, _: None, token: int) -> None:
        if self.relay is not None:
            self.relay.flushed(token)

    def _flush_failed(self, failure: Any, token: int) -> None:
        failure.trap(NotConnected)
        self.flushes_failed += 1
        if self.relay is not None:
            self.relay.flush_failed(token)

    def subscribe(self, topic: bytes, subject: bytes) -> None:
        """``topic``'s subject, kept across reconnections."""
        if topic in self._subscriptions:
            return
        relay = self.relay
        assert relay is not None

        def received(msg: Msg) -> None:
            relay.received(topic, msg.payload)

        # Made now when connected, else with the others at the next connection.
        self._subscriptions[topic] = self.client.subscribe(subject.decode("ascii"), received)

    def unsubscribe(self, topic: bytes) -> None:
        """No more of ``topic``."""
        subscription = self._subscriptions.pop(topic, None)
        if subscription is not None:
            self.client.unsubscribe(subscription)

    def _changed(self, connected: bool) -> None:
        relay = self.relay
        if relay is None:
            return
        if connected:
            relay.link_up()
        else:
            relay.link_lost()

    # -- life ---------------------------------------------------------------------------------

    @defer.inlineCallbacks
    def open(self) -> Any:
        """Connect (an unreachable cluster is a start-up error, in one line), and learn the
        longest subject the servers take."""
        settings = self.settings
        self.client.start()
        try:
            yield self.client.when_connected(timeout=settings.connect_timeout)
        except ConnectError as error:
            self.client.stop()
            raise StartupError("nats", f"cannot reach a NATS server: {error}") from None
        longest = len(settings.subject_prefix) + 1 + 3 * 1024 + _LINE_BEYOND_SUBJECT
        try:
            self.max_control_line = yield threads.deferToThread(self._probe, longest)
        except (ConnectError, OSError, ProtocolError) as error:
            self.client.stop()
            raise StartupError(
                "nats", f"{', '.join(shown(u) for u in settings.servers)}: {error}"
            ) from None
        if self.relay is not None:
            self.relay.max_subject_bytes = max(0, self.max_control_line - _LINE_BEYOND_SUBJECT)
        log.info(
            "mc0 relay {origin} on NATS server {server} ({tls}): subjects {prefix}.<topic>; "
            "messages of up to {payload} bytes, subjects of up to {subject} bytes",
            origin=self.origin.decode("utf-8", "replace"),
            server=self.client.server,
            tls="TLS" if tls_assured(settings) else "no TLS",
            prefix=settings.subject_prefix,
            payload=self.max_payload,
            subject=max(0, self.max_control_line - _LINE_BEYOND_SUBJECT),
        )

    def _probe(self, longest: int) -> int:
        """In a thread: the longest command line the servers take, up to ``longest``."""
        settings = self.settings
        return longest_control_line(
            lambda: Connection(
                settings.servers,
                timeout=settings.connect_timeout,
                tls=tls_context(settings),
                credentials=settings.credentials,
                name=f"mc0-probe-{self.origin.decode('utf-8', 'replace')}",
            ),
            longest,
        )

    def close(self) -> None:
        """Close the connection (nothing waits: what was not confirmed was answered)."""
        self.client.stop()

    # -- what it is doing ---------------------------------------------------------------------

    def status(self) -> dict[str, Any]:
        """The link and the relay, for ``/status``."""
        client = self.client
        url = client.server_url
        seen = servers_seen(client.servers, [("relay", url, client.info, True)] if url else [])
        relay = self.relay.status() if self.relay is not None else {}
        return {
            "broker_id": self.origin.decode("utf-8", "replace"),
            "connected": client.connected,
            "server": client.server,
            "servers": [server.status() for server in seen],
            "tls": tls_assured(self.settings),
            "subject_prefix": self.settings.subject_prefix,
            "subjects": len(self._subscriptions),
            "max_payload": self.max_payload,
            "connects": client.connects,
            "disconnects": client.disconnects,
            "lame_duck_moves": client.lame_duck_moves,
            "slow_consumer_drops": client.slow_consumer_drops,
            "flushes": self.flushes,
            "flushes_failed": self.flushes_failed,
            **relay,
        }

    def metrics(self) -> list[Metric]:
        """The link and the relay, as ``mc0_nats_*`` families."""
        client = self.client
        relay = self.relay
        url = client.server_url
        seen = servers_seen(client.servers, [("relay", url, client.info, True)] if url else [])
        families = [
            gauge("mc0_nats_connected", "1 while the link to NATS is up", int(client.connected)),
            gauges_by(
                "mc0_nats_servers",
                "NATS servers the broker knows (given or learnt), and those in the cluster now "
                "as its connection sees it",
                "state",
                {
                    "known": len(seen),
                    "connected": sum(s.connected for s in seen),
                    "lame_duck": sum(s.lame_duck for s in seen),
                },
            ),
            gauge(
                "mc0_nats_subjects",
                "Topics this broker receives from NATS",
                len(self._subscriptions),
            ),
            counter("mc0_nats_disconnects", "Connections to NATS lost", client.disconnects),
            counter(
                "mc0_nats_slow_consumer_drops",
                "Relayed messages dropped over the subscriptions' pending limits",
                client.slow_consumer_drops,
            ),
        ]
        if relay is not None:
            families += [
                counters_by(
                    "mc0_nats_messages",
                    "PUTs relayed: published to NATS (out), received from other brokers (in)",
                    "kind",
                    {"out": relay.published, "in": relay.relayed_in},
                ),
                counters_by(
                    "mc0_nats_acknowledgements",
                    "PUTs answered once NATS confirmed them (confirmed), or ERROR as their "
                    "connection was lost first (unconfirmed)",
                    "result",
                    {"confirmed": relay.confirmed, "unconfirmed": relay.unconfirmed},
                ),
                counters_by(
                    "mc0_nats_expired",
                    "PUTs past their sender's TTL: held while the link was down, confirmed too "
                    "late, received too late",
                    "kind",
                    {
                        "held": relay.expired_held,
                        "unconfirmed": relay.expired_unconfirmed,
                        "received": relay.expired_received,
                    },
                ),
                gauge("mc0_nats_held", "PUTs held while the link to NATS is down", relay.held),
                counters_by(
                    "mc0_nats_refused",
                    "PUTs and SUBs refused for the cluster, by reason",
                    "reason",
                    dict(relay.refusals),
                ),
                counters_by(
                    "mc0_nats_dropped",
                    "Relayed messages dropped, by reason",
                    "reason",
                    dict(relay.drops.counts),
                ),
            ]
        return families
