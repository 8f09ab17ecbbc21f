"""Hermes (lnestelroad/Hermes, the original DBP) as it really is, through real sockets on
127.0.0.1, and the catalog's bounds against strangers.

The fakes follow the wire facts of shared/specs/README.md: Hermes' Service registers with
``{"name", "interfaces": {"router": {"ip": "127.0.0.1", "port": 5246}}, "reg_time", "topics"}``
from a fresh REQ socket, closes it after ``OwO``, never heartbeats, and sends each later
request from another fresh socket; times are ``struct.pack('f', ...)`` (4 octets, native).
Hermes' catalog reads exactly 4 octets of time (its reactor dies on any other size)."""

from __future__ import annotations

import json
import socket
import struct
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import pytest_twisted
import zmq
from twisted.internet import threads
from twisted.logger import globalLogPublisher

from bus.dbp import codec
from bus.dbp.client import CatalogClient, ServiceRegistration
from bus.testing import RawPeer, wait_until
from tests.processes import START_BOUND, own_bound
from tests.test_dbp_server import (
    Activity,
    CatalogMaker,
    make_catalog,
    registration,
    request,
    stoppers,
)

__all__ = ["make_catalog", "stoppers"]

DBP_CLI = str(Path(sys.executable).with_name("dbp-cli"))
#: Hermes packs its times with the native float format.
HERMES_TIME = struct.Struct("f")


def hermes_registration(name: str) -> bytes:
    body = {
        "name": name,
        "interfaces": {"router": {"ip": "127.0.0.1", "port": 5246}},
        "reg_time": time.time(),
        "topics": None,
    }
    return json.dumps(body).encode()


@pytest_twisted.inlineCallbacks
def hermes_request(endpoint: str, command: bytes, body: bytes) -> Any:
    """What Hermes does for every request: a fresh REQ socket, one request, one reply,
    the socket closed. Returns the reply's frames (command, time, body...)."""
    peer = RawPeer(zmq.REQ, endpoint)
    try:
        peer.send([command, HERMES_TIME.pack(time.time()), body])
        yield wait_until(lambda: peer.messages, what=f"a reply to {command!r}")
        reply = peer.messages[0]
        # Hermes' Message.recv (seen at 66aca11) drops a reply of fewer than three frames
        # (command, time, body) as an invalid envelope and answers with an error.
        assert len(reply) >= 3, f"Hermes would drop {reply!r} as an invalid envelope"
        return reply
    finally:
        peer.close()


@pytest_twisted.inlineCallbacks
def test_a_hermes_service_registers_then_updates_from_another_connection(
    make_catalog: CatalogMaker,
) -> Any:
    catalog = make_catalog(hermes_services="keep")
    reply = yield hermes_request(catalog.endpoint, codec.REGISTER, hermes_registration("Rohan"))
    assert reply[0] == codec.APPROVED and len(reply[1]) == 4  # OwO, in its float32
    entry = catalog.core.entries["Rohan"]
    info = entry.info
    # The address is the connection's (Hermes always advertises 127.0.0.1), function and
    # heartbeat the documented defaults; what it sent is kept.
    assert (info["address"], info["port"], info["function"]) == ("127.0.0.1", 5246, "")
    assert info["heartbeat"] == catalog.config.hermes_heartbeat
    assert info["interfaces"] == {"router": {"ip": "127.0.0.1", "port": 5246}}
    assert entry.form == "hermes"
    assert entry.public()["heartbeat_path"] == "none"  # it never beats
    # Its update comes from a socket that never registered: accepted by name (keep mode).
    update = json.dumps({"name": "Rohan", "topics": ["weather"]}).encode()
    reply = yield hermes_request(catalog.endpoint, codec.UPDATE, update)
    # Command, time, body: Hermes' Message.recv drops a reply of fewer frames as invalid.
    assert reply[0] == codec.ACKNOWLEDGED and len(reply[1]) == 4 and reply[2:] == [b""]
    assert catalog.core.entries["Rohan"].info["topics"] == ["weather"]
    # A Hermes client's info requests, each from a fresh socket too.
    reply = yield hermes_request(catalog.endpoint, codec.INFO_REQUEST, b"")
    assert reply[0] == codec.INFO_REPLY and len(reply[1]) == 4
    listed = json.loads(reply[2])
    assert listed["Rohan"]["active"] is True and listed["Rohan"]["topics"] == ["weather"]
    reply = yield hermes_request(catalog.endpoint, codec.INFO_REQUEST, b"Mordor")
    assert "Error" in json.loads(reply[2])
    # Kept: never expired, never beaten (its service does not listen), well past liveness x
    # the catalog's interval.
    ticks = catalog.core.ticks
    yield wait_until(lambda: catalog.core.ticks >= ticks + 10, what="ticks")
    assert catalog.core.entries["Rohan"].active
    assert catalog.heartbeats_sent_udp == catalog.heartbeats_sent_zmq == 0
    # Until it unregisters: </3 with its name, from yet another fresh connection.
    peer = RawPeer(zmq.REQ, catalog.endpoint)
    try:
        peer.send([codec.DISCONNECT, HERMES_TIME.pack(time.time()), b"Rohan"])
        yield wait_until(lambda: "Rohan" not in catalog.core.entries, what="unregistered")
    finally:
        peer.close()


