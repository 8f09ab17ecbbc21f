"""The compiled NATS scanner (bus/nats/_scan.c) against the Python code it speeds up:
for any bytes, split anywhere, the parser gives the same messages and the same errors with
it and without it; JetStream deliveries read into the same columns."""

from __future__ import annotations

import sys
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bus.nats import codec, ranged
from bus.nats.codec import Control, Msg
from tests.processes import resident

needs_native = pytest.mark.skipif(codec.native is None, reason="the compiled scanner is not built")


SUBJECTS = st.sampled_from([b"a", b"events.x.y", b"_INBOX.abc.7", b"$JS.API.INFO", b"q"])
NUMBERS = st.one_of(
    st.integers(0, 2**70).map(lambda n: str(n).encode()),
    st.sampled_from(
        [
            *(b"", b"+1", b"-1", b"1_0", b" 2", b"x", b"007", b"18446744073709551616"),
            *(b"18446744073709551615", b"99999999999999999999", b"9999999999999999999"),
            b"0" * 20,
        ]
    ),
)


@st.composite
def message(draw: Any) -> bytes:
    payload = draw(st.binary(max_size=40))
    headers = draw(st.sampled_from([b"", b"NATS/1.0\r\n\r\n", b"NATS/1.0 404 No Messages\r\n\r\n"]))
    subject = draw(SUBJECTS)
    sid = draw(st.one_of(st.integers(0, 99).map(lambda n: str(n).encode()), NUMBERS))
    reply = draw(
        st.one_of(st.just(b""), SUBJECTS, st.just(b"$JS.ACK.S.C.1.5.5.1795814609528077441.0"))
    )
    body = headers + payload
    honest = draw(st.booleans())
    total = str(len(body)).encode() if honest else draw(NUMBERS)
    ending = b"\r\n" if draw(st.integers(0, 9)) else draw(st.sampled_from([b"", b"\n", b"xx"]))
    words = [b"HMSG" if headers else b"MSG", subject, sid] + ([reply] if reply else [])
    if headers:
        words.append(str(len(headers)).encode() if honest else draw(NUMBERS))
    words.append(total)
    separator = draw(st.sampled_from([b" ", b" ", b" ", b"  "]))
    return separator.join(words) + b"\r\n" + body + ending


CONTROLS = st.sampled_from(
    [
        b"PING\r\n",
        b"PONG\r\n",
        b"+OK\r\n",
        b"ping\r\n",
        b"PING x\r\n",
        b'INFO {"server_id":"x"}\r\n',
        b"-ERR 'Stale Connection'\r\n",
        b"NOPE\r\n",
        b"MSG a\r\n",
        b"\r\n",
        b"PI\rNG\r\n",
    ]
)


def outcome(chunks: list[bytes], compiled: bool, monkeypatch: pytest.MonkeyPatch) -> Any:
    monkeypatch.setattr(codec, "native", codec.native if compiled else None)
    parser = codec.Parser()
    seen: list[Msg | Control] = []
    try:
        for chunk in chunks:
            seen.extend(parser.feed(chunk))
    except Exception as error:  # the error is part of the outcome
        return seen, type(error).__name__, str(error)
    return seen, parser._buffer


native = codec.native


@needs_native
@settings(max_examples=400, deadline=None)
@given(
    items=st.lists(st.one_of(message(), CONTROLS), max_size=12),
    cuts=st.lists(st.integers(0, 2000), max_size=6),
)
def test_the_scanner_parses_any_bytes_as_the_python_parser_does(
    items: list[bytes], cuts: list[int]
) -> None:
    data = b"".join(items)
    points = sorted({min(cut, len(data)) for cut in cuts})
    chunks = [data[a:b] for a, b in zip([0, *points], [*points, len(data)], strict=True)]
    with pytest.MonkeyPatch.context() as patch:
        fast = outcome(chunks, True, patch)
        slow = outcome(chunks, False, patch)
    assert codec.native is native
    assert fast == slow
    for item in fast[0]:
        assert type(item) in (Msg, Control)


