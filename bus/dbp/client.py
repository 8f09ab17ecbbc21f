"""Twisted libraries for DBP peers: a service that registers and heartbeats, a client that asks
the catalog for services, and discovery of the catalog by its ``SHALOM`` beacon::

    endpoint = yield find_catalog()                    # tcp://127.0.0.1:5246, from the beacon
    registration = ServiceRegistration(endpoint, {"name": "thermo", "address": "127.0.0.1",
                                                   "port": 7000, "function": "temperature",
                                                   "heartbeat": 1.0})
    registration.startService()
    yield registration.registered                      # OwO (DENIED: errback with Denied)
    yield registration.update({"function": "humidity"})
    services = yield CatalogClient(endpoint).services()

``dialect="hermes"`` speaks to Hermes' own catalog, which reads exactly 4 octets of time
(``struct.pack('f')``; its reactor dies on any other size): float32 times, Hermes'
registration form, and none of what it cannot take (heartbeats, DISCONNECT).
"""

from __future__ import annotations

import contextlib
from collections import deque
from collections.abc import Sequence
from typing import Any

import zmq
from twisted.application.service import Service
from twisted.internet import defer
from twisted.logger import Logger

from bus.dbp import codec
from bus.dbp.codec import DbpError, DbpMessage
from bus.extension import SocketFactory, SocketOptions, ZmqSocket, listen_shared, reactor_of
from bus.transport.curve import ClientCurve
from bus.transport.udp import UdpListener, UdpPort
from bus.util.periodic import Periodic
from bus.util.wakes import Wakes

log = Logger(namespace="bus.dbp")


class Denied(Exception):
    """The catalog refused a registration or an update; ``reasons`` says why."""

    def __init__(self, reasons: list[str]) -> None:
        super().__init__("; ".join(reasons))
        self.reasons = reasons


def _host_of(endpoint: str) -> str:
    return endpoint.removeprefix("tcp://").rpartition(":")[0]


def find_catalog(
    reactor: Any = None, beacon_port: int = 5245, timeout: float = 5.0, host: str = "0.0.0.0"
) -> defer.Deferred[str]:
    """The catalog's endpoint (``tcp://HOST:PORT``) from the first ``SHALOM`` beacon heard."""
    clock = reactor_of(reactor)
    found: defer.Deferred[str] = defer.Deferred()
    listener: UdpListener | None = None

    def heard(data: bytes, address: tuple[str, int]) -> None:
        try:
            port = codec.parse_beacon(data)
        except DbpError:
            return
        if not found.called:
            found.callback(f"tcp://{address[0]}:{port}")

    def give_up() -> None:
        if not found.called:
            found.errback(TimeoutError(f"no SHALOM beacon on UDP {beacon_port} in {timeout}s"))

    listener = listen_shared(clock, host, beacon_port, heard)
    timer = clock.callLater(timeout, give_up)

    def done(result: Any) -> Any:
        if timer.active():
            timer.cancel()
        assert listener is not None
        listener.close()
        return result

    return found.addBoth(done)


def _time_size(dialect: str, time_size: int | None) -> int:
    if dialect not in codec.DIALECTS:
        raise ValueError(f"dialect must be one of {', '.join(codec.DIALECTS)}, not {dialect!r}")
    if time_size is not None:
        return time_size
    return codec.TIME_FLOAT32 if dialect == codec.HERMES else codec.TIME_DOUBLE


