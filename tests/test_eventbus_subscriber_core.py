"""The subscriber state machine without sockets: what it delivers and when it asks."""

from __future__ import annotations

from bus.eventbus.codec import Event, Heartbeat, SnapshotEnd
from bus.eventbus.subscriber import SubscriberCore, snapshot_patience


def ev(sequence: int, topic: bytes = b"/t/") -> Event:
    return Event(topic, sequence, b"p", b"2026-01-01T00:00:00Z", b"u", b"\xc0")


class Recorder:
    def __init__(self, full_feed: bool = True, last: int = 0) -> None:
        self.delivered: list[int] = []
        self.asked: list[int] = []
        self.core = SubscriberCore(
            deliver=lambda e: self.delivered.append(e.sequence),
            request_snapshot=self.asked.append,
            full_feed=full_feed,
            last=last,
        )


def test_snapshot_then_live_with_buffered_broadcasts_and_stale_discarded() -> None:
    r = Recorder()
    r.core.start(0.0, wait_for_heartbeat=False)
    assert r.asked == [0]
    r.core.on_broadcast(ev(3))  # arrives during the snapshot: buffered
    r.core.on_broadcast(ev(4))
    r.core.on_sync(ev(1))
    r.core.on_sync(ev(2))
    r.core.on_sync(ev(3))
    r.core.on_sync_end(SnapshotEnd(b"", 3))
    assert r.delivered == [1, 2, 3, 4]  # 3 from SYNC, the buffered 3 is stale
    r.core.on_broadcast(ev(4))
    assert r.delivered == [1, 2, 3, 4]
    assert r.core.stats.stale == 2


def test_full_feed_gap_asks_from_last_and_resumes_in_order() -> None:
    r = Recorder()
    r.core.start(0.0, wait_for_heartbeat=False)
    r.core.on_sync_end(SnapshotEnd(b"", 0))
    r.core.on_broadcast(ev(1))
    r.core.on_broadcast(ev(4))  # 2 and 3 lost
    assert r.asked == [0, 1]
    r.core.on_broadcast(ev(5))  # buffered while healing
    r.core.on_sync(ev(2))
    r.core.on_sync(ev(3))
    r.core.on_sync(ev(4))
    r.core.on_sync_end(SnapshotEnd(b"", 4))
    assert r.delivered == [1, 2, 3, 4, 5]
    assert r.core.stats.gaps == 1
    assert r.core.stats.healed_events == 3


def test_heartbeat_reveals_tail_loss_for_full_feed() -> None:
    r = Recorder()
    r.core.start(0.0, wait_for_heartbeat=False)
    r.core.on_sync_end(SnapshotEnd(b"", 0))
    r.core.on_broadcast(ev(1))
    r.core.on_heartbeat(Heartbeat(1, "store"), 1.0)
    assert r.asked == [0]
    r.core.on_heartbeat(Heartbeat(3, "store"), 2.0)  # 2 and 3 never came
    assert r.asked == [0, 1]
    r.core.on_sync(ev(2))
    r.core.on_sync(ev(3))
    r.core.on_sync_end(SnapshotEnd(b"", 3))
    assert r.delivered == [1, 2, 3]


def test_subtree_subscriber_reconciles_on_heartbeat_and_delivers_only_missing() -> None:
    r = Recorder(full_feed=False)
    r.core.start(0.0, wait_for_heartbeat=False)
    r.core.on_sync_end(SnapshotEnd(b"/a/", 10))
    r.core.on_heartbeat(Heartbeat(10, "store"), 0.5)  # first beat: nothing beyond the snapshot
    r.core.on_broadcast(ev(12))
    r.core.on_broadcast(ev(15))  # not a gap for a subtree subscriber
    assert r.delivered == [12, 15]
    r.core.on_heartbeat(Heartbeat(20, "store"), 1.0)  # too early to reconcile
    assert r.asked == [0]
    r.core.on_heartbeat(Heartbeat(20, "store"), 6.0)
    assert r.asked == [0, 10]
    for sequence in (12, 13, 15):  # 13 was lost
        r.core.on_sync(ev(sequence))
    r.core.on_sync_end(SnapshotEnd(b"/a/", 15))
    assert r.delivered == [12, 15, 13]
    assert r.core.verified == 15


def test_resume_from_stored_sequence() -> None:
    r = Recorder(last=41)
    r.core.start(0.0, wait_for_heartbeat=False)
    assert r.asked == [41]
    r.core.on_sync(ev(41))  # at or below the resume point: not again
    r.core.on_sync(ev(42))
    r.core.on_sync_end(SnapshotEnd(b"", 42))
    assert r.delivered == [42]


