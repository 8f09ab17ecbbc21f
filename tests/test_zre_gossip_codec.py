"""ZGOSSIP's wire format (bus.zre.gossip_codec) against the frames the real zyre sent
(zyre git master d8370f7 on czmq 4.2.1, recorded on loopback), and fuzzed: any input parses
or raises GossipError, never anything else."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bus.zre import gossip_codec as wire
from bus.zre.gossip_codec import GossipError, GossipHello, GossipPing, Invalid, Pong, Publish

#: What a zyre client sent our hub, in order: HELLO, then its own tuple.
ZYRE_HELLO = b"\xaa\xa0\x01\x01"
ZYRE_PUBLISH = (
    b"\xaa\xa0\x02\x01 5E7EC7D314CE4EC8831E822576B85D5F"
    b"\x00\x00\x00\x15tcp://127.0.0.1:49152\x00\x00\x00\x00"
)
#: A zyre hub's answers: PONG to PING, INVALID to a PUBLISH from a client it forgot.
ZYRE_PONG = b"\xaa\xa0\x04\x01"
ZYRE_INVALID = b"\xaa\xa0\x05\x01"


def test_what_zyre_sent_parses_and_encodes_back_octet_for_octet() -> None:
    assert wire.parse([ZYRE_HELLO]) == GossipHello()
    publish = wire.parse([ZYRE_PUBLISH])
    assert publish == Publish("5E7EC7D314CE4EC8831E822576B85D5F", "tcp://127.0.0.1:49152", 0)
    assert wire.parse([ZYRE_PONG]) == Pong() and wire.parse([ZYRE_INVALID]) == Invalid()
    for frame in (ZYRE_HELLO, ZYRE_PUBLISH, ZYRE_PONG, ZYRE_INVALID):
        assert wire.encode(wire.parse([frame])) == frame
    assert wire.encode(GossipPing()) == b"\xaa\xa0\x03\x01"


@pytest.mark.parametrize(
    ("frames", "reason"),
    [
        ([b"\xaa\xa0\x01"], "truncated"),
        ([b"\xaa\xa1\x01\x01"], "signature"),
        ([b"\xaa\xa0\x01\x02"], "version"),
        ([b"\xaa\xa0\x09\x01"], "command"),
        ([b"\xaa\xa0\x01\x01x"], "trailing"),
        ([ZYRE_PUBLISH[:-1]], "truncated"),
        ([ZYRE_PUBLISH + b"x"], "trailing"),
        ([b"\xaa\xa0\x02\x01\x01\xff\x00\x00\x00\x00\x00\x00\x00\x00"], "bad-string"),
        ([ZYRE_HELLO, b""], "frames"),
        ([], "frames"),
    ],
)
def test_malformed_messages_raise_with_their_reason(frames: list[bytes], reason: str) -> None:
    with pytest.raises(GossipError) as caught:
        wire.parse(frames)
    assert caught.value.reason == reason


def test_a_key_longer_than_its_length_octet_is_refused_when_encoding() -> None:
    with pytest.raises(ValueError):
        wire.encode(Publish("k" * 256, "v"))


@settings(max_examples=400, deadline=None)
@given(st.text(max_size=255), st.text(max_size=300), st.integers(0, 0xFFFFFFFF))
def test_publish_round_trips(key: str, value: str, ttl: int) -> None:
    message = Publish(key, value, ttl)
    if len(key.encode()) > 255:
        with pytest.raises(ValueError):
            wire.encode(message)
        return
    assert wire.parse([wire.encode(message)]) == message


@settings(max_examples=1500, deadline=None)
@given(
    st.lists(
        st.one_of(
            st.binary(max_size=80),
            st.builds(lambda tail: b"\xaa\xa0" + tail, st.binary(max_size=80)),
            st.builds(
                lambda c, tail: b"\xaa\xa0" + bytes((c, 1)) + tail,
                st.integers(0, 7),
                st.binary(max_size=60),
            ),
        ),
        max_size=3,
    )
)
def test_any_input_parses_or_raises_gossip_error(frames: list[bytes]) -> None:
    try:
        message = wire.parse(frames)
    except GossipError as error:
        assert error.reason
    else:
        assert wire.encode(message) == frames[0]
