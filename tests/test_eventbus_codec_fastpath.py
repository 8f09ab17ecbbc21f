"""The collector's inlined validation agrees with the reference parser on every input, in
Python and compiled (bus/eventbus/_pubscan.c)."""

from __future__ import annotations

import contextlib
import gc
import sys
import uuid
from collections.abc import Iterator
from typing import Any

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bus.eventbus import codec
from bus.eventbus.codec import EventBusError, SequenceEncoding
from bus.eventbus.subjects import subject
from tests.processes import resident

#: The batch parser's ways: Python alone, and with the compiled check where it was built.
PATHS: list[Any] = [None] + ([codec.native] if codec.native is not None else [])


@contextlib.contextmanager
def path(native: Any) -> Iterator[None]:
    """The batch parser with ``native`` as its compiled check (None: Python alone)."""
    saved = codec.native
    codec.native = native
    try:
        yield
    finally:
        codec.native = saved


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
    expected = [outcome(codec.parse_pub, as_collected(m)) for m in (list(VALID), frames, frames)]
    for native in PATHS:
        with path(native):
            got = batch_outcomes(codec.PubParser(64), [list(VALID), frames, frames])
        assert got == expected, native


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
    changed = [*VALID[:4], uuid_, VALID[5]]
    # With and without a REQ-style empty delimiter after the identity.
    messages = [list(VALID), changed]
    for native in PATHS:
        with path(native):
            parser = codec.PubParser(64)
            accepted, refused = parser.parse_batch(
                [[b"id", *([b""] if delimited else []), *m] for m in messages]
            )
            assert batch_outcomes(parser, [changed]) == [outcome(codec.parse_pub, changed)]
        assert len(accepted) + len(refused) == 2


@pytest.mark.parametrize("native", PATHS, ids=lambda n: "python" if n is None else "compiled")
def test_batch_parser_forgets_at_its_bound_and_takes_a_req_delimiter(native: Any) -> None:
    with path(native):
        forgets_at_its_bound_and_takes_a_req_delimiter()


def forgets_at_its_bound_and_takes_a_req_delimiter() -> None:
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


#: What a batch's messages are made of: a valid PUB (one of a few topics, producers and
#: timestamps, so that some are remembered and some new) with at most two frames changed,
#: and now and then a frame too many or too few, or a REQ-style delimiter.
good_topics = st.sampled_from([b"/a/b/", b"/a/c/", b"/z/"])
good_producers = st.sampled_from([b"producer", b"other"])
good_timestamps = st.sampled_from([VALID[3], b"2026-11-21T10:00:01Z"])
changes = st.one_of(
    st.tuples(st.just(0), st.sampled_from([b"$heartbeat", b"", b"/\xff/", b"t" * 300])),
    st.tuples(st.just(1), st.sampled_from([b"", b"null", b"NULL", b"1234", b"17", b"abcd"])),
    st.tuples(st.just(1), st.binary(min_size=7, max_size=9)),
    st.tuples(st.just(2), st.sampled_from([b"x" * 300, b"\xff", b""])),
    st.tuples(st.just(3), st.sampled_from([b"tomorrow", b"", b"2026-13-01T00:00:00Z"])),
    # New values the compiled pass checks itself (not remembered yet): any bytes as a topic
    # or producer id, timestamps of ISO-8601's characters (fromisoformat decides).
    st.tuples(st.just(0), st.binary(min_size=1, max_size=6).map(lambda b: b"/" + b)),
    st.tuples(st.just(2), st.binary(max_size=6)),
    st.tuples(
        st.just(3),
        st.text("0123456789T:.,+- Zz", min_size=1, max_size=66).map(str.encode)
        | st.datetimes().map(lambda d: d.isoformat().encode()),
    ),
    st.tuples(st.just(4), uuid_texts),
    st.tuples(st.just(4), st.just(VALID[4].upper())),
    st.tuples(
        st.just(5),
        st.sampled_from(
            [b"\xc1", b"", b"\x91", b"d" * 65, msgpack.packb(1) + b"x", b"\xd4\xff\x00"]
        ),
    ),
    st.tuples(st.just(5), st.binary(max_size=12)),
)


