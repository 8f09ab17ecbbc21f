"""Event BUS front-ends of one JetStream stream (``--store jetstream``), against a real
nats-server: events published at either front-end are broadcast by both, under one
sequence space, in the same order; a snapshot at one front-end holds what was
published at the other; heartbeats carry the sequence and the stream's id; a resent
event (same uuid) is stored once; while the stream cannot store, the collector pauses
and nothing is broadcast, and everything collected is stored once it can."""

from __future__ import annotations

import signal
from pathlib import Path
from typing import Any

import pytest
import pytest_twisted

from bus.eventbus.codec import HEARTBEAT_TOPIC, SEQUENCE
from bus.eventbus.config import EventBusConfig, JetStreamSettings
from bus.nats.servers import NatsCluster
from bus.testing import RawPeer, wait_until
from tests.eventbus_helpers import pub

pytest.importorskip("nats")


def front_end(cluster: NatsCluster, data_dir: Path, **settings: Any) -> Any:
    from bus.eventbus.frontend import EventBusFrontEnd

    config = EventBusConfig(
        port=0, data_dir=data_dir, stats_interval=0, heartbeat_interval=0.2, **settings
    )
    stream = JetStreamSettings(tuple(cluster.urls), ack_timeout=1.0)
    return EventBusFrontEnd(config, stream)


def events(peer: RawPeer) -> list[list[bytes]]:
    return [m for m in peer.messages if m[0] != HEARTBEAT_TOPIC]


def seq(frame: bytes) -> int:
    return int(SEQUENCE.unpack(frame)[0])


@pytest_twisted.inlineCallbacks
def test_two_front_ends_broadcast_one_sequence_and_serve_each_others_events(
    nats_server: NatsCluster, tmp_path: Path, peers: list[Any]
) -> Any:
    one, two = front_end(nats_server, tmp_path / "a"), front_end(nats_server, tmp_path / "b")
    yield one.startService()
    yield two.startService()
    try:
        subs = [RawPeer.sub(fe.endpoints["publisher"]) for fe in (one, two)]
        producers = [RawPeer.dealer(fe.endpoints["collector"]) for fe in (one, two)]
        peers += [*subs, *producers]
        yield wait_until(
            lambda: all(any(m[0] == HEARTBEAT_TOPIC for m in s.messages) for s in subs),
            what="subscribed",
        )
        for i in range(40):
            producers[i % 2].send(pub(f"/from/{i % 2}/{i}/", {"i": i}))
        yield wait_until(lambda: all(len(events(s)) == 40 for s in subs), what="broadcasts")
        seen = [[(seq(m[1]), m[0], m[4]) for m in events(s)] for s in subs]
        assert seen[0] == seen[1]  # the same events, sequences and order at both
        assert [s for s, _, _ in seen[0]] == list(range(1, 41))
        assert sorted(t for _, t, _ in seen[0]) == sorted(
            f"/from/{i % 2}/{i}/".encode() for i in range(40)
        )
        # A publisher's own events keep their order.
        for side in (b"/from/0/", b"/from/1/"):
            mine = [int(t.split(b"/")[3]) for _, t, _ in seen[0] if t.startswith(side)]
            assert mine == sorted(mine)
        # The same uuid again, at the other front-end: stored once.
        again = pub("/again/", {"x": 1})
        producers[0].send(again)
        producers[1].send(again)
        producers[0].send(pub("/after/"))
        yield wait_until(lambda: any(m[0] == b"/after/" for m in events(subs[1])), what="after")
        assert [m[0] for m in events(subs[1])].count(b"/again/") == 1
        # A snapshot at one front-end of what was published at the other.
        snap = RawPeer.dealer(two.endpoints["snapshot"])
        peers.append(snap)
        snap.send([b"SYNCSTART", b"/from/0/", SEQUENCE.pack(10)])
        yield wait_until(lambda: snap.messages and snap.messages[-1][0] == b"SYNCEND")
        got = [(m[1], seq(m[2])) for m in snap.messages[:-1]]
        expected = [(t, s) for s, t, _ in seen[0] if t.startswith(b"/from/0/") and s > 10]
        assert got == expected and seq(snap.messages[-1][2]) == expected[-1][1]
        # Heartbeats: the sequence broadcast and the stream's id.
        beats = [m for m in subs[0].messages if m[0] == HEARTBEAT_TOPIC]
        yield wait_until(lambda: any(seq(m[1]) == 42 for m in subs[0].messages
                                     if m[0] == HEARTBEAT_TOPIC), what="a heartbeat at 42")  # fmt: skip
        beats = [m for m in subs[0].messages if m[0] == HEARTBEAT_TOPIC]
        assert beats[-1][2].decode() == one.store.store_id == two.store.store_id
        status = two.status()
        assert status["jetstream"]["connected"] is True and status["sequence"] == 42
    finally:
        yield one.stopService()
        yield two.stopService()


@pytest_twisted.inlineCallbacks
def test_while_the_stream_cannot_store_nothing_is_broadcast_and_all_is_stored_after(
    nats_server: NatsCluster, tmp_path: Path, peers: list[Any]
) -> Any:
    one = front_end(nats_server, tmp_path / "a", storage_retry_max=0.5)
    yield one.startService()
    try:
        sub = RawPeer.sub(one.endpoints["publisher"])
        producer = RawPeer.dealer(one.endpoints["collector"])
        peers += [sub, producer]
        yield wait_until(lambda: any(m[0] == HEARTBEAT_TOPIC for m in sub.messages))
        producer.send(pub("/before/"))
        yield wait_until(lambda: len(events(sub)) == 1, what="the first event")
        [node] = nats_server.nodes
        nats_server.kill(node, signal.SIGSTOP)  # the stream stops answering
        try:
            for i in range(30):
                producer.send(pub(f"/during/{i}/"))
            yield wait_until(lambda: one.core.refused, timeout=15, what="a refused append")
            assert one.collector_paused and len(events(sub)) == 1
        finally:
            nats_server.kill(node, signal.SIGCONT)
        yield wait_until(lambda: len(events(sub)) == 31, timeout=30, what="stored after")
        topics = [m[0] for m in events(sub)]
        assert topics == [b"/before/", *(f"/during/{i}/".encode() for i in range(30))]
        assert [seq(m[1]) for m in events(sub)] == list(range(1, 32))
        # The acknowledgement may come after the feed broadcast the events.
        yield wait_until(lambda: not one.collector_paused, what="the collector read again")
        assert one.core.refused_storage >= 1 and one.core.storage_error is None
    finally:
        yield one.stopService()
