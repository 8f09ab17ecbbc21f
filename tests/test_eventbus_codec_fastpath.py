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


def as_collected(frames: list[bytes]) -> list[bytes]:
    """A PUB as the collector reads it: 7 frames starting empty carry a REQ-style delimiter."""
    return frames[1:] if len(frames) == 7 and not frames[0] else frames


def batch_outcomes(parser: codec.PubParser, messages: list[list[bytes]]) -> list[object]:
    """What ``parser`` made of each message: its fields, or the reason it was refused."""
    accepted, refused = parser.parse_batch([[b"id-%d" % i, *m] for i, m in enumerate(messages)])
    reasons = {identity: error.reason for identity, error in refused}
    kept = iter(accepted)
    return [
        ("error", reasons[b"id-%d" % i]) if b"id-%d" % i in reasons else ("ok", next(kept))
        for i in range(len(messages))
    ]


@settings(max_examples=600, deadline=None)
@given(
    st.lists(st.tuples(st.integers(0, 5), field_values), max_size=3),
    st.integers(4, 8),
)
def test_batch_parser_matches_reference_with_fields_remembered(
    mutations: list[tuple[int, bytes]], count: int
) -> None:
    # The valid PUB first: its topic, producer and timestamp are then remembered, and the
    # mutated one takes the parser's shortest path wherever those three still match.
    frames = list(VALID)
    for index, value in mutations:
        frames[index] = value
    frames = (frames + [b"extra"] * 3)[:count]
    parser = codec.PubParser(64)
    got = batch_outcomes(parser, [list(VALID), frames, frames])
    expected = [outcome(codec.parse_pub, as_collected(m)) for m in (list(VALID), frames, frames)]
    assert got == expected


@settings(max_examples=300, deadline=None)
def one_byte_changed(value: tuple[object, int, bytes]) -> bytes:
    """A uuid's text with the byte at an index replaced."""
    text, index, byte = str(value[0]).encode(), value[1], value[2]
    return text[:index] + byte + text[index + 1 :]


uuid_texts = (
    st.binary(min_size=36, max_size=36)
    | st.uuids().map(lambda u: str(u).encode())
    | st.uuids().map(lambda u: str(u).upper().encode())
    | st.tuples(st.uuids(), st.integers(0, 35), st.binary(min_size=1, max_size=1)).map(
        one_byte_changed
    )
)


@given(uuid_texts, st.booleans())
def test_batch_parser_checks_each_uuid_as_the_reference(uuid_: bytes, delimited: bool) -> None:
    parser = codec.PubParser(64)
    changed = [*VALID[:4], uuid_, VALID[5]]
    # With and without a REQ-style empty delimiter after the identity.
    messages = [list(VALID), changed]
    accepted, refused = parser.parse_batch(
        [[b"id", *([b""] if delimited else []), *m] for m in messages]
    )
    assert batch_outcomes(parser, [changed]) == [outcome(codec.parse_pub, changed)]
    assert len(accepted) + len(refused) == 2


def test_batch_parser_forgets_at_its_bound_and_takes_a_req_delimiter() -> None:
    parser = codec.PubParser(64, remember=4)
    messages = [[b"/t/%d/" % i, *VALID[1:]] for i in range(10)]
    accepted, refused = parser.parse_batch([[b"id", b"", *m] for m in messages])
    assert not refused
    assert [fields[0] for fields in accepted] == [m[0] for m in messages]
    assert len(parser._topics) <= 4
    accepted, refused = parser.parse_batch([[b"id", *m] for m in messages])
    assert len(accepted) == 10 and not refused
    # A remembered topic does not let a bad uuid or payload through.
    bad = [[*messages[9][:4], b"x" * 36, VALID[5]], [*messages[9][:5], b"\xc1"]]
    accepted, refused = parser.parse_batch([[b"id", *m] for m in bad])
    assert not accepted
    assert [error.reason for _, error in refused] == ["bad-uuid", "bad-payload"]
