"""The broker's JetStream side (bus.emqp.jetstream) on a fake NATS client and a Clock, for two
faults tests/test_emqp_nemesis.py found.

Acknowledgements: one is a request the stream answers; one lost with its connection, or
unanswered, is said again until the stream confirms it or ``ack_wait`` has passed. Without
that, a request whose worker answered ran again at another broker whenever the broker's NATS
server died before the acknowledgement reached the stream.

The schedules' watch: each watch delivers to an inbox of its own and the one before is not
listened to any more; one retry waits at a time. Before, every watch made again (after a
reconnection, or a lost change) delivered to the same inbox as the ones before, which stayed:
their sequences interleaved, each looked like a lost change and made one more watch, until
JetStream's consumer limit refused them and the retries went on without end.

Pulls: a pull is forgotten and asked again once past its expiry without an end (a consumer
leader elected anew, or cut away, forgets its pulls and sends nothing); a pull ended by "no
responders" or "Consumer Deleted" has the consumer made again. Before, the broker waited for
an end that never came, and the queue was never pulled again (issue 49).

A schedule's run is appended apart from the requests: its answer goes to the schedule gate
(bus.emqp.schedule_gate), which alone appends it again; no answer of it, not even another
broker's append of the same run in process (JetStream's "duplicate message id is in
process"), pauses the client port. A schedule's compare-and-set tells a change that came
first (another broker's) from a failure."""

from __future__ import annotations

from typing import Any

from twisted.internet import defer
from twisted.internet.task import Clock

from bus.emqp import codec, jobstream, schedule_gate
from bus.emqp.config import JetStreamSettings
from bus.emqp.core import Job
from bus.emqp.jetstream import PULL_GRACE, JetStreamJobs
from bus.emqp.schedule_gate import PutRow
from bus.emqp.schedules import ScheduleRow
from bus.nats import jsapi, kv
from bus.nats.client import NotConnected
from bus.nats.codec import Msg

HANDLE = b"$JS.ACK.EMQP.q_default.1.7.7.1700000000000000000.0"


class FakeNats:
    """What JetStreamJobs asks of the client, recorded; answers given by the test."""

    def __init__(self) -> None:
        self.connected = True
        self.server = "nats://127.0.0.1:4222"
        self.servers = [self.server]
        self.server_url = self.server
        self.info: dict[str, Any] = {}
        self.disconnects = 0
        self.lame_duck_moves = 0
        self.max_payload = 1024 * 1024
        self.listeners: list[Any] = []
        self.requests: list[tuple[bytes, bytes, defer.Deferred[Any]]] = []
        self.subscriptions: dict[str, Any] = {}
        self.jetstream_asked: list[tuple[str, Any, defer.Deferred[Any]]] = []
        self.published: list[tuple[bytes, bytes, bytes]] = []

    def publish(
        self, subject: bytes, payload: bytes, headers: bytes = b"", reply: bytes = b""
    ) -> None:
        if not self.connected:
            raise NotConnected("down")
        self.published.append((subject, payload, reply))

    def pulls(self) -> list[bytes]:
        """The reply subjects of the pulls sent."""
        return [reply for subject, _, reply in self.published if b".MSG.NEXT." in subject]

    def subscribe(self, subject: str, callback: Any, queue: str = "") -> str:
        self.subscriptions[subject] = callback
        return subject

    def unsubscribe(self, subscription: str) -> None:
        del self.subscriptions[subscription]

    def jetstream(self, subject: str, body: Any = None, timeout: float = 5.0) -> Any:
        answer: defer.Deferred[Any] = defer.Deferred()
        self.jetstream_asked.append((subject, body, answer))
        return answer

    def request(
        self, subject: bytes, payload: bytes, headers: bytes = b"", timeout: float = 5.0
    ) -> defer.Deferred[Any]:
        if not self.connected:
            return defer.fail(NotConnected("down"))
        answer: defer.Deferred[Any] = defer.Deferred()
        self.requests.append((subject, payload, answer))
        return answer

    def lose(self) -> None:
        """The connection is lost: what waits for an answer fails, as NatsClient does."""
        self.connected = False
        waiting, self.requests = self.requests, []
        for _, _, answer in waiting:
            if not answer.called:
                answer.errback(NotConnected("lost"))

    def acks(self) -> list[bytes]:
        return [subject for subject, payload, _ in self.requests if payload == b"+ACK"]


