"""Snapshot streams of many clients, their limits and their pace: first SnapshotScheduler
alone, under a Clock, with a fake ROUTER whose clients read when the test says so; then
through real sockets.

A "stuck" client through sockets is a raw DEALER that asked for a snapshot and stopped
reading: its ZeroMQ receive queue (5 messages), both kernel socket buffers and the
server's pipe fill up, then the server's stream cannot send. The events are 32 KiB each
so that a few hundred of them are more than the buffers hold.
"""

from __future__ import annotations

from collections import defaultdict, deque
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import msgpack
import pytest_twisted
from hypothesis import given, settings
from hypothesis import strategies as st
from twisted.internet.task import Clock

from bus.eventbus import codec
from bus.eventbus.codec import SEQUENCE, SYNCEND, SYNCSTART, SequenceEncoding
from bus.eventbus.config import EventBusConfig
from bus.eventbus.snapshots import (
    HOT_WINDOW,
    KEEP_WHEN_BLOCKED,
    MAX_RETRY_DELAY,
    SnapshotScheduler,
)
from bus.testing import MemoryEventLog, RawPeer, start_bus, wait_until
from bus.transport.zmqsocket import PeerUnreachable
from tests.eventbus_helpers import pub

BIG = 32 * 1024
EVENTS = 600
UUID = b"0d5e8f1e-6a43-4a4f-9c5e-6f3f9d0a1b2c"


# -- the scheduler under a Clock, with no socket ---------------------------------------------------


class FakeRouter:
    """The snapshot ROUTER as the scheduler uses it. Each client identity has a pipe of
    ``hwm`` messages: ``send_many`` takes messages in order while the pipe has room (what
    libzmq does at the send HWM) and raises PeerUnreachable for a client that left; the
    client takes messages out of its pipe with :meth:`read`. (A candidate for
    bus.testing, beside MemoryEventLog.)"""

    closed = False

    def __init__(self, hwm: int) -> None:
        self.hwm = hwm
        self.pipes: defaultdict[bytes, deque[list[bytes]]] = defaultdict(deque)
        #: What each client read, as a DEALER sees it (without the identity frame).
        self.received: defaultdict[bytes, list[list[bytes]]] = defaultdict(list)
        self.gone: set[bytes] = set()

    def send_many(self, messages: Sequence[Sequence[bytes]]) -> int:
        if not messages:
            return 0
        identity = messages[0][0]
        assert all(m[0] == identity for m in messages), "a stream sends to one client"
        if identity in self.gone:
            raise PeerUnreachable(identity)
        pipe = self.pipes[identity]
        taken = messages[: max(self.hwm - len(pipe), 0)]
        pipe.extend(list(m[1:]) for m in taken)
        return len(taken)

    def read(self, identity: bytes, count: int | None = None) -> int:
        """The client reads ``count`` messages (None: all its pipe holds)."""
        pipe = self.pipes[identity]
        n = len(pipe) if count is None else min(count, len(pipe))
        self.received[identity].extend(pipe.popleft() for _ in range(n))
        return n

    def ended(self, identity: bytes) -> bool:
        got = self.received[identity]
        return bool(got) and got[-1][0] == SYNCEND


def memory_log(topics: list[str]) -> MemoryEventLog:
    memory = MemoryEventLog()
    fields = [
        (t.encode(), b"p", b"2026-11-27T00:00:00Z", UUID, msgpack.packb(i))
        for i, t in enumerate(topics)
    ]
    memory.append_fields(fields, 0.0)
    return memory


def scheduled(
    memory: MemoryEventLog, hwm: int = 5, released: Any = None, **options: Any
) -> tuple[SnapshotScheduler, FakeRouter, Clock]:
    clock = Clock()
    clock.advance(1_000)
    router = FakeRouter(hwm)
    sock: Any = router  # what the scheduler calls of a ZmqSocket: send_many, closed
    config = replace(EventBusConfig(), **options)
    scheduler = SnapshotScheduler(clock, memory, config, lambda: sock, released)
    return scheduler, router, clock