@pytest_twisted.inlineCallbacks
def test_by_default_a_hermes_service_expires_and_its_update_is_denied(
    make_catalog: CatalogMaker,
) -> Any:
    activity = Activity()
    catalog = make_catalog(activity=activity, hermes_heartbeat=0.2)
    reply = yield hermes_request(catalog.endpoint, codec.REGISTER, hermes_registration("Gondor"))
    assert reply[0] == codec.APPROVED
    update = json.dumps({"name": "Gondor", "topics": ["x"]}).encode()
    reply = yield hermes_request(catalog.endpoint, codec.UPDATE, update)
    assert reply[0] == codec.DENIED_ORIGINAL
    denial = reply[2].decode()
    # It is registered (from the connection Hermes closed): the denial says so, and how a
    # catalog takes Hermes' updates.
    assert "not registered" not in denial
    assert "'Gondor' is registered from another connection" in denial
    assert "--hermes-services keep" in denial
    # liveness (3) x its assumed heartbeat, then inactive for --grace.
    yield wait_until(lambda: not catalog.core.entries["Gondor"].active, what="expiry")
    assert activity.topics()[-1] == "/dbp/services/Gondor/expired/"


class FakeHermesCatalog:
    """A raw ROUTER that answers only what Hermes' catalog can read (4-octet times) and
    records every message; any other time size gets no answer (Hermes' reactor dies)."""

    def __init__(self, services: dict[str, Any]) -> None:
        from bus.transport.zmqsocket import SocketFactory, SocketOptions
        from bus.util.reactor import reactor_of

        self.services = services
        self.received: list[list[bytes]] = []
        self.factory = SocketFactory(reactor_of(None))
        self.router = self.factory.socket(zmq.ROUTER, self._on_messages, SocketOptions(linger_ms=0))
        self.endpoint = self.router.bind("tcp://127.0.0.1:*")

    def _on_messages(self, batch: list[list[bytes]]) -> None:
        for frames in batch:
            self.received.append(frames)
            identity, _, command, stamp, *body = frames
            if len(stamp) != 4:
                continue
            now = HERMES_TIME.pack(time.time())
            if command == codec.INFO_REQUEST:
                name = body[0].decode() if body else ""
                answer = self.services if not name else self.services.get(name, {"Error": name})
                self.router.send_frames(
                    [identity, b"", codec.INFO_REPLY, now, json.dumps(answer).encode()]
                )
            elif command == codec.REGISTER:
                self.router.send_frames([identity, b"", codec.APPROVED, now])

    def close(self) -> None:
        self.factory.shutdown()


@pytest.fixture
def hermes_catalog() -> Iterator[FakeHermesCatalog]:
    fake = FakeHermesCatalog({"Rohan": {"interfaces": {"router": {"ip": "127.0.0.1"}}}})
    yield fake
    fake.close()


