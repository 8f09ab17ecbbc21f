"""The Core Catalog Service as a Twisted service: the ROUTER on ``--port``, UDP heartbeats on the
same port number, the ``SHALOM`` beacon, the registry in the data directory.

The state machine is :class:`bus.dbp.core.CatalogCore`; here are its sockets and timers. The
registry is saved (atomically, as JSON) whenever it changes, so it survives a restart; with the
Event BUS composed, every change is published under ``/dbp/services/<name>/<what>/``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from itertools import islice
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

import zmq
from twisted.application.service import Service
from twisted.internet import defer
from twisted.logger import Logger

from bus.dbp import codec
from bus.dbp.config import CatalogConfig
from bus.dbp.core import CatalogCore, CatalogSettings
from bus.extension import (
    NO_ACTIVITY,
    ActivitySink,
    BeaconSender,
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
from bus.transport.security import ServerCurve
from bus.transport.serving import ServerPorts
from bus.transport.udp import InterfaceError, UdpPort, interface_address
from bus.transport.zmqsocket import PeerUnreachable, bind_failure
from bus.util.droplog import DropCounter
from bus.util.files import replace_atomically

if TYPE_CHECKING:
    from bus.dbp.cluster import CatalogBucket

log = Logger(namespace="bus.dbp")


REGISTRY_FILE = "dbp-registry.json"


def _names(metadata: Mapping[str, str]) -> frozenset[str] | None:
    """The service names a key's certificate lets it register (None: any)."""
    names = metadata.get("names")
    if names is None:
        return None
    return frozenset(part.strip() for part in names.split(",") if part.strip())


