"""The broker's state machine in front of a JetStream stream (--store jetstream), with a
fake clock and no sockets: a guaranteed request goes to the stream and is told to nobody
before it is stored; what the stream delivers is dispatched to this broker's workers and
acknowledged after the reply, with answers routed through the client's own broker; a
delivery past the retries is terminated; a queue whose workers leave gives its requests
back; a request delivered before its append's acknowledgement is run, never dropped."""

from __future__ import annotations

import json
from functools import partial
from typing import Any

from twisted.internet.task import Clock
from twisted.logger import Logger, capturedLogs, formatEvent

from bus.emqp import codec, jobstream
from bus.emqp.core import Broker, BrokerSettings
from bus.emqp.schedule_gate import run_msgid
from bus.emqp.schedules import ScheduleRow, ScheduleSpec

log = Logger(namespace="test.emqp.stream")


def make(broker_id: bytes = b"A") -> tuple[Broker, Clock]:
    clock = Clock()
    clock.advance(1_000)
    return Broker(BrokerSettings(), clock.seconds, log, broker_id=broker_id, streamed=True), clock


def request(
    broker: Broker, client: bytes = b"client", headers: bytes = b"guarantee,reply-requested"
) -> bytes:
    frames = codec.request("q", json.dumps(1).encode(), headers)
    broker.on_client_message(client, frames)
    return frames[3]


def inform(broker: Broker, worker: bytes, slots: int) -> None:
    broker.on_worker_message(worker, codec.inform([(10, "q")], "worker"))
    for _ in range(slots):
        broker.on_worker_message(worker, codec.ready())
    broker.to_workers.clear()


def stored(msgid: bytes, origin: bytes = b"A", retries: int = 2) -> jobstream.StreamedJob:
    return jobstream.StreamedJob(
        origin, b"client", msgid, b"q", b"guarantee,reply-requested", b"1", 5.0, retries
    )


def commands(broker: Broker) -> list[tuple[str, Any]]:
    out, broker.to_stream = broker.to_stream, []
    return out


def schedule_run(
    spec: ScheduleSpec, created: float, number: int, client: bytes = b""
) -> jobstream.StreamedJob:
    """Run ``number`` of the schedule ``spec`` made at ``created``, as the stream delivers it."""
    msgid = run_msgid(spec.id, created, number)
    return jobstream.StreamedJob(b"A", client, msgid, b"q", b"", spec.body, 0.0, 5)


def dispatched(broker: Broker) -> list[bytes]:
    """The msgids of the requests sent to workers since the last call."""
    out = [frames[4] for frames in broker.to_workers]
    broker.to_workers.clear()
    return out


def test_a_guaranteed_request_is_appended_and_told_to_nobody_until_stored() -> None:
    broker, _ = make()
    inform(broker, b"w", 1)
    msgid = request(broker)
    ((what, job),) = commands(broker)
    assert what == "append" and job.msgid == msgid
    assert broker.to_workers == [] and broker.to_clients == []
    body = broker.streamed_job(job)
    assert body.origin == b"A" and body.retries == BrokerSettings().guarantee_retries
    assert jobstream.decode(jobstream.encode(body)) == body
    broker.stream_appended(msgid)
    # Stored: the stream's now, run where it is pulled (here too, once delivered).
    assert broker.to_workers == [] and msgid not in broker.jobs
    assert broker.wanted() == {b"q": 1}


def test_a_delivery_runs_and_is_acknowledged_after_the_reply_through_its_broker() -> None:
    broker, _ = make(b"B")
    inform(broker, b"w", 1)
    broker.on_stream_job(stored(b"m1", origin=b"A"), b"$JS.ACK.h1", 1)
    (sent,) = broker.to_workers
    assert sent[0] == b"w" and sent[4] == b"m1"
    assert broker.to_clients == []  # the client is A's
    ((origin, note),) = broker.to_brokers
    assert origin == b"A" and note[0] == b"client" and note[-1] == b"m1"
    assert broker.held_handles() == [b"$JS.ACK.h1"]
    broker.to_brokers.clear()
    broker.on_worker_message(b"w", codec.reply(json.dumps({"value": 3}).encode(), b"m1"))
    ((origin, answer),) = broker.to_brokers
    assert origin == b"A" and json.loads(answer[5]) == {"value": 3}
    assert commands(broker) == [("ack", b"$JS.ACK.h1")]
    assert broker.held_handles() == []


