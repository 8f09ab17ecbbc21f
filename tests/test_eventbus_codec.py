"""The Event BUS codec (sans-I/O): every function, both dialects, every error reason, and
hypothesis properties (nothing but EventBusError escapes; encode -> decode round trips)."""

from __future__ import annotations

import struct
import uuid
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import msgpack
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bus.errors import ProtocolError
from bus.eventbus import codec
from bus.eventbus.codec import (
    HEARTBEAT_TOPIC,
    MAX_SEQUENCE,
    SYNC,
    SYNCEND,
    SYNCSTART,
    Event,
    EventBusError,
    Heartbeat,
    SequenceEncoding,
    SnapshotEnd,
    SnapshotRequest,
)

BINARY = SequenceEncoding.BINARY
TEXT = SequenceEncoding.TEXT
UUID = b"0f8fad5b-d9cb-469f-a165-70867728950e"
TIMESTAMP = b"2026-11-21T10:00:00.123Z"
DATA = msgpack.packb({"answer": 42})
#: The smallest 64-bit value whose 8 network-order bytes are all ASCII digits ("00000000").
FIRST_AMBIGUOUS = 0x3030303030303030

#: Every reason the Event BUS codec may give.
REASONS = {
    "frame-count",
    "bad-sequence",
    "bad-topic",
    "reserved-topic",
    "bad-producer",
    "bad-timestamp",
    "bad-uuid",
    "bad-payload",
    "oversized",
    "unknown-command",
    "bad-heartbeat",
}


def good_pub(**fields: bytes) -> list[bytes]:
    values = {
        "topic": b"/orders/1/",
        "sequence": b"\x00" * 8,
        "producer": b"producer-1",
        "timestamp": TIMESTAMP,
        "uuid": UUID,
        "data": DATA,
    }
    values.update(fields)
    return [
        values["topic"],
        values["sequence"],
        values["producer"],
        values["timestamp"],
        values["uuid"],
        values["data"],
    ]


def reason_of(call: Any, *args: Any) -> str:
    with pytest.raises(EventBusError) as caught:
        call(*args)
    assert isinstance(caught.value, ProtocolError)
    assert isinstance(caught.value, ValueError)
    assert str(caught.value), "an error must carry a message"
    return caught.value.reason


# -- errors ------------------------------------------------------------------------------


def test_protocol_error_reason_defaults_and_overrides() -> None:
    assert ProtocolError("x").reason == "malformed"
    assert ProtocolError("x", "custom").reason == "custom"
    assert EventBusError("x", "bad-uuid").reason == "bad-uuid"
    assert str(EventBusError("the message", "r")) == "the message"
    # The class default is not changed by an instance's reason.
    assert EventBusError.reason == "malformed"


# -- sequences -----------------------------------------------------------------------------


def test_encode_sequence_binary_is_8_bytes_network_order() -> None:
    assert codec.encode_sequence(0) == b"\x00" * 8
    assert codec.encode_sequence(1, BINARY) == b"\x00" * 7 + b"\x01"
    assert codec.encode_sequence(0x0102030405060708, BINARY) == bytes(range(1, 9))
    assert codec.encode_sequence(MAX_SEQUENCE, BINARY) == b"\xff" * 8


def test_encode_sequence_text_is_ascii_decimal() -> None:
    assert codec.encode_sequence(0, TEXT) == b"0"
    assert codec.encode_sequence(42, TEXT) == b"42"
    assert codec.encode_sequence(MAX_SEQUENCE, TEXT) == b"18446744073709551615"


@pytest.mark.parametrize(
    ("frame", "expected"),
    [
        (b"\x00" * 8, (0, BINARY)),
        (b"\x00" * 7 + b"\x2a", (42, BINARY)),
        (b"\xff" * 8, (MAX_SEQUENCE, BINARY)),
        (b"0", (0, TEXT)),
        (b"42", (42, TEXT)),
        (b"007", (7, TEXT)),
        (b"18446744073709551615", (MAX_SEQUENCE, TEXT)),
        (b"null", (None, TEXT)),
        (b"", (None, None)),
    ],
)
def test_decode_sequence_both_dialects(frame: bytes, expected: tuple[Any, Any]) -> None:
    assert codec.decode_sequence(frame) == expected


