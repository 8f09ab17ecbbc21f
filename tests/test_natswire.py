"""bus.nats: the NATS wire parsed from any split of the bytes (hypothesis), broken
input refused as a protocol error and nothing else, JetStream's reply subjects read in
both forms; and against a real nats-server: a blocking connection admitted or refused
by token, requests and no-responders, and ranged reads of a stream through a pull
consumer (subject filters, range ends, chunks smaller than a pull, an empty range, a
start that retention removed); batches published atomic or message by message, a resend
of ids already stored taking its first sequences, a batch nobody stores refused."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bus.nats import codec, jsapi
from bus.nats.codec import Control, Msg, Parser, ProtocolError, Run

tokens = st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789-_$", min_size=1, max_size=8)
subject_text = st.lists(tokens, min_size=1, max_size=4).map(".".join)
header_blocks = st.dictionaries(
    st.sampled_from([b"Nats-Msg-Id", b"X-A", b"Nats-Sequence"]),
    st.binary(min_size=1, max_size=10).map(lambda b: b.hex().encode()),
    max_size=3,
).map(codec.header_block)


@st.composite
def wire_items(draw: Any) -> tuple[bytes, Msg | Control]:
    kind = draw(st.sampled_from(["MSG", "HMSG", "PING", "PONG", "+OK", "INFO", "-ERR"]))
    if kind in ("MSG", "HMSG"):
        subject = draw(subject_text).encode()
        sid = draw(st.integers(1, 10**6))
        reply = draw(st.one_of(st.just(""), subject_text)).encode()
        payload = draw(st.binary(max_size=300))
        headers = draw(header_blocks) if kind == "HMSG" else b""
        tail = b" " + reply if reply else b""
        if kind == "MSG":
            line = b"MSG %s %d%s %d\r\n" % (subject, sid, tail, len(payload))
        else:
            size = len(headers) + len(payload)
            line = b"HMSG %s %d%s %d %d\r\n" % (subject, sid, tail, len(headers), size)
        return line + headers + payload + b"\r\n", Msg(subject, sid, reply, headers, payload)
    if kind == "INFO":
        return b'INFO {"a":1}\r\n', Control(b"INFO", b'{"a":1}')
    if kind == "-ERR":
        return b"-ERR 'Slow Consumer'\r\n", Control(b"-ERR", b"Slow Consumer")
    return kind.encode() + b"\r\n", Control(kind.encode(), b"")


@settings(max_examples=300, deadline=None)
@given(st.lists(wire_items(), max_size=20), st.lists(st.integers(0, 2000), max_size=10))
def test_any_split_of_the_bytes_parses_to_the_same_items(
    items: list[tuple[bytes, Msg | Control]], cuts: list[int]
) -> None:
    wire = b"".join(data for data, _ in items)
    points = sorted({min(c, len(wire)) for c in cuts} | {0, len(wire)})
    parser = Parser()
    got: list[Msg | Control] = []
    for start, end in itertools.pairwise(points):
        got.extend(parser.feed(wire[start:end]))
    assert got == [item for _, item in items]


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=400))
def test_garbage_is_a_protocol_error_or_waits_for_more_never_anything_else(data: bytes) -> None:
    with contextlib.suppress(ProtocolError):
        Parser().feed(data)


@pytest.mark.parametrize(
    "wire",
    [
        b"HELLO there\r\n",
        b"MSG a\r\n",
        b"HMSG a 1 2\r\n",
        b"MSG a 1 2\r\nabcd\r\n",  # payload longer than said
        b"HMSG a 1 9 4\r\nabcd\r\n",  # headers longer than the whole
    ],
)
def test_broken_lines_are_protocol_errors(wire: bytes) -> None:
    with pytest.raises(ProtocolError):
        Parser().feed(wire)


def test_headers_and_statuses_read_from_the_block() -> None:
    block = codec.header_block({b"Nats-Msg-Id": b"abc", b"X-Y": b"1"})
    assert codec.header(block, b"nats-msg-id") == b"abc"
    assert codec.header(block, b"missing") is None
    assert codec.status(block) == 0
    timeout = b"NATS/1.0 408 Request Timeout\r\nNats-Pending-Messages: 3\r\n\r\n"
    assert codec.status(timeout) == 408
    assert codec.description(timeout) == "Request Timeout"
    assert codec.header(timeout, b"Nats-Pending-Messages") == b"3"


def test_both_forms_of_a_delivery_subject() -> None:
    assert jsapi.delivery(b"$JS.ACK.S.C.1.42.7.1700000000000000000.5") == (
        42,
        1700000000000000000,
        5,
    )
    assert jsapi.delivery(b"$JS.ACK.dom.acc.S.C.1.42.7.1700000000000000000.5.xyz") == (
        42,
        1700000000000000000,
        5,
    )
    with pytest.raises(ValueError):
        jsapi.delivery(b"_INBOX.abc")


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.binary(min_size=1, max_size=40),
            st.binary(min_size=1, max_size=40),
            st.binary(max_size=300),
        ),
        min_size=1,
        max_size=30,
    ),
    st.integers(1, 2**40),
)
def test_an_atomic_batch_is_the_publishes_of_its_messages(
    messages: list[tuple[bytes, bytes, bytes]], number: int
) -> None:
    batch, reply = b"0123abcd4567-%d" % number, b"_INBOX.x.%d" % number
    last = len(messages)
    expected = b"".join(
        codec.hpub(
            subject,
            jsapi.batch_headers(msg_id, batch, index, index == last),
            body,
            reply if index == last else b"",
        )
        for index, (subject, msg_id, body) in enumerate(messages, 1)
    )
    assert jsapi.batch_publishes(messages, batch, reply) == expected


def test_errors_in_answers_are_raised_with_their_codes() -> None:
    with pytest.raises(jsapi.JetStreamError) as raised:
        jsapi.answer(b'{"error":{"code":404,"err_code":10059,"description":"stream not found"}}')
    assert raised.value.err_code == 10059 and "stream not found" in str(raised.value)
    assert jsapi.answer(b'{"name":"x"}') == {"name": "x"}


# -- against a real nats-server -------------------------------------------------------------


def fill(url: str, stream: str, topics: list[str], count: int, **config: Any) -> None:
    """``count`` messages, the n-th (from 1) on ``topics[n % len]`` with body ``b"n"``."""
    import nats
    from nats.js.api import StreamConfig

    async def go() -> None:
        nc = await nats.connect(url)
        js = nc.jetstream()
        await js.add_stream(StreamConfig(name=stream, subjects=["t.>"], **config))
        futures = [
            await js.publish_async(f"t.{topics[n % len(topics)]}", b"%d" % n)
            for n in range(1, count + 1)
        ]
        await asyncio.gather(*futures)
        await nc.close()

    asyncio.run(go())


@pytest.fixture
def filled(nats_server: Any) -> Iterator[str]:
    url = nats_server.urls[0]
    fill(url, "R", ["a", "b.x", "b.y"], 2500)
    yield url


def read_all(url: str, after: int, upto: int, filters: list[str], count: int) -> list[Any]:
    from bus.nats.blocking import Connection
    from bus.nats.ranged import RangeRead

    with Connection([url]) as connection:
        reader = RangeRead(connection, "R", after, upto, filters).open()
        out: list[Any] = []
        while rows := reader.next(count):
            assert len(rows) <= count
            out.extend(rows)
        assert reader.done
        reader.close()
    return out


@pytest.mark.parametrize("count", [1000, 37, 5000])
def test_a_ranged_read_gives_every_stored_message_in_order_once(filled: str, count: int) -> None:
    rows = read_all(filled, 0, 2500, ["t.>"], count)
    assert [r.sequence for r in rows] == list(range(1, 2501))
    assert [r.payload for r in rows] == [b"%d" % n for n in range(1, 2501)]
    assert rows[1].subject == b"t.b.y" and rows[2].subject == b"t.a"
    assert all(r.timestamp_ns > 1_600_000_000 * 10**9 for r in rows)


def test_a_ranged_read_gives_the_same_without_the_compiled_scanner(
    filled: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from bus.nats import ranged

    fast = read_all(filled, 0, 2500, ["t.>"], 700)
    monkeypatch.setattr(codec, "native", None)
    monkeypatch.setattr(ranged, "deliveries", ranged._deliveries)
    slow = read_all(filled, 0, 2500, ["t.>"], 700)
    assert slow == fast and len(slow) == 2500


def test_a_ranged_read_keeps_to_its_range_and_its_filters(filled: str) -> None:
    middle = read_all(filled, 100, 1800, ["t.>"], 333)
    assert [r.sequence for r in middle] == list(range(101, 1801))
    bees = read_all(filled, 10, 2000, ["t.b.>"], 100)
    assert [r.sequence for r in bees] == [n for n in range(11, 2001) if n % 3]
    two = read_all(filled, 0, 2500, ["t.a", "t.b.x"], 1000)
    assert [r.sequence for r in two] == [n for n in range(1, 2501) if n % 3 != 2]
    # Nothing under the filter, or nothing in the range: an empty read, done at once.
    assert read_all(filled, 0, 2500, ["t.none.>"], 10) == []
    assert read_all(filled, 2500, 2500, ["t.>"], 10) == []


def test_a_consumer_request_never_answered_is_asked_again_and_makes_one_consumer(
    filled: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A request to make the read's consumer that reaches no meta leader (one being elected)
    is never answered: the read asks again soon, and, its consumer being named, the server
    holds one consumer however many times it was asked."""
    from bus.nats import ranged
    from bus.nats.blocking import Connection
    from bus.nats.ranged import RangeRead

    monkeypatch.setattr(ranged, "CREATE_ATTEMPT", 0.5)
    with Connection([filled]) as connection:
        request = connection.request
        unanswered = []

        def lose_the_first_answer(subject: str, payload: bytes, timeout: Any = None) -> Any:
            if ".CONSUMER.CREATE." in subject and not unanswered:
                unanswered.append(subject)
                request(subject, payload, timeout)  # the server makes it; the answer is lost
                raise TimeoutError("no answer")
            return request(subject, payload, timeout)

        monkeypatch.setattr(connection, "request", lose_the_first_answer)
        reader = RangeRead(connection, "R", 0, 2500, ["t.>"]).open()
        assert unanswered and unanswered[0].endswith("." + reader.consumer)
        names = jsapi.answer(request(f"{jsapi.API}.CONSUMER.NAMES.R", b"").payload)
        assert names["consumers"] == [reader.consumer]
        rows = []
        while chunk := reader.next(1000):
            rows.extend(chunk)
        assert [r.sequence for r in rows] == list(range(1, 2501))
        reader.close()


