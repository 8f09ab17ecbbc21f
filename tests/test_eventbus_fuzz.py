"""Property-based fuzzing of a RUNNING Event BUS through real sockets.

Hypothesis generates batches of garbage multipart messages (random frames, near-valid PUBs
with one field corrupted, huge frames, SYNCSTARTs with garbage), interleaved with valid PUBs
and SYNCSTARTs, and sends them to the collector and snapshot ports of one server shared by
the module. After every example the server must still answer (a probe PUB is stored and
broadcast, a probe SYNCSTART gets its SYNCEND), every valid PUB must be stored exactly once
under consecutive sequences and broadcast as stored, the drop counters must have counted
every bad message under the reason the codec gives, and nothing stored before may be lost.
The oracle is the codec's reference parsers (parse_pub, parse_sync_start; unit-tested in
test_eventbus_codec.py), while the server runs its inlined fast path: the two must agree.

How hypothesis runs inside pytest-twisted: pytest-twisted (1.14) recognises a test wrapped
by ``@given`` and replaces hypothesis' inner test with one that runs the decorated
``inlineCallbacks`` function in the reactor greenlet and waits for its Deferred. So every
example really drives the server through the reactor, and shrinking replays examples
against the same live server. Because the server is shared, each example checks deltas,
and an example that fails marks the bookkeeping stale so that replays re-read it from the
server instead of reporting a cascade of unrelated differences.
"""

from __future__ import annotations

import uuid
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC
from pathlib import Path
from typing import Any

import msgpack
import pytest
import pytest_twisted
import zmq
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bus.eventbus import codec
from bus.eventbus.codec import HEARTBEAT_TOPIC, SYNC, SYNCEND, SYNCSTART, EventBusError
from bus.testing import RawPeer, start_bus, wait_until

MAX_DATA = 64 * 1024
#: Largest frame sent to the collector: above every field limit, below the collector's
#: ZMQ_MAXMSGSIZE (max_data_bytes + 8 KiB), past which libzmq drops the connection itself.
COLLECTOR_FRAME_LIMIT = 70_000
#: The same for the snapshot port (MAX_SUBTREE_SPEC_BYTES + 1 KiB).
SNAPSHOT_FRAME_LIMIT = codec.MAX_SUBTREE_SPEC_BYTES + 1000

Message = list[bytes]
Action = tuple[str, Message]  # ("collector" | "snapshot", frames)


# -- the oracle: what the server must do with each message --------------------------------------


def collector_outcome(frames: Message) -> str | None:
    """None if the collector must store this PUB, else the drop reason."""
    body = frames
    if len(body) == 7 and not body[0]:
        body = body[1:]  # a REQ-style empty delimiter
    try:
        codec.parse_pub(body, MAX_DATA)
    except EventBusError as error:
        return error.reason
    return None


def snapshot_outcome(frames: Message) -> str | None:
    """None if the snapshot port must answer this SYNCSTART, else the drop reason."""
    try:
        codec.parse_sync_start(frames)
    except EventBusError as error:
        return error.reason
    return None


def stored_body(frames: Message) -> tuple[bytes, ...]:
    body = frames[1:] if len(frames) == 7 else frames
    topic, _, producer, timestamp, event_id, data = body
    return (topic, producer, timestamp, event_id, data)


# -- strategies ----------------------------------------------------------------------------------

msgpack_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**64 - 1) | st.text(max_size=10),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=5), children, max_size=4)
    ),
    max_leaves=10,
)
sequence_frames = st.sampled_from([b"\x00" * 8, b"\x00" * 7 + b"\x05", b"null", b"", b"0", b"42"])


@st.composite
def valid_pubs(draw: st.DrawFn) -> Message:
    moment = draw(st.datetimes(timezones=st.none() | st.just(UTC)))
    timespec = draw(st.sampled_from(["seconds", "milliseconds", "microseconds"]))
    return [
        b"/fuzz/" + draw(st.text(max_size=12)).encode(),
        draw(sequence_frames),
        draw(st.text(max_size=12)).encode(),
        moment.isoformat(timespec=timespec).encode(),
        str(draw(st.uuids(version=4))).encode(),
        msgpack.packb(draw(msgpack_values)),
    ]


