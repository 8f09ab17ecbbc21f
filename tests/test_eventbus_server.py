"""The Event BUS server through real sockets: PUB -> store -> BROADCAST, SYNCSTART, dialects."""

from __future__ import annotations

import struct
from typing import Any

import pytest_twisted
from twisted.internet import reactor
from twisted.internet.task import deferLater

from bus.eventbus.codec import HEARTBEAT_TOPIC, SEQUENCE, SequenceEncoding
from bus.testing import RawPeer, start_bus, wait_until
from tests.eventbus_helpers import pub


def events_of(messages: list[list[bytes]]) -> list[list[bytes]]:
    return [m for m in messages if m[0] != HEARTBEAT_TOPIC]


def sequence(frame: bytes) -> int:
    return int(SEQUENCE.unpack(frame)[0])


def snapshot_ended(peer: RawPeer) -> bool:
    """The peer's last message is a SYNCEND: its snapshot is complete."""
    return bool(peer.messages) and peer.messages[-1][0] == b"SYNCEND"


@pytest_twisted.inlineCallbacks
def test_pub_is_stored_then_broadcast_with_strictly_incremental_sequences(
    bus_server: Any, peers: list[Any]
) -> Any:
    sub = RawPeer.sub(bus_server.endpoints["publisher"])
    producer = RawPeer.dealer(bus_server.endpoints["collector"])
    peers += [sub, producer]
    yield wait_until(lambda: any(m[0] == HEARTBEAT_TOPIC for m in sub.messages), what="subscribed")
    sent = [pub(f"/orders/{i}/", {"n": i}) for i in range(50)]
    for frames in sent:
        producer.send(frames)
    yield wait_until(lambda: len(events_of(sub.messages)) == 50)
    got = events_of(sub.messages)
    assert [sequence(m[1]) for m in got] == list(range(1, 51))
    for original, broadcast in zip(sent, got, strict=True):
        assert len(broadcast) == 6
        # topic, producer, timestamp, uuid and data exactly as sent
        assert broadcast[0] == original[0]
        assert broadcast[2:] == original[2:]
    assert bus_server.store.count() == 50
    assert bus_server.store.last_sequence == 50


@pytest_twisted.inlineCallbacks
def test_empty_subtree_and_original_comma_separator(bus_server: Any, peers: list[Any]) -> Any:
    producer = RawPeer.dealer(bus_server.endpoints["collector"])
    peers.append(producer)
    for topic in ["/x/", "/y/", "/z/"]:
        producer.send(pub(topic))
    yield wait_until(lambda: bus_server.store.last_sequence == 3)

    everything = RawPeer.dealer(bus_server.endpoints["snapshot"])
    comma = RawPeer.dealer(bus_server.endpoints["snapshot"])
    two_frames = RawPeer.dealer(bus_server.endpoints["snapshot"])
    peers += [everything, comma, two_frames]
    everything.send([b"SYNCSTART", b"", SEQUENCE.pack(0)])
    comma.send([b"SYNCSTART", b"/x/,/z/", b"0"])
    two_frames.send([b"SYNCSTART", b"/y/"])
    done = (everything, comma, two_frames)
    yield wait_until(lambda: all(snapshot_ended(p) for p in done))
    assert [m[1] for m in everything.messages[:-1]] == [b"/x/", b"/y/", b"/z/"]
    # A text sequence in the request is answered in text.
    assert [(m[1], m[2]) for m in comma.messages[:-1]] == [(b"/x/", b"1"), (b"/z/", b"3")]
    assert comma.messages[-1] == [b"SYNCEND", b"/x/,/z/", b"3"]
    assert [m[1] for m in two_frames.messages[:-1]] == [b"/y/"]