def jobs(
    on_change: Any = lambda: None, on_appended: Any = lambda _: None, **more: Any
) -> tuple[JetStreamJobs, FakeNats, Clock]:
    clock = Clock()
    made = JetStreamJobs(
        clock,
        JetStreamSettings(servers=("nats://127.0.0.1:4222",), ack_wait=4.0, pull_expires=5.0),
        b"broker-a",
        on_job=lambda *_: None,
        on_answer=lambda _: None,
        on_appended=on_appended,
        on_change=on_change,
        held=lambda: [],
        **more,
    )
    fake = FakeNats()
    made.client = fake  # type: ignore[assignment]
    return made, fake, clock


def test_an_acknowledgement_is_done_once_the_stream_confirms_it() -> None:
    stream, fake, clock = jobs()
    stream.carry_out([("ack", HANDLE)], [], lambda _: None)  # type: ignore[arg-type, return-value]
    assert fake.acks() == [HANDLE]
    assert stream.status()["acks_confirming"] == 1
    fake.requests[0][2].callback(None)
    assert stream.status()["acks_confirming"] == 0
    clock.advance(10)
    assert fake.acks() == [HANDLE]  # said once
    assert stream.status()["acks_unconfirmed"] == 0


def test_an_acknowledgement_lost_with_the_connection_is_said_on_the_next() -> None:
    stream, fake, clock = jobs()
    stream.carry_out([("ack", HANDLE)], [], lambda _: None)  # type: ignore[arg-type, return-value]
    fake.lose()  # its NATS server died before answering
    clock.advance(1.0)
    assert fake.acks() == []  # nothing to say it on
    fake.connected = True
    stream._connection_changed(True)
    assert fake.acks() == [HANDLE]
    fake.requests[-1][2].callback(None)
    assert stream.status()["acks_confirming"] == 0
    assert stream.status()["acks_unconfirmed"] == 0


def test_an_unanswered_acknowledgement_is_said_again_until_ack_wait() -> None:
    stream, fake, clock = jobs()
    stream.carry_out([("ack", HANDLE)], [], lambda _: None)  # type: ignore[arg-type, return-value]
    said = 0
    while fake.requests:
        subject, _, answer = fake.requests.pop()
        assert subject == HANDLE
        said += 1
        answer.errback(TimeoutError("no answer"))  # e.g. no consumer leader for a while
        clock.advance(1.0)
    assert said >= 3
    # ack_wait passed: the stream has given the request to another broker; it is given up.
    assert stream.status()["acks_confirming"] == 0
    assert stream.status()["acks_unconfirmed"] == 1


def test_an_acknowledgement_older_than_ack_wait_is_not_said_on_a_new_connection() -> None:
    stream, fake, clock = jobs()
    stream.carry_out([("ack", HANDLE)], [], lambda _: None)  # type: ignore[arg-type, return-value]
    fake.lose()
    clock.advance(5.0)
    fake.connected = True
    stream._connection_changed(True)
    assert fake.acks() == []
    assert stream.status()["acks_unconfirmed"] == 1


def watches(fake: FakeNats) -> list[tuple[Any, defer.Deferred[Any]]]:
    return [(body, answer) for subject, body, answer in fake.jetstream_asked if "KV_" in subject]


def watch_of(stream: JetStreamJobs, fake: FakeNats, clock: Clock) -> kv.Watch:
    """The schedules' watch as the broker makes it once the bucket is there."""
    fake.reactor = clock  # type: ignore[attr-defined]
    stream._watch = kv.Watch(
        fake,  # type: ignore[arg-type]
        stream.bucket,
        "_EMQPKV.broker-a.1",
        stream._schedule_changed,
    )
    return stream._watch


def test_each_watch_of_the_schedules_has_an_inbox_of_its_own() -> None:
    stream, fake, clock = jobs()
    watch = watch_of(stream, fake, clock)
    watch.start()
    watch.start()  # e.g. after a reconnection
    (first, _), (second, _) = watches(fake)
    inboxes = [first["config"]["deliver_subject"], second["config"]["deliver_subject"]]
    assert inboxes[0] != inboxes[1]
    assert list(fake.subscriptions) == [inboxes[1]]  # the first is not listened to any more