@st.composite
def collected(draw: Any) -> list[bytes]:
    """A message as the collector reads it: identity, an optional delimiter, PUB frames."""
    frames = [
        draw(good_topics), VALID[1], draw(good_producers), draw(good_timestamps), VALID[4],
        VALID[5],
    ]  # fmt: skip
    for index, value in draw(st.lists(changes, max_size=2)):
        frames[index] = value
    shape = draw(st.integers(0, 19))
    if shape == 0:
        frames.append(b"x")
    elif shape == 1:
        frames.pop()
    delimiter = [b""] if shape == 2 else []
    return [b"id", *delimiter, *frames]


@pytest.mark.skipif(codec.native is None, reason="the compiled check is not built")
@settings(max_examples=400, deadline=None)
@given(st.lists(st.lists(collected(), max_size=12), min_size=1, max_size=4), st.integers(2, 8))
def test_compiled_and_python_batches_agree_and_remember_alike(
    batches: list[list[list[bytes]]], remember: int
) -> None:
    parsers = {}
    for native in PATHS:
        with path(native):
            parser = codec.PubParser(64, remember=remember)
            results = []
            for batch in batches:
                accepted, refused = parser.parse_batch([list(m) for m in batch])
                results.append((accepted, [(i, e.reason) for i, e in refused]))
            parsers[native] = (results, parser._topics, parser._producers, parser._timestamps)
    python, compiled = parsers[None], parsers[codec.native]
    assert compiled == python


@pytest.mark.skipif(codec.native is None, reason="the compiled check is not built")
def test_the_compiled_check_lets_only_exceptions_go() -> None:
    parser = codec.PubParser(64)
    # Data the compiled walk leaves to unpackb (a timestamp: msgpack checks its fields).
    message = [b"id", *VALID[:5], b"\xd6\xff\x00\x00\x00\x01"]
    parser.parse_batch([list(message)])  # its topic, producer and timestamp remembered
    args = (parser._topics, parser._producers, parser._timestamps, 64)

    def refuses(data: bytes, **options: Any) -> Any:
        raise ValueError("not msgpack")

    def interrupted(data: bytes, **options: Any) -> Any:
        raise KeyboardInterrupt

    assert codec.native.known([list(message)] * 3, 0, *args, refuses) == ([], 0)
    assert codec.native.known([list(message)] * 3, 1, *args, msgpack.unpackb) == (
        [tuple(message[i] for i in (1, 3, 4, 5, 6))] * 2,
        3,
    )
    # Data it is sure of is not given to unpackb at all.
    plain = [b"id", *VALID]
    assert codec.native.known([plain], 0, *args, refuses) == (
        [tuple(plain[i] for i in (1, 3, 4, 5, 6))],
        1,
    )
    with pytest.raises(KeyboardInterrupt):
        codec.native.known([list(message)], 0, *args, interrupted)
    with pytest.raises(TypeError):
        codec.native.known((message,), 0, *args, msgpack.unpackb)


@st.composite
def appended(draw: Any) -> tuple[Any, ...]:
    """An event as the collector hands it to a front-end's append; now and then one the
    compiled pass leaves to Python (a part past the topic that is not bytes)."""
    part = st.one_of(
        st.binary(max_size=20),
        st.sampled_from([0xFF, 0x100, 0xFFFF, 0x10000]).map(lambda n: b"d" * n),
    )
    topic = draw(st.sampled_from([b"/a/", b"/a/b/", b"/caf\xc3\xa9/", b"/sp ace/", b"/x.y/"]))
    fields: list[Any] = [topic, draw(part), draw(part), draw(st.binary(max_size=36)), draw(part)]
    if draw(st.integers(0, 15)) == 0:
        fields[draw(st.integers(1, 4))] = bytearray(fields[0])
    return tuple(fields)


@pytest.mark.skipif(codec.native is None, reason="the compiled helper is not built")
@settings(max_examples=300, deadline=None)
@given(st.lists(st.lists(appended(), max_size=10), min_size=1, max_size=4))
def test_appends_are_the_same_messages_compiled(batches: list[list[tuple[Any, ...]]]) -> None:
    """A front-end's messages for the stream (subject, uuid, body), batch after batch (the
    topics remembered between them), are the same with the compiled helper and without."""
    from bus.eventbus.stream_read import Appends, encode
    from bus.eventbus.subjects import subject

    compiled, python = Appends("evt"), Appends("evt")
    for batch in batches:
        made = compiled(batch)
        with path(None):
            assert python(batch) == made
        assert made == [
            (subject("evt", e[0]).encode(), e[3], encode(e))
            for e in batch  # type: ignore[arg-type]
        ]


