"""The broker's guaranteed requests in a JetStream stream (``--store jetstream``), on the
reactor through :class:`bus.nats.client.NatsClient` (no thread, no asyncio).

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
import os
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import msgpack
from twisted.internet import defer
from twisted.logger import Logger
from twisted.python.failure import Failure

from bus.emqp import jobstream, schedule_gate, stream_purge
from bus.emqp.config import JetStreamSettings
from bus.emqp.core import Job, Message
from bus.emqp.schedule_gate import PutRow
from bus.extension import StartupError
from bus.nats import codec, jsapi, kv
from bus.nats.client import (
    NotConnected,
    Subscription,
    client_for,
    connect_at_start,
    stream_ready,
)
from bus.nats.codec import Msg
from bus.nats.seen import (
    ConsumerSeen,
    ServerSeen,
    StreamCluster,
    cluster_status,
    consumer_seen,
    servers_seen,
    stream_cluster,
    unread,
)

log = Logger(namespace="bus.emqp.jetstream")

_ACK = b"+ACK"
_NAK = b"-NAK"
#: Delivered again after a second, not at once (to whichever broker pulls then).
_NAK_LATER = b'-NAK {"delay": 1000000000}'
_TERM = b"+TERM"
_PROGRESS = b"+WPI"
#: The smallest pull made while another of the same queue is open.
PULL_AT_LEAST = 8
#: How long a schedule's change is tried while JetStream cannot store it.
SCHEDULE_PATIENCE = 15.0
#: How long past its expiry a pull may stay unanswered before it is taken for lost: a
#: consumer leader elected anew, or cut away, forgets its pulls and never ends them.
PULL_GRACE = 1.0
#: JetStream's error for a message id another append of the same id is storing now.
DUPLICATE_IN_PROCESS = 10158


@dataclass(slots=True)
class _Pull:
    queue: bytes
    #: The subject its requests come under (they do not come on the pull's own).
    subject: bytes
    left: int
    #: When it is taken for lost if the server has not ended it (reactor seconds).
    until: float


@dataclass(slots=True)
class QueueSeen:
    """What this broker knows of a queue's consumer, for /status and /metrics."""

    #: Requests the consumer has not delivered yet (its latest word: a delivery or its info).
    pending: int = 0
    #: When a request of this queue was last delivered here (reactor seconds; 0: never).
    last_delivery: float = 0.0
    #: When the consumer's info was last read (reactor seconds; 0: never).
    info_at: float = 0.0
    #: The consumer as its info last described it (acknowledgements pending, its leader
    #: and replicas); None before a read.
    consumer: ConsumerSeen | None = None


