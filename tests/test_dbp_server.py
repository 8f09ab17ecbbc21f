"""The DBP catalog through real sockets on 127.0.0.1: REQ and DEALER clients, registration,
DENIED, updates, DISCONNECT, the original's float32 dialect, UDP heartbeats with the ZeroMQ
fallback and back, expiry, restart, the beacon."""

from __future__ import annotations

import json
import struct
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import pytest_twisted
import zmq
from twisted.internet import reactor

from bus.dbp import codec
from bus.dbp.client import CatalogClient, Denied, ServiceRegistration, find_catalog
from bus.dbp.config import CatalogConfig
from bus.dbp.server import CatalogService
from bus.testing import RawPeer, wait_until
from tests.zre_helpers import free_udp_port

CatalogMaker = Callable[..., CatalogService]


class Activity:
    def __init__(self) -> None:
        self.events: list[tuple[str, Any]] = []

    def publish(self, topic: str, value: object) -> None:
        self.events.append((topic, value))

    def topics(self) -> list[str]:
        return [topic for topic, _ in self.events]


@pytest.fixture
def make_catalog(tmp_path: Path) -> Iterator[CatalogMaker]:
    made: list[CatalogService] = []

    def make(**settings: Any) -> CatalogService:
        activity = settings.pop("activity", None)
        config = CatalogConfig(
            port=0,
            beacon_port=free_udp_port(),
            beacon_interval=0.1,
            heartbeat_interval=0.1,
            data_dir=str(tmp_path / "dbp"),
        )
        catalog = CatalogService(replace(config, **settings), activity=activity or Activity())
        catalog.startService()
        made.append(catalog)
        return catalog

    yield make
    for catalog in made:
        pytest_twisted.blockon(catalog.stopService())


@pytest.fixture
def stoppers() -> Iterator[list[Any]]:
    """Things with close() or stopService() to end after the test."""
    things: list[Any] = []
    yield things
    for thing in reversed(things):
        if hasattr(thing, "stopService"):
            if thing.running:
                pytest_twisted.blockon(thing.stopService())
        else:
            thing.close()


def registration(name: str, port: int, **extra: Any) -> dict[str, Any]:
    return {
        "name": name,
        "address": "127.0.0.1",
        "port": port,
        "function": "test",
        "heartbeat": 0.1,
        **extra,
    }


def request(command: bytes, body: list[bytes] | None = None, time_size: int = 8) -> list[bytes]:
    return codec.encode(command, 1_700_000_000.0, body or [], time_size)


def replies(peer: RawPeer) -> list[codec.DbpMessage]:
    out = []
    for frames in peer.messages:
        if peer.socket.socketType == zmq.REQ:
            frames = [b"", *frames]
        out.append(codec.parse(frames))
    return out