def test_eight_ascii_digits_are_read_as_decimal_not_binary() -> None:
    # The ambiguity rule: 8 ASCII digits would be >= 0x3030303030303030 read as binary.
    assert codec.decode_sequence(b"12345678") == (12345678, TEXT)
    assert codec.decode_sequence(b"00000000") == (0, TEXT)
    # So a binary sequence whose bytes happen to be digits does not survive...
    assert codec.encode_sequence(FIRST_AMBIGUOUS, BINARY) == b"00000000"
    assert codec.decode_sequence(codec.encode_sequence(FIRST_AMBIGUOUS)) == (0, TEXT)
    # ...but one just below (last byte "/", 0x2f) does: it is not all digits.
    below = FIRST_AMBIGUOUS - 1
    assert codec.encode_sequence(below) == b"0000000/"
    assert codec.decode_sequence(codec.encode_sequence(below)) == (below, BINARY)
    # Eight bytes that are not all digits are binary even if most are.
    assert codec.decode_sequence(b"1234567a") == (int.from_bytes(b"1234567a", "big"), BINARY)


@pytest.mark.parametrize(
    "frame",
    [
        b"\x01\x02\x03",  # neither 8 bytes nor digits
        b"\x00" * 7,
        b"\x00" * 9,
        b"-1",
        b"+1",
        b" 1",
        b"1 ",
        b"1.5",
        b"NULL",
        b"nul",
        b"18446744073709551616",  # 2**64: out of range
        b"99999999999999999999",  # 20 digits, out of range
        b"1" * 21,  # too many digits
        "\uff14\uff12".encode(),  # fullwidth (non-ASCII) digits
    ],
)
def test_decode_sequence_rejects_bad_frames(frame: bytes) -> None:
    assert reason_of(codec.decode_sequence, frame) == "bad-sequence"


# -- field checks --------------------------------------------------------------------------


def test_check_topic() -> None:
    codec.check_topic(b"/a/")
    codec.check_topic("/ünïcode/".encode())
    codec.check_topic(b"x" * codec.MAX_TOPIC_BYTES)
    assert reason_of(codec.check_topic, b"") == "bad-topic"
    assert reason_of(codec.check_topic, b"/\xff/") == "bad-topic"
    assert reason_of(codec.check_topic, b"x" * (codec.MAX_TOPIC_BYTES + 1)) == "oversized"


@pytest.mark.parametrize(
    "timestamp",
    [
        TIMESTAMP,  # the original's UTC with milliseconds and Z
        b"2026-11-21T10:00:00",
        b"2026-11-21T10:00:00.123456+02:00",
        b"2026-11-21",
        b"2026-11-21 10:00:00-05:30",
    ],
)
def test_check_timestamp_accepts_iso8601(timestamp: bytes) -> None:
    codec.check_timestamp(timestamp)


@pytest.mark.parametrize(
    "timestamp",
    [
        b"",
        b"yesterday at noon",
        b"2026-13-01T00:00:00",
        b"2026-02-30",
        b"2026-11-21T25:00:00",
        b"2026-11-21T10:00:00+24:00",
        "2026-11-21T10:00:00\u00a0".encode(),  # not ASCII
        b"\xff\xfe",
        b"2026-11-21T10:00:00" + b"0" * 60,  # longer than 64 bytes
    ],
)
def test_check_timestamp_rejects(timestamp: bytes) -> None:
    assert reason_of(codec.check_timestamp, timestamp) == "bad-timestamp"


@pytest.mark.parametrize("tail", [b"\x00", b"\x00<script>", b"\x00 and more text"])
def test_timestamp_with_bytes_after_a_nul_is_rejected(tail: bytes) -> None:
    timestamp = TIMESTAMP + tail  # "2026-11-21T10:00:00.123Z\x00..."
    assert reason_of(codec.check_timestamp, timestamp) == "bad-timestamp"
    assert reason_of(codec.parse_pub, good_pub(timestamp=timestamp)) == "bad-timestamp"
    assert reason_of(codec.parse_pub_fields, good_pub(timestamp=timestamp)) == "bad-timestamp"


def test_check_uuid() -> None:
    codec.check_uuid(UUID)
    codec.check_uuid(UUID.upper())
    codec.check_uuid(str(uuid.uuid4()).encode())
    for bad in [
        b"",
        b"not-a-uuid",
        UUID[:-1],
        UUID + b"0",
        UUID.replace(b"-", b""),
        b"{" + UUID + b"}",
    ]:
        assert reason_of(codec.check_uuid, bad) == "bad-uuid", bad
    assert reason_of(codec.check_uuid, UUID + b"\n") == "bad-uuid"
    assert reason_of(codec.check_uuid, UUID.replace(b"0", b"g", 1)) == "bad-uuid"


def test_check_payload() -> None:
    codec.check_payload(msgpack.packb(None))
    codec.check_payload(msgpack.packb({"a": [1, 2.5, b"x", "y"]}))
    codec.check_payload(msgpack.packb({1: 2}))  # non-string map keys are allowed
    assert reason_of(codec.check_payload, b"") == "bad-payload"
    assert reason_of(codec.check_payload, b"\xc1") == "bad-payload"  # never-used byte
    assert reason_of(codec.check_payload, b"\x01\x02") == "bad-payload"  # two objects
    assert reason_of(codec.check_payload, b"\x92\x01") == "bad-payload"  # truncated
    assert reason_of(codec.check_payload, b"\xdd\xff\xff\xff\xff") == "bad-payload"
    data = msgpack.packb(b"x" * 100)
    codec.check_payload(data, max_bytes=len(data))
    assert reason_of(codec.check_payload, data, len(data) - 1) == "oversized"


