"""The broker's state machine in front of a JetStream stream (--store jetstream), with a
fake clock and no sockets: a guaranteed request goes to the stream and is told to nobody
before it is stored; what the stream delivers is dispatched to this broker's workers and
acknowledged after the reply, with answers routed through the client's own broker; a
delivery past the retries is terminated; a queue whose workers leave gives its requests
back; a request delivered before its append's acknowledgement is run, never dropped."""

from __future__ import annotations

import json
from typing import Any

from twisted.internet.task import Clock
from twisted.logger import Logger

from bus.emqp import codec, jobstream
from bus.emqp.core import Broker, BrokerSettings

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