def test_a_delivery_past_its_retries_is_terminated_and_its_client_told() -> None:
    broker, _ = make(b"B")
    inform(broker, b"w", 1)
    broker.on_stream_job(stored(b"m1", origin=b"A", retries=2), b"$JS.ACK.h", 4)
    assert commands(broker) == [("term", b"$JS.ACK.h")]
    ((origin, error),) = broker.to_brokers
    assert origin == b"A" and json.loads(error[5])["error"] == "retries-exhausted"
    assert broker.to_workers == []


def test_the_last_worker_of_a_queue_leaving_gives_its_requests_back() -> None:
    broker, _ = make()
    inform(broker, b"w", 1)
    broker.on_stream_job(stored(b"m1"), b"h1", 1)  # dispatched to w
    broker.on_stream_job(stored(b"m2"), b"h2", 1)  # waits: w has no free slot
    broker.on_worker_message(b"w", codec.kbye())
    # m1 was running on w: retried, then given back with m2 since nobody here serves q.
    assert sorted(commands(broker)) == [("nak", b"h1"), ("nak", b"h2")]
    assert broker.jobs == {} and b"q" not in broker.queues
    # A delivery for a queue nobody here serves any more goes straight back too.
    broker.on_stream_job(stored(b"m3"), b"h3", 1)
    assert commands(broker) == [("nak", b"h3")]


def test_its_own_append_delivered_before_the_acknowledgement_is_run() -> None:
    broker, _ = make()
    inform(broker, b"w", 1)
    msgid = request(broker)
    commands(broker)
    broker.on_stream_job(stored(msgid), b"h1", 1)
    assert commands(broker) == []  # neither acknowledged nor given back: run
    (sent,) = broker.to_workers
    assert sent[4] == msgid
    broker.stream_appended(msgid)  # the late acknowledgement changes nothing
    assert broker.held_handles() == [b"h1"]


def test_a_request_of_the_same_msgid_running_here_makes_a_delivery_wait() -> None:
    broker, _ = make()
    inform(broker, b"w", 1)
    request(broker, headers=b"reply-requested")  # not kept in the stream
    msgid = next(iter(broker.jobs))
    broker.on_stream_job(stored(msgid), b"h1", 1)
    assert commands(broker) == [("later", b"h1")]


def test_a_request_not_kept_goes_to_a_broker_with_workers_when_none_is_here() -> None:
    a, _ = make(b"A")
    msgid = request(a, headers=b"reply-requested")
    ((what, job),) = commands(a)
    assert what == "forward" and job.msgid == msgid
    offered = a.streamed_job(job)
    assert offered.origin == b"A"
    b, _ = make(b"B")
    assert b.on_offered(offered) is False  # b serves no queue q yet
    inform(b, b"w", 1)
    assert b.served_queues() == {b"q"}
    assert b.on_offered(offered) is True
    ((sent),) = b.to_workers
    assert sent[4] == msgid
    a.forward_taken(msgid)
    assert msgid not in a.jobs
    b.on_worker_message(b"w", codec.reply(json.dumps({"value": 5}).encode(), msgid))
    assert b.to_stream == []  # nothing to acknowledge: it was never in the stream
    answers = [m for origin, m in b.to_brokers if origin == b"A" and len(m) == 7]
    (answer,) = answers
    a.on_forwarded(answer)
    assert json.loads(a.to_clients[-1][5]) == {"value": 5}


def test_an_offer_nobody_takes_waits_and_is_offered_again_at_the_heartbeat() -> None:
    a, _ = make(b"A")
    msgid = request(a, headers=b"reply-requested")
    commands(a)
    a.forward_refused(msgid)
    assert [j.msgid for j in a.queues[b"q"].waiting] == [msgid]
    a.heartbeat()
    assert [(w, j.msgid) for w, j in commands(a)] == [("forward", msgid)]
    # A worker joining here meanwhile takes it when the offer comes back refused.
    inform(a, b"w", 1)
    a.forward_refused(msgid)
    ((sent),) = a.to_workers
    assert sent[4] == msgid


