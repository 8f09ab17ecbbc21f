"""The Event BUS's core (bus.eventbus.core) without sockets, a reactor or a disk: PUB
batches in, rights, drops, store then broadcast, waiting while the log refuses, the pair's
release, in-process events; a fake clock and an in-memory log (bus.testing)."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import msgpack
from hypothesis import given, settings
from hypothesis import strategies as st
from twisted.internet.task import Clock
from twisted.logger import Logger

from bus.eventbus import codec
from bus.eventbus.codec import EventFields
from bus.eventbus.core import EventBusCore, Turn
from bus.eventbus.eventlog import PairLog
from bus.eventbus.pair_core import Change
from bus.eventbus.store import EventStore
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
    kept = sqlite3.connect(store.path)
    try:
        assert kept.execute("SELECT topic FROM events").fetchall() == [(b"/mine/",)]
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