def ask(scheduler: SnapshotScheduler, identity: bytes, *frames: bytes) -> None:
    scheduler.request(identity, codec.parse_sync_start([SYNCSTART, *frames]))


def numbers(messages: list[list[bytes]]) -> list[int]:
    """The sequences of SYNC messages, in either encoding."""
    return [codec.decode_sequence(m[2])[0] or 0 for m in messages if m[0] == b"SYNC"]


def test_a_slow_client_gets_every_event_once_in_order_while_its_stream_waits() -> None:
    scheduler, router, clock = scheduled(
        memory_log([f"/s/{i % 7}/" for i in range(300)]), snapshot_chunk=50
    )
    ask(scheduler, b"slow", b"", SEQUENCE.pack(0))
    clock.advance(0)
    assert len(router.pipes[b"slow"]) == 5  # its pipe is full: the stream waits
    for step in range(1_000):
        if router.ended(b"slow"):
            break
        if step == 20:
            # It stops reading for a while: its stream keeps only a few messages ready
            # (and reads the rest again from the log once the client moves).
            clock.advance(1.0)
            [stream] = scheduler.streams
            assert stream.prepared <= KEEP_WHEN_BLOCKED
        router.read(b"slow", 3)
        clock.advance(0.01)
    got = router.received[b"slow"]
    assert numbers(got) == list(range(1, 301))
    assert got[-1] == [SYNCEND, b"", SEQUENCE.pack(300)]
    assert (scheduler.served, scheduler.stalled, scheduler.aborted) == (1, 0, 0)
    assert scheduler.messages_sent == 301 and not scheduler.streams and not scheduler.per_client


def test_a_client_that_takes_nothing_is_abandoned_after_the_stall_timeout_without_a_syncend() -> (
    None
):
    scheduler, router, clock = scheduled(
        memory_log(["/a/"] * 100), snapshot_chunk=50, snapshot_stall_timeout=10
    )
    ask(scheduler, b"stuck", b"", SEQUENCE.pack(0))
    while clock.seconds() < 1_009.9:
        clock.advance(0.05)
    [stream] = scheduler.streams
    assert scheduler.stalled == 0 and stream.prepared <= KEEP_WHEN_BLOCKED
    # Waiting costs a few attempts, ever further apart, not one per millisecond.
    assert scheduler.retries <= 40
    clock.advance(MAX_RETRY_DELAY)
    assert scheduler.stalled == 1 and not scheduler.streams and not scheduler.per_client
    # What was queued for it is a prefix, and nothing says it holds everything.
    router.read(b"stuck")
    assert numbers(router.received[b"stuck"]) == [1, 2, 3, 4, 5]
    assert not router.ended(b"stuck")
    # Asking again, it gets the whole snapshot.
    ask(scheduler, b"stuck", b"", SEQUENCE.pack(0))
    while not router.ended(b"stuck"):
        router.read(b"stuck")
        clock.advance(0.01)
    assert numbers(router.received[b"stuck"]) == [1, 2, 3, 4, 5, *range(1, 101)]
    assert scheduler.served == 1


def test_the_signal_wakes_a_stream_whose_client_was_reading_and_not_one_that_stopped() -> None:
    scheduler, router, clock = scheduled(memory_log(["/a/"] * 100), hwm=4)
    ask(scheduler, b"c", b"", SEQUENCE.pack(0))
    clock.advance(0)
    assert router.read(b"c") == 4
    # The pipe drained: libzmq signals the ROUTER, and the stream sends with no timer.
    scheduler.writable()
    clock.advance(0)
    assert len(router.pipes[b"c"]) == 4
    # A client that took nothing for longer than HOT_WINDOW waits for its timer.
    clock.advance(HOT_WINDOW * 3)
    assert router.read(b"c") == 4
    scheduler.writable()
    clock.advance(0)
    assert len(router.pipes[b"c"]) == 0
    [stream] = scheduler.streams
    clock.advance(stream.due - clock.seconds())
    assert len(router.pipes[b"c"]) == 4
    assert numbers(router.received[b"c"] + list(router.pipes[b"c"])) == list(range(1, 13))


