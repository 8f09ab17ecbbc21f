"""One SYNCSTART's answer (bus.eventbus.snapshots.SnapshotStream) with no socket: a log in
memory, a fake socket that takes what it has room for, and the request as the codec
parses it. Which events (subtrees, above a sequence, up to the bus's sequence at the
request), in order, chunk by chunk, the SYNCEND's value in both dialects, a client that
stops reading and starts again, and one that goes away."""

from __future__ import annotations

from typing import Any

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bus.eventbus import codec
from bus.eventbus.codec import SEQUENCE, SequenceEncoding
from bus.eventbus.snapshots import SnapshotStream
from bus.testing import MemoryEventLog
from bus.transport.zmqsocket import PeerUnreachable

UUID = b"0d5e8f1e-6a43-4a4f-9c5e-6f3f9d0a1b2c"


class FakeSocket:
    """Takes up to ``room`` messages per call (None: all); ``gone``: the peer left."""

    def __init__(self, room: int | None = None) -> None:
        self.room = room
        self.gone = False
        self.sent: list[list[bytes]] = []

    def send_many(self, messages: list[list[bytes]]) -> int:
        if self.gone:
            raise PeerUnreachable("gone")
        taken = messages if self.room is None else messages[: self.room]
        self.sent.extend(list(m) for m in taken)
        return len(taken)


def log_of(topics: list[str]) -> MemoryEventLog:
    memory = MemoryEventLog()
    memory.append_fields(
        [
            (t.encode(), b"p", b"2026-11-27T00:00:00Z", UUID, msgpack.packb(i))
            for i, t in enumerate(topics)
        ],
        0.0,
    )
    return memory


def stream(frames: list[bytes], upto: int, encoding: Any = SequenceEncoding.BINARY) -> Any:
    request = codec.parse_sync_start(frames)
    return SnapshotStream(b"client", request, upto, request.encoding or encoding, 0.0)


def run(
    answer: SnapshotStream,
    memory: MemoryEventLog,
    sock: FakeSocket,
    *,
    chunk: int = 500,
    current: bool = False,
    budget: int = 10_000,
) -> str:
    outcome, _ = answer.pump(sock, memory, budget, chunk, current)  # type: ignore[arg-type]
    return outcome


def syncs(sock: FakeSocket) -> list[tuple[bytes, bytes]]:
    return [(m[2], m[3]) for m in sock.sent if m[1] == b"SYNC"]


def test_subtrees_above_the_sequence_in_order_then_the_highest_sent() -> None:
    memory = log_of(["/a/1/", "/b/1/", "/a/2/", "/c/1/", "/b/2/", "/a/3/"])
    sock = FakeSocket()
    answer = stream([b"SYNCSTART", b"/a/;/b/", SEQUENCE.pack(2)], upto=6)
    assert run(answer, memory, sock) == "finished"
    assert [(m[2], SEQUENCE.unpack(m[3])[0]) for m in sock.sent[:-1]] == [
        (b"/a/2/", 3), (b"/b/2/", 5), (b"/a/3/", 6),
    ]  # fmt: skip
    assert all(m[0] == b"client" and len(m) == 8 for m in sock.sent[:-1])
    assert sock.sent[-1] == [b"client", b"SYNCEND", b"/a/;/b/", SEQUENCE.pack(6)]


def test_all_topics_a_comma_list_and_a_request_without_a_sequence() -> None:
    memory = log_of(["/x/", "/y/", "/z/"])
    everything, comma, two = FakeSocket(), FakeSocket(), FakeSocket()
    run(stream([b"SYNCSTART", b"", SEQUENCE.pack(0)], 3), memory, everything)
    run(stream([b"SYNCSTART", b"/x/,/z/", b"0"], 3), memory, comma)
    run(stream([b"SYNCSTART", b"/y/"], 3), memory, two)
    assert [m[2] for m in everything.sent[:-1]] == [b"/x/", b"/y/", b"/z/"]
    # A text sequence in the request is answered in text.
    assert syncs(comma) == [(b"/x/", b"1"), (b"/z/", b"3")]
    assert comma.sent[-1] == [b"client", b"SYNCEND", b"/x/,/z/", b"3"]
    assert [m[2] for m in two.sent[:-1]] == [b"/y/"]