# -- PUB -----------------------------------------------------------------------------------


def test_parse_pub_returns_the_fields_with_sequence_zero() -> None:
    event = codec.parse_pub(good_pub())
    assert event == Event(b"/orders/1/", 0, b"producer-1", TIMESTAMP, UUID, DATA)
    assert event.topic_name == "/orders/1/"
    assert event.producer_id == "producer-1"
    assert event.event_id == UUID.decode()
    assert event.time == datetime(2026, 11, 21, 10, 0, 0, 123000, tzinfo=UTC)
    assert event.value() == {"answer": 42}


@pytest.mark.parametrize(
    "sequence",
    [b"\x00" * 8, b"\x00" * 7 + b"\x07", b"null", b"", b"0", b"42", b"12345678"],
)
def test_parse_pub_accepts_both_dialects_and_ignores_the_sequence(sequence: bytes) -> None:
    assert codec.parse_pub(good_pub(sequence=sequence)).sequence == 0


def test_parse_pub_accepts_empty_producer_and_naive_timestamp() -> None:
    event = codec.parse_pub(good_pub(producer=b"", timestamp=b"2026-11-21T10:00:00"))
    assert event.producer == b""
    assert event.time == datetime(2026, 11, 21, 10, 0, 0)
    assert event.time.tzinfo is None


@pytest.mark.parametrize(
    ("frames", "reason"),
    [
        ([], "frame-count"),
        (good_pub()[:5], "frame-count"),
        ([*good_pub(), b""], "frame-count"),
        (good_pub(topic=b""), "bad-topic"),
        (good_pub(topic=b"\xc3\x28"), "bad-topic"),
        (good_pub(topic=b"/" * (codec.MAX_TOPIC_BYTES + 1)), "oversized"),
        (good_pub(topic=HEARTBEAT_TOPIC), "reserved-topic"),
        (good_pub(topic=b"$anything"), "reserved-topic"),
        (good_pub(sequence=b"\x01\x02\x03"), "bad-sequence"),
        (good_pub(sequence=b"18446744073709551616"), "bad-sequence"),
        (good_pub(producer=b"\xff"), "bad-producer"),
        (good_pub(producer=b"p" * (codec.MAX_PRODUCER_BYTES + 1)), "oversized"),
        (good_pub(timestamp=b"noon"), "bad-timestamp"),
        (good_pub(uuid=b"not-a-uuid"), "bad-uuid"),
        (good_pub(data=b"\xc1"), "bad-payload"),
        (good_pub(data=b""), "bad-payload"),
    ],
)
def test_parse_pub_rejects(frames: list[bytes], reason: str) -> None:
    assert reason_of(codec.parse_pub, frames) == reason


def test_parse_pub_data_limit() -> None:
    data = msgpack.packb(b"x" * 1000)
    assert codec.parse_pub(good_pub(data=data), max_data_bytes=len(data)).data == data
    assert reason_of(codec.parse_pub, good_pub(data=data), len(data) - 1) == "oversized"
    big = msgpack.packb(b"x" * codec.DEFAULT_MAX_DATA_BYTES)
    assert reason_of(codec.parse_pub, good_pub(data=big)) == "oversized"


def test_parse_pub_fields_is_parse_pub_without_the_event() -> None:
    for sequence in [b"\x00" * 8, b"null", b"", b"42", b"12345678"]:
        frames = good_pub(sequence=sequence)
        assert codec.parse_pub_fields(frames) == (
            b"/orders/1/",
            b"producer-1",
            TIMESTAMP,
            UUID,
            DATA,
        )
    data = msgpack.packb(b"x" * 10)
    assert codec.parse_pub_fields(good_pub(data=data), len(data))[4] == data


@pytest.mark.parametrize(
    ("frames", "reason"),
    [
        (good_pub()[:5], "frame-count"),
        (good_pub(topic=b""), "bad-topic"),
        (good_pub(topic=b"$x"), "reserved-topic"),
        (good_pub(topic=b"\xff"), "bad-topic"),
        (good_pub(sequence=b"\x00" * 7), "bad-sequence"),
        (good_pub(producer=b"\xff"), "bad-producer"),
        (good_pub(producer=b"p" * (codec.MAX_PRODUCER_BYTES + 1)), "oversized"),
        (good_pub(timestamp=b"noon"), "bad-timestamp"),
        (good_pub(uuid=UUID[1:]), "bad-uuid"),
        (good_pub(data=b"\xc1"), "bad-payload"),
        (good_pub(data=msgpack.packb(b"x" * codec.DEFAULT_MAX_DATA_BYTES)), "oversized"),
    ],
)
def test_parse_pub_fields_rejects_like_parse_pub(frames: list[bytes], reason: str) -> None:
    assert reason_of(codec.parse_pub_fields, frames) == reason
    assert reason_of(codec.parse_pub, frames) == reason


