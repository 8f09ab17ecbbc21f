"""The Event BUS's core (bus.eventbus.core) without sockets, a reactor or a disk: PUB
batches in, rights, drops, store then broadcast, waiting while the log refuses, the pair's
release, in-process events; a fake clock and an in-memory log (bus.testing)."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import msgpack
from hypothesis import given, settings
from hypothesis import strategies as st
from twisted.internet.task import Clock
from twisted.logger import LogEvent, Logger, formatEvent

from bus.eventbus import codec
from bus.eventbus.codec import EventFields, SnapshotRequest
from bus.eventbus.core import EventBusCore, Turn
from bus.eventbus.eventlog import PairLog
from bus.eventbus.pair_core import Change
from bus.eventbus.store import EventStore, Retention
from bus.testing import MemoryEventLog

log = Logger(namespace="test.eventbus.core")
UUID = b"0d5e8f1e-6a43-4a4f-9c5e-6f3f9d0a1b2c"


def pub(topic: bytes, n: int, delimiter: bool = False) -> list[bytes]:
    data = msgpack.packb({"n": n})
    frames = codec.pub_frames(topic, b"p", b"2026-11-26T00:00:00Z", UUID, data)
    return [b"peer", *([b""] if delimiter else []), *frames]


def made(limit: int = 100) -> tuple[EventBusCore, MemoryEventLog, Clock]:
    clock = Clock()
    clock.advance(1_000)
    memory = MemoryEventLog()
    core = EventBusCore(
        memory, max_data_bytes=1024, clock=clock.seconds, logger=log, local_limit=limit
    )
    return core, memory, clock


def broadcast_sequences(core: EventBusCore) -> list[int]:
    return [b.first + i for b in core.take_broadcasts() for i in range(len(b.fields))]


def test_a_batch_is_stored_then_broadcast_and_bad_messages_are_counted() -> None:
    core, memory, _ = made()
    core.collect([pub(b"/a/", 1), [b"peer", b"junk"], pub(b"/b/", 2, delimiter=True)])
    assert memory.last_sequence == 2 and [row[1] for row in memory.rows] == [b"/a/", b"/b/"]
    [batch] = core.take_broadcasts()
    assert batch.first == 1 and [f[0] for f in batch.fields] == [b"/a/", b"/b/"]
    assert core.released == 2 and core.accepted == 2
    assert sum(core.drops.counts.values()) == 1
    assert core.take_broadcasts() == []  # taken once


def test_every_pub_the_codec_refuses_is_dropped_by_its_reason_and_the_rest_stored() -> None:
    core, memory, _ = made()
    good = pub(b"/ok/", 1)
    bad = {
        "frame-count": good[:4],
        "bad-sequence": [*good[:2], b"\x01\x02\x03", *good[3:]],
        "bad-timestamp": [*good[:4], b"yesterday at noon", *good[5:]],
        "bad-uuid": [*good[:5], b"not-a-uuid", good[6]],
        "bad-payload": [*good[:6], b"\xc1"],
        "bad-topic": [good[0], b"\xff\xfe", *good[2:]],
        "reserved-topic": [good[0], b"$heartbeat", *good[2:]],
        "oversized": [*good[:6], msgpack.packb(b"x" * 1025)],
    }
    core.collect([*bad.values(), good])
    assert dict(core.drops.counts) == dict.fromkeys(bad, 1)
    assert [row[1] for row in memory.rows] == [b"/ok/"] and broadcast_sequences(core) == [1]


def test_rights_drop_what_a_key_may_not_publish_and_anything_without_a_key() -> None:
    core, memory, _ = made()
    core.publish_rights = lambda key: (b"/orders/",) if key == "K1" else None
    core.collect(
        [pub(b"/orders/1/", 1), pub(b"/admin/", 2), pub(b"/admin/", 3), pub(b"/x/", 4)],
        ["K1", "K1", "K2", ""],
    )
    assert [row[1] for row in memory.rows] == [b"/orders/1/", b"/admin/"]
    assert core.drops.counts["forbidden-topic"] == 2


def test_a_refusing_log_holds_events_in_order_and_nothing_is_broadcast_early() -> None:
    core, memory, clock = made()
    core.collect([pub(b"/a/", 1)])
    broadcast_sequences(core)
    memory.refusing = "No space left on device"
    core.collect([pub(b"/b/", 2), pub(b"/c/", 3)])
    assert core.collector_paused and core.storage_error is not None
    clock.advance(5)
    core.collect([pub(b"/d/", 4)])  # read before the pause took effect: behind them
    assert core.take_broadcasts() == [] and memory.last_sequence == 1
    assert core.refused_storage == 3 and core.append_failures == 1
    assert not core.retry_waiting() and core.append_failures == 2
    memory.refusing = None
    assert core.retry_waiting() and not core.collector_paused
    assert core.storage_error is None and core.blocked_since == 1_000
    assert broadcast_sequences(core) == [2, 3, 4]
    assert [row[1] for row in memory.rows] == [b"/a/", b"/b/", b"/c/", b"/d/"]
    assert core.refused_storage == 3  # each counted once, however many retries


class FakePair:
    """The pair as the core sees it: whether this server stores, and how far it may release."""

    def __init__(self) -> None:
        self.active = True
        self.limit = 0
        self.forwarded: list[EventFields] = []
        self.passive_got: list[int] = []
        self.held: list[EventFields] = []
        self.votes = 0

    def stores(self) -> bool:
        return self.active

    def forward(self, fields: list[EventFields]) -> None:
        self.forwarded.extend(fields)

    def appended(self, first: int, fields: list[EventFields]) -> None:
        self.passive_got.extend(range(first, first + len(fields)))

    def release_limit(self) -> int:
        return self.limit

    def take_held(self) -> list[EventFields]:
        held, self.held = self.held, []
        return held

    def serves(self) -> bool:
        return self.active

    def vote(self) -> None:
        self.votes += 1


def test_in_a_pair_a_batch_is_released_only_as_far_as_the_pair_allows() -> None:
    core, memory, _ = made()
    pair = FakePair()
    core.pair = pair
    core.collect([pub(b"/a/", n) for n in range(5)])
    assert memory.last_sequence == 5 and pair.passive_got == [1, 2, 3, 4, 5]
    assert core.take_broadcasts() == [] and core.released == 0
    pair.limit = 3
    core.release()
    [batch] = core.take_broadcasts()
    assert batch.first == 1 and batch.fields == [row[1:6] for row in memory.rows[:3]]
    assert core.released == 3
    pair.limit = 5
    core.release()
    assert broadcast_sequences(core) == [4, 5] and core.released == 5
    # A passive forwards what it collects and stores nothing.
    pair.active = False
    core.collect([pub(b"/b/", 9)])
    assert memory.last_sequence == 5 and [f[0] for f in pair.forwarded] == [b"/b/"]
    # Stored unreleased, then active after a real failover: released from the log's end.
    pair.active = True
    core.collect([pub(b"/c/", 10)])
    assert core.released == 5 and core.take_broadcasts() == []
    core.pair_changed(Change(0.0, "passive", "active", "failover"))
    assert core.released == 6 and not core.unreleased
    assert core.take_turns() == [Turn("active", 6)]
    core.pair_changed(Change(0.0, "active", "passive", "rejoin"))
    assert not core.unreleased and core.take_turns() == [Turn("passive", 6)]


def test_the_pair_talks_to_the_core_and_the_service_is_woken_after_each_change() -> None:
    core, memory, _ = made()
    pair = FakePair()
    pair.active = False
    core.pair = pair
    wakes: list[tuple[list[Turn], list[int], bool]] = []
    core.woken = lambda: wakes.append(
        (core.take_turns(), broadcast_sequences(core), core.collector_paused)
    )
    # A passive holding all it may: the collector is not read until it hands them over.
    core.hold_collector(True)
    assert wakes.pop() == ([], [], True) and core.collector_paused
    pair.held = [(b"/held/", b"p", b"t", UUID, b"\xc0")] * 2
    # It becomes active: the turn (and the sequence its first heartbeat says) comes
    # before the held events are stored and broadcast, and the collector is read again.
    pair.active = True
    pair.limit = 10
    core.pair_changed(Change(0.0, "passive", "active", "failover"))
    assert wakes.pop() == ([Turn("active", 0)], [1, 2], False)
    assert [row[1] for row in memory.rows] == [b"/held/", b"/held/"] and pair.held == []
    # Events a passive forwards are stored and broadcast at once.
    core.accept_forwarded([(b"/fw/", b"p", b"t", UUID, b"\xc0")])
    assert wakes.pop() == ([], [3], False)
    # A release the passive's acknowledgement allows.
    pair.limit = 3
    core.collect([pub(b"/a/", 1), pub(b"/a/", 2)])
    assert broadcast_sequences(core) == []
    pair.limit = 5
    core.pair_release()
    assert wakes.pop() == ([], [4, 5], False)
    # From doubt back to active: nothing stored is taken back, nothing released again.
    core.pair_changed(Change(0.0, "doubt", "active", "peer back"))
    assert wakes.pop() == ([Turn("active", 5)], [], False) and not wakes


def test_a_passive_replaces_a_log_of_another_bus_and_keeps_the_old_one_aside(
    tmp_path: Path,
) -> None:
    store = EventStore(tmp_path)
    store.append_fields([(b"/mine/", b"p", b"t", UUID, b"\xc0")], 1.0)
    old_id = store.store_id
    core: EventBusCore[PairLog] = EventBusCore(
        store, max_data_bytes=1024, clock=Clock().seconds, logger=log
    )
    wakes: list[int] = []
    core.woken = lambda: wakes.append(1)
    core.replace_log("the-active's-id")
    new = core.log
    assert wakes == [1] and new is not store
    assert new.store_id == "the-active's-id" and new.count() == 0 and new.last_sequence == 0
    assert store.path.name == f"events.sqlite3.replaced-{old_id}"
    (store.directory / "kept").mkdir()
    store.path.rename(store.directory / "kept" / "events.sqlite3")  # closed: no WAL left
    kept = EventStore(store.directory / "kept")
    try:
        assert [event.topic for event in kept.read(0)] == [b"/mine/"]
    finally:
        kept.close()
    new.close()
    # The replacement is the log found at the next start.
    again = EventStore(tmp_path)
    assert again.store_id == "the-active's-id" and again.count() == 0
    again.close()


def test_events_made_in_this_process_are_one_batch_and_bounded() -> None:
    core, memory, _ = made(limit=3)
    fields = (b"/emqp/x/", b"emqp", b"2026-11-26T00:00:00Z", UUID, msgpack.packb(1))
    assert core.publish_local(fields) is True  # the first: a flush is due
    assert core.publish_local(fields) is False and core.publish_local(fields) is False
    assert core.publish_local(fields) is False and core.drops.counts["local-overflow"] == 1
    core.flush_local()
    assert memory.last_sequence == 3 and core.local_accepted == 3
    assert broadcast_sequences(core) == [1, 2, 3]


operations = st.lists(
    st.one_of(
        st.tuples(st.just("batch"), st.integers(1, 5)),
        st.tuples(st.just("refuse"), st.booleans()),
        st.tuples(st.just("retry"), st.just(0)),
        st.tuples(st.just("local"), st.integers(1, 3)),
    ),
    max_size=40,
)


@settings(max_examples=200, deadline=None)
@given(operations)
def test_whatever_the_log_does_broadcasts_are_gapless_in_order_and_stored(
    steps: list[tuple[str, object]],
) -> None:
    core, memory, _ = made(limit=1000)
    seen: list[int] = []
    sent = 0
    for step, argument in steps:
        if step == "batch":
            core.collect([pub(b"/f/", sent + i) for i in range(int(str(argument)))])
            sent += int(str(argument))
        elif step == "refuse":
            memory.refusing = "full" if argument else None
        elif step == "retry":
            core.retry_waiting()
        else:
            for _ in range(int(str(argument))):
                core.publish_local((b"/l/", b"p", b"t", UUID, b"\xc0"))
            core.flush_local()
            sent += int(str(argument))
        for sequence in broadcast_sequences(core):
            # Never broadcast what is not stored; one sequence after another.
            assert sequence <= memory.last_sequence
            assert sequence == (seen[-1] + 1 if seen else 1)
            seen.append(sequence)
        assert core.collector_paused == bool(core.waiting)
    memory.refusing = None
    core.retry_waiting()
    seen.extend(broadcast_sequences(core))
    # Everything accepted is stored once and broadcast once, in order.
    assert seen == list(range(1, sent + 1)) == [row[0] for row in memory.rows]
    assert core.released == sent and not core.waiting


# -- what the server tests showed through sockets, as rules of the core ----------------------------

topics = st.sampled_from([b"/a/", b"/a/b/", b"/orders/1/", b"/\xc3\xa9/"])
#: Whatever sequence a publisher sends (either dialect, or none) is ignored.
sent_sequences = st.sampled_from(
    [codec.SEQUENCE.pack(0), codec.SEQUENCE.pack(99), b"null", b"", b"0", b"42", b"12345678"]
)


def pub_with(
    topic: bytes, sequence: bytes, producer: bytes, n: int, delimiter: bool
) -> list[bytes]:
    data = msgpack.packb(n)
    body = [topic, sequence, producer, b"2026-11-26T00:00:00Z", UUID, data]
    return [b"peer", *([b""] if delimiter else []), *body]


valid_pubs = st.builds(
    pub_with,
    topics,
    sent_sequences,
    st.sampled_from([b"", b"p", b"producer-1"]),
    st.integers(0, 1000),
    st.booleans(),
)


def body_of(frames: list[bytes]) -> list[bytes]:
    """A message's PUB frames: after the identity and a REQ-style empty delimiter, if any."""
    body = frames[1:]
    return body[1:] if len(body) == 7 and not body[0] else body