@pytest_twisted.inlineCallbacks
def test_syncend_current_reaches_the_wire(tmp_path: Any, peers: list[Any]) -> Any:
    # Both rules are in test_eventbus_snapshot_stream.py; here, that the option is used.
    server = start_bus(tmp_path, syncend="current")
    try:
        producer = RawPeer.dealer(server.endpoints["collector"])
        snap = RawPeer.dealer(server.endpoints["snapshot"])
        peers += [producer, snap]
        for topic in ["/a/", "/b/", "/b/"]:
            producer.send(pub(topic))
        yield wait_until(lambda: server.store.last_sequence == 3)
        snap.send([b"SYNCSTART", b"/a/", SEQUENCE.pack(0)])
        yield wait_until(lambda: snapshot_ended(snap))
        assert sequence(snap.messages[-1][2]) == 3  # the bus's, not the highest SYNC (1)
    finally:
        yield server.stopService()


@pytest_twisted.inlineCallbacks
def test_original_dialect_text_sequences_null_and_one_shot_publishers(
    tmp_path: Any, peers: list[Any]
) -> Any:
    server = start_bus(tmp_path, sequence_encoding=SequenceEncoding.TEXT)
    try:
        sub = RawPeer.sub(server.endpoints["publisher"], (b"/node/",))
        peers.append(sub)
        # Subscriptions propagate asynchronously: publish until the SUB sees events.
        # The original publisher opens a new DEALER for every event and sends "null".
        i = 0
        while len(events_of(sub.messages)) < 3:
            one_shot = RawPeer.dealer(server.endpoints["collector"])
            peers.append(one_shot)
            one_shot.send(pub(f"/node/{i}/", {"i": i}, sequence=b"null"))
            i += 1
            yield deferLater(reactor, 0.02, lambda: None)
            assert i < 500, "subscriber never received"
        yield wait_until(lambda: server.store.last_sequence == i)
        got = events_of(sub.messages)
        numbers = [int(m[1]) for m in got]
        assert all(m[1].isdigit() for m in got)
        assert numbers == list(range(numbers[0], numbers[0] + len(numbers)))
        assert server.drops.total == 0
    finally:
        yield server.stopService()


@pytest_twisted.inlineCallbacks
def test_heartbeat_carries_current_sequence(bus_server: Any, peers: list[Any]) -> Any:
    sub = RawPeer.sub(bus_server.endpoints["publisher"], (HEARTBEAT_TOPIC,))
    producer = RawPeer.dealer(bus_server.endpoints["collector"])
    peers += [sub, producer]
    for i in range(3):
        producer.send(pub(f"/t/{i}/"))
    yield wait_until(lambda: bus_server.store.last_sequence == 3)
    yield wait_until(lambda: any(sequence(m[1]) == 3 for m in sub.messages))
    beat = next(m for m in sub.messages if sequence(m[1]) == 3)
    assert beat[0] == HEARTBEAT_TOPIC
    assert beat[2].decode() == bus_server.store.store_id
    assert all(m[0] == HEARTBEAT_TOPIC for m in sub.messages)  # prefix subscription respected


@pytest_twisted.inlineCallbacks
def test_bad_input_on_both_ports_is_counted_dropped_and_the_server_goes_on(
    bus_server: Any, peers: list[Any]
) -> Any:
    # Every PUB a codec refuses, by reason, is in test_eventbus_core.py; here, the ports.
    producer = RawPeer.dealer(bus_server.endpoints["collector"])
    snap = RawPeer.dealer(bus_server.endpoints["snapshot"])
    peers += [producer, snap]
    good = pub("/ok/")
    producer.send(good[:3])
    producer.send([*good[:5], b"\xc1"])
    snap.send([b"HELLO"])
    snap.send([b"SYNCSTART", b"/", b"\x00\x01"])
    producer.send(good)
    yield wait_until(lambda: bus_server.store.last_sequence == 1)
    yield wait_until(lambda: bus_server.drops.total == 4)
    counts = bus_server.drops.counts
    assert counts["frame-count"] == 1 and counts["bad-payload"] == 1
    assert counts["unknown-command"] == 1 and bus_server.store.count() == 1
    snap.send([b"SYNCSTART", b"", struct.pack(">Q", 0)])
    yield wait_until(lambda: snapshot_ended(snap))
    assert [m[1] for m in snap.messages if m[0] == b"SYNC"] == [b"/ok/"]