def test_broadcast_messages_number_events_consecutively() -> None:
    fields = [(b"/a/", b"p", TIMESTAMP, UUID, DATA), (b"/b/", b"q", TIMESTAMP, UUID, DATA)]
    assert codec.broadcast_messages(7, fields, TEXT) == [
        [b"/a/", b"7", b"p", TIMESTAMP, UUID, DATA],
        [b"/b/", b"8", b"q", TIMESTAMP, UUID, DATA],
    ]
    binary = codec.broadcast_messages(MAX_SEQUENCE - 1, fields, BINARY)
    assert [m[1] for m in binary] == [b"\xff" * 7 + b"\xfe", b"\xff" * 8]
    assert codec.broadcast_messages(1, [], BINARY) == []
    for i, message in enumerate(codec.broadcast_messages(5, fields, BINARY)):
        assert message == codec.broadcast_frames(Event(fields[i][0], 5 + i, *fields[i][1:]), BINARY)


def test_pub_frames_is_the_texts_pub() -> None:
    frames = codec.pub_frames(b"/t/", b"p", TIMESTAMP, UUID, DATA)
    assert frames == [b"/t/", b"\x00" * 8, b"p", TIMESTAMP, UUID, DATA]
    assert codec.parse_pub(frames) == Event(b"/t/", 0, b"p", TIMESTAMP, UUID, DATA)


# -- SYNCSTART -----------------------------------------------------------------------------


def test_parse_sync_start_three_frames_binary() -> None:
    request = codec.parse_sync_start([SYNCSTART, b"/a/;/b/", struct.pack(">Q", 7)])
    assert request == SnapshotRequest((b"/a/", b"/b/"), 7, b"/a/;/b/", BINARY)


def test_parse_sync_start_original_dialect_comma_and_text() -> None:
    request = codec.parse_sync_start([SYNCSTART, b"/a/,/b/", b"12"])
    assert request.subtrees == (b"/a/", b"/b/")
    assert request.since == 12
    assert request.encoding is TEXT
    assert request.spec == b"/a/,/b/"


def test_parse_sync_start_two_frames_means_zero() -> None:
    request = codec.parse_sync_start([SYNCSTART, b"/x/"])
    assert request == SnapshotRequest((b"/x/",), 0, b"/x/", None)


@pytest.mark.parametrize(("sequence", "encoding"), [(b"null", TEXT), (b"", None)])
def test_parse_sync_start_without_sequence_value(sequence: bytes, encoding: Any) -> None:
    request = codec.parse_sync_start([SYNCSTART, b"", sequence])
    assert request.since == 0
    assert request.encoding is encoding


def test_subtree_specifications() -> None:
    assert codec.split_subtrees(b"") == ()
    assert codec.split_subtrees(b"/a/") == (b"/a/",)
    assert codec.split_subtrees(b"/a/;/b/,/c/") == (b"/a/", b"/b/", b"/c/")
    assert codec.split_subtrees(b";;/a/,,;") == (b"/a/",)  # empty parts are dropped
    assert codec.split_subtrees(b";,") == ()
    everything = codec.parse_sync_start([SYNCSTART, b"", b"0"])
    assert everything.subtrees == ()
    assert everything.matches(b"/anything/")
    assert everything.matches(b"$heartbeat")
    some = codec.parse_sync_start([SYNCSTART, b"/a/;/b", b"0"])
    assert some.matches(b"/a/1/")
    assert some.matches(b"/b/")
    assert some.matches(b"/bee/")  # a plain string prefix, as in the original
    assert not some.matches(b"/c/")
    assert not some.matches(b"/a")  # shorter than the prefix
    only_separators = codec.parse_sync_start([SYNCSTART, b";", b"0"])
    assert only_separators.matches(b"/z/")


@pytest.mark.parametrize(
    ("frames", "reason"),
    [
        ([], "unknown-command"),
        ([b"HELLO"], "unknown-command"),
        ([b"syncstart", b"", b"0"], "unknown-command"),
        ([SYNC, b"", b"0"], "unknown-command"),
        ([SYNCSTART], "frame-count"),
        ([SYNCSTART, b"", b"0", b""], "frame-count"),
        ([SYNCSTART, b"", b"\x00\x01"], "bad-sequence"),  # the server's own test case
        ([SYNCSTART, b"", b"-5"], "bad-sequence"),
        ([SYNCSTART, b"/" * (codec.MAX_SUBTREE_SPEC_BYTES + 1), b"0"], "oversized"),
    ],
)
def test_parse_sync_start_rejects(frames: list[bytes], reason: str) -> None:
    assert reason_of(codec.parse_sync_start, frames) == reason