def test_what_the_stream_keeps_never_goes_into_the_local_store(tmp_path: Any) -> None:
    from bus.emqp.store import JobStore

    store = JobStore(tmp_path)
    clock = Clock()
    broker = Broker(BrokerSettings(), clock.seconds, log, store, broker_id=b"A", streamed=True)
    try:
        inform(broker, b"w", 1)
        inform(broker, b"w2", 0)
        broker.on_stream_job(stored(b"m1"), b"h1", 1)
        broker.on_worker_message(b"w", codec.inform([(10, "q")], "worker"))  # lost, back
        assert store.dirty is False
        broker.on_worker_message(b"w2", codec.ready())
        broker.on_worker_message(b"w2", codec.reply(json.dumps({"value": 1}).encode(), b"m1"))
        # Retried here and replied: the stream hears of it, the local store never does (a
        # restart would run it again from there).
        assert ("ack", b"h1") in commands(broker)
        assert not store.dirty and store.count() == 0
    finally:
        store.close()


def test_a_schedule_run_the_stream_gives_out_past_its_time_is_acknowledged_unrun() -> None:
    """The stream holds a stored run back while its queue's consumer elects a leader, or a
    dead broker's until ack_wait, and gives it out with the runs stored meanwhile: only the
    latest runs, and only while the next is more than half an interval away; the others
    are missed runs, acknowledged without running. (The nemesis test found runs of a 2 s
    schedule 1-8 ms apart at the workers after such outages.)"""
    broker, clock = make(b"B")
    inform(broker, b"w", 4)
    spec = ScheduleSpec(b"q", b"", 2.0, None, b'["tick"]')
    created = clock.seconds() - 60
    stored_five = ScheduleRow(
        spec.id, b"q", b"", 2.0, None, spec.body, created, clock.seconds() + 2.0, 5, None
    )
    broker.on_schedule_change(spec.id, tuple(stored_five), False, 10)

    run, ran = partial(schedule_run, spec, created), partial(dispatched, broker)

    # Runs 3 and 4 come late, with 5 (stored, the next due in 2 s): 5 alone runs. Each
    # missed run is logged, with how long after its storing the stream gave it out.
    with capturedLogs() as events:
        broker.on_stream_job(run(3), b"h3", 2, stored_at=clock.seconds() - 3.25)
        broker.on_stream_job(run(4), b"h4", 1)
        broker.on_stream_job(run(5), b"h5", 1)
    assert commands(broker) == [("ack", b"h3"), ("ack", b"h4")]
    assert ran() == [run(5).msgid]
    assert broker.counters()["schedule_runs_missed"] == 2
    missed = [formatEvent(e) for e in events if "missed" in e.get("log_format", "")]
    assert len(missed) == 2
    assert run(3).msgid.decode() in missed[0] and "3.250s after" in missed[0]
    assert run(4).msgid.decode() in missed[1] and "unknown time" in missed[1]
    # Another broker fired run 6 (half an interval after 5 was stored at the earliest), and
    # the stream gave it out before the watch brought its row: it runs.
    clock.advance(1.0)
    broker.on_stream_job(run(6), b"h6", 1)
    assert commands(broker) == [] and ran() == [run(6).msgid]
    # Run 6 pending, then stored with run 7 due in 2 s: run 4 again is a missed run;
    # run 7, given out 1.5 s later (under half an interval before its next), too.
    broker.on_schedule_change(spec.id, tuple(stored_five._replace(runs=6)), True, 11)
    broker.on_stream_job(run(4), b"h4", 2)
    assert commands(broker) == [("ack", b"h4")]
    stored_seven = stored_five._replace(runs=7, next_due=clock.seconds() + 2.0)
    broker.on_schedule_change(spec.id, tuple(stored_seven), False, 12)
    clock.advance(1.5)
    broker.on_stream_job(run(7), b"h7", 1)
    assert commands(broker) == [("ack", b"h7")] and ran() == []
    assert broker.counters()["schedule_runs_missed"] == 4
    # A client's request of the same job, and a run of a schedule this broker does not
    # know (its count run out, its key gone), run.
    broker.on_stream_job(run(2, client=b"client"), b"hc", 1)
    broker.on_schedule_change(spec.id, None, False, 13)
    broker.on_stream_job(run(7), b"h7", 2)
    assert commands(broker) == [] and len(ran()) == 2


