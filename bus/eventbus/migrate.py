"""A server's SQLite log into a new JetStream stream, every sequence kept
(``eventbus-cli import-log``): a subscriber's cursor from the old server resumes at a
front-end with no hole and no repeat, under the same store id.

The stream is written exactly as front-ends write it (subjects, body, each event's uuid
as its ``Nats-Msg-Id``), each event at its own sequence:

- the sequences below the log's first event (removed by retention) are the new stream's
  ``first_seq``: the stream starts there;
- a hole inside (latest-per-topic compaction, a pair's skip) and the sequences above the
  last event held up to the last assigned are filled with placeholders on
  ``<prefix>.~gap`` (never a topic's subject: ``~`` begins an escape of two hex digits
  or stands alone), removed together by one purge at the end: JetStream keeps a removed
  message's sequence as a hole, and its last sequence;
- each message carries ``Nats-Expected-Last-Sequence``, so it is stored at its sequence or
  not at all (:mod:`bus.nats.sequenced`), and nothing else can write into the stream
  unnoticed meanwhile.

While it runs, the stream's metadata says so (:data:`bus.nats.jsapi.IMPORTING`), its
limits are off (a placeholder must not push an event out) and front-ends refuse to start
on it. An import stopped half-way (Ctrl-C, a crash, a lost server) leaves the stream so;
the same command with ``--resume`` checks the stream's last message against the log and
goes on from there. At the end the limits the retention options ask for are set, the log's
store id is written beside them (:data:`bus.eventbus.jetstream.STORE_ID`), and the mark
is removed.

:func:`placements` is the sequence mapping, sans I/O; :class:`LogImport` does the rest on a
blocking connection (a command's own thread).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from bus.eventbus import subjects
from bus.eventbus.config import JetStreamSettings
from bus.eventbus.eventlog import Row
from bus.eventbus.jetstream import STORE_ID, stream_config, stream_limits
from bus.eventbus.store import LogExport, Retention
from bus.eventbus.stream_read import Subjects, encode_row
from bus.nats import jsapi
from bus.nats.admin import StreamAdmin
from bus.nats.blocking import ConnectError, Connection, connection
from bus.nats.codec import ProtocolError
from bus.nats.limits import longest_control_line
from bus.nats.publish import PublishError, TooLarge
from bus.nats.ranged import RangeRead
from bus.nats.sequenced import HEADERS_BEYOND_ID, Placed, Repeated, SequencedPublisher

#: The token of the placeholders that keep a log's holes (see the module's text).
GAP_TOKEN = "~gap"
#: Events read from the log at a time.
READ_CHUNK = 5000
#: Seconds the import waits for the stream to take messages again after a failure (a
#: server lost, a leader elected) before it gives up (``--resume`` goes on later).
PATIENCE = 60.0


class ImportRefused(Exception):
    """The import cannot be made (or go on): the sentence says why, and what to do."""


def gap_subject(prefix: str) -> str:
    """The subject of the placeholders under ``prefix``."""
    return f"{prefix}.{GAP_TOKEN}"


def placements(
    read: Callable[[int, int], list[Row]], after: int, last: int, chunk: int = READ_CHUNK
) -> Iterator[tuple[int, Row | None]]:
    """Every sequence from ``after + 1`` to ``last``, once, in order, with the log's row
    there or None for a hole. ``read(after, limit)`` gives the log's rows above ``after``,
    in order (at most ``limit``); rows above ``last`` are not placed."""
    sequence = after
    while sequence < last:
        rows = read(sequence, chunk)
        for row in rows:
            at = row[0]
            if at > last:
                break
            if at <= sequence:
                raise ValueError(f"the log gave sequence {at} after {sequence}")
            while sequence + 1 < at:
                sequence += 1
                yield sequence, None
            sequence = at
            yield at, row
        else:
            if rows:
                continue
        break
    while sequence < last:
        sequence += 1
        yield sequence, None


def retention_text(retention: Retention) -> str:
    """The retention options that make these limits (``none`` for none)."""
    said = []
    if retention.max_age is not None:
        said.append(f"--retention-max-age {retention.max_age:g}s")
    if retention.max_count is not None:
        said.append(f"--retention-max-count {retention.max_count}")
    if retention.latest_per_topic:
        said.append("--retention-latest-per-topic")
    return " ".join(said) or "none"


@dataclass
class ImportDone:
    """What an import did."""

    stream: str
    store_id: str
    #: The sequences the stream holds the log's events under: first and last (0 and the
    #: last sequence for an empty log).
    first_sequence: int
    last_sequence: int
    #: Events written by this run, and placeholders (holes) written and removed.
    events: int = 0
    holes: int = 0
    #: Events the stream holds at the end (after its limits were set).
    held: int = 0
    seconds: float = 0.0
    #: Whether this run went on with an import stopped earlier.
    resumed: bool = False
    #: Whether it was stopped (``stop()``) before the end: the stream is left marked.
    interrupted: bool = False
    #: Whether the messages went as atomic batches (the stream has replicas).
    atomic: bool = False

    @property
    def rate(self) -> float:
        """Messages (events and placeholders) written a second."""
        return (self.events + self.holes) / self.seconds if self.seconds > 0 else 0.0


class LogImport:
    """The import of one log into one stream (see the module's text). Blocking: run it in a
    thread of its own (a command's main thread)."""

    def __init__(
        self,
        log: LogExport,
        settings: JetStreamSettings,
        retention: Retention,
        *,
        resume: bool = False,
        say: Callable[[str], None] = lambda _: None,
        stored: Callable[[int], None] = lambda _: None,
        stop: Callable[[], bool] = lambda: False,
        window: int = 16_000,
    ) -> None:
        self.log = log
        self.settings = settings
        self.retention = retention
        self.resume = resume
        self._say = say
        self._stored = stored
        self._stop = stop
        self.window = window
        self.prefix = settings.subject_prefix
        self._gap = gap_subject(self.prefix).encode()
        self._subject = Subjects(self.prefix)
        #: Sequences whose event goes without its ``Nats-Msg-Id``: the log holds its uuid
        #: more than once (SQLite keeps every copy a publisher sent; the stream would keep one).
        self._without_id: set[int] = set()
        self._connection: Connection | None = None
        #: Whether messages go as atomic batches: as the front-ends append, where the
        #: stream allows them and has replicas to propose to (bus.eventbus.jetstream).
        self.atomic = False
        #: The stream holds what the log holds up to here (acknowledged, or checked).
        self._good = 0
        #: Where the log's events start in the stream.
        self.first = log.first_sequence if log.first_sequence is not None else log.last_sequence + 1
        self.done = ImportDone(settings.stream, log.store_id, self.first, log.last_sequence)

    # -- the whole ------------------------------------------------------------------------------

    def run(self) -> ImportDone:
        """Check, make the stream (or take the unfinished one, with ``resume``), write
        every sequence, remove the placeholders, set the limits; :class:`ImportRefused`
        says why not."""
        started = time.monotonic()
        try:
            admin = self._admin()
            self._check_sizes()
            info = self._prepare(admin)
            config = info["config"]
            self.atomic = bool(config.get("allow_atomic")) and int(config["num_replicas"]) > 1
            self.done.atomic = self.atomic
            # A uuid the log holds twice would be dropped the second time by the stream's
            # duplicate window: that event goes without its id (found once, here).
            self._without_id = self.log.repeats()
            self._write(info)
            if not self.done.interrupted:
                # On the connection now: a failure while writing replaced the first one.
                self._finish(self._admin())
        finally:
            self.done.seconds = time.monotonic() - started
            self.close()
        return self.done

    def close(self) -> None:
        """Leave the servers."""
        if self._connection is not None:
            self._connection.close()
            self._connection = None

    def _admin(self) -> StreamAdmin:
        """The stream's management, on the connection (made at first: a start-up that
        reaches no server is refused at once)."""
        try:
            return StreamAdmin(self._connected(), self.settings.stream, patience=PATIENCE)
        except (ConnectError, OSError, ProtocolError) as error:
            raise ImportRefused(
                f"cannot reach {', '.join(self.settings.servers)}: {error}"
            ) from None

    def _connected(self) -> Connection:
        """The connection, made again when there is none (:class:`ConnectError` when no
        server admits it: after a failure, the caller tries again within :data:`PATIENCE`)."""
        if self._connection is None:
            self._connection = connection(self.settings, name="eventbus-import")
        return self._connection

    # -- before anything is written -----------------------------------------------------------

    def _check_sizes(self) -> None:
        """Every event fits in one of the servers' messages and its subject in their
        command line; otherwise nothing is written (the import is all or nothing)."""
        assert self._connection is not None
        payload = self._connection.max_payload
        sequence, size = self.log.largest()
        # The body's msgpack heads and the headers, at their longest.
        beyond = 1 + 4 * 5 + HEADERS_BEYOND_ID + 64
        if size + beyond > payload:
            raise ImportRefused(
                f"the event at sequence {sequence} makes a message of about {size + beyond} "
                f"bytes, more than the {payload} the NATS servers take (max_payload): raise "
                "max_payload in every server's configuration, then import"
            )
        settings = self.settings
        sure = (4096 - jsapi.PUBLISH_LINE_BEYOND_SUBJECT - len(self.prefix) - 1) // 3
        long_topics = self.log.topics_longer_than(sure)
        if not long_topics:
            return
        longest = max(len(subjects.subject(self.prefix, topic)) for topic in long_topics)
        line = longest_control_line(
            lambda: connection(settings, name="eventbus-import-probe"),
            longest + jsapi.PUBLISH_LINE_BEYOND_SUBJECT,
        )
        if longest + jsapi.PUBLISH_LINE_BEYOND_SUBJECT > line:
            raise ImportRefused(
                f"the log holds a topic whose subject is {longest} bytes; the NATS servers "
                f"take command lines of {line} bytes: raise max_control_line in every "
                "server's configuration (65536 takes every topic), then import"
            )

    def _prepare(self, admin: StreamAdmin) -> dict[str, Any]:
        """The stream to write into: made now, an empty one taken, or (``resume``) the
        one an earlier run of this import left."""
        log, settings = self.log, self.settings
        stream = settings.stream
        info = admin.info()
        marker = f"{log.store_id} from {log.path.resolve()}"
        if info is None:
            if self.resume:
                raise ImportRefused(f"stream {stream} does not exist: nothing to resume")
            return admin.create(self._import_config(marker))
        config, state = info["config"], info["state"]
        importing = jsapi.importing(config)
        if importing is not None:
            if not importing.startswith(log.store_id + " "):
                raise ImportRefused(
                    f"stream {stream} holds an unfinished import of another log ({importing})"
                )
            if not self.resume:
                raise ImportRefused(
                    f"stream {stream} holds an unfinished import of this log, up to sequence "
                    f"{state['last_seq']} of {log.last_sequence}: --resume goes on with it"
                )
            self.done.resumed = True
            return info
        if self.resume:
            raise ImportRefused(f"stream {stream} holds no unfinished import: nothing to resume")
        if int(state.get("messages", 0)) or int(state.get("last_seq", 0)):
            raise ImportRefused(
                f"stream {stream} already holds events (sequences {state.get('first_seq')} to "
                f"{state.get('last_seq')}, {state.get('messages')} messages): an import writes "
                "only into a new stream; name another --nats-stream, or delete this one"
            )
        # Made empty (a front-end started on it, nothing published): taken, as if made now.
        wanted = self._import_config(marker)
        found = {key: config.get(key) for key in ("subjects", "num_replicas", "retention")}
        differ = jsapi.disagreements(
            found, {key: wanted[key] for key in ("subjects", "num_replicas", "retention")}
        )
        if differ:
            raise ImportRefused(f"stream {stream} exists with other settings ({'; '.join(differ)})")
        updated = dict(config)
        for key in ("max_age", "max_msgs", "max_msgs_per_subject", "metadata"):
            updated[key] = wanted[key]
        admin.update(updated)
        if self.first > 1:
            admin.purge(seq=self.first)  # an empty stream then starts at that sequence
        info = admin.info()
        assert info is not None
        return info

    def _import_config(self, marker: str) -> dict[str, Any]:
        """The stream as a front-end makes it, starting at the log's first sequence, its
        limits off and its metadata marked while the import writes."""
        made = stream_config(self.settings, Retention())
        made["first_seq"] = self.first
        made["metadata"] = {jsapi.IMPORTING: marker, STORE_ID: self.log.store_id}
        return made

    # -- writing ------------------------------------------------------------------------------

    def _write(self, info: dict[str, Any]) -> None:
        """Every sequence the stream does not hold yet, from its last on; after a
        failure, on again from what the stream says it holds (within :data:`PATIENCE`
        without progress), once what it holds past the last acknowledgement is checked to
        be this import's."""
        log = self.log
        last_progress = time.monotonic()
        began = int(info["state"]["last_seq"])
        # Checked to hold what the log holds, up to here: of a stream found (a resumed
        # import) only its last message is, the rest is trusted.
        self._good = max(began - 1, self.first - 1)
        while True:
            at = int(info["state"]["last_seq"])
            try:
                self._check(at, int(info["state"]["first_seq"]))
                self._stored(at)
                # What this run wrote, as the stream holds it (not as it was sent).
                self.done.events = log.count_between(began, at)
                self.done.holes = at - began - self.done.events
                if at >= log.last_sequence or self._stop():
                    self.done.interrupted = at < log.last_sequence
                    return
                self._publish(at)
            except Repeated as repeated:
                # The stream held its id from elsewhere: sent again without it (a batch
                # holding it: the rest a message at a time, which finds which one). The
                # connection goes with the refusals of what was sent after it.
                if repeated.batch:
                    self.atomic = False
                else:
                    self._without_id.add(repeated.sequence)
                self.close()
            except TooLarge as error:
                raise ImportRefused(
                    f"the NATS servers take messages of {error.limit} bytes at most now, less "
                    "than when the import began: raise max_payload in every server's "
                    "configuration, then --resume"
                ) from None
            except (
                PublishError,
                ConnectError,
                OSError,
                ProtocolError,
                jsapi.JetStreamError,
            ) as error:
                # Misplaced too: stored past the last acknowledgement may be ours (sent
                # before a connection was lost), or another writer's: _check says which.
                if time.monotonic() - last_progress > PATIENCE:
                    raise ImportRefused(
                        f"the stream stopped taking messages ({error}) for {PATIENCE:g}s; "
                        "what it took is kept: --resume goes on from there"
                    ) from None
                self._say(f"the stream refused ({error}); going on from what it holds")
                self.close()
                time.sleep(0.5)
            try:
                info_now = StreamAdmin(self._connected(), self.settings.stream).info()
            except (ConnectError, OSError, ProtocolError, TimeoutError, jsapi.JetStreamError):
                info_now = info  # not reached now: tried again, within PATIENCE
                self.close()
                if time.monotonic() - last_progress > PATIENCE:
                    raise ImportRefused(
                        f"the NATS servers did not answer for {PATIENCE:g}s; what the stream "
                        "took is kept: --resume goes on from there"
                    ) from None
                time.sleep(0.5)
            if info_now is None:
                raise ImportRefused(f"stream {self.settings.stream} was deleted meanwhile")
            if int(info_now["state"]["last_seq"]) > at:
                last_progress = time.monotonic()
            info = info_now

    def _acknowledged(self, sequence: int) -> None:
        """The stream stored everything up to ``sequence`` as this import sent it."""
        self._good = max(self._good, sequence)
        self._stored(sequence)

    def _check(self, at: int, first: int) -> None:
        """The stream, whose last sequence is ``at``, holds what the log holds past the
        last sequence known good (acknowledged, or checked), up to ``at``: a message
        another writer appended (a front-end started on the stream anyway) ends the
        import, as does a stream that is not this log's import."""
        log, stream = self.log, self.settings.stream
        if first != self.first:
            raise ImportRefused(
                f"stream {stream} starts at sequence {first}, the log at {self.first}: not "
                "this log's import"
            )
        if at > log.last_sequence:
            raise ImportRefused(
                f"stream {stream} goes up to sequence {at}, past the log's last "
                f"({log.last_sequence}): not this log's import"
            )
        if at <= self._good:
            self._good = at
            return
        read = RangeRead(self._connected(), stream, self._good, at, [self.prefix + ".>"]).open()
        found: dict[int, tuple[bytes, bytes]] = {}
        try:
            while not read.done:
                batch = read.next_batch()
                found.update(
                    zip(batch.sequences, zip(batch.subjects, batch.payloads, strict=True),
                        strict=True)
                )  # fmt: skip
        finally:
            read.close()
        for sequence, row in placements(log.rows, self._good, at):
            held = found.pop(sequence, None)
            if row is None:
                # A placeholder, or none: purged by an earlier run's end.
                if held is None or held == (self._gap, b""):
                    continue
            elif held == (self._subject(row[1]), encode_row(row)):
                continue
            raise ImportRefused(
                f"stream {stream} holds at sequence {sequence} "
                f"{'nothing' if held is None else held[0].decode('ascii', 'replace')} where "
                f"this import put {'a hole' if row is None else 'the log event'}: another "
                "writer appended to it, or it is not this log's import; delete it and import "
                "again"
            )
        self._good = at

    def _publish(self, after: int) -> None:
        """Write the sequences above ``after``, pipelined."""
        publisher = SequencedPublisher(self._connected(), window=self.window, atomic=self.atomic)
        gap, subject_of, without_id = self._gap, self._subject, self._without_id

        def messages() -> Iterator[Placed]:
            for sequence, row in placements(self.log.rows, after, self.log.last_sequence):
                if row is None:
                    yield Placed(sequence, gap, b"", b"")
                else:
                    msg_id = b"" if sequence in without_id else row[4]
                    yield Placed(sequence, subject_of(row[1]), msg_id, encode_row(row))

        publisher.publish(
            messages(), self.settings.ack_timeout, stored=self._acknowledged, stop=self._stop
        )

    # -- the end --------------------------------------------------------------------------------

    def _finish(self, admin: StreamAdmin) -> None:
        """Remove the placeholders, check the stream against the log, set the limits and
        the store id, and take the mark away."""
        log, settings = self.log, self.settings
        admin.purge(filter=gap_subject(self.prefix))
        info = admin.info()
        if info is None:
            raise ImportRefused(f"stream {settings.stream} was deleted meanwhile")
        state = info["state"]
        held = (int(state["messages"]), int(state["last_seq"]))
        if held != (log.count, log.last_sequence):
            raise ImportRefused(
                f"stream {settings.stream} holds {held[0]} messages up to sequence {held[1]}, "
                f"the log {log.count} up to {log.last_sequence}: left marked as unfinished"
            )
        config = dict(info["config"])
        limits = stream_limits(settings, self.retention)
        config["max_age"] = int(float(limits["max_age"]) * 1e9)
        config["max_msgs"] = limits["max_msgs"]
        config["max_msgs_per_subject"] = limits["max_msgs_per_subject"]
        metadata = dict(config.get("metadata") or {})
        metadata.pop(jsapi.IMPORTING, None)
        metadata[STORE_ID] = log.store_id
        config["metadata"] = metadata
        finished = admin.update(config)
        self.done.held = int(finished["state"]["messages"])