def test_parse_sync_start_accepts_the_largest_spec() -> None:
    spec = b"/" * codec.MAX_SUBTREE_SPEC_BYTES
    assert codec.parse_sync_start([SYNCSTART, spec]).spec == spec


def test_sync_start_frames_both_encodings() -> None:
    assert codec.sync_start_frames((b"/a/", b"/b/"), 5) == [
        SYNCSTART,
        b"/a/;/b/",
        b"\x00" * 7 + b"\x05",
    ]
    assert codec.sync_start_frames([b"/a/"], 5, TEXT) == [SYNCSTART, b"/a/", b"5"]
    assert codec.sync_start_frames((), 0) == [SYNCSTART, b"", b"\x00" * 8]


# -- server replies: BROADCAST, SYNC, SYNCEND, heartbeat ----------------------------------------

EVENT = Event(b"/t/", 3, b"p", TIMESTAMP, UUID, DATA)


def test_broadcast_sync_and_syncend_frames() -> None:
    seq3 = b"\x00" * 7 + b"\x03"
    assert codec.broadcast_frames(EVENT, BINARY) == [b"/t/", seq3, b"p", TIMESTAMP, UUID, DATA]
    assert codec.broadcast_frames(EVENT, TEXT) == [b"/t/", b"3", b"p", TIMESTAMP, UUID, DATA]
    assert codec.sync_frames(EVENT, BINARY) == [SYNC, b"/t/", seq3, b"p", TIMESTAMP, UUID, DATA]
    assert codec.sync_frames(EVENT, TEXT)[2] == b"3"
    assert codec.sync_end_frames(b"/a/;/b/", 9, BINARY) == [
        SYNCEND,
        b"/a/;/b/",
        b"\x00" * 7 + b"\t",
    ]
    assert codec.sync_end_frames(b"/a/,/b/", 9, TEXT) == [SYNCEND, b"/a/,/b/", b"9"]


def test_heartbeat_frames_and_parse() -> None:
    store_id = str(uuid.uuid4())
    frames = codec.heartbeat_frames(17, store_id, BINARY)
    assert frames == [HEARTBEAT_TOPIC, b"\x00" * 7 + b"\x11", store_id.encode()]
    assert codec.parse_published(frames) == Heartbeat(17, store_id)
    text = codec.heartbeat_frames(17, store_id, TEXT)
    assert text[1] == b"17"
    assert codec.parse_published(text) == Heartbeat(17, store_id)


@pytest.mark.parametrize(
    ("frames", "reason"),
    [
        ([HEARTBEAT_TOPIC, b"1"], "frame-count"),
        ([HEARTBEAT_TOPIC, b"1", b"id", b""], "frame-count"),
        ([HEARTBEAT_TOPIC, b"1", b"\xff"], "bad-heartbeat"),
        ([HEARTBEAT_TOPIC, b"null", b"id"], "bad-sequence"),
        ([HEARTBEAT_TOPIC, b"", b"id"], "bad-sequence"),
        ([HEARTBEAT_TOPIC, b"\x01", b"id"], "bad-sequence"),
        ([], "frame-count"),
        ([b"/t/", b"1"], "frame-count"),
        ([b"/t/", b"1", b"p", TIMESTAMP, UUID, DATA, b""], "frame-count"),
        ([b"/t/", b"null", b"p", TIMESTAMP, UUID, DATA], "bad-sequence"),
        ([b"/t/", b"", b"p", TIMESTAMP, UUID, DATA], "bad-sequence"),
        ([b"/t/", b"abc", b"p", TIMESTAMP, UUID, DATA], "bad-sequence"),
    ],
)
def test_parse_published_rejects(frames: list[bytes], reason: str) -> None:
    assert reason_of(codec.parse_published, frames) == reason


def test_parse_published_broadcast_both_encodings() -> None:
    for encoding in SequenceEncoding:
        assert codec.parse_published(codec.broadcast_frames(EVENT, encoding)) == EVENT


def test_parse_snapshot_reply_sync_and_syncend() -> None:
    for encoding in SequenceEncoding:
        assert codec.parse_snapshot_reply(codec.sync_frames(EVENT, encoding)) == EVENT
        end = codec.parse_snapshot_reply(codec.sync_end_frames(b"/a/", 99, encoding))
        assert end == SnapshotEnd(b"/a/", 99)