def huge(limit: int) -> st.SearchStrategy[bytes]:
    return st.integers(4097, limit).map(lambda n: b"\x00" * n)


#: Per PUB field, values that break exactly that field.
BAD_FIELDS: dict[int, list[bytes]] = {
    0: [b"", b"\xff\xfe", HEARTBEAT_TOPIC, b"$", b"t" * (codec.MAX_TOPIC_BYTES + 1)],
    1: [b"\x01\x02\x03", b"-1", b"18446744073709551616", b"1" * 21, b"\x00" * 9],
    2: [b"\xff", b"p" * (codec.MAX_PRODUCER_BYTES + 1)],
    3: [b"", b"noon", b"2026-02-30", "2026-11-21T10:00:00\u00e9".encode(), b"2" * 65],
    4: [b"", b"not-a-uuid", b"0" * 32, str(uuid.UUID(int=1)).encode()[:-1]],
    5: [b"", b"\xc1", b"\x01\x02", b"\x92\x01", msgpack.packb(b"x" * MAX_DATA)],
}


@st.composite
def corrupted_pubs(draw: st.DrawFn) -> Message:
    """A valid PUB with one field broken, or a frame added or removed."""
    frames = draw(valid_pubs())
    how = draw(st.sampled_from(["known-bad", "random", "huge", "drop", "add"]))
    index = draw(st.integers(0, 5))
    if how == "known-bad":
        frames[index] = draw(st.sampled_from(BAD_FIELDS[index]))
    elif how == "random":
        frames[index] = draw(st.binary(max_size=40))
    elif how == "huge":
        frames[index] = draw(huge(COLLECTOR_FRAME_LIMIT))
    elif how == "drop":
        del frames[index]
    else:
        frames.insert(index, draw(st.binary(max_size=10)))
    return frames


def random_messages(limit: int) -> st.SearchStrategy[Message]:
    return st.lists(st.binary(max_size=40) | huge(limit), min_size=1, max_size=10)


collector_messages = st.one_of(
    valid_pubs(),
    valid_pubs().map(lambda frames: [b"", *frames]),  # REQ-style delimiter: accepted
    corrupted_pubs(),
    corrupted_pubs().map(lambda frames: [b"", *frames]),
    random_messages(COLLECTOR_FRAME_LIMIT),
)

subtree_specs = st.sampled_from([b"", b"/fuzz/", b"/nothing/", b"/a/;/b/", b"/fuzz/,/x/", b";"])
syncstart_sequences = st.one_of(
    st.sampled_from([b"", b"null", b"0", b"\x00" * 8]),
    st.integers(0, 10_000).map(lambda n: b"%d" % n),
    st.integers(0, 10_000).map(codec.SEQUENCE.pack),
)
snapshot_messages = st.one_of(
    st.tuples(subtree_specs, syncstart_sequences).map(lambda t: [SYNCSTART, *t]),
    subtree_specs.map(lambda spec: [SYNCSTART, spec]),
    st.lists(st.binary(max_size=20) | syncstart_sequences, max_size=4).map(
        lambda rest: [SYNCSTART, *rest]
    ),
    st.integers(codec.MAX_SUBTREE_SPEC_BYTES + 1, SNAPSHOT_FRAME_LIMIT).map(
        lambda n: [SYNCSTART, b"/" * n, b"0"]
    ),
    random_messages(SNAPSHOT_FRAME_LIMIT),
)
batches = st.lists(
    st.one_of(
        collector_messages.map(lambda frames: ("collector", frames)),
        snapshot_messages.map(lambda frames: ("snapshot", frames)),
    ),
    min_size=1,
    max_size=20,
)


# -- the server under test -------------------------------------------------------------------------