def fields_of(frames: list[bytes]) -> EventFields:
    topic, _, producer, timestamp, event_id, data = body_of(frames)
    return (topic, producer, timestamp, event_id, data)


@settings(max_examples=200, deadline=None)
@given(st.integers(0, 30), st.lists(st.lists(valid_pubs, max_size=6), max_size=6))
def test_each_pub_is_broadcast_as_sent_under_the_next_sequences_of_the_log(
    already: int, batches: list[list[list[bytes]]]
) -> None:
    # A log that already holds events (a restart): the core goes on from its last sequence.
    memory = MemoryEventLog()
    memory.append_fields([(b"/old/", b"p", b"t", UUID, b"\xc0")] * already, 0.0)
    core = EventBusCore(memory, max_data_bytes=1024, clock=Clock().seconds, logger=log)
    assert core.released == already
    broadcast: list[tuple[int, EventFields]] = []
    for batch in batches:
        core.collect(batch)
        for b in core.take_broadcasts():
            broadcast += [(b.first + i, fields) for i, fields in enumerate(b.fields)]
        assert core.released == memory.last_sequence
    sent = [fields_of(frames) for batch in batches for frames in batch]
    assert broadcast == list(enumerate(sent, already + 1))
    assert [(row[0], row[1:6]) for row in memory.rows[already:]] == broadcast
    assert sum(core.drops.counts.values()) == 0