def test_failed_watches_wait_for_one_retry_at_a_time() -> None:
    stream, fake, clock = jobs()
    watch = watch_of(stream, fake, clock)
    for _ in range(3):
        watch.start()
    for _, answer in watches(fake):
        answer.errback(TimeoutError("maximum consumers limit reached"))
    # Only the latest watch's failure asks again, once, a second later.
    clock.advance(1.0)
    assert len(watches(fake)) == 4
    watches(fake)[-1][1].errback(TimeoutError("again"))
    clock.advance(1.0)
    assert len(watches(fake)) == 5
    watches(fake)[-1][1].callback({"name": "w"})
    clock.advance(10.0)
    assert len(watches(fake)) == 5


def serving(changes: list[int]) -> tuple[JetStreamJobs, FakeNats, Clock]:
    """A broker whose queue ``default`` has its consumer, pulls enabled."""
    stream, fake, clock = jobs(on_change=lambda: changes.append(1))
    stream._pull_inbox = "_EMQP.broker-a.1"
    stream._consumers.add(b"default")
    return stream, fake, clock


def test_a_pull_the_server_never_ends_is_forgotten_and_asked_again() -> None:
    changes: list[int] = []
    stream, fake, clock = serving(changes)
    stream.pull({b"default": 4})
    assert len(fake.pulls()) == 1
    stream.pull({b"default": 4})
    assert len(fake.pulls()) == 1  # the open pull covers it
    clock.advance(5.0 + PULL_GRACE / 2)
    stream._watch_pulls()
    assert stream.status()["pulls_open"] == 1  # not past its expiry and grace yet
    clock.advance(PULL_GRACE)
    stream._watch_pulls()
    # Its consumer's leader changed and forgot it: no 408 will come.
    assert stream.status()["pulls_open"] == 0
    assert stream.status()["pulls_lapsed"] == 1
    assert changes, "the service was not told to pull again"
    stream.pull({b"default": 4})
    assert len(fake.pulls()) == 2


def test_a_pull_the_server_ends_is_not_counted_as_lapsed() -> None:
    changes: list[int] = []
    stream, fake, clock = serving(changes)
    stream.pull({b"default": 4})
    [reply] = fake.pulls()
    stream._delivered(Msg(reply, 1, b"", b"NATS/1.0 408 Request Timeout\r\n\r\n", b""))
    clock.advance(10.0)
    stream._watch_pulls()
    assert stream.status()["pulls_lapsed"] == 0
    assert stream.status()["consumers_lost"] == 0


def test_a_pull_no_consumer_answers_has_the_consumer_made_again() -> None:
    for headers in (b"NATS/1.0 503\r\n\r\n", b"NATS/1.0 409 Consumer Deleted\r\n\r\n"):
        changes: list[int] = []
        stream, fake, _ = serving(changes)
        stream.pull({b"default": 4})
        [reply] = fake.pulls()
        stream._delivered(Msg(reply, 1, b"", headers, b""))
        assert stream.status()["consumers_lost"] == 1
        stream.pull({b"default": 4})
        assert len(fake.pulls()) == 1  # no pull to a consumer that is not there
        [(subject, _, _)] = fake.requests
        assert subject.startswith(b"$JS.API.CONSUMER.CREATE.EMQP."), subject


def test_the_queues_pending_and_last_delivery_are_in_the_status() -> None:
    stream, fake, clock = serving([])
    stream.pull({b"default": 4})
    assert len(fake.pulls()) == 1
    clock.advance(2.0)
    handle = b"$JS.ACK.EMQP.q_default.1.7.7.1700000000000000000.39"
    stream._delivered(Msg(b"emqp.jobs.default", 1, handle, b"", b"not a request"))
    clock.advance(1.0)
    seen = stream.status()["queues"]["default"]
    assert seen == {"pending": 39, "ready_slots": 4, "pulls_open": 1, "last_delivery_s_ago": 1.0}


