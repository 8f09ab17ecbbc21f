"""The eMQP broker through real sockets on 127.0.0.1: our client and worker libraries, and
raw peers that take a job and die, stay silent or reply late."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import msgpack
import pytest
import pytest_twisted
import zmq
from twisted.internet import defer, reactor

from bus.emqp import codec
from bus.emqp.client import EmqpClient, JobFailed, query_status
from bus.emqp.worker import EmqpWorker
from bus.testing import RawPeer, start_broker, start_bus, wait_until
from tests.emqp_helpers import RawClient, RawWorker, broker_in


def add(params: dict[str, int]) -> int:
    return params["a"] + params["b"]


def fail(params: Any) -> None:
    raise ValueError("no such thing")


def worker_for(broker: Any, cleanup: list[Any], **options: Any) -> EmqpWorker:
    options.setdefault("handlers", {"add": add, "fail": fail})
    worker = EmqpWorker(broker.endpoints["worker"], **options)
    worker.startService()
    cleanup.append(worker)
    return worker


def client_for(broker: Any, cleanup: list[Any]) -> EmqpClient:
    client = EmqpClient(broker.endpoints["client"])
    cleanup.append(client)
    return client


@pytest_twisted.inlineCallbacks
def test_a_reply_reaches_the_client_that_asked(tmp_path: Path, cleanup: list[Any]) -> Any:
    broker = broker_in(tmp_path, cleanup)
    worker = worker_for(broker, cleanup, slots=2)
    client = client_for(broker, cleanup)
    yield wait_until(lambda: worker.registered, what="the worker's ACK")
    submitted = [client.submit("default", ["add", {"a": i, "b": 1}]) for i in range(20)]
    results = yield defer.gatherResults(submitted)
    assert results == [i + 1 for i in range(20)]
    # The failure of a handler comes back as an error.
    with pytest.raises(JobFailed) as failed:
        yield client.submit("default", ["fail", {}])
    assert failed.value.reason == "handler-failed"
    assert "ValueError: no such thing" in failed.value.message
    # Without reply the Deferred fires on dispatch with the request's id.
    msgid = yield client.submit("default", ["add", {"a": 1, "b": 1}], reply=False)
    assert isinstance(msgid, str) and len(msgid) == 36
    yield wait_until(lambda: broker.broker.replied == 22, what="every reply")
    assert broker.broker.forwarded_replies == 21  # the reply=False one was not forwarded
    assert broker.broker.drops.total == 0
    # The worker sends its READY after the REPLY, a message of its own: it may come in a
    # later read than the REPLY the count above was waited on.
    yield wait_until(
        lambda: broker.status()["workers"][0]["free_slots"] == 2, what="both slots free again"
    )


@pytest_twisted.inlineCallbacks
def test_dispatch_ack_then_result_as_the_original_client_sees_them(
    tmp_path: Path, cleanup: list[Any]
) -> Any:
    broker = broker_in(tmp_path, cleanup)
    worker = RawWorker(broker.endpoints["worker"], [[10, "jobs"]])
    client = RawClient(broker.endpoints["client"])
    cleanup += [worker, client]
    yield wait_until(worker.acked, what="ACK")
    # The original job manager starts its workers at the broker's first HEARTBEAT: the broker
    # sends one right behind the ACK. Both leave in one batch but may arrive in two reads.
    yield wait_until(lambda: len(worker.messages) >= 2, what="the message after the ACK")
    assert [m[2] for m in worker.messages[:2]] == [codec.ACK, codec.HEARTBEAT]
    worker.ready()
    msgid = client.request("jobs", ["run", {"path": "os.path", "callable": "join"}], b"")
    yield wait_until(lambda: worker.requests(), what="the REQUEST at the worker")
    request = worker.requests()[0]
    # Forwarded with the client's msgid and body; reply-requested added for the broker.
    assert request[3] == msgid and request[4] == b"jobs"
    assert request[5] == b"reply-requested"
    assert json.loads(request[6]) == ["run", {"path": "os.path", "callable": "join"}]
    yield wait_until(lambda: client.acks(msgid), what="the dispatch acknowledgement")
    worker.reply(request, "done")
    yield wait_until(lambda: broker.broker.replied == 1, what="the REPLY")
    # Not asked for: not forwarded (counted as the REPLY is taken; a result sent to the
    # client could still be on its way when its absence is checked).
    assert broker.broker.forwarded_replies == 0
    assert client.results(msgid) == []
    msgid = client.request("jobs", {"x": 1}, b"reply-requested,timeout:30")
    worker.ready()
    yield wait_until(lambda: len(worker.requests()) == 2, what="the second REQUEST")
    worker.reply(worker.requests()[1], [1, 2])
    yield wait_until(lambda: client.results(msgid), what="the forwarded result")
    assert client.results(msgid) == [{"value": [1, 2]}]


@pytest_twisted.inlineCallbacks
def test_full_buffer_answers_an_error_and_waiting_requests_go_out_on_ready(
    tmp_path: Path, cleanup: list[Any]
) -> Any:
    broker = broker_in(tmp_path, cleanup, queue_limit=2)
    client = RawClient(broker.endpoints["client"])
    cleanup.append(client)
    ids = [client.request("q", i) for i in range(3)]
    yield wait_until(lambda: client.results(ids[2]), what="the error reply")
    assert client.results(ids[2]) == [
        {"error": "queue-full", "message": "the queue's buffer is full"}
    ]
    status = yield query_status(broker.endpoints["admin"])
    assert status["queues"]["q"]["depth"] == 2 and status["queues"]["q"]["rejected"] == 1
    worker = RawWorker(broker.endpoints["worker"], [[10, "q"]])
    cleanup.append(worker)
    yield wait_until(worker.acked, what="ACK")
    worker.ready(5)
    yield wait_until(lambda: len(worker.requests()) == 2, what="the waiting requests")
    assert [json.loads(r[6]) for r in worker.requests()] == [0, 1]  # oldest first
    yield wait_until(lambda: broker.status()["workers"][0]["free_slots"] == 3)


@pytest_twisted.inlineCallbacks
def test_weighted_queues_then_least_recently_used(tmp_path: Path, cleanup: list[Any]) -> Any:
    broker = broker_in(tmp_path, cleanup)
    light = RawWorker(broker.endpoints["worker"], [[5, "q"]])
    heavy_a = RawWorker(broker.endpoints["worker"], [[20, "q"]])
    heavy_b = RawWorker(broker.endpoints["worker"], [[20, "q"]])
    client = RawClient(broker.endpoints["client"])
    cleanup += [light, heavy_a, heavy_b, client]
    for worker in (light, heavy_a, heavy_b):
        yield wait_until(worker.acked, what="ACK")
        worker.ready(3)
    yield wait_until(lambda: sum(w["free_slots"] for w in broker.status()["workers"]) == 9)
    for i in range(6):
        client.request("q", i)
    yield wait_until(lambda: broker.broker.dispatched == 6)
    # Dispatched is sent, not yet received: wait for the six to arrive somewhere.
    yield wait_until(
        lambda: sum(len(w.requests()) for w in (light, heavy_a, heavy_b)) == 6,
        what="six requests at the workers",
    )
    # The two heavier workers take everything, alternating (least recently used first).
    assert len(heavy_a.requests()) == 3 and len(heavy_b.requests()) == 3
    assert light.requests() == []
    first = [json.loads(r[6]) for r in heavy_a.requests()]
    second = [json.loads(r[6]) for r in heavy_b.requests()]
    assert sorted([first, second]) == [[0, 2, 4], [1, 3, 5]]
    client.request("q", 6)
    yield wait_until(lambda: light.requests(), what="the light worker's turn")


@pytest_twisted.inlineCallbacks
def test_a_guaranteed_request_outlives_its_dead_worker(tmp_path: Path, cleanup: list[Any]) -> Any:
    broker = broker_in(tmp_path, cleanup, heartbeat_interval=0.1, heartbeat_liveness=3)
    doomed = RawWorker(broker.endpoints["worker"])
    client = client_for(broker, cleanup)
    cleanup.append(doomed)
    yield wait_until(doomed.acked, what="ACK")
    doomed.ready()
    result = client.submit("default", ["add", {"a": 2, "b": 3}], guarantee=True)
    yield wait_until(lambda: doomed.requests(), what="the first dispatch")
    assert broker.store.count() == 1  # stored before the worker saw it
    doomed.close()  # dies without a word: the broker notices the silence
    yield wait_until(lambda: broker.broker.workers_lost == 1, what="the dead worker forgotten")
    assert broker.broker.retried == 1
    assert broker.status()["queues"]["default"]["depth"] == 1
    worker_for(broker, cleanup, heartbeat_interval=0.1)
    value = yield result
    assert value == 5
    yield wait_until(lambda: broker.store.count() == 0, what="the store emptied")


@pytest_twisted.inlineCallbacks
def test_timeout_answers_an_error_and_a_late_reply_is_dropped(
    tmp_path: Path, cleanup: list[Any]
) -> Any:
    broker = broker_in(tmp_path, cleanup)
    slow = RawWorker(broker.endpoints["worker"])
    client = client_for(broker, cleanup)
    cleanup.append(slow)
    yield wait_until(slow.acked, what="ACK")
    slow.ready()
    with pytest.raises(JobFailed) as failed:
        yield client.submit("default", ["add", {"a": 1, "b": 1}], timeout=1)
    assert failed.value.reason == "timeout"
    assert broker.broker.timed_out == 1
    slow.reply(slow.requests()[0], 2)
    yield wait_until(lambda: broker.broker.late_replies == 1, what="the late reply")
    assert broker.broker.drops.counts["late-reply"] == 1
    assert broker.broker.replied == 0


@pytest_twisted.inlineCallbacks
def test_retry_count_bounds_the_redispatches(tmp_path: Path, cleanup: list[Any]) -> Any:
    broker = broker_in(tmp_path, cleanup)
    silent = RawWorker(broker.endpoints["worker"])
    client = client_for(broker, cleanup)
    cleanup.append(silent)
    yield wait_until(silent.acked, what="ACK")
    silent.ready(5)
    with pytest.raises(JobFailed) as failed:
        yield client.submit("default", 1, guarantee=True, retries=2, timeout=1)
    assert failed.value.reason == "timeout"
    # One dispatch and two re-dispatches, each timed out; then the store forgot it.
    assert len(silent.requests()) == 3
    assert len({r[3] for r in silent.requests()}) == 1
    assert broker.broker.retried == 2 and broker.broker.failed == 1
    yield wait_until(lambda: broker.store.count() == 0)


@defer.inlineCallbacks
def ready_worker(broker: Any, cleanup: list[Any]) -> Any:
    """A raw worker of queue ``default`` with one free slot that the broker knows of, and
    nothing on its way to it: the HEARTBEAT the broker sends behind the ACK (in the same
    batch, yet maybe in a later read) has been read too."""
    worker = RawWorker(broker.endpoints["worker"])
    cleanup.append(worker)
    yield wait_until(worker.acked, what="ACK")
    yield wait_until(lambda: worker.commands(codec.HEARTBEAT), what="the HEARTBEAT behind the ACK")
    worker.ready()
    yield wait_until(
        lambda: getattr(broker.broker.workers.get(worker.identity), "free_slots", 0) == 1,
        what="the worker's free slot",
    )
    return worker


def commit_watching(store: Any, peer: RawWorker, wait_ms: int, commits: int = 1) -> list[int]:
    """Make the store's next ``commits`` commits first wait (the reactor stopped, libzmq's
    I/O threads running) up to ``wait_ms`` for a message at ``peer``: what the poll found,
    per commit."""
    commit = store.commit
    found: list[int] = []

    def watched() -> None:
        if len(found) + 1 == commits:
            store.commit = commit
        found.append(peer.peer.socket.socket.poll(wait_ms))
        commit()

    store.commit = watched
    return found


@pytest_twisted.inlineCallbacks
def test_the_next_stored_request_reaches_the_worker_before_the_commit_of_its_reply(
    tmp_path: Path, cleanup: list[Any]
) -> Any:
    """A worker's REPLY and READY in one batch: the next request, stored by an earlier
    commit, goes to the worker before the commit that forgets the replied one (its slot does
    not wait for the store); the client hears the result after that commit."""
    broker = broker_in(tmp_path, cleanup)
    client = RawClient(broker.endpoints["client"])
    cleanup.append(client)
    msgids = [client.request("default", n, b"reply-requested,guarantee") for n in range(2)]
    yield wait_until(lambda: broker.store.count() == 2, what="both requests stored")
    worker = RawWorker(broker.endpoints["worker"])
    cleanup.append(worker)
    yield wait_until(worker.acked, what="ACK")
    worker.ready()
    yield wait_until(lambda: len(worker.requests()) == 1, what="the first request")
    first = worker.requests()[0]
    assert first[3] == msgids[0]
    polled = commit_watching(broker.store, worker, 10_000)
    # The batch as the worker port hands it over (ROUTER identity first).
    broker._on_workers(
        [
            [worker.identity, *codec.reply(b'{"value": 0}', first[3])],
            [worker.identity, *codec.ready()],
        ]
    )
    assert polled == [zmq.POLLIN]  # the next request was there while the commit waited
    worker.peer.socket.read_soon()  # the poll took its descriptor's signal
    yield wait_until(lambda: len(worker.requests()) == 2, what="the second request read")
    assert worker.requests()[1][3] == msgids[1]
    yield wait_until(lambda: client.results(msgids[0]), what="the first result")
    assert client.results(msgids[0]) == [{"value": 0}]
    assert broker.store.count() == 1


@pytest_twisted.inlineCallbacks
def test_a_retried_request_waits_for_the_commit_of_its_retry(
    tmp_path: Path, cleanup: list[Any]
) -> Any:
    """A worker leaves with a guaranteed request: its retry (one fewer left, a row the
    commit writes) goes to the next worker only after that commit."""
    # No heartbeat round while the test runs: a HEARTBEAT on its way is what the poll finds.
    broker = broker_in(tmp_path, cleanup, heartbeat_interval=60.0)
    leaving = yield ready_worker(broker, cleanup)
    client = RawClient(broker.endpoints["client"])
    cleanup.append(client)
    msgid = client.request("default", 1, b"reply-requested,guarantee")
    yield wait_until(lambda: leaving.requests(), what="the request at the first worker")
    spare = yield ready_worker(broker, cleanup)
    polled = commit_watching(broker.store, spare, 500)
    broker._on_workers([[leaving.identity, *codec.kbye()]])
    assert polled == [0]  # nothing had come while the commit waited
    assert broker.broker.retried == 1
    spare.peer.socket.read_soon()
    yield wait_until(lambda: spare.requests(), what="the retried request")
    assert spare.requests()[0][3] == msgid


@pytest_twisted.inlineCallbacks
def test_a_schedules_run_waits_for_the_commit_of_its_schedule(
    tmp_path: Path, cleanup: list[Any]
) -> Any:
    """A schedule's run (not guaranteed: never a row of its own) goes to a worker only after
    the commit that keeps its schedule's new state: sent before it, then a crash, the
    schedule would fire it again."""
    # No heartbeat round while the test runs: a HEARTBEAT on its way is what the poll finds.
    broker = broker_in(tmp_path, cleanup, heartbeat_interval=60.0)
    worker = yield ready_worker(broker, cleanup)
    client = RawClient(broker.endpoints["client"])
    cleanup.append(client)
    # The SCHEDULE's commit, then the first run's (an interval schedule runs at once).
    polled = commit_watching(broker.store, worker, 500, commits=2)
    client.peer.send(
        codec.message(codec.SCHEDULE, b"default", b"", b"60", json.dumps(["run", {}]).encode(), b"")
    )
    yield wait_until(lambda: len(polled) == 2, what="the schedule's and its run's commits")
    assert polled == [0, 0]  # nothing had come while either commit waited
    worker.peer.socket.read_soon()
    yield wait_until(lambda: worker.requests(), what="the schedule's run")
    assert broker.broker.schedules_fired == 1


@pytest_twisted.inlineCallbacks
def test_status_and_schedule_forwarding(tmp_path: Path, cleanup: list[Any]) -> Any:
    broker = broker_in(tmp_path, cleanup, scheduler="external")
    admin = RawPeer.dealer(broker.endpoints["admin"])
    client = RawClient(broker.endpoints["client"])
    cleanup += [admin, client]
    schedule = codec.message(
        codec.SCHEDULE, b"default", b"guarantee", b"60", json.dumps(["run", {}]).encode(), b""
    )
    client.peer.send(schedule)
    yield wait_until(lambda: client.results(schedule[3]), what="the no-scheduler error")
    assert client.results(schedule[3])[0]["error"] == "no-scheduler"
    # libzmq's default binary identity: the original router crashed on it.
    scheduler = RawPeer.dealer(broker.endpoints["client"])
    cleanup.append(scheduler)
    scheduler.send(codec.inform([], codec.SCHEDULER))
    yield wait_until(lambda: any(m[2] == codec.ACK for m in scheduler.messages), what="ACK")
    client.peer.send(schedule)
    unschedule = [*schedule[:2], codec.UNSCHEDULE, codec.new_msgid(), *schedule[4:]]
    admin.send(unschedule)

    def forwarded() -> list[list[bytes]]:
        return [m for m in scheduler.messages if m[2] in (codec.SCHEDULE, codec.UNSCHEDULE)]

    yield wait_until(lambda: len(forwarded()) == 2, what="both forwarded")
    assert sorted(forwarded()) == sorted([schedule, unschedule])
    status_request = codec.message(codec.STATUS)
    admin.send(status_request)
    yield wait_until(lambda: any(m[2] == codec.REPLY for m in admin.messages), what="STATUS")
    reply = next(m for m in admin.messages if m[2] == codec.REPLY)
    assert reply[5] == status_request[3]
    status = json.loads(reply[4])
    assert len(status["schedulers"]) == 1 and status["schedulers"][0].startswith("0x00")
    assert status["counters"]["schedules_forwarded"] == 2
    assert set(status) >= {"queues", "workers", "in_flight", "counters"}


def sleep_then(params: list[Any]) -> Any:
    time.sleep(params[0])
    return params[1]


@pytest_twisted.inlineCallbacks
def test_a_worker_that_heartbeats_quicker_than_its_broker_learns_its_period_and_stays(
    tmp_path: Path, cleanup: list[Any]
) -> Any:
    """By its own settings the worker takes a broker silent for 0.3 s as gone, and its broker
    heartbeats every second: it must not leave (and lose its job) between two of them."""
    broker = broker_in(tmp_path, cleanup, heartbeat_interval=1.0, heartbeat_liveness=3)
    worker = worker_for(
        broker, cleanup, heartbeat_interval=0.1, heartbeat_liveness=3,
        handlers={"sleep_then": sleep_then},
    )  # fmt: skip
    yield wait_until(
        lambda: worker.broker_beats.period is not None, timeout=30, what="the broker's period"
    )
    # By the broker's clock, between two of its heartbeat rounds (the HEARTBEAT that greets
    # a new connection does not count): about its interval, far from the worker's own.
    assert 0.5 < worker.broker_beats.period < 1.5
    assert worker.silence_bound() == pytest.approx(3 * worker.broker_beats.period)
    informs, lost = worker.informs, broker.broker.workers_lost
    client = client_for(broker, cleanup)
    # Three of the broker's heartbeat periods, ten times the worker's own silence bound.
    assert (yield client.submit("default", ["sleep_then", [3.0, "done"]])) == "done"
    assert worker.informs == informs  # it never connected again
    assert broker.broker.workers_lost == lost


@pytest_twisted.inlineCallbacks
def test_a_stall_of_the_process_is_not_taken_for_silence(tmp_path: Path, cleanup: list[Any]) -> Any:
    """Broker and worker in one process at 0.1 s x 3: stalled for 1 s (SIGSTOP, a VM's pause,
    a starved machine), their first rounds after it come late with the other's heartbeats
    waiting unread. The broker forgets no one, the worker does not connect again, and a job
    running through the stalls comes back."""
    broker = broker_in(tmp_path, cleanup, heartbeat_interval=0.1, heartbeat_liveness=3)
    worker = worker_for(
        broker, cleanup, heartbeat_interval=0.1, heartbeat_liveness=3,
        handlers={"sleep_then": sleep_then},
    )  # fmt: skip
    yield wait_until(lambda: worker.heartbeats_received >= 3, what="heartbeats")
    informs = worker.informs
    client = client_for(broker, cleanup)
    job = client.submit("default", ["sleep_then", [2.0, "done"]])  # on a pool thread
    for stall in range(1, 4):
        beats = worker.heartbeats_received + 3
        reactor.callLater(0, time.sleep, 1.0)
        yield wait_until(
            lambda n=beats: worker.heartbeats_received >= n, what="heartbeats after the stall"
        )
        # Each side's timer saw a late wake (and held it back) at every stall.
        assert broker.broker.wakes.held >= stall and worker.wakes.held >= stall
    assert (yield job) == "done"
    assert broker.broker.workers_lost == 0 and worker.informs == informs


@pytest_twisted.inlineCallbacks
def test_a_stall_does_not_time_out_a_request_whose_reply_waited(
    tmp_path: Path, cleanup: list[Any]
) -> Any:
    """A request with ``timeout:1`` whose job stalls the process as it starts (1.5 s: SIGSTOP,
    a VM's pause) and returns after 0.3 s: when the process runs again its reply waits,
    and the broker's look at the timeouts comes first (the reactor runs timers before it
    reads). That late look gives up on nothing: the client has the value, nothing timed out."""
    broker = broker_in(tmp_path, cleanup)

    def stall_then(params: list[Any]) -> Any:
        reactor.callFromThread(time.sleep, 1.5)  # the process stops as the job starts
        return sleep_then(params)

    worker = worker_for(broker, cleanup, handlers={"stall_then": stall_then})
    # Registered, and the timeouts looked at once at least (a wake is late against the one
    # before it: the first has none).
    yield wait_until(lambda: worker.registered and broker.broker.expiry_wakes.woken >= 1,
                     what="the worker's ACK")  # fmt: skip
    client = client_for(broker, cleanup)
    value = yield client.submit("default", ["stall_then", [0.3, "done"]], timeout=1.0)
    assert value == "done"
    assert broker.broker.timed_out == 0 and broker.broker.late_replies == 0
    assert broker.status()["counters"]["late_timeout_checks_held"] >= 1


@pytest_twisted.inlineCallbacks
def test_heartbeats_both_ways(tmp_path: Path, cleanup: list[Any]) -> Any:
    broker = broker_in(tmp_path, cleanup, heartbeat_interval=0.1, heartbeat_liveness=3)
    silent = RawWorker(broker.endpoints["worker"], identity=b"silent")
    talker = worker_for(broker, cleanup, heartbeat_interval=0.1)
    cleanup.append(silent)
    yield wait_until(lambda: talker.registered and silent.acked(), what="both ACKed")
    yield wait_until(lambda: len(silent.commands(codec.HEARTBEAT)) >= 3, what="heartbeats")
    beat = silent.commands(codec.HEARTBEAT)[-1]
    assert float(beat[4]) > 1e9  # the sender's time.time(), as the original sends it
    yield wait_until(lambda: broker.broker.workers_lost == 1, what="the silent one forgotten")
    assert [w["id"] for w in broker.status()["workers"]] != ["silent"]
    assert len(broker.status()["workers"]) == 1
    count = talker.heartbeats_received
    yield wait_until(lambda: talker.heartbeats_received > count + 3, what="more heartbeats")
    assert broker.broker.workers_lost == 1  # the worker that heartbeats stays
    # A forgotten worker's messages are dropped, and it is told KBYE.
    silent.ready()
    yield wait_until(lambda: silent.commands(codec.KBYE), what="KBYE")
    assert broker.broker.drops.counts["not-informed"] == 1


@pytest_twisted.inlineCallbacks
def test_kbye_on_stop_and_the_worker_informs_the_next_broker(
    tmp_path: Path, cleanup: list[Any]
) -> Any:
    first = start_broker(tmp_path / "emqp")
    watcher = RawWorker(first.endpoints["worker"])
    cleanup.append(watcher)
    worker = EmqpWorker(first.endpoints["worker"], handlers={"add": add})
    worker.startService()
    cleanup.append(worker)
    yield wait_until(lambda: worker.registered and watcher.acked())
    yield first.stopService()
    yield wait_until(lambda: watcher.commands(codec.KBYE), what="the broker's KBYE")
    yield wait_until(lambda: worker.informs == 2, what="the worker starting over")
    ports = {name: int(address.rsplit(":", 1)[1]) for name, address in first.endpoints.items()}
    second = start_broker(
        tmp_path / "emqp",
        worker_port=ports["worker"],
        client_port=ports["client"],
        admin_port=ports["admin"],
    )
    cleanup.append(second)
    client = client_for(second, cleanup)
    value = yield client.submit("default", ["add", {"a": 20, "b": 22}])
    assert value == 42
    assert second.broker.drops.total == 0


@pytest_twisted.inlineCallbacks
def test_job_life_is_published_on_the_bus(tmp_path: Path, cleanup: list[Any]) -> Any:
    bus = start_bus(tmp_path / "bus")
    cleanup.append(bus)
    subscriber = RawPeer.sub(bus.endpoints["publisher"])
    cleanup.append(subscriber)
    yield wait_until(lambda: subscriber.messages, what="the bus heartbeat")
    broker = broker_in(tmp_path, cleanup, activity=bus.activity_sink("emqp"))
    worker = worker_for(broker, cleanup, slots=1)
    client = client_for(broker, cleanup)
    yield wait_until(lambda: worker.registered)
    assert (yield client.submit("default", ["add", {"a": 1, "b": 2}])) == 3
    with pytest.raises(JobFailed):
        yield client.submit("default", ["fail", {}])

    def topics() -> list[bytes]:
        return [m[0] for m in subscriber.messages if m[0].startswith(b"/emqp/")]

    yield wait_until(lambda: topics().count(b"/emqp/job/replied/") == 2, what="activity")
    assert topics()[:4] == [
        b"/emqp/worker/joined/",
        b"/emqp/job/queued/",
        b"/emqp/job/dispatched/",
        b"/emqp/job/replied/",
    ]
    replied = next(m for m in subscriber.messages if m[0] == b"/emqp/job/replied/")
    value = msgpack.unpackb(replied[-1])
    assert value["queue"] == "default" and value["worker"] and value["seconds"] >= 0
    # Stored in the bus's own log too, so a snapshot (and the Spark bridge) sees them.
    assert any(e.topic == b"/emqp/job/queued/" for e in bus.store.read(0))


@pytest_twisted.inlineCallbacks
def test_process_pool_and_run_bodies(tmp_path: Path, cleanup: list[Any]) -> Any:
    broker = broker_in(tmp_path, cleanup)
    worker = worker_for(broker, cleanup, slots=2, pool="process")
    client = client_for(broker, cleanup)
    yield wait_until(lambda: worker.registered)
    value = yield client.submit("default", ["add", {"a": 4, "b": 5}])
    assert value == 9
    body = ["run", {"path": "os.path", "callable": "join", "args": ["a", "b"]}]
    assert (yield client.submit("default", body)) == "a/b"
    body = ["run", {"path": "collections:Counter", "callable": "most_common",
                    "class_args": ["abracadabra"], "args": [1]}]  # fmt: skip
    assert (yield client.submit("default", body)) == [["a", 5]]
    body = ["run", {"path": "os.path:join", "args": ["x", "y"]}]
    assert (yield client.submit("default", body)) == "x/y"


def test_a_busy_port_names_its_option(tmp_path: Path) -> None:
    from bus.errors import StartupError

    context = zmq.Context.instance()
    taken = context.socket(zmq.ROUTER)
    port = taken.bind_to_random_port("tcp://127.0.0.1")
    try:
        with pytest.raises(StartupError) as error:
            start_broker(tmp_path, client_port=port)
        assert error.value.option == "client-port"
        assert "in use" in error.value.cause
    finally:
        taken.close(0)


def client_gone(broker: Any, client: RawClient) -> Any:
    """Close ``client`` and wait until the broker saw it go: an answer sent to it before
    that goes into the pipe of a connection being torn down, lost uncounted (CI, under load:
    the answer to a client closed just before was never dropped as gone)."""
    connected = broker.connections()["client"]
    client.close()
    return wait_until(
        lambda: broker.connections()["client"] < connected, what="the broker to see it gone"
    )


@pytest_twisted.inlineCallbacks
def test_an_answer_waits_for_its_client_to_come_back(tmp_path: Path, cleanup: list[Any]) -> Any:
    broker = broker_in(tmp_path, cleanup, reply_linger=1.0)
    worker = RawWorker(broker.endpoints["worker"])
    cleanup.append(worker)
    yield wait_until(worker.acked, what="ACK")
    worker.ready(2)
    first = RawClient(broker.endpoints["client"], identity=b"comes-back")
    msgid = first.request("default", 1)
    yield wait_until(lambda: first.acks(msgid), what="dispatched")
    yield client_gone(broker, first)  # gone before its result
    # The dispatch acknowledgement can reach the client before the request reaches the worker.
    yield wait_until(worker.requests, what="the request at the worker")
    worker.reply(worker.requests()[0], "late but delivered")
    yield wait_until(lambda: broker.status()["answers_held"] == 1, what="the answer held")
    again = RawClient(broker.endpoints["client"], identity=b"comes-back")
    cleanup.append(again)
    yield wait_until(lambda: again.results(msgid), what="the held answer")
    assert again.results(msgid) == [{"value": "late but delivered"}]
    # A client that never comes back: its answer is dropped after --reply-linger, counted.
    gone = RawClient(broker.endpoints["client"], identity=b"never-again")
    other = gone.request("default", 2)
    yield wait_until(lambda: gone.acks(other), what="dispatched")
    yield client_gone(broker, gone)
    # As above: its acknowledgement can come before the request reaches the worker.
    yield wait_until(lambda: len(worker.requests()) == 2, what="the second request at the worker")
    worker.reply(worker.requests()[1], "nobody listens")
    yield wait_until(lambda: broker.answers.dropped["gone"] == 1, what="the answer dropped")
    assert broker.status()["answers_held"] == 0


@pytest_twisted.inlineCallbacks
def test_a_worker_whose_inform_was_lost_informs_again_at_the_kbye(cleanup: list[Any]) -> Any:
    """Its INFORM went to a broker that was stopping; the next one knows nothing of it and
    says KBYE once (to its heartbeat): it must INFORM again then, not wait for silence."""
    from bus.transport.zmqsocket import SocketFactory, SocketOptions

    factory = SocketFactory(reactor)
    cleanup.append(SimpleNamespace(close=factory.shutdown))
    heard: list[list[bytes]] = []

    def broker_that_lost_the_inform(batch: list[list[bytes]]) -> None:
        for frames in batch:
            heard.append(frames)
            if frames[3] == codec.HEARTBEAT:
                router.send_frames([frames[0], *codec.kbye()])

    router = factory.socket(
        zmq.ROUTER, broker_that_lost_the_inform, SocketOptions(linger_ms=0, router_mandatory=True)
    )
    endpoint = router.bind("tcp://127.0.0.1:*")
    worker = EmqpWorker(endpoint, heartbeat_interval=0.2, heartbeat_liveness=50)
    worker.startService()
    cleanup.append(worker)
    informs = lambda: [f for f in heard if f[3] == codec.INFORM]  # noqa: E731
    yield wait_until(lambda: len(informs()) >= 2, timeout=5, what="a second INFORM")
    assert len({f[0] for f in informs()}) >= 2  # from a fresh socket (a new identity)
    assert not worker.registered


@pytest_twisted.inlineCallbacks
def test_the_job_store_wal_is_bounded_and_reported(tmp_path: Path, cleanup: list[Any]) -> Any:
    """eMQP's store shares the Event BUS's checkpoints, and with them the WAL's bound: its
    status and /metrics say the size, the bound and what the checkpoints did."""
    from bus.util.sqlitewal import DEFAULT_WAL_LIMIT

    broker = broker_in(tmp_path, cleanup)
    yield wait_until(
        lambda: broker.status()["wal_checkpoints"] > 0, timeout=60, what="a checkpoint"
    )
    status = broker.status()
    assert status["wal_limit"] == DEFAULT_WAL_LIMIT
    assert status["wal_bytes"] == broker.store.wal_status().wal_bytes
    assert status["wal_restarts"] == 0  # a WAL this small is never restarted
    families = {family.name: family for family in broker.metrics()}
    assert families["emqp_wal_bytes"].samples[0].value == broker.store.wal_status().wal_bytes
    assert families["emqp_wal_checkpoints"].samples[0].value >= 1


#: The job store as brokers before the batches wrote it: a row per request, keyed by position.
_JOBS_A_ROW_EACH = """
CREATE TABLE jobs (
    msgid BLOB NOT NULL, position INTEGER PRIMARY KEY, client BLOB NOT NULL, queue BLOB NOT NULL,
    headers BLOB NOT NULL, body BLOB NOT NULL, received REAL NOT NULL, attempts INTEGER NOT NULL,
    retries_left INTEGER NOT NULL
);
"""


@pytest_twisted.inlineCallbacks
def test_a_store_of_a_row_per_request_runs_in_order_and_replied_ones_stay_gone(
    tmp_path: Path, cleanup: list[Any]
) -> Any:
    """A broker started on a store written before batches moves its requests over and runs
    them in their order; once replied, a restart on the same store runs none again."""
    import sqlite3

    data = tmp_path / "emqp"
    data.mkdir()
    db = sqlite3.connect(data / "emqp.sqlite3")
    db.executescript(_JOBS_A_ROW_EACH)
    bodies = [json.dumps(["add", {"a": n, "b": 0}]).encode() for n in range(5)]
    db.executemany(
        "INSERT INTO jobs VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
        [(b"old-%d" % n, 10 - n, b"", b"default", b"guarantee", bodies[n], 1.0, 0, 3)
         for n in range(5)],
    )  # fmt: skip
    db.commit()
    db.close()
    seen: list[int] = []

    def record(params: dict[str, int]) -> int:
        seen.append(params["a"])
        return params["a"]

    broker = start_broker(data)
    try:
        assert broker.broker.restored == 5 and broker.store.count() == 5
        worker = worker_for(broker, cleanup, slots=1, handlers={"add": record})
        yield wait_until(lambda: broker.store.count() == 0, what="every request run and removed")
        assert seen == [4, 3, 2, 1, 0]  # by position
        yield worker.stopService()
    finally:
        yield broker.stopService()
    again = start_broker(data)
    try:
        assert again.broker.restored == 0 and again.store.count() == 0
    finally:
        yield again.stopService()


@pytest_twisted.inlineCallbacks
def test_status_json_is_rewritten_off_the_reactor_and_written_last_at_the_stop(
    tmp_path: Path, cleanup: list[Any], monkeypatch: pytest.MonkeyPatch
) -> Any:
    from bus.emqp import server

    writers: list[bool] = []
    write = server.write_status_text

    def recorded(path: Path, text: str) -> None:
        writers.append(threading.current_thread() is threading.main_thread())
        write(path, text)

    monkeypatch.setattr(server, "write_status_text", recorded)
    broker = broker_in(tmp_path, cleanup, stats_interval=0.05)
    path = tmp_path / "emqp" / "status.json"
    # Written at the start before startService returned, on the reactor's thread.
    assert json.loads(path.read_text())["stored"] == 0 and writers == [True]
    worker = worker_for(broker, cleanup)
    client = client_for(broker, cleanup)
    yield wait_until(lambda: worker.registered, what="the worker's ACK")
    result = yield client.submit("default", ["add", {"a": 1, "b": 2}], guarantee=True)
    assert result == 3

    def replied() -> bool:
        return json.loads(path.read_text())["counters"]["replied"] == 1

    yield wait_until(replied, what="the reply in status.json")
    assert False in writers  # the periodic ones on the status thread
    yield broker.stopService()
    # The stop's status is the last one written, after any the thread was writing.
    assert writers[-1] is True
    final = json.loads(path.read_text())
    assert final["stored"] is None and final["counters"] == broker.broker.counters()
    assert final.keys() == broker.status().keys()
    assert final["config"]["stats_interval"] == 0.05