@pytest_twisted.inlineCallbacks
def test_register_info_update_disconnect_with_dealer_and_req_clients(
    make_catalog: CatalogMaker, stoppers: list[Any]
) -> Any:
    activity = Activity()
    catalog = make_catalog(activity=activity)
    service = RawPeer.dealer(catalog.endpoint)
    req = RawPeer(zmq.REQ, catalog.endpoint)
    stoppers += [service, req]
    # This raw service sends no heartbeat: with the 0.1 s of the others, the catalog would
    # beat it over ZeroMQ 0.2 s after its registration (a HEARTBEAT before the u.u) and
    # expire it after 0.3 s of silence, both within this test's steps on a loaded machine.
    body = codec.json_frame(registration("thermo", 7001, unit="C", heartbeat=60))
    service.send(request(codec.REGISTER, [body]))
    yield wait_until(lambda: service.messages, what="OwO")
    [approved] = replies(service)
    assert approved.command == codec.APPROVED and approved.time_size == 8
    config = codec.json_object(approved.body[0])
    assert config == {
        "heartbeat_interval": 0.1,
        "liveness": 3,
        "udp_port": catalog.port,
        "catalog_id": catalog.core.settings.catalog_id,
    }
    # A REQ client: its socket adds and strips the empty frame.
    req.send(request(codec.INFO_REQUEST, [b""])[1:])
    yield wait_until(lambda: req.messages, what="o_O to REQ")
    [info] = replies(req)
    services = codec.json_object(info.body[0])
    assert list(services) == ["thermo"]
    assert services["thermo"]["unit"] == "C" and services["thermo"]["active"] is True
    service.send(
        request(codec.UPDATE, [codec.json_frame({"name": "thermo", "unit": "K", "port": 7002})])
    )
    yield wait_until(lambda: len(service.messages) == 2, what="u.u")
    assert replies(service)[1].command == codec.ACKNOWLEDGED
    dealer = RawPeer.dealer(catalog.endpoint)
    stoppers.append(dealer)
    dealer.send(request(codec.INFO_REQUEST, [b"thermo"]))
    dealer.send(request(codec.INFO_REQUEST, [b"nobody"]))
    yield wait_until(lambda: len(dealer.messages) == 2, what="two o_O")
    one, unknown = (codec.json_object(m.body[0]) for m in replies(dealer))
    assert (one["thermo"]["unit"], one["thermo"]["port"]) == ("K", 7002)
    assert unknown["inactive"] == "nobody" and "Error" in unknown
    service.send(request(codec.DISCONNECT))
    yield wait_until(lambda: not catalog.core.entries, what="removed on </3")
    assert activity.topics() == [
        "/dbp/services/thermo/registered/",
        "/dbp/services/thermo/updated/",
        "/dbp/services/thermo/disconnected/",
    ]
    # Nothing answers DISCONNECT. (The catalog's own ZeroMQ heartbeats (<3) to a service
    # that sends none over UDP would not be answers: none comes within its 60 s here.)
    answers = [m.command for m in replies(service) if m.command != codec.HEARTBEAT]
    assert answers == [codec.APPROVED, codec.ACKNOWLEDGED]


@pytest_twisted.inlineCallbacks
def test_denied_for_malformed_registrations_and_by_the_allow_list(
    make_catalog: CatalogMaker, stoppers: list[Any], tmp_path: Path
) -> Any:
    catalog = make_catalog(allow={"ok": None, "secret": "s3cr3t"})
    peer = RawPeer.dealer(catalog.endpoint)
    stoppers.append(peer)
    cases = [
        [b"[1, 2]"],  # JSON, not an object
        [b"{not json"],
        [codec.json_frame({"name": "ok", "address": "127.0.0.1"})],  # keys missing
        [codec.json_frame(registration("intruder", 1))],  # not allowed
        [codec.json_frame(registration("secret", 1, token="wrong"))],
        [],
    ]
    for body in cases:
        peer.send(request(codec.REGISTER, body))
    yield wait_until(lambda: len(peer.messages) == len(cases), what="a DENIED each")
    answers = replies(peer)
    assert {m.command for m in answers} == {codec.DENIED}
    reasons = [codec.json_object(m.body[0])["denied"] for m in answers]
    assert "not an object" in reasons[0][0] and "not JSON" in reasons[1][0]
    assert any("port" in r for r in reasons[2]) and any("heartbeat" in r for r in reasons[2])
    assert "not allowed" in reasons[3][0] and "token" in reasons[4][0]
    assert not catalog.core.entries
    peer.send(
        request(codec.REGISTER, [codec.json_frame(registration("secret", 1, token="s3cr3t"))])
    )
    yield wait_until(lambda: len(peer.messages) == len(cases) + 1)
    assert replies(peer)[-1].command == codec.APPROVED
    assert "token" not in catalog.core.entries["secret"].info  # never stored or shown
    # An update from a peer that never registered is DENIED too.
    other = RawPeer.dealer(catalog.endpoint)
    stoppers.append(other)
    other.send(request(codec.UPDATE, [codec.json_frame({"name": "secret", "port": 9})]))
    yield wait_until(lambda: other.messages)
    assert replies(other)[0].command == codec.DENIED


