"""The broker core's operator actions with a fake clock, without sockets: a paused queue's
requests wait (and are not asked of a stream) until resumed, a purge forgets the waiting
requests (stored and not yet committed ones too) and tells their clients, a forgotten
worker's requests in flight are retried elsewhere, a removed schedule is gone from the
store. Through the HTTP port and real sockets: tests/test_http_actions.py."""

from __future__ import annotations

from pathlib import Path

from bus.emqp import codec
from bus.emqp.core import Broker, BrokerSettings
from bus.emqp.store import JobStore
from tests.test_emqp_core import Harness, log


def test_a_paused_queue_holds_its_requests_and_resumes_in_their_order() -> None:
    h = Harness()
    h.inform(b"w", [[10, "q"], [5, "other"]], slots=3)
    h.sent_to_workers()
    assert h.broker.pause(b"q") and not h.broker.pause(b"q")
    held = [h.request("q", i) for i in range(2)]
    other = h.request("other")
    assert h.sent_to_workers() == [(b"w", other)]  # the worker's slots go to other queues
    assert h.broker.status()["queues"]["q"] == {
        "depth": 2, "workers": 1, "free_slots": 2, "dispatched": 0, "rejected": 0, "paused": True,
    }  # fmt: skip
    assert b"q" not in h.broker.wanted()  # nothing pulled from a stream for it either
    h.ready(b"w")  # a READY while paused takes nothing of it
    assert h.sent_to_workers() == []
    assert h.broker.resume(b"q") and not h.broker.resume(b"q")
    assert h.sent_to_workers() == [(b"w", held[0]), (b"w", held[1])]


def test_a_purge_forgets_waiting_requests_stored_or_not_and_tells_their_clients(
    tmp_path: Path,
) -> None:
    store = JobStore(tmp_path)
    try:
        h = Harness(store)
        stored = h.request("q", 1, b"reply-requested,guarantee")
        h.commit()
        plain = h.request("q", 2)
        uncommitted = h.request("q", 3, b"reply-requested,guarantee")  # before its commit
        h.request("kept", 4)
        h.client_results()
        assert h.broker.purge(b"q") == 3
        h.commit()
        assert store.count() == 0
        told = dict(h.client_results())
        assert {msgid: result["error"] for msgid, result in told.items()} == {
            stored: "purged", plain: "purged", uncommitted: "purged",
        }  # fmt: skip
        h.inform(b"w", [[10, "q"], [10, "kept"]], slots=5)
        assert [job.queue for job in h.broker.jobs.values()] == [b"kept"]
        assert [m for _, m in h.sent_to_workers()] == list(h.broker.jobs)
        assert h.broker.counters()["purged"] == 3
    finally:
        store.close()


def test_a_forgotten_worker_is_told_to_leave_and_its_requests_go_to_another() -> None:
    h = Harness()
    h.inform(b"dead", [[10, "q"]], slots=1)
    msgid = h.request("q", 1, b"reply-requested,retry-count:1")
    assert h.sent_to_workers() == [(b"dead", msgid)]
    assert h.broker.worker_named(h.broker.status()["workers"][0]["id"]) == b"dead"
    assert h.broker.forget(b"dead") and not h.broker.forget(b"dead")
    assert [worker for worker, _ in h.sent_to_workers(codec.KBYE)] == [b"dead"]
    h.inform(b"alive", [[10, "q"]], slots=1)
    assert h.sent_to_workers() == [(b"alive", msgid)]
    assert h.broker.counters()["workers_forgotten"] == 1


def test_a_removed_schedule_is_gone_from_the_book_and_the_store(tmp_path: Path) -> None:
    store = JobStore(tmp_path)
    try:
        h = Harness(store)
        h.broker.on_client_message(b"client", codec.schedule("q", b'"run"', b"", 3600.0, None))
        h.commit()
        (schedule,) = [row[0] for row in store.load_schedules()]
        assert h.broker.remove_schedule(schedule) and not h.broker.remove_schedule(schedule)
        h.commit()
        assert store.load_schedules() == []
        assert h.broker.next_schedule_due is None
        external = Broker(BrokerSettings(scheduler="external"), h.clock.seconds, log)
        assert not external.remove_schedule(schedule)
    finally:
        store.close()
