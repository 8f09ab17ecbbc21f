"""Property-based fuzzing of the pair's peer link: the codec, and a RUNNING pair whose
link ports get garbage beside valid traffic.

The codec must raise only :class:`PairError` for any input and give back what it encoded.
The running pair (a primary active, a backup passive, sync replication) gets batches of
garbage on both link ports (random frames, link messages with a corrupted body, wrong
types) interleaved with valid PUBs on the active's collector. After each example the pair
must still be formed (active paired, passive in sync), every valid PUB must be stored once
in both logs under the same sequences, and the drop counters of the two link sockets must
have counted every garbage message under the reason the codec gives (the oracle).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgpack
import pytest
import pytest_twisted
import zmq
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bus.eventbus import pair_codec
from bus.eventbus.pair_codec import (
    Ack,
    Events,
    Forward,
    Join,
    PairError,
    PeerState,
    Rewind,
)
from bus.testing import RawPeer, wait_until
from tests.eventbus_helpers import pub
from tests.test_eventbus_pair import Pair, formed

KINDS = [b"STATE", b"JOIN", b"REWIND", b"EVENTS", b"ACK", b"FORWARD", b"NOPE"]
sequences = st.integers(min_value=0, max_value=2**63 - 1)
fields = st.tuples(*[st.binary(max_size=20)] * 5)

# -- the codec ----------------------------------------------------------------------------

messages = st.one_of(
    st.builds(PeerState, st.sampled_from(["primary", "backup"]),
              st.sampled_from(["waiting", "active", "passive", "doubt"]), sequences,
              st.text(max_size=36), sequences, sequences, st.booleans(), sequences,
              sequences),
    st.builds(Join, st.text(max_size=36), sequences, sequences,
              st.lists(st.tuples(sequences, st.binary(max_size=36)), max_size=5).map(tuple)),
    st.builds(Rewind, st.text(max_size=36), sequences, sequences),
    st.builds(Ack, sequences),
    st.builds(Forward, st.lists(fields, max_size=4).map(tuple)),
)  # fmt: skip


def encode(message: Any) -> list[bytes]:
    if isinstance(message, PeerState):
        return pair_codec.state_frames(message)
    if isinstance(message, Join):
        return pair_codec.join_frames(message)
    if isinstance(message, Rewind):
        return pair_codec.rewind_frames(message)
    if isinstance(message, Ack):
        return pair_codec.ack_frames(message.sequence)
    return pair_codec.forward_frames(list(message.events))


@settings(max_examples=300, deadline=None)
@given(message=messages)
def test_every_message_survives_a_round_trip(message: Any) -> None:
    assert pair_codec.parse(encode(message)) == message


@given(first=st.integers(1, 2**40), batch=st.lists(fields, min_size=1, max_size=5))
def test_events_round_trip(first: int, batch: list[Any]) -> None:
    parsed = pair_codec.parse(pair_codec.consecutive_events_frames(first - 1, first, batch))
    assert isinstance(parsed, Events)
    assert parsed.after == first - 1 and parsed.last == first + len(batch) - 1
    assert [f for _, f in parsed.events] == batch


body_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**64 - 1) | st.binary(max_size=8)
    | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=8),
    max_leaves=30,
)  # fmt: skip


@st.composite
def link_garbage(draw: st.DrawFn) -> list[bytes]:
    """Frames that look more or less like a link message."""
    choice = draw(st.integers(0, 3))
    if choice == 0:
        return draw(st.lists(st.binary(max_size=40), max_size=5))
    kind = draw(st.sampled_from(KINDS))
    if choice == 1:
        value = draw(body_values)
        body = msgpack.packb(value, use_bin_type=True)
    elif choice == 2:
        body = draw(st.binary(max_size=60))
    else:
        valid = encode(draw(messages))[2]
        cut = draw(st.integers(0, max(len(valid) - 1, 0)))
        body = valid[:cut] + draw(st.binary(max_size=4))
    return [pair_codec.MAGIC, kind, body]


@settings(max_examples=500, deadline=None)
@given(frames=link_garbage())
def test_the_codec_raises_only_its_own_error(frames: list[bytes]) -> None:
    try:
        pair_codec.parse(frames)
    except PairError as error:
        assert error.reason


# -- a running pair -----------------------------------------------------------------------


def outcome(frames: list[bytes]) -> str | None:
    """The drop reason the link must count, or None for a message that parses."""
    try:
        pair_codec.parse(frames)
    except PairError as error:
        return error.reason
    return None


@dataclass
class FuzzedPair:
    pair: Pair
    rogues: list[RawPeer]
    collector: RawPeer
    published: int = 0


@pytest.fixture(scope="module")
def fuzzed_pair(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FuzzedPair]:
    pair = Pair(Path(tmp_path_factory.mktemp("fuzzed-pair")))
    primary = pair.start("primary")
    pair.start("backup")
    rogues = [RawPeer(zmq.DEALER, f"tcp://127.0.0.1:{port}") for port in pair.links.values()]
    collector = RawPeer.dealer(primary.endpoints["collector"])
    try:
        pytest_twisted.blockon(wait_until(lambda: formed(pair), what="pair formed"))
        yield FuzzedPair(pair, rogues, collector)
    finally:
        for peer in (*rogues, collector):
            peer.close()
        for server in pair.servers.values():
            pytest_twisted.blockon(server.stopService())


actions = st.lists(
    st.one_of(
        st.tuples(st.integers(0, 1), link_garbage()),
        st.tuples(st.just(-1), st.just([])),  # a valid PUB on the collector
    ),
    max_size=25,
)


@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(batch=actions)
@pytest_twisted.inlineCallbacks
def test_a_running_pair_survives_link_garbage(fuzzed_pair: FuzzedPair,
                                             batch: list[Any]) -> Any:  # fmt: skip
    fuzzed = fuzzed_pair
    primary = fuzzed.pair.servers["primary"]
    backup = fuzzed.pair.servers["backup"]
    before = Counter(primary.pair.drops.counts) + Counter(backup.pair.drops.counts)
    expected: Counter[str] = Counter()
    start = primary.store.last_sequence
    valid = 0
    for target, frames in batch:
        if target < 0:
            fuzzed.collector.send(pub("/fuzz/", valid))
            valid += 1
            continue
        reason = outcome(frames)
        if reason is None or not frames:
            continue  # a valid link message from a stranger would be obeyed: not garbage
        expected[reason] += 1
        fuzzed.rogues[target].send(frames)

    def counted() -> bool:
        now = Counter(primary.pair.drops.counts) + Counter(backup.pair.drops.counts)
        return now - before == expected

    yield wait_until(counted, what="every garbage message counted")
    yield wait_until(lambda: backup.store.last_sequence == start + valid, what="replicated")
    yield wait_until(lambda: formed(fuzzed.pair), what="pair still formed")
    mine = primary.store.read(start, limit=10**6)
    theirs = backup.store.read(start, limit=10**6)
    assert [e.sequence for e in mine] == list(range(start + 1, start + valid + 1))
    assert mine == theirs
    # Released once the passive's acknowledgement is back.
    yield wait_until(lambda: primary.core.released == start + valid, what="released")