#: Per PUB field (after the identity), values that break exactly that field.
BAD_FIELDS: dict[int, list[bytes]] = {
    0: [b"", b"\xff\xfe", codec.HEARTBEAT_TOPIC, b"$x", b"/" * (codec.MAX_TOPIC_BYTES + 1)],
    1: [b"\x01\x02\x03", b"-1", b"18446744073709551616", b"\x00" * 9],
    2: [b"\xff", b"p" * (codec.MAX_PRODUCER_BYTES + 1)],
    3: [b"", b"noon", b"2026-02-30", b"2" * 65],
    4: [b"", b"not-a-uuid", UUID[1:]],
    5: [b"", b"\xc1", b"\x92\x01", msgpack.packb(b"x" * 1025)],
}


@st.composite
def any_pubs(draw: st.DrawFn) -> list[bytes]:
    """A valid PUB, one with a field broken, a frame missing or added, or random frames."""
    frames = draw(valid_pubs)
    delimiter, body = frames[1:2] == [b""], body_of(frames)
    how = draw(st.sampled_from(["valid", "bad-field", "random-field", "drop", "add", "junk"]))
    index = draw(st.integers(0, 5))
    if how == "bad-field":
        body[index] = draw(st.sampled_from(BAD_FIELDS[index]))
    elif how == "random-field":
        body[index] = draw(st.binary(max_size=40))
    elif how == "drop":
        del body[index]
    elif how == "add":
        body.insert(index, draw(st.binary(max_size=10)))
    elif how == "junk":
        body = draw(st.lists(st.binary(max_size=20), max_size=9))
    return [b"peer", *([b""] if delimiter else []), *body]