def apart(chunks: list[bytes], compiled: bool, monkeypatch: pytest.MonkeyPatch) -> Any:
    monkeypatch.setattr(codec, "native", codec.native if compiled else None)
    parser = codec.Parser()
    messages: list[Msg] = []
    controls: list[Control] = []
    try:
        for chunk in chunks:
            more, lines = parser.feed_apart(chunk)
            messages += more
            controls += lines
    except Exception as error:
        return messages, controls, type(error).__name__, str(error)
    return messages, controls, parser._buffer


@settings(max_examples=300, deadline=None)
@given(
    items=st.lists(st.one_of(message(), CONTROLS), max_size=12),
    cuts=st.lists(st.integers(0, 2000), max_size=6),
    compiled=st.booleans(),
)
def test_the_messages_and_control_lines_apart_are_what_feed_gives_in_order(
    items: list[bytes], cuts: list[int], compiled: bool
) -> None:
    """feed_apart (a stream's reader) gives feed's items, the messages and the control
    lines each in the order sent, and the same error where feed fails; compiled or not."""
    if compiled and native is None:
        return
    data = b"".join(items)
    points = sorted({min(cut, len(data)) for cut in cuts})
    chunks = [data[a:b] for a, b in zip([0, *points], [*points, len(data)], strict=True)]
    with pytest.MonkeyPatch.context() as patch:
        whole = outcome(chunks, compiled, patch)
        split = apart(chunks, compiled, patch)
    assert codec.native is native
    seen = whole[0]
    assert split[0] == [item for item in seen if type(item) is Msg]
    assert split[1] == [item for item in seen if type(item) is Control]
    assert split[2:] == whole[1:]


@needs_native
def test_the_scanner_makes_the_parsers_own_types() -> None:
    parser = codec.Parser()
    got = parser.feed(b"MSG a 1 r 2\r\nhi\r\nHMSG b 2 12 14\r\nNATS/1.0\r\n\r\nyo\r\nPING\r\n")
    assert got == [
        Msg(b"a", 1, b"r", b"", b"hi"),
        Msg(b"b", 2, b"", b"NATS/1.0\r\n\r\n", b"yo"),
        Control(b"PING", b""),
    ]
    assert [type(item) for item in got] == [Msg, Msg, Control]
    assert got[0].payload == b"hi" and got[1].headers.startswith(b"NATS/1.0")
    assert native is not None
    with pytest.raises(ValueError, match="before the buffer"):
        native.scan(b"PING\r\n", -1, Msg, Control)


REPLIES = st.one_of(
    st.builds(
        lambda seq, stamp, pending: b"$JS.ACK.S.C.1.%s.%d.%s.%s" % (seq, 3, stamp, pending),
        NUMBERS,
        NUMBERS,
        NUMBERS,
    ),
    st.builds(
        lambda seq, stamp, pending, extra: (
            b"$JS.ACK.D.H.S.C.1.%s.4.%s.%s" % (seq, stamp, pending) + extra
        ),
        NUMBERS,
        NUMBERS,
        NUMBERS,
        st.sampled_from([b"", b".r", b".r.s", b".a" * 25]),
    ),
    st.sampled_from([b"", b"_INBOX.x.1", b"$JS.ACK.", b"$JS.ACK.a.b"]),
)


@needs_native
@settings(max_examples=400, deadline=None)
@given(
    messages=st.lists(
        st.builds(Msg, SUBJECTS, st.integers(0, 3), REPLIES, st.just(b""), st.binary(max_size=8)),
        max_size=12,
    ),
    start=st.integers(-2, 13),
    sid=st.integers(0, 3),
    limit=st.integers(1, 14),
)
def test_deliveries_read_as_the_python_code_reads_them(
    messages: list[Msg], start: int, sid: int, limit: int
) -> None:
    assert native is not None
    assert native.deliveries(messages, start, sid, limit) == ranged._deliveries(
        messages, start, sid, limit
    )