class CatalogClient:
    """Info requests over one DEALER (the explicit empty frame first); replies come back in
    the order asked. ``dialect="hermes"`` (or ``time_size=4``) speaks the original's
    float32 time."""

    def __init__(
        self,
        endpoint: str,
        reactor: Any = None,
        time_size: int | None = None,
        dialect: str = codec.SPEC,
        curve: ClientCurve | None = None,
    ) -> None:
        self.reactor = reactor_of(reactor)
        self.dialect = dialect
        self.time_size = _time_size(dialect, time_size)
        self._factory = SocketFactory(self.reactor, curve=curve)
        self._waiting: deque[defer.Deferred[dict[str, Any]]] = deque()
        self.socket = self._factory.socket(
            zmq.DEALER, self._on_replies, SocketOptions(linger_ms=0), name="dbp-client"
        )
        self.socket.connect(endpoint)

    def services(self, name: str = "") -> defer.Deferred[dict[str, Any]]:
        """Every active service (``{name: info}``), or one; an inactive or unknown one
        answers ``{"Error": ..., "inactive": name}``."""
        answer: defer.Deferred[dict[str, Any]] = defer.Deferred()
        frames = codec.encode(
            codec.INFO_REQUEST, self.reactor.seconds(), [name.encode()], self.time_size
        )
        if not self.socket.send_frames(frames):
            return defer.fail(RuntimeError("catalog queue full"))
        self._waiting.append(answer)
        return answer

    def _on_replies(self, batch: list[list[bytes]]) -> None:
        for frames in batch:
            try:
                message = codec.parse(frames)
                body = codec.json_object(message.body[0]) if message.body else {}
            except DbpError as error:
                log.warn("bad reply from the catalog: {error}", error=error)
                continue
            if message.command != codec.INFO_REPLY or not self._waiting:
                continue
            self._waiting.popleft().callback(body)

    def close(self) -> None:
        """Fail the questions still waiting and close the socket."""
        while self._waiting:
            self._waiting.popleft().errback(ConnectionError("client closed"))
        self._factory.shutdown()


