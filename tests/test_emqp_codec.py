"""The eMQP codec: the frames of the real eventmq 0.3.13 and of the text, and fuzzing."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bus.emqp import codec
from bus.emqp.codec import EmqpError

MSGID = b"0b9e5d3c-2d7e-4d8c-9a53-7f7c3f0b2a11"


def frames(command: bytes, *rest: bytes) -> list[bytes]:
    return [b"", b"eMQP/1.0", command, MSGID, *rest]


def test_the_original_inform_and_the_texts() -> None:
    original = codec.parse(frames(b"INFORM", b'[[10, "default"], [20, "emails"]]', b"worker"))
    assert original == codec.Inform(MSGID, ((10, "default"), (20, "emails")), "worker")
    # The text: comma-separated names, no peer type.
    text = codec.parse(frames(b"INFORM", b"default, emails"))
    assert text == codec.Inform(MSGID, ((10, "default"), (10, "emails")), "worker")
    # Empty queues: the original's default.
    assert codec.parse(frames(b"INFORM", b"", b"scheduler")) == codec.Inform(
        MSGID, ((10, "default"),), "scheduler"
    )
    # The same name twice keeps its highest weight.
    twice = codec.parse(frames(b"INFORM", b'[[1, "a"], [5, "a"]]', b"worker"))
    assert isinstance(twice, codec.Inform) and twice.queues == ((5, "a"),)


def test_request_headers() -> None:
    request = codec.parse(
        frames(b"REQUEST", b"q", b"reply-requested,guarantee,retry-count:3,timeout:20", b"[1]")
    )
    assert isinstance(request, codec.Request)
    headers = request.headers
    assert (headers.reply_requested, headers.guarantee) == (True, True)
    assert (headers.retry_count, headers.timeout) == (3, 20.0)
    plain = codec.parse(frames(b"REQUEST", b"q", b"", b'["run", {}]'))
    assert isinstance(plain, codec.Request) and plain.headers == codec.NO_HEADERS
    # timeout:0 means none (the original's default); unknown names are kept, not refused.
    odd = codec.parse(frames(b"REQUEST", b"q", b"timeout:0,debounce", b"{}"))
    assert isinstance(odd, codec.Request) and odd.headers.timeout is None
    assert odd.headers.raw == b"timeout:0,debounce"
    assert codec.with_reply_requested(odd.headers) == b"reply-requested,timeout:0,debounce"
    assert codec.with_reply_requested(codec.NO_HEADERS) == b"reply-requested"


def test_reply_shapes() -> None:
    result = codec.parse(frames(b"REPLY", b'{"value": 3}', b"req-1"))
    assert result == codec.Reply(MSGID, b'{"value": 3}', b"req-1")
    assert codec.parse(frames(b"REPLY", b"req-1")) == codec.DispatchAck(MSGID, b"req-1")


def test_built_messages_parse_back() -> None:
    built = [
        codec.inform([(10, "a"), (3, "b")], codec.WORKER),
        codec.ack(MSGID),
        codec.ready(),
        codec.heartbeat(1700000000.25),
        codec.kbye(),
        codec.request("q", b'["x", 1]', codec.encode_headers(True, True, 2, 5)),
        codec.reply(codec.result_value({"k": [1]}), MSGID),
        codec.dispatch_ack(MSGID),
        codec.message(codec.STATUS),
    ]
    for message in built:
        command = codec.parse(message)
        assert command.msgid == message[3]
    request = codec.parse(built[5])
    assert isinstance(request, codec.Request)
    assert request.headers.raw == b"reply-requested,guarantee,retry-count:2,timeout:5"
    assert json.loads(codec.result_value(object())) == {
        "value": "Object of type object is not JSON serializable"
    }


@pytest.mark.parametrize(
    ("message", "reason"),
    [
        ([b"", b"eMQP/1.0", b"READY"], "truncated"),
        ([b"x", b"eMQP/1.0", b"READY", MSGID], "bad-delimiter"),
        ([b"", b"eMQP/2.0", b"READY", MSGID], "bad-protocol"),
        (frames(b"SHOUT"), "unknown-command"),
        ([b"", b"eMQP/1.0", b"READY", b""], "bad-msgid"),
        ([b"", b"eMQP/1.0", b"READY", b"\xff\xfe"], "not-utf8"),
        (frames(b"READY", b"extra"), "extra-frames"),
        (frames(b"REQUEST", b"q", b""), "truncated"),
        (frames(b"REQUEST", b"q", b"", b"{not json"), "bad-json"),
        (frames(b"REQUEST", b"q", b"", b'{"a": 1} x'), "bad-json"),
        (frames(b"REQUEST", b"q", b"", b"1 2"), "bad-json"),
        (frames(b"REQUEST", b"q", b"", b"   "), "bad-json"),
        (frames(b"REPLY", b"[1,", MSGID), "bad-json"),
        (frames(b"REQUEST", b"q", b"", b"\xff"), "not-utf8"),
        (frames(b"REQUEST", b"", b"", b"1"), "bad-queue"),
        (frames(b"REQUEST", b"q", b"retry-count:x", b"1"), "bad-header"),
        (frames(b"REQUEST", b"q", b"timeout:-1", b"1"), "bad-header"),
        (frames(b"INFORM", b"[[10]]", b"worker"), "bad-queues"),
        (frames(b"INFORM", b"[", b"worker"), "bad-json"),
        (frames(b"INFORM", b'[[true, "a"]]', b"worker"), "bad-queues"),
        (frames(b"INFORM", b"a", b"client"), "bad-peer"),
        (frames(b"REPLY", b"1", b"2", b"3"), "extra-frames"),
        (frames(b"SCHEDULE", b"q", b"", b"60"), "truncated"),
        ([b"", b"eMQP/1.0", b"READY", MSGID] + [b""] * 20, "extra-frames"),
    ],
)
def test_malformed_input_has_a_reason(message: list[bytes], reason: str) -> None:
    with pytest.raises(EmqpError) as error:
        codec.parse(message)
    assert error.value.reason == reason


json_texts = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3)
    ),
    max_leaves=6,
).map(json.dumps)


@settings(max_examples=2000)
@given(
    text=json_texts | st.text(alphabet=' \t\n{}[]",:0123456789.eE+-truefalsnNI', max_size=16),
    before=st.sampled_from(["", " ", "\n\t"]),
    after=st.sampled_from(["", " ", "\n", " x", ",", "]"]),
)
def test_request_bodies_are_judged_as_json_loads_judges_them(
    text: str, before: str, after: str
) -> None:
    body = (before + text + after).encode()
    try:
        json.loads(body)
    except ValueError:
        valid = False
    else:
        valid = True
    try:
        codec.parse(frames(b"REQUEST", b"q", b"", body))
    except EmqpError as error:
        assert not valid and error.reason == "bad-json"
    else:
        assert valid


COMMANDS = [c for c in codec._PARSERS] + [b"", b"NOPE"]
texty = st.sampled_from([b"", b"q", b"[]", b'[[1, "a"]]', b"{}", b"null", b"1", b"\xff", b"a,b"])


@settings(max_examples=3000)
@given(
    head=st.lists(st.binary(max_size=12) | st.sampled_from([b"", b"eMQP/1.0"]), max_size=2),
    command=st.sampled_from(COMMANDS) | st.binary(max_size=10),
    rest=st.lists(st.binary(max_size=40) | texty, max_size=8),
)
def test_fuzzed_frames_parse_or_raise_one_error(
    head: list[bytes], command: bytes, rest: list[bytes]
) -> None:
    message = [b"", b"eMQP/1.0", command, *rest] if len(head) == 0 else [*head, command, *rest]
    try:
        parsed = codec.parse(message)
    except EmqpError as error:
        assert error.reason
        return
    # Whatever parses carries a UTF-8 message id and round-trips what it names.
    assert parsed.msgid.decode("utf-8")
    if isinstance(parsed, codec.Request):
        json.loads(parsed.body)
        parsed.queue.decode("utf-8")