def test_a_start_that_retention_removed_shows_as_the_first_stored(nats_server: Any) -> None:
    from bus.nats.blocking import Connection
    from bus.nats.ranged import RangeRead

    url = nats_server.urls[0]
    fill(url, "R", ["a"], 300, max_msgs=100)
    with Connection([url]) as connection:
        reader = RangeRead(connection, "R", 0, 300, ["t.>"]).open(check_retention=True)
        assert reader.first_stored == 201
        assert [r.sequence for r in reader.next(1000)] == list(range(201, 301))


def test_a_connection_is_refused_without_the_token_and_answers_with_it(tmp_path: Path) -> None:
    from bus.nats.blocking import ConnectError, Connection
    from tests.ports import free_port, nats_cluster

    cluster = nats_cluster(tmp_path / "nats", size=1, token="s3cret")
    cluster.start()
    try:
        url = cluster.urls[0]
        for given_url in (url, url.replace("nats://", "nats://wrong@")):
            with pytest.raises(ConnectError) as raised:
                Connection([given_url], timeout=2)
            assert "authorization violation" in str(raised.value).lower()
        dead = f"nats://127.0.0.1:{free_port()}"
        good = url.replace("nats://", "nats://s3cret@")
        # The servers are tried in order: a dead one first costs nothing but its refusal.
        with Connection([dead, good], timeout=2) as connection:
            assert connection.info["jetstream"] is True
            with pytest.raises(ConnectionRefusedError):
                connection.request("nobody.listens", b"")
            answer = jsapi.answer(connection.request("$JS.API.INFO", b"").payload)
            assert answer["type"] == "io.nats.jetstream.api.v1.account_info_response"
            with pytest.raises(jsapi.JetStreamError) as missing:
                jsapi.answer(connection.request(jsapi.stream_info("NOPE"), b"").payload)
            assert missing.value.err_code == 10059
        with pytest.raises(ConnectError) as none:
            Connection([dead], timeout=2)
        assert dead in str(none.value)
    finally:
        cluster.stop()


