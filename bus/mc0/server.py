"""The mc0 broker as a Twisted service: one CURVE ROUTER socket, ZAP, and the broker core.

Security: by default the ROUTER is a CURVE server with the key pair from ``--server-cert``
or, without it, the pair kept in the data directory (made on first start; the public key is
logged). Client keys are checked by ZAP (:class:`bus.transport.curve.ZapHandler`): against
the ``--client-certs`` allow-list, or any key without one. ``--plain`` turns CURVE off.

A client that fails the handshake (a wrong server key, a key not on the allow-list) never
reaches the broker: libzmq closes its connection and the socket monitor counts it.

With ``--nats`` the broker is one of several hosts' brokers of one topic space: a
:class:`bus.mc0.relay.Relay` on a :class:`bus.mc0.link.NatsLink` (docs/mc0.md).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from itertools import islice
from typing import TYPE_CHECKING, Any

import zmq
from twisted.application.service import Service
from twisted.internet import defer
from twisted.logger import Logger

from bus.application.statusjson import config_json
from bus.extension import (
    NO_ACTIVITY,
    ActivitySink,
    Metric,
    SocketFactory,
    SocketOptions,
    StartupError,
    ZmqSocket,
    counter,
    counters_by,
    gauge,
    reactor_of,
)
from bus.mc0 import codec
from bus.mc0.config import Mc0Config
from bus.mc0.core import Broker, Client, SendResult
from bus.mc0.relay import Relay, RelaySettings
from bus.transport.curve import CurveKeyPair, ZapHandler
from bus.transport.names import peer_name
from bus.transport.security import ServerCurve
from bus.transport.serving import ServerPorts
from bus.transport.zmqsocket import PeerUnreachable, bind_failure
from bus.util.droplog import DropCounter

if TYPE_CHECKING:
    from bus.mc0.link import NatsLink

log = Logger(namespace="bus.mc0")


_HANDSHAKE_FAILURES = {
    zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL: "other",
    zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL: "protocol",
    zmq.EVENT_HANDSHAKE_FAILED_AUTH: "auth",
}
_HANDSHAKE_EVENTS = zmq.EVENT_HANDSHAKE_SUCCEEDED
for _event in _HANDSHAKE_FAILURES:
    _HANDSHAKE_EVENTS |= _event


class Mc0Service(Service):
    """The mc0 broker: its CURVE ROUTER, ZAP, and the :class:`bus.mc0.core.Broker`."""

    name = "mc0"

    def __init__(
        self,
        config: Mc0Config,
        activity: ActivitySink = NO_ACTIVITY,
        reactor: Any = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.config = config
        self.activity = activity
        self.reactor: Any = reactor_of(reactor)
        self.clock = clock
        #: CURVE unless ``--plain`` (the kept key pair without ``--server-cert``); its keys
        #: are loaded by ``ports.open`` in startService.
        self.curve = ServerCurve("mc0", config.curve, clock)
        self.ports = ServerPorts(self.reactor, self.curve, log)
        self.endpoint = ""
        self.broker: Broker | None = None
        self.socket: ZmqSocket | None = None
        self._stopped: defer.Deferred[None] | None = None
        self.handshakes = 0
        self.handshake_failures: dict[str, int] = dict.fromkeys(_HANDSHAKE_FAILURES.values(), 0)
        self.mirrored = 0
        self.mirror_drops = DropCounter(log, "PUT mirror", clock)
        self._started_at = 0.0
        #: The link to the brokers of other hosts (``--nats``; None: this broker alone).
        self.link: NatsLink | None = None

    # -- lifecycle ----------------------------------------------------------------------------

    def startService(self) -> defer.Deferred[None] | None:
        config = self.config
        try:
            config.data_dir.mkdir(parents=True, exist_ok=True)
        except OSError as error:
            raise StartupError("data-dir", f"cannot create {config.data_dir}: {error}") from None
        self.ports.open(self._open_sockets, undo=self._close_socket)
        self.broker = Broker(
            config.broker,
            self.reactor,
            self._transmit,
            on_put=self._mirror if config.mirror else None,
            transmit_many=self._transmit_many,
        )
        Service.startService(self)
        self._stopped = None
        self._started_at = self.clock()
        self._log_security()
        if config.cluster is not None:
            return self._open_link(self.broker)
        return None

    def _open_link(self, broker: Broker) -> defer.Deferred[None]:
        """The relay to the brokers of other hosts, connected to NATS (a start-up error
        when no server can be reached)."""
        from bus.mc0.link import NatsLink, broker_id

        cluster = self.config.cluster
        assert cluster is not None
        origin = broker_id(cluster)
        self.link = link = NatsLink(self.reactor, cluster, origin)
        relay = Relay(
            RelaySettings(cluster.subject_prefix, cluster.hold_messages, cluster.hold_bytes),
            origin,
            self.reactor,
            link,
            broker.answer,
            broker.deliver,
            self.config.broker.max_frames,
        )
        link.relay = relay
        broker.relay = relay
        if cluster.without_tls and self.curve.enabled:
            log.warn(
                "--nats-without-tls: the topics of this broker's CURVE clients go over NATS "
                "without TLS: readable by anyone on the network between it and the servers"
            )
        opened: defer.Deferred[None] = link.open()
        return opened

    @property
    def keys(self) -> CurveKeyPair | None:
        """The server's key pair (None with ``--plain``)."""
        return self.curve.keys

    @property
    def zap(self) -> ZapHandler | None:
        """The ZAP handler checking client keys (None: plain text)."""
        return self.curve.zap

    def _open_sockets(self, factory: SocketFactory) -> None:
        config = self.config
        limits = config.broker
        sock = factory.socket(
            zmq.ROUTER,
            self._on_messages,
            SocketOptions(
                send_hwm=config.send_hwm,
                receive_hwm=config.receive_hwm,
                router_mandatory=True,
                # Above the broker's own limit, so an oversized message is answered ERROR;
                # a frame past this one makes libzmq drop the connection instead.
                max_message_size=2 * limits.max_message_bytes + 65536,
                linger_ms=0,
            ),
            read_budget=config.read_budget,
            name="mc0",
            # Its one socket: what came while a batch was answered is read in the same turn.
            eager_reads=True,
        )
        self.socket = sock
        self.curve.secure(sock, "mc0")
        port = "*" if config.port == 0 else str(config.port)
        try:
            self.endpoint = sock.bind(f"tcp://{config.bind}:{port}")
        except zmq.ZMQError as error:
            raise bind_failure(error, "port", f"{config.bind}:{config.port}") from None
        sock.watch_connections(_HANDSHAKE_EVENTS, self._on_socket_event)

    def _log_security(self) -> None:
        config = self.config
        if config.mirror and self.activity is NO_ACTIVITY:
            log.warn("--mirror: no Event BUS runs in this process, so PUTs are not mirrored")
        if not self.curve.enabled:
            log.warn(
                "mc0 broker on {endpoint} WITHOUT CURVE (--plain): traffic is not encrypted "
                "and any peer that can reach the port is served",
                endpoint=self.endpoint,
            )
            return
        self.ports.announce(config.bind, [self.endpoint])

    def stopService(self) -> defer.Deferred[None]:
        if self._stopped is not None:
            return self._stopped
        if self.running:
            Service.stopService(self)
        if self.broker is not None:
            self.broker.close()
        if self.link is not None:
            self.link.close()
        self._close_socket()
        self.ports.close()
        self._stopped = defer.succeed(None)
        return self._stopped

    def _close_socket(self) -> None:
        if self.socket is not None:
            self.socket.shutdown()
        self.socket = None

    # -- traffic -------------------------------------------------------------------------------

    def _on_messages(self, batch: list[list[bytes]]) -> None:
        broker = self.broker
        if broker is not None:
            broker.receive_batch(batch)

    def _transmit(self, frames: list[bytes]) -> SendResult:
        sock = self.socket
        if sock is None:
            return SendResult.GONE
        try:
            return SendResult.SENT if sock.send_frames(frames) else SendResult.FULL
        except PeerUnreachable:
            return SendResult.GONE

    def _transmit_many(self, messages: list[list[bytes]]) -> tuple[int, SendResult]:
        sock = self.socket
        if sock is None:
            return 0, SendResult.GONE
        sent, error = sock.send_each(messages)
        if not error:
            return sent, SendResult.SENT
        return sent, SendResult.GONE if error == zmq.EHOSTUNREACH else SendResult.FULL

    def _mirror(self, client: Client, put: codec.Put) -> None:
        """A PUT onto the Event BUS of this process, under ``/mc0/<topic>/``."""
        try:
            topic = put.topic.decode("utf-8")
            self.activity.publish(
                f"/mc0/{topic}/",
                {
                    "topic": topic,
                    "headers": {
                        key.decode("utf-8", "replace"): value.decode("utf-8", "replace")
                        for key, value in put.headers
                    },
                    "body": list(put.body),
                    "client": client.identity.hex(),
                },
            )
        except (UnicodeDecodeError, ValueError) as error:
            self.mirror_drops.drop("unmirrorable", str(error), client.identity)
            return
        self.mirrored += 1

    def _on_socket_event(self, event: int) -> None:
        if event & zmq.EVENT_HANDSHAKE_SUCCEEDED:
            self.handshakes += 1
            return
        for flag, kind in _HANDSHAKE_FAILURES.items():
            if event & flag:
                self.handshake_failures[kind] += 1

    # -- what it does ---------------------------------------------------------------------------

    def status(self) -> dict[str, Any]:
        """The broker, the port, its security and handshakes, for ``/status``."""
        broker = self.broker.status() if self.broker is not None else {}
        zap = self.zap
        return {
            **broker,
            "endpoint": self.endpoint,
            "security": "plain" if self.keys is None else "curve",
            "server_public_key": None if self.keys is None else self.keys.public.decode(),
            "connections": self.socket.connections if self.socket is not None else 0,
            "handshakes": self.handshakes,
            "handshake_failures": dict(self.handshake_failures),
            "auth": {
                "accepted": zap.accepted if zap else 0,
                "denied": zap.denied if zap else 0,
                "allow_list": str(certs) if (certs := self.curve.settings.client_certs) else None,
                "allowed_keys": zap.allowed_keys if zap else None,
                "refused_keys": self.curve.refused_keys(),
            },
            "mirror": self.config.mirror,
            "mirrored": self.mirrored,
            "mirror_dropped": dict(self.mirror_drops.counts),
            "uptime_s": round(self.clock() - self._started_at, 3),
            "cluster": self.link.status() if self.link is not None else None,
            "config": config_json(self.config),
        }

    #: The console's charts (see :mod:`bus.web.console.view`).
    console_rates = {"messages": "puts", "delivered": "delivered"}

    def details(self, limit: int = 100) -> dict[str, Any]:
        """What the console lists beyond the counts: clients and topics (at most ``limit``)."""
        broker = self.broker
        if broker is None:
            return {}
        now = self.clock()
        clients = [
            {
                "id": peer_name(client.identity),
                "topics": sorted(t.decode("utf-8", "replace") for t in client.topics)[:limit],
                "ttl_s": client.ttl,
                "last_heard_s": round(now - client.last_heard, 3),
                "connected_s": round(now - client.connected_at, 3),
            }
            for client in islice(broker.clients.values(), limit)
        ]
        topics = {
            topic.decode("utf-8", "replace"): len(subscribers)
            for topic, subscribers in islice(broker.topics.items(), limit)
        }
        return {"client_list": clients, "topic_list": topics}

    def metrics(self) -> list[Metric]:
        """Connections, handshakes, authentication and the broker's counts, for ``/metrics``."""
        broker = self.broker
        zap = self.zap
        families = [
            gauge(
                "mc0_connections",
                "TCP peers connected now",
                self.socket.connections if self.socket else 0,
            ),
            counter("mc0_handshakes", "CURVE/NULL handshakes completed", self.handshakes),
            counters_by(
                "mc0_handshake_failures",
                "Handshakes that failed, by kind (auth: refused by ZAP; protocol: e.g. a wrong "
                "server key)",
                "kind",
                self.handshake_failures,
            ),
            counters_by(
                "mc0_zap_decisions",
                "CURVE client keys accepted or denied by ZAP",
                "result",
                {"accepted": zap.accepted if zap else 0, "denied": zap.denied if zap else 0},
            ),
            counter("mc0_puts_mirrored", "PUTs mirrored onto the Event BUS", self.mirrored),
            gauge("mc0_uptime_seconds", "Seconds since the broker started", self._uptime()),
        ]
        if self.link is not None:
            families += self.link.metrics()
        if broker is not None:
            families += [
                gauge("mc0_clients", "Clients the broker knows", len(broker.clients)),
                gauge("mc0_topics", "Topics with at least one subscriber", len(broker.topics)),
                gauge("mc0_subscriptions", "Client-topic subscriptions", broker.subscriptions),
                counters_by(
                    "mc0_commands", "Well-formed commands, by verb", "verb", broker.commands
                ),
                counters_by(
                    "mc0_errors",
                    "Commands answered ERROR, by reason",
                    "reason",
                    broker.errors.counts,
                ),
                counter("mc0_acknowledged", "Commands answered OK", broker.acknowledged),
                counter("mc0_puts", "PUTs accepted", broker.puts),
                counter("mc0_messages_delivered", "MESSAGEs sent to subscribers", broker.delivered),
                counters_by(
                    "mc0_messages_undelivered",
                    "MESSAGEs not sent: the subscriber's queue was full, or it was gone",
                    "reason",
                    broker.undelivered,
                ),
                counter("mc0_noops_sent", "NOOP heartbeats sent", broker.noops_sent),
                counter(
                    "mc0_clients_expired", "Clients forgotten after 1.05 x TTL", broker.expired
                ),
                counter(
                    "mc0_expiries_put_off",
                    "Expiries put off once as the broker woke late (it had not run: a stall)",
                    broker.expiries_put_off,
                ),
            ]
        return families

    def _uptime(self) -> float:
        return round(self.clock() - self._started_at, 3) if self._started_at else 0.0