def run_cli(*args: str) -> Any:
    timeout = START_BOUND + own_bound("dbp-cli", ["services", *args])  # its own, and its start
    return threads.deferToThread(
        subprocess.run,
        [DBP_CLI, "services", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
    )


@pytest_twisted.inlineCallbacks
def test_dbp_cli_speaks_hermes_to_its_catalog_and_the_spec_by_default(
    hermes_catalog: FakeHermesCatalog, make_catalog: CatalogMaker
) -> Any:
    fake = hermes_catalog
    run = yield run_cli("--dialect", "hermes", "--catalog", fake.endpoint, "--timeout", "10")
    assert run.returncode == 0, run.stderr
    assert json.loads(run.stdout) == fake.services
    [(_, delimiter, command, stamp, body)] = fake.received
    assert (delimiter, command, len(stamp), body) == (b"", codec.INFO_REQUEST, 4, b"")
    assert abs(HERMES_TIME.unpack(stamp)[0] - time.time()) < 600  # float32 precision
    # The options may come first, as a user types them.
    run = yield threads.deferToThread(
        subprocess.run,
        [DBP_CLI, "--dialect", "hermes", "--catalog", fake.endpoint, "services"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert run.returncode == 0, run.stderr
    assert json.loads(run.stdout) == fake.services
    assert len(fake.received[-1][3]) == 4
    # The default is the spec's 8-octet time: Hermes' catalog cannot answer it ...
    run = yield run_cli("--catalog", fake.endpoint, "--timeout", "1")
    assert run.returncode == 1 and "no answer" in run.stderr
    assert "--dialect hermes" in run.stderr  # the way out, named
    assert len(fake.received[-1][3]) == 8
    # ... and our catalog can. (Kept: a Hermes registration otherwise expires 30 s after it,
    # and the two commands below, each a process to start, may take longer than that on a
    # loaded machine: run_cli allows each START_BOUND.)
    catalog = make_catalog(hermes_services="keep")
    reply = yield hermes_request(catalog.endpoint, codec.REGISTER, hermes_registration("Rohan"))
    assert reply[0] == codec.APPROVED
    run = yield run_cli("Rohan", "--catalog", catalog.endpoint)
    assert run.returncode == 0, run.stderr
    assert json.loads(run.stdout)["Rohan"]["port"] == 5246
    run = yield run_cli("Rohan", "--catalog", catalog.endpoint, "--dialect", "hermes")
    assert run.returncode == 0, run.stderr


@pytest_twisted.inlineCallbacks
def test_the_libraries_hermes_dialect(
    hermes_catalog: FakeHermesCatalog, stoppers: list[Any]
) -> Any:
    fake = hermes_catalog
    service = ServiceRegistration(
        fake.endpoint,
        {"name": "Isengard", "address": "127.0.0.1", "port": 7300, "heartbeat": 0.1},
        dialect="hermes",
    )
    stoppers.append(service)
    service.startService()
    yield service.registered
    _, _, command, stamp, body = fake.received[0]
    assert (command, len(stamp)) == (codec.REGISTER, 4)
    sent = json.loads(body)
    assert sent["interfaces"] == {"router": {"ip": "127.0.0.1", "port": 7300}}
    assert sent["name"] == "Isengard" and "topics" in sent and "reg_time" in sent
    client = CatalogClient(fake.endpoint, dialect="hermes")
    stoppers.append(client)
    answer = yield client.services()
    assert answer == fake.services
    # Hermes' catalog answers heartbeats with an error frame: the library sends none.
    ticks = service.ticks
    yield wait_until(lambda: service.ticks >= ticks + 5, what="service ticks")
    assert [m[2] for m in fake.received] == [codec.REGISTER, codec.INFO_REQUEST]
    assert service.sent_udp == service.sent_zmq == 0


@pytest_twisted.inlineCallbacks
def test_a_flood_of_registrations_from_strangers_stays_bounded(
    make_catalog: CatalogMaker, stoppers: list[Any]
) -> Any:
    activity = Activity()
    catalog = make_catalog(activity=activity, max_services=10, grace=3600.0)
    failures: list[dict[str, Any]] = []
    observer = lambda event: failures.append(event) if "log_failure" in event else None  # noqa: E731
    globalLogPublisher.addObserver(observer)
    try:
        first = [RawPeer.dealer(catalog.endpoint) for _ in range(10)]
        stoppers.extend(first)
        for n, peer in enumerate(first):
            peer.send(request(codec.REGISTER, [codec.json_frame(registration(f"old-{n}", 0))]))
            # One at a time, so that the registration order (and the expiry order) is known.
            yield wait_until(lambda peer=peer: peer.messages, what=f"OwO {n}")
        # They never beat: expired (inactive, still listed for --grace) soon.
        yield wait_until(
            lambda: not any(e.active for e in catalog.core.entries.values()), what="expiry"
        )
        strangers = [RawPeer.dealer(catalog.endpoint) for _ in range(40)]
        stoppers.extend(strangers)
        for n, peer in enumerate(strangers):
            body = codec.json_frame(registration(f"new-{n}", 0, heartbeat=3600))
            peer.send(request(codec.REGISTER, [body]))
        yield wait_until(lambda: all(p.messages for p in strangers), what="40 answers")
        answers = [codec.parse(p.messages[0]).command for p in strangers]
        # The expired ones made room, oldest first; then the registry is full.
        assert answers.count(codec.APPROVED) == 10 and answers.count(codec.DENIED) == 30
        # (which ones: the first 10 to arrive; 40 sockets connect in no set order)
        approved = [f"new-{n}" for n, c in enumerate(answers) if c == codec.APPROVED]
        assert sorted(catalog.core.entries) == sorted(approved)
        removed = [t for t in activity.topics() if t.endswith("/removed/")]
        assert removed == [f"/dbp/services/old-{n}/removed/" for n in range(10)]
        assert catalog.drops.counts["registry-full"] == 30
        refused = next(
            m for m in (codec.parse(p.messages[0]) for p in strangers) if m.command == codec.DENIED
        )
        denied = codec.json_object(refused.body[0])["denied"]
        assert "full" in denied[0]
        assert len(catalog.core.by_identity) <= 10
        # UDP heartbeats for services nobody registered: counted, nothing created.
        sender = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        try:
            for burst in range(5):
                for n in range(100):
                    beat = codec.encode_udp_heartbeat(f"ghost-{burst}-{n}", time.time())
                    sender.sendto(beat, ("127.0.0.1", catalog.port))
                sender.sendto(b"\xff" * (burst + 1), ("127.0.0.1", catalog.port))
                want = (burst + 1) * 100
                yield wait_until(
                    lambda want=want: catalog.drops.counts["udp-unknown"] >= want,
                    what="UDP drops",
                )
        finally:
            sender.close()
        assert catalog.drops.counts["udp-unknown"] == 500
        assert catalog.drops.counts["udp-command"] == 5
        assert len(catalog.core.entries) == 10
    finally:
        globalLogPublisher.removeObserver(observer)
    assert failures == []  # never a traceback for a stranger's input


@pytest_twisted.inlineCallbacks
def test_an_update_of_a_service_registered_from_another_connection_says_so(
    make_catalog: CatalogMaker, stoppers: list[Any]
) -> Any:
    catalog = make_catalog()
    owner = RawPeer.dealer(catalog.endpoint)
    other = RawPeer.dealer(catalog.endpoint)
    stoppers.extend([owner, other])
    owner.send(request(codec.REGISTER, [codec.json_frame(registration("Isengard", 0))]))
    yield wait_until(lambda: owner.messages, what="OwO")
    assert codec.parse(owner.messages[0]).command == codec.APPROVED
    other.send(request(codec.UPDATE, [codec.json_frame({"name": "Isengard", "function": "x"})]))
    yield wait_until(lambda: other.messages, what="an answer to the update")
    answer = codec.parse(other.messages[0])
    assert answer.command == codec.DENIED
    [denial] = codec.json_object(answer.body[0])["denied"]
    assert denial == (
        "service 'Isengard' is registered from another connection: only that connection may"
        " update it"
    )


@pytest_twisted.inlineCallbacks
def test_a_udp_peer_is_logged_by_its_address(make_catalog: CatalogMaker) -> Any:
    catalog = make_catalog()
    warnings: list[str] = []

    def observer(event: dict[str, Any]) -> None:
        if "dropped" in str(event.get("log_format", "")):
            from twisted.logger import formatEvent

            warnings.append(formatEvent(event))

    globalLogPublisher.addObserver(observer)
    sender = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        beat = codec.encode_udp_heartbeat("ghost", time.time())
        sender.sendto(beat, ("127.0.0.1", catalog.port))
        yield wait_until(lambda: catalog.drops.counts["udp-unknown"] >= 1, what="the drop")
        yield wait_until(lambda: warnings, what="the drop's warning")
    finally:
        sender.close()
        globalLogPublisher.removeObserver(observer)
    [line] = warnings
    assert "UDP heartbeat for unknown service 'ghost'" in line
    assert line.endswith("; peer 127.0.0.1"), line