def test_buffer_overflow_during_snapshot_asks_again() -> None:
    import bus.eventbus.subscriber as module

    saved = module.MAX_BUFFERED
    module.MAX_BUFFERED = 2
    try:
        r = Recorder()
        r.core.start(0.0, wait_for_heartbeat=False)
        for sequence in (5, 6, 7):
            r.core.on_broadcast(ev(sequence))
        r.core.on_sync_end(SnapshotEnd(b"", 4))
        assert r.asked == [0, 4]
        assert r.core.syncing
    finally:
        module.MAX_BUFFERED = saved


def test_first_heartbeat_opens_the_snapshot_and_a_new_store_starts_over() -> None:
    r = Recorder()
    r.core.start(0.0)
    assert r.asked == []  # waits for the heartbeat that proves the subscription is live
    r.core.on_broadcast(ev(7))  # buffered meanwhile
    r.core.on_heartbeat(Heartbeat(7, "store-a"), 0.5)
    assert r.asked == [0]
    for sequence in range(1, 8):
        r.core.on_sync(ev(sequence))
    r.core.on_sync_end(SnapshotEnd(b"", 7))
    assert r.delivered == list(range(1, 8))
    # Failover to a server whose log is another one: sequences restart from its start.
    r.core.start(1.0)
    r.core.on_heartbeat(Heartbeat(2, "store-b"), 1.5)
    assert r.core.stats.store_changes == 1
    assert r.asked == [0, 0]
    r.core.on_sync(ev(1))
    r.core.on_sync(ev(2))
    r.core.on_sync_end(SnapshotEnd(b"", 2))
    assert r.delivered == [*range(1, 8), 1, 2]


def test_no_heartbeat_in_time_proceeds_anyway() -> None:
    r = Recorder()
    r.core.start(0.0)
    r.core.proceed_without_heartbeat()
    assert r.asked == [0]
    r.core.proceed_without_heartbeat()
    assert r.asked == [0]


def test_first_beat_after_an_immediate_snapshot_closes_the_subscription_race() -> None:
    r = Recorder(full_feed=False)
    r.core.start(0.0, wait_for_heartbeat=False)
    assert r.asked == [0]
    r.core.on_heartbeat(Heartbeat(9, "s"), 0.1)  # arrives mid-snapshot: nothing yet
    r.core.on_sync(ev(2))
    r.core.on_sync_end(SnapshotEnd(b"/a/", 5))
    # Event 7 of the subtree was broadcast before the SUB was live, so it was missed.
    r.core.on_heartbeat(Heartbeat(9, "s"), 0.2)  # first beat after the snapshot: reconcile now
    assert r.asked == [0, 5]
    r.core.on_sync(ev(7))
    r.core.on_sync_end(SnapshotEnd(b"/a/", 9))
    assert r.delivered == [2, 7]
    r.core.on_heartbeat(Heartbeat(12, "s"), 0.3)  # later beats wait for the interval
    assert r.asked == [0, 5]


def test_subtree_subscriber_without_heartbeats_reconciles_to_bound_its_memory() -> None:
    import bus.eventbus.subscriber as module

    saved = module.MAX_UNVERIFIED
    module.MAX_UNVERIFIED = 3
    try:
        r = Recorder(full_feed=False)
        r.core.start(0.0, wait_for_heartbeat=False)
        r.core.on_sync_end(SnapshotEnd(b"/a/", 0))
        for sequence in (2, 4, 6, 8):
            r.core.on_broadcast(ev(sequence))
        assert r.asked == [0, 0]  # the fourth unverified sequence forced a reconcile
        r.core.on_sync_end(SnapshotEnd(b"/a/", 8))
        assert r.core.verified == 8
        assert r.delivered == [2, 4, 6, 8]
    finally:
        module.MAX_UNVERIFIED = saved


def test_unanswered_snapshot_requests_back_off_and_an_answer_resets_them() -> None:
    r = Recorder(last=10)
    r.core.start(0.0, wait_for_heartbeat=False)
    waits = [snapshot_patience(2.0, r.core.snapshot_retries, cap=20.0)]
    for _ in range(5):  # refused or abandoned by a busy server: no answer
        r.core.retry_snapshot()
        waits.append(snapshot_patience(2.0, r.core.snapshot_retries, cap=20.0))
    assert r.asked == [10] * 6  # the same request each time
    assert waits == [2.0, 4.0, 8.0, 16.0, 20.0, 20.0]
    r.core.on_sync(ev(11))
    assert r.core.snapshot_retries == 0
    r.core.retry_snapshot()
    r.core.on_sync_end(SnapshotEnd(b"", 11))
    assert r.core.snapshot_retries == 0
    assert r.delivered == [11]
    assert snapshot_patience(2.0, 1000, cap=20.0) == 20.0
    assert snapshot_patience(30.0, 3, cap=20.0) == 30.0  # never below the base
