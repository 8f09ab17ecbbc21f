"""The broker's state machine with a fake clock: routing, slots, buffers, heartbeats,
timeouts, retries and the store, without sockets."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from twisted.internet.task import Clock
from twisted.logger import Logger

from bus.emqp import codec
from bus.emqp.core import (
    EXPIRY_SETTLE,
    Broker,
    BrokerSettings,
    Job,
    WorkerState,
    job_maker,
    open_ages,
)
from bus.emqp.store import JobStore
from bus.util.compiled import compiled

log = Logger(namespace="test.emqp")


class Harness:
    def __init__(self, store: JobStore | None = None, **settings: Any) -> None:
        self.clock = Clock()
        self.clock.advance(1_000)
        self.broker = Broker(BrokerSettings(**settings), self.clock.seconds, log, store)

    def inform(self, worker: bytes, queues: list[list[Any]], slots: int = 0) -> None:
        self.broker.on_worker_message(worker, codec.inform([tuple(q) for q in queues], "worker"))
        for _ in range(slots):
            self.ready(worker)

    def ready(self, worker: bytes) -> None:
        self.broker.on_worker_message(worker, codec.ready())

    def request(self, queue: str, body: Any = 0, headers: bytes = b"reply-requested") -> bytes:
        frames = codec.request(queue, json.dumps(body).encode(), headers)
        self.broker.on_client_message(b"client", frames)
        return frames[3]

    def commit(self) -> None:
        """What the service does after each batch: commit, then route what was stored."""
        assert self.broker.store is not None
        self.broker.store.commit()
        self.broker.release_stored()

    def reply(self, worker: bytes, msgid: bytes, value: Any = "ok") -> None:
        result = json.dumps({"value": value}).encode()
        self.broker.on_worker_message(worker, codec.reply(result, msgid))

    def sent_to_workers(self, command: bytes = codec.REQUEST) -> list[tuple[bytes, bytes]]:
        """(worker, msgid) of each message of ``command`` sent since last asked."""
        sent = [(m[0], m[4]) for m in self.broker.to_workers if m[3] == command]
        self.broker.to_workers.clear()
        return sent

    def client_results(self) -> list[tuple[bytes, Any]]:
        results = [(m[6], json.loads(m[5])) for m in self.broker.to_clients if len(m) == 7]
        self.broker.to_clients.clear()
        return results


def test_weight_then_least_recently_used() -> None:
    h = Harness()
    h.inform(b"light", [[5, "q"]], slots=10)
    h.inform(b"a", [[20, "q"]], slots=2)
    h.inform(b"b", [[20, "q"]], slots=2)
    h.sent_to_workers()
    ids = [h.request("q", i) for i in range(5)]
    assert [w for w, _ in h.sent_to_workers()] == [b"a", b"b", b"a", b"b", b"light"]
    assert {m for m in h.broker.jobs} == set(ids)


def test_ready_takes_the_heaviest_waiting_queue_then_the_oldest() -> None:
    h = Harness()
    low = h.request("low")
    h.clock.advance(1)
    high_1 = h.request("high")
    h.clock.advance(1)
    high_2 = h.request("high")
    h.inform(b"w", [[1, "low"], [9, "high"]])
    assert h.sent_to_workers() == []
    for _ in range(3):
        h.ready(b"w")
    assert [m for _, m in h.sent_to_workers()] == [high_1, high_2, low]
    assert h.broker.workers[b"w"].free_slots == 0


def test_a_full_buffer_answers_queue_full_and_too_many_queues() -> None:
    h = Harness(queue_limit=2, max_queues=2)
    ids = [h.request("q", i) for i in range(3)]
    assert h.client_results() == [
        (ids[2], {"error": "queue-full", "message": "the queue's buffer is full"})
    ]
    h.request("r")
    third = h.request("s")
    assert h.client_results()[0][1]["error"] == "too-many-queues"
    assert h.broker.rejected == 2 and third not in h.broker.jobs


def test_replies_reach_the_client_only_when_asked() -> None:
    h = Harness()
    h.inform(b"w", [[10, "q"]], slots=2)
    asked = h.request("q")
    quiet = h.request("q", headers=b"")
    requests = [m for m in h.broker.to_workers if m[3] == codec.REQUEST]
    assert [m[4] for m in requests] == [asked, quiet]
    # Both forwarded with reply-requested: the broker must learn when each ends.
    assert [m[6] for m in requests] == [b"reply-requested", b"reply-requested"]
    acks = [m for m in h.broker.to_clients if len(m) == 6]
    assert [m[5] for m in acks] == [asked, quiet]  # dispatch acknowledgements
    h.broker.to_clients.clear()
    h.reply(b"w", asked, 1)
    h.reply(b"w", quiet, 2)
    assert h.client_results() == [(asked, {"value": 1})]
    assert h.broker.replied == 2 and h.broker.forwarded_replies == 1 and not h.broker.jobs


def test_silent_workers_are_forgotten_and_their_requests_retried_or_failed() -> None:
    h = Harness(heartbeat_interval=3, heartbeat_liveness=3)
    h.inform(b"dies", [[10, "q"]], slots=2)
    plain = h.request("q")
    retried = h.request("q", headers=b"retry-count:1")
    assert len(h.sent_to_workers()) == 2
    h.clock.advance(3)
    h.broker.heartbeat()
    assert [w for w, _ in h.sent_to_workers(codec.HEARTBEAT)] == [b"dies"]
    h.clock.advance(3)
    h.broker.heartbeat()
    h.clock.advance(3.5)  # 9.5 s of silence > 3 x 3 s
    h.broker.heartbeat()
    assert b"dies" not in h.broker.workers
    assert h.client_results() == [
        (plain, {"error": "worker-lost", "message": "its worker died or went silent"})
    ]
    assert h.broker.queues[b"q"].waiting[0].msgid == retried
    h.inform(b"fresh", [[10, "q"]], slots=1)
    assert [m for w, m in h.sent_to_workers() if w == b"fresh"] == [retried]


def test_a_broker_that_did_not_run_forgets_no_one_before_it_read_what_waited() -> None:
    h = Harness(heartbeat_interval=1, heartbeat_liveness=3)
    h.inform(b"talks", [[10, "q"]])
    h.inform(b"dead", [[10, "q"]])
    h.broker.heartbeat()
    h.broker.to_workers.clear()
    h.clock.advance(20)  # stopped (SIGSTOP, a VM's pause): its first round comes late
    h.broker.heartbeat()
    assert set(h.broker.workers) == {b"talks", b"dead"}  # beaten, not judged
    assert {w for w, _ in h.sent_to_workers(codec.HEARTBEAT)} == {b"talks", b"dead"}
    assert h.broker.counters()["late_heartbeats_held"] == 1
    h.broker.on_worker_message(b"talks", codec.heartbeat(0))  # what waited in the socket
    h.clock.advance(0.1)  # LoopingCall's next point, soon after: still settling
    h.broker.heartbeat()
    assert set(h.broker.workers) == {b"talks", b"dead"}
    h.clock.advance(1.0)
    h.broker.heartbeat()
    assert set(h.broker.workers) == {b"talks"}
    assert h.broker.workers_lost == 1


def test_a_reloaded_heartbeat_interval_is_the_period_its_rounds_are_judged_by() -> None:
    h = Harness(heartbeat_interval=1, heartbeat_liveness=3)
    h.inform(b"dead", [[10, "q"]])
    h.broker.heartbeat()
    h.broker.reconfigure(dataclasses.replace(h.broker.settings, heartbeat_interval=10))
    for _ in range(4):  # rounds every 10 s: late at the old 1 s, on time now
        h.clock.advance(10)
        h.broker.heartbeat()
    assert h.broker.counters()["late_heartbeats_held"] == 0
    assert not h.broker.workers  # 40 s of silence > 3 x 10 s


def test_heartbeats_go_to_every_live_worker() -> None:
    h = Harness(heartbeat_interval=1, heartbeat_liveness=3)
    h.inform(b"a", [[10, "q"]])
    h.inform(b"b", [[10, "q"]])
    h.broker.to_workers.clear()
    h.clock.advance(1)
    h.broker.on_worker_message(b"a", codec.heartbeat(0))
    h.clock.advance(2.5)
    h.broker.heartbeat()
    assert [w for w, _ in h.sent_to_workers(codec.HEARTBEAT)] == [b"a"]
    assert set(h.broker.workers) == {b"a"}


def test_timeout_gives_up_and_a_late_reply_is_dropped() -> None:
    h = Harness()
    h.inform(b"w", [[10, "q"]], slots=1)
    msgid = h.request("q", headers=b"reply-requested,timeout:5")
    h.clock.advance(4.9)
    h.broker.expire()
    assert h.broker.timed_out == 0
    h.clock.advance(0.2)
    h.broker.expire()
    results = h.client_results()
    assert results[-1][0] == msgid and results[-1][1]["error"] == "timeout"
    assert msgid not in h.broker.jobs and h.broker.workers[b"w"].inflight == {}
    h.reply(b"w", msgid)
    assert h.broker.late_replies == 1 and h.broker.replied == 0
    assert h.client_results() == []


def test_a_late_look_at_the_timeouts_gives_up_on_nothing_before_it_read_what_waited() -> None:
    """The server looks every 50 ms; a look that comes late (the broker did not run) and
    those within its settling time give up on nothing: the REPLY may wait in the socket,
    and the reactor runs its timers before it reads. The first look after gives up."""
    h = Harness()
    h.inform(b"w", [[10, "q"], [10, "r"]], slots=2)
    answered = h.request("q", headers=b"reply-requested,timeout:1")
    silent = h.request("r", headers=b"reply-requested,timeout:1")
    assert h.broker.check_timeouts() is False  # nothing due
    h.clock.advance(EXPIRY_SETTLE)  # a busy reactor's jitter is no stall
    assert h.broker.check_timeouts() is False
    assert h.broker.counters()["late_timeout_checks_held"] == 0
    h.clock.advance(1.5)  # stalled past both timeouts: the look comes late
    assert h.broker.check_timeouts() is False
    assert h.broker.timed_out == 0 and h.broker.counters()["late_timeout_checks_held"] == 1
    h.reply(b"w", answered)  # it waited in the socket
    h.clock.advance(0.05)  # within the settling time
    assert h.broker.check_timeouts() is False
    h.clock.advance(EXPIRY_SETTLE)
    assert h.broker.check_timeouts() is True
    assert h.broker.timed_out == 1 and h.broker.replied == 1
    assert [(m, r.get("error")) for m, r in h.client_results()] == [
        (answered, None),
        (silent, "timeout"),
    ]


def test_guaranteed_requests_are_stored_until_replied_and_restored(tmp_path: Path) -> None:
    store = JobStore(tmp_path)
    h = Harness(store, guarantee_retries=2)
    h.inform(b"w", [[10, "q"]], slots=1)
    done = h.request("q", "first", b"guarantee")
    waiting = h.request("q", "second", b"guarantee,reply-requested")
    # Nobody hears of a guaranteed request before it is committed.
    assert h.sent_to_workers() == [] and h.broker.to_clients == []
    h.commit()
    assert [j.msgid for j in store.load()] == [done, waiting]
    assert h.sent_to_workers() == [(b"w", done)]
    plain = h.request("q", "third", b"")
    h.reply(b"w", done)
    h.commit()
    assert [j.msgid for j in store.load()] == [waiting]
    store.close()
    # After a crash: a new broker on the same store queues it again, in order.
    store = JobStore(tmp_path)
    again = Harness(store)
    assert again.broker.restore() == 1
    job = again.broker.queues[b"q"].waiting[0]
    assert (job.msgid, job.body, job.headers.reply_requested) == (waiting, b'"second"', True)
    assert job.retries_left == 2
    again.inform(b"w2", [[10, "q"]], slots=1)
    assert again.sent_to_workers() == [(b"w2", waiting)]
    assert plain not in again.broker.jobs
    store.close()


def test_retries_are_stored_and_bounded(tmp_path: Path) -> None:
    store = JobStore(tmp_path)
    h = Harness(store)
    h.inform(b"w", [[10, "q"]], slots=3)
    msgid = h.request("q", headers=b"guarantee,retry-count:1,timeout:1")
    h.commit()
    h.clock.advance(1.01)
    h.broker.expire()
    h.commit()
    assert store.load()[0].retries_left == 0
    h.clock.advance(1.01)
    h.broker.expire()
    h.commit()
    assert store.load() == []
    assert [m for _, m in h.sent_to_workers()] == [msgid, msgid]
    assert h.client_results()[-1][1]["error"] == "timeout"
    assert (h.broker.retried, h.broker.failed, h.broker.timed_out) == (1, 1, 2)
    # Both attempts' REPLYs are late now.
    h.reply(b"w", msgid)
    assert h.broker.late_replies == 1 and h.broker.drops.counts["late-reply"] == 1
    store.close()


def test_guaranteed_requests_the_store_refused_are_refused_and_never_stored(
    tmp_path: Path,
) -> None:
    store = JobStore(tmp_path)
    h = Harness(store)
    h.inform(b"w", [[10, "q"]], slots=2)
    refused = h.request("q", "a", b"guarantee,reply-requested")
    plain = h.request("q", "b", b"")  # not guaranteed: goes on
    assert h.sent_to_workers() == [(b"w", plain)]
    assert h.broker.refuse_unstored("storage-error", "the job store cannot write") == 1
    results = h.client_results()
    assert [(m, r["error"]) for m, r in results] == [(refused, "storage-error")]
    assert refused not in h.broker.jobs and h.broker.refused_unstored == 1
    h.commit()  # a later commit does not store what was refused
    assert store.load() == [] and h.sent_to_workers() == []
    store.close()


def test_committed_guaranteed_requests_take_free_slots_in_order_then_wait(
    tmp_path: Path,
) -> None:
    """At the commit each goes to a free slot as a new request would (heaviest worker, then
    the least recently used, on from the dispatches before it); the rest wait, ahead of
    what comes after them."""
    store = JobStore(tmp_path)
    try:
        h = Harness(store)
        h.inform(b"a", [[20, "q"]], slots=2)
        h.inform(b"b", [[20, "q"]], slots=2)
        h.inform(b"light", [[5, "q"]])
        h.sent_to_workers()
        first = h.request("q", "plain")
        held = [h.request("q", i, b"guarantee,reply-requested") for i in range(4)]
        assert h.sent_to_workers() == [(b"a", first)]
        h.commit()
        assert h.sent_to_workers() == [(b"b", held[0]), (b"a", held[1]), (b"b", held[2])]
        assert [job.msgid for job in h.broker.queues[b"q"].waiting] == [held[3]]
        later = h.request("q", "plain")
        h.ready(b"light")
        h.ready(b"light")
        assert h.sent_to_workers() == [(b"light", held[3]), (b"light", later)]
        acknowledged = [m[5] for m in h.broker.to_clients if len(m) == 6]
        assert acknowledged == [first, held[0], held[1], held[2], held[3], later]
    finally:
        store.close()


def test_committed_guaranteed_requests_wait_in_a_paused_or_gone_queue(tmp_path: Path) -> None:
    """A paused queue holds them, each behind what waited before it, until it is resumed;
    a queue dropped before the commit (its only worker left) is made again for them."""
    store = JobStore(tmp_path)
    try:
        h = Harness(store)
        h.inform(b"w", [[10, "q"]], slots=3)
        h.inform(b"x-worker", [[10, "x"]])
        assert h.broker.pause(b"q")
        first = h.request("q", 1, b"guarantee")
        orphan = h.request("x", "gone", b"guarantee")
        h.broker.on_worker_message(b"x-worker", codec.kbye())
        assert b"x" not in h.broker.queues
        h.commit()  # the paused queue has a free slot and nothing waiting: held all the same
        between = h.request("q", "plain")
        second = h.request("q", 2, b"guarantee")
        h.commit()
        after = h.request("q", "plain")
        assert h.sent_to_workers() == []
        waiting = [job.msgid for job in h.broker.queues[b"q"].waiting]
        assert waiting == [first, between, second, after]
        assert [job.msgid for job in h.broker.queues[b"x"].waiting] == [orphan]
        assert h.broker.resume(b"q")
        assert h.sent_to_workers() == [(b"w", first), (b"w", between), (b"w", second)]
        assert [job.msgid for job in h.broker.queues[b"q"].waiting] == [after]
        h.inform(b"x-again", [[1, "x"]], slots=1)
        assert h.sent_to_workers() == [(b"x-again", orphan)]
    finally:
        store.close()


def test_a_stranger_is_told_kbye_once_until_it_informs() -> None:
    h = Harness()
    for _ in range(5):  # e.g. eventmq's job manager heartbeating a restarted broker
        h.broker.on_worker_message(b"stranger", codec.heartbeat(1.0))
    assert [w for w, _ in h.sent_to_workers(codec.KBYE)] == [b"stranger"]
    assert h.broker.drops.counts["not-informed"] == 5
    h.inform(b"stranger", [[10, "q"]])
    assert b"stranger" in h.broker.workers
    h.sent_to_workers(codec.ACK)
    # Forgotten again (silent too long): its next message is told KBYE once more.
    h.clock.advance(h.broker.settings.worker_expiry + 1)
    h.broker.heartbeat()
    assert b"stranger" not in h.broker.workers
    h.sent_to_workers(codec.HEARTBEAT)
    h.broker.on_worker_message(b"stranger", codec.ready())
    h.broker.on_worker_message(b"stranger", codec.ready())
    assert [w for w, _ in h.sent_to_workers(codec.KBYE)] == [b"stranger"]


def test_bad_peers_are_counted() -> None:
    h = Harness()
    h.broker.on_worker_message(b"stranger", codec.ready())
    assert [w for w, _ in h.sent_to_workers(codec.KBYE)] == [b"stranger"]
    h.broker.on_worker_message(b"stranger", [b"", b"eMQP/1.0", b"READY", b"\xff"])
    h.inform(b"w", [[10, "q"]])
    h.reply(b"w", b"nobody")
    h.broker.on_client_message(b"c", codec.ready())
    msgid = h.request("q")
    h.broker.on_client_message(b"client", codec.request("q", b"1", b"", msgid=msgid))
    assert dict(h.broker.drops.counts) == {
        "not-informed": 1,
        "not-utf8": 1,
        "unknown-request": 1,
        "unexpected-command": 1,
        "duplicate-msgid": 1,
    }


def test_the_store_checkpoints_off_the_committing_connection(tmp_path: Path) -> None:
    from bus.emqp.store import StoredJob

    store = JobStore(tmp_path)
    for n in range(200):
        msgid = b"job-%d" % n
        store.put(StoredJob(msgid, store.next_position(), b"c", b"q", b"", b"1", 0.0, 0, 1))
        store.commit()
        store.remove(msgid)
        store.commit()
    wal = tmp_path / "emqp.sqlite3-wal"
    assert wal.stat().st_size > 0  # no automatic checkpoint inside the commits
    assert store.checkpoint() > 0
    store.close()
    assert not wal.exists() or wal.stat().st_size == 0
    again = JobStore(tmp_path)
    assert again.load() == [] and again.next_position() == 1
    again.close()


def test_the_brokers_scheduler_fires_requests_stores_its_runs_and_catches_up_once(
    tmp_path: Path,
) -> None:
    store = JobStore(tmp_path)
    h = Harness(store)
    h.inform(b"w", [[10, "q"]], slots=10)
    h.sent_to_workers(codec.ACK)
    body = json.dumps(["run", {"path": "m", "callable": "f", "args": [1]}]).encode()
    schedule = codec.schedule("q", body, b"guarantee", 10, None)
    h.broker.on_admin_message(b"admin", schedule)
    h.commit()  # answered once stored
    [answer] = h.broker.to_admin
    value = json.loads(answer[5])["value"]
    assert answer[6] == schedule[3] and value["replaced"] is False and value["next_run_in"] == 0
    schedule_id = value["schedule"]
    assert [row[0] for row in store.load_schedules()] == [schedule_id]
    # Due at once (eventmq's haste): a guaranteed request, dispatched once committed.
    assert h.broker.fire_schedules() == 1
    assert h.sent_to_workers() == [] and store.count() == 0
    h.commit()
    [(worker, first)] = h.sent_to_workers()
    assert worker == b"w" and store.count() == 1
    assert h.broker.to_clients == []  # nobody to acknowledge
    h.reply(b"w", first)
    h.commit()
    assert store.count() == 0 and h.broker.to_clients == []
    h.clock.advance(9.9)
    assert h.broker.fire_schedules() == 0
    h.clock.advance(0.1)
    assert h.broker.fire_schedules() == 1
    h.commit()
    assert len(h.sent_to_workers()) == 1
    assert store.load_schedules()[0][8] == 2  # runs
    store.close()

    # Down for 95 s: after the restart it runs once, not nine times, then every 10 s again.
    store = JobStore(tmp_path)
    again = Harness(store)
    again.clock.advance(95)
    assert again.broker.restore_schedules() == 1
    again.inform(b"w2", [[10, "q"]], slots=10)
    assert again.broker.fire_schedules() == 1
    again.commit()
    assert len(again.sent_to_workers()) == 1
    assert again.broker.fire_schedules() == 0
    again.clock.advance(10)
    assert again.broker.fire_schedules() == 1
    # UNSCHEDULE by id (or by eventmq's frames): gone from the book and the store.
    again.broker.on_client_message(b"client", codec.unschedule(schedule_id))
    again.commit()
    assert json.loads(again.broker.to_clients[-1][5])["value"]["removed"] is True
    assert store.load_schedules() == []
    again.clock.advance(100)
    assert again.broker.fire_schedules() == 0
    store.close()


def test_a_bad_schedule_is_refused_and_an_external_scheduler_gets_them_forwarded() -> None:
    h = Harness()
    bad = codec.schedule("q", b"[1]", b"", None, "not a cron line")
    h.broker.on_client_message(b"client", bad)
    assert json.loads(h.broker.to_clients[-1][5])["error"] == "bad-schedule"
    assert h.broker.drops.counts["bad-schedule"] == 1
    external = Harness(scheduler="external")
    external.broker.on_client_message(b"sched", codec.inform([], codec.SCHEDULER))
    external.broker.to_clients.clear()
    external.broker.on_client_message(b"client", codec.schedule("q", b"[1]", b"", 5, None))
    assert [m[0] for m in external.broker.to_clients] == [b"sched"]
    assert external.broker.schedules is None and external.broker.schedules_forwarded == 1


def test_schedule_changes_are_answered_only_after_their_commit(tmp_path: Path) -> None:
    store = JobStore(tmp_path)
    h = Harness(store)
    add = codec.schedule("q", b'["a"]', b"", 60, None)
    h.broker.on_admin_message(b"admin", add)
    h.broker.on_client_message(b"client", codec.schedule("q", b'["b"]', b"", 60, None))
    # Nobody hears of either before the commit, on either port.
    assert h.broker.to_admin == [] and h.client_results() == []
    assert h.broker.awaiting_commit and len(h.broker.unstored_answers) == 2
    h.commit()
    [answer] = h.broker.to_admin
    schedule_id = json.loads(answer[5])["value"]["schedule"]
    assert answer[6] == add[3] and [r["value"]["replaced"] for _, r in h.client_results()] == [
        False
    ]
    # UNSCHEDULE likewise; one of nothing stored is answered at once.
    h.broker.on_client_message(b"client", codec.unschedule(schedule_id))
    assert h.client_results() == []
    h.commit()
    assert [r["value"]["removed"] for _, r in h.client_results()] == [True]
    h.broker.on_client_message(b"client", codec.unschedule("0" * 40))
    assert [r["value"]["removed"] for _, r in h.client_results()] == [False]
    # A store that never takes it (the broker stops): the client is told, not answered.
    late = codec.schedule("q", b'["c"]', b"", 60, None)
    h.broker.on_client_message(b"client", late)
    assert h.broker.refuse_unstored("storage-error", "the job store cannot write") == 1
    assert [(m, r["error"]) for m, r in h.client_results()] == [(late[3], "storage-error")]
    assert not h.broker.awaiting_commit
    store.close()


def test_an_answer_behind_a_held_one_keeps_its_turn(tmp_path: Path) -> None:
    """An admin's SCHEDULE then STATUS: the STATUS answer waits behind the SCHEDULE's
    (answered once stored), and goes as it is if the store never takes the schedule."""
    store = JobStore(tmp_path)
    h = Harness(store)
    add = codec.schedule("q", b'["a"]', b"", 60, None)
    status = codec.message(codec.STATUS)
    h.broker.on_admin_message(b"admin", add)
    h.broker.on_admin_message(b"admin", status)
    assert h.broker.to_admin == []
    h.commit()
    assert [m[6] for m in h.broker.to_admin] == [add[3], status[3]]
    h.broker.to_admin.clear()
    again = codec.schedule("q", b'["b"]', b"", 60, None)
    h.broker.on_admin_message(b"admin", again)
    h.broker.on_admin_message(b"admin", status)
    assert h.broker.refuse_unstored("storage-error", "full") == 1
    answers = [(m[6], json.loads(m[5])) for m in h.broker.to_admin]
    assert answers[0] == (again[3], answers[0][1]) and answers[0][1]["error"] == "storage-error"
    assert answers[1][0] == status[3] and "workers" in answers[1][1]
    store.close()


def test_eventmq_status_keys_count_what_happened_and_outlive_workers_and_queues() -> None:
    h = Harness()
    h.inform(b"w", [[10, "q"]], slots=1)
    first = h.request("q")
    h.clock.advance(2)
    h.request("q")  # waits: the one slot is taken
    keys = h.broker.eventmq_status(h.clock.seconds())
    assert keys["inflight_messages_by_queue"] == {"q": 2}
    assert keys["waiting_messages_by_queue"] == {"q": 1}
    assert keys["latency_messages_by_queue"] == {"q": 1000}  # ages 2 s and 0 s
    assert keys["max_latency_messages_by_queue"] == {"q": 2000}
    h.reply(b"w", first)  # its slot takes the waiting one: two dispatches
    h.ready(b"w")
    h.broker.on_worker_message(b"w", codec.kbye())  # the second is lost with it
    keys = h.broker.eventmq_status(h.clock.seconds())
    assert keys["processed_messages_by_queue"] == {"q": 2}
    assert keys["processed_messages_by_worker"] == {"w": 2}
    assert keys["inflight_messages_by_queue"] == {} == keys["waiting_messages_by_queue"]
    assert b"q" not in h.broker.queues  # gone, its count kept


@settings(max_examples=60, deadline=None)
@given(st.lists(st.lists(st.tuples(st.integers(0, 300), st.booleans()), max_size=160), max_size=6))
def test_the_store_keeps_what_commits_of_any_size_told_it(
    tmp_path_factory: Any, commits: list[list[tuple[int, bool]]]
) -> None:
    """Puts and removals go in statements of several rows (bus/emqp/store.py's groups):
    what is loaded is what was put and not removed since, whatever the counts."""
    from bus.emqp.store import StoredJob

    store = JobStore(tmp_path_factory.mktemp("store"))
    kept: dict[bytes, StoredJob] = {}
    for changes in commits:
        for number, remove in changes:
            msgid = b"job-%d" % number
            if remove:
                store.remove(msgid)
                kept.pop(msgid, None)
            else:
                job = StoredJob(msgid, store.next_position(), b"c", b"q", b"", b"[1]", 1.0, 0, 2)
                store.put(job)
                kept[msgid] = job
        store.commit()
        assert store.load() == sorted(kept.values(), key=lambda job: job.position)
    store.close()


def _traffic() -> list[tuple[str, list[list[bytes]]]]:
    """A worker's and a client's batches: jobs, strangers, garbage."""
    msgids = [b"7c4d3a1e-55aa-4f0e-9b1c-%012x" % n for n in range(4)]
    body = b'["job", 1]'

    def request(n: int, headers: bytes) -> list[bytes]:
        return [b"client", b"", codec.PROTOCOL, codec.REQUEST, msgids[n], b"q", headers, body]

    def reply(worker: bytes, msgid: bytes) -> list[bytes]:
        return [worker, b"", codec.PROTOCOL, codec.REPLY, b"r", b'{"value": 1}', msgid]

    return [
        ("workers", [
            [b"w", *codec.inform([(10, "q")], "worker")],
            [b"w", *codec.ready()], [b"w", *codec.ready()],
            [b"ghost", *codec.ready()], [b"w", *codec.heartbeat(1.0)], [b"w", b"", b"bad"],
        ]),
        ("clients", [
            request(0, b"reply-requested"), request(1, b"reply-requested,guarantee"),
            request(2, b"guarantee,retry-count:2"), [b"client", b"", b"junk"],
            request(0, b"reply-requested"), request(3, b""),
        ]),
        ("workers", [
            reply(b"w", msgids[0]), [b"w", *codec.ready()], reply(b"w", b"unknown"),
            reply(b"ghost", msgids[1]), reply(b"w", msgids[1]), [b"w", *codec.ready()],
        ]),
    ]  # fmt: skip


def _handled(
    rounds: list[tuple[str, list[list[bytes]]]],
    store: JobStore | None,
    batched: bool,
    monkeypatch: Any,
) -> dict[str, Any]:
    """What a broker left once given ``rounds`` a batch at a time, as the service reads
    them, or a message at a time (its message ids numbered alike)."""
    import itertools

    import bus.emqp.core

    made = itertools.count()
    for module in (bus.emqp.core, codec):
        name = "_new_msgid" if module is bus.emqp.core else "new_msgid"
        monkeypatch.setattr(module, name, lambda: b"id-%d" % next(made))
    h = Harness(store)
    broker = h.broker
    for side, batch in rounds:
        if batched:
            handle = broker.on_worker_messages if side == "workers" else broker.on_client_messages
            handle([list(message) for message in batch])
        else:
            one = broker.on_worker_message if side == "workers" else broker.on_client_message
            for message in batch:
                one(message[0], message[1:])
        if store is not None:
            h.commit()
    return {
        "to_workers": broker.to_workers,
        "to_clients": broker.to_clients,
        "counters": broker.counters(),
        "drops": dict(broker.drops.counts),
        "jobs": sorted(broker.jobs),
        "workers": {
            w.identity: (w.free_slots, w.last_seen, sorted(w.inflight), w.dispatched)
            for w in broker.workers.values()
        },
        "stored": sorted(job.msgid for job in store.load()) if store is not None else None,
    }


def test_a_batch_is_handled_as_its_messages_one_at_a_time(tmp_path: Path, monkeypatch: Any) -> None:
    """The service hands the broker whole batches (on_worker_messages, on_client_messages):
    what a batch leaves is what its messages given one at a time leave, with or without
    the store of guaranteed requests."""
    rounds = _traffic()
    for stored in (False, True):
        stores = [JobStore(tmp_path / f"{stored}-{n}") if stored else None for n in (0, 1)]
        alone = _handled(rounds, stores[0], batched=False, monkeypatch=monkeypatch)
        batched = _handled(rounds, stores[1], batched=True, monkeypatch=monkeypatch)
        assert batched == alone
        assert alone["counters"]["replied"] == 2 and alone["drops"]
        if stored:
            assert alone["stored"] == [b"7c4d3a1e-55aa-4f0e-9b1c-000000000002"]
        for store in stores:
            if store is not None:
                store.close()


@given(
    st.binary(max_size=8), st.binary(max_size=8), st.floats(allow_nan=False), st.integers(),
    st.booleans(),
)  # fmt: skip
def test_a_request_s_job_is_made_as_the_class_makes_it(
    msgid: bytes, client: bytes, received: float, retries: int, stored: bool
) -> None:
    headers = codec.parse_headers(b"guarantee")
    made = job_maker()(msgid, client, b"q", headers, b"1", received, retries, stored)
    expected = Job(msgid, client, b"q", headers, b"1", received, retries, stored)
    assert type(made) is Job
    for each in dataclasses.fields(Job):
        assert getattr(made, each.name) == getattr(expected, each.name), each.name


def test_the_compiled_maker_takes_only_a_class_of_slots() -> None:
    maker = getattr(compiled("bus.emqp._jobscan", "BUS_NATIVE_EMQP"), "Maker", None)
    if maker is None:
        pytest.skip("bus.emqp._jobscan not built")

    class Plain:
        msgid = b""

    with pytest.raises(TypeError):
        maker(Plain, ("msgid",), ())
    with pytest.raises(TypeError):
        job_maker()(b"too few")


@given(
    st.lists(
        st.tuples(st.sampled_from([b"a", b"b", b"q" * 300, b""]), st.floats(-1e9, 1e9)),
        max_size=60,
    ),
    st.floats(-1e9, 1e9),
)
def test_the_open_requests_ages_by_queue_are_python_s_compiled_or_not(
    requests: list[tuple[bytes, float]], now: float
) -> None:
    """``open_ages`` (eventmq's STATUS keys) gives, compiled, what the Python loop gives."""
    native = getattr(compiled("bus.emqp._jobscan", "BUS_NATIVE_EMQP"), "open_ages", None)
    if native is None:
        pytest.skip("bus.emqp._jobscan not built")
    headers = codec.parse_headers(b"")
    jobs = {
        b"%d" % n: Job(b"%d" % n, b"c", queue, headers, b"1", received, 0, False)
        for n, (queue, received) in enumerate(requests)
    }
    expected: dict[bytes, list[Any]] = {}
    for job in jobs.values():
        age = now - job.received
        count, total, oldest = expected.get(job.queue, [0, 0.0, age])
        expected[job.queue] = [count + 1, total + age, max(oldest, age)]
    assert native(jobs, Job.queue, Job.received, now) == expected
    assert open_ages(jobs, now) == expected
    # What it cannot read (another class, a received time not a float) it leaves to Python.
    assert native({b"x": object()}, Job.queue, Job.received, now) is None
    if jobs:
        next(iter(jobs.values())).received = 5  # type: ignore[assignment]
        assert native(jobs, Job.queue, Job.received, now) is None
    with pytest.raises(TypeError):
        native(jobs, Job.queue, WorkerState.identity, now)


def test_a_ready_in_a_batch_dispatches_nothing_of_a_paused_queue() -> None:
    """A READY handled within a batch (on_worker_messages) takes no request of a paused
    queue, and the oldest waiting one once it is resumed."""
    h = Harness()
    h.inform(b"w", [[10, "q"]])
    first, second = h.request("q", 1), h.request("q", 2)
    h.broker.pause(b"q")
    h.broker.on_worker_messages([[b"w", *codec.ready()]])
    assert h.sent_to_workers() == []
    h.broker.resume(b"q")
    assert h.sent_to_workers() == [(b"w", first)]
    h.broker.on_worker_messages([[b"w", *codec.ready()]])
    assert h.sent_to_workers() == [(b"w", second)]


def test_weight_then_least_recently_used_once_the_heaviest_worker_left() -> None:
    """A queue's heaviest worker gone (its weight no longer any worker's), the others are
    still chosen by weight, then least recently used."""
    h = Harness()
    h.inform(b"heavy", [[30, "q"]], slots=1)
    h.inform(b"light", [[5, "q"]], slots=10)
    h.inform(b"a", [[20, "q"]], slots=2)
    h.inform(b"b", [[20, "q"]], slots=2)
    h.broker.on_worker_message(b"heavy", codec.kbye())
    h.sent_to_workers()
    h.request("q", 0)
    h.request("q", 1)
    h.request("q", 2)
    h.request("q", 3)
    h.request("q", 4)
    assert [w for w, _ in h.sent_to_workers()] == [b"a", b"b", b"a", b"b", b"light"]
