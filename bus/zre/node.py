"""A ZRE node as a Twisted service: the UDP beacon, the ROUTER mailbox, a DEALER per peer,
and (20/ZRE) the ZRE/LOG service and sender.

The state machine is :class:`bus.zre.core.ZreCore`; this module owns its sockets and timers,
turns its events into listener calls and, when the Event BUS runs in the same process, into
``/zre/...`` events on the bus. Many nodes can share one process (and one
:class:`SocketFactory`) for simulation: each has its own UDP socket on the shared port.
"""

from __future__ import annotations

import time
import uuid as uuidlib
from collections.abc import Callable, Sequence
from functools import partial
from itertools import islice
from typing import Any
from urllib.parse import quote

import zmq
from twisted.application.service import Service
from twisted.internet import defer
from twisted.logger import Logger
from zmq.utils import z85

from bus.extension import (
    NO_ACTIVITY,
    ActivitySink,
    BeaconSender,
    CurveSettings,
    DescriptorBudget,
    Metric,
    SocketFactory,
    SocketOptions,
    StartupError,
    ZmqSocket,
    counter,
    counters_by,
    gauge,
    listen_shared,
    reactor_of,
)
from bus.transport.curve import make_curve_client
from bus.transport.security import ServerCurve
from bus.transport.serving import ServerPorts
from bus.transport.udp import InterfaceAddress, InterfaceError, UdpListener, interface_address
from bus.util.droplog import DropCounter
from bus.zre import codec
from bus.zre.codec import VERSION_20, VERSION_36, LogRecord, ZreError
from bus.zre.config import ZreConfig
from bus.zre.core import LOG_HEADER, Peer, ZreCore, ZreEvent, ZreSettings
from bus.zre.gossip import GossipCore, parse_tuple_value

log = Logger(namespace="bus.zre")


def bind_ephemeral(sock: ZmqSocket, host: str) -> str:
    """Bind to a random free port of ZRE's ephemeral range %xC000-%xFFFF (pyzmq leaves the
    choice to the OS, outside that range, when given its default bounds: 65535, not 65536)."""
    port = sock.socket.bind_to_random_port(f"tcp://{host}", 0xC000, 0xFFFF, 500)
    endpoint = f"tcp://{host}:{port}"
    sock.guard_inbound(endpoint)
    return endpoint


_LOG_LEVEL = {"ENTER": 3, "EXIT": 3, "JOIN": 3, "LEAVE": 3}
_LOG_EVENT = {"JOIN": 1, "LEAVE": 2, "ENTER": 3, "EXIT": 4}
#: Events published on the bus (LEADER is not logged to ZRE/LOG: it has no event code).
_MEMBERSHIP = frozenset(("ENTER", "EXIT", "JOIN", "LEAVE", "LEADER"))

EventListener = Callable[[ZreEvent], None]

#: Messages that came in while a mailbox batch was handled, read before its events are
#: told (at most; the rest on the next reactor turn).
_MORE_BEFORE_EVENTS = 256
#: How long a link that carries our GOODBYE may still send once closed (milliseconds).
_GOODBYE_LINGER_MS = 500