@pytest.mark.parametrize("limits", [(10_000, 10**9), (25, 10**9), (10_000, 3_000)])
@pytest.mark.parametrize("by", ["poll", "request"])
def test_messages_that_come_meanwhile_are_kept_within_the_pending_limits(
    nats_server: Any, limits: tuple[int, int], by: str
) -> None:
    """Messages of a subscription that a poll finds, or that arrive while a request
    waits, wait for read() in order; past the pending limits (count, bytes) the rest are
    dropped and counted, never more kept than the limits allow."""
    import time

    from bus.nats.blocking import Connection, Limits

    url = nats_server.urls[0]
    pending = Limits(*limits)
    with Connection([url]) as sender, Connection([url], pending=pending) as connection:
        sid = connection.subscribe("kept.>")
        connection.flush()
        bodies = [b"%04d" % i + b"x" * 96 for i in range(60)]
        for body in bodies:
            sender.publish("kept.one", body)
        sender.flush()
        if by == "request":  # its wait reads them all: they came before its answer
            connection.request("$JS.API.INFO", b"")
        else:  # each poll takes what came so far, until all came (kept or dropped)
            deadline = time.monotonic() + 10
            while len(connection._pending) + connection.dropped < len(bodies):
                assert time.monotonic() < deadline, "the messages never came"
                connection.poll()
        got = [m.payload for m in connection.read(timeout=5) if m.sid == sid]
        assert got == bodies[: len(got)]  # in order, the first ones
        assert len(got) + connection.dropped == len(bodies)
        assert len(got) <= pending.messages
        assert sum(len(b) for b in got) <= pending.bytes
        assert (connection.dropped == 0) == (limits == (10_000, 10**9))


