"""A front-end's rules (bus.eventbus.stream_core) with no stream, socket or reactor: one
batch in flight at a time, a refused batch resent whole and in order, the collector held
while it waits or while too much is pending, and broadcasts made from what the stream
committed, once each, in order, whatever the feed repeats or skips."""

from __future__ import annotations

import msgpack
from hypothesis import given, settings
from hypothesis import strategies as st
from twisted.internet.task import Clock
from twisted.logger import Logger

from bus.eventbus import codec
from bus.eventbus.codec import EventFields
from bus.eventbus.eventlog import Row
from bus.eventbus.stream_core import MAX_SUBJECT_BYTES, StreamCore

log = Logger(namespace="test.eventbus.stream_core")


def pub(n: int, topic: bytes | None = None) -> list[bytes]:
    uuid = f"00000000-0000-4000-8000-{n:012d}".encode()
    topic = f"/t/{n}/".encode() if topic is None else topic
    return [b"peer", *codec.pub_frames(topic, b"p", b"2026-11-27T00:00:00Z", uuid,
                                         msgpack.packb(n))]  # fmt: skip


def made(**kw: int) -> tuple[StreamCore, Clock]:
    clock = Clock()
    core = StreamCore(released=0, max_data_bytes=1024, clock=clock.seconds, logger=log, **kw)
    return core, clock


def rows_of(first: int, fields: list[EventFields]) -> list[Row]:
    return [(first + i, *f) for i, f in enumerate(fields)]  # type: ignore[misc]


def test_one_batch_in_flight_refused_then_resent_whole_and_the_collector_held() -> None:
    core, clock = made(batch_limit=3, hold_limit=6)
    core.collect([pub(n) for n in range(5)])
    first = core.take_append()
    assert first is not None and [f[0] for f in first] == [b"/t/0/", b"/t/1/", b"/t/2/"]
    assert core.take_append() is None  # one at a time
    clock.advance(5)
    core.append_refused("no quorum")
    assert core.collector_paused and core.storage_error == "no quorum"
    assert core.refused_storage == 3 and core.blocked_since == 5
    assert [f[0] for f in core.waiting] == [b"/t/0/", b"/t/1/", b"/t/2/", b"/t/3/", b"/t/4/"]
    core.append_refused("no quorum")  # a retry refused again: counted once
    assert core.refused_storage == 3 and core.append_failures == 2
    assert core.retry() is first and core.take_append() is None
    core.appended([1, 2, 0])  # the last one the stream held already
    assert not core.collector_paused and core.storage_error is None and core.waiting == []
    assert core.accepted == 3 and core.duplicates == 1
    second = core.take_append()
    assert second is not None and [f[0] for f in second] == [b"/t/3/", b"/t/4/"]
    core.collect([pub(n) for n in range(5, 9)])  # 2 in flight + 4 pending: the limit
    assert core.collector_paused


def test_a_full_backlog_holds_the_collector_until_half_of_it_is_stored() -> None:
    core, _ = made(batch_limit=2, hold_limit=8)
    core.collect([pub(n) for n in range(7)])
    assert not core.collector_paused
    core.collect([pub(7)])  # 8 wait: the limit
    assert core.collector_paused
    sequence = 0
    for left in (6, 4):  # stored two at a time: still more than half wait
        batch = core.take_append()
        assert batch is not None
        core.appended(list(range(sequence + 1, sequence + 1 + len(batch))))
        sequence += len(batch)
        assert core.backlog() == left and core.collector_paused == (left > 4)
    assert not core.collector_paused  # 4 wait: half, read again
    core.collect([pub(n) for n in range(8, 11)])
    assert not core.collector_paused  # 7 below the limit
    core.collect([pub(11)])
    assert core.collector_paused


def test_the_feed_is_broadcast_once_in_order_with_repeats_skipped_and_holes_counted() -> None:
    core, _ = made()
    fields = [(f"/t/{n}/".encode(), b"p", b"t", b"u", b"\xc0") for n in range(8)]
    core.committed(rows_of(1, fields[:3]))
    core.committed(rows_of(2, fields[1:5]))  # the feed restarted a little behind
    core.committed(rows_of(7, fields[6:8]))  # 6 was removed by the stream's limits
    broadcasts = core.take_broadcasts()
    assert [(b.first, len(b.fields)) for b in broadcasts] == [(1, 3), (4, 2), (7, 2)]
    assert core.released == 8 and core.repeated == 2 and core.skipped == 1


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.one_of(
            st.tuples(st.just("pub"), st.integers(1, 7)),
            st.tuples(st.just("ack"), st.just(0)),
            st.tuples(st.just("refuse"), st.just(0)),
            st.tuples(st.just("retry"), st.just(0)),
            st.tuples(st.just("local"), st.integers(1, 3)),
        ),
        max_size=60,
    )
)
def test_whatever_the_stream_does_each_event_is_stored_once_in_the_order_it_came(
    steps: list[tuple[str, int]],
) -> None:
    core, _ = made(batch_limit=4, hold_limit=10)
    stream: list[bytes] = []  # uuids in the order the stream stored them
    sent: list[bytes] = []
    n = 0
    in_flight: list[EventFields] | None = None

    def kept(events: list[EventFields]) -> list[int]:
        """The stream takes each event it does not hold yet (by uuid): its sequences."""
        sequences = []
        for event in events:
            if event[3] in stream:
                sequences.append(0)
            else:
                stream.append(event[3])
                sequences.append(len(stream))
        return sequences

    for step, count in steps:
        if step == "pub":
            batch = [pub(n + i) for i in range(count)]
            core.collect(batch)
            sent += [frames[5] for frames in batch]
            n += count
        elif step == "local":
            for _ in range(count):
                uuid = f"00000000-0000-4000-8000-{n:012d}".encode()
                core.publish_local((b"/l/", b"p", b"t", uuid, b"\xc0"))
                sent.append(uuid)
                n += 1
            core.flush_local()
        elif step == "refuse" and in_flight is not None:
            kept(in_flight[: len(in_flight) // 2])  # what it stored before failing
            core.append_refused("timeout")
            in_flight = None
        elif step == "retry" and core.refused:
            in_flight = core.retry()
        elif step == "ack" and in_flight is not None:
            core.appended(kept(in_flight))
            in_flight = None
        if in_flight is None and not core.refused:
            in_flight = core.take_append()
    # Drain: the stream answers everything from now on.
    while True:
        if core.refused:
            in_flight = core.retry()
        elif in_flight is None:
            in_flight = core.take_append()
        if in_flight is None:
            break
        core.appended(kept(in_flight))
        in_flight = None
    # Once each, and in the order they came: a batch goes whole (resent whole) before the
    # next, and what the stream kept of a refused batch is its beginning here.
    assert stream == sent
    assert core.pending == [] and core.in_flight == [] and not core.collector_paused


def test_a_topic_whose_subject_is_too_long_for_nats_is_dropped_and_counted() -> None:
    core, _ = made()
    # eventbus.~.TOPIC.~ : 13 bytes beside the topic's own, 3 for each escaped byte.
    room = MAX_SUBJECT_BYTES - 13
    long_ascii = pub(5, b"/" + b"a" * (room + 1) + b"/")
    escaped = pub(2, b"/" + b"." * (room // 3 + 1) + b"/")
    fits = pub(3, b"/" + b"." * (room // 3) + b"/")
    core.collect([long_ascii, pub(1), escaped, fits])
    assert [f[3][-1:] for f in core.pending] == [b"1", b"3"]
    assert core.drops.counts["subject-too-long"] == 2
