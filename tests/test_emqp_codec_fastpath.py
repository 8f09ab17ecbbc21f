"""The compiled parser of a job's commands (bus/emqp/_jobscan.c) agrees with the Python
parser: whatever it takes, the Python parser takes and builds the same command from;
whatever it leaves (None), the Python parser decides. And ``is_ready`` compiled or not
answers alike for frames of bytes; its message ids are the Python function's."""

from __future__ import annotations

import itertools
import json
import os
from typing import Any

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from bus.emqp import codec
from bus.emqp.codec import EmqpError

native: Any = codec.native
pytestmark = pytest.mark.skipif(native is None, reason="bus/emqp/_jobscan.c is not built")

MSGID = b"7c4d3a1e-55aa-4f0e-9b1c-000000000001"
VALID = [
    [b"", codec.PROTOCOL, codec.REQUEST, MSGID, b"default", b"reply-requested", b'["x", {"n": 1}]'],
    [b"", codec.PROTOCOL, codec.REPLY, b"1b2c-1", b'{"value": 1}', MSGID],
    [b"", codec.PROTOCOL, codec.READY, b"3d4e-1"],
]  # fmt: skip

frame_values = st.one_of(
    st.binary(max_size=40),
    st.sampled_from(
        [
            b"", b" ", codec.PROTOCOL, b"eMQP/1.1", codec.REQUEST, codec.REPLY, codec.READY,
            codec.HEARTBEAT, b"READY ", MSGID, b"\xc3\xa9t\xc3\xa9", b"\xff", b"x" * 129,
            b"q" * 256, b"q" * 257, b"reply-requested", b"guarantee,reply-requested",
            b"retry-count:x", b"timeout:5", b"unknown-header", b"null", b"[1]", b" [1]",
            b"[1] ", b"[1]x", b'"\xc3\xa9"', b'{"a": [1, 2.5, "x"]}', b"{", b"1e400", b"NaN",
            b"[" * 3000 + b"]" * 3000,
        ]
    ),
)  # fmt: skip


@st.composite
def near_valid(draw: Any) -> list[Any]:
    """A valid job message with a few frames changed, added or removed (sometimes not
    bytes at all)."""
    frames: list[Any] = list(draw(st.sampled_from(VALID)))
    for _ in range(draw(st.integers(0, 3))):
        change = draw(st.sampled_from(["set", "add", "remove", "type"]))
        index = draw(st.integers(0, len(frames)))
        if change == "set" and index < len(frames):
            frames[index] = draw(frame_values)
        elif change == "add":
            frames.insert(index, draw(frame_values))
        elif change == "remove" and index < len(frames) and len(frames) > 1:
            del frames[index]
        elif change == "type" and index < len(frames) and type(frames[index]) is bytes:
            frames[index] = draw(st.sampled_from([bytearray(frames[index]), None, 5, "text"]))
    return frames


def python_outcome(frames: list[Any]) -> tuple[str, Any]:
    try:
        return ("ok", codec._parse(frames))
    except EmqpError as error:
        return ("error", error.reason)
    except Exception as error:  # what a non-bytes frame makes the Python code raise
        return ("raised", type(error))


@settings(max_examples=3000, deadline=None)
@given(near_valid())
@example([b"", codec.PROTOCOL, codec.REQUEST, MSGID, b"default", b"", b"1"])
@example([b"", codec.PROTOCOL, codec.REPLY, b"a", b"\t1", MSGID])
def test_the_compiled_parser_takes_only_what_python_takes_and_builds_the_same(
    frames: list[Any],
) -> None:
    codec.parse_headers(b"reply-requested")  # a header string met before: remembered
    expected = python_outcome(frames)
    built = native.parse(frames)
    if built is not None:
        assert expected[0] == "ok", (frames, expected)
        assert type(built) is type(expected[1]) and built == expected[1]
        assert type(built) in (codec.Request, codec.Reply, codec.Ready)
    # Through the public parse: the same outcome either way.
    try:
        outcome: tuple[str, Any] = ("ok", codec.parse(frames))
    except EmqpError as error:
        outcome = ("error", error.reason)
    except Exception as error:
        outcome = ("raised", type(error))
    assert outcome == expected
    # Frames that are not all bytes (never from the transport) are left to parse.
    if all(type(frame) is bytes for frame in frames):
        assert native.is_ready(frames) == codec.python_is_ready(frames)
        if codec.python_is_ready(frames):
            assert expected[0] == "ok" and type(expected[1]) is codec.Ready
    else:
        assert not native.is_ready(frames)


@settings(max_examples=2000, deadline=None)
@given(st.one_of(frame_values, st.sampled_from([None, "text", 5])), near_valid())
def test_a_routed_message_parses_as_its_frames_without_the_identity(
    identity: Any, frames: list[Any]
) -> None:
    codec.parse_headers(b"reply-requested")
    message = [identity, *frames]
    assert native.parse_routed(message) == native.parse(frames)
    assert native.parse_routed(message) == native.parse(message[1:])


def test_a_routed_message_that_is_no_list_or_empty_is_left_to_python() -> None:
    assert native.parse_routed([]) is None
    assert native.parse_routed((b"peer", *VALID[2])) is None
    assert native.parse_routed(b"peer") is None
    for frames in VALID:
        assert native.parse_routed([b"\x00peer", *frames]) == codec.parse(frames)


