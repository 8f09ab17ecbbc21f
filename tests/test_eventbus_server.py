"""The Event BUS server through real sockets: the frames a client sees, one test per wire
behaviour (PUB -> store -> BROADCAST, SYNCSTART -> SYNC... SYNCEND, the heartbeat, the
original dialect, the sequence across a restart) and the retention pass the service runs.

The rules behind them are tested without sockets: what is stored, dropped and broadcast in
test_eventbus_core.py, one snapshot's answer in test_eventbus_snapshot_stream.py, streams
of slow and stuck clients in test_eventbus_snapshots.py, retention in
test_eventbus_store.py. Bad input on both ports, through sockets, is fuzzed in
test_eventbus_fuzz.py.
"""

from __future__ import annotations

from typing import Any

import pytest
import pytest_twisted

from bus.eventbus.codec import HEARTBEAT_TOPIC, SEQUENCE, SYNCSTART, SequenceEncoding
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
def publish_then_snapshot(server: Any, peers: list[Any], topic: str, stored: int) -> Any:
    """Publish one event on ``topic``, wait until the log's last sequence is ``stored``, then
    take a snapshot from 0: its events' ``(topic, sequence)``."""
    producer = RawPeer.dealer(server.endpoints["collector"])
    snap = RawPeer.dealer(server.endpoints["snapshot"])
    peers += [producer, snap]
    producer.send(pub(topic))
    yield wait_until(lambda: server.store.last_sequence == stored)
    snap.send([b"SYNCSTART", b"", SEQUENCE.pack(0)])
    yield wait_until(lambda: snapshot_ended(snap))
    return [(m[1], sequence(m[2])) for m in snap.messages[:-1]]


def clocked_bus(data_dir: Any, retention: Any, now: list[float]) -> Any:
    """A started server on free ports whose clock is ``now[0]`` (received times, retention's
    cutoffs), running ``retention`` every 0.05 s."""
    from bus.eventbus.config import EventBusConfig
    from bus.eventbus.server import EventBusService

    config = EventBusConfig(
        port=0,
        data_dir=data_dir,
        stats_interval=0,
        retention=retention,
        retention_interval=0.05,
    )
    server = EventBusService(config, clock=lambda: now[0])
    server.startService()
    return server


def subscribed(sub: RawPeer) -> Any:
    """A heartbeat arrived: the SUB's subscriptions (sent before its heartbeat one) are in place."""
    return wait_until(lambda: any(m[0] == HEARTBEAT_TOPIC for m in sub.messages), what="subscribed")


@pytest_twisted.inlineCallbacks
def test_pub_is_stored_then_broadcast_with_strictly_incremental_sequences(
    bus_server: Any, peers: list[Any]
) -> Any:
    sub = RawPeer.sub(bus_server.endpoints["publisher"])
    producer = RawPeer.dealer(bus_server.endpoints["collector"])
    peers += [sub, producer]
    yield subscribed(sub)
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
def test_syncstart_is_answered_with_sync_frames_then_a_syncend(
    tmp_path: Any, peers: list[Any]
) -> Any:
    # syncend="current": the option reaches the wire (both rules: test_eventbus_snapshot_stream.py).
    server = start_bus(tmp_path, syncend="current")
    try:
        producer = RawPeer.dealer(server.endpoints["collector"])
        binary = RawPeer.dealer(server.endpoints["snapshot"])
        text = RawPeer.dealer(server.endpoints["snapshot"])
        peers += [producer, binary, text]
        x, y, z = sent = [pub("/x/"), pub("/y/"), pub("/z/")]
        for frames in sent:
            producer.send(frames)
        yield wait_until(lambda: server.store.last_sequence == 3)
        binary.send([SYNCSTART, b"/x/", SEQUENCE.pack(0)])
        text.send([SYNCSTART, b"/x/,/z/", b"0"])  # the original's comma and text sequence
        yield wait_until(lambda: snapshot_ended(binary) and snapshot_ended(text))
        assert binary.messages == [
            [b"SYNC", x[0], SEQUENCE.pack(1), *x[2:]],
            [b"SYNCEND", b"/x/", SEQUENCE.pack(3)],  # the bus's sequence, not the highest SYNC
        ]
        assert text.messages == [
            [b"SYNC", x[0], b"1", *x[2:]],
            [b"SYNC", z[0], b"3", *z[2:]],
            [b"SYNCEND", b"/x/,/z/", b"3"],
        ]
        assert y[0] not in {m[1] for m in binary.messages + text.messages}
    finally:
        yield server.stopService()


@pytest_twisted.inlineCallbacks
def test_original_dialect_text_sequences_null_and_one_shot_publishers(
    tmp_path: Any, peers: list[Any]
) -> Any:
    server = start_bus(tmp_path, sequence_encoding=SequenceEncoding.TEXT)
    try:
        sub = RawPeer.sub(server.endpoints["publisher"], (b"/node/", HEARTBEAT_TOPIC))
        peers.append(sub)
        yield subscribed(sub)
        # The original publisher opens a new DEALER for every event and sends "null".
        for i in range(3):
            one_shot = RawPeer.dealer(server.endpoints["collector"])
            peers.append(one_shot)
            one_shot.send(pub(f"/node/{i}/", {"i": i}, sequence=b"null"))
        yield wait_until(lambda: len(events_of(sub.messages)) == 3)
        got = events_of(sub.messages)
        assert [m[1] for m in got] == [b"1", b"2", b"3"]
        assert sorted(m[0] for m in got) == [b"/node/0/", b"/node/1/", b"/node/2/"]
        assert all(m[1].isdigit() for m in sub.messages if m[0] == HEARTBEAT_TOPIC)
        assert server.core.drops.total == 0
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
        held = yield publish_then_snapshot(server, peers, "/r/after/", 6)
        assert [sequence for _, sequence in held] == [4, 5, 6]
    finally:
        yield server.stopService()