@needs_native
def test_deliveries_take_both_reply_forms_and_stop_at_a_status() -> None:
    assert native is not None
    messages = [
        Msg(b"e.a", 9, b"$JS.ACK.S.C.1.41.41.1795814609528077441.2", b"", b"one"),
        Msg(b"other", 5, b"", b"", b"skipped"),
        Msg(b"e.b", 9, b"$JS.ACK.dom.hash.S.C.1.42.42.1795814609528077442.0.tok", b"", b"two"),
        Msg(b"_INBOX.x.1", 9, b"", b"NATS/1.0 404 No Messages\r\n\r\n", b""),
        Msg(b"e.c", 9, b"$JS.ACK.S.C.1.43.43.1795814609528077443.0", b"", b"three"),
    ]
    for read in (native.deliveries, ranged._deliveries):
        assert read(messages, 0, 9, 100) == (
            3,
            [41, 42],
            [b"e.a", b"e.b"],
            [b"one", b"two"],
            [1795814609528077441, 1795814609528077442],
            [2, 0],
        )
        assert read(messages, 0, 9, 1)[0] == 1
        assert read(messages, 4, 9, 100)[1] == [43]


BATCH_PART = st.one_of(
    st.binary(max_size=40),
    st.integers(0, 3).map(lambda n: b"x" * (0xFFFF + n)),  # a size past 16 bits
)


@needs_native
@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.tuples(SUBJECTS, st.binary(max_size=40), BATCH_PART), max_size=12),
    st.binary(min_size=1, max_size=40),
    st.one_of(st.just(b""), SUBJECTS),
)
def test_an_atomic_batch_is_the_same_bytes_compiled(
    messages: list[tuple[bytes, bytes, bytes]], batch: bytes, reply: bytes
) -> None:
    """The compiled builder of an atomic batch's HPUBs gives the Python function's bytes,
    and leaves to it what is not a list of bytes tuples."""
    from bus.nats import jsapi

    assert codec.native is not None
    assert codec.native.batch_publishes(messages, batch, reply) == jsapi._batch_publishes(
        messages, batch, reply
    )
    assert jsapi.batch_publishes(tuple(messages), batch, reply) == jsapi._batch_publishes(
        messages, batch, reply
    )
    if messages:
        odd = [*messages[:-1], (messages[-1][0], bytearray(messages[-1][1]), messages[-1][2])]
        assert codec.native.batch_publishes(odd, batch, reply) is None
        assert jsapi.batch_publishes(odd, batch, reply) == jsapi._batch_publishes(
            messages, batch, reply
        )


@needs_native
def test_scanned_items_leave_the_collector_only_where_nothing_can_be_added_to_them() -> None:
    """Msg and Control hold bytes and ints and take no attributes: out of the cyclic
    collector's sight, and so are a run's columns. A tuple subclass with a __dict__ could
    hold a cycle: tracked."""
    import gc

    assert native is not None
    data = b"MSG a 1 r 2\r\nhi\r\nPING\r\n"
    items, _ = native.scan(data, 0, Msg, Control)
    assert [type(item) for item in items] == [Msg, Control]
    assert not any(gc.is_tracked(item) for item in items)

    class Open(tuple):  # type: ignore[type-arg]
        pass

    items, _ = native.scan(data, 0, Open, Open)
    assert len(items) == 2 and all(gc.is_tracked(item) for item in items)

    # A run's columns hold ints and bytes and nothing adds to them: out of sight too.
    data = b"MSG s.x 7 $JS.ACK.S.C.1.5.5.17.0 2\r\nhi\r\n"
    items, _ = native.scan(data, 0, Msg, Control, None, 7, codec.Run, False)
    assert type(items[0]) is codec.Run
    assert not any(gc.is_tracked(column) for column in items[0][:5])


