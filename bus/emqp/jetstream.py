"""The broker's guaranteed requests in a JetStream stream (``--store jetstream``), on the
reactor through :class:`bus.transport.nats.NatsClient` (no thread, no asyncio).

:class:`JetStreamJobs` does what the broker's core asks in ``to_stream`` and
``to_brokers`` (see :mod:`bus.emqp.jobstream` for the design): appends a request and
tells the service once the stream stored it, pulls for the queues whose workers are
ready, acknowledges, gives back or terminates what it holds, tells the stream every
``ack_wait / 4`` that held requests are still in progress, and carries answers to the
broker a client is connected to.
"""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import msgpack
from twisted.internet import defer
from twisted.logger import Logger
from twisted.python.failure import Failure

from bus.emqp import jobstream
from bus.emqp.config import JetStreamSettings
from bus.emqp.core import Job, Message
from bus.errors import StartupError
from bus.natswire import codec, jsapi
from bus.natswire.codec import Msg
from bus.natswire.handshake import ConnectError
from bus.transport.nats import NatsClient, NatsTLS, NotConnected, Subscription

log = Logger(namespace="bus.emqp.jetstream")

#: JetStream's error for a stream name not found, and for subjects another stream holds.
STREAM_NOT_FOUND = 10059
OVERLAPPING_SUBJECTS = 10065
_ACK = b"+ACK"
_NAK = b"-NAK"
#: Delivered again after a second, not at once (to whichever broker pulls then).
_NAK_LATER = b'-NAK {"delay": 1000000000}'
_TERM = b"+TERM"
_PROGRESS = b"+WPI"
#: How long a schedule's change is tried while JetStream cannot store it.
SCHEDULE_PATIENCE = 15.0


@dataclass(slots=True)
class _Pull:
    queue: bytes
    #: The subject its requests come under (they do not come on the pull's own).
    subject: bytes
    left: int


