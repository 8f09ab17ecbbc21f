"""Snapshot limits through real sockets: clients that stop reading, caps, the queue.

A "stuck" client here is a raw DEALER that asked for a snapshot and stopped reading:
its ZeroMQ receive queue (5 messages), both kernel socket buffers and the server's pipe
fill up, then the server's stream cannot send. The events are 32 KiB each so that a
few hundred of them are more than the buffers hold.
"""

from __future__ import annotations

from typing import Any

import pytest_twisted

from bus.eventbus.codec import SEQUENCE
from bus.eventbus.snapshots import KEEP_WHEN_BLOCKED
from bus.testing import RawPeer, start_bus, wait_until
from tests.eventbus_helpers import pub

BIG = 32 * 1024
EVENTS = 600


def sequences(messages: list[list[bytes]]) -> list[int]:
    return [int(SEQUENCE.unpack(m[2])[0]) for m in messages if m[0] == b"SYNC"]


def syncends(peer: RawPeer) -> list[list[bytes]]:
    return [m for m in peer.messages if m[0] == b"SYNCEND"]


def syncstart(peer: RawPeer, since: int = 0) -> None:
    peer.send([b"SYNCSTART", b"", SEQUENCE.pack(since)])


def fill(server: Any, peers: list[Any], count: int = EVENTS, size: int = BIG) -> Any:
    producer = RawPeer.dealer(server.endpoints["collector"])
    peers.append(producer)
    pad = b"x" * size
    for i in range(count):
        producer.send(pub(f"/big/{i % 5}/", {"i": i, "pad": pad}))
    return wait_until(lambda: server.store.last_sequence == count, timeout=30)


def stuck_client(server: Any, peers: list[Any]) -> RawPeer:
    """A DEALER that asks for everything, then never reads."""
    peer = RawPeer.dealer(server.endpoints["snapshot"], receive_hwm=5)
    peers.append(peer)
    peer.socket.pause_reading()
    syncstart(peer)
    return peer


def healthy_client(server: Any, peers: list[Any]) -> RawPeer:
    peer = RawPeer.dealer(server.endpoints["snapshot"])
    peers.append(peer)
    syncstart(peer)
    return peer


def blocked(server: Any, count: int) -> bool:
    """``count`` streams are waiting for their clients and hold little prepared data."""
    streams = list(server.streams)
    return len(streams) == count and all(
        s.delay > 0.1 and s.prepared <= KEEP_WHEN_BLOCKED for s in streams
    )


@pytest_twisted.inlineCallbacks
def test_stuck_clients_are_abandoned_after_the_stall_timeout(
    tmp_path: Any, peers: list[Any]
) -> Any:
    server = start_bus(tmp_path, snapshot_hwm=5, snapshot_stall_timeout=1.5)
    try:
        yield fill(server, peers)
        stuck = [stuck_client(server, peers) for _ in range(3)]
        # While they are stuck, each stream backs off and keeps only a few messages ready.
        yield wait_until(lambda: blocked(server, 3), timeout=20, what="streams to block")
        assert server.status()["snapshots_stalled"] == 0
        yield wait_until(lambda: server.snapshots.stalled == 3, timeout=20)
        status = server.status()
        assert status["snapshots_active"] == 0
        assert status["snapshots_stalled"] == 3
        assert status["snapshots_served"] == 0
        # Reading again, a client gets what was already queued for it (a prefix, no
        # SYNCEND) and, asking again, the whole snapshot.
        for peer in stuck:
            peer.socket.resume_reading()
            syncstart(peer)
        yield wait_until(lambda: all(syncends(p) for p in stuck), timeout=30)
        for peer in stuck:
            assert len(syncends(peer)) == 1
            assert peer.messages[-1][0] == b"SYNCEND"
            got = sequences(peer.messages)
            leftover = got[: len(got) - EVENTS]
            assert 0 < len(leftover) < EVENTS
            assert leftover == list(range(1, len(leftover) + 1))
            assert got[len(leftover) :] == list(range(1, EVENTS + 1))
        assert server.snapshots.served == 3
    finally:
        yield server.stopService()


@pytest_twisted.inlineCallbacks
def test_a_healthy_client_gets_its_snapshot_while_stuck_clients_wait(
    tmp_path: Any, peers: list[Any]
) -> Any:
    server = start_bus(tmp_path, snapshot_hwm=5, snapshot_stall_timeout=600)
    try:
        yield fill(server, peers)
        for _ in range(8):
            stuck_client(server, peers)
        yield wait_until(lambda: blocked(server, 8), timeout=30, what="streams to block")
        healthy = healthy_client(server, peers)
        yield wait_until(lambda: syncends(healthy), timeout=30)
        assert sequences(healthy.messages) == list(range(1, EVENTS + 1))
        assert healthy.messages[-1] == [b"SYNCEND", b"", SEQUENCE.pack(EVENTS)]
        assert server.snapshots.served == 1
        assert len(server.streams) == 8  # the stuck ones still wait, not abandoned
    finally:
        yield server.stopService()


