"""Property-based fuzzing of a RUNNING mc0 broker through real CURVE sockets.

Hypothesis generates batches of messages — valid commands in both framings, valid ones with a
frame broken, dropped or added, oversized ones, random frames — and one peer sends them to a
broker shared by the module while a second peer watches the topics the batch PUTs to. After
every example the broker must still answer (a probe NOOP with an ID gets its OK), and:

* the fuzzing peer got exactly the replies the oracle predicts, in order and in the framing of
  each message: ERROR (with the ID when the message had a readable one) for bad input, OK
  for every good command with an ID, a MESSAGE before the OK of a PUT to a topic it holds;
* the watcher got one MESSAGE per good PUT to its topics, as sent;
* the error counters grew by exactly the oracle's reasons.

The oracle is the codec (``decode_client``, unit-tested in test_mc0_codec.py) plus the
broker's documented rules (TTL range, subscriptions, DISCONNECT forgets them).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import pytest_twisted
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bus.mc0 import codec
from bus.mc0.codec import Framing, Mc0Error
from bus.testing import wait_until
from tests.mc0_helpers import RawMc0Peer, start_broker
from tests.mc0_helpers import settings as broker_settings

MAX_BYTES = 4096
MIN_TTL, MAX_TTL = 60_000, 86_400_000
WATCHED = (b"w1", b"w2")
FUZZER = b"fuzzer"  # the fuzzing peer's socket identity, to find it in the broker
Message = list[bytes]


# -- strategies ----------------------------------------------------------------------------------

topics = st.sampled_from([b"w1", b"w2", b"t1", b"t2", b"mcollective.x"])
ids = st.none() | st.binary(min_size=0, max_size=8)
framings = st.sampled_from(list(Framing))
ttls = st.one_of(
    st.integers(MIN_TTL, MAX_TTL),  # accepted
    st.sampled_from([1, 99, MAX_TTL + 1, codec.MAX_TTL_MS]),  # outside the broker's range
)
commands = st.one_of(
    st.builds(
        codec.Connect,
        st.none() | ttls,
        st.none() | st.sampled_from([b"0.1", b"0.2", b"0.3"]),
        ids,
        framings,
    ),
    st.builds(codec.Noop, ids, framings),
    st.builds(codec.Subscribe, st.lists(topics, max_size=3).map(tuple), ids, framings),
    st.builds(codec.Unsubscribe, st.lists(topics, max_size=3).map(tuple), ids, framings),
    st.builds(codec.Disconnect, ids, framings),
    st.builds(
        lambda topic, extra, body, message_id, framing: codec.Put(
            topic, ((codec.TOPIC, topic), *extra), body, message_id, framing
        ),
        topics,
        st.lists(
            st.tuples(st.sampled_from([b"X-a", b"X-b"]), st.binary(max_size=6)),
            max_size=2,
            unique_by=lambda pair: pair[0],
        ).map(tuple),
        st.lists(st.binary(max_size=30), max_size=3).map(tuple),
        ids,
        framings,
    ),
)


@st.composite
def broken(draw: st.DrawFn) -> Message:
    frames = codec.encode(draw(commands))
    how = draw(st.sampled_from(["drop", "add", "replace", "huge", "verb"]))
    index = draw(st.integers(0, max(len(frames) - 1, 0)))
    if how == "drop" and frames:
        del frames[index]
    elif how == "add":
        frames.insert(index, draw(st.sampled_from([b"", b"ID", b"TOPIC", b"TTL", b"x"])))
    elif how == "replace" and frames:
        frames[index] = draw(st.binary(max_size=12))
    elif how == "huge":
        frames.append(b"\x00" * draw(st.integers(MAX_BYTES, 60_000)))
    elif how == "verb":
        verb_at = 1 if codec.framing_of(frames) is Framing.DELIMITED else 0
        frames[verb_at] = draw(st.binary(min_size=1, max_size=8))
    return frames


messages = st.one_of(
    commands.map(codec.encode),
    broken(),
    st.lists(st.binary(max_size=16), max_size=6),
)
batches = st.lists(messages, min_size=1, max_size=25)


# -- the oracle ------------------------------------------------------------------------------------


@dataclass
class Expected:
    replies: list[tuple[bytes, bytes | None, Framing, Message | None]] = field(default_factory=list)
    reasons: Counter[str] = field(default_factory=Counter)
    watched: list[Message] = field(default_factory=list)


def predict(batch: list[Message], held: set[bytes]) -> Expected:
    """What the broker must answer; ``held`` (the fuzzing peer's topics) is updated."""
    out = Expected()
    for frames in batch:
        if not frames:
            continue  # a zero-frame message cannot be sent
        try:
            command = codec.decode_client(frames, MAX_BYTES)
        except Mc0Error as error:
            out.reasons[error.reason] += 1
            out.replies.append((codec.ERROR, error.message_id, error.framing, None))
            continue
        if (
            isinstance(command, codec.Connect)
            and command.ttl_ms is not None
            and not (MIN_TTL <= command.ttl_ms <= MAX_TTL)
        ):
            out.reasons["bad-ttl"] += 1
            out.replies.append((codec.ERROR, command.id, command.framing, None))
            continue
        if isinstance(command, codec.Subscribe):
            held.update(command.topics)
        elif isinstance(command, codec.Unsubscribe):
            held.difference_update(command.topics)
        elif isinstance(command, codec.Disconnect):
            held.clear()
        elif isinstance(command, codec.Put):
            if command.topic in held:
                message = codec.message_frames(command, command.framing)
                out.replies.append((codec.MESSAGE, None, command.framing, message))
            if command.topic in WATCHED:
                out.watched.append(codec.message_frames(command, Framing.DELIMITED))
        if command.id is not None:
            out.replies.append((codec.OK, command.id, command.framing, None))
    return out


def check_reply(
    got: Message, verb: bytes, message_id: bytes | None, framing: Framing, exact: Message | None
) -> None:
    if exact is not None:
        assert got == exact
        return
    assert codec.framing_of(got) is framing, got
    parsed = codec.parse(got)
    assert parsed.verb == verb, got
    assert parsed.id == message_id, got
    if verb == codec.ERROR:
        assert parsed.header(codec.MESSAGE), got


# -- the broker under test -------------------------------------------------------------------------


@dataclass
class Fuzzed:
    broker: Any
    fuzzer: RawMc0Peer
    watcher: RawMc0Peer
    held: set[bytes] = field(default_factory=set)
    examples: int = 0
    in_sync: bool = True


@pytest.fixture(scope="module")
def fuzzed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fuzzed]:
    broker = start_broker(
        tmp_path_factory.mktemp("fuzzed-mc0"),
        broker=broker_settings(
            min_ttl_ms=MIN_TTL,
            max_ttl_ms=MAX_TTL,
            default_ttl_ms=MIN_TTL,
            max_message_bytes=MAX_BYTES,
        ),
    )
    fuzzer = RawMc0Peer(broker.endpoint, broker.keys.public, identity=FUZZER)
    watcher = RawMc0Peer(broker.endpoint, broker.keys.public)
    try:
        watcher.send(b"", b"SUB", b"ID", b"watching", b"", *WATCHED)
        pytest_twisted.blockon(wait_until(lambda: watcher.messages, what="the watcher's OK"))
        assert watcher.messages == [[b"", b"OK", b"ID", b"watching"]]
        watcher.messages.clear()
        yield Fuzzed(broker, fuzzer, watcher)
    finally:
        fuzzer.close()
        watcher.close()
        pytest_twisted.blockon(broker.stopService())


@settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(batch=batches)
@pytest_twisted.inlineCallbacks
def test_broker_answers_garbage_as_the_oracle_says(fuzzed: Fuzzed, batch: list[Message]) -> Any:
    state = fuzzed
    broker = state.broker
    if not state.in_sync:
        # A previous example failed: take the broker's word for what the fuzzer holds.
        state.held = fuzzer_topics(broker)
        state.in_sync = True
    try:
        yield run_example(state, batch)
    except BaseException:
        state.in_sync = False
        raise


@pytest_twisted.inlineCallbacks
def run_example(state: Fuzzed, batch: list[Message]) -> Any:
    broker = state.broker
    state.examples += 1
    state.fuzzer.messages.clear()
    state.watcher.messages.clear()
    errors_before = Counter(broker.broker.errors.counts)
    expected = predict(batch, state.held)
    for frames in batch:
        if frames:
            state.fuzzer.send(*frames)
    probe = b"probe-%d" % state.examples
    state.fuzzer.send(b"", b"NOOP", b"ID", probe)
    yield wait_until(
        lambda: state.fuzzer.messages and state.fuzzer.messages[-1] == [b"", b"OK", b"ID", probe],
        what="the probe's OK",
    )
    got = state.fuzzer.messages[:-1]
    assert len(got) == len(expected.replies), (got, expected.replies)
    for reply, (verb, message_id, framing, exact) in zip(got, expected.replies, strict=True):
        check_reply(reply, verb, message_id, framing, exact)
    assert Counter(broker.broker.errors.counts) - errors_before == expected.reasons
    # The watcher's MESSAGEs were sent before the probe's OK: they are in by now or in flight.
    yield wait_until(lambda: len(state.watcher.messages) >= len(expected.watched))
    assert state.watcher.messages == expected.watched
    assert fuzzer_topics(broker) == state.held


def fuzzer_topics(broker: Any) -> set[bytes]:
    client = broker.broker.clients.get(FUZZER)
    return set(client.topics) if client is not None else set()


# -- frames past the socket's own limit ------------------------------------------------------------


@pytest_twisted.inlineCallbacks
def test_a_frame_over_the_socket_limit_drops_only_that_connection(tmp_path: Path) -> Any:
    import zmq

    broker = start_broker(tmp_path, broker=broker_settings(max_message_bytes=1024))
    rogue = RawMc0Peer(broker.endpoint, broker.keys.public)
    honest = RawMc0Peer(broker.endpoint, broker.keys.public)
    try:
        limit = broker.socket.socket.get(zmq.MAXMSGSIZE)
        assert limit > 1024
        rogue.send(b"", b"PUT", b"TOPIC", b"t", b"ID", b"r", b"", b"x" * (limit + 1))
        honest.send(b"", b"NOOP", b"ID", b"h")
        yield wait_until(lambda: honest.messages == [[b"", b"OK", b"ID", b"h"]])
        assert broker.broker.errors.total == 0 and rogue.messages == []
    finally:
        rogue.close()
        honest.close()
        yield broker.stopService()