def reason_for(frames: list[bytes]) -> str | None:
    """What the codec's reference parser says of this message: None (stored) or the reason."""
    try:
        codec.parse_pub(body_of(frames), 1024)
    except codec.EventBusError as error:
        return error.reason
    return None


@settings(max_examples=300, deadline=None)
@given(st.lists(st.lists(any_pubs(), max_size=8), max_size=5))
def test_of_any_mix_the_good_pubs_are_stored_in_order_and_each_bad_one_counted_by_its_reason(
    batches: list[list[list[bytes]]],
) -> None:
    core, memory, _ = made()
    expected_drops: Counter[str] = Counter()
    good: list[EventFields] = []
    for batch in batches:
        for frames in batch:
            reason = reason_for(frames)
            if reason is None:
                good.append(fields_of(frames))
            else:
                expected_drops[reason] += 1
        core.collect(batch)  # the core goes on after every bad message
    assert Counter(core.drops.counts) == expected_drops
    assert [row[1:6] for row in memory.rows] == good
    assert broadcast_sequences(core) == list(range(1, len(good) + 1))


def test_after_a_restart_and_retention_that_left_nothing_the_core_goes_on_from_the_high_water(
    tmp_path: Path,
) -> None:
    store = EventStore(tmp_path)
    core: EventBusCore[EventStore] = EventBusCore(
        store, max_data_bytes=1024, clock=Clock().seconds, logger=log
    )
    core.collect([pub(b"/r/", n) for n in range(5)])
    assert sum(Retention(max_count=0).steps(lambda: store, 0.0)) == 5 and store.count() == 0
    store.close()
    store = EventStore(tmp_path)
    try:
        core = EventBusCore(store, max_data_bytes=1024, clock=Clock().seconds, logger=log)
        # Before any new event: what heartbeats and snapshots say is the old sequence.
        assert core.released == 5
        core.collect([pub(b"/r/after/", 6)])
        assert broadcast_sequences(core) == [6]
        assert [e.sequence for e in store.read(0)] == [6]
    finally:
        store.close()