ERROR_10158 = (
    b'{"type":"io.nats.jetstream.api.v1.pub_ack_response","error":{"code":409,'
    b'"err_code":10158,"description":"duplicate message id is in process"}}'
)


def run_job(msgid: bytes) -> Job:
    return Job(msgid, b"", b"default", codec.NO_HEADERS, b'["tick"]', 0.0, 0, False)


def streamed(job: Job) -> jobstream.StreamedJob:
    return jobstream.StreamedJob(b"broker-a", b"", job.msgid, job.queue, b"", job.body, 0.0, 0)


def test_a_schedule_run_is_appended_alone_and_only_the_gate_appends_it_again() -> None:
    told: list[tuple[str, bytes, bool]] = []
    appended: list[bytes] = []
    stream, fake, clock = jobs(
        on_appended=appended.append, on_schedule_run=lambda *a: told.append(a)
    )
    answers = [
        b'{"stream":"EMQP","seq":7}',
        b'{"stream":"EMQP","seq":7,"duplicate": true}',  # another broker's, stored
        ERROR_10158,  # another broker's, being stored now
        b'{"error":{"code":503,"err_code":10077,"description":"no quorum"}}',
    ]
    for n, payload in enumerate(answers):
        stream.carry_out([("schedule-run", ("s1", run_job(b"run-%d" % n)))], [], streamed)
        fake.requests[-1][2].callback(Msg(b"_INBOX.x", 1, b"", b"", payload))
    stream.carry_out([("schedule-run", ("s1", run_job(b"run-4")))], [], streamed)
    fake.requests[-1][2].errback(TimeoutError("no answer"))
    assert told == [
        ("s1", b"run-0", True),
        ("s1", b"run-1", True),
        ("s1", b"run-2", False),
        ("s1", b"run-3", False),
        ("s1", b"run-4", False),
    ]
    assert appended == []  # not a request of this broker's clients
    clock.advance(10)
    assert len(fake.requests) == 5  # never sent again here
    status = stream.status()
    assert (status["schedule_runs_raced"], status["schedule_runs_refused"]) == (1, 2)
    assert stream.refusing is False and status["refusals"] == 0  # the client port goes on


def test_a_schedule_compare_and_set_tells_a_change_first_from_a_failure() -> None:
    told: list[tuple[str, int, str, int]] = []
    stream, fake, _ = jobs(on_schedule_put=lambda *a: told.append(a))
    row = ScheduleRow("s1", b"default", b"", 1.0, None, b'["tick"]', 0.0, 5.0, 3, 4.0)
    answers = [
        b'{"stream":"KV_EMQP_SCHEDULES","seq":42}',
        b'{"error":{"code":400,"err_code":10071,"description":"wrong last sequence: 41"}}',
        b'{"error":{"code":503,"err_code":10077,"description":"no quorum"}}',
    ]
    for token, payload in enumerate(answers, 1):
        stream.carry_out([("schedule-cas", PutRow("s1", row, True, 40, token))], [], streamed)
        subject, body, answer = fake.requests[-1]
        assert subject == b"$KV.EMQP_SCHEDULES." + jobstream.token(b"s1").encode()
        assert jobstream.decode_row(body) == (tuple(row), True)
        answer.callback(Msg(b"_INBOX.x", 1, b"", b"", payload))
    assert told == [
        ("s1", 1, schedule_gate.TAKEN, 42),
        ("s1", 2, schedule_gate.CONFLICT, 0),
        ("s1", 3, schedule_gate.FAILED, 0),
    ]
    assert stream.status()["schedule_conflicts"] == 1
    assert jsapi.refused(answers[1]) is not None


def test_a_request_of_a_client_in_process_elsewhere_is_still_retried() -> None:
    stream, fake, clock = jobs()
    stream._send_append(b"req-1", (b"emqp.jobs.default", b"req-1", b"body"))
    [(_, _, answer)] = fake.requests
    answer.callback(Msg(b"_INBOX.x", 1, b"", b"", ERROR_10158))
    # Not a schedule's run: this broker's own request, which must be stored: sent again.
    assert stream.status()["refusals"] == 1
    clock.advance(0.2)
    assert len(fake.requests) == 2
