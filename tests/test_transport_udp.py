"""bus.transport.udp: interface addresses from psutil, shared UDP ports on loopback, beacons."""

from __future__ import annotations

import socket
from typing import Any, NamedTuple

import pytest
import pytest_twisted
from twisted.internet import reactor

from bus.testing import wait_until
from bus.transport.udp import (
    BeaconSender,
    InterfaceError,
    UdpPort,
    interface_address,
    listen_shared,
    shared_udp_socket,
)
from tests.zre_helpers import free_udp_port


def test_loopback_address_and_its_broadcast() -> None:
    lo = interface_address("lo")
    assert (lo.address, lo.netmask, lo.broadcast) == ("127.0.0.1", "255.0.0.0", "127.255.255.255")
    assert lo.contains("127.1.2.3") and not lo.contains("10.0.0.1") and not lo.contains("junk")
    with pytest.raises(InterfaceError, match="no interface named"):
        interface_address("no-such-if0")


@pytest_twisted.inlineCallbacks
def test_listeners_of_one_process_share_a_socket_and_other_sockets_still_hear() -> Any:
    port = free_udp_port()
    heard: dict[str, list[bytes]] = {"a": [], "b": []}
    a = listen_shared(reactor, "0.0.0.0", port, lambda data, _: heard["a"].append(data))
    b = listen_shared(reactor, "0.0.0.0", port, lambda data, _: heard["b"].append(data))
    # Another process's socket on the same port (SO_REUSEPORT) gets every broadcast too.
    other = shared_udp_socket("0.0.0.0", port)
    other.setblocking(True)
    other.settimeout(5)
    beacon = BeaconSender(reactor, b, ("127.255.255.255", port), lambda: b"beacon", 0.05)
    try:
        beacon.start()
        yield wait_until(lambda: len(heard["a"]) >= 3 and len(heard["b"]) >= 3, what="beacons")
        assert other.recv(64) == b"beacon"
        assert a.port == b.port == port
        yield a.close()
        count = len(heard["a"])
        yield wait_until(lambda: len(heard["b"]) >= count + 3, what="b still hears")
        assert len(heard["a"]) == count  # a left: no more datagrams
        assert not b.closed
    finally:
        beacon.stop()
        yield a.close()
        yield b.close()
        other.close()
    # Every listener gone: the port is closed, so a plain bind without reuse succeeds.
    plain = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    plain.bind(("0.0.0.0", port))
    plain.close()


@pytest_twisted.inlineCallbacks
def test_send_errors_are_counted_not_raised() -> Any:
    udp = UdpPort(reactor, lambda data, address: None)
    udp.listen("127.0.0.1", 0)
    try:
        assert udp.send(b"x" * 70_000, ("127.0.0.1", 9)) is False  # too big for a datagram
        assert udp.send_errors == 1
        assert udp.send(b"x", ("127.0.0.1", 9)) is True
    finally:
        yield udp.close()


def _fake_interfaces(monkeypatch: pytest.MonkeyPatch, **entries: list[Any]) -> None:
    """psutil.net_if_addrs() answering ``entries`` (psutil's snicaddr tuples)."""
    import psutil

    monkeypatch.setattr(psutil, "net_if_addrs", lambda: entries)


class _Snicaddr(NamedTuple):
    """The fields of psutil's ``snicaddr``."""

    family: int
    address: str
    netmask: str | None
    broadcast: str | None
    ptp: str | None


def _inet(address: str, netmask: str, broadcast: str | None, ptp: str | None = None) -> Any:
    return _Snicaddr(socket.AF_INET, address, netmask, broadcast, ptp)


def test_broadcast_computed_when_missing_or_reported_as_the_address_itself(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # `ip addr add 10.78.0.1/24 dev X` without `brd`: psutil says broadcast = the address.
    _fake_interfaces(
        monkeypatch,
        nobrd=[_inet("10.78.0.1", "255.255.255.0", "10.78.0.1")],
        missing=[_inet("10.79.0.7", "255.255.0.0", None)],
        explicit=[_inet("10.80.0.1", "255.255.255.0", "10.80.0.255")],
    )
    assert interface_address("nobrd").broadcast == "10.78.0.255"
    assert interface_address("missing").broadcast == "10.79.255.255"
    assert interface_address("explicit").broadcast == "10.80.0.255"


def test_a_host_route_or_point_to_point_interface_has_no_broadcast(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _fake_interfaces(
        monkeypatch,
        host=[_inet("10.78.0.1", "255.255.255.255", "10.78.0.1")],
        ptp=[_inet("10.78.0.1", "255.255.255.0", None, ptp="10.78.0.2")],
    )
    with pytest.raises(InterfaceError, match=r"10\.78\.0\.1/32.*no broadcast"):
        interface_address("host")
    with pytest.raises(InterfaceError, match=r"point-to-point.*no broadcast"):
        interface_address("ptp")