REPLIES = st.sampled_from(
    [
        b"$JS.ACK.S.C.1.5.5.1795814609528077441.0",
        b"$JS.ACK.dom.hash.S.C.1.6.6.1795814609528077441.3.tok",
        b"$JS.ACK.S.C.1.x.5.1.0",
        b"$JS.ACK.S.C.1.18446744073709551616.5.1.0",
        b"$JS.ACK.S.C.1.5",
        b"$JS.ACK.S.C.1.5.5.17.0.",
        b"$JS.ACK.dom.hash.S.C.1.6.6.17.3" + b".x" * 21,  # 32 tokens: the most read
        b"$JS.ACK.dom.hash.S.C.1.6.6.17.3" + b".x" * 22,  # 33: not a delivery
        b"_INBOX.abc.7",
        # The same head as the first, read after it (a consumer's replies share their
        # first four tokens): the rest must still be read as a whole reply would be.
        b"$JS.ACK.S.C.2.6.6.1795814609528077442.0",
        b"$JS.ACK.S.C..7.x.18446744073709551615.00",
        b"$JS.ACK.S.C.1.5.5.1.0.9.9",  # 11 tokens: other places
        b"$JS.ACK.S.C.1.5.5.1.0.9.9.8",
        b"$JS.ACK.S.C.1.5.5..0",
        b"$JS.ACK.S.C.1.5.5.1.",
        b"$JS.ACK.S.C.1.5.5.1.x",
        b"$JS.ACK.S.C.1.99999999999999999999.5.1.0",
        b"$JS.ACK.S.C.1.012345678901234567890.5.1.0",
        b"$JS.ACK.S.C.1.5.5.1",
        b"$JS.ACK.S.CC.1.5.5.1.0",
        b"$JS.ACK.S.C",
        b"$JS.ACK.S.C.",
    ]
)


@st.composite
def delivery(draw: Any) -> bytes:
    """A message on sid 7, often a JetStream delivery (HMSG or MSG)."""
    payload = draw(st.binary(max_size=20))
    headers = draw(st.sampled_from([b"", b"NATS/1.0\r\nNats-Msg-Id: 9\r\n\r\n"]))
    reply, body = draw(REPLIES), headers + payload
    sid = draw(st.sampled_from([b"7", b"7", b"7", b"8"]))
    if headers:
        line = b"HMSG s.x %s %s %d %d" % (sid, reply, len(headers), len(body))
    else:
        line = b"MSG s.x %s %s %d" % (sid, reply, len(body))
    return line + b"\r\n" + body + b"\r\n"


def flat(items: list[Any]) -> tuple[list[Any], int]:
    """Runs taken apart into one entry a delivery (where a run ends is no outcome), and
    the bytes the runs counted."""
    out: list[Any] = []
    counted = 0
    for item in items:
        if type(item) is codec.Run:
            out += [("delivery", *values) for values in zip(*item[:5], strict=True)]
            counted += item.bytes
        else:
            out.append(item)
    return out, counted


def runs(
    chunks: list[bytes], compiled: bool, split: bool, stamps: bool, patch: pytest.MonkeyPatch
) -> Any:
    patch.setattr(codec, "native", native if compiled else None)
    parser = codec.Parser()
    parser.run_sid, parser.run_stamps = 7, stamps
    items: list[Any] = []
    controls: list[Control] = []
    try:
        for chunk in chunks:
            if split:
                more, lines = parser.feed_apart(chunk)
                items += more
                controls += lines
            else:
                items += parser.feed(chunk)
    except Exception as error:
        return flat(items), controls, type(error).__name__, str(error)
    return flat(items), controls, parser._buffer