@pytest.mark.parametrize(
    ("frames", "reason"),
    [
        ([], "unknown-command"),
        ([b"HELLO"], "unknown-command"),
        ([SYNCSTART, b"", b"0"], "unknown-command"),
        ([b"/t/", b"1", b"p", TIMESTAMP, UUID, DATA], "unknown-command"),  # a BROADCAST
        ([SYNC], "frame-count"),
        ([SYNC, b"/t/", b"1", b"p", TIMESTAMP, UUID], "frame-count"),
        ([SYNC, b"/t/", b"1", b"p", TIMESTAMP, UUID, DATA, b""], "frame-count"),
        ([SYNC, b"/t/", b"null", b"p", TIMESTAMP, UUID, DATA], "bad-sequence"),
        ([SYNC, b"/t/", b"\x00", b"p", TIMESTAMP, UUID, DATA], "bad-sequence"),
        ([SYNCEND, b""], "frame-count"),
        ([SYNCEND, b"", b"1", b""], "frame-count"),
        ([SYNCEND, b"", b"null"], "bad-sequence"),
        ([SYNCEND, b"", b"x"], "bad-sequence"),
    ],
)
def test_parse_snapshot_reply_rejects(frames: list[bytes], reason: str) -> None:
    assert reason_of(codec.parse_snapshot_reply, frames) == reason


def test_event_time_and_value_accessors() -> None:
    naive = EVENT._replace(timestamp=b"2026-01-02T03:04:05")
    assert naive.time == datetime(2026, 1, 2, 3, 4, 5)
    offset = EVENT._replace(timestamp=b"2026-01-02T03:04:05+01:00")
    assert offset.time == datetime(2026, 1, 2, 2, 4, 5, tzinfo=UTC)
    with_bytes = EVENT._replace(data=msgpack.packb({"b": b"\x00", 1: [None]}))
    assert with_bytes.value() == {"b": b"\x00", 1: [None]}


# -- hypothesis: nothing but EventBusError escapes ---------------------------------------------

COMMAND_WORDS = [SYNCSTART, SYNC, SYNCEND, HEARTBEAT_TOPIC, b"", b"$", b"/t/"]
SEQUENCE_LIKE = [b"", b"null", b"0", b"00000000", b"\xff" * 8, b"18446744073709551616", b"1" * 21]

any_frame = st.binary(max_size=80)
#: Frames that look like a field (so deeper checks are reached) or are arbitrary bytes.
field_frame = st.one_of(
    any_frame,
    st.sampled_from(COMMAND_WORDS + SEQUENCE_LIKE),
    st.sampled_from([TIMESTAMP, UUID, DATA, b"2026-02-30", UUID.upper(), b"\xc1"]),
    st.integers(0, MAX_SEQUENCE).map(lambda n: struct.pack(">Q", n)),
    st.integers(0, 2**70).map(lambda n: b"%d" % n),
)


@st.composite
def near_valid(draw: st.DrawFn) -> list[bytes]:
    """A valid message of some kind with zero or more frames replaced, added or removed."""
    kind = draw(st.sampled_from(["pub", "syncstart", "sync", "syncend", "heartbeat"]))
    base = {
        "pub": good_pub(),
        "syncstart": [SYNCSTART, b"/a/;/b/", b"\x00" * 8],
        "sync": codec.sync_frames(EVENT, BINARY),
        "syncend": codec.sync_end_frames(b"/a/", 3, TEXT),
        "heartbeat": codec.heartbeat_frames(3, str(uuid.UUID(int=3)), BINARY),
    }[kind]
    frames = list(base)
    for _ in range(draw(st.integers(0, 3))):
        action = draw(st.sampled_from(["replace", "insert", "delete"]))
        if action == "replace" and frames:
            frames[draw(st.integers(0, len(frames) - 1))] = draw(field_frame)
        elif action == "insert":
            frames.insert(draw(st.integers(0, len(frames))), draw(field_frame))
        elif frames:
            del frames[draw(st.integers(0, len(frames) - 1))]
    return frames


frame_lists = st.one_of(
    st.lists(any_frame, max_size=9),
    st.lists(field_frame, max_size=9),
    near_valid(),
)

RESULT_TYPES = {
    codec.parse_pub: (Event,),
    codec.parse_sync_start: (SnapshotRequest,),
    codec.parse_published: (Event, Heartbeat),
    codec.parse_snapshot_reply: (Event, SnapshotEnd),
}


def _parses_or_raises_event_bus_error(parse: Any, frames: list[bytes]) -> None:
    try:
        result = parse(frames)
    except EventBusError as error:
        assert error.reason in REASONS
        assert str(error)
        return
    assert isinstance(result, RESULT_TYPES[parse])