@st.composite
def stored_body(draw: Any) -> bytes:
    """A stream message's body: mostly the four ``bin`` a front-end writes (sizes at each
    bound), sometimes another form msgpack reads differently, or not at all."""
    part = st.one_of(
        st.binary(max_size=12),
        st.sampled_from([0xFF, 0x100, 0xFFFF, 0x10000]).map(lambda n: b"d" * n),
    )
    parts = [draw(part) for _ in range(4)]
    body = bytes(msgpack.packb(parts, use_bin_type=True))
    form = draw(st.integers(0, 9))
    if form == 1:  # str parts, as an older writer might: msgpack reads them as bytes
        body = bytes(msgpack.packb(parts, use_bin_type=False))
    elif form == 2:
        body = body[: draw(st.integers(0, len(body) - 1))]
    elif form == 3:
        body += draw(st.binary(min_size=1, max_size=3))
    elif form == 4:
        body = bytes(msgpack.packb(draw(st.sampled_from([parts[:3], {b"a": 1}, b"x", 7]))))
    return body


@pytest.mark.skipif(codec.native is None, reason="the compiled helper is not built")
@settings(max_examples=400, deadline=None)
@given(st.lists(stored_body(), max_size=8))
def test_rows_read_back_from_a_stream_are_the_same_compiled(bodies: list[bytes]) -> None:
    """The log's rows of messages read from a stream are those msgpack and the Python
    checks give, and a body they refuse is refused with the same error."""
    from bus.eventbus.stream_read import Events, decoded_rows
    from bus.nats.ranged import Batch

    batch = Batch(list(range(5, 5 + len(bodies))), [b""] * len(bodies), bodies, [0] * len(bodies))
    topics = [b"/t/%d/" % i for i in range(len(bodies))]

    def outcome(read: Any) -> Any:
        try:
            return read()
        except Exception as error:  # compared: the same kind of refusal
            return type(error)

    python = outcome(lambda: Events.decoded(batch, topics).rows())
    assert outcome(lambda: decoded_rows(batch, topics)) == python
    with path(None):
        assert outcome(lambda: decoded_rows(batch, topics)) == python


@pytest.mark.skipif(codec.native is None, reason="the compiled helper is not built")
@settings(max_examples=400, deadline=None)
@given(
    st.lists(stored_body(), max_size=8),
    st.one_of(st.integers(0, 2**20), st.integers(2**64 - 10, 2**64 + 3)),
    st.sampled_from(list(codec.SequenceEncoding)),
    st.binary(max_size=6),
)
def test_snapshot_messages_made_from_a_stream_are_the_same_compiled(
    bodies: list[bytes], first: int, encoding: codec.SequenceEncoding, identity: bytes
) -> None:
    """A snapshot's SYNC messages made where the stream is read (the front-end's reader
    thread) are sync_messages of the rows msgpack and the Python checks give, sequences
    past 64 bits and refused bodies included."""
    from bus.eventbus.stream_read import Events, decoded_syncs
    from bus.nats.ranged import Batch

    sequences = list(range(first, first + len(bodies)))
    batch = Batch(sequences, [b""] * len(bodies), bodies, [0] * len(bodies))
    topics = [b"/t/%d/" % i for i in range(len(bodies))]

    def outcome(read: Any) -> Any:
        try:
            return read()
        except Exception as error:  # compared: the same kind of refusal
            return type(error)

    python = outcome(
        lambda: codec.sync_messages(identity, Events.decoded(batch, topics).rows(), encoding)
    )
    assert outcome(lambda: decoded_syncs(batch, topics, identity, encoding)) == python
    with path(None):
        assert outcome(lambda: decoded_syncs(batch, topics, identity, encoding)) == python


@pytest.mark.skipif(codec.native is None, reason="the compiled helper is not built")
@settings(max_examples=300, deadline=None)
@given(
    st.one_of(
        st.integers(0, 2**20),
        st.integers(2**64 - 20, 2**64 + 3),
        st.integers(-3, -1),
    ),
    st.lists(st.tuples(*[st.binary(max_size=6)] * 5).map(tuple), max_size=8),
    st.sampled_from(list(codec.SequenceEncoding)),
)
def test_broadcasts_are_the_same_frames_compiled(
    first: int, fields: list[tuple[bytes, ...]], encoding: codec.SequenceEncoding
) -> None:
    """The BROADCAST frames of a batch are those the Python function makes (and where it
    refuses a sequence, it decides)."""

    def made() -> Any:
        try:
            return codec.broadcast_messages(first, fields, encoding)  # type: ignore[arg-type]
        except Exception as error:
            return type(error)

    compiled = made()
    with path(None):
        assert made() == compiled
    if fields and first >= 0 and first + len(fields) <= 2**64:
        assert compiled[0][1] == codec.encode_sequence(first, encoding)


