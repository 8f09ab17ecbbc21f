"""The collector's inlined validation agrees with the reference parser on every input."""

from __future__ import annotations

import uuid

import msgpack
from hypothesis import given, settings
from hypothesis import strategies as st

from bus.eventbus import codec
from bus.eventbus.codec import EventBusError

VALID = [
    b"/a/b/",
    b"\x00" * 8,
    b"producer",
    b"2026-11-21T10:00:00.123Z",
    str(uuid.uuid4()).encode(),
    msgpack.packb({"a": [1, 2.5, "x"]}),
]

field_values = st.one_of(
    st.binary(max_size=48),
    st.sampled_from(
        [b"", b"null", b"42", b"$x", b"\xff", b"yesterday", b"\xc1", b"12345678", *VALID]
    ),
)


def outcome(function: object, frames: list[bytes]) -> object:
    try:
        result = function(frames, 64)  # type: ignore[operator]
    except EventBusError as error:
        return ("error", error.reason)
    if isinstance(result, codec.Event):
        return ("ok", (result.topic, result.producer, result.timestamp, result.uuid, result.data))
    return ("ok", result)


@settings(max_examples=600, deadline=None)
@given(
    st.lists(st.tuples(st.integers(0, 5), field_values), max_size=3),
    st.integers(4, 8),
)
def test_fast_path_matches_reference(mutations: list[tuple[int, bytes]], count: int) -> None:
    frames = list(VALID)
    for index, value in mutations:
        frames[index] = value
    frames = (frames + [b"extra"] * 3)[:count]
    assert outcome(codec.parse_pub_fields, frames) == outcome(codec.parse_pub, frames)


def test_fast_path_accepts_the_original_dialect_and_rejects_reserved_topics() -> None:
    assert codec.parse_pub_fields([VALID[0], b"null", *VALID[2:]])[0] == b"/a/b/"
    assert codec.parse_pub_fields([VALID[0], b"17", *VALID[2:]])[0] == b"/a/b/"
    try:
        codec.parse_pub_fields([b"$heartbeat", *VALID[1:]])
    except EventBusError as error:
        assert error.reason == "reserved-topic"
    else:
        raise AssertionError("reserved topic accepted")