# Not @pytest.mark.parametrize: pytest-twisted 1.14 wraps a hypothesis test's inner test
# once per collected item on the shared function object, so parametrized @given tests
# nest the wrappers and fail with "blockon cannot be called from the twisted greenlet".
FUZZ = settings(max_examples=400, suppress_health_check=[HealthCheck.too_slow], deadline=None)


@FUZZ
@given(frames=frame_lists)
def test_parse_pub_returns_a_value_or_raises_event_bus_error(frames: list[bytes]) -> None:
    _parses_or_raises_event_bus_error(codec.parse_pub, frames)


@FUZZ
@given(frames=frame_lists)
def test_parse_sync_start_returns_a_value_or_raises_event_bus_error(frames: list[bytes]) -> None:
    _parses_or_raises_event_bus_error(codec.parse_sync_start, frames)


@FUZZ
@given(frames=frame_lists)
def test_parse_published_returns_a_value_or_raises_event_bus_error(frames: list[bytes]) -> None:
    _parses_or_raises_event_bus_error(codec.parse_published, frames)


@FUZZ
@given(frames=frame_lists)
def test_parse_snapshot_reply_returns_a_value_or_raises_event_bus_error(
    frames: list[bytes],
) -> None:
    _parses_or_raises_event_bus_error(codec.parse_snapshot_reply, frames)


@FUZZ
@given(frames=frame_lists, max_data=st.sampled_from([0, 1, 64, codec.DEFAULT_MAX_DATA_BYTES]))
def test_parse_pub_fields_returns_what_parse_pub_returns_or_the_same_error(
    frames: list[bytes], max_data: int
) -> None:
    try:
        event = codec.parse_pub(frames, max_data)
    except EventBusError as error:
        with pytest.raises(EventBusError) as fast_error:
            codec.parse_pub_fields(frames, max_data)
        assert fast_error.value.reason == error.reason
        return
    fields = codec.parse_pub_fields(frames, max_data)
    assert fields == (event.topic, event.producer, event.timestamp, event.uuid, event.data)


@settings(max_examples=200, deadline=None)
@given(frame=st.binary(max_size=24))
def test_decode_sequence_returns_or_raises_event_bus_error(frame: bytes) -> None:
    try:
        value, encoding = codec.decode_sequence(frame)
    except EventBusError as error:
        assert error.reason == "bad-sequence"
        return
    assert value is None or 0 <= value <= MAX_SEQUENCE
    assert (value, encoding) == (None, None) or encoding is not None


@settings(max_examples=300, deadline=None)
@given(timestamp=st.one_of(st.binary(max_size=70), st.text(max_size=70).map(str.encode)))
def test_check_timestamp_returns_or_raises_event_bus_error(timestamp: bytes) -> None:
    try:
        codec.check_timestamp(timestamp)
    except EventBusError as error:
        assert error.reason == "bad-timestamp"


@settings(max_examples=300, deadline=None)
@given(data=st.binary(max_size=64))
def test_check_payload_returns_or_raises_event_bus_error(data: bytes) -> None:
    try:
        codec.check_payload(data)
    except EventBusError as error:
        assert error.reason == "bad-payload"


# -- hypothesis: round trips -----------------------------------------------------------------

topics = (
    st.text(min_size=1, max_size=60)
    .map(str.encode)
    .filter(lambda t: not t.startswith(b"$") and len(t) <= codec.MAX_TOPIC_BYTES)
)
producers = st.text(max_size=40).map(str.encode)
# Whole minutes: ISO 8601 offsets have no seconds (and CPython 3.11's fromisoformat drops
# an offset's microseconds).
offsets = st.integers(-(23 * 60 + 59), 23 * 60 + 59).map(lambda m: timezone(timedelta(minutes=m)))
datetimes = st.one_of(
    st.datetimes(),  # naive
    st.datetimes(timezones=st.just(UTC)),
    st.datetimes(timezones=offsets),
)
timespecs = st.sampled_from(["auto", "seconds", "milliseconds", "microseconds"])
msgpack_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**64 - 1)
    | st.floats(allow_nan=False)
    | st.text(max_size=20)
    | st.binary(max_size=20),
    lambda children: (
        st.lists(children, max_size=5)
        | st.dictionaries(st.text(max_size=10) | st.integers(-100, 100), children, max_size=5)
    ),
    max_leaves=20,
)
#: Binary sequences below the first all-digits value round-trip exactly (see the ambiguity rule).
binary_sequences = st.integers(0, FIRST_AMBIGUOUS - 1)
text_sequences = st.integers(0, MAX_SEQUENCE)