class JetStreamJobs:
    """The stream, from the reactor's thread (see the module's text)."""

    def __init__(
        self,
        reactor: Any,
        settings: JetStreamSettings,
        broker_id: bytes,
        *,
        on_job: Callable[[jobstream.StreamedJob, bytes, int, float], None],
        on_answer: Callable[[Message], None],
        on_appended: Callable[[bytes], None],
        on_change: Callable[[], None],
        held: Callable[[], list[bytes]],
        on_schedule: Callable[[str, tuple[Any, ...] | None, bool, int], None] = lambda *_: None,
        on_schedule_kept: Callable[[str, int, str | None], None] = lambda *_: None,
        on_schedule_put: Callable[[str, int, str, int], None] = lambda *_: None,
        on_schedule_run: Callable[[str, bytes, bool], None] = lambda *_: None,
        on_offered: Callable[[jobstream.StreamedJob], bool] = lambda _: False,
        on_forwarded: Callable[[bytes, bool], None] = lambda *_: None,
        on_too_large: Callable[[bytes, int, int], None] = lambda *_: None,
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
        self._on_schedule_put = on_schedule_put
        self._on_schedule_run = on_schedule_run
        self._on_offered = on_offered
        self._on_forwarded = on_forwarded
        self._on_too_large = on_too_large
        #: Requests refused because their message was more than the servers take.
        self.too_large = 0
        #: The offer subscriptions of the queues this broker serves.
        self._offers: dict[bytes, Subscription] = {}
        self.offers_sent = 0
        self.offers_taken = 0
        self.bucket = jobstream.bucket_name(settings.stream)
        #: The bucket's watch (made once the bucket is there).
        self._watch: kv.Watch | None = None
        self.schedule_conflicts = 0
        self.client = client_for(
            reactor, settings, f"emqp-broker-{broker_id.decode('ascii', 'replace')}"
        )
        self.client.listeners.append(self._connection_changed)
        prefix = settings.subject_prefix
        self._prefix = prefix
        self._stream = settings.stream
        #: Each stream's leader and replicas as last read (the requests', the schedules'
        #: bucket's), every stats interval (:meth:`read_clusters`).
        self.clusters = {settings.stream: StreamCluster(), f"KV_{self.bucket}": StreamCluster()}
        self._reading: set[str] = set()
        #: Appends sent and not yet acknowledged: msgid -> (job subject, message id, body).
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
        #: Pulls past their expiry that no status ended, forgotten and asked again.
        self.pulls_lapsed = 0
        #: Pulls ended because their consumer is gone (made again before the next).
        self.consumers_lost = 0
        #: Per queue served: pending, last delivery (see :class:`QueueSeen`).
        self.queues: dict[bytes, QueueSeen] = {}
        #: What the service last wanted pulled, by queue (its ready workers' slots).
        self.wanted: dict[bytes, int] = {}
        self._pull_watch: Any = None
        #: Schedule runs another broker was storing at the same moment (the race by which
        #: a run is stored once): appended again a moment later, not a refusal.
        self.schedule_runs_raced = 0
        #: Schedule runs' appends the stream refused or did not answer (tried again).
        self.schedule_runs_refused = 0
        self.acks = 0
        #: Acknowledgements the stream has not confirmed yet: handle -> when first said.
        self._acking: dict[bytes, float] = {}
        #: Those given up on after ack_wait (the stream may run them again elsewhere).
        self.acks_unconfirmed = 0
        self._ack_reason = ""
        self.naks = 0
        self.terms = 0
        self.answers_sent = 0
        self.bad_messages = 0
        #: The stream and the bucket are there and watched (open() is done).
        self.ready = False
        #: Whether appends go as atomic batches (the stream allows them: made so here).
        self.atomic = False
        self.atomic_batches = 0
        #: Atomic batches JetStream refused for an id it held, sent again one by one.
        self.batches_resent_each = 0
        self._batch_numbers = itertools.count(1)
        self._batch_tag = os.urandom(6).hex().encode()
        self._subjects: dict[bytes, bytes] = {}
        self._progress_loop: Any = None

    # -- opening -------------------------------------------------------------------------------

    @defer.inlineCallbacks
    def open(self) -> Any:
        """Connect, make the stream when missing, check it when found; a StartupError
        says what is wrong in one line."""
        settings = self.settings
        yield connect_at_start(self.client, settings.connect_timeout)
        wanted = jobstream.stream_config(
            settings.stream, self._prefix, settings.replicas, settings.duplicate_window
        )
        try:
            info, _ = yield defer.ensureDeferred(
                stream_ready(self.client, wanted, 3 * settings.connect_timeout)
            )
        except jsapi.JetStreamError as error:
            self.client.stop()
            if error.err_code == jsapi.OVERLAPPING_SUBJECTS:
                raise StartupError(
                    "nats-stream",
                    f"another stream holds the subjects {wanted['subjects'][0]}: give "
                    "--nats-stream its name, or another --nats-subject-prefix",
                ) from None
            raise StartupError(
                "nats-stream", f"JetStream refused stream {settings.stream}: {error}"
            ) from None
        except TimeoutError as error:
            self.client.stop()
            raise StartupError("nats-stream", str(error)) from None
        unfinished = jsapi.unfinished_import(settings.stream, info["config"])
        if unfinished is not None:
            self.client.stop()
            raise StartupError("nats-stream", unfinished)
        wrong = jsapi.disagreements(info["config"], {k: wanted[k] for k in jobstream.CHECKED})
        if wrong:
            self.client.stop()
            raise StartupError(
                "nats-stream",
                f"stream {settings.stream} exists with other settings ({'; '.join(wrong)}): "
                "change the options or the stream (it is never changed silently)",
            )
        self.atomic = bool(info["config"].get("allow_atomic"))
        yield kv.bucket_ready(
            self.client, self.bucket, settings.replicas, settings.duplicate_window, "nats-stream"
        )
        self._watch = kv.Watch(
            self.client,
            self.bucket,
            f"_EMQPKV.{self.broker_id.decode('ascii', 'replace')}.{id(self):x}",
            self._schedule_changed,
            on_bad=self._bad_schedule,
        )
        yield self._watch.start()
        self.client.subscribe(jobstream.broker_subject(self._prefix, self.broker_id), self._answer)
        self._pull_inbox = f"_EMQP.{self.broker_id.decode('ascii', 'replace')}.{id(self):x}"
        self.client.subscribe(self._pull_inbox + ".*", self._delivered)
        from twisted.internet.task import LoopingCall

        self.ready = True
        self._progress_loop = LoopingCall(self._in_progress)
        self._progress_loop.clock = self.reactor
        self._progress_loop.start(settings.ack_wait / 4, now=False)
        self._pull_watch = LoopingCall(self._watch_pulls)
        self._pull_watch.clock = self.reactor
        self._pull_watch.start(max(settings.pull_expires / 4, 0.25), now=False)
        self.read_clusters()

    def _watch_again(self) -> None:
        if self._watch is not None:
            self._watch.again()

    def _bad_schedule(self, error: str) -> None:
        self.bad_messages += 1
        log.warn("JetStream: a schedule that cannot be read: {error}", error=error)

    def _schedule_changed(self, key: bytes, value: bytes | None, revision: int) -> None:
        try:
            schedule_id = key.decode("ascii")
            row, pending = (None, False) if value is None else jobstream.decode_row(value)
        except (ValueError, jobstream.JobBodyError) as error:
            self._bad_schedule(str(error))
            return
        self._on_schedule(schedule_id, row, pending, revision)

    # -- schedules ----------------------------------------------------------------------------

    def _put_schedule(
        self,
        schedule_id: str,
        row: tuple[Any, ...] | None,
        expected: int | None = None,
        pending: bool = False,
    ) -> defer.Deferred[int]:
        """Put (or delete, for None) a schedule's key; with ``expected``, only if the key
        is still at that revision. Fires with the key's new revision."""
        value = jobstream.encode_row(row, pending) if row is not None else None
        return kv.put(
            self.client,
            self.bucket,
            schedule_id.encode("ascii"),
            value,
            expected,
            timeout=self.settings.ack_timeout,
        )

    def _kept(self, schedule_id: str) -> Callable[[int], None]:
        """What the bucket's acknowledgement of a schedule's change tells the broker."""

        def kept(revision: int) -> None:
            self._on_schedule_kept(schedule_id, revision, None)

        return kept

    def _keep_schedule(
        self,
        schedule_id: str,
        row: tuple[Any, ...] | None,
        pending: bool = False,
        waited: float = 0.0,
    ) -> None:
        """Put it, again and again while JetStream cannot (no leader yet, no quorum) for
        about ``SCHEDULE_PATIENCE`` seconds; then its SCHEDULE is refused."""

        def refused(failure: Failure) -> None:
            if waited < SCHEDULE_PATIENCE:
                delay = min(0.25 + waited / 2, 2.0)
                self.reactor.callLater(
                    delay, self._keep_schedule, schedule_id, row, pending, waited + delay
                )
                return
            self._on_schedule_kept(schedule_id, 0, failure.getErrorMessage())
            self._on_change()

        self._put_schedule(schedule_id, row, pending=pending).addCallbacks(
            self._kept(schedule_id), refused
        )

    def _schedule_cas(self, put: PutRow) -> None:
        """A step of a schedule's run (see :mod:`bus.emqp.schedule_gate`): the bucket's
        compare-and-set, its answer to the gate. Never tried again here: the gate decides."""

        def taken(revision: int) -> None:
            self._on_schedule_put(put.schedule_id, put.token, schedule_gate.TAKEN, revision)

        def refused(failure: Failure) -> None:
            error = failure.value
            if isinstance(error, jsapi.JetStreamError) and error.err_code == kv.WRONG_LAST_SEQUENCE:
                self.schedule_conflicts += 1  # another broker's change came first
                outcome = schedule_gate.CONFLICT
            else:
                outcome = schedule_gate.FAILED
            self._on_schedule_put(put.schedule_id, put.token, outcome, 0)

        asked = self._put_schedule(put.schedule_id, put.row, put.expected, put.pending)
        asked.addCallbacks(taken, refused)

    def _append_run(self, schedule_id: str, job: Job, stored: jobstream.StreamedJob) -> None:
        """A schedule's run, alone and apart from the requests' appends: never retried
        here (the gate appends it again, one at a time, while its row is pending), and its
        refusal does not pause the client port."""
        subject, message_id, body = self._entry(job, stored)
        answer = self.client.request(
            subject, body, jsapi.msg_id_headers(message_id), timeout=self.settings.ack_timeout
        )

        def answered(msg: Msg) -> None:
            error = jsapi.refused(msg.payload)
            if error is None and jsapi.number_in(msg.payload, jsapi.SEQ_KEY) is not None:
                self._on_schedule_run(schedule_id, job.msgid, True)
                return
            if error is not None and error.err_code == DUPLICATE_IN_PROCESS:
                # Another broker's append of this run is being stored this very moment:
                # asked again shortly, when the stream answers "duplicate".
                self.schedule_runs_raced += 1
            else:
                self.schedule_runs_refused += 1
            self._on_schedule_run(schedule_id, job.msgid, False)

        def failed(_: Failure) -> None:
            self.schedule_runs_refused += 1
            self._on_schedule_run(schedule_id, job.msgid, False)

        answer.addCallbacks(answered, failed)

    def close(self) -> None:
        """Stop the periodic work and the NATS client."""
        if self._progress_loop is not None and self._progress_loop.running:
            self._progress_loop.stop()
        if self._pull_watch is not None and self._pull_watch.running:
            self._pull_watch.stop()
        if self._retry_call is not None and self._retry_call.active():
            self._retry_call.cancel()
        if self._watch is not None:
            self._watch.stop()
        self.client.stop()

    @property
    def connected(self) -> bool:
        """Connected to a NATS server."""
        return self.client.connected

    def _connection_changed(self, up: bool) -> None:
        # Pulls die with their connection; appends unanswered are sent again; the
        # schedules' watch is made again (its consumer may be gone).
        self._pulls.clear()
        if up:
            self._schedule_retry(0.0)
            self._watch_again()
            for handle in list(self._acking):
                self._ack_again(handle)
        self._on_change()

    # -- what the core asks --------------------------------------------------------------------

    def carry_out(
        self,
        commands: list[tuple[str, Any]],
        answers: list[tuple[bytes, Message]],
        job_of: Callable[[Job], jobstream.StreamedJob],
    ) -> None:
        """Do what the broker's core asked of the stream (``commands``, its ``to_stream``:
        append, ack, nak, forward, the schedules' changes) and publish ``answers`` (its
        ``to_brokers``) to the brokers their clients are connected to; ``job_of`` gives a
        job as the stream keeps it."""
        batch: list[tuple[bytes, tuple[bytes, bytes, bytes]]] = []
        limit = self.client.max_payload
        for what, value in commands:
            if what == "append":
                entry = self._entry(value, job_of(value))
                size = len(entry[2]) + jsapi.headers_most(entry[1])
                if size > limit:
                    # Sent, it would cost the connection and be resent for ever, holding
                    # every client's guaranteed requests: refused here, to its client.
                    self.too_large += 1
                    self._on_too_large(value.msgid, size, limit)
                    continue
                batch.append((value.msgid, entry))
            elif what == "ack":
                self._acking.setdefault(value, self.reactor.seconds())
                self._ack(value)
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
                row, pending = value
                self._keep_schedule(row[0], row, pending)
            elif what == "schedule-delete":
                self._keep_schedule(value, None)
            elif what == "schedule-cas":
                self._schedule_cas(value)
            elif what == "schedule-run":
                schedule_id, job = value
                self._append_run(schedule_id, job, job_of(job))
            elif what == "term":
                self._tell_stream(value, _TERM)
                self.terms += 1
        if len(batch) > 1 and self.atomic:
            for start in range(0, len(batch), jsapi.ATOMIC_LIMIT):
                self._send_batch(batch[start : start + jsapi.ATOMIC_LIMIT])
        else:
            for msgid, entry in batch:
                self._send_append(msgid, entry)
        for origin, message in answers:
            subject = jobstream.broker_subject(self._prefix, origin).encode()
            try:
                self.client.publish(subject, msgpack.packb(message, use_bin_type=True))
                self.answers_sent += 1
            except NotConnected:
                pass  # as an answer to a client that is gone: its broker is out of reach

    def purge(self, queue: bytes) -> defer.Deferred[stream_purge.Purged]:
        """Remove every request of ``queue`` from the stream (those no broker holds, and
        those delivered and not yet acknowledged: their acknowledgements then find
        nothing); fires with what was removed, and which of them no broker had been given
        (their clients are to be told): :mod:`bus.emqp.stream_purge`."""
        return stream_purge.purge(
            self.client,
            self.reactor,
            self._stream,
            self._prefix,
            queue,
            self.settings.ack_wait,
            self.settings.ack_timeout,
        )

    def _tell_stream(self, handle: bytes, word: bytes) -> None:
        # Unsaid (no connection): the stream delivers it again after ack_wait.
        with contextlib.suppress(NotConnected):
            self.client.publish(handle, word)

    def _entry(self, job: Job, stored: jobstream.StreamedJob) -> tuple[bytes, bytes, bytes]:
        """What an append sends: subject, the message id, body."""
        subject = self._subjects.get(job.queue)
        if subject is None:
            subject = self._subjects[job.queue] = jobstream.job_subject(
                self._prefix, job.queue
            ).encode()
            if len(self._subjects) > 4096:
                self._subjects.clear()
        return (subject, jobstream.msg_id(job.msgid), jobstream.encode(stored))

    def _ack(self, handle: bytes) -> None:
        """Acknowledge a request its worker answered, and have the stream confirm it. An
        acknowledgement lost with its connection (its NATS server died), or unanswered, is
        said again (on the next connection, or at once) until the stream confirms it or
        ``ack_wait`` has passed since it was first said: by then the stream has given the
        request to another broker. Unconfirmed, a request that ran would run again."""
        answer = self.client.request(handle, _ACK, timeout=self.settings.ack_wait / 4)
        answer.addCallbacks(
            lambda _: self._acking.pop(handle, None),
            lambda failure: self._ack_unconfirmed(handle, failure),
        )

    def _ack_unconfirmed(self, handle: bytes, failure: Failure) -> None:
        self._ack_reason = failure.getErrorMessage() or type(failure.value).__name__
        if not failure.check(NotConnected):  # else: said again once connected
            self.reactor.callLater(0.1, self._ack_again, handle)

    def _ack_again(self, handle: bytes) -> None:
        first = self._acking.get(handle)
        if first is None or not self.client.connected:
            return
        if self.reactor.seconds() - first < self.settings.ack_wait:
            self._ack(handle)
            return
        del self._acking[handle]
        self.acks_unconfirmed += 1
        log.warn(
            "JetStream did not confirm an acknowledgement in {seconds}s ({reason}): the "
            "request may run again",
            seconds=self.settings.ack_wait,
            reason=self._ack_reason,
        )

    def _send_batch(self, batch: list[tuple[bytes, tuple[bytes, bytes, bytes]]]) -> None:
        """One of JetStream's atomic batches: stored whole or not at all, one
        acknowledgement for all (one proposal to the replicas, not one each)."""
        number = next(self._batch_numbers)
        tag = self._batch_tag + b"-%d" % number
        last = len(batch)
        frames = []
        for index, (msgid, (subject, message_id, body)) in enumerate(batch[:-1], 1):
            self.appending[msgid] = (subject, message_id, body)
            headers = jsapi.batch_headers(message_id, tag, index, commit=False)
            frames.append(codec.hpub(subject, headers, body))
        msgid, (subject, message_id, body) = batch[-1]
        self.appending[msgid] = (subject, message_id, body)
        commit = jsapi.batch_headers(message_id, tag, last, commit=True)
        msgids = [msgid for msgid, _ in batch]
        try:
            self.client.publish_raw(b"".join(frames))
        except NotConnected as error:
            for msgid in msgids:
                self._append_failed(msgid, Failure(error))
            return
        answer = self.client.request(subject, body, commit, timeout=self.settings.ack_timeout)
        answer.addCallbacks(
            lambda msg: self._batch_answered(msgids, msg),
            lambda failure: self._batch_failed(msgids, failure),
        )
        self.atomic_batches += 1

    def _batch_failed(self, msgids: list[bytes], failure: Failure) -> None:
        for msgid in msgids:
            self._append_failed(msgid, failure)

    def _batch_answered(self, msgids: list[bytes], msg: Msg) -> None:
        error = jsapi.refused(msg.payload)
        if error is not None and error.err_code == jsapi.DUPLICATE_IN_BATCH:
            # A resend of ids the stream holds: each alone, where it drops repeats.
            self.batches_resent_each += 1
            for msgid in msgids:
                entry = self.appending.pop(msgid, None)
                if entry is not None:
                    self._send_append(msgid, entry)
            return
        if error is not None:
            for msgid in msgids:
                self._append_failed(msgid, Failure(error))
            return
        for msgid in msgids:
            self._append_stored(msgid)

    def _send_append(self, msgid: bytes, entry: tuple[bytes, bytes, bytes]) -> None:
        self.appending[msgid] = entry
        subject, message_id, body = entry
        answer = self.client.request(
            subject, body, jsapi.msg_id_headers(message_id), timeout=self.settings.ack_timeout
        )
        answer.addCallbacks(
            lambda msg: self._append_answered(msgid, msg),
            lambda failure: self._append_failed(msgid, failure),
        )

    def _append_answered(self, msgid: bytes, msg: Msg) -> None:
        try:
            jsapi.stored_sequence(msg.payload)
        except (jsapi.JetStreamError, ValueError) as error:
            self._append_failed(msgid, Failure(error))
            return
        self._append_stored(msgid)

    def _append_stored(self, msgid: bytes) -> None:
        if self.appending.pop(msgid, None) is None:
            return
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
        """The last append was refused (a full stream, no quorum); the client port waits."""
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
        self.wanted = wanted
        for queue in wanted:
            self.queues.setdefault(queue, QueueSeen())
        if not self.client.connected or not self._pull_inbox:
            return
        asked: dict[bytes, int] = {}
        for pull in self._pulls.values():
            asked[pull.queue] = asked.get(pull.queue, 0) + pull.left
        for queue, count in wanted.items():
            open_ = asked.get(queue, 0)
            more = count - open_
            # A pull still open delivers as the stream fills: a small shortfall waits for
            # it rather than cost a pull of its own (a pull per READY halves the rate).
            if more <= 0 or (open_ and more < PULL_AT_LEAST):
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
            queue,
            jobstream.job_subject(self._prefix, queue).encode(),
            count,
            self.reactor.seconds() + self.settings.pull_expires + PULL_GRACE,
        )

    def _watch_pulls(self) -> None:
        """Forget the pulls past their expiry that no status ended (their consumer's
        leader changed or was cut away: it forgot them), so that the queue is pulled
        again; and read the consumers' info now and then (pending, for /status)."""
        now = self.reactor.seconds()
        lapsed = [reply for reply, pull in self._pulls.items() if pull.until < now]
        for reply in lapsed:
            del self._pulls[reply]
        if lapsed:
            self.pulls_lapsed += len(lapsed)
            log.info(
                "JetStream: {count} pull(s) past their expiry without an end, asked again",
                count=len(lapsed),
            )
            self._on_change()
        if not self.client.connected:
            return
        for queue in list(self._consumers):
            seen = self.queues.setdefault(queue, QueueSeen())
            if now - seen.info_at >= self.settings.pull_expires:
                seen.info_at = now
                self._read_consumer(queue, seen)

    def _read_consumer(self, queue: bytes, seen: QueueSeen) -> None:
        name = jobstream.consumer_name(queue)
        subject = f"{jsapi.API}.CONSUMER.INFO.{self._stream}.{name}"

        def read(info: dict[str, Any]) -> None:
            seen.consumer = consumer_seen("queue", self._stream, info, _text(queue))
            seen.pending = int(info.get("num_pending", 0))

        def failed(failure: Failure) -> None:
            if isinstance(failure.value, jsapi.JetStreamError) and failure.value.code == 404:
                self._consumer_gone(queue)  # deleted: made again before the next pull
                seen.consumer = None
                return
            # No answer: no leader of the consumer, as far as this broker can tell.
            known = seen.consumer or ConsumerSeen("queue", name, self._stream, _text(queue))
            seen.consumer = replace(known, cluster=unread(failure.getErrorMessage()))

        answer = self.client.jetstream(subject, timeout=self.settings.ack_timeout)
        answer.addCallbacks(read, failed)

    def _consumer_gone(self, queue: bytes) -> None:
        seen = self.queues.get(queue)
        if seen is not None and seen.consumer is not None:
            # Shown leaderless until it is read again.
            seen.consumer = replace(seen.consumer, cluster=unread("gone: made again"))
        if queue in self._consumers:
            self._consumers.discard(queue)
            self.consumers_lost += 1
            log.warn(
                "JetStream: the consumer of queue {queue} is gone; made again",
                queue=queue.decode("utf-8", "replace"),
            )

    def _delivered(self, msg: Msg) -> None:
        status = codec.status(msg.headers)
        if status:
            # The end of a pull, on its own reply subject: 404/408/409 (nothing left,
            # expired, the consumer changed); 100 is an idle heartbeat.
            if status != 100:
                pull = self._pulls.pop(msg.subject, None)
                if pull is not None and (
                    status == 503
                    or (status == 409 and codec.description(msg.headers) == "Consumer Deleted")
                ):
                    # No consumer answers its subject (503: no responders) or it was
                    # deleted: made again before the next pull.
                    self._consumer_gone(pull.queue)
                self._on_change()
            return
        # A request comes with the subject it was stored under, which names its queue:
        # it counts against that queue's oldest pull.
        seen = None
        for reply, pull in self._pulls.items():
            if pull.left > 0 and pull.subject == msg.subject:
                pull.left -= 1
                if pull.left == 0:
                    del self._pulls[reply]
                seen = self.queues.get(pull.queue)
                if seen is not None:
                    seen.last_delivery = self.reactor.seconds()
                break
        self.pulled += 1
        try:
            delivered, pending, stored_at = jsapi.delivered_pending_stored(msg.reply)
            if seen is not None:
                seen.pending = pending
            stored = jobstream.decode(msg.payload)
        except (jobstream.JobBodyError, ValueError) as error:
            self.bad_messages += 1
            log.warn(
                "JetStream: a message that is no request, terminated: {error}", error=str(error)
            )
            self._tell_stream(msg.reply, _TERM)
            return
        self._on_job(stored, msg.reply, delivered, stored_at)

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
        """The connection, the stream, appends, pulls and acknowledgements, for ``/status``."""
        return {
            "connected": self.client.connected,
            "ready": self.ready,
            "server": self.client.server,
            # Given, then learnt (never with credentials): in the cluster now or not, in
            # lame-duck mode or not, and whether this broker's connection is on it.
            "servers": [server.status() for server in self.servers_seen()],
            # Each stream's leader and replicas, read every stats interval.
            "stream_clusters": {
                name: cluster_status(cluster) for name, cluster in self.clusters.items()
            },
            "consumers": [consumer.status() for consumer in self.consumers()],
            "authentication": self.settings.credentials.kind,
            "lame_duck_moves": self.client.lame_duck_moves,
            "max_payload": self.client.max_payload,
            "too_large": self.too_large,
            "stream": self._stream,
            "replicas": self.settings.replicas,
            "broker_id": self.broker_id.decode("ascii", "replace"),
            "disconnects": self.client.disconnects,
            "appending": len(self.appending) + len(self._retry),
            "refusing": self.refusal,
            "refusals": self.refusals,
            "pulls_open": len(self._pulls),
            "pulls_lapsed": self.pulls_lapsed,
            "consumers_lost": self.consumers_lost,
            "queues": self.queue_status(),
            "pulled": self.pulled,
            "acks": self.acks,
            "acks_unconfirmed": self.acks_unconfirmed,
            "acks_confirming": len(self._acking),
            "naks": self.naks,
            "terms": self.terms,
            "answers_sent": self.answers_sent,
            "bad_messages": self.bad_messages,
            "bucket": f"KV_{self.bucket}",
            "schedule_conflicts": self.schedule_conflicts,
            "schedule_runs_raced": self.schedule_runs_raced,
            "schedule_runs_refused": self.schedule_runs_refused,
            "atomic_batches": self.atomic_batches,
            "batches_resent_each": self.batches_resent_each,
            "offers_sent": self.offers_sent,
            "offers_taken": self.offers_taken,
        }

    def read_clusters(self) -> None:
        """Ask each stream's state again, for its leader and replicas (one read of each
        in flight at most; none before the streams are made)."""
        if not self.ready:
            return
        for name in self.clusters:
            if name not in self._reading:
                self._reading.add(name)
                self._read_cluster(name)

    def _read_cluster(self, name: str) -> None:
        def took(cluster: StreamCluster) -> None:
            self._reading.discard(name)
            self.clusters[name] = cluster

        asked = self.client.jetstream(jsapi.stream_info(name), timeout=self.settings.ack_timeout)
        asked.addCallbacks(
            lambda info: took(stream_cluster(info)),
            lambda failure: took(unread(failure.getErrorMessage())),
        )

    def servers_seen(self) -> list[ServerSeen]:
        """Each server known (given or learnt): in the cluster now, in lame-duck mode, and
        whether this broker's connection (it pings: what it hears is live) is on it."""
        url = self.client.server_url
        live = [("broker", url, self.client.info, True)] if url is not None else []
        return servers_seen(self.client.servers, live)

    def consumers(self) -> list[ConsumerSeen]:
        """This broker's consumers: each queue's (shared by every broker; as its info was
        last read, what it holds as last heard) and the schedules' watch."""
        found = []
        for queue, seen in sorted(self.queues.items()):
            if queue not in self._consumers and seen.consumer is None:
                continue
            known = seen.consumer or ConsumerSeen(
                "queue", jobstream.consumer_name(queue), self._stream, _text(queue)
            )
            found.append(replace(known, pending=seen.pending))
        watch = self._watch
        if watch is not None and watch.consumer:
            found.append(
                ConsumerSeen("schedules", watch.consumer, f"KV_{self.bucket}",
                             pending=watch.pending)
            )  # fmt: skip
        return found

    def pulls_open(self) -> dict[bytes, int]:
        """Open pulls by queue."""
        opened: dict[bytes, int] = {}
        for pull in self._pulls.values():
            opened[pull.queue] = opened.get(pull.queue, 0) + 1
        return opened

    def queue_status(self) -> dict[str, dict[str, Any]]:
        """Each queue served: the consumer's pending requests, this broker's ready slots
        and open pulls, and how long since a request of it was last delivered here."""
        now = self.reactor.seconds()
        opened = self.pulls_open()
        return {
            _text(queue): {
                "pending": seen.pending,
                "ready_slots": self.wanted.get(queue, 0),
                "pulls_open": opened.get(queue, 0),
                "last_delivery_s_ago": round(now - seen.last_delivery, 3)
                if seen.last_delivery
                else None,
            }
            for queue, seen in sorted(self.queues.items())
        }


def _text(queue: bytes) -> str:
    """A queue's name as /status and /metrics show it."""
    return queue.decode("utf-8", "replace")
