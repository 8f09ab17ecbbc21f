"""UDP for beacons and heartbeats: interface addresses, a shared listening port, a beacon.

ZRE and DBP both announce themselves by UDP broadcast and listen on a well-known port
that several processes (and several nodes of one process) share. Here:

* :func:`interface_address` asks psutil for an interface's IPv4 address and netmask and
  derives its directed broadcast address when the kernel reports none, or reports the
  address itself (loopback: 127.0.0.1, 127.255.255.255), so the default configuration
  never broadcasts beyond this machine;
* :class:`UdpPort` is a Twisted ``DatagramProtocol`` on a socket bound with SO_REUSEADDR,
  SO_REUSEPORT and SO_BROADCAST, so every process listening on the port gets each
  broadcast; :func:`listen_shared` shares one such socket among the listeners of a process;
* :class:`BeaconSender` sends a payload to a target at a fixed interval (at once on start).

Importing this module does not import the reactor.
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from twisted.internet import defer, task
from twisted.internet.error import MessageLengthError
from twisted.internet.protocol import DatagramProtocol
from twisted.logger import Logger

log = Logger(namespace="bus.transport.udp")

DatagramHandler = Callable[[bytes, tuple[str, int]], None]

LOOPBACK = "lo"


class InterfaceError(LookupError):
    """No such interface, or it has no IPv4 address."""


@dataclass(frozen=True, slots=True)
class InterfaceAddress:
    """An interface's IPv4 address, netmask and the broadcast address beacons are sent to."""

    name: str
    address: str
    netmask: str
    broadcast: str
    network: ipaddress.IPv4Network = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        network = ipaddress.IPv4Network(f"{self.address}/{self.netmask}", strict=False)
        object.__setattr__(self, "network", network)

    def contains(self, host: str) -> bool:
        """Whether ``host`` (an IPv4 address as text) is on this interface's subnet."""
        try:
            return ipaddress.IPv4Address(host) in self.network
        except ValueError:
            return False


def interface_address(name: str = LOOPBACK) -> InterfaceAddress:
    """The first IPv4 address of interface ``name`` (psutil), with its broadcast address.

    psutil reports an address added without ``brd`` (``ip addr add 10.0.0.1/24 dev X``) with
    the address itself as its broadcast, and loopback with none: then the broadcast is the
    subnet's highest address, as zyre computes it. A /32 (or /31) address or a
    point-to-point interface has no broadcast address: InterfaceError says so."""
    import psutil

    addresses = psutil.net_if_addrs().get(name)
    if addresses is None:
        known = ", ".join(sorted(psutil.net_if_addrs()))
        raise InterfaceError(f"no interface named {name!r} (this machine has: {known})")
    for entry in addresses:
        if entry.family != socket.AF_INET or not entry.netmask:
            continue
        network = ipaddress.IPv4Network(f"{entry.address}/{entry.netmask}", strict=False)
        broadcast = entry.broadcast
        if not broadcast or broadcast == entry.address:
            if getattr(entry, "ptp", None):
                raise InterfaceError(
                    f"interface {name!r} ({entry.address}) is point-to-point "
                    f"(peer {entry.ptp}): it has no broadcast address"
                )
            if network.prefixlen >= 31:
                raise InterfaceError(
                    f"interface {name!r} has {entry.address}/{network.prefixlen}: "
                    "a subnet without hosts to reach has no broadcast address"
                )
            broadcast = str(network.broadcast_address)
        return InterfaceAddress(name, entry.address, entry.netmask, broadcast)
    raise InterfaceError(f"interface {name!r} has no IPv4 address")