def test_a_run_right_after_another_one_let_run_here_is_missed_whatever_the_book_says() -> None:
    """A book behind the bucket (its watch on a nats-server just lost) says run 5 is
    pending: the stream gives out run 5, held back by an election, then run 6 5 ms later.
    Each alone is one the book cannot tell late; the second, less than half an interval
    after the first let run here, is missed (the nemesis test saw them run 5 ms apart)."""
    broker, clock = make(b"B")
    inform(broker, b"w", 4)
    spec = ScheduleSpec(b"q", b"", 2.0, None, b'["tick"]')
    created = clock.seconds() - 60
    pending_five = ScheduleRow(
        spec.id, b"q", b"", 2.0, None, spec.body, created, clock.seconds(), 5, None
    )
    broker.on_schedule_change(spec.id, tuple(pending_five), True, 10)

    run, ran = partial(schedule_run, spec, created), partial(dispatched, broker)

    broker.on_stream_job(run(5), b"h5", 2)
    assert commands(broker) == [] and ran() == [run(5).msgid]
    clock.advance(0.005)
    broker.on_stream_job(run(6), b"h6", 1)
    assert commands(broker) == [("ack", b"h6")] and ran() == []
    assert broker.counters()["schedule_runs_missed"] == 1
    # The same run given out again is not another run: the rule leaves it to the rest.
    broker.on_worker_message(b"w", codec.reply(json.dumps({"value": 1}).encode(), run(5).msgid))
    commands(broker)
    clock.advance(1.0)
    broker.on_stream_job(run(6), b"h6", 2)  # its acknowledgement lost; half an interval on: runs
    assert ran() == [run(6).msgid]
    broker.on_stream_job(run(5), b"h5", 3)  # older than one let run: missed
    assert commands(broker) == [("ack", b"h5")]
    assert broker.counters()["schedule_runs_missed"] == 2


def test_a_run_the_book_has_not_seen_stored_is_judged_by_when_the_stream_stored_it() -> None:
    """A book behind the bucket (its watch on a nats-server just lost) says run 5 is pending,
    or has not seen it fired: the stream gives it out held back by an election. The time it
    was stored (the delivery says) tells what the row the storing broker wrote says: the
    next run due at the first point of the rhythm half an interval after it, so a run given
    out within half an interval of that is missed, as it is by a book up to date (the
    nemesis test saw two runs 0.495 s apart after a nats-server was killed)."""
    broker, clock = make(b"B")
    inform(broker, b"w", 4)
    spec = ScheduleSpec(b"q", b"", 2.0, None, b'["tick"]')
    created = clock.seconds() - 60
    due = clock.seconds()
    pending_five = ScheduleRow(spec.id, b"q", b"", 2.0, None, spec.body, created, due, 5, None)
    broker.on_schedule_change(spec.id, tuple(pending_five), True, 10)

    run, ran = partial(schedule_run, spec, created), partial(dispatched, broker)

    # Stored 10 ms after its time, given out 1.3 s later: run 6 is due 0.7 s on.
    clock.advance(1.31)
    broker.on_stream_job(run(5), b"h5", 1, due + 0.01)
    assert commands(broker) == [("ack", b"h5")] and ran() == []
    # Without the stored time the book cannot tell: it runs (as before).
    broker.on_stream_job(run(5), b"h5", 2)
    assert commands(broker) == [] and ran() == [run(5).msgid]

    # The row says run 5 stored (run 6 due at due + 2): run 6 fired elsewhere, its row not
    # here yet, stored 0.4 s late and given out 0.5 s after that: runs (run 7 is due at
    # due + 4, more than half an interval away).
    broker, clock = make(b"C")
    inform(broker, b"w", 4)
    ran = partial(dispatched, broker)
    stored_five = pending_five._replace(next_due=due + 2.0)
    broker.on_schedule_change(spec.id, tuple(stored_five), False, 11)
    clock.advance(due + 2.9 - clock.seconds())
    broker.on_stream_job(run(6), b"h6", 1, due + 2.4)
    assert commands(broker) == [] and ran() == [run(6).msgid]
    # Given out 1.2 s after it was stored instead: missed.
    broker, clock = make(b"D")
    inform(broker, b"w", 4)
    ran = partial(dispatched, broker)
    broker.on_schedule_change(spec.id, tuple(stored_five), False, 11)
    clock.advance(due + 3.6 - clock.seconds())
    broker.on_stream_job(run(6), b"h6", 1, due + 2.4)
    assert commands(broker) == [("ack", b"h6")] and ran() == []
    assert broker.counters()["schedule_runs_missed"] == 1