MSGPACK_SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**63), 2**64 - 1),
    st.floats(allow_nan=True),
    st.binary(max_size=300),
    st.text(max_size=40),
    st.builds(msgpack.ExtType, st.integers(0, 127), st.binary(max_size=20)),
)
MSGPACK_VALUES = st.recursive(
    MSGPACK_SCALARS,
    lambda inner: st.one_of(
        st.lists(inner, max_size=5),
        st.dictionaries(
            st.one_of(st.binary(max_size=8), st.integers(-(2**63), 2**64 - 1), st.none()),
            inner,
            max_size=5,
        ),
    ),
    max_leaves=20,
)


@st.composite
def msgpack_bytes(draw: Any) -> bytes:
    """Whole values, cut, padded, with a byte changed, or any bytes at all."""
    packed = bytes(msgpack.packb(draw(MSGPACK_VALUES), use_bin_type=draw(st.booleans())))
    form = draw(st.integers(0, 6))
    if form == 1 and packed:
        packed = packed[: draw(st.integers(0, len(packed) - 1))]
    elif form == 2:
        packed += draw(st.binary(min_size=1, max_size=3))
    elif form == 3 and packed:
        at = draw(st.integers(0, len(packed) - 1))
        packed = packed[:at] + bytes([draw(st.integers(0, 255))]) + packed[at + 1 :]
    elif form == 4:
        packed = draw(st.binary(max_size=30))
    elif form == 5:  # an extension of any code, the packer's (0 to 127) or not
        size = draw(st.sampled_from([1, 2, 4, 8, 16]))
        head = bytes([0xD4 + [1, 2, 4, 8, 16].index(size), draw(st.integers(0, 255))])
        packed = bytes(msgpack.packb([head + bytes(size)]))[:1] + head + bytes(size)
    return packed


@pytest.mark.skipif(codec.native is None, reason="the compiled helper is not built")
@settings(max_examples=2000, deadline=None)
@given(msgpack_bytes())
def test_data_found_surely_valid_is_what_msgpack_takes(data: bytes) -> None:
    """What the compiled walk calls surely valid (so that msgpack is not asked), msgpack
    takes; what it is not sure of, msgpack decides."""
    assert codec.native is not None
    if codec.native.sure_msgpack(data):
        msgpack.unpackb(data, raw=True, strict_map_key=False)


@pytest.mark.skipif(codec.native is None, reason="the compiled helper is not built")
@settings(max_examples=300, deadline=None)
@given(MSGPACK_VALUES)
def test_whole_values_without_timestamps_or_container_keys_are_found_valid(value: Any) -> None:
    """The walk takes the values publishers send: anything packed whole (its keys bytes,
    integers or nil), at any nesting this strategy makes."""
    assert codec.native is not None
    assert codec.native.sure_msgpack(bytes(msgpack.packb(value, use_bin_type=True)))


@pytest.mark.skipif(codec.native is None, reason="the compiled helper is not built")
def test_the_walk_leaves_to_msgpack_what_only_it_decides() -> None:
    assert codec.native is not None
    sure = codec.native.sure_msgpack
    deep = b"\x91" * 600 + b"\x01"  # past the walk's depth: msgpack's own limit decides
    timestamp = b"\xd6\xff\x00\x00\x00\x01"  # its fields checked by msgpack
    negative = b"\xd5\x80\x00\x00"  # an extension code msgpack refuses (CI's hypothesis found it)
    for data in (
        deep,
        timestamp,
        negative,
        b"\x81\x91\x01\x01",
        b"\x81\x80\x01",
        b"\xc1",
        b"\x90\x00",
        b"",
    ):
        assert not sure(data), data
    assert sure(b"\x91" * 500 + b"\x01")