def _truncate(moment: datetime, timespec: str) -> datetime:
    if timespec == "seconds":
        return moment.replace(microsecond=0)
    if timespec == "milliseconds":
        return moment.replace(microsecond=moment.microsecond // 1000 * 1000)
    return moment


@settings(max_examples=300, deadline=None)
@given(
    topic=topics,
    producer=producers,
    moment=datetimes,
    timespec=timespecs,
    value=msgpack_values,
    encoding=st.sampled_from(SequenceEncoding),
    data=st.data(),
)
def test_event_round_trips_through_pub_broadcast_and_sync(
    topic: bytes,
    producer: bytes,
    moment: datetime,
    timespec: str,
    value: Any,
    encoding: SequenceEncoding,
    data: st.DataObject,
) -> None:
    timestamp = moment.isoformat(timespec=timespec).encode()
    event_id = str(uuid.uuid4()).encode()
    payload = msgpack.packb(value)
    published = codec.parse_pub(codec.pub_frames(topic, producer, timestamp, event_id, payload))
    assert published == Event(topic, 0, producer, timestamp, event_id, payload)
    assert published.time == _truncate(moment, timespec)
    assert published.time.utcoffset() == moment.utcoffset()
    assert published.value() == value
    assert published.topic_name == topic.decode()
    assert published.producer_id == producer.decode()

    sequence = data.draw(binary_sequences if encoding is BINARY else text_sequences)
    stored = published._replace(sequence=sequence)
    assert codec.parse_published(codec.broadcast_frames(stored, encoding)) == stored
    assert codec.parse_snapshot_reply(codec.sync_frames(stored, encoding)) == stored
    end = codec.parse_snapshot_reply(codec.sync_end_frames(topic, sequence, encoding))
    assert end == SnapshotEnd(topic, sequence)
    beat = codec.parse_published(codec.heartbeat_frames(sequence, str(uuid.uuid4()), encoding))
    assert isinstance(beat, Heartbeat)
    assert beat.sequence == sequence
    if sequence < FIRST_AMBIGUOUS - 1:
        fields = (topic, producer, timestamp, event_id, payload)
        messages = codec.broadcast_messages(sequence, [fields, fields], encoding)
        assert [codec.parse_published(m) for m in messages] == [
            stored,
            stored._replace(sequence=sequence + 1),
        ]


subtree = st.text(min_size=1, max_size=20).map(str.encode).filter(lambda s: not set(s) & set(b";,"))


@settings(max_examples=200, deadline=None)
@given(
    subtrees=st.lists(subtree, max_size=5),
    encoding=st.sampled_from(SequenceEncoding),
    data=st.data(),
)
def test_sync_start_round_trips(
    subtrees: list[bytes], encoding: SequenceEncoding, data: st.DataObject
) -> None:
    since = data.draw(binary_sequences if encoding is BINARY else text_sequences)
    request = codec.parse_sync_start(codec.sync_start_frames(subtrees, since, encoding))
    assert request.subtrees == tuple(subtrees)
    assert request.since == since
    assert request.encoding is encoding
    assert request.spec == b";".join(subtrees)


@settings(max_examples=500, deadline=None)
@given(n=text_sequences)
def test_text_sequence_round_trips_for_every_value(n: int) -> None:
    assert codec.decode_sequence(codec.encode_sequence(n, TEXT)) == (n, TEXT)


@settings(max_examples=500, deadline=None)
@given(n=binary_sequences)
def test_binary_sequence_round_trips_below_the_ambiguous_range(n: int) -> None:
    assert codec.decode_sequence(codec.encode_sequence(n, BINARY)) == (n, BINARY)


@settings(max_examples=500, deadline=None)
@given(
    n=st.one_of(
        st.integers(0, MAX_SEQUENCE),
        # values made of digit bytes, to hit the ambiguous ones often
        st.lists(st.integers(0x30, 0x39), min_size=8, max_size=8).map(
            lambda b: int.from_bytes(bytes(b), "big")
        ),
    )
)
def test_binary_sequence_decodes_by_the_ambiguity_rule_over_the_whole_range(n: int) -> None:
    frame = codec.encode_sequence(n, BINARY)
    assert len(frame) == 8
    if frame.isdigit():
        assert codec.decode_sequence(frame) == (int(frame), TEXT)
    else:
        assert codec.decode_sequence(frame) == (n, BINARY)


@given(
    st.lists(
        st.tuples(
            st.integers(1, codec.MAX_SEQUENCE),
            *(st.binary(max_size=12) for _ in range(5)),
        ),
        max_size=5,
    ),
    st.sampled_from(list(codec.SequenceEncoding)),
)
def test_sync_messages_from_rows_are_sync_frames_of_their_events(
    rows: list[tuple[int, bytes, bytes, bytes, bytes, bytes]], encoding: Any
) -> None:
    events = [codec.Event(t, s, p, ts, u, d) for s, t, p, ts, u, d in rows]
    assert codec.sync_messages(b"peer", rows, encoding) == [
        [b"peer", *codec.sync_frames(event, encoding)] for event in events
    ]