def test_the_compiled_parser_takes_a_job_s_usual_messages() -> None:
    codec.parse_headers(b"reply-requested")
    for frames in VALID:
        built = native.parse(frames)
        assert built is not None and built == codec._parse(frames)
    # Headers not met before, and JSON with white space around it: left to Python.
    fresh = [*VALID[0][:5], b"reply-requested,retry-count:3", VALID[0][6]]
    assert native.parse(fresh) is None and codec.parse(fresh).headers.retry_count == 3
    assert native.parse(fresh) is not None  # remembered by the Python parse
    spaced = [*VALID[1][:4], b' {"value": 1}', MSGID]
    assert native.parse(spaced) is None and codec.parse(spaced) == codec._parse(spaced)


@settings(max_examples=200, deadline=None)
@given(
    st.text("0123456789abcdef-", min_size=24, max_size=24).map(str.encode),
    st.integers(0, 2**50) | st.integers(2**48 - 3, 2**48 + 3),
    st.integers(1, 8),
)
def test_compiled_message_ids_are_the_python_ones(prefix: bytes, start: int, count: int) -> None:
    try:
        native.msgids(prefix, start)
        made = [native.new_msgid() for _ in range(count)]
    finally:  # the process's own ids go on from a new random start
        native.msgids(codec._MSGID_PREFIX, int.from_bytes(os.urandom(4), "big"))
    assert made == [b"%s%012x" % (prefix, (start + n) & 0xFFFFFFFFFFFF) for n in range(count)]
    assert made[0] == python_made(prefix, start)


def python_made(prefix: bytes, start: int) -> bytes:
    """The Python function's id for that prefix and counter."""
    saved = codec._MSGID_PREFIX, codec._msgid_counter
    codec._MSGID_PREFIX, codec._msgid_counter = prefix, itertools.count(start)
    try:
        return codec.python_new_msgid()
    finally:
        codec._MSGID_PREFIX, codec._msgid_counter = saved


# -- the JSON of a body or result, judged on its bytes ------------------------------------------


def python_whole(frame: bytes) -> bool:
    """What codec._json takes without decode()'s second look: UTF-8 whose one JSON value
    the scanner takes whole (the test the compiled check stands for)."""
    try:
        text = frame.decode("utf-8")
        _, end = codec._scan_json(text, 0)
    except (UnicodeDecodeError, ValueError, RecursionError, StopIteration):
        return False
    return bool(end == len(text))


json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(10**40), 10**40)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=12),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=6), children, max_size=4)
    ),
    max_leaves=20,
)


@st.composite
def json_bytes(draw: Any) -> bytes:
    """JSON as peers write it (any separators, ASCII-escaped or not), sometimes with a few
    bytes changed, cut or added."""
    text = json.dumps(
        draw(json_values),
        ensure_ascii=draw(st.booleans()),
        separators=draw(st.sampled_from([(",", ":"), (", ", ": "), (" ,\t", "\n:\r ")])),
    )
    data = bytearray(text.encode("utf-8"))
    for _ in range(draw(st.sampled_from([0, 0, 1, 2, 3]))):
        index = draw(st.integers(0, len(data)))
        byte = draw(st.sampled_from([*b'"\\[]{},:-.eE0u \t\x00\x1f', 0x80, 0xC0, 0xED, 0xFF]))
        change = draw(st.sampled_from(["set", "insert", "cut"]))
        if change == "set" and index < len(data):
            data[index] = byte
        elif change == "insert":
            data.insert(index, byte)
        else:
            del data[index:]
    return bytes(data)


@settings(max_examples=4000, deadline=None)
@given(json_bytes() | st.binary(max_size=30))
@example(b"NaN")
@example(b"-Infinity")
@example(b'"\\ud800"')
@example(b'"\xed\xa0\x80"')
@example(b'"\xc0\x80"')
@example(b'"\xf4\x90\x80\x80"')
@example(b"1" * 700)
@example(b"[" * 65 + b"]" * 65)
def test_the_compiled_json_check_takes_only_what_python_takes_whole(frame: bytes) -> None:
    if native.whole_json(frame):
        assert python_whole(frame), frame
        assert codec._json(frame, "the body") == json.loads(frame)


@settings(max_examples=1000, deadline=None)
@given(json_values, st.booleans(), st.sampled_from([(",", ":"), (", ", ": "), None]))
def test_the_compiled_json_check_takes_json_as_peers_write_it(
    value: Any, ascii_only: bool, separators: tuple[str, str] | None
) -> None:
    text = json.dumps(value, ensure_ascii=ascii_only, separators=separators)
    assert native.whole_json(text.encode("utf-8")), text


def test_the_compiled_json_check_leaves_the_rare_forms_to_python() -> None:
    """What the scanner takes but the check leaves (Python decides, and takes them), and
    what neither takes."""
    for left in (b"NaN", b"[Infinity]", b"-Infinity", b"1" * 700, b"[" * 65 + b"]" * 65):
        assert not native.whole_json(left) and python_whole(left), left
    for refused in (b" [1]", b"[1] ", b"[1,]", b'{"a":1,}', b"01", b'"\x01"', b'"\xff"', b""):
        assert not native.whole_json(refused) and not python_whole(refused), refused
    assert native.whole_json(b'"\\ud800"') and python_whole(b'"\\ud800"')  # a lone surrogate
    assert native.whole_json(b"[" * 64 + b"]" * 64)