@settings(max_examples=400, deadline=None)
@given(
    items=st.lists(st.one_of(delivery(), delivery(), message(), CONTROLS), max_size=14),
    cuts=st.lists(st.integers(0, 2000), max_size=6),
    split=st.booleans(),
    stamps=st.booleans(),
)
def test_deliveries_in_runs_are_what_the_messages_give_compiled_or_not(
    items: list[bytes], cuts: list[int], split: bool, stamps: bool
) -> None:
    """A parser told of a subscription gives its JetStream deliveries as runs of columns:
    taken apart, the runs hold what deliveries() reads of the messages a parser not told
    gives (the bytes counted are theirs), everything else the same, the same errors;
    compiled and in Python alike; without stamps, each time stored 0."""
    data = b"".join(items)
    points = sorted({min(cut, len(data)) for cut in cuts})
    chunks = [data[a:b] for a, b in zip([0, *points], [*points, len(data)], strict=True)]
    with pytest.MonkeyPatch.context() as patch:
        plain = outcome(chunks, False, patch)
        slow = runs(chunks, False, split, stamps, patch)
        fast = runs(chunks, True, split, stamps, patch) if native is not None else slow
    assert codec.native is native
    assert fast == slow
    expected: list[Any] = []
    counted = 0
    for item in plain[0]:
        read = codec.delivered(item.reply) if type(item) is Msg and item.sid == 7 else None
        if read is None:
            if not (split and type(item) is Control):
                expected.append(item)
            continue
        columns = ranged._deliveries([item], 0, 7, 1)
        assert columns[1:] == ([read[0]], [item.subject], [item.payload], [read[1]], [read[2]])
        stamp = read[1] if stamps else 0
        expected.append(("delivery", read[0], item.subject, item.payload, stamp, read[2]))
        counted += len(item.headers) + len(item.payload)
    assert slow[0] == (expected, counted)
    if split:
        assert slow[1] == [item for item in plain[0] if type(item) is Control]
    assert slow[2:] == plain[1:]


@pytest.mark.parametrize("compiled", [False, True])
def test_deliveries_one_after_another_are_one_run_until_another_message(compiled: bool) -> None:
    if compiled and native is None:
        pytest.skip("the compiled scanner is not built")
    reply = b"$JS.ACK.S.C.1.%d.%d.1795814609528077441.%d"
    data = b"".join(
        b"HMSG s.%d 7 %s 12 14\r\nNATS/1.0\r\n\r\nhi\r\n" % (n, reply % (n, n, 3 - n))
        for n in (1, 2)
    )
    data += b"PING\r\nMSG s.3 7 %s 2\r\nho\r\n" % (reply % (3, 3, 0))
    data += b"HMSG _INBOX.x.1 7 18 18\r\nNATS/1.0 408 x\r\n\r\n\r\nMSG s.4 7 %s 0\r\n\r\n" % (
        reply % (4, 4, 0)
    )
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(codec, "native", native if compiled else None)
        parser = codec.Parser()
        parser.run_sid = 7
        items, controls = parser.feed_apart(data)
    stamp = 1795814609528077441
    assert items == [
        codec.Run(
            [1, 2, 3], [b"s.1", b"s.2", b"s.3"], [b"hi", b"hi", b"ho"], [stamp] * 3, [2, 1, 0], 30
        ),
        Msg(b"_INBOX.x.1", 7, b"", b"NATS/1.0 408 x\r\n\r\n", b""),
        codec.Run([4], [b"s.4"], [b""], [stamp], [0], 0),
    ]
    assert controls == [Control(b"PING", b"")]


#: A reply's numbers as the scanner reads them eight digits at a time: any count of digits,
#: and one of them perhaps with a byte beside the digits' range ("/", ":") or past it.
PLAIN_NUMBERS = st.integers(0, 2**64 + 9).map(lambda n: str(n).encode())
ODD_NUMBERS = st.tuples(
    st.integers(10**7, 10**21).map(lambda n: str(n).encode()),
    st.integers(0, 21),
    st.sampled_from([b"/", b":", b"\xfa", b"\xff", b"a", b"0" * 9]),
).map(lambda t: t[0][: t[1]] + t[2] + t[0][t[1] :])