@pytest.mark.parametrize(("current", "expected"), [(False, 1), (True, 3)])
def test_syncend_says_the_highest_sync_sent_or_the_bus_sequence(
    current: bool, expected: int
) -> None:
    memory = log_of(["/a/", "/b/", "/b/"])
    sock = FakeSocket()
    run(stream([b"SYNCSTART", b"/a/", SEQUENCE.pack(0)], 3), memory, sock, current=current)
    assert SEQUENCE.unpack(sock.sent[-1][3])[0] == expected


def test_nothing_matching_ends_at_the_bus_sequence() -> None:
    memory = log_of(["/a/", "/b/"])
    sock = FakeSocket()
    run(stream([b"SYNCSTART", b"/none/", SEQUENCE.pack(0)], 2), memory, sock)
    assert sock.sent == [[b"client", b"SYNCEND", b"/none/", SEQUENCE.pack(2)]]


def test_events_stored_after_the_request_are_not_in_it() -> None:
    memory = log_of(["/a/"] * 3)
    sock = FakeSocket()
    answer = stream([b"SYNCSTART", b"", SEQUENCE.pack(0)], upto=2)
    memory.append_fields([(b"/a/", b"p", b"t", UUID, b"\xc0")], 0.0)
    run(answer, memory, sock)
    assert [SEQUENCE.unpack(m[3])[0] for m in sock.sent] == [1, 2, 2]


def test_a_client_that_stops_reading_gets_the_rest_once_it_reads_again() -> None:
    memory = log_of([f"/t/{i}/" for i in range(50)])
    sock = FakeSocket(room=7)
    answer = stream([b"SYNCSTART", b"", SEQUENCE.pack(0)], 50)
    assert run(answer, memory, sock, chunk=10, budget=7) == "more"
    sock.room = 0
    assert run(answer, memory, sock, chunk=10) == "blocked"
    answer.shrink(2)  # what the scheduler does for a stuck client: read again later
    sock.room = None
    assert run(answer, memory, sock, chunk=10) == "finished"
    numbers = [SEQUENCE.unpack(m[3])[0] for m in sock.sent]
    assert numbers == [*range(1, 51), 50]


def test_a_client_that_went_away_ends_its_stream() -> None:
    memory = log_of(["/a/"] * 5)
    sock = FakeSocket()
    sock.gone = True
    assert run(stream([b"SYNCSTART", b"", SEQUENCE.pack(0)], 5), memory, sock) == "gone"


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.sampled_from(["/a/", "/a/b/", "/b/", "/ab/", "/c/"]), max_size=60),
    st.lists(st.sampled_from(["/a/", "/a", "/b/", "/c/x/"]), max_size=3),
    st.integers(0, 70),
    st.integers(1, 9),
    st.lists(st.integers(0, 5), min_size=1, max_size=30),
)
def test_whatever_the_client_reads_it_gets_each_matching_event_once_in_order(
    topics: list[str], subtrees: list[str], since: int, chunk: int, rooms: list[int]
) -> None:
    memory = log_of(topics)
    upto = memory.last_sequence
    sock = FakeSocket()
    answer = stream([b"SYNCSTART", ";".join(subtrees).encode(), SEQUENCE.pack(since)], upto)
    outcome = "more"
    for room in [*rooms, None]:
        sock.room = room
        outcome = run(answer, memory, sock, chunk=chunk, budget=chunk)
        if outcome == "finished":
            break
        if outcome == "blocked":
            answer.shrink(1)
    while outcome != "finished":
        outcome = run(answer, memory, sock, chunk=chunk)
    wanted = [
        (i + 1, t.encode()) for i, t in enumerate(topics)
        if i + 1 > since and (not subtrees or any(t.startswith(s) for s in subtrees))
    ]  # fmt: skip
    got = [(SEQUENCE.unpack(m[3])[0], m[2]) for m in sock.sent if m[1] == b"SYNC"]
    assert got == wanted
    end = SEQUENCE.unpack(sock.sent[-1][3])[0]
    assert sock.sent[-1][1] == b"SYNCEND" and end == (wanted[-1][0] if wanted else upto)