@pytest_twisted.inlineCallbacks
def test_the_originals_float32_dialect_and_keys(
    make_catalog: CatalogMaker, stoppers: list[Any]
) -> Any:
    """What Hermes sends: a REQ socket, time as struct.pack('f'), ip_addr and liveliness (ms)."""
    catalog = make_catalog()
    hermes = RawPeer(zmq.REQ, catalog.endpoint)
    stoppers.append(hermes)
    info = {
        "name": "Rohan",
        "ip_addr": "127.0.0.1",
        "port": 7003,
        "last_beat": "Mon",
        "liveliness": 1000,
        "retry": 3,
        "topics": None,
    }
    hermes.send([codec.REGISTER, struct.pack("f", 1.7e9), json.dumps(info).encode()])
    yield wait_until(lambda: hermes.messages, what="OwO")
    frames = hermes.messages[0]
    assert frames[0] == codec.APPROVED and len(frames[1]) == 4  # answered in its dialect
    stored = catalog.core.entries["Rohan"].info
    assert (stored["address"], stored["heartbeat"], stored["retry"]) == ("127.0.0.1", 1.0, 3)
    hermes.send([codec.INFO_REQUEST, struct.pack("f", 1.7e9), b"Mordor"])
    yield wait_until(lambda: len(hermes.messages) == 2)
    command, time, body = hermes.messages[1]
    assert command == codec.INFO_REPLY and len(time) == 4
    assert "Error" in json.loads(body)
    bad = RawPeer(zmq.REQ, catalog.endpoint)
    stoppers.append(bad)
    bad.send([codec.REGISTER, struct.pack("f", 1.7e9), b"{}"])
    yield wait_until(lambda: bad.messages)
    assert bad.messages[0][0] == codec.DENIED_ORIGINAL  # OmO, as the original says DENIED


@pytest_twisted.inlineCallbacks
def test_unexpected_commands_get_disconnect_and_invalid_peers_are_dropped(
    make_catalog: CatalogMaker, stoppers: list[Any]
) -> Any:
    catalog = make_catalog()
    peer = RawPeer.dealer(catalog.endpoint)
    stranger = RawPeer.dealer(catalog.endpoint)
    invalid = RawPeer.dealer(catalog.endpoint)
    stoppers += [peer, stranger, invalid]
    peer.send(request(codec.APPROVED))  # only the catalog sends OwO
    stranger.send(request(codec.HEARTBEAT, [b"ghost"]))  # never registered
    yield wait_until(lambda: peer.messages and stranger.messages, what="DISCONNECTs")
    assert replies(peer)[0].command == replies(stranger)[0].command == codec.DISCONNECT
    invalid.send([b"", codec.INFO_REQUEST, b"\x00\x01\x02"])  # time of 3 octets
    invalid.send(request(codec.INFO_REQUEST, [b""]))  # valid, but from an invalid peer
    yield wait_until(lambda: catalog.drops.counts["invalid-peer"] == 1, what="drops")
    assert catalog.drops.counts["time-size"] == 1 and not invalid.messages
    assert catalog.drops.counts["unexpected"] == 2


@pytest_twisted.inlineCallbacks
def test_udp_heartbeats_fall_back_to_zeromq_and_come_back(
    make_catalog: CatalogMaker, stoppers: list[Any]
) -> Any:
    catalog = make_catalog()
    service = ServiceRegistration(catalog.endpoint, registration("pump", free_udp_port()))
    stoppers.append(service)
    service.startService()
    yield service.registered
    entry = catalog.core.entries["pump"]
    yield wait_until(
        lambda: catalog.udp_heartbeats >= 5 and service.last_catalog_udp > 0, what="UDP beats"
    )
    assert entry.path == "udp" and service.path == "udp" and catalog.heartbeats_sent_zmq == 0
    yield catalog.suspend_udp()  # UDP lost both ways
    yield wait_until(lambda: entry.path == "zmq" and service.path == "zmq", what="fallback")
    sent = service.sent_zmq
    yield wait_until(
        lambda: service.sent_zmq >= sent + 10 and catalog.heartbeats_sent_zmq >= 10,
        what="ZMQ beats",
    )
    assert entry.active  # alive through the fallback, well past liveness x interval
    catalog.resume_udp()
    yield wait_until(lambda: entry.path == "udp" and service.path == "udp", what="back to UDP")
    zmq_beats = service.sent_zmq
    sent_udp = service.sent_udp
    yield wait_until(lambda: service.sent_udp >= sent_udp + 5, what="UDP beats again")
    assert service.sent_zmq == zmq_beats  # no more ZeroMQ beats
    assert entry.active and catalog.core.counts["fallbacks"] == 1