def test_beyond_the_cap_requests_wait_then_are_refused_and_a_client_gone_frees_its_slot() -> None:
    scheduler, router, clock = scheduled(
        memory_log(["/a/"] * 50), hwm=2, max_snapshots=2, snapshot_queue=1
    )
    for identity in (b"one", b"two", b"waits", b"refused"):
        ask(scheduler, identity, b"", SEQUENCE.pack(0))
    clock.advance(0)
    assert sorted(s.identity for s in scheduler.streams) == [b"one", b"two"]
    assert (scheduler.queued, scheduler.refused, len(scheduler.waiting)) == (1, 1, 1)
    router.gone.add(b"one")
    clock.advance(MAX_RETRY_DELAY)  # its stream tries again and finds it gone
    assert scheduler.aborted == 1 and not scheduler.waiting
    while not router.ended(b"waits"):
        router.read(b"waits")
        clock.advance(0.01)
    assert numbers(router.received[b"waits"]) == list(range(1, 51))
    # The refused request was never answered: no SYNCEND telling it it has everything.
    assert router.received[b"refused"] == [] and not router.pipes[b"refused"]


def test_one_identity_runs_its_snapshots_one_after_the_other_without_holding_up_others() -> None:
    scheduler, router, clock = scheduled(
        memory_log(["/a/"] * 20), hwm=3, max_snapshots_per_client=1
    )
    ask(scheduler, b"same", b"", SEQUENCE.pack(0))
    ask(scheduler, b"same", b"", SEQUENCE.pack(15))
    ask(scheduler, b"other", b"", SEQUENCE.pack(10))
    clock.advance(0)
    assert sorted(s.identity for s in scheduler.streams) == [b"other", b"same"]
    assert scheduler.queued == 1
    for _ in range(1_000):
        if scheduler.served == 3:
            break
        router.read(b"same")
        router.read(b"other")
        clock.advance(0.01)
    router.read(b"same")
    got = router.received[b"same"]
    assert numbers(got) == [*range(1, 21), *range(16, 21)]
    assert got[20][0] == SYNCEND and got[-1][0] == SYNCEND  # not interleaved
    assert numbers(router.received[b"other"]) == list(range(11, 21))


def test_the_servers_encoding_and_syncend_rule_answer_what_the_request_leaves_open() -> None:
    memory = memory_log(["/a/", "/b/", "/b/"])
    scheduler, router, clock = scheduled(
        memory, hwm=100, sequence_encoding=SequenceEncoding.TEXT, syncend="current"
    )
    ask(scheduler, b"no-sequence", b"/a/")  # answered in the server's encoding
    ask(scheduler, b"binary", b"/a/", SEQUENCE.pack(0))  # answered as asked
    clock.advance(0)
    router.read(b"no-sequence")
    router.read(b"binary")
    assert [m[:3] for m in router.received[b"no-sequence"]] == [
        [b"SYNC", b"/a/", b"1"], [SYNCEND, b"/a/", b"3"],
    ]  # fmt: skip
    assert [m[:3] for m in router.received[b"binary"]] == [
        [b"SYNC", b"/a/", SEQUENCE.pack(1)], [SYNCEND, b"/a/", SEQUENCE.pack(3)],
    ]  # fmt: skip


def test_a_snapshot_stops_at_what_clients_may_see_when_it_is_asked() -> None:
    released = [3]
    memory = memory_log(["/a/"] * 5)
    scheduler, router, clock = scheduled(memory, hwm=100, released=lambda: released[0])
    ask(scheduler, b"early", b"", SEQUENCE.pack(0))
    released[0] = 5  # later releases do not reach a snapshot already asked for
    clock.advance(0)
    ask(scheduler, b"late", b"", SEQUENCE.pack(0))
    clock.advance(0)
    router.read(b"early")
    router.read(b"late")
    assert numbers(router.received[b"early"]) == [1, 2, 3]
    assert router.received[b"early"][-1] == [SYNCEND, b"", SEQUENCE.pack(3)]
    assert numbers(router.received[b"late"]) == [1, 2, 3, 4, 5]