@st.composite
def shared_head(draw: Any) -> bytes:
    """A delivery's reply with the head "$JS.ACK.S.C.", its numbers plain but perhaps one;
    sometimes a token fewer or more (a byte read as a dot would make it nine)."""
    tokens = [draw(PLAIN_NUMBERS) for _ in range(draw(st.sampled_from([5, 5, 5, 4, 6])))]
    if draw(st.booleans()):
        tokens[draw(st.integers(0, len(tokens) - 1))] = draw(ODD_NUMBERS)
    return b"$JS.ACK.S.C." + b".".join(tokens)


#: Subjects of one size and the same last eight bytes (one place in the scanner's table).
RUN_SUBJECTS = st.sampled_from([b"a.12345678", b"b.12345678", b"s.x", b"evt.~.t.12345678"])


@needs_native
@settings(max_examples=300, deadline=None)
@given(
    replies=st.lists(
        st.tuples(st.one_of(REPLIES, shared_head(), shared_head()), RUN_SUBJECTS),
        min_size=2,
        max_size=10,
    ),
    cuts=st.lists(st.integers(0, 600), max_size=3),
)
def test_replies_that_share_a_head_are_each_read_whole(
    replies: list[tuple[bytes, bytes]], cuts: list[int]
) -> None:
    """The scanner reads a reply whose first four tokens are the last delivery's from the
    fifth on: what it reads is what the Python code reads of the whole reply (another
    number of tokens, other places, a number that is not one), whole or split anywhere;
    and the subjects it keeps from one read to the next are the ones sent."""
    replies = [(b"$JS.ACK.S.C.1.5.5.17.0", b"s.x"), *replies]  # the head known first
    data = b"".join(b"MSG %s 7 %s 2\r\nhi\r\n" % (subject, reply) for reply, subject in replies)
    points = sorted({min(cut, len(data)) for cut in cuts})
    chunks = [data[a:b] for a, b in zip([0, *points], [*points, len(data)], strict=True)]
    with pytest.MonkeyPatch.context() as patch:
        slow = runs(chunks, False, True, True, patch)
        fast = runs(chunks, True, True, True, patch)
    assert fast == slow


@needs_native
def test_scanning_runs_of_deliveries_leaks_nothing() -> None:
    """Many scans of deliveries whose replies share a head (and some that do not), their
    subjects kept from one scan to the next or not, leave resident memory flat, and the
    subjects kept their references."""
    replies = [b"$JS.ACK.S.C.1.%d.%d.1795814609528077441.9" % (n, n) for n in range(60)]
    replies += [b"$JS.ACK.S.C.1.5.5.1.0.9.9", b"$JS.ACK.S.C.1.x.5.1.0", b"_INBOX.a.1"]
    data = b"".join(b"MSG s.x 7 %s 100\r\n%s\r\n" % (r, b"p" * 100) for r in replies)

    kept: list[bytes | None] = [None] * codec.SUBJECT_SLOTS

    def scans(count: int) -> None:
        for _ in range(count):
            native.scan(data, 0, Msg, Control, [], 7, codec.Run, False)
            native.scan(data, 0, Msg, Control, [], 7, codec.Run, False, kept)

    scans(200)
    subject = next(known for known in kept if known is not None)
    held = sys.getrefcount(subject)
    before = resident()
    scans(5000)
    assert resident() - before < 4 << 20  # a payload a scan kept would be 30 MiB
    assert sys.getrefcount(subject) == held


@needs_native
def test_a_topics_subject_is_one_object_from_one_read_to_the_next() -> None:
    """A parser's scans keep the subjects they made: a dict keyed by a subject read
    earlier finds the same object again (no comparison of bytes)."""
    parser = codec.Parser()
    parser.run_sid = 7
    one = b"MSG evt.~.t.~ 7 $JS.ACK.S.C.1.%d.%d.17.0 2\r\nhi\r\n"
    first, second = (parser.feed(one % (n, n))[0] for n in (1, 2))
    assert type(first) is type(second) is codec.Run
    assert first.subjects[0] is second.subjects[0]