@pytest_twisted.inlineCallbacks
def test_a_stall_of_the_process_is_not_taken_for_silence(
    make_catalog: CatalogMaker, stoppers: list[Any]
) -> Any:
    # Catalog and service in one process, both at 0.1 s: stalled for 1 s (SIGSTOP, a VM's
    # pause, a starved machine), the first ticks after it come late with the beats sent
    # before it waiting unread. The catalog neither falls back nor expires; the service
    # neither takes the catalog as gone nor beats over ZeroMQ.
    activity = Activity()
    catalog = make_catalog(activity=activity)
    service = ServiceRegistration(catalog.endpoint, registration("pump", free_udp_port()))
    stoppers.append(service)
    service.startService()
    yield service.registered
    yield wait_until(
        lambda: catalog.udp_heartbeats >= 5 and service.last_catalog_udp > 0, what="UDP beats"
    )
    for stall in range(1, 4):
        ticks = catalog.core.ticks + 5, service.ticks + 5
        reactor.callLater(0, time.sleep, 1.0)
        yield wait_until(
            lambda t=ticks: catalog.core.ticks >= t[0] and service.ticks >= t[1],
            what="five ticks after the stall",
        )
        # Each loop saw a late wake (and held it back) at every stall.
        assert catalog.core.wakes.held >= stall and service.wakes.held >= stall
    assert [t.rsplit("/", 2)[-2] for t in activity.topics()] == ["registered"]  # no expiry
    entry = catalog.core.entries["pump"]
    assert entry.active and entry.path == "udp" and service.path == "udp"
    assert catalog.core.counts.get("fallbacks", 0) == 0 and catalog.heartbeats_sent_zmq == 0
    assert service.reregistrations == 0 and service.sent_zmq == 0


@pytest_twisted.inlineCallbacks
def test_a_silent_service_expires_then_is_removed(
    make_catalog: CatalogMaker, stoppers: list[Any]
) -> Any:
    activity = Activity()
    catalog = make_catalog(activity=activity, grace=2.0)
    peer = RawPeer.dealer(catalog.endpoint)
    stoppers.append(peer)
    peer.send(request(codec.REGISTER, [codec.json_frame(registration("quiet", free_udp_port()))]))
    yield wait_until(
        lambda: "quiet" in catalog.core.entries and not catalog.core.entries["quiet"].active,
        what="expired",
    )
    client = CatalogClient(catalog.endpoint)
    stoppers.append(client)
    answer = yield client.services("quiet")
    assert answer["inactive"] == "quiet" and answer["state"] == "expired"
    assert (yield client.services()) == {}
    yield wait_until(lambda: "quiet" not in catalog.core.entries, what="removed after grace")
    assert [t.rsplit("/", 2)[-2] for t in activity.topics()] == ["registered", "expired", "removed"]


@pytest_twisted.inlineCallbacks
def test_registry_survives_a_restart_and_the_service_registers_again(
    make_catalog: CatalogMaker, stoppers: list[Any], tmp_path: Path
) -> Any:
    first = make_catalog(port=0)
    port = first.port
    service = ServiceRegistration(first.endpoint, registration("durable", free_udp_port()))
    stoppers.append(service)
    service.startService()
    yield service.registered
    yield first.stopService()
    second = make_catalog(port=port)
    assert second.restored == 1
    entry = second.core.entries["durable"]
    assert entry.info["function"] == "test"
    yield wait_until(
        lambda: service.reregistrations >= 1 and second.core.entries["durable"].identity,
        timeout=15,
        what="re-registration",
    )
    yield wait_until(
        lambda: second.core.entries["durable"].active and service.state == "registered"
    )
    assert service.registrations >= 2