class CatalogService(Service):
    """The Core Catalog Service: its ROUTER, the UDP heartbeat port, the beacon and the registry on
    disk, around :class:`bus.dbp.core.CatalogCore`."""

    def __init__(
        self, config: CatalogConfig, reactor: Any = None, activity: ActivitySink = NO_ACTIVITY
    ) -> None:
        self.config = config
        self.reactor = reactor_of(reactor)
        self.activity_sink = activity
        self.drops = DropCounter(log, "DBP input", self.reactor.seconds)
        settings = CatalogSettings(
            heartbeat_interval=config.heartbeat_interval,
            liveness=config.liveness,
            grace=config.grace,
            allow=config.allow,
            hermes_services=config.hermes_services,
            hermes_heartbeat=config.hermes_heartbeat,
            max_services=config.max_services,
        )
        #: The shared catalog's bucket (``--nats``), None when this instance is alone.
        self.bucket: CatalogBucket | None = None
        if config.nats is None:
            self.core = CatalogCore(settings, self.reactor.seconds, self._activity, self.drops.drop)
        else:
            from bus.dbp.cluster import CatalogBucket
            from bus.dbp.shared import SharedCatalogCore

            self.core = shared = SharedCatalogCore(
                settings,
                self.reactor.seconds,
                self._activity,
                self.drops.drop,
                refresh=config.nats.refresh,
            )
            self.bucket = CatalogBucket(self.reactor, config.nats, shared, self._send)
        self.router: ZmqSocket | None = None
        self.udp: UdpPort | None = None
        self.beacon_port: UdpPort | None = None
        self.beacon: BeaconSender | None = None
        self.port = 0
        self.endpoint = ""
        self._stopping: defer.Deferred[None] | None = None
        self.messages = 0
        self.udp_heartbeats = 0
        self.heartbeats_sent_udp = 0
        self.heartbeats_sent_zmq = 0
        self.activity_errors = 0
        self.save_errors = 0
        self.restored = 0
        #: CURVE on the ROUTER; with an allow-list, a key's ``names`` are the services it
        #: may register. (UDP heartbeats carry no key: only a port number.)
        self.curve = ServerCurve("dbp", config.curve, self.reactor.seconds)
        self.ports = ServerPorts(self.reactor, self.curve, log)
        #: Whether some certificate names ``names`` (each message's key read only then).
        self._rights = False
        self.curve.on_reload.append(self._rights_changed)

    @property
    def registry_path(self) -> Path:
        """Where the registry is saved."""
        return Path(self.config.data_dir) / REGISTRY_FILE

    # -- starting ----------------------------------------------------------------------------

    def startService(self) -> defer.Deferred[None] | None:
        config = self.config
        saved: dict[str, Any] = {}
        if self.bucket is None:  # a shared catalog is in its bucket, not on this disk
            try:
                Path(config.data_dir).mkdir(parents=True, exist_ok=True)
                saved = self._load()
            except (OSError, ValueError) as error:
                raise StartupError("data-dir", f"cannot use the registry: {error}") from None
        try:
            interface = interface_address(config.beacon_interface)
        except InterfaceError as error:
            raise StartupError("beacon-interface", str(error)) from None
        self.ports.open(lambda factory: self._open(factory, interface.broadcast), self._close_ports)
        self.restored = self.core.restore(saved)
        kept = sum(entry.active for entry in self.core.entries.values())
        Service.startService(self)
        self.ports.announce(config.bind, [self.endpoint])
        self.ports.periodic.every(config.heartbeat_interval, self._tick)
        log.info(
            "DBP catalog on {endpoint} (UDP heartbeats on {port}), beacon SHALOM to {beacon}; "
            "{restored} services restored ({kept} kept active, the others inactive until they "
            "beat)",
            endpoint=self.endpoint,
            port=self.port,
            beacon=f"{interface.broadcast}:{config.beacon_port}",
            restored=self.restored,
            kept=kept,
        )
        if self.bucket is not None:
            assert config.nats is not None
            log.info(
                "DBP catalog {me} shares its catalog in bucket {bucket} on NATS {servers}",
                me=self.core.settings.catalog_id,
                bucket=f"KV_{config.nats.bucket}",
                servers=", ".join(config.nats.servers),
            )
            self.ports.periodic.every(10.0, self.bucket.read_cluster)
            return self.bucket.open()
        return None

    def _open(self, factory: SocketFactory, broadcast: str) -> None:
        config = self.config
        self._rights = self.curve.uses("names")
        # Peer addresses: Hermes' Service advertises 127.0.0.1 whatever its address, and the
        # connection's is the honest one.
        self.router = factory.socket(
            zmq.ROUTER,
            self._on_messages,
            SocketOptions(
                router_mandatory=True,
                max_message_size=codec.MAX_BODY_BYTES * 4,
                receive_hwm=10_000,
                send_hwm=10_000,
                linger_ms=0,
                peer_addresses=True,
                peer_user_ids=self._rights,
            ),
            read_budget=256,
            name="dbp-router",
        )
        self.curve.secure(self.router, "dbp")
        try:
            self.endpoint = self.router.bind(f"tcp://{config.bind}:{config.port}")
        except zmq.ZMQError as error:
            raise bind_failure(error, "port", f"{config.bind}:{config.port}") from None
        self.port = int(self.endpoint.rpartition(":")[2])
        self.core.settings.udp_port = self.port
        self.udp = UdpPort(self.reactor, self._on_datagram)
        try:
            self.udp.listen(config.bind, self.port)
        except OSError as error:
            raise StartupError(
                "port", f"cannot listen on UDP {self.port}: {error.strerror}"
            ) from None
        if config.beacon_port:
            self.beacon_port = UdpPort(self.reactor, lambda data, address: None)
            self.beacon_port.listen("0.0.0.0", 0)
            beacon = codec.encode_beacon(self.port)
            self.beacon = BeaconSender(
                self.reactor,
                self.beacon_port,
                (broadcast, config.beacon_port),
                lambda: beacon,
                config.beacon_interval,
            )
            self.beacon.start()

    def _rights_changed(self) -> None:
        """The allow-list was re-read: read each message's key if a certificate names
        services now (between two reactor turns: no batch is half handled)."""
        self._rights = self.curve.uses("names")
        if self.router is not None:
            self.router.keep_user_ids = self._rights

    # -- input -------------------------------------------------------------------------------

    def _on_messages(self, batch: list[list[bytes]]) -> None:
        router = self.router
        if router is None:
            return
        addresses = router.peer_addresses
        user_ids = router.peer_user_ids
        for index, frames in enumerate(batch):
            self.messages += 1
            peer = addresses[index] if index < len(addresses) else None
            names = self.curve.rights(user_ids[index], _names) if user_ids else None
            replies = self.core.on_message(frames[0], frames[1:], peer, names)
            for reply in replies:
                self._send(reply)
        self._save_if_changed()
        if self.bucket is not None:
            self.bucket.flush()

    def _on_datagram(self, data: bytes, address: tuple[str, int]) -> None:
        self.udp_heartbeats += 1
        self.core.on_udp_heartbeat(data, address[0])
        if self.bucket is not None:
            self.bucket.flush()

    def _send(self, frames: list[bytes]) -> bool:
        router = self.router
        if router is None:
            return False
        try:
            if router.send_frames(frames):
                return True
            self.drops.drop("reply-blocked", "a peer's queue is full", frames[0])
        except PeerUnreachable:
            self.drops.drop("peer-gone", "the peer disconnected before its reply", frames[0])
        return False

    def _tick(self) -> None:
        out = self.core.tick()
        if self.udp is not None:
            for datagram, address in out.datagrams:
                if self.udp.send(datagram, address):
                    self.heartbeats_sent_udp += 1
        for frames in out.messages:
            if self._send(frames):
                self.heartbeats_sent_zmq += 1
        self._save_if_changed()
        if self.bucket is not None:
            self.bucket.flush()

    def _activity(self, kind: str, name: str, value: dict[str, Any]) -> None:
        topic = f"/dbp/services/{quote(name, safe='')}/{kind}/"
        try:
            self.activity_sink.publish(topic, {"event": kind, "name": name, **value})
        except ValueError as error:
            self.activity_errors += 1
            log.warn("cannot publish DBP activity: {error}", error=error)

    # -- the registry on disk ----------------------------------------------------------------

    def _load(self) -> dict[str, Any]:
        try:
            text = self.registry_path.read_text()
        except FileNotFoundError:
            return {}
        saved = json.loads(text)
        if not isinstance(saved, dict):
            raise ValueError(f"{self.registry_path} does not hold a JSON object")
        return saved

    def _save_if_changed(self) -> None:
        if not self.core.dirty or self.bucket is not None:
            return
        self.core.dirty = False
        try:
            replace_atomically(self.registry_path, json.dumps(self.core.snapshot(), sort_keys=True))
        except OSError as error:
            self.save_errors += 1
            self.core.dirty = True  # try again at the next change or tick
            log.error("cannot save the DBP registry: {error}", error=error)

    # -- the UDP heartbeat port, for maintenance --------------------------------------------

    def suspend_udp(self) -> defer.Deferred[None]:
        """Close the UDP heartbeat port: services' UDP beats are lost (the kernel drops them)
        and the catalog falls back to ZeroMQ heartbeats for each of them."""
        udp, self.udp = self.udp, None
        return udp.close() if udp is not None else defer.succeed(None)

    def resume_udp(self) -> None:
        """Open the UDP heartbeat port again; services go back to UDP heartbeats."""
        if self.udp is None and self.running:
            self.udp = UdpPort(self.reactor, self._on_datagram)
            self.udp.listen(self.config.bind, self.port)

    # -- stopping ----------------------------------------------------------------------------

    def stopService(self) -> defer.Deferred[None]:
        if self._stopping is None:
            Service.stopService(self)
            self.ports.periodic.stop_all()
            self._save_if_changed()
            self._stopping = self._close()
            if self.bucket is not None:
                self.bucket.close()
        return self._stopping

    def _close(self) -> defer.Deferred[None]:
        closed = self._close_ports()
        self.ports.close()
        return closed

    def _close_ports(self) -> defer.Deferred[None]:
        if self.beacon is not None:
            self.beacon.stop()
            self.beacon = None
        if self.router is not None:
            self.router.shutdown()
            self.router = None
        closing = [port.close() for port in (self.udp, self.beacon_port) if port is not None]
        self.udp = self.beacon_port = None
        return defer.gatherResults(closing).addCallback(lambda _: None)

    # -- what it does ------------------------------------------------------------------------

    def status(self) -> dict[str, Any]:
        """Ports, services, heartbeats and counts, for ``/status``."""
        entries = self.core.entries.values()
        return {
            "endpoint": self.endpoint,
            "udp_port": self.port,
            "beacon": (f"{self.beacon.target[0]}:{self.beacon.target[1]}" if self.beacon else None),
            "services": sum(1 for e in entries if e.active),
            "services_inactive": sum(1 for e in entries if not e.active),
            "services_on_zmq_heartbeats": sum(1 for e in entries if e.active and e.path == "zmq"),
            "restored": self.restored,
            "messages": self.messages,
            "commands": dict(self.core.counts),
            "udp_heartbeats_received": self.udp_heartbeats,
            "heartbeats_sent_udp": self.heartbeats_sent_udp,
            "heartbeats_sent_zmq": self.heartbeats_sent_zmq,
            "late_ticks_held": self.core.wakes.held,
            "beacons_sent": self.beacon.sent if self.beacon else 0,
            "save_errors": self.save_errors,
            "dropped": dict(self.drops.counts),
            "curve": self.curve.status(),
            "shared": self.bucket.status() if self.bucket is not None else None,
        }

    #: The console's charts (see :mod:`bus.web.console.view`).
    console_rates = {"messages": "messages", "heartbeats": "udp_heartbeats_received"}

    def details(self, limit: int = 100) -> dict[str, Any]:
        """The catalog as the console lists it (at most ``limit`` services)."""
        now = self.reactor.seconds()
        catalog = []
        for entry in islice(self.core.entries.values(), limit):
            catalog.append(
                {
                    "name": entry.name,
                    "active": entry.active,
                    "heartbeat_path": entry.heartbeat_path,
                    "form": entry.form,
                    "last_heard_s": round(now - entry.last_heard, 3) if entry.last_heard else None,
                    "registered_s": round(now - entry.registered_at, 3),
                    "info": {k: v for k, v in entry.info.items() if isinstance(k, str)},
                }
            )
        return {"catalog": catalog}

    def metrics(self) -> list[Metric]:
        """The services, messages and heartbeats, and CURVE, for ``/metrics``."""
        status = self.status()
        return [
            *self.curve.metrics(),
            gauge("dbp_services", "Active services", status["services"]),
            gauge(
                "dbp_services_inactive",
                "Expired services in their grace period",
                status["services_inactive"],
            ),
            gauge(
                "dbp_services_zmq_heartbeats",
                "Services heartbeating over ZeroMQ (UDP lost)",
                status["services_on_zmq_heartbeats"],
            ),
            counter("dbp_messages", "Messages read on the ROUTER", self.messages),
            counters_by(
                "dbp_commands",
                "Commands received and replies of note",
                "command",
                status["commands"],
            ),
            counter(
                "dbp_udp_heartbeats_received",
                "UDP datagrams received on the heartbeat port",
                self.udp_heartbeats,
            ),
            counter(
                "dbp_heartbeats_sent_udp", "Heartbeats sent over UDP", self.heartbeats_sent_udp
            ),
            counter(
                "dbp_heartbeats_sent_zmq", "Heartbeats sent over ZeroMQ", self.heartbeats_sent_zmq
            ),
            counter("dbp_beacons_sent", "SHALOM beacons sent", status["beacons_sent"]),
            counters_by("dbp_dropped", "Bad input dropped, by reason", "reason", status["dropped"]),
            *(self.bucket.metrics() if self.bucket is not None else []),
        ]