@pytest.mark.parametrize("limits", [(10_000, 10**9), (25, 10**9), (10_000, 3_000)])
@pytest.mark.parametrize("by", ["poll", "request"])
def test_deliveries_in_runs_are_kept_within_the_pending_limits(
    nats_server: Any, limits: tuple[int, int], by: str
) -> None:
    """A stream's deliveries that come as runs (runs_of_deliveries) while a poll or a
    request reads: kept for read() in order within the pending limits, each of a
    run's messages counted; of a run that does not fit, its first messages are kept as
    one by one, the rest dropped and counted (no gap: the first ones, in order)."""
    import time

    from bus.nats.blocking import Connection, Limits

    url = nats_server.urls[0]
    make_stream(url, "K", False)
    bodies = [b"%04d" % i + b"x" * 96 for i in range(60)]
    with Connection([url]) as sender:
        for body in bodies:
            jsapi.answer(sender.request("k.one", body).payload)
    pending = Limits(*limits)
    with Connection([url], pending=pending) as connection:
        connection.runs_of_deliveries()
        config = jsapi.ranged_consumer("K", 1, ["k.>"], name="c")
        jsapi.answer(connection.request(jsapi.consumer_create("K", "c"), config).payload)
        connection.publish(
            jsapi.consumer_next("K", "c"), jsapi.pull(100, 5), connection.new_inbox()
        )
        deadline = time.monotonic() + 10
        while connection._pending_count + connection.dropped < len(bodies):
            assert time.monotonic() < deadline, "the deliveries never came"
            if by == "request":
                connection.request("$JS.API.INFO", b"")
            else:
                connection.poll()
        items = connection.read(timeout=5) if connection._pending_count else []
        runs = [item for item in items if isinstance(item, Run)]
        got = [payload for run in runs for payload in run.payloads]
        assert got == bodies[: len(got)]  # in order, the first ones
        assert [s for run in runs for s in run.sequences] == list(range(1, len(got) + 1))
        assert len(got) + connection.dropped == len(bodies)
        assert len(got) <= pending.messages
        assert sum(len(b) for b in got) <= pending.bytes
        assert (connection.dropped == 0) == (limits == (10_000, 10**9))


def test_a_run_that_does_not_fit_keeps_its_first_messages_as_one_by_one(nats_server: Any) -> None:
    """Runs kept while a request waits: of one past the limits, the first messages that
    fit (by count, then by bytes with their share of the headers), the rest dropped and
    counted; a later run that would fit by bytes leaves no gap once the count is full."""
    from bus.nats.blocking import Connection, Limits

    def run(first: int, count: int) -> Run:
        numbers = list(range(first, first + count))
        payloads = [b"p" * 10] * count
        return Run(numbers, [b"s"] * count, payloads, numbers, numbers, 12 * count)

    with Connection([nats_server.urls[0]], pending=Limits(25, 10**9)) as connection:
        connection.runs_of_deliveries()
        for item in (run(1, 20), run(21, 10), run(31, 3)):
            connection._keep(item)
        kept = connection.read(timeout=1)
        assert [s for r in kept for s in r.sequences] == list(range(1, 26))
        assert [r.bytes for r in kept] == [240, 60] and connection.dropped == 8
    with Connection([nats_server.urls[0]], pending=Limits(100, 100)) as connection:
        connection.runs_of_deliveries()
        connection._keep(run(1, 10))  # 12 bytes each: 8 fit in 100
        kept = connection.read(timeout=1)
        assert kept[0].sequences == list(range(1, 9)) and kept[0].bytes == 96
        assert connection.dropped == 2