@dataclass
class FuzzedBus:
    server: Any
    collector: Any
    snapshot: Any
    subscriber: Any
    #: (topic, producer, timestamp, uuid, data) of every event stored so far, in order.
    stored: list[tuple[bytes, ...]] = field(default_factory=list)
    in_sync: bool = True
    examples: int = 0

    def store_contents(self) -> list[tuple[bytes, ...]]:
        events = self.server.store.read(0, limit=1_000_000)
        assert [e.sequence for e in events] == list(range(1, len(events) + 1))
        return [(e.topic, e.producer, e.timestamp, e.uuid, e.data) for e in events]

    def broadcasts(self) -> list[Message]:
        return [m for m in self.subscriber.messages if m[0] != HEARTBEAT_TOPIC]


@pytest.fixture(scope="module")
def fuzzed_bus(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FuzzedBus]:
    server = start_bus(
        tmp_path_factory.mktemp("fuzzed-bus"), max_data_bytes=MAX_DATA, heartbeat_interval=0.05
    )
    subscriber = RawPeer.sub(server.endpoints["publisher"])
    collector = RawPeer.dealer(server.endpoints["collector"])
    snapshot = RawPeer.dealer(server.endpoints["snapshot"])
    try:
        # A heartbeat proves the subscription is in place before anything is published.
        pytest_twisted.blockon(
            wait_until(lambda: bool(subscriber.messages), what="the first heartbeat")
        )
        yield FuzzedBus(server, collector, snapshot, subscriber)
    finally:
        for peer in (subscriber, collector, snapshot):
            peer.close()
        pytest_twisted.blockon(server.stopService())


@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(batch=batches)
@pytest_twisted.inlineCallbacks
def test_server_survives_garbage_and_accounts_for_every_message(
    fuzzed_bus: FuzzedBus, batch: list[Action]
) -> Any:
    bus = fuzzed_bus
    server = bus.server
    if not bus.in_sync:
        # A previous example failed: take the server's state as the new baseline.
        yield wait_until(lambda: not server.snapshots.streams, what="snapshot streams to finish")
        bus.stored = bus.store_contents()
        bus.in_sync = True
    try:
        yield run_example(bus, batch)
    except BaseException:
        bus.in_sync = False
        raise