# -- what the service used to decide: when to retry, what a key receives, held SYNCSTARTs ----------


def lines(events: list[LogEvent]) -> list[str]:
    return [f"{event['log_level'].name}: {formatEvent(event)}" for event in events]


def test_refused_events_are_retried_ever_later_reported_once_in_ten_seconds_until_stored() -> None:
    clock = Clock()
    clock.advance(1_000)
    said: list[LogEvent] = []
    memory = MemoryEventLog()
    core = EventBusCore(
        memory,
        max_data_bytes=1024,
        clock=clock.seconds,
        logger=Logger(namespace="test", observer=said.append),
        retry_min=0.5,
        retry_max=3.0,
    )
    memory.refusing = "No space left on device"
    core.collect([pub(b"/a/", 1), pub(b"/a/", 2)])
    delays = [core.next_retry()]
    for _ in range(6):
        clock.advance(delays[-1])
        assert not core.retry_waiting()
        delays.append(core.next_retry())
    assert delays == [0.5, 1.0, 2.0, 3.0, 3.0, 3.0, 3.0]
    # One line for the first refusal; the next one, due ten seconds later (at 12.5 s),
    # tells of the attempts held back meanwhile.
    [first, second] = lines(said)
    assert first.startswith("error: event log :memory: cannot write (")
    assert "No space left on device" in first and "2 events waiting" in first
    assert "(1 failed attempts since the last report)" in first
    assert "(6 failed attempts since the last report)" in second
    assert core.append_failures == 7 and core.collector_paused
    memory.refusing = None
    clock.advance(3.0)
    assert core.retry_waiting() and not core.collector_paused
    assert lines(said)[-1] == (
        "info: event log :memory: writes again after 15.5s: stored 2 waiting events; "
        "collector resumed"
    )
    assert broadcast_sequences(core) == [1, 2]
    # The next refusal is news: retried soon and reported at once.
    memory.refusing = "I/O error"
    core.collect([pub(b"/b/", 3)])
    assert core.next_retry() == 0.5 and "I/O error" in lines(said)[-1]


def syncstart(*subtrees: bytes) -> list[bytes]:
    return [b"client", *codec.sync_start_frames(subtrees, 0)]


def subtrees_of(request: SnapshotRequest | None) -> tuple[bytes, ...] | None:
    return None if request is None else request.subtrees