@pytest_twisted.inlineCallbacks
def test_sequence_survives_restart_and_retention(tmp_path: Any, peers: list[Any]) -> Any:
    from bus.eventbus.store import Retention

    server = start_bus(tmp_path, retention=Retention(max_count=2), retention_interval=0.05)
    producer = RawPeer.dealer(server.endpoints["collector"])
    peers.append(producer)
    for i in range(5):
        producer.send(pub(f"/r/{i}/"))
    yield wait_until(lambda: server.store.last_sequence == 5 and server.store.count() == 2)
    yield server.stopService()
    producer.close()

    server = start_bus(tmp_path)
    try:
        assert server.store.last_sequence == 5
        producer = RawPeer.dealer(server.endpoints["collector"])
        snap = RawPeer.dealer(server.endpoints["snapshot"])
        peers += [producer, snap]
        producer.send(pub("/r/after/"))
        yield wait_until(lambda: server.store.last_sequence == 6)
        snap.send([b"SYNCSTART", b"", SEQUENCE.pack(0)])
        yield wait_until(lambda: snapshot_ended(snap))
        assert [sequence(m[2]) for m in snap.messages[:-1]] == [4, 5, 6]
    finally:
        yield server.stopService()


@pytest_twisted.inlineCallbacks
def test_latest_per_topic_and_max_age_retention(tmp_path: Any, peers: list[Any]) -> Any:
    from bus.eventbus.store import Retention

    now = [1000.0]
    from bus.eventbus.config import EventBusConfig
    from bus.eventbus.server import EventBusService

    server = EventBusService(
        EventBusConfig(
            port=0,
            data_dir=tmp_path,
            stats_interval=0,
            retention=Retention(latest_per_topic=True, max_age=100),
            retention_interval=0.05,
        ),
        clock=lambda: now[0],
    )
    server.startService()
    try:
        producer = RawPeer.dealer(server.endpoints["collector"])
        peers.append(producer)
        for topic in ["/k/a/", "/k/b/", "/k/a/", "/k/a/", "/k/b/"]:
            producer.send(pub(topic))
        yield wait_until(lambda: server.store.last_sequence == 5)
        yield wait_until(lambda: server.store.count() == 2)
        assert [e.sequence for e in server.store.read(0)] == [4, 5]
        now[0] += 101  # both are now older than max_age
        producer.send(pub("/k/c/"))
        yield wait_until(lambda: [e.sequence for e in server.store.read(0)] == [6])
        assert server.store.last_sequence == 6
    finally:
        yield server.stopService()


@pytest_twisted.inlineCallbacks
def test_snapshot_to_a_slow_client_never_drops(tmp_path: Any, peers: list[Any]) -> Any:
    server = start_bus(tmp_path, snapshot_hwm=5, snapshot_chunk=50)
    try:
        producer = RawPeer.dealer(server.endpoints["collector"])
        peers.append(producer)
        for i in range(3000):
            producer.send(pub(f"/slow/{i % 7}/", {"i": i}))
        yield wait_until(lambda: server.store.last_sequence == 3000)
        # A receive HWM of 5 on the client, and a tiny send HWM on the server: the server
        # must wait for the client rather than drop.
        snap = RawPeer.dealer(server.endpoints["snapshot"], receive_hwm=5)
        peers.append(snap)
        snap.send([b"SYNCSTART", b"", SEQUENCE.pack(0)])
        yield wait_until(lambda: snapshot_ended(snap), timeout=30)
        assert [sequence(m[2]) for m in snap.messages[:-1]] == list(range(1, 3001))
        assert server.snapshots_served == 1
    finally:
        yield server.stopService()