@pytest_twisted.inlineCallbacks
def run_example(bus: FuzzedBus, batch: list[Action]) -> Any:
    server = bus.server
    bus.examples += 1
    drops_before = Counter(server.core.drops.counts)
    last_before = server.store.last_sequence
    broadcasts_before = len(bus.broadcasts())
    snapshot_replies_before = len(bus.snapshot.messages)
    assert last_before == len(bus.stored)

    expected_drops: Counter[str] = Counter()
    expected_new: list[tuple[bytes, ...]] = []
    expected_syncends = 0
    for port, frames in batch:
        if port == "collector":
            reason = collector_outcome(frames)
            bus.collector.send(frames)
            if reason is None:
                expected_new.append(stored_body(frames))
        else:
            reason = snapshot_outcome(frames)
            bus.snapshot.send(frames)
            if reason is None:
                expected_syncends += 1
        if reason is not None:
            expected_drops[reason] += 1

    # The probes: sent last on each socket, so once they are answered, everything sent
    # before them on that socket has been handled.
    probe_topic = b"/probe/%d/" % bus.examples
    probe = [probe_topic, b"null", b"fuzzer", b"2026-11-21T10:00:00.000Z"]
    probe += [str(uuid.uuid4()).encode(), msgpack.packb(bus.examples)]
    bus.collector.send(probe)
    expected_new.append(stored_body(probe))
    yield wait_until(
        lambda: any(m[0] == probe_topic for m in bus.broadcasts()),
        what="the probe PUB to be broadcast",
    )
    # Sent once the probe PUB is stored, so its snapshot must contain it.
    probe_spec = b"/probe/%d/;/nothing/" % bus.examples
    bus.snapshot.send([SYNCSTART, probe_spec, b"%d" % last_before])
    expected_syncends += 1

    def replies() -> list[Message]:
        return list(bus.snapshot.messages[snapshot_replies_before:])

    def probe_answered() -> bool:
        return any(m[0] == SYNCEND and m[1] == probe_spec for m in replies())

    yield wait_until(probe_answered, what="the probe SYNCSTART's SYNCEND")
    yield wait_until(
        lambda: sum(m[0] == SYNCEND for m in replies()) >= expected_syncends,
        what="a SYNCEND for every valid SYNCSTART",
    )
    yield wait_until(lambda: not server.snapshots.streams, what="snapshot streams to finish")

    # Every valid PUB stored exactly once, in order, under consecutive sequences; nothing
    # stored before was lost.
    last = last_before + len(expected_new)
    assert server.store.last_sequence == last
    assert bus.store_contents() == bus.stored + expected_new
    bus.stored += expected_new

    # Each of them broadcast once, as stored.
    new_broadcasts = bus.broadcasts()[broadcasts_before:]
    assert [codec.decode_sequence(m[1])[0] for m in new_broadcasts] == list(
        range(last_before + 1, last + 1)
    )
    assert [stored_body(m) for m in new_broadcasts] == expected_new

    # Every bad message counted under the codec's reason, and nothing else counted.
    assert Counter(server.core.drops.counts) - drops_before == expected_drops
    assert sum(server.core.drops.counts.values()) == sum(drops_before.values()) + sum(
        expected_drops.values()
    )

    # One SYNCEND per valid SYNCSTART, none for the others; the probe's names the probe.
    syncends = [m for m in replies() if m[0] == SYNCEND]
    assert len(syncends) == expected_syncends
    probe_end = next(m for m in syncends if m[1] == probe_spec)
    assert codec.decode_sequence(probe_end[2]) == (last, codec.SequenceEncoding.TEXT)
    probe_syncs = [m for m in replies() if m[0] == SYNC and m[1] == probe_topic]
    assert probe_syncs and all(codec.decode_sequence(m[2])[0] == last for m in probe_syncs)
    assert all(len(m) == 7 for m in replies() if m[0] == SYNC)
    assert server.snapshots.aborted == 0


# -- beyond the socket's own limit -------------------------------------------------------------------


@pytest_twisted.inlineCallbacks
def test_a_frame_over_the_socket_limit_disconnects_only_that_peer(
    tmp_path: Path, peers: list[Any]
) -> Any:
    server = start_bus(tmp_path, max_data_bytes=1024)
    try:
        limit = server.collector_socket.socket.get(zmq.MAXMSGSIZE)
        assert limit > 1024
        rogue = RawPeer.dealer(server.endpoints["collector"])
        honest = RawPeer.dealer(server.endpoints["collector"])
        sub = RawPeer.sub(server.endpoints["publisher"])
        peers += [rogue, honest, sub]
        yield wait_until(lambda: bool(sub.messages), what="subscribed")
        good = [
            b"/ok/",
            b"null",
            b"p",
            b"2026-11-21T10:00:00Z",
            str(uuid.uuid4()).encode(),
            b"\x01",
        ]
        rogue.send([b"/big/", b"null", b"p", b"2026-11-21T10:00:00Z", b"u", b"x" * (limit + 1)])
        honest.send(good)
        yield wait_until(lambda: server.store.last_sequence == 1)
        # libzmq refused the message before the server saw it: nothing stored, nothing counted
        assert [e.topic for e in server.store.read(0)] == [b"/ok/"]
        assert server.core.drops.total == 0
        honest.send([*good[:4], str(uuid.uuid4()).encode(), b"\x02"])
        yield wait_until(lambda: server.store.last_sequence == 2)
        yield wait_until(lambda: len([m for m in sub.messages if m[0] == b"/ok/"]) == 2)
        assert server.core.drops.total == 0
        assert [e.topic for e in server.store.read(0)] == [b"/ok/", b"/ok/"]
    finally:
        yield server.stopService()