def shared_udp_socket(host: str, port: int) -> socket.socket:
    """A non-blocking UDP socket bound to ``host:port`` that other sockets may share and
    that may send broadcasts."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_BROADCAST, 1)
        sock.setblocking(False)
        sock.bind((host, port))
    except OSError:
        sock.close()
        raise
    return sock


class UdpPort(DatagramProtocol):
    """A shared UDP port in the reactor; every datagram goes to ``on_datagram``.

    Send failures (a network gone, a full buffer) are counted, never raised: beacons and
    heartbeats are best effort, and their receivers time out on their own.
    """

    noisy = False  # the service logs its ports itself, once

    def __init__(self, reactor: Any, on_datagram: DatagramHandler) -> None:
        self.reactor = reactor
        self.on_datagram = on_datagram
        self.port = 0
        self.sent = 0
        self.received = 0
        self.send_errors = 0
        self._listening: Any = None

    def listen(self, host: str, port: int, max_packet_size: int = 8192) -> int:
        """Bind ``host:port`` (0: any free port) and return the port; raises OSError."""
        sock = shared_udp_socket(host, port)
        try:
            # The reactor takes a duplicate of the descriptor; ours is closed below.
            self._listening = self.reactor.adoptDatagramPort(
                sock.fileno(), socket.AF_INET, self, max_packet_size
            )
            self.port = sock.getsockname()[1]
        finally:
            sock.close()
        return self.port

    def datagramReceived(self, datagram: bytes, addr: Any) -> None:
        """Hand one datagram to the handler; a handler error is logged, not raised."""
        self.received += 1
        try:
            self.on_datagram(datagram, (addr[0], addr[1]))
        except Exception:
            # A handler bug must not stop the port from being read.
            log.failure("datagram handler failed")

    def send(self, datagram: bytes, address: tuple[str, int]) -> bool:
        """Send ``datagram`` to ``address``; False (counted) when the OS refuses it."""
        transport: Any = self.transport
        if transport is None:
            return False
        try:
            transport.write(datagram, address)
        except (OSError, MessageLengthError) as error:
            self.send_errors += 1
            if self.send_errors == 1 or self.send_errors % 100 == 0:
                log.warn(
                    "UDP send to {address} failed ({count} so far): {error}",
                    address=address,
                    count=self.send_errors,
                    error=error,
                )
            return False
        self.sent += 1
        return True

    @property
    def closed(self) -> bool:
        """The port no longer listens."""
        return self._listening is None

    def close(self) -> defer.Deferred[None]:
        """Stop listening; fires once the socket is closed. Idempotent."""
        listening, self._listening = self._listening, None
        if listening is None:
            return defer.succeed(None)
        result = listening.stopListening()
        return result if isinstance(result, defer.Deferred) else defer.succeed(None)


class UdpListener:
    """One listener's share of a UDP port: what :func:`listen_shared` returns."""

    def __init__(self, shared: _SharedPort, on_datagram: DatagramHandler) -> None:
        self._shared: _SharedPort | None = shared
        self.on_datagram = on_datagram
        self.port = shared.port.port
        self.received = 0

    def send(self, datagram: bytes, address: tuple[str, int]) -> bool:
        """Send ``datagram`` to ``address`` from the shared port; False when it cannot."""
        return self._shared.port.send(datagram, address) if self._shared else False

    @property
    def closed(self) -> bool:
        """This listener has left the port."""
        return self._shared is None

    def close(self) -> defer.Deferred[None]:
        """Leave the port (closed once its last listener leaves). Idempotent."""
        shared, self._shared = self._shared, None
        return shared.leave(self) if shared is not None else defer.succeed(None)


class _SharedPort:
    def __init__(self, key: tuple[int, str, int], port: UdpPort) -> None:
        self.key = key
        self.port = port
        self.listeners: list[UdpListener] = []

    def dispatch(self, datagram: bytes, address: tuple[str, int]) -> None:
        for listener in list(self.listeners):
            listener.received += 1
            try:
                listener.on_datagram(datagram, address)
            except Exception:
                log.failure("datagram handler failed")

    def leave(self, listener: UdpListener) -> defer.Deferred[None]:
        if listener in self.listeners:
            self.listeners.remove(listener)
        if self.listeners:
            return defer.succeed(None)
        _SHARED.pop(self.key, None)
        return self.port.close()


_SHARED: dict[tuple[int, str, int], _SharedPort] = {}


def listen_shared(reactor: Any, host: str, port: int, on_datagram: DatagramHandler) -> UdpListener:
    """Listen on ``host:port`` through one socket per process and port: the nodes of one
    process (a simulation of many) share it, so each datagram is read once and handed to
    every listener, instead of once per node. Port 0 is never shared. Raises OSError."""
    key = (id(reactor), host, port)
    shared = _SHARED.get(key) if port else None
    if shared is None:
        udp = UdpPort(reactor, lambda data, address: None)
        udp.listen(host, port)
        shared = _SharedPort(key, udp)
        udp.on_datagram = shared.dispatch
        if port:
            _SHARED[key] = shared
    listener = UdpListener(shared, on_datagram)
    shared.listeners.append(listener)
    return listener


class BeaconSender:
    """Sends ``payload()`` to ``target`` through ``port`` every ``interval`` seconds, the
    first at once; :meth:`send_now` adds one out of turn (a leaving beacon)."""

    def __init__(
        self,
        reactor: Any,
        port: UdpPort | UdpListener,
        target: tuple[str, int],
        payload: Callable[[], bytes],
        interval: float,
    ) -> None:
        self.port = port
        self.target = target
        self.payload = payload
        self.interval = interval
        self.sent = 0
        self._loop = task.LoopingCall(self.send_now)
        self._loop.clock = reactor

    def start(self) -> None:
        """Send a beacon now and then every interval."""
        if not self._loop.running:
            self._loop.start(self.interval, now=True).addErrback(
                lambda failure: log.failure("beacon failed", failure)
            )

    def send_now(self) -> None:
        """Send one beacon at once (a leaving beacon, say)."""
        if self.port.send(self.payload(), self.target):
            self.sent += 1

    def stop(self) -> None:
        """Stop sending beacons."""
        if self._loop.running:
            self._loop.stop()
