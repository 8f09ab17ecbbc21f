"""A broker's stored guaranteed requests and schedules moved from its SQLite store into
JetStream (``emqp-cli import-store``), where brokers started with ``--store jetstream``
run them.

What the brokers of a cluster read is written as they write it:

- each request not yet answered goes to the work-queue stream (``<prefix>.jobs.<queue>``,
  its msgid the ``Nats-Msg-Id``), in the order the broker would dispatch them, as
  :class:`bus.emqp.jobstream.StreamedJob`: its client, its body and headers, when it was
  received, the re-dispatches it has left; its broker is the one that will serve its
  client (``--broker-id``, else the id kept in the data directory, as the broker keeps
  it), so that the answers reach a client that connects to that broker again;
- each schedule goes to the schedules' bucket under its id, with its interval or cron
  line, its creation time, its runs so far and its next due time (stored, not pending):
  the brokers fire it then, once, as a broker restarted on SQLite would.

Moved, not copied: once the stream acknowledged every request and the bucket every
schedule, they are deleted from the SQLite store (in one transaction), so that a broker
started on the same data directory with ``--store jetstream`` does not run them a second
time from there (it runs what its store still holds).

A stream that holds requests, or a bucket that holds schedules, is refused. While the
import writes, the stream's metadata says so (:data:`bus.nats.jsapi.IMPORTING`) and
brokers refuse to start on it; an import stopped half-way is finished by the same command
with ``--resume`` (what the stream and the bucket hold is checked and kept, the rest
written).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from bus.emqp import jobstream
from bus.emqp.config import JetStreamSettings
from bus.emqp.store import StoredJob, StoreExport
from bus.nats import codec, jsapi, kv
from bus.nats.admin import StreamAdmin
from bus.nats.blocking import ConnectError, Connection, connection
from bus.nats.codec import Msg, ProtocolError
from bus.nats.publish import PublishError
from bus.nats.ranged import RangeRead
from bus.nats.sequenced import Placed, SequencedPublisher
from bus.nats.tokens import SubjectError

#: Seconds JetStream may not answer (a leader being elected) before the import gives up.
PATIENCE = 60.0
#: The stream's metadata beside the mark: its last sequence before the import began.
BASE = "bus_import_base"


class ImportRefused(Exception):
    """The import cannot be made (or go on): the sentence says why, and what to do."""


@dataclass
class MoveDone:
    """What an import did."""

    stream: str
    broker_id: str
    #: Requests and schedules the stream and the bucket hold from the store, of those
    #: the store held (written by this run or an earlier one).
    requests: int = 0
    schedules: int = 0
    seconds: float = 0.0
    resumed: bool = False


def streamed(job: StoredJob, broker_id: bytes) -> jobstream.StreamedJob:
    """A stored request as the stream keeps it, for the broker ``broker_id``."""
    return jobstream.StreamedJob(
        broker_id,
        job.client,
        job.msgid,
        job.queue,
        job.headers,
        job.body,
        job.received,
        job.retries_left,
    )


class StoreMove:
    """The move of one broker's store into one stream and its bucket (see the module's
    text). Blocking: run it in a thread of its own (a command's main thread)."""

    def __init__(
        self,
        store: StoreExport,
        settings: JetStreamSettings,
        broker_id: bytes,
        *,
        resume: bool = False,
        say: Callable[[str], None] = lambda _: None,
    ) -> None:
        self.store = store
        self.settings = settings
        self.broker_id = broker_id
        self.resume = resume
        self._say = say
        self.bucket = jobstream.bucket_name(settings.stream)
        self._connection: Connection | None = None
        self.done = MoveDone(settings.stream, broker_id.decode("ascii", "replace"))

    def run(self) -> MoveDone:
        """Check, write what is missing, delete what was moved from the store, take the
        mark away; :class:`ImportRefused` says why not."""
        started = time.monotonic()
        try:
            jobs, schedules = self.store.jobs(), self.store.schedules()
            admin = self._admin(self.settings.stream)
            base = self._prepare(admin, bool(jobs or schedules))
            if self.done.resumed and not (jobs or schedules):
                # The store was emptied: the earlier run ended but for taking the mark away.
                self._say("the store holds nothing more: the earlier run had moved everything")
                self._unmark(admin)
                return self.done
            self._requests(admin, jobs, base)
            self._schedules(schedules)
            self.store.remove([job.msgid for job in jobs], [row[0] for row in schedules])
            self._unmark(admin)
        finally:
            self.done.seconds = time.monotonic() - started
            self.close()
        return self.done

    def close(self) -> None:
        """Leave the servers."""
        if self._connection is not None:
            self._connection.close()
            self._connection = None

    def _admin(self, stream: str) -> StreamAdmin:
        if self._connection is None:
            settings = self.settings
            try:
                self._connection = connection(settings, f"emqp-import-{self.done.broker_id}")
            except (ConnectError, OSError, ProtocolError) as error:
                raise ImportRefused(
                    f"cannot reach {', '.join(settings.servers)}: {error}"
                ) from None
        return StreamAdmin(self._connection, stream, patience=PATIENCE)

    # -- before anything is written -----------------------------------------------------------

    def _prepare(self, admin: StreamAdmin, anything: bool) -> int:
        """The stream and the bucket to write into (made, or found empty, or found as an
        earlier run of this import left them with ``resume``), the stream marked; the
        stream's last sequence before the first request of this import."""
        settings = self.settings
        stream = settings.stream
        marker = f"the store {self.store.path.resolve()} for broker {self.done.broker_id}"
        wanted = jobstream.stream_config(
            stream, settings.subject_prefix, settings.replicas, settings.duplicate_window
        )
        info = admin.info()
        bucket = self._admin(f"KV_{self.bucket}")
        bucket_info = bucket.info()
        if info is not None:
            config = info["config"]
            wrong = jsapi.disagreements(config, {k: wanted[k] for k in jobstream.CHECKED})
            if wrong:
                raise ImportRefused(
                    f"stream {stream} exists with other settings ({'; '.join(wrong)})"
                )
            importing = jsapi.importing(config)
            if importing is not None:
                if importing != marker:
                    raise ImportRefused(
                        f"stream {stream} holds an unfinished import of another store ({importing})"
                    )
                if not self.resume:
                    raise ImportRefused(
                        f"stream {stream} holds an unfinished import of this store: --resume "
                        "goes on with it"
                    )
                self.done.resumed = True
                return int((config.get("metadata") or {}).get(BASE, 0))
        if self.resume:
            raise ImportRefused(f"stream {stream} holds no unfinished import: nothing to resume")
        if info is not None and int(info["state"].get("messages", 0)):
            raise ImportRefused(
                f"stream {stream} already holds {info['state']['messages']} requests: an import "
                "writes only into a stream that holds none; name another --nats-stream, or "
                "let the brokers on it run them first"
            )
        if bucket_info is not None:
            held = self._bucket_keys()
            if held:
                raise ImportRefused(
                    f"the schedules' bucket {self.bucket} already holds {len(held)} "
                    "schedules: an import writes only into one that holds none"
                )
        if not anything:
            self._say(f"{self.store.path} holds no request and no schedule: nothing to move")
        base = 0 if info is None else int(info["state"].get("last_seq", 0))
        metadata = {jsapi.IMPORTING: marker, BASE: str(base)}
        if info is None:
            admin.create({**wanted, "metadata": metadata})
        else:
            config = dict(info["config"])
            config["metadata"] = {**(config.get("metadata") or {}), **metadata}
            admin.update(config)
        if bucket_info is None:
            bucket.create(
                kv.bucket_config(self.bucket, settings.replicas, settings.duplicate_window)
            )
        return base

    # -- requests -------------------------------------------------------------------------------

    def _requests(self, admin: StreamAdmin, jobs: list[StoredJob], base: int) -> None:
        """Every request the stream does not hold yet, after those it holds (checked to be
        the store's first ones, in order)."""
        settings = self.settings
        prefix = settings.subject_prefix
        info = admin.info()
        if info is None:
            raise ImportRefused(f"stream {settings.stream} was deleted meanwhile")
        at = int(info["state"]["last_seq"])
        written = at - base
        if written > len(jobs) or written < 0:
            raise ImportRefused(
                f"stream {settings.stream} holds {written} requests of this import, the store "
                f"{len(jobs)}: not this store's import"
            )
        if written:
            found = admin.message(at)
            expected = jobstream.msg_id(jobs[written - 1].msgid)
            if found is None or codec.header(found[1], b"Nats-Msg-Id") != expected:
                raise ImportRefused(
                    f"stream {settings.stream} holds another request at sequence {at} than "
                    "the store: not this store's import"
                )
        remaining = jobs[written:]
        if remaining:
            assert self._connection is not None
            publisher = SequencedPublisher(self._connection)

            def messages() -> Iterator[Placed]:
                for offset, job in enumerate(remaining, at + 1):
                    body = jobstream.encode(streamed(job, self.broker_id))
                    subject = jobstream.job_subject(prefix, job.queue).encode()
                    yield Placed(offset, subject, jobstream.msg_id(job.msgid), body)

            try:
                publisher.publish(messages(), settings.ack_timeout)
            except (PublishError, OSError, ProtocolError) as error:
                raise ImportRefused(
                    f"the stream did not take every request ({error}): what it took is kept, "
                    "--resume goes on from there"
                ) from None
        self.done.requests = len(jobs)

    # -- schedules ------------------------------------------------------------------------------

    def _bucket_keys(self) -> dict[str, bytes]:
        """The schedules the bucket holds now, by id (their rows as stored)."""
        assert self._connection is not None
        info = self._admin(f"KV_{self.bucket}").info()
        last = 0 if info is None else int(info["state"]["last_seq"])
        if last == 0:
            return {}
        read = RangeRead(
            self._connection, f"KV_{self.bucket}", 0, last, [f"$KV.{self.bucket}.>"]
        ).open()
        latest: dict[str, bytes] = {}
        try:
            while not read.done:
                batch = read.next_batch()
                for subject, payload in zip(batch.subjects, batch.payloads, strict=True):
                    try:
                        key = kv.key_of(self.bucket, subject.decode()).decode()
                    except (SubjectError, UnicodeDecodeError):
                        continue
                    latest[key] = payload  # a deleted key's last message is empty
        finally:
            read.close()
        return {key: payload for key, payload in latest.items() if payload}

    def _schedules(self, rows: list[tuple[Any, ...]]) -> None:
        """Each schedule into the bucket, as a key made now (a key there already is this
        import's when it holds the same row: a resumed run keeps it)."""
        if not rows:
            return
        assert self._connection is not None
        held = self._bucket_keys() if self.done.resumed else {}
        for row in rows:
            payload = jobstream.encode_row(tuple(row), False)
            there = held.get(row[0])
            if there is not None:
                if there != payload:
                    raise ImportRefused(
                        f"the bucket {self.bucket} holds schedule {row[0]} otherwise than the "
                        "store: not this store's import"
                    )
                continue
            headers = codec.header_block({b"Nats-Expected-Last-Subject-Sequence": b"0"})
            subject = kv.key_subject(self.bucket, row[0].encode())
            answer = self._request_with_headers(subject, headers, payload)
            error = jsapi.refused(answer)
            if error is not None:
                raise ImportRefused(f"the bucket {self.bucket} refused schedule {row[0]}: {error}")
        self.done.schedules = len(rows)

    def _request_with_headers(self, subject: str, headers: bytes, payload: bytes) -> bytes:
        """JetStream's answer to a publish with headers, asked again while unanswered."""
        assert self._connection is not None
        connection = self._connection
        deadline = time.monotonic() + PATIENCE
        while True:
            inbox = connection.new_inbox()
            connection.send(codec.hpub(subject.encode(), headers, payload, inbox.encode()))
            try:
                while True:
                    for message in connection.read(self.settings.ack_timeout):
                        if isinstance(message, Msg) and message.subject == inbox.encode():
                            return message.payload
            except TimeoutError:
                if time.monotonic() > deadline:
                    raise ImportRefused(
                        f"JetStream did not answer for the bucket {self.bucket}"
                    ) from None

    # -- the end --------------------------------------------------------------------------------

    def _unmark(self, admin: StreamAdmin) -> None:
        info = admin.info()
        if info is None:
            raise ImportRefused(f"stream {self.settings.stream} was deleted meanwhile")
        config = dict(info["config"])
        metadata = dict(config.get("metadata") or {})
        metadata.pop(jsapi.IMPORTING, None)
        metadata.pop(BASE, None)
        config["metadata"] = metadata
        admin.update(config)