def make_stream(url: str, name: str, atomic: bool) -> None:
    from bus.nats.blocking import Connection

    config = {"name": name, "subjects": [f"{name.lower()}.>"], "allow_atomic": atomic}
    with Connection([url]) as connection:
        made = jsapi.answer(
            connection.request(f"$JS.API.STREAM.CREATE.{name}", json.dumps(config).encode()).payload
        )
    assert bool(made["config"].get("allow_atomic")) is atomic


@pytest.mark.parametrize("atomic", [True, False])
def test_batches_are_stored_once_each_way_and_resends_keep_their_sequences(
    nats_server: Any, atomic: bool
) -> None:
    from bus.nats.blocking import Connection
    from bus.nats.publish import Publisher

    url = nats_server.urls[0]
    make_stream(url, "P", atomic)

    def batch(ids: range) -> list[tuple[bytes, bytes, bytes]]:
        return [(b"p.x.%d" % (n % 7), b"id-%d" % n, b"body %d" % n) for n in ids]

    with Connection([url]) as connection:
        publisher = Publisher(connection, atomic=atomic)
        # 2,500 in one call: three atomic batches (at most 1,000 each) or 2,500 acks.
        assert publisher.publish(batch(range(2500)), timeout=10) == list(range(1, 2501))
        # A resend after a failover: ids the stream holds, then new ones. JetStream
        # refuses that as an atomic batch; it goes message by message and the stream
        # drops the repeats, which answer with their first sequences.
        again = publisher.publish(batch(range(2490, 2510)), timeout=10)
        assert again == list(range(2491, 2501)) + list(range(2501, 2511))
        assert publisher.resent_each == (1 if atomic else 0)
        # The same id twice in one batch: stored once.
        twice = publisher.publish(batch(range(3000, 3001)) * 2, timeout=10)
        assert twice == [2511, 2511]
        state = jsapi.answer(connection.request(jsapi.stream_info("P"), b"").payload)["state"]
        assert state["messages"] == 2511
        stored = read_all_of(url, "P", 2511)
        assert [r.payload for r in stored[:3]] == [b"body 0", b"body 1", b"body 2"]
        assert stored[-1].payload == b"body 3000"


def read_all_of(url: str, stream: str, upto: int) -> list[Any]:
    from bus.nats.blocking import Connection
    from bus.nats.ranged import RangeRead

    with Connection([url]) as connection:
        reader = RangeRead(connection, stream, 0, upto, [f"{stream.lower()}.>"]).open()
        out: list[Any] = []
        while rows := reader.next(5000):
            out.extend(rows)
        reader.close()
    return out


def test_a_batch_the_stream_cannot_take_is_a_publish_error(nats_server: Any) -> None:
    from bus.nats.blocking import Connection
    from bus.nats.publish import Publisher, PublishError

    url = nats_server.urls[0]
    make_stream(url, "Q", True)
    with Connection([url]) as connection:
        for atomic in (True, False):
            with pytest.raises(PublishError, match="no response from stream"):
                # No stream holds these subjects: nobody answers.
                Publisher(connection, atomic=atomic).publish([(b"none.x", b"i", b"b")], 5)