class JetStreamJobs:
    """The stream, from the reactor's thread (see the module's text)."""

    def __init__(
        self,
        reactor: Any,
        settings: JetStreamSettings,
        broker_id: bytes,
        *,
        on_job: Callable[[jobstream.StreamedJob, bytes, int], None],
        on_answer: Callable[[Message], None],
        on_appended: Callable[[bytes], None],
        on_change: Callable[[], None],
        held: Callable[[], list[bytes]],
        on_schedule: Callable[[str, tuple[Any, ...] | None, int], None] = lambda *_: None,
        on_schedule_kept: Callable[[str, int, str | None], None] = lambda *_: None,
        on_offered: Callable[[jobstream.StreamedJob], bool] = lambda _: False,
        on_forwarded: Callable[[bytes, bool], None] = lambda *_: None,
    ) -> None:
        self.reactor = reactor
        self.settings = settings
        self.broker_id = broker_id
        self._on_job = on_job
        self._on_answer = on_answer
        self._on_appended = on_appended
        self._on_change = on_change
        self._held = held
        self._on_schedule = on_schedule
        self._on_schedule_kept = on_schedule_kept
        self._on_offered = on_offered
        self._on_forwarded = on_forwarded
        #: The offer subscriptions of the queues this broker serves.
        self._offers: dict[bytes, Subscription] = {}
        self.offers_sent = 0
        self.offers_taken = 0
        self.bucket = jobstream.bucket_name(settings.stream)
        self._watch_inbox = ""
        self._watch_sequence = 0
        self.schedule_conflicts = 0
        tls = (
            NatsTLS(settings.tls_ca, settings.tls_cert, settings.tls_key)
            if settings.tls_ca or settings.tls_cert
            else None
        )
        self.client = NatsClient(
            reactor,
            settings.servers,
            name=f"emqp-broker-{broker_id.decode('ascii', 'replace')}",
            creds=settings.creds,
            tls=tls,
            ping_interval=settings.ping_interval,
            connect_timeout=settings.connect_timeout,
        )
        self.client.listeners.append(self._connection_changed)
        prefix = settings.subject_prefix
        self._prefix = prefix
        self._stream = settings.stream
        #: Appends sent and not yet acknowledged: msgid -> (job subject, headers, body).
        self.appending: dict[bytes, tuple[bytes, bytes, bytes]] = {}
        #: Appends refused or unanswered, sent again after ``retry_delay``.
        self._retry: dict[bytes, tuple[bytes, bytes, bytes]] = {}
        self._retry_call: Any = None
        self.retry_delay = 0.1
        #: Since when an append is refused (None: the stream takes them).
        self.refused_since: float | None = None
        self.refusal: str | None = None
        self.refusals = 0
        self._consumers: set[bytes] = set()
        self._making: set[bytes] = set()
        self._pulls: dict[bytes, _Pull] = {}
        self._pull_ids = itertools.count(1)
        self._pull_inbox = ""
        self.pulled = 0
        self.acks = 0
        self.naks = 0
        self.terms = 0
        self.answers_sent = 0
        self.bad_messages = 0
        self.stream_info: dict[str, Any] = {}
        #: The stream and the bucket are there and watched (open() is done).
        self.ready = False
        #: What follows an append once stored (a schedule's compare-and-set), by msgid.
        self._then: dict[bytes, Callable[[], None]] = {}
        self._progress_loop: Any = None

    # -- opening -------------------------------------------------------------------------------

    @defer.inlineCallbacks
    def open(self) -> Any:
        """Connect, make the stream when missing, check it when found; a StartupError
        says what is wrong in one line."""
        settings = self.settings
        self.client.start()
        try:
            yield self.client.when_connected(timeout=settings.connect_timeout)
        except ConnectError as error:
            self.client.stop()
            raise StartupError("nats", str(error)) from None
        wanted = jobstream.stream_config(
            settings.stream, self._prefix, settings.replicas, settings.duplicate_window
        )
        deadline = self.reactor.seconds() + 3 * settings.connect_timeout
        while True:
            try:
                info = yield self._stream_info_or_made(wanted)
                break
            except jsapi.JetStreamError as error:
                if error.err_code == OVERLAPPING_SUBJECTS:
                    self.client.stop()
                    raise StartupError(
                        "nats-stream",
                        f"another stream holds the subjects {wanted['subjects'][0]}: give "
                        "--nats-stream its name, or another --nats-subject-prefix",
                    ) from None
                failure: Exception = error
            except (TimeoutError, NotConnected) as error:  # no meta leader yet: a new cluster
                failure = error
            if self.reactor.seconds() > deadline:
                self.client.stop()
                raise StartupError(
                    "nats-stream", f"JetStream did not make {settings.stream}: {failure}"
                )
            yield _sleep(self.reactor, 0.25)
        wrong = jobstream.disagreements(info["config"], wanted)
        if wrong:
            self.client.stop()
            raise StartupError(
                "nats-stream",
                f"stream {settings.stream} exists with other settings ({'; '.join(wrong)}): "
                "change the options or the stream (it is never changed silently)",
            )
        self.stream_info = info
        bucket = jobstream.bucket_config(self.bucket, settings.replicas, settings.duplicate_window)
        while True:
            try:
                yield self._made(bucket)
                break
            except (jsapi.JetStreamError, TimeoutError, NotConnected) as error:
                if self.reactor.seconds() > deadline:
                    self.client.stop()
                    raise StartupError(
                        "nats-stream", f"JetStream did not make KV_{self.bucket}: {error}"
                    ) from None
            yield _sleep(self.reactor, 0.25)
        self._watch_inbox = f"_EMQPKV.{self.broker_id.decode('ascii', 'replace')}.{id(self):x}"
        self.client.subscribe(self._watch_inbox, self._schedule_changed)
        yield self._watch()
        self.client.subscribe(jobstream.broker_subject(self._prefix, self.broker_id), self._answer)
        self._pull_inbox = f"_EMQP.{self.broker_id.decode('ascii', 'replace')}.{id(self):x}"
        self.client.subscribe(self._pull_inbox + ".*", self._delivered)
        from twisted.internet.task import LoopingCall

        self.ready = True
        self._progress_loop = LoopingCall(self._in_progress)
        self._progress_loop.clock = self.reactor
        self._progress_loop.start(settings.ack_wait / 4, now=False)

    @defer.inlineCallbacks
    def _made(self, config: dict[str, Any]) -> Any:
        """A stream as ``config`` says, made when missing (its settings are ours)."""
        name = config["name"]
        try:
            info = yield self.client.jetstream(jsapi.stream_info(name))
            return info
        except jsapi.JetStreamError as error:
            if error.err_code != STREAM_NOT_FOUND:
                raise
        info = yield self.client.jetstream(f"{jsapi.API}.STREAM.CREATE.{name}", config)
        return info

    def _watch(self) -> defer.Deferred[Any]:
        """(Again) the bucket's keys, then its changes, to this broker."""
        self._watch_sequence = 0
        config = jobstream.watch_config(self.bucket, self._watch_inbox)
        watching = self.client.jetstream(f"{jsapi.API}.CONSUMER.CREATE.KV_{self.bucket}", config)

        def failed(failure: Failure) -> None:
            log.warn(
                "JetStream: schedules not watched yet ({error}); again soon",
                error=failure.getErrorMessage(),
            )
            self.reactor.callLater(1.0, self._watch_again)

        return watching.addErrback(failed)

    def _watch_again(self) -> None:
        if self.client.connected and self._watch_inbox:
            self._watch()

    def _schedule_changed(self, msg: Msg) -> None:
        if codec.status(msg.headers):
            return  # an idle heartbeat or flow control: nothing changed
        try:
            delivery = jsapi.delivery(msg.reply)
            consumer_sequence = jobstream.consumer_sequence(msg.reply)
            schedule_id = jobstream.key_of(self.bucket, msg.subject.decode())
            operation = codec.header(msg.headers, b"KV-Operation") if msg.headers else None
            row = None if operation else jobstream.decode_row(msg.payload)
        except (ValueError, jobstream.JobBodyError) as error:
            self.bad_messages += 1
            log.warn("JetStream: a schedule that cannot be read: {error}", error=str(error))
            return
        if consumer_sequence != self._watch_sequence + 1:
            # A change lost on its way (a push consumer's messages are not resent): the
            # whole bucket again.
            self._watch()
            return
        self._watch_sequence = consumer_sequence
        self._on_schedule(schedule_id, row, delivery.stream_sequence)

    # -- schedules ----------------------------------------------------------------------------

    def _put_schedule(
        self, schedule_id: str, row: tuple[Any, ...] | None, expected: int | None = None
    ) -> defer.Deferred[Any]:
        """Put (or delete, for None) a schedule's key; with ``expected``, only if the key
        is still at that revision."""
        fields: dict[bytes, bytes] = {}
        if row is None:
            fields[b"KV-Operation"] = b"DEL"
        if expected is not None:
            fields[b"Nats-Expected-Last-Subject-Sequence"] = str(expected).encode()
        headers = codec.header_block(fields) if fields else b""
        payload = jobstream.encode_row(row) if row is not None else b""
        subject = jobstream.key_subject(self.bucket, schedule_id).encode()
        return self.client.request(
            subject, payload, headers, timeout=self.settings.ack_timeout
        ).addCallback(lambda msg: jsapi.answer(msg.payload))

    def _keep_schedule(
        self, schedule_id: str, row: tuple[Any, ...] | None, waited: float = 0.0
    ) -> None:
        """Put it, again and again while JetStream cannot (no leader yet, no quorum) for
        about ``SCHEDULE_PATIENCE`` seconds; then its SCHEDULE is refused."""

        def kept(answer: dict[str, Any]) -> None:
            self._on_schedule_kept(schedule_id, int(answer.get("seq", 0)), None)

        def refused(failure: Failure) -> None:
            if waited < SCHEDULE_PATIENCE:
                delay = min(0.25 + waited / 2, 2.0)
                self.reactor.callLater(delay, self._keep_schedule, schedule_id, row, waited + delay)
                return
            self._on_schedule_kept(schedule_id, 0, failure.getErrorMessage())
            self._on_change()

        self._put_schedule(schedule_id, row).addCallbacks(kept, refused)

    def _fire(
        self, job: Job, stored: jobstream.StreamedJob, schedule_id: str, row: Any, revision: int
    ) -> None:
        """The run first (stored once whoever fires it), then the schedule's next state
        if nobody changed it since ``revision``."""

        def appended() -> None:
            def kept(answer: dict[str, Any]) -> None:
                self._on_schedule_kept(schedule_id, int(answer.get("seq", 0)), None)

            def lost(failure: Failure) -> None:
                self.schedule_conflicts += 1  # another broker's, or a change: the watch says

            self._put_schedule(schedule_id, row, revision).addCallbacks(kept, lost)

        self._then[job.msgid] = appended
        self._append(job, stored)

    @defer.inlineCallbacks
    def _stream_info_or_made(self, wanted: dict[str, Any]) -> Any:
        try:
            info = yield self.client.jetstream(jsapi.stream_info(self._stream))
            return info
        except jsapi.JetStreamError as error:
            if error.err_code != STREAM_NOT_FOUND:
                raise
        info = yield self.client.jetstream(f"{jsapi.API}.STREAM.CREATE.{self._stream}", wanted)
        log.info(
            "JetStream: made stream {stream} ({replicas} replicas, subjects {subjects})",
            stream=self._stream,
            replicas=self.settings.replicas,
            subjects=wanted["subjects"][0],
        )
        return info

    def close(self) -> None:
        if self._progress_loop is not None and self._progress_loop.running:
            self._progress_loop.stop()
        if self._retry_call is not None and self._retry_call.active():
            self._retry_call.cancel()
        self.client.stop()

    @property
    def connected(self) -> bool:
        return self.client.connected

    def _connection_changed(self, up: bool) -> None:
        # Pulls die with their connection; appends unanswered are sent again; the
        # schedules' watch is made again (its consumer may be gone).
        self._pulls.clear()
        if up:
            self._schedule_retry(0.0)
            self._watch_again()
        self._on_change()

    # -- what the core asks --------------------------------------------------------------------

    def carry_out(
        self,
        commands: list[tuple[str, Any]],
        answers: list[tuple[bytes, Message]],
        job_of: Callable[[Job], jobstream.StreamedJob],
    ) -> None:
        for what, value in commands:
            if what == "append":
                self._append(value, job_of(value))
            elif what == "ack":
                self._tell_stream(value, _ACK)
                self.acks += 1
            elif what == "nak":
                self._tell_stream(value, _NAK)
                self.naks += 1
            elif what == "later":
                self._tell_stream(value, _NAK_LATER)
                self.naks += 1
            elif what == "forward":
                self._offer(value, job_of(value))
            elif what == "schedule-put":
                self._keep_schedule(value[0], value)
            elif what == "schedule-delete":
                self._keep_schedule(value, None)
            elif what == "schedule-fire":
                job, schedule_id, row, revision = value
                self._fire(job, job_of(job), schedule_id, row, revision)
            elif what == "term":
                self._tell_stream(value, _TERM)
                self.terms += 1
        for origin, message in answers:
            subject = jobstream.broker_subject(self._prefix, origin).encode()
            try:
                self.client.publish(subject, msgpack.packb(message, use_bin_type=True))
                self.answers_sent += 1
            except NotConnected:
                pass  # as an answer to a client that is gone: its broker is out of reach

    def _tell_stream(self, handle: bytes, word: bytes) -> None:
        # Unsaid (no connection): the stream delivers it again after ack_wait.
        with contextlib.suppress(NotConnected):
            self.client.publish(handle, word)

    def _append(self, job: Job, stored: jobstream.StreamedJob) -> None:
        subject = jobstream.job_subject(self._prefix, job.queue).encode()
        headers = codec.header_block({b"Nats-Msg-Id": jobstream.msg_id(job.msgid)})
        entry = (subject, headers, jobstream.encode(stored))
        self._send_append(job.msgid, entry)

    def _send_append(self, msgid: bytes, entry: tuple[bytes, bytes, bytes]) -> None:
        self.appending[msgid] = entry
        subject, headers, body = entry
        answer = self.client.request(subject, body, headers, timeout=self.settings.ack_timeout)
        answer.addCallbacks(
            lambda msg: self._append_answered(msgid, msg),
            lambda failure: self._append_failed(msgid, failure),
        )

    def _append_answered(self, msgid: bytes, msg: Msg) -> None:
        try:
            jsapi.answer(msg.payload)
        except (jsapi.JetStreamError, ValueError) as error:
            self._append_failed(msgid, Failure(error))
            return
        if self.appending.pop(msgid, None) is None:
            return
        then = self._then.pop(msgid, None)
        if then is not None:
            then()
        if self.refused_since is not None and not self._retry:
            log.info(
                "JetStream stores again after {seconds:.1f}s",
                seconds=self.reactor.seconds() - self.refused_since,
            )
            self.refused_since = None
            self.refusal = None
            self.retry_delay = 0.1
        self._on_appended(msgid)

    def _append_failed(self, msgid: bytes, failure: Failure) -> None:
        entry = self.appending.pop(msgid, None)
        if entry is None:
            return
        self.refusals += 1
        reason = failure.getErrorMessage() or type(failure.value).__name__
        self.refusal = reason
        if self.refused_since is None:
            self.refused_since = self.reactor.seconds()
            log.warn(
                "JetStream does not store guaranteed requests ({reason}): the client port "
                "waits until it does",
                reason=reason,
            )
            self._on_change()
        self._retry[msgid] = entry
        self._schedule_retry(self.retry_delay)
        self.retry_delay = min(self.retry_delay * 2, 2.0)

    def _schedule_retry(self, delay: float) -> None:
        if self._retry and (self._retry_call is None or not self._retry_call.active()):
            self._retry_call = self.reactor.callLater(delay, self._send_retries)

    def _send_retries(self) -> None:
        retry, self._retry = self._retry, {}
        for msgid, entry in retry.items():
            self._send_append(msgid, entry)

    @property
    def refusing(self) -> bool:
        return self.refused_since is not None

    # -- requests not kept in the stream -------------------------------------------------------

    def _offer(self, job: Job, stored: jobstream.StreamedJob) -> None:
        """To one broker serving its queue; the answer says whether it took it."""
        self.offers_sent += 1
        subject = jobstream.direct_subject(self._prefix, job.queue).encode()
        answer = self.client.request(subject, jobstream.encode(stored), timeout=2.0)
        answer.addCallbacks(
            lambda msg: self._on_forwarded(job.msgid, msg.payload == jobstream.TAKEN),
            lambda _: self._on_forwarded(job.msgid, False),
        )

    def serve(self, queues: set[bytes]) -> None:
        """Take offers for exactly these queues (those this broker has workers for)."""
        if not self.ready:
            return
        for queue in list(self._offers):
            if queue not in queues:
                self.client.unsubscribe(self._offers.pop(queue))
        for queue in queues:
            if queue not in self._offers:
                self._offers[queue] = self.client.subscribe(
                    jobstream.direct_subject(self._prefix, queue),
                    self._offered,
                    queue=jobstream.OFFER_GROUP,
                )

    def _offered(self, msg: Msg) -> None:
        try:
            stored = jobstream.decode(msg.payload)
        except jobstream.JobBodyError as error:
            self.bad_messages += 1
            log.warn("JetStream: a broken offer from another broker: {error}", error=str(error))
            return
        taken = self._on_offered(stored)
        if taken:
            self.offers_taken += 1
        if msg.reply:
            with contextlib.suppress(NotConnected):
                self.client.publish(msg.reply, jobstream.TAKEN if taken else b"0")

    # -- pulls ---------------------------------------------------------------------------------

    def pull(self, wanted: dict[bytes, int]) -> None:
        """Ask the queues' consumers for what this broker's ready workers can take, less
        what pulls already asked for."""
        if not self.client.connected or not self._pull_inbox:
            return
        asked: dict[bytes, int] = {}
        for pull in self._pulls.values():
            asked[pull.queue] = asked.get(pull.queue, 0) + pull.left
        for queue, count in wanted.items():
            more = count - asked.get(queue, 0)
            if more <= 0:
                continue
            if queue in self._consumers:
                self._ask(queue, more)
            else:
                self._make_consumer(queue)

    def _make_consumer(self, queue: bytes) -> None:
        """Once per queue (JetStream takes the same config again as a no-op); the
        service is told when it is made, and pulls then."""
        if queue in self._making:
            return
        self._making.add(queue)
        name = jobstream.consumer_name(queue)
        body = jobstream.consumer_config(self._stream, self._prefix, queue, self.settings.ack_wait)
        subject = f"{jsapi.API}.CONSUMER.CREATE.{self._stream}.{name}".encode()

        def made(msg: Msg) -> None:
            jsapi.answer(msg.payload)
            self._consumers.add(queue)
            self._on_change()

        def failed(failure: Failure) -> None:
            log.warn(
                "JetStream: no consumer for queue {queue} yet: {error}",
                queue=queue.decode("utf-8", "replace"),
                error=failure.getErrorMessage(),
            )

        answer = self.client.request(subject, body)
        answer.addCallback(made).addErrback(failed)
        answer.addBoth(lambda _: self._making.discard(queue))

    def _ask(self, queue: bytes, count: int) -> None:
        pull_id = next(self._pull_ids)
        reply = f"{self._pull_inbox}.{pull_id}".encode()
        subject = jsapi.consumer_next(self._stream, jobstream.consumer_name(queue)).encode()
        try:
            self.client.publish(subject, jsapi.pull(count, self.settings.pull_expires), reply=reply)
        except NotConnected:
            return
        self._pulls[reply] = _Pull(
            queue, jobstream.job_subject(self._prefix, queue).encode(), count
        )

    def _delivered(self, msg: Msg) -> None:
        status = codec.status(msg.headers)
        if status:
            # The end of a pull, on its own reply subject: 404/408/409 (nothing left,
            # expired, the consumer changed); 100 is an idle heartbeat.
            if status != 100:
                self._pulls.pop(msg.subject, None)
                self._on_change()
            return
        # A request comes with the subject it was stored under, which names its queue:
        # it counts against that queue's oldest pull.
        for reply, pull in self._pulls.items():
            if (
                pull.left > 0
                and jobstream.job_subject(self._prefix, pull.queue).encode() == msg.subject
            ):
                pull.left -= 1
                if pull.left == 0:
                    del self._pulls[reply]
                break
        self.pulled += 1
        try:
            stored = jobstream.decode(msg.payload)
            delivered = jobstream.delivered(msg.reply)
        except (jobstream.JobBodyError, ValueError) as error:
            self.bad_messages += 1
            log.warn(
                "JetStream: a message that is no request, terminated: {error}", error=str(error)
            )
            self._tell_stream(msg.reply, _TERM)
            return
        self._on_job(stored, msg.reply, delivered)

    # -- held requests -------------------------------------------------------------------------

    def _in_progress(self) -> None:
        """Tell the stream the deliveries this broker holds are still being worked on
        (else, after ack_wait, it gives them to another broker)."""
        if not self.client.connected:
            return
        handles = self._held()
        if handles:
            self.client.publish_many([(handle, _PROGRESS) for handle in handles])

    def _answer(self, msg: Msg) -> None:
        try:
            message = msgpack.unpackb(msg.payload, raw=True)
        except Exception as error:  # broken bytes from the network: dropped and counted
            self.bad_messages += 1
            log.warn("JetStream: a broken answer from another broker: {error}", error=str(error))
            return
        if isinstance(message, list) and message and all(isinstance(f, bytes) for f in message):
            self._on_answer(message)
        else:
            self.bad_messages += 1

    def status(self) -> dict[str, Any]:
        return {
            "connected": self.client.connected,
            "ready": self.ready,
            "server": self.client.server,
            "stream": self._stream,
            "replicas": self.settings.replicas,
            "broker_id": self.broker_id.decode("ascii", "replace"),
            "disconnects": self.client.disconnects,
            "appending": len(self.appending) + len(self._retry),
            "refusing": self.refusal,
            "refusals": self.refusals,
            "pulls_open": len(self._pulls),
            "pulled": self.pulled,
            "acks": self.acks,
            "naks": self.naks,
            "terms": self.terms,
            "answers_sent": self.answers_sent,
            "bad_messages": self.bad_messages,
            "bucket": f"KV_{self.bucket}",
            "schedule_conflicts": self.schedule_conflicts,
            "offers_sent": self.offers_sent,
            "offers_taken": self.offers_taken,
        }


def _sleep(reactor: Any, seconds: float) -> defer.Deferred[None]:
    from twisted.internet.task import deferLater

    return deferLater(reactor, seconds, lambda: None)