def test_a_stopped_scheduler_leaves_no_timer_and_answers_nothing() -> None:
    scheduler, router, clock = scheduled(memory_log(["/a/"] * 50), hwm=2)
    ask(scheduler, b"c", b"", SEQUENCE.pack(0))
    clock.advance(0)
    assert clock.getDelayedCalls()
    scheduler.stop()
    assert clock.getDelayedCalls() == [] and not scheduler.streams
    ask(scheduler, b"late", b"", SEQUENCE.pack(0))
    clock.advance(10)
    assert not scheduler.streams and router.received[b"late"] == []


class FailingLog(MemoryEventLog):
    """A log whose reads of one subtree fail (a fault of the server's, not the client's)."""

    def read_rows(self, after: int, upto: Any = None, prefixes: Any = (), limit: int = 1000) -> Any:
        if b"/broken/" in prefixes:
            raise OSError("the disk is gone")
        return super().read_rows(after, upto, prefixes, limit)


def test_a_stream_whose_read_fails_ends_unanswered_and_the_others_go_on() -> None:
    memory = FailingLog()
    memory.append_fields([(b"/a/", b"p", b"t", UUID, b"\xc0")] * 3, 0.0)
    scheduler, router, clock = scheduled(memory, hwm=100)
    ask(scheduler, b"broken", b"/broken/", SEQUENCE.pack(0))
    ask(scheduler, b"fine", b"/a/", SEQUENCE.pack(0))
    clock.advance(0)
    router.read(b"broken")
    router.read(b"fine")
    assert numbers(router.received[b"fine"]) == [1, 2, 3] and router.ended(b"fine")
    assert router.received[b"broken"] == []  # no SYNCEND: its client asks again
    assert (scheduler.served, scheduler.failed, scheduler.aborted) == (1, 1, 0)
    assert not scheduler.streams and not scheduler.per_client
    assert scheduler.status()["snapshots_failed"] == 1


def test_a_since_past_the_log_is_answered_with_its_syncend_without_reading_it() -> None:
    memory = FailingLog()  # a read of /broken/ would fail: none may happen
    memory.append_fields([(b"/broken/", b"p", b"t", UUID, b"\xc0")] * 3, 0.0)
    scheduler, router, clock = scheduled(memory, hwm=100)
    ask(scheduler, b"far", b"/broken/", SEQUENCE.pack(2**64 - 1))
    ask(scheduler, b"at-end", b"/broken/", b"3")
    clock.advance(0)
    for identity in (b"far", b"at-end"):
        router.read(identity)
    assert router.received[b"far"] == [[SYNCEND, b"/broken/", SEQUENCE.pack(3)]]
    assert router.received[b"at-end"] == [[SYNCEND, b"/broken/", b"3"]]
    assert (scheduler.served, scheduler.failed) == (2, 0)


clients = st.lists(
    st.tuples(
        st.lists(st.sampled_from(["/a/", "/a/b/", "/b/"]), max_size=2),  # subtrees
        st.integers(0, 45),  # since
    ),
    min_size=1,
    max_size=3,
)
steps = st.lists(
    st.tuples(
        st.sampled_from([0.0, 0.001, 0.05, 0.3, 2.0]),  # time passes
        st.lists(st.integers(0, 6), min_size=3, max_size=3),  # each client reads
        st.booleans(),  # the ROUTER signals
        st.integers(0, 3),  # events stored meanwhile (in no snapshot asked before)
    ),
    max_size=40,
)


