"""The Event BUS over CURVE through real sockets: refused keys counted, rights per key
(publish and subscribe subtrees) from the allow-list's certificates, a re-read allow-list."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import pytest_twisted
import zmq

from bus.eventbus.codec import HEARTBEAT_TOPIC, SEQUENCE
from bus.testing import RawPeer, start_bus, wait_until
from bus.transport.certs import set_metadata, write_certificate
from bus.transport.curve import CurveKeyPair
from bus.transport.curve_settings import CurveSettings
from tests.curve_helpers import Keys
from tests.eventbus_helpers import pub


@pytest.fixture
def curve_bus(tmp_path: Path, keys: Keys, cleanup: list[Any]) -> Any:
    bus = start_bus(tmp_path / "bus", curve=keys.settings())
    cleanup.append(bus)
    return bus


def listed(bus: Any, count: int) -> Any:
    """Once the bus has re-read its allow-list with ``count`` keys: a key refused before
    would stay refused (libzmq does not reconnect after a refused handshake)."""
    return wait_until(lambda: bus.curve.zap.allowed_keys == count, what=f"{count} keys listed")


def events(peer: RawPeer) -> list[list[bytes]]:
    return [m for m in peer.messages if m[0] != HEARTBEAT_TOPIC]


@pytest_twisted.inlineCallbacks
def test_refused_keys_are_counted_and_never_reach_the_log(
    curve_bus: Any, keys: Keys, cleanup: list[Any]
) -> Any:
    collector = curve_bus.endpoints["collector"]
    known, other = keys.client("a"), keys.client("w")
    yield listed(curve_bus, 2)
    unknown = RawPeer.dealer(collector, curve=(keys.server.public, keys.client("u", False)))
    wrong_server = RawPeer.dealer(collector, curve=(CurveKeyPair.generate().public, other))
    plain = RawPeer.dealer(collector)
    cleanup += [unknown, wrong_server, plain]
    for peer in (unknown, wrong_server, plain):
        peer.send(pub("/orders/1/"))
    yield wait_until(
        lambda: (
            curve_bus.curve.refusals.get("unknown-key", 0) >= 1
            and curve_bus.curve.refusals.get("handshake", 0) >= 2
        ),
        what="an unknown key, a wrong server key and a plain-text peer refused",
    )
    allowed = RawPeer.dealer(collector, curve=(keys.server.public, known))
    cleanup.append(allowed)
    allowed.send(pub("/orders/2/"))
    yield wait_until(lambda: curve_bus.store.last_sequence == 1, what="the allowed key's event")
    assert [e.topic for e in curve_bus.store.read(0)] == [b"/orders/2/"]
    status = curve_bus.status()["curve"]
    assert status["security"] == "curve"
    assert status["server_public_key"] == keys.server.public.decode()
    assert status["refused"]["unknown-key"] >= 1
    families = {family.name: family for family in curve_bus.metrics()}
    refusals = {s.labels["reason"]: s.value for s in families["eventbus_curve_refusals"].samples}
    assert refusals["unknown-key"] >= 1 and refusals["handshake"] >= 2


@pytest_twisted.inlineCallbacks
def test_a_publisher_outside_its_subtrees_is_dropped_and_counted(
    curve_bus: Any, keys: Keys, cleanup: list[Any]
) -> Any:
    collector = curve_bus.endpoints["collector"]
    orders_key = keys.client("orders", publish="/orders/,/o2/")
    any_key = keys.client("any")
    yield listed(curve_bus, 2)
    orders = RawPeer.dealer(collector, curve=(keys.server.public, orders_key))
    anything = RawPeer.dealer(collector, curve=(keys.server.public, any_key))
    cleanup += [orders, anything]
    orders.send(pub("/orders/1/"))
    orders.send(pub("/billing/1/"))
    orders.send(pub("/o2/x/"))
    anything.send(pub("/billing/2/"))
    yield wait_until(
        lambda: (
            curve_bus.store.last_sequence == 3
            and curve_bus.core.drops.counts["forbidden-topic"] == 1
        ),
        what="three events stored, one dropped",
    )
    assert sorted(e.topic for e in curve_bus.store.read(0)) == [
        b"/billing/2/",
        b"/o2/x/",
        b"/orders/1/",
    ]


@pytest_twisted.inlineCallbacks
def test_a_subscriber_receives_only_its_subtrees_and_heartbeats(
    curve_bus: Any, keys: Keys, cleanup: list[Any]
) -> Any:
    reader = keys.client("reader", subscribe="/orders/")
    all_key, producer_key = keys.client("all"), keys.client("p")
    yield listed(curve_bus, 3)
    sub = RawPeer.sub(curve_bus.endpoints["publisher"], curve=(keys.server.public, reader))
    everyone = RawPeer.sub(curve_bus.endpoints["publisher"], curve=(keys.server.public, all_key))
    producer = RawPeer.dealer(
        curve_bus.endpoints["collector"], curve=(keys.server.public, producer_key)
    )
    cleanup += [sub, everyone, producer]
    yield wait_until(
        lambda: (
            any(m[0] == HEARTBEAT_TOPIC for m in sub.messages)
            and any(m[0] == HEARTBEAT_TOPIC for m in everyone.messages)
        ),
        what="both subscribed (heartbeats reach a narrowed subscriber)",
    )
    for topic in ("/orders/1/", "/billing/1/", "/orders/2/"):
        producer.send(pub(topic))
    yield wait_until(lambda: len(events(everyone)) == 3, what="all three broadcast")
    yield wait_until(lambda: len(events(sub)) == 2, what="the two /orders/ events")
    assert [m[0] for m in events(sub)] == [b"/orders/1/", b"/orders/2/"]
    assert curve_bus.core.narrowed_subscriptions >= 1


@pytest_twisted.inlineCallbacks
def test_a_snapshot_is_narrowed_to_the_keys_subtrees(
    curve_bus: Any, keys: Keys, cleanup: list[Any]
) -> Any:
    producer_key = keys.client("p")
    reader = keys.client("reader", subscribe="/orders/")
    yield listed(curve_bus, 2)
    producer = RawPeer.dealer(
        curve_bus.endpoints["collector"], curve=(keys.server.public, producer_key)
    )
    cleanup.append(producer)
    for topic in ("/orders/1/", "/billing/1/", "/orders/2/"):
        producer.send(pub(topic))
    yield wait_until(lambda: curve_bus.store.last_sequence == 3, what="stored")
    for spec, expected in ((b"", [b"/orders/1/", b"/orders/2/"]), (b"/billing/", [])):
        snap = RawPeer.dealer(curve_bus.endpoints["snapshot"], curve=(keys.server.public, reader))
        cleanup.append(snap)
        snap.send([b"SYNCSTART", spec, SEQUENCE.pack(0)])
        yield wait_until(
            lambda snap=snap: bool(snap.messages) and snap.messages[-1][0] == b"SYNCEND",
            what="SYNCEND",
        )
        assert [m[1] for m in snap.messages[:-1]] == expected
        assert snap.messages[-1][1] == spec  # the client's own spec, as it asked
    assert curve_bus.core.narrowed_snapshots == 2


@pytest_twisted.inlineCallbacks
def test_a_changed_allow_list_takes_effect_without_a_restart(
    curve_bus: Any, keys: Keys, cleanup: list[Any]
) -> Any:
    late = CurveKeyPair.generate()
    first = RawPeer.dealer(curve_bus.endpoints["collector"], curve=(keys.server.public, late))
    first.send(pub("/early/"))
    yield wait_until(
        lambda: curve_bus.curve.refusals.get("unknown-key", 0) >= 1, what="refused at first"
    )
    first.close()
    write_certificate(keys.allowed, "late", late.public, None, {"publish": "/late/"})
    yield listed(curve_bus, 1)
    second = RawPeer.dealer(curve_bus.endpoints["collector"], curve=(keys.server.public, late))
    cleanup.append(second)
    second.send(pub("/late/1/"))
    second.send(pub("/early/"))
    yield wait_until(
        lambda: curve_bus.core.drops.counts["forbidden-topic"] == 1, what="rights apply"
    )
    yield wait_until(lambda: curve_bus.store.last_sequence >= 1, what="stored")
    topics = [e.topic for e in curve_bus.store.read(0)]
    assert b"/late/1/" in topics
    assert b"/early/" not in topics


def test_client_certs_without_server_cert_is_a_usage_error() -> None:
    from twisted.python import usage

    from bus.eventbus.tap import Options

    options = Options()
    with pytest.raises(usage.UsageError, match="--client-certs needs --server-cert"):
        options.parseOptions(["--client-certs", "/nonexistent"])


def test_pub_sockets_stay_plain_pub_without_an_allow_list(
    tmp_path: Path, keys: Keys, cleanup: list[Any]
) -> None:
    bus = start_bus(tmp_path / "bus", curve=CurveSettings(keys.server_cert))
    cleanup.append(bus)
    assert bus.publisher_socket.socket.get(zmq.TYPE) == zmq.PUB
    assert bus.status()["curve"]["allow_list"] is None


@pytest_twisted.inlineCallbacks
def test_a_pair_over_curve_replicates_and_its_link_takes_only_the_peer(
    tmp_path: Path, keys: Keys, cleanup: list[Any]
) -> Any:
    from bus.eventbus.client import EventBusPublisher
    from bus.eventbus.config import PairConfig
    from tests.ports import free_port

    links = {"primary": free_port(), "backup": free_port()}
    client = keys.curve("client")
    servers = {}
    for role, other in (("primary", "backup"), ("backup", "primary")):
        config = PairConfig(
            role,  # type: ignore[arg-type]
            f"127.0.0.1:{links[other]}",
            port=links[role],
            failover_timeout=0.5,
            alone_timeout=0.5,
        )
        servers[role] = start_bus(
            tmp_path / role, pair=config, heartbeat_interval=0.1, curve=keys.settings()
        )
        cleanup.append(servers[role])
    primary, backup = servers["primary"], servers["backup"]
    yield listed(primary, 1)
    voter = RawPeer.dealer(primary.endpoints["snapshot"], curve=(keys.server.public, client.keys))
    cleanup.append(voter)
    voter.send([b"SYNCSTART", b"", SEQUENCE.pack(0)])
    yield wait_until(
        lambda: primary.pair.state == "active" and primary.pair.paired, what="the pair formed"
    )
    publisher = EventBusPublisher(f"127.0.0.1:{primary.port}", "curve-pair", curve=client)
    cleanup.append(publisher)
    publisher.publish("/orders/1/", {"n": 1})
    yield wait_until(lambda: backup.store.last_sequence == 1, what="replicated to the backup")
    # A key on the client allow-list is still not the other half.
    intruder = RawPeer.dealer(primary.pair.endpoint, curve=(keys.server.public, client.keys))
    cleanup.append(intruder)
    intruder.send([b"HELLO"])
    yield wait_until(lambda: primary.curve.refusals.get("not-peer", 0) >= 1, what="refused")


@pytest_twisted.inlineCallbacks
def test_publish_rights_are_checked_from_the_moment_a_certificate_names_them(
    curve_bus: Any, keys: Keys, cleanup: list[Any]
) -> Any:
    pair = keys.client("p")  # no rights written: every topic
    yield listed(curve_bus, 1)
    assert not curve_bus._publish_rights  # no certificate names publish: no lookup
    publisher = RawPeer.dealer(curve_bus.endpoints["collector"], curve=(keys.server.public, pair))
    cleanup.append(publisher)
    publisher.send(pub("/billing/1/"))
    yield wait_until(lambda: curve_bus.store.last_sequence == 1, what="the first event")
    set_metadata(keys.allowed / "p.key", {"publish": "/orders/"})  # as bus-keys set does
    yield wait_until(lambda: curve_bus._publish_rights, what="the allow-list re-read")
    assert curve_bus.collector_socket.keep_user_ids
    publisher.send(pub("/billing/2/"))
    publisher.send(pub("/orders/3/"))
    yield wait_until(lambda: curve_bus.store.last_sequence == 2, what="the allowed event")
    assert curve_bus.core.drops.counts["forbidden-topic"] == 1
    assert [e.topic for e in curve_bus.store.read(0)] == [b"/billing/1/", b"/orders/3/"]


@pytest_twisted.inlineCallbacks
def test_what_a_stop_drains_from_the_collector_is_checked_against_rights_too(
    curve_bus: Any, keys: Keys, cleanup: list[Any]
) -> Any:
    orders_key = keys.client("orders", publish="/orders/")
    yield listed(curve_bus, 1)
    yield wait_until(lambda: curve_bus._publish_rights)
    publisher = RawPeer.dealer(
        curve_bus.endpoints["collector"], curve=(keys.server.public, orders_key)
    )
    cleanup.append(publisher)
    publisher.send(pub("/orders/0/"))
    yield wait_until(lambda: curve_bus.store.last_sequence == 1, what="connected and heard")
    curve_bus.collector_socket.pause_reading()  # only the stop's drain reads from now on
    publisher.send(pub("/billing/1/"))
    publisher.send(pub("/orders/2/"))

    def drained() -> bool:
        curve_bus._drain_collector()
        return bool(curve_bus.store.last_sequence == 2)

    yield wait_until(drained, what="the drain read both")
    assert curve_bus.core.drops.counts["forbidden-topic"] == 1
    assert [e.topic for e in curve_bus.store.read(0)] == [b"/orders/0/", b"/orders/2/"]