class ServiceRegistration(Service):
    """A service in the catalog: registers, heartbeats over UDP (and over its ZeroMQ
    connection while UDP beats go missing either way), updates, re-registers on DISCONNECT
    or when the catalog has been silent for ``liveness`` of its intervals (it restarted, or
    is gone), and says DISCONNECT when stopped. A tick after a stall of its own process
    judges no silence (:mod:`bus.util.wakes`).

    It receives the catalog's UDP heartbeats on its registered port number (or
    ``heartbeat_port``) over UDP, on its registered address.

    ``catalog`` may be several endpoints (instances of one shared catalog, ``twistd -n dbp
    --nats``): it registers at the first, and after a silence at the next.

    ``dialect="hermes"`` registers as Hermes' Service does (float32 time, ``interfaces``
    form from ``address`` and ``port``) and, as Hermes' catalog can take neither, never
    heartbeats and never says DISCONNECT."""

    def __init__(
        self,
        catalog: str | Sequence[str],
        info: dict[str, Any],
        reactor: Any = None,
        token: str | None = None,
        time_size: int | None = None,
        dialect: str = codec.SPEC,
        curve: ClientCurve | None = None,
    ) -> None:
        self.catalogs = [catalog] if isinstance(catalog, str) else list(catalog)
        if not self.catalogs:
            raise ValueError("no catalog endpoint given")
        #: The endpoint registered at now.
        self.catalog = self.catalogs[0]
        self.curve = curve
        self.dialect = dialect
        self.time_size = _time_size(dialect, time_size)
        self.info = dict(info)
        if token is not None:
            self.info["token"] = token
        self.reactor = reactor_of(reactor)
        self.registered: defer.Deferred[dict[str, Any]] = defer.Deferred()
        self.state = "new"
        self.registrations = 0
        self.reregistrations = 0
        self.denied: list[str] = []
        self.catalog_interval = 1.0
        self.catalog_liveness = 3
        self.catalog_udp_port = int(self.catalog.rpartition(":")[2])
        #: Moves to the next catalog after a silence.
        self.moves = 0
        self.last_catalog_udp = 0.0
        self.last_catalog_zmq = 0.0
        self.last_catalog_any = 0.0
        #: The catalog run that approved us (its heartbeats carry it): another one means
        #: the catalog restarted, and we register again.
        self.catalog_id = ""
        self.sent_udp = 0
        self.sent_zmq = 0
        self.path = "udp"
        self.ticks = 0
        self._factory: SocketFactory | None = None
        self.socket: ZmqSocket | None = None
        self.udp: UdpPort | None = None
        self._updates: deque[defer.Deferred[None]] = deque()
        self._periodic = Periodic(self.reactor, log)
        #: A tick after a stall of this process judges no silence (:mod:`bus.util.wakes`).
        self.wakes = Wakes(float(self.info.get("heartbeat", 1.0)), self.reactor.seconds)

    @property
    def service_name(self) -> str:
        """The name the service registers under."""
        return str(self.info.get("name", ""))

    # -- lifecycle ---------------------------------------------------------------------------

    def startService(self) -> None:
        Service.startService(self)
        self._factory = SocketFactory(self.reactor, curve=self.curve)
        port = int(self.info.get("heartbeat_port") or self.info.get("port") or 0)
        if port and self.dialect == codec.SPEC:
            self.udp = UdpPort(self.reactor, self._on_datagram)
            self.udp.listen(str(self.info.get("address", "0.0.0.0")), port)
        self._register()
        self._periodic.every(float(self.info.get("heartbeat", 1.0)), self._tick)

    def _new_socket(self) -> None:
        assert self._factory is not None
        if self.socket is not None:
            self.socket.shutdown()
        self.socket = self._factory.socket(
            zmq.DEALER, self._on_messages, SocketOptions(linger_ms=0), name="dbp-service"
        )
        self.socket.connect(self.catalog)

    def _register(self) -> None:
        self._new_socket()
        self.state = "registering"
        self.last_catalog_any = self.reactor.seconds()
        self._send(codec.REGISTER, [codec.json_frame(self._registration())])

    def _registration(self) -> dict[str, Any]:
        if self.dialect == codec.SPEC:
            return self.info
        info = self.info
        router = {"ip": info.get("address", "127.0.0.1"), "port": info.get("port", 0)}
        body = {k: v for k, v in info.items() if k not in ("address", "port", "heartbeat")}
        return {
            **body,
            "interfaces": {"router": router},
            "reg_time": self.reactor.seconds(),
            "topics": info.get("topics"),
        }

    def _send(self, command: bytes, body: list[bytes] | None = None) -> bool:
        if self.socket is None:
            return False
        frames = codec.encode(command, self.reactor.seconds(), body or [], self.time_size)
        return self.socket.send_frames(frames)

    def update(self, fields: dict[str, Any]) -> defer.Deferred[None]:
        """Merge ``fields`` into the registration; fires on u.u, fails with Denied."""
        self.info.update(fields)
        answer: defer.Deferred[None] = defer.Deferred()
        self._updates.append(answer)
        self._send(codec.UPDATE, [codec.json_frame({"name": self.service_name, **fields})])
        return answer

    def stopService(self) -> defer.Deferred[None]:
        Service.stopService(self)
        self._periodic.stop_all()
        if self.state == "registered" and self.dialect == codec.SPEC:
            self._send(codec.DISCONNECT)
        self.state = "stopped"
        # Let the DISCONNECT leave before the socket closes (linger 0 would drop it).
        if self.socket is not None:
            self.socket.socket.set(zmq.LINGER, 200)
            self.socket.shutdown()
            self.socket = None
        if self._factory is not None:
            self._factory.shutdown()
            self._factory = None
        udp, self.udp = self.udp, None
        return udp.close() if udp is not None else defer.succeed(None)

    # -- input -------------------------------------------------------------------------------

    def _on_messages(self, batch: list[list[bytes]]) -> None:
        for frames in batch:
            try:
                message = codec.parse(frames)
            except DbpError as error:
                log.warn("bad message from the catalog: {error}", error=error)
                continue
            now = self.reactor.seconds()
            self.last_catalog_any = now
            command = message.command
            if command == codec.APPROVED:
                self._approved(message)
            elif command in (codec.DENIED, codec.DENIED_ORIGINAL):
                self._on_denied(message)
            elif command == codec.ACKNOWLEDGED:
                if self._updates:
                    self._updates.popleft().callback(None)
            elif command == codec.HEARTBEAT:
                self.last_catalog_zmq = now
                self._check_catalog(message.text)
            elif command == codec.DISCONNECT and self.state != "stopped":
                log.info(
                    "catalog said DISCONNECT: registering {name} again", name=self.service_name
                )
                self.reregistrations += 1
                self._register()

    def _approved(self, message: DbpMessage) -> None:
        config: dict[str, Any] = {}
        if message.body:
            try:
                config = codec.json_object(message.body[0])
            except DbpError:
                config = {}
        self.catalog_interval = float(config.get("heartbeat_interval", self.catalog_interval))
        self.catalog_liveness = int(config.get("liveness", self.catalog_liveness))
        self.catalog_udp_port = int(config.get("udp_port") or self.catalog_udp_port)
        self.catalog_id = str(config.get("catalog_id", ""))
        self.state = "registered"
        self.registrations += 1
        self.last_catalog_udp = self.reactor.seconds()
        if not self.registered.called:
            self.registered.callback(config)

    def _on_denied(self, message: DbpMessage) -> None:
        reasons = ["denied"]
        if message.body:
            with contextlib.suppress(DbpError):
                reasons = list(codec.json_object(message.body[0]).get("denied", reasons))
        if self.state == "registering":
            self.state = "denied"
            self.denied = reasons
            if not self.registered.called:
                self.registered.errback(Denied(reasons))
        elif self._updates:
            self._updates.popleft().errback(Denied(reasons))

    def _on_datagram(self, data: bytes, address: tuple[str, int]) -> None:
        try:
            _, catalog_id = codec.parse_udp_heartbeat(data)
        except DbpError:
            return
        if address[0] == _host_of(self.catalog) or _host_of(self.catalog) in ("localhost", "*"):
            now = self.reactor.seconds()
            self.last_catalog_udp = self.last_catalog_any = now
            self._check_catalog(catalog_id)

    def _check_catalog(self, catalog_id: str) -> None:
        if self.state == "registered" and self.catalog_id and catalog_id != self.catalog_id:
            log.info("the catalog restarted: registering {name} again", name=self.service_name)
            self.reregistrations += 1
            self._register()

    # -- heartbeats --------------------------------------------------------------------------

    def _tick(self) -> None:
        self.ticks += 1
        if self.state == "denied" or self.state == "stopped" or self.dialect != codec.SPEC:
            return
        now = self.reactor.seconds()
        judging = self.wakes.judging()
        silent = now - self.last_catalog_any
        if judging and silent > self.catalog_liveness * max(self.catalog_interval, 0.05) * 2:
            # Nothing from the catalog at all: it restarted or is gone. Start over, at the
            # next catalog when there are several.
            self.reregistrations += 1
            if len(self.catalogs) > 1:
                index = (self.catalogs.index(self.catalog) + 1) % len(self.catalogs)
                self.catalog = self.catalogs[index]
                self.catalog_udp_port = int(self.catalog.rpartition(":")[2])
                self.moves += 1
                log.info(
                    "catalog silent: registering {name} at {catalog}",
                    name=self.service_name,
                    catalog=self.catalog,
                )
            self._register()
            return
        if self.state != "registered":
            return
        if self.udp is not None:
            beat = codec.encode_udp_heartbeat(self.service_name, now)
            if self.udp.send(beat, (_host_of(self.catalog), self.catalog_udp_port)):
                self.sent_udp += 1
        if judging:
            window = 2 * self.catalog_interval
            udp_alone = (
                now - self.last_catalog_udp <= window and now - self.last_catalog_zmq >= window
            )
            self.path = "udp" if udp_alone and self.udp is not None else "zmq"
        if self.path == "zmq" and self._send(codec.HEARTBEAT, [self.service_name.encode()]):
            self.sent_zmq += 1