class LaterLog:
    """A log whose reads answer later (a replicated stream's), when the test says."""

    def __init__(self, memory: MemoryEventLog) -> None:
        self.memory = memory
        self.asked: list[tuple[Any, Any]] = []

    @property
    def last_sequence(self) -> int:
        return self.memory.last_sequence

    def read_rows(self, after: int, upto: int, prefixes: Any, limit: int) -> Any:
        from twisted.internet import defer

        answer: defer.Deferred[Any] = defer.Deferred()
        self.asked.append((answer, self.memory.read_rows(after, upto, prefixes, limit)))
        return answer

    def answer(self) -> None:
        deferred, rows = self.asked.pop(0)
        deferred.callback(rows)


def test_rows_a_log_gives_later_are_sent_once_in_and_asked_for_once() -> None:
    later = LaterLog(log_of([f"/t/{i}/" for i in range(5)]))
    sock = FakeSocket()
    answer = stream([b"SYNCSTART", b"", SEQUENCE.pack(0)], 5)
    assert run(answer, later, sock, chunk=3) == "reading"  # type: ignore[arg-type]
    assert run(answer, later, sock, chunk=3) == "reading"  # type: ignore[arg-type]
    assert len(later.asked) == 1 and sock.sent == []
    later.answer()
    assert answer.reading is None
    assert run(answer, later, sock, chunk=3) == "reading"  # type: ignore[arg-type]
    later.answer()
    # 4-5 reach the end the snapshot may hold: the SYNCEND without another read.
    assert run(answer, later, sock, chunk=3) == "finished"  # type: ignore[arg-type]
    assert later.asked == []
    assert [SEQUENCE.unpack(m[3])[0] for m in sock.sent] == [1, 2, 3, 4, 5, 5]
    assert sock.sent[-1][1] == b"SYNCEND"


def test_a_log_that_answers_later_is_asked_for_the_next_chunk_as_soon_as_one_comes() -> None:
    later = LaterLog(log_of([f"/t/{i}/" for i in range(8)]))
    sock = FakeSocket()
    answer = stream([b"SYNCSTART", b"", SEQUENCE.pack(0)], 8)
    assert run(answer, later, sock, chunk=3) == "reading"  # type: ignore[arg-type]
    later.answer()  # 1-3 came: 4-6 are asked for before any of them is sent
    assert [rows[0][0] for _, rows in later.asked] == [4] and sock.sent == []
    assert run(answer, later, sock, chunk=3) == "reading"  # type: ignore[arg-type]
    assert len(sock.sent) == 3 and len(later.asked) == 1  # sent; 4-6 asked for once
    later.answer()  # 4-6 came: 7-8 asked for
    assert [rows[0][0] for _, rows in later.asked] == [7]
    assert run(answer, later, sock, chunk=3) == "reading"  # type: ignore[arg-type]
    later.answer()  # 7-8 came: the end the snapshot may hold, so no empty read is asked for
    assert later.asked == []
    assert run(answer, later, sock, chunk=3) == "finished"  # type: ignore[arg-type]
    assert [SEQUENCE.unpack(m[3])[0] for m in sock.sent] == [*range(1, 9), 8]


def test_a_chunk_read_ahead_is_dropped_when_the_stream_moves_back_or_ends() -> None:
    later = LaterLog(log_of([f"/t/{i}/" for i in range(9)]))
    sock = FakeSocket(room=0)
    answer = stream([b"SYNCSTART", b"", SEQUENCE.pack(0)], 9)
    assert run(answer, later, sock, chunk=4) == "reading"  # type: ignore[arg-type]
    later.answer()  # 1-4 came, 5-8 asked for
    ahead, _ = later.asked[0]
    answer.shrink(1)  # a client that took nothing: keep 1, read on from 2
    assert answer.position == 1
    ahead.errback(RuntimeError("its reader failed"))
    assert ahead.result is None  # dropped: its failure handled, never an unhandled error
    later.asked.clear()
    sock.room = None
    assert run(answer, later, sock, chunk=4) == "reading"  # type: ignore[arg-type]
    assert later.asked[0][1][0][0] == 2  # read again from where the kept message ends
    later.answer()
    answer.done = True
    answer.drop_ahead()  # the stream ended: its read ahead may fail unheard
    last, _ = later.asked[0]
    last.errback(RuntimeError("closed"))
    assert last.result is None