class ZreNode(Service):
    """One ZRE node. ``whisper``, ``shout``, ``join``, ``leave``; events go to listeners."""

    def __init__(
        self,
        config: ZreConfig,
        reactor: Any = None,
        activity: ActivitySink = NO_ACTIVITY,
        socket_factory: SocketFactory | None = None,
        node_uuid: bytes | None = None,
    ) -> None:
        self.config = config
        self.reactor = reactor_of(reactor)
        self.activity = activity
        self.uuid = node_uuid or uuidlib.uuid4().bytes
        self.node_name = config.name or uuidlib.UUID(bytes=self.uuid).hex[:6]
        self.interface: InterfaceAddress | None = None
        self.endpoint = ""
        self.mailbox: ZmqSocket | None = None
        self.udp: UdpListener | None = None
        self.beacon: BeaconSender | None = None
        self.log_socket: ZmqSocket | None = None
        self.log_endpoint = ""
        self._log_senders: dict[bytes, ZmqSocket] = {}
        self._dealers: dict[str, ZmqSocket] = {}
        #: A peer DEALER made ahead, so that a new peer is connected to (and greeted) without
        #: waiting for a socket to be made; made again after each use, off that path.
        self._spare_dealer: ZmqSocket | None = None
        self._spare_due: Any = None
        #: ZGOSSIP: the hub's ROUTER, and a DEALER per hub we are a client of.
        self.gossip: GossipCore | None = None
        self.gossip_hub: ZmqSocket | None = None
        self.gossip_endpoint = ""
        self._gossip_remotes: dict[str, ZmqSocket] = {}
        #: Per-peer sockets (DEALERs, ZRE/LOG senders) come out of this share.
        self.budget = DescriptorBudget(config.descriptor_share)
        self.core: ZreCore | None = None
        #: Replaced, never changed in place: a listener may add one while being called.
        self.listeners: tuple[EventListener, ...] = ()
        self.drops = DropCounter(log, "ZRE input", self.reactor.seconds)
        #: Beacon source address -> on our interface's subnet (asked once per address).
        self._hosts: dict[str, bool] = {}
        #: Beacon datagram -> (the peer it came from, its address), for the fast path.
        self._beacons: dict[bytes, tuple[Peer, str]] = {}
        self._stopping: defer.Deferred[None] | None = None
        #: Events of the mailbox batch being handled, told after it (see _on_mailbox).
        self._held: list[ZreEvent] | None = None
        self.events_by_type: dict[str, int] = {}
        self.messages_received = 0
        self.beacons_received = 0
        self.log_records = 0
        self.log_records_sent = 0
        self.send_blocked = 0
        self.activity_errors = 0
        #: CURVE (``config.cert``): the mailbox a CURVE server, ZAP with the peer allow-list.
        self.curve = ServerCurve(
            "zre",
            CurveSettings(config.cert, config.peer_certs),
            self.reactor.seconds,
            options=("cert", "peer-certs"),
        )
        #: CURVE, the socket factory (the process's shared one while CURVE is off) and
        #: the periodic work, as every server keeps them.
        self.ports = ServerPorts(self.reactor, self.curve, log, shared=socket_factory)

    # -- the API -----------------------------------------------------------------------------

    @property
    def uuid_hex(self) -> str:
        """The node's UUID as 32 hex digits."""
        return uuidlib.UUID(bytes=self.uuid).hex

    def add_listener(self, listener: EventListener) -> None:
        """Call ``listener`` with every event of the node (ENTER, JOIN, WHISPER...)."""
        self.listeners = (*self.listeners, listener)

    def join(self, group: str) -> None:
        """Join ``group`` (the node must be running)."""
        self._running_core().join(group)

    def leave(self, group: str) -> None:
        """Leave ``group`` (the node must be running)."""
        self._running_core().leave(group)

    def whisper(self, peer: bytes, content: Sequence[bytes]) -> bool:
        """Send ``content`` to peer ``peer`` alone; False when it is not ready."""
        return self._running_core().whisper(peer, content)

    def shout(self, group: str, content: Sequence[bytes]) -> int:
        """Send ``content`` to every ready peer of ``group``; how many."""
        return self._running_core().shout(group, content)

    def peers(self) -> list[bytes]:
        """The UUIDs of the ready peers."""
        core = self.core
        return [p.uuid for p in core.peers.values() if p.ready] if core else []

    def _running_core(self) -> ZreCore:
        if self.core is None:
            raise RuntimeError("the ZRE node is not running")
        return self.core

    # -- starting ----------------------------------------------------------------------------

    def startService(self) -> None:
        config = self.config
        try:
            self.interface = interface_address(config.interface)
        except InterfaceError as error:
            raise StartupError("interface", str(error)) from None
        self.ports.open(lambda factory: self._open(factory, config), undo=self._close_sockets)
        Service.startService(self)

    def _open(self, factory: SocketFactory, config: ZreConfig) -> None:
        assert self.interface is not None
        host = self.interface.address
        self.mailbox = factory.socket(
            zmq.ROUTER,
            self._on_mailbox,
            SocketOptions(receive_hwm=10_000, linger_ms=0),
            read_budget=256,
            name="zre-mailbox",
        )
        # A peer that restarts with the same UUID takes its identity over at once.
        self.mailbox.socket.set(zmq.ROUTER_HANDOVER, 1)
        self.curve.secure(self.mailbox, "zre")
        try:
            self.endpoint = bind_ephemeral(self.mailbox, host)
        except (zmq.ZMQError, zmq.ZMQBindError) as error:
            raise StartupError("interface", f"cannot bind a mailbox on {host}: {error}") from None
        headers = dict(config.headers)
        if config.version == VERSION_20 and config.log_service:
            self.log_socket = factory.socket(
                zmq.SUB,
                self._on_log_records,
                SocketOptions(linger_ms=0, receive_hwm=10_000),
                name="zre-log",
            )
            self.log_socket.subscribe(b"")
            self.log_endpoint = bind_ephemeral(self.log_socket, host)
            headers[LOG_HEADER] = self.log_endpoint
        settings = ZreSettings(
            uuid=self.uuid,
            name=self.node_name,
            endpoint=self.endpoint,
            version=config.version,
            headers=headers,
            evasive=config.evasive,
            expired=config.expired,
            hello_wait=2 * config.beacon_interval,
            max_pending=config.max_pending_peers,
            pending_expired=config.pending_expired,
            reap_interval=config.reap_interval,
            public_key=self.curve.keys.public if self.curve.keys else None,
            key_allowed=self._key_allowed if config.peer_certs else None,
        )
        self.core = ZreCore(settings, _Dealers(self), self.reactor.seconds, self._emit, self._drop)
        self._make_spare()
        port = config.beacon_port
        if port:
            try:
                self.udp = listen_shared(self.reactor, "0.0.0.0", port, self._on_datagram)
            except OSError as error:
                raise StartupError(
                    "port", f"cannot listen on UDP {port}: {error.strerror}"
                ) from None
            mailbox_port = int(self.endpoint.rpartition(":")[2])
            beacon = codec.encode_beacon(self.uuid, mailbox_port, self._raw_public_key())
            self.beacon = BeaconSender(
                self.reactor,
                self.udp,
                (self.interface.broadcast, port),
                lambda: beacon,
                config.beacon_interval,
            )
            # As zyre, whose first beacon goes out once its node polls: a peer that hears
            # it greets us at once, so it waits until the reactor runs and we can answer
            # (twistd starts services, so sends it, before it runs the reactor).
            self.reactor.callWhenRunning(self._start_beacon)
        for group in config.groups:
            self.core.join(group)
        for endpoint in config.peers:
            self.core.connect_endpoint(endpoint, seed=True)
        if config.gossip_bind or config.gossip_connect:
            self._open_gossip(factory, config)
        self.ports.periodic.every(config.reap_interval, self._tick)
        log.info(
            "ZRE node {name} {uuid} ({dialect}) on {endpoint}, beacon {beacon}",
            name=self.node_name,
            uuid=self.uuid_hex,
            dialect="36/ZRE" if config.version == VERSION_36 else "20/ZRE",
            endpoint=self.endpoint,
            beacon=f"{self.interface.broadcast}:{port}" if port else "off",
        )

    def _start_beacon(self) -> None:
        if self.beacon is not None and self.udp is not None and self._stopping is None:
            self.beacon.start()

    def _open_gossip(self, factory: SocketFactory, config: ZreConfig) -> None:
        """ZGOSSIP as zyre: our hub (a ROUTER, a CURVE server with our certificate), our
        client links (a DEALER per hub; CURVE when given the hub's key), our tuple."""
        gossip = self.gossip = GossipCore(
            self.reactor.seconds,
            _GossipSockets(self),
            self._on_gossip_tuple,
            self._drop,
            client_expired=config.expired,
        )
        if config.gossip_bind:
            hub = self.gossip_hub = factory.socket(
                zmq.ROUTER,
                self._on_gossip_clients,
                SocketOptions(receive_hwm=10_000, send_hwm=10_000, linger_ms=0),
                read_budget=256,
                name=f"zre-gossip-hub-{self.node_name}",
            )
            hub.socket.set(zmq.MAXMSGSIZE, 4096)
            self.curve.secure(hub, "zre")
            try:
                self.gossip_endpoint = hub.bind(config.gossip_bind)
            except zmq.ZMQError as error:
                raise StartupError(
                    "gossip-bind", f"cannot bind {config.gossip_bind}: {error}"
                ) from None
        keys = self.curve.keys
        for given in config.gossip_connect:
            endpoint, _, server_key = given.partition("|")
            dealer = factory.socket(
                zmq.DEALER,
                partial(self._on_gossip_remote, endpoint),
                SocketOptions(receive_hwm=10_000, send_hwm=1000, linger_ms=0),
                name=f"zre-gossip-{self.node_name}",
            )
            dealer.socket.set(zmq.MAXMSGSIZE, 4096)
            if server_key and keys is not None:
                make_curve_client(dealer, server_key.encode("ascii"), keys)
            try:
                dealer.connect(endpoint)
            except zmq.ZMQError as error:
                dealer.shutdown()
                raise StartupError(
                    "gossip-connect", f"cannot connect {endpoint}: {error}"
                ) from None
            self._gossip_remotes[endpoint] = dealer
        own = self.endpoint if keys is None else f"{self.endpoint}|{keys.public.decode()}"
        gossip.publish(self.uuid_hex.upper(), own)
        for endpoint in self._gossip_remotes:
            gossip.add_remote(endpoint)
        if self._gossip_remotes:
            self.ports.periodic.every(config.gossip_ping_interval, gossip.ping)

    def _on_gossip_clients(self, batch: list[list[bytes]]) -> None:
        gossip = self.gossip
        if gossip is None:
            return
        for identity, *frames in batch:
            gossip.on_client(identity, frames)

    def _on_gossip_remote(self, endpoint: str, batch: list[list[bytes]]) -> None:
        gossip = self.gossip
        if gossip is None:
            return
        for frames in batch:
            gossip.on_remote(endpoint, frames)

    def _on_gossip_tuple(self, key: str, value: str) -> None:
        """A tuple heard through gossip: greet the node in it, as zyre does."""
        core = self.core
        if core is None or key.upper() == self.uuid_hex.upper():
            return
        parsed = parse_tuple_value(value)
        try:
            node = bytes.fromhex(key)
        except ValueError:
            node = b""
        if parsed is None or len(node) != 16:
            self.drops.drop("gossip-tuple", f"not a zyre tuple: {key!r} = {value[:80]!r}")
            return
        endpoint, public_key = parsed
        if endpoint == self.endpoint:
            return
        if (public_key is None) != (self.curve.keys is None):
            # A CURVE node and a plain one never meet (as with beacons).
            reason = "plain-tuple" if public_key is None else "curve-tuple"
            self.drops.drop(reason, f"gossip tuple {endpoint}", node)
            return
        if public_key is not None and self.config.peer_certs and not self._key_allowed(public_key):
            self.drops.drop("refused-key", f"gossip tuple {endpoint}: key not on the list", node)
            return
        core.require_peer(node, endpoint, public_key=public_key)

    def _raw_public_key(self) -> bytes | None:
        keys = self.curve.keys
        return None if keys is None else z85.decode(keys.public)

    def _key_allowed(self, key: bytes) -> bool:
        zap = self.curve.zap
        return zap is not None and key in zap.certificates

    # -- input -------------------------------------------------------------------------------

    def _on_datagram(self, data: bytes, address: tuple[str, int]) -> None:
        core, interface = self.core, self.interface
        if core is None or interface is None:
            return
        host = address[0]
        # Fast path: the same beacon again from a peer we know (every peer, every second).
        known = self._beacons.get(data)
        if known is not None and known[1] == host and core.peers.get(known[0].uuid) is known[0]:
            known[0].last_seen = self.reactor.seconds()
            self.beacons_received += 1
            return
        try:
            beacon = codec.parse_beacon(data, self.config.version)
        except ZreError as error:
            self.drops.drop(error.reason, str(error), host)
            return
        if beacon.uuid == self.uuid:
            return
        on_subnet = self._hosts.get(host)
        if on_subnet is None:
            on_subnet = self._hosts[host] = interface.contains(host)
            if len(self._hosts) > 4096:
                self._hosts.clear()
        if not on_subnet:
            self.drops.drop("foreign-subnet", f"beacon from {host}", host)
            return
        self.beacons_received += 1
        core.on_beacon(beacon, host)
        peer = core.peers.get(beacon.uuid)
        if peer is not None and not beacon.leaving:
            if len(self._beacons) > 4 * len(core.peers) + 64:
                self._beacons.clear()
            self._beacons[data] = (peer, host)

    def _on_mailbox(self, batch: list[list[bytes]]) -> None:
        """The protocol's work first, as zyre's node actor does it (its application reads
        the events from a pipe, in a thread of its own): the batch's messages, then what
        came in meanwhile (peers greeting us together are greeted back together, their
        elections answered), and only then the listeners hear of it all, in order."""
        core = self.core
        if core is None:
            return
        self.messages_received += len(batch)
        if self._held is not None:
            core.on_messages(batch)  # read by the drain below
            return
        held: list[ZreEvent] = []
        self._held = held
        try:
            core.on_messages(batch)
            mailbox = self.mailbox
            if mailbox is not None and mailbox.drain(_MORE_BEFORE_EVENTS) >= _MORE_BEFORE_EVENTS:
                mailbox.read_soon()
        finally:
            self._held = None
        for event in held:
            self._deliver(event)

    def _on_log_records(self, batch: list[list[bytes]]) -> None:
        for frames in batch:
            try:
                record = codec.parse_log(frames)
            except ZreError as error:
                self.drops.drop(error.reason, str(error), b"zrelog")
                continue
            self.log_records += 1
            self._publish(
                f"/zre/log/{record.node:04x}/",
                {
                    "level": record.level_name,
                    "event": record.event_name,
                    "node": record.node,
                    "peer": record.peer,
                    "time_ms": record.time_ms,
                    "data": record.data,
                    "collector": self.uuid_hex,
                },
            )

    def _drop(self, reason: str, detail: str, peer: bytes) -> None:
        self.drops.drop(reason, detail, peer)

    def _tick(self) -> None:
        if self.core is not None:
            self.core.tick()
        if self.gossip is not None:
            self.gossip.tick()

    # -- output ------------------------------------------------------------------------------

    def _emit(self, event: ZreEvent) -> None:
        held = self._held
        if held is not None:
            held.append(event)  # told once the mailbox's batch is done
        else:
            self._deliver(event)

    def _deliver(self, event: ZreEvent) -> None:
        kind = event.type
        counts = self.events_by_type
        counts[kind] = counts.get(kind, 0) + 1
        if kind == "EXIT" and self.gossip is not None:
            self.gossip.unpublish(event.peer_hex.upper())  # as zyre's UNPUBLISH
        if kind in _MEMBERSHIP:
            self._publish_membership(event)
            if kind != "LEADER":
                self._log_sender(event)
        for listener in self.listeners:
            try:
                listener(event)
            except Exception:
                log.failure("ZRE event listener failed on {type}", type=event.type)

    def _publish_membership(self, event: ZreEvent) -> None:
        value: dict[str, Any] = {
            "event": event.type,
            "node": self.uuid_hex,
            "node_name": self.node_name,
            "peer": event.peer_hex,
            "name": event.name,
        }
        if event.type in ("ENTER", "EXIT"):
            value["endpoint"] = event.endpoint
            if event.type == "ENTER":
                value["headers"] = dict(event.headers)
            topic = f"/zre/peers/{event.peer_hex}/{event.type.lower()}/"
        else:
            value["group"] = event.group
            if event.type == "LEADER":
                value["leader"] = event.leader
            topic = f"/zre/groups/{quote(event.group or '', safe='')}/{event.type.lower()}/"
        self._publish(topic, value)

    def _publish(self, topic: str, value: dict[str, Any]) -> None:
        try:
            self.activity.publish(topic, value)
        except ValueError as error:
            self.activity_errors += 1
            log.warn("cannot publish ZRE activity: {error}", error=error)

    def _log_sender(self, event: ZreEvent) -> None:
        """20/ZRE: connect to the ZRE/LOG service a peer announces, and log what we see."""
        if self.config.version != VERSION_20 or self.ports.factory is None:
            return
        if event.type == "ENTER" and LOG_HEADER in event.headers:
            old: ZmqSocket | None = self._log_senders.pop(event.peer, None)
            if old is not None:
                old.shutdown()
                self.budget.release()
            sender = self._peer_socket(zmq.PUB, SocketOptions(linger_ms=0), "logsend")
            if sender is not None:
                try:
                    sender.connect(event.headers[LOG_HEADER])
                except zmq.ZMQError as error:
                    self._close_peer_socket(sender)
                    self.drops.drop("bad-endpoint", f"ZRE/LOG endpoint: {error}", event.peer)
                else:
                    self._log_senders[event.peer] = sender
        if event.type == "EXIT":
            gone: ZmqSocket | None = self._log_senders.pop(event.peer, None)
            if gone is not None:
                self._close_peer_socket(gone)
        if not self._log_senders:
            return
        data = f"{event.type} {event.name}" + (f" {event.group}" if event.group else "")
        record = LogRecord(
            level=_LOG_LEVEL[event.type],
            event=_LOG_EVENT[event.type],
            node=codec.node_hash(self.uuid),
            peer=codec.node_hash(event.peer),
            time_ms=int(time.time() * 1000),
            data=data.encode("utf-8")[:255].decode("utf-8", "ignore"),
        )
        frame = codec.encode_log(record)
        for sender in self._log_senders.values():
            if sender.send_frames([frame]):
                self.log_records_sent += 1

    def _peer_socket(self, kind: int, options: SocketOptions, what: str) -> ZmqSocket | None:
        """A socket on a peer's behalf, out of the descriptor budget; None (counted, no
        traceback: a flood must cost a counter, not a log line per datagram) when the
        budget or the process has none to spare."""
        factory = self.ports.factory
        if factory is None:
            return None
        if not self.budget.acquire():
            self.drops.drop(
                "descriptor-budget",
                f"{self.budget.in_use} peer sockets: the node's share of the descriptors is used",
            )
            return None
        try:
            return factory.socket(kind, None, options, name=f"zre-{what}")
        except zmq.ZMQError as error:
            self.budget.release()
            self.drops.drop("socket-error", f"cannot open a peer socket: {error}")
            return None

    def _peer_dealer(self) -> ZmqSocket | None:
        """A DEALER for a new peer: the one made ahead, else a new one (None: counted)."""
        dealer, self._spare_dealer = self._spare_dealer, None
        if dealer is None:
            dealer = self._make_dealer()
        if self._spare_due is None and self.core is not None:
            self._spare_due = self.reactor.callLater(0, self._make_spare)
        return dealer

    def _make_spare(self) -> None:
        self._spare_due = None
        # Never the last of the budget: a peer's own link comes first.
        if self._spare_dealer is None and self.core is not None and self.budget.available > 1:
            self._spare_dealer = self._make_dealer()

    def _make_dealer(self) -> ZmqSocket | None:
        return self._peer_socket(
            zmq.DEALER,
            # zyre's HWM: 100 messages a second for the 30 s a peer may be silent.
            SocketOptions(
                identity=codec.identity_of(self.uuid), send_hwm=3000, linger_ms=0, receive_hwm=10
            ),
            "peer",
        )

    def _close_peer_socket(self, sock: ZmqSocket) -> None:
        if not sock.closed:
            sock.shutdown()
            self.budget.release()

    # -- stopping ----------------------------------------------------------------------------

    def stopService(self) -> defer.Deferred[None]:
        if self._stopping is not None:
            return self._stopping
        Service.stopService(self)
        self.ports.periodic.stop_all()
        self._say_goodbye()
        if self.beacon is not None:
            self.beacon.stop()
            if self.config.version == VERSION_36 and self.udp is not None:
                # 36/ZRE: port 0 says we are leaving, so peers drop us at once.
                self.udp.send(
                    codec.encode_beacon(self.uuid, 0, self._raw_public_key()),
                    self.beacon.target,
                )
        self._stopping = self._close_all()
        return self._stopping

    def _say_goodbye(self) -> None:
        """Gossip mode: GOODBYE to every peer that gossips too (its tuple is held), as zyre
        says it to its peers when it stops, and they drop us at once rather than after
        ``--expired``. Only to those: pyre has no gossip, and dies on a command it does not
        know. Their links linger a little so that it goes out before they close."""
        core, gossip = self.core, self.gossip
        if core is None or gossip is None or self.config.version != VERSION_36:
            return
        gossiping = {key.upper() for key in gossip.tuples}
        told = core.goodbye(lambda node: uuidlib.UUID(bytes=node).hex.upper() in gossiping)
        for key in told:
            dealer = self._dealers.get(key)
            if dealer is not None and dealer.socket is not None:
                dealer.socket.set(zmq.LINGER, _GOODBYE_LINGER_MS)

    def _close_all(self) -> defer.Deferred[None]:
        closed = self._close_sockets()
        self.ports.close()
        return closed

    def _close_sockets(self) -> defer.Deferred[None]:
        if self.core is not None:
            self.core.close()
            self.core = None
        if self._spare_due is not None and self._spare_due.active():
            self._spare_due.cancel()
        self._spare_due = None
        spare, self._spare_dealer = self._spare_dealer, None
        for sock in [*self._dealers.values(), *self._log_senders.values(), *filter(None, [spare])]:
            self._close_peer_socket(sock)
        self._dealers.clear()
        self._log_senders.clear()
        for own in (self.mailbox, self.log_socket, self.gossip_hub, *self._gossip_remotes.values()):
            if own is not None:
                own.shutdown()
        self.mailbox = self.log_socket = self.gossip_hub = None
        self._gossip_remotes.clear()
        self.gossip = None
        udp, self.udp = self.udp, None
        return udp.close() if udp is not None else defer.succeed(None)

    # -- what it does ------------------------------------------------------------------------

    def status(self) -> dict[str, Any]:
        """The node, its beacon, peers, groups and counts, for ``/status``."""
        core = self.core
        peers = list(core.peers.values()) if core else []
        return {
            "uuid": self.uuid_hex,
            "name": self.node_name,
            "version": "36/ZRE" if self.config.version == VERSION_36 else "20/ZRE",
            "endpoint": self.endpoint,
            "beacon": (
                f"{self.interface.broadcast}:{self.config.beacon_port}"
                if self.interface and self.config.beacon_port
                else None
            ),
            "log_service": self.log_endpoint or None,
            "peers": sum(1 for p in peers if p.ready),
            "peers_foreign": core.foreign_count() if core else 0,
            "peers_pending": sum(1 for p in peers if not p.ready)
            + len(core.pending if core else ()),
            "peer_sockets": self.budget.in_use,
            "peer_sockets_capacity": self.budget.capacity,
            "ignored": dict(core.ignored) if core else {},
            "elections_held": core.elections_held if core else 0,
            "groups": list(core.own_groups) if core else [],
            "peer_groups": {g: len(m) for g, m in core.peer_groups.items()} if core else {},
            "events": dict(self.events_by_type),
            "messages_received": self.messages_received,
            "messages_sent": core.sent if core else 0,
            "beacons_received": self.beacons_received,
            "beacons_sent": self.beacon.sent if self.beacon else 0,
            "log_records": self.log_records,
            "log_records_sent": self.log_records_sent,
            "send_blocked": self.send_blocked,
            "dropped": dict(self.drops.counts),
            "curve": self.curve.status(),
            "gossip": self._gossip_status(),
        }

    def _gossip_status(self) -> dict[str, Any] | None:
        gossip = self.gossip
        if gossip is None:
            return None
        return {
            "hub": self.gossip_endpoint or None,
            "remotes": list(gossip.remotes),
            "clients": len(gossip.clients),
            "tuples": len(gossip.tuples),
            "messages_received": gossip.received,
            "messages_sent": gossip.sent,
        }

    #: The console's charts (see :mod:`bus.web.console.view`).
    console_rates = {"messages": "messages_received", "beacons": "beacons_received"}

    def details(self, limit: int = 100) -> dict[str, Any]:
        """The peers as the console lists them (at most ``limit``), and who is evasive or
        silent."""
        core = self.core
        if core is None:
            return {}
        now = self.reactor.seconds()
        peers = [
            {
                "uuid": peer.hex,
                "name": peer.name,
                "endpoint": peer.endpoint,
                "groups": sorted(peer.groups)[:limit],
                "state": "silent"
                if peer.silent
                else "evasive"
                if peer.evasive
                else "ready"
                if peer.ready
                else "pending",
                "last_seen_s": round(now - peer.last_seen, 3),
                "foreign": peer.foreign,
            }
            for peer in islice(core.peers.values(), limit)
        ]
        return {"peer_list": peers}

    def metrics(self) -> list[Metric]:
        """Peers, events, messages, beacons and drops, and CURVE, for ``/metrics``."""
        status = self.status()
        return [
            *self.curve.metrics(),
            gauge("zre_peers", "Peers that said HELLO", status["peers"]),
            gauge("zre_peers_pending", "Peers found but not greeted yet", status["peers_pending"]),
            counters_by("zre_events", "Events by type", "type", status["events"]),
            counter(
                "zre_messages_received", "Messages read from the mailbox", self.messages_received
            ),
            counter("zre_messages_sent", "Messages sent to peers", status["messages_sent"]),
            counter(
                "zre_beacons_received", "Valid beacons from other nodes", self.beacons_received
            ),
            counter("zre_beacons_sent", "Beacons sent", status["beacons_sent"]),
            counter("zre_log_records", "ZRE/LOG records received", self.log_records),
            counter("zre_send_blocked", "Sends refused by a full peer queue", self.send_blocked),
            counters_by("zre_dropped", "Bad input dropped, by reason", "reason", status["dropped"]),
            counters_by(
                "zre_ignored",
                "Valid messages accepted but not acted on (ELECT, unknown commands)",
                "reason",
                status["ignored"],
            ),
            gauge("zre_peer_sockets", "Sockets held on peers' behalf", status["peer_sockets"]),
        ]