@pytest_twisted.inlineCallbacks
def test_the_library_is_denied_and_updates(make_catalog: CatalogMaker, stoppers: list[Any]) -> Any:
    catalog = make_catalog(allow={"known": None})
    refused = ServiceRegistration(catalog.endpoint, registration("unknown", 0))
    stoppers.append(refused)
    refused.startService()
    with pytest.raises(Denied, match="not allowed"):
        yield refused.registered
    known = ServiceRegistration(catalog.endpoint, registration("known", free_udp_port()))
    stoppers.append(known)
    known.startService()
    yield known.registered
    yield known.update({"function": "renamed"})
    assert catalog.core.entries["known"].info["function"] == "renamed"
    with pytest.raises(Denied, match="port"):
        yield known.update({"port": "seven"})
    yield known.stopService()
    yield wait_until(lambda: "known" not in catalog.core.entries, what="DISCONNECT on stop")


@pytest_twisted.inlineCallbacks
def test_the_beacon_finds_the_catalog_and_dbp_cli_lists_services(
    make_catalog: CatalogMaker, stoppers: list[Any]
) -> Any:
    catalog = make_catalog()
    endpoint = yield find_catalog(beacon_port=catalog.config.beacon_port, timeout=5)
    assert endpoint == f"tcp://127.0.0.1:{catalog.port}"
    service = ServiceRegistration(endpoint, registration("listed", free_udp_port()))
    stoppers.append(service)
    service.startService()
    yield service.registered
    from twisted.internet import threads

    cli = Path(sys.executable).with_name("dbp-cli")
    run = yield threads.deferToThread(
        subprocess.run,
        [str(cli), "services", "--beacon-port", str(catalog.config.beacon_port)],
        capture_output=True, text=True, timeout=30,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    assert json.loads(run.stdout)["listed"]["function"] == "test"
    missing = yield threads.deferToThread(
        subprocess.run,
        [str(cli), "services", "nobody", "--catalog", endpoint],
        capture_output=True, text=True, timeout=30,
    )  # fmt: skip
    assert missing.returncode == 1 and json.loads(missing.stdout)["inactive"] == "nobody"


@pytest_twisted.inlineCallbacks
def test_the_library_registers_again_on_a_new_socket_after_disconnect() -> Any:
    """A raw ROUTER as the catalog: it approves, then says DISCONNECT; the service must
    register again, from a new socket (a new identity)."""
    from bus.transport.zmqsocket import SocketFactory, SocketOptions
    from bus.util.reactor import reactor_of

    factory = SocketFactory(reactor_of(None))
    received: list[list[bytes]] = []
    router = factory.socket(zmq.ROUTER, received.extend, SocketOptions(linger_ms=0))
    endpoint = router.bind("tcp://127.0.0.1:*")
    service = ServiceRegistration(endpoint, registration("phoenix", 0))
    try:
        service.startService()
        yield wait_until(lambda: received, what="UwU")
        first = received[0]
        assert codec.parse(first[1:]).command == codec.REGISTER
        router.send_frames([first[0], *codec.encode(codec.APPROVED, 0.0, [b"{}"])])
        yield service.registered
        router.send_frames([first[0], *codec.encode(codec.DISCONNECT, 0.0)])
        yield wait_until(lambda: len(received) >= 2, what="a second UwU")
        second = received[1]
        assert codec.parse(second[1:]).command == codec.REGISTER
        assert second[0] != first[0]  # a new socket
        assert service.reregistrations == 1 and service.state == "registering"
    finally:
        yield service.stopService()
        factory.shutdown()