@pytest_twisted.inlineCallbacks
def test_the_retention_pass_applies_latest_per_topic_and_max_age_by_the_service_clock(
    tmp_path: Any, peers: list[Any]
) -> Any:
    # Which events each option keeps is in test_eventbus_store.py; the pass that applies
    # the options on the service's timer, with its clock, lives in the service.
    from bus.eventbus.store import Retention

    now = [1000.0]
    server = clocked_bus(tmp_path, Retention(latest_per_topic=True, max_age=100), now)
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


@pytest.mark.parametrize("mode", ["count", "age"])
@pytest_twisted.inlineCallbacks
def test_count_and_age_retention_whose_steps_stop_after_each_part_keep_exactly_their_events(
    tmp_path: Any, peers: list[Any], monkeypatch: pytest.MonkeyPatch, mode: str
) -> Any:
    """Every step's budget spent at once: each age or count step deletes one part (128
    events or so, whole batches where it can) and stops, the next goes on. After three rounds
    of 600 events, 30 s apart by the service's clock, a snapshot through the snapshot port
    holds exactly the newest 700 (count) or the last two rounds (age, 75 s), each as sent."""
    import msgpack

    import bus.eventbus.store as store_module
    from bus.eventbus.store import Retention

    monkeypatch.setattr(store_module, "STEP_BUDGET", 0.0)
    now = [1000.0]
    retention = Retention(max_count=700) if mode == "count" else Retention(max_age=75.0)
    server = clocked_bus(tmp_path, retention, now)
    try:
        producer = RawPeer.dealer(server.endpoints["collector"])
        peers.append(producer)
        for stored in (600, 1200, 1800):
            for n in range(stored - 600, stored):
                producer.send(pub(f"/parts/{n % 7}/", {"n": n}))
            yield wait_until(lambda stored=stored: server.store.last_sequence == stored)
            now[0] += 30.0
        kept = range(1101, 1801) if mode == "count" else range(601, 1801)
        yield wait_until(lambda: server.store.count() == len(kept), what="retention")
        snap = RawPeer.dealer(server.endpoints["snapshot"])
        peers.append(snap)
        snap.send([b"SYNCSTART", b"", SEQUENCE.pack(0)])
        yield wait_until(lambda: snapshot_ended(snap))
        syncs = snap.messages[:-1]
        assert [sequence(m[2]) for m in syncs] == list(kept)
        assert [msgpack.unpackb(m[6])["n"] for m in syncs] == [s - 1 for s in kept]
        assert [m[1] for m in syncs] == [b"/parts/%d/" % ((s - 1) % 7) for s in kept]
        assert server.store.last_sequence == 1800
    finally:
        yield server.stopService()


@pytest_twisted.inlineCallbacks
def test_a_log_of_the_previous_release_is_served_after_its_move_to_batches(
    tmp_path: Any, peers: list[Any]
) -> Any:
    from twisted.logger import globalLogPublisher

    from tests.test_eventbus_store import old_release_log

    old_release_log(tmp_path / "events.sqlite3", [(1, b"/old/a/", 1.0), (3, b"/old/b/", 1.0)], 3)
    lines: list[str] = []

    def observe(event: dict[str, Any]) -> None:
        if "moved" in str(event.get("log_format", "")):
            lines.append(str(event.get("count")))

    globalLogPublisher.addObserver(observe)
    try:
        server = start_bus(tmp_path)
    finally:
        globalLogPublisher.removeObserver(observe)
    try:
        assert lines == ["2"]
        held = yield publish_then_snapshot(server, peers, "/new/", 4)
        assert held == [
            (b"/old/a/", 1),
            (b"/old/b/", 3),
            (b"/new/", 4),
        ]
    finally:
        yield server.stopService()


@pytest_twisted.inlineCallbacks
def test_a_snapshot_of_a_subtree_few_events_match_reads_the_log_a_bound_at_a_time(
    tmp_path: Any, peers: list[Any]
) -> Any:
    from bus.eventbus.store import SCAN_EVENTS, EventStore

    store = EventStore(tmp_path)
    total = SCAN_EVENTS * 3
    for start in range(0, total, 500):
        store.append_fields(
            [(b"/rare/" if i % 5000 == 1 else b"/common/", b"p", b"ts", b"u%d" % i, b"d")
             for i in range(start, start + 500)],
            1.0,
        )  # fmt: skip
    store.close()
    server = start_bus(tmp_path)
    try:
        turns: list[int] = []
        snap = RawPeer.dealer(server.endpoints["snapshot"])
        peers.append(snap)
        original = server.snapshots._run

        def counted() -> None:
            turns.append(1)
            original()

        server.snapshots._run = counted
        snap.send([b"SYNCSTART", b"/rare/", SEQUENCE.pack(0)])
        yield wait_until(lambda: snapshot_ended(snap))
        assert [sequence(m[2]) for m in snap.messages[:-1]] == [
            i + 1 for i in range(total) if i % 5000 == 1
        ]
        assert snap.messages[-1][0] == b"SYNCEND"
        assert len(turns) >= 3  # a bound of the log a turn, not the whole of it in one
    finally:
        yield server.stopService()
