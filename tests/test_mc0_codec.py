"""The mc0 codec: both framings, header pairs, every malformed input one Mc0Error with the ID
when it could be read, and decode(encode(x)) == x for every command (hypothesis)."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from bus.errors import ProtocolError
from bus.mc0 import codec
from bus.mc0.codec import (
    Connect,
    Disconnect,
    Error,
    Framing,
    Mc0Error,
    Message,
    Noop,
    Ok,
    Put,
    Subscribe,
    Unsubscribe,
)

D, S = Framing.DELIMITED, Framing.SPEC


# -- the real implementations' frames (README, mc0 section) -----------------------------------


def test_the_real_connectors_connect() -> None:
    frames = [b"", b"CONNECT", b"ID", b"c1", b"TTL", b"30000", b"VERSION", b"0.2"]
    assert codec.decode_client(frames) == Connect(30000, b"0.2", b"c1", D)


def test_the_torture_tools_connect_has_neither_ttl_nor_version() -> None:
    frames = [b"", b"CONNECT", b"ID", b"chattyClient 3"]
    assert codec.decode_client(frames) == Connect(None, None, b"chattyClient 3", D)


def test_the_specs_connect_without_delimiter() -> None:
    assert codec.decode_client([b"CONNECT", b"VERSION", b"0.1", b"TTL", b"1000"]) == Connect(
        1000, b"0.1", None, S
    )


def test_sub_and_unsub_carry_topics_after_the_delimiter() -> None:
    assert codec.decode_client([b"SUB", b"", b"t1", b"t2"]) == Subscribe((b"t1", b"t2"), None, S)
    assert codec.decode_client([b"", b"UNSUB", b"ID", b"9", b"", b"t1"]) == Unsubscribe(
        (b"t1",), b"9", D
    )
    assert codec.decode_client([b"SUB"]) == Subscribe((), None, S)


def test_put_keeps_its_headers_but_id_for_the_message() -> None:
    frames = [b"", b"PUT", b"TOPIC", b"t", b"ID", b"7", b"X-a", b"", b"", b"b1", b"b2"]
    put = codec.decode_client(frames)
    assert put == Put(b"t", ((b"TOPIC", b"t"), (b"X-a", b"")), (b"b1", b"b2"), b"7", D)
    assert isinstance(put, Put)
    assert codec.message_frames(put, D) == [
        b"",
        b"MESSAGE",
        b"TOPIC",
        b"t",
        b"X-a",
        b"",
        b"",
        b"b1",
        b"b2",
    ]
    assert codec.message_frames(put, S) == [
        b"MESSAGE",
        b"TOPIC",
        b"t",
        b"X-a",
        b"",
        b"",
        b"b1",
        b"b2",
    ]


def test_replies_in_the_real_brokers_order() -> None:
    assert codec.ok_frames(b"1", D) == [b"", b"OK", b"ID", b"1"]
    assert codec.ok_frames(b"1", S) == [b"OK", b"ID", b"1"]
    assert codec.error_frames(b"bad", b"2", D) == [b"", b"ERROR", b"MESSAGE", b"bad", b"ID", b"2"]
    assert codec.error_frames(b"bad", None, S) == [b"ERROR", b"MESSAGE", b"bad"]
    assert codec.noop_frames(D) == [b"", b"NOOP"]


def test_broker_messages_decode() -> None:
    assert codec.decode_broker([b"", b"OK", b"ID", b"1"]) == Ok(b"1")
    assert codec.decode_broker([b"ERROR", b"MESSAGE", b"no", b"ID", b"3"]) == Error(b"no", b"3")
    message = codec.decode_broker([b"", b"MESSAGE", b"TOPIC", b"t", b"", b"x"])
    assert message == Message(((b"TOPIC", b"t"),), (b"x",))
    assert isinstance(message, Message) and message.topic == b"t"
    assert codec.decode_broker([b"NOOP"]) == Noop(None, S)


# -- bad input ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("frames", "reason", "message_id"),
    [
        ([], "no-verb", None),
        ([b""], "no-verb", None),
        ([b"", b""], "no-verb", None),
        ([b"PUT", b"ID", b"5", b"TOPIC"], "odd-headers", b"5"),
        ([b"", b"NOOP", b"ID"], "odd-headers", None),
        ([b"", b"PUT", b"ID", b"6", b"", b"body"], "no-topic", b"6"),
        ([b"PUT", b"TOPIC", b"", b"ID", b"8"], "empty-topic", b"8"),
        ([b"PUT", b"TOPIC", b"t" * 1025], "long-topic", None),
        ([b"SUB", b"ID", b"4", b"", b"ok", b""], "empty-topic", b"4"),
        ([b"FROB", b"ID", b"9"], "unknown-verb", b"9"),
        ([b"", b"OK", b"ID", b"9"], "unknown-verb", b"9"),
        ([b"CONNECT", b"TTL", b"soon", b"ID", b"1"], "bad-ttl", b"1"),
        ([b"CONNECT", b"TTL", b"0"], "bad-ttl", None),
        ([b"CONNECT", b"TTL", b"99999999999"], "bad-ttl", None),
        ([b"CONNECT", b"TTL", "١٢".encode()], "bad-ttl", None),
        ([b"NOOP", b"ID", b"1", b"ID", b"2"], "duplicate-header", b"1"),
    ],
)
def test_malformed_messages_raise_one_error_with_the_id(
    frames: list[bytes], reason: str, message_id: bytes | None
) -> None:
    with pytest.raises(Mc0Error) as caught:
        codec.decode_client(frames)
    assert caught.value.reason == reason
    assert caught.value.message_id == message_id
    assert caught.value.framing is codec.framing_of(frames)
    assert isinstance(caught.value, ProtocolError)


def test_size_and_frame_limits() -> None:
    with pytest.raises(Mc0Error) as caught:
        codec.decode_client(
            [b"", b"PUT", b"ID", b"x", b"TOPIC", b"t", b"", b"a" * 100], max_bytes=50
        )
    assert (caught.value.reason, caught.value.message_id) == ("oversized", b"x")
    with pytest.raises(Mc0Error) as caught:
        codec.decode_client([b"SUB", b"ID", b"y", b"", *([b"t"] * 20)], max_frames=10)
    assert (caught.value.reason, caught.value.message_id) == ("too-many-frames", b"y")


def test_an_unknown_broker_verb_is_an_error() -> None:
    with pytest.raises(Mc0Error):
        codec.decode_broker([b"PUT", b"TOPIC", b"t"])


# -- round trips ----------------------------------------------------------------------------

tokens = st.binary(min_size=1, max_size=12)
ids = st.none() | st.binary(max_size=12)
framings = st.sampled_from(list(Framing))
topics = st.binary(min_size=1, max_size=20)
extra_headers = st.dictionaries(
    st.binary(min_size=1, max_size=8).filter(lambda k: k not in (b"ID", b"TOPIC")),
    st.binary(max_size=8),
    max_size=4,
).map(lambda d: tuple(d.items()))

client_commands = st.one_of(
    st.builds(
        Connect, st.none() | st.integers(1, codec.MAX_TTL_MS), st.none() | tokens, ids, framings
    ),
    st.builds(Disconnect, ids, framings),
    st.builds(Noop, ids, framings),
    st.builds(Subscribe, st.lists(topics, max_size=4).map(tuple), ids, framings),
    st.builds(Unsubscribe, st.lists(topics, max_size=4).map(tuple), ids, framings),
    st.builds(
        lambda topic, extra, body, message_id, framing: Put(
            topic, ((b"TOPIC", topic), *extra), body, message_id, framing
        ),
        topics,
        extra_headers,
        st.lists(st.binary(max_size=20), max_size=3).map(tuple),
        ids,
        framings,
    ),
)


@given(command=client_commands)
def test_client_commands_round_trip(command: Any) -> None:
    assert codec.decode_client(codec.encode(command)) == command


@given(
    message=st.one_of(
        st.builds(Ok, ids),
        st.builds(Error, st.binary(max_size=20), ids),
        st.builds(
            Message,
            extra_headers,
            st.lists(st.binary(max_size=20), max_size=3).map(tuple),
        ),
    ),
    framing=framings,
)
def test_broker_messages_round_trip(message: Any, framing: Framing) -> None:
    assert codec.decode_broker(codec.encode(message, framing)) == message


@given(
    frames=st.lists(
        st.binary(max_size=12)
        | st.sampled_from([b"", b"ID", b"PUT", b"SUB", b"TOPIC", b"CONNECT", b"TTL"]),
        max_size=12,
    )
)
def test_any_frames_decode_or_raise_mc0error(frames: list[bytes]) -> None:
    for decode in (codec.decode_client, codec.decode_broker):
        try:
            decode(frames)
        except Mc0Error as error:
            assert error.reason