def test_a_syncstart_is_parsed_and_narrowed_to_what_its_key_may_receive() -> None:
    core, _, _ = made()
    core.subscribe_rights = lambda key: (b"/orders/",) if key == "K1" else None
    # Without rights in force (no User-Id), as asked.
    assert subtrees_of(core.snapshot_request(syncstart(b"/a/"), None)) == (b"/a/",)
    assert subtrees_of(core.snapshot_request(syncstart(), "K1")) == (b"/orders/",)
    assert subtrees_of(core.snapshot_request(syncstart(b"/orders/1/"), "K1")) == (b"/orders/1/",)
    assert subtrees_of(core.snapshot_request(syncstart(b"/a/"), "K2")) == (b"/a/",)
    request = core.snapshot_request(syncstart(b"/a/"), "K1")
    assert subtrees_of(request) == (codec.PROBE_SUBTREE,)  # a lone SYNCEND
    assert core.narrowed_snapshots == 2
    assert core.snapshot_request([b"client", b"SYNCSTART"], None) is None
    assert sum(core.drops.counts.values()) == 1


def test_a_subscription_is_narrowed_to_what_its_key_may_receive() -> None:
    core, _, _ = made()
    core.subscribe_rights = lambda key: (b"/orders/",) if key == "K1" else None
    assert core.subscription(b"\x01/", "K1") == (True, [b"/orders/"])
    assert core.subscription(b"\x00/orders/9/", "K1") == (False, [b"/orders/9/"])
    assert core.subscription(b"\x01/billing/", "K1") == (True, [])
    assert core.subscription(b"\x01/billing/", "K2") == (True, [b"/billing/"])
    assert core.subscription(b"\x02/", "K1") is None and core.subscription(b"", "K1") is None
    assert core.narrowed_subscriptions == 2


def test_a_syncstart_reaching_a_server_that_does_not_serve_is_a_vote_answered_if_recent() -> None:
    core, _, clock = made()
    pair = FakePair()
    core.pair = pair
    pair.active = False
    assert core.snapshot_request(syncstart(b"/old/"), None) is None
    clock.advance(1.5)
    assert core.snapshot_request(syncstart(b"/new/"), None) is None
    assert pair.votes == 2 and [held[1] for held in core.held_requests] == [b"client"] * 2
    clock.advance(1.0)
    # This server takes over: what its clients still wait for (here 2 s) is answered.
    pair.active = True
    [(identity, request)] = core.take_held_requests(2.0)
    assert identity == b"client" and request.subtrees == (b"/new/",)
    assert not core.held_requests and core.take_held_requests(2.0) == []
    assert subtrees_of(core.snapshot_request(syncstart(b"/now/"), None)) == (b"/now/",)
    assert pair.votes == 2


def test_activity_is_an_event_checked_as_a_pub_and_queued_with_the_others() -> None:
    core, memory, _ = made()
    assert core.publish_activity(b"emqp", "/emqp/job/", {"id": 1}) is True
    assert core.publish_activity(b"emqp", "/emqp/job/", [2]) is False
    for topic, value in (("", 1), ("/" * 5000, 1), ("/x/", object()), ("/x/", "y" * 2000)):
        try:
            core.publish_activity(b"emqp", topic, value)
        except ValueError as error:
            assert str(error).startswith(f"cannot publish to {topic!r}: ")
        else:
            raise AssertionError(f"{topic!r}: {value!r} was queued")
    core.flush_local()
    assert [msgpack.unpackb(row[5]) for row in memory.rows] == [{"id": 1}, [2]]
    assert {row[2] for row in memory.rows} == {b"emqp"} and core.local_accepted == 2
    codec.check_timestamp(memory.rows[0][3])
    assert len({row[4] for row in memory.rows}) == 2  # a uuid each


def test_status_and_metrics_say_the_counts_as_kept() -> None:
    core, memory, _ = made(limit=1)
    core.collect([pub(b"/a/", 1), [b"peer", b"junk"]])
    core.publish_local((b"/l/", b"p", b"t", UUID, b"\xc0"))
    core.flush_local()
    memory.refusing = "full"
    core.collect([pub(b"/b/", 2)])
    assert core.status() == {
        "accepted": 2,
        "accepted_bytes": len(pub(b"/a/", 1)[6]) + 1,
        "accepted_local": 1,
        "dropped": {"frame-count": 1},
        "refused_storage": 1,
        "storage_error": "[Errno 28] full",
        "collector_paused": True,
    }
    samples = {m.name: [s.value for s in m.samples] for m in core.metrics()}
    assert samples == {
        "eventbus_events_accepted": [2],
        "eventbus_event_bytes_accepted": [core.bytes_accepted],
        "eventbus_events_local": [1],
        "eventbus_messages_dropped": [1],
        "eventbus_events_refused_storage": [1],
        "eventbus_collector_paused": [1.0],
    }
