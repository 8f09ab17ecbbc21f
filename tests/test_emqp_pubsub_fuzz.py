"""Property-based fuzzing of a RUNNING eMQP PUBLISH service through real sockets.

Hypothesis generates batches of garbage (random frames, PUBLISHes with one frame corrupted,
dropped or added) among valid PUBLISHes and HEARTBEATs, sent by one DEALER to a service
shared by the module, with a plain SUB of every topic on its outgoing port. After every
example: the service still relays (a probe publication arrives), the SUB received exactly the
valid publications in order, and the drop counters grew by exactly what the codec's parser
(the oracle) says."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
import pytest_twisted
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bus.emqp import pubsub_codec
from bus.emqp.codec import EmqpError
from bus.emqp.pubsub_core import PubsubConfig
from bus.emqp.pubsub_server import PubsubService
from bus.testing import RawPeer, wait_until

Message = list[bytes]

texts = st.text(max_size=20).map(lambda t: t.encode("utf-8"))
ids = st.uuids(version=4).map(lambda u: str(u).encode())


@st.composite
def valid_messages(draw: st.DrawFn) -> Message:
    if draw(st.integers(0, 4)) == 0:
        return [b"", b"eMQP/1.0", b"HEARTBEAT", draw(ids), *draw(st.lists(texts, max_size=1))]
    return pubsub_codec.publish(draw(texts), draw(texts), draw(ids))


@st.composite
def corrupted(draw: st.DrawFn) -> Message:
    frames = list(draw(valid_messages()))
    index = draw(st.integers(0, len(frames) - 1))
    how = draw(st.sampled_from(["replace", "drop", "insert", "not-utf8", "large"]))
    if how == "replace":
        frames[index] = draw(st.binary(max_size=12))
    elif how == "drop":
        del frames[index]
    elif how == "insert":
        frames.insert(index, draw(st.binary(max_size=10)))
    elif how == "not-utf8":
        frames[index] = b"\xff" + frames[index]
    else:
        frames[index] = b"\x01" * draw(st.integers(1000, 60_000))
    return frames or [b""]


messages = st.lists(
    st.one_of(
        valid_messages(), corrupted(), st.lists(st.binary(max_size=30), min_size=1, max_size=8)
    ),
    min_size=1,
    max_size=30,
)


def test_the_codec_raises_only_its_own_error() -> None:
    @given(frames=st.lists(st.binary(max_size=40), max_size=9))
    @settings(max_examples=500, deadline=None)
    def parse_anything(frames: Message) -> None:
        try:
            command = pubsub_codec.parse(frames)
        except EmqpError as error:
            assert error.reason
        else:
            assert isinstance(command, pubsub_codec.Publish | pubsub_codec.Heartbeat)

    parse_anything()


@dataclass
class Fuzzed:
    service: PubsubService
    publisher: RawPeer
    subscriber: RawPeer
    examples: int = 0


@pytest.fixture(scope="module")
def fuzzed() -> Iterator[Fuzzed]:
    service = PubsubService(PubsubConfig(incoming_port=0, outgoing_port=0, stats_interval=0))
    service.startService()
    publisher = RawPeer.dealer(service.endpoints["incoming"])
    subscriber = RawPeer.sub(service.endpoints["outgoing"], (b"",))
    try:
        while not subscriber.messages:  # the SUB has joined: nothing is lost to a slow join
            publisher.send(pubsub_codec.publish(b"join", b"", b"j"))
            pytest_twisted.blockon(
                wait_until(lambda: subscriber.messages, timeout=0.1).addErrback(lambda _: None)
            )
        # A later "join" may still be on its way when the SUB has an earlier one: it would
        # come in the first example's messages. One more, last, and all are in once it is.
        publisher.send(pubsub_codec.publish(b"joined", b"", b"j"))
        pytest_twisted.blockon(
            wait_until(lambda: [b"joined", b""] in subscriber.messages, what="the last join")
        )
        yield Fuzzed(service, publisher, subscriber)
    finally:
        publisher.close()
        subscriber.close()
        pytest_twisted.blockon(service.stopService())


@settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(batch=messages)
@pytest_twisted.inlineCallbacks
def test_the_service_survives_garbage_and_accounts_for_every_message(
    fuzzed: Fuzzed, batch: list[Message]
) -> Any:
    relay = fuzzed.service.relay
    fuzzed.examples += 1
    drops_before = Counter(relay.drops.counts)
    heartbeats_before = relay.heartbeats
    del fuzzed.subscriber.messages[:]
    expected_drops: Counter[str] = Counter()
    expected_out: list[Message] = []
    heartbeats = 0
    for frames in batch:
        try:
            command = pubsub_codec.parse(frames)
        except EmqpError as error:
            expected_drops[error.reason] += 1
        else:
            if isinstance(command, pubsub_codec.Publish):
                expected_out.append([command.topic, command.message])
            else:
                heartbeats += 1
        fuzzed.publisher.send(frames)
    probe = [b"probe", b"%d" % fuzzed.examples]
    fuzzed.publisher.send(pubsub_codec.publish(*probe, b"p"))
    yield wait_until(lambda: probe in fuzzed.subscriber.messages, what="the probe")
    assert fuzzed.subscriber.messages == [*expected_out, probe]
    assert Counter(relay.drops.counts) - drops_before == expected_drops
    assert relay.drops.total - sum(drops_before.values()) == sum(expected_drops.values())
    assert relay.heartbeats - heartbeats_before == heartbeats
    assert fuzzed.service.running and fuzzed.service.unsent == 0