@pytest_twisted.inlineCallbacks
def test_beyond_the_cap_requests_wait_then_are_refused_without_a_syncend(
    tmp_path: Any, peers: list[Any]
) -> Any:
    server = start_bus(
        tmp_path, snapshot_hwm=5, max_snapshots=2, snapshot_queue=1, snapshot_stall_timeout=600
    )
    try:
        yield fill(server, peers)
        first = stuck_client(server, peers)
        stuck_client(server, peers)
        yield wait_until(lambda: len(server.streams) == 2)
        waiting = healthy_client(server, peers)
        yield wait_until(lambda: server.snapshots.queued == 1)
        refused = healthy_client(server, peers)
        yield wait_until(lambda: server.snapshots.refused == 1)
        status = server.status()
        assert (status["snapshots_active"], status["snapshots_waiting"]) == (2, 1)
        assert (status["snapshots_queued"], status["snapshots_refused"]) == (1, 1)
        # A stuck client leaves: its stream ends, the waiting request takes its place.
        first.close()
        peers.remove(first)
        yield wait_until(lambda: syncends(waiting), timeout=30)
        assert sequences(waiting.messages) == list(range(1, EVENTS + 1))
        assert server.snapshots.aborted == 1
        assert server.status()["snapshots_waiting"] == 0
        # The refused one was never answered: no SYNCEND telling it it has everything.
        assert refused.messages == []
    finally:
        yield server.stopService()


@pytest_twisted.inlineCallbacks
def test_one_client_identity_runs_its_snapshots_one_after_the_other(
    tmp_path: Any, peers: list[Any]
) -> Any:
    server = start_bus(tmp_path, snapshot_chunk=20, max_snapshots_per_client=1)
    try:
        yield fill(server, peers, count=300, size=10)
        peer = RawPeer.dealer(server.endpoints["snapshot"])
        peers.append(peer)
        syncstart(peer)
        syncstart(peer, since=100)
        yield wait_until(lambda: len(syncends(peer)) == 2, timeout=30)
        # Not interleaved: all of the first answer, then all of the second.
        assert sequences(peer.messages) == list(range(1, 301)) + list(range(101, 301))
        assert peer.messages[300][0] == b"SYNCEND"
        assert server.snapshots.queued == 1
        assert server.snapshots.served == 2
    finally:
        yield server.stopService()


@pytest_twisted.inlineCallbacks
def test_the_subscriber_asks_again_until_a_refused_snapshot_is_served(
    tmp_path: Any, peers: list[Any]
) -> Any:
    from bus.eventbus.client import EventBusSubscriber

    server = start_bus(
        tmp_path, snapshot_hwm=5, max_snapshots=1, snapshot_queue=0, snapshot_stall_timeout=1.0
    )
    subscriber = None
    try:
        yield fill(server, peers, count=300)
        stuck_client(server, peers)  # holds the only slot until it is abandoned
        yield wait_until(lambda: len(server.streams) == 1)
        delivered: list[int] = []
        subscriber = EventBusSubscriber(
            [f"127.0.0.1:{server.port}"],
            on_event=lambda event: delivered.append(event.sequence),
            heartbeat_timeout=0.3,
        )
        retries: list[int] = []
        subscriber.startService()
        yield wait_until(lambda: server.snapshots.refused >= 1)
        yield wait_until(
            lambda: retries.append(subscriber.core.snapshot_retries) or delivered[-1:] == [300],
            timeout=30,
        )
        assert delivered == list(range(1, 301))
        assert server.snapshots.stalled == 1
        assert max(retries) >= 1  # it had to ask again
        assert subscriber.core.snapshot_retries == 0  # and the answer reset the backoff
        assert subscriber.core.stats.snapshots >= 2
    finally:
        if subscriber is not None:
            yield subscriber.stopService()
        yield server.stopService()


@pytest_twisted.inlineCallbacks
def test_a_request_waiting_for_its_own_identity_does_not_hold_up_others(
    tmp_path: Any, peers: list[Any]
) -> Any:
    server = start_bus(
        tmp_path, snapshot_hwm=5, max_snapshots_per_client=1, snapshot_stall_timeout=600
    )
    try:
        yield fill(server, peers)
        stuck = RawPeer.dealer(server.endpoints["snapshot"], receive_hwm=5, identity=b"stuck")
        peers.append(stuck)
        stuck.socket.pause_reading()
        syncstart(stuck)
        syncstart(stuck, since=10)  # waits: this identity already has its one stream
        yield wait_until(lambda: server.snapshots.queued == 1)
        other = healthy_client(server, peers)
        yield wait_until(lambda: syncends(other), timeout=30)
        assert sequences(other.messages) == list(range(1, EVENTS + 1))
        status = server.status()
        assert (status["snapshots_queued"], status["snapshots_waiting"]) == (1, 1)
        assert status["snapshots_active"] == 1
    finally:
        yield server.stopService()