class LaggingReplica:
    """A connection whose consumer sits on a replica that lags: it delivers sequence 1
    saying nothing is pending, while the leader already holds 2 (and 3); a pull then
    expires empty, and the replica, caught up, delivers 2 and 3."""

    reply_sid = 1
    timeout = 1.0

    def __init__(self) -> None:
        self.inboxes = itertools.count(1)
        self.pulls: list[bytes] = []
        self.asked: list[dict[str, Any]] = []
        self.reads = 0

    def new_inbox(self) -> str:
        return f"_INBOX.t.{next(self.inboxes)}"

    def publish(self, subject: str, payload: bytes, reply: str = "") -> None:
        self.pulls.append(reply.encode())

    def request(self, subject: str, payload: bytes, timeout: float | None = None) -> Msg:
        if subject.startswith("$JS.API.CONSUMER.CREATE."):
            return Msg(b"r", 1, b"", b"", b'{"name":"c","num_pending":1}')
        assert subject == "$JS.API.STREAM.MSG.GET.S"
        self.asked.append(json.loads(payload))
        return Msg(b"r", 1, b"", b"", b'{"message":{"subject":"s.x","seq":2}}')

    def runs_of_deliveries(self, stamps: bool = True) -> None:
        """Deliveries stay messages here: the read takes both forms."""

    def read(self, timeout: float | None = None) -> list[Msg]:
        def delivery(seq: int, pending: int) -> Msg:
            reply = b"$JS.ACK.S.c.1.%d.%d.1700000000000000000.%d" % (seq, seq, pending)
            return Msg(b"s.x", 1, reply, b"", b"%d" % seq)

        self.reads += 1
        assert self.reads <= 3, "read on after the range's end"
        if self.reads == 1:
            return [delivery(1, 0)]
        if self.reads == 2:
            return [Msg(self.pulls[0], 1, b"", b"NATS/1.0 408 Request Timeout\r\n\r\n", b"")]
        return [delivery(2, 1), delivery(3, 0)]


def test_a_replica_that_lags_does_not_end_a_read_short() -> None:
    from bus.nats.ranged import RangeRead

    lagging = LaggingReplica()
    reader = RangeRead(lagging, "S", 0, 3, ["s.>"]).open()  # type: ignore[arg-type]
    rows: list[Any] = []
    while chunk := reader.next(10):
        rows.extend(chunk)
    assert [r.sequence for r in rows] == [1, 2, 3]
    assert reader.behind == 1  # the replica said "nothing" after 1; the leader had 2
    assert lagging.asked == [{"seq": 2, "next_by_subj": "s.>"}]


class FreshConsumer:
    """A connection whose consumer was just made on another server: its first
    ``unanswered`` pulls find no responder (status 503), then it delivers 1..3."""

    reply_sid = 1
    timeout = 1.0

    def __init__(self, unanswered: int) -> None:
        self.inboxes = itertools.count(1)
        self.pulls: list[bytes] = []
        self.unanswered = unanswered

    def new_inbox(self) -> str:
        return f"_INBOX.t.{next(self.inboxes)}"

    def publish(self, subject: str, payload: bytes, reply: str = "") -> None:
        self.pulls.append(reply.encode())

    def request(self, subject: str, payload: bytes, timeout: float | None = None) -> Msg:
        assert subject.startswith("$JS.API.CONSUMER.CREATE.")
        return Msg(b"r", 1, b"", b"", b'{"name":"c","num_pending":3}')

    def runs_of_deliveries(self, stamps: bool = True) -> None:
        """Deliveries come as a run of columns, as a connection's parser makes them."""

    def read(self, timeout: float | None = None) -> list[Msg | Run]:
        if self.unanswered:
            self.unanswered -= 1
            return [Msg(self.pulls[-1], 1, b"", b"NATS/1.0 503\r\n\r\n", b"")]
        stamps = [1700000000000000000] * 3
        return [Run([1, 2, 3], [b"s.x"] * 3, [b"1", b"2", b"3"], stamps, [2, 1, 0], 3)]


def test_pulls_a_consumer_just_made_does_not_answer_yet_are_sent_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from bus.nats import ranged
    from bus.nats.ranged import RangeRead

    monkeypatch.setattr(ranged, "REPULL", 0.001)
    fresh = FreshConsumer(unanswered=5)
    reader = RangeRead(fresh, "S", 0, 3, ["s.>"]).open()  # type: ignore[arg-type]
    assert [r.sequence for r in reader.next(10)] == [1, 2, 3]
    assert len(fresh.pulls) > 5  # each unanswered pull sent again
    # One that never answers (its server is gone): the read fails once the grace is over.
    monkeypatch.setattr(ranged, "NO_RESPONDERS_GRACE", 0.05)
    gone = RangeRead(FreshConsumer(unanswered=10**6), "S", 0, 3, ["s.>"]).open()  # type: ignore[arg-type]
    with pytest.raises(jsapi.JetStreamError, match="no responders for consumer c") as raised:
        gone.next(10)
    assert raised.value.code == 503