class _GossipSockets:
    """:class:`bus.zre.gossip.GossipLinks` on the node's hub ROUTER and hub DEALERs."""

    def __init__(self, node: ZreNode) -> None:
        self.node = node

    def to_client(self, identity: bytes, frame: bytes) -> None:
        hub = self.node.gossip_hub
        if hub is not None and not hub.send_frames([identity, frame]):
            self.node.send_blocked += 1

    def to_remote(self, endpoint: str, frame: bytes) -> None:
        dealer = self.node._gossip_remotes.get(endpoint)
        if dealer is not None and not dealer.send_frames([frame]):
            self.node.send_blocked += 1


class _Dealers:
    """:class:`bus.zre.core.Links` as one DEALER per peer, with our identity."""

    def __init__(self, node: ZreNode) -> None:
        self.node = node
        self.sockets = node._dealers

    def connect(self, key: str, endpoint: str, server_key: bytes | None = None) -> bool:
        node = self.node
        old: ZmqSocket | None = node._dealers.pop(key, None)
        if old is not None:
            node._close_peer_socket(old)
        dealer = node._peer_dealer()
        if dealer is None:
            return False
        keys = node.curve.keys
        if server_key is not None and keys is not None:
            make_curve_client(dealer, server_key, keys)
        try:
            dealer.connect(endpoint)
        except zmq.ZMQError as error:
            node._close_peer_socket(dealer)
            node.drops.drop("bad-endpoint", f"cannot connect to {endpoint!r}: {error}")
            return False
        node._dealers[key] = dealer
        return True

    def send(self, key: str, frames: list[bytes]) -> bool:
        dealer = self.sockets.get(key)
        if dealer is None:
            return False
        if not dealer.send_frames(frames):
            self.node.send_blocked += 1
            return False
        return True

    def close(self, key: str) -> None:
        dealer: ZmqSocket | None = self.node._dealers.pop(key, None)
        if dealer is not None:
            self.node._close_peer_socket(dealer)

    def rekey(self, old: str, new: str) -> None:
        dealer: ZmqSocket | None = self.node._dealers.pop(old, None)
        if dealer is not None:
            self.node._dealers[new] = dealer