@settings(max_examples=150, deadline=None)
@given(
    st.lists(st.sampled_from(["/a/", "/a/b/", "/b/", "/ab/"]), max_size=40),
    clients,
    st.integers(1, 6),
    st.integers(1, 20),
    steps,
)
def test_however_clients_read_each_gets_its_matching_events_once_in_order_then_its_syncend(
    topics: list[str],
    requests: list[tuple[list[str], int]],
    hwm: int,
    chunk: int,
    schedule: list[tuple[float, list[int], bool, int]],
) -> None:
    memory = memory_log(topics)
    upto = memory.last_sequence
    scheduler, router, clock = scheduled(
        memory, hwm=hwm, snapshot_chunk=chunk, snapshot_stall_timeout=0
    )
    identities = [b"client-%d" % i for i in range(len(requests))]
    for identity, (subtrees, since) in zip(identities, requests, strict=True):
        ask(scheduler, identity, ";".join(subtrees).encode(), SEQUENCE.pack(since))
    for elapsed, reads, signal, stored in schedule:
        memory.append_fields([(b"/a/", b"p", b"t", UUID, b"\xc0")] * stored, 0.0)
        clock.advance(elapsed)
        for identity, count in zip(identities, reads, strict=False):
            router.read(identity, count)
        if signal:
            scheduler.writable()
    for _ in range(10_000):  # now every client reads all it is sent
        if scheduler.served == len(requests):
            break
        for identity in identities:
            router.read(identity)
        clock.advance(MAX_RETRY_DELAY)
    for identity, (subtrees, since) in zip(identities, requests, strict=True):
        router.read(identity)
        wanted = [
            i + 1 for i, t in enumerate(topics)
            if i + 1 > since and (not subtrees or t.startswith(tuple(subtrees)))
        ]  # fmt: skip
        got = router.received[identity]
        assert numbers(got) == wanted
        assert [m[0] for m in got].count(SYNCEND) == 1
        assert got[-1][0] == SYNCEND
        assert SEQUENCE.unpack(got[-1][2])[0] == (wanted[-1] if wanted else upto)
    assert (scheduler.stalled, scheduler.aborted) == (0, 0) and not scheduler.streams


# -- through real sockets ---------------------------------------------------------------------


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
    streams = list(server.snapshots.streams)
    return len(streams) == count and all(
        s.delay > 0.1 and s.prepared <= KEEP_WHEN_BLOCKED for s in streams
    )


@pytest_twisted.inlineCallbacks
def test_stuck_clients_are_abandoned_after_the_stall_timeout(
    tmp_path: Any, peers: list[Any]
) -> Any:
    # 4 s: the streams are seen blocked between about 0.3 s and the stall timeout, a window a
    # loaded machine's pauses must not outlast.
    server = start_bus(tmp_path, snapshot_hwm=5, snapshot_stall_timeout=4.0)
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
        assert len(server.snapshots.streams) == 8  # the stuck ones still wait, not abandoned
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
        yield wait_until(lambda: len(server.snapshots.streams) == 2)
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
        yield wait_until(lambda: len(server.snapshots.streams) == 1)
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


@pytest_twisted.inlineCallbacks
def test_a_since_past_what_sqlite_holds_gets_its_syncend_and_the_port_goes_on(
    tmp_path: Any, peers: list[Any]
) -> Any:
    """A sequence frame may say up to 2**64 - 1, past SQLite's integers: such a SYNCSTART
    once raised inside the shared pump and left every stream of that turn waiting."""
    server = start_bus(tmp_path)
    try:
        yield fill(server, peers, count=3, size=10)
        client = RawPeer.dealer(server.endpoints["snapshot"])
        peers.append(client)
        client.send([SYNCSTART, b"", b"\xff" * 8])
        client.send([SYNCSTART, b"/big/", b"%d" % (2**64 - 1)])
        client.send([SYNCSTART, b"", SEQUENCE.pack(1)])
        yield wait_until(lambda: len(syncends(client)) == 3, what="three SYNCENDs")
        assert syncends(client)[:2] == [
            [SYNCEND, b"", SEQUENCE.pack(3)], [SYNCEND, b"/big/", b"3"],
        ]  # fmt: skip
        assert sequences(client.messages) == [2, 3]
        assert server.status()["snapshots_failed"] == 0
    finally:
        yield server.stopService()