STORED_SUBJECTS = st.one_of(
    st.sampled_from([b"/", b"/a/b/", b"x", b"/t.1/\xc3\xa9/", b"a b", b"//"]).map(
        lambda topic: subject("evt", topic).encode()
    ),
    # Naming no topic: an import's placeholder, another writer's, a broken escape, not ASCII.
    st.sampled_from([b"evt.~gap", b"other.x", b"evt.~ZZ", b"evt.\xff", b"evt"]),
)


@pytest.mark.skipif(codec.native is None, reason="the compiled helper is not built")
@settings(max_examples=400, deadline=None)
@given(
    st.lists(st.lists(st.tuples(STORED_SUBJECTS, stored_body()), max_size=8), max_size=3),
    st.sampled_from(list(codec.SequenceEncoding)),
    st.binary(max_size=6),
)
def test_snapshot_messages_of_stored_subjects_are_the_same_compiled(
    batches: list[list[tuple[bytes, bytes]]], encoding: codec.SequenceEncoding, identity: bytes
) -> None:
    """A front-end's SYNC messages of a chunk of stored messages, each subject's topic
    looked up in the compiled step (a subject that names none left out and counted, a
    refused body refused alike), are what the topics' column and then sync_messages give,
    compiled or not; the topics remembered between chunks."""
    from bus.eventbus.stream_read import Events, Topics, events_of, syncs_of
    from bus.nats.ranged import Batch

    def outcome(read: Any, *args: Any) -> Any:
        try:
            return read(*args)
        except Exception as error:  # compared: the same kind of refusal
            return type(error)

    def by_columns(batch: Batch, topics: Topics) -> Any:
        kept, names, skipped = events_of(batch, topics)
        rows = Events.decoded(kept, names).rows()
        return kept.sequences, codec.sync_messages(identity, rows, encoding), skipped

    ways = {"compiled": Topics("evt"), "python": Topics("evt"), "columns": Topics("evt")}
    first = 5
    for stored in batches:
        sequences = list(range(first, first + len(stored)))
        first += len(stored)
        subjects, bodies = [s for s, _ in stored], [b for _, b in stored]
        a, b, c = (Batch(sequences[:], subjects[:], bodies[:], [0] * len(stored)) for _ in "abc")
        expected = outcome(by_columns, a, ways["columns"])
        made = outcome(syncs_of, b, ways["compiled"], identity, encoding)
        with path(None):
            python = outcome(syncs_of, c, ways["python"], identity, encoding)
        assert made == python == expected
        assert dict(ways["compiled"]) == dict(ways["python"]) == dict(ways["columns"])
        assert ways["compiled"].none_seen == ways["python"].none_seen


@pytest.mark.skipif(codec.native is None, reason="the compiled helper is not built")
def test_snapshot_messages_of_stored_subjects_leak_nothing() -> None:
    """Many chunks made in the compiled step (topics found and converted, a subject that
    names none, a refused body) leave resident memory and the topics' references flat; the
    messages and their list are out of the cyclic collector's walks."""
    from bus.eventbus.stream_read import Topics, syncs_of
    from bus.nats.ranged import Batch

    body = bytes(msgpack.packb([b"p", b"2026", b"u" * 36, b"d" * 200], use_bin_type=True))
    subjects = [subject("evt", b"/t/%d/" % (i % 7)).encode() for i in range(64)]
    subjects[40] = b"evt.~gap"
    bodies = [body] * 64
    topics = Topics("evt")

    def chunks(count: int, broken: bool) -> None:
        for _ in range(count):
            if broken:
                bodies[50] = b"\x93\xc4\x01a"
            syncs_of(
                Batch(list(range(64)), subjects, bodies, [0] * 64),
                topics,
                b"id",
                SequenceEncoding.BINARY,
            )
            bodies[50] = body

    chunks(200, False)
    # Bytes and ints only, nothing added: out of the cyclic collector's walks.
    whole = Batch(list(range(8)), subjects[:8], bodies[:8], [0] * 8)
    _, messages, _ = syncs_of(whole, topics, b"id", SequenceEncoding.BINARY)
    assert len(messages) == 8 and not gc.is_tracked(messages)
    assert not any(gc.is_tracked(message) for message in messages)
    topic = topics[subjects[0]]
    held = sys.getrefcount(topic)
    before = resident()
    chunks(3000, False)
    with contextlib.suppress(ValueError):
        chunks(1, True)
    assert resident() - before < 4 << 20  # a message a chunk kept would be 40 MiB
    assert sys.getrefcount(topic) == held
