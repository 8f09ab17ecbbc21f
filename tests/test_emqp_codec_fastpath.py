"""The compiled parser of a job's commands (bus/emqp/_jobscan.c) agrees with the Python
parser: whatever it takes, the Python parser takes and builds the same command from;
whatever it leaves (None), the Python parser decides. And ``is_ready`` compiled or not
answers alike for frames of bytes; its message ids are the Python function's."""

from __future__ import annotations

import itertools
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
