"""What every reader of the Event BUS stream shares, with no reactor: the message body,
the client's connection options, and an ordered read of a sequence range.

The front-ends (:mod:`bus.eventbus.jetstream`, on threads of the reactor's pool) read
snapshots with it; Spark's executors (:mod:`bus.spark.stream_source`) read their
partitions with it in their task's thread. Both read through :mod:`bus.nats`, about
ten times as fast as nats-py for a message per event (docs/cluster.md).

A message's body is msgpack ``[producer, timestamp, uuid, data]`` (data: the event's own
msgpack bytes); the subject gives the topic back (:mod:`bus.eventbus.subjects`).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar, cast

import msgpack

from bus.eventbus import codec, subjects
from bus.nats import jsapi
from bus.nats.blocking import Connection, connector
from bus.nats.failover import ONCE, Failover, Retry
from bus.nats.ranged import CREATE_ATTEMPT, FETCH, Batch, RangeRead

_Value = TypeVar("_Value")

if TYPE_CHECKING:  # Spark's executors import this module: nothing of Twisted's
    from bus.eventbus.codec import EventFields
    from bus.eventbus.config import JetStreamSettings
    from bus.eventbus.eventlog import Row


def encode(fields: EventFields) -> bytes:
    """An event's fields as a stream message's body (the topic goes in the subject)."""
    _topic, producer, timestamp, uuid, data = fields
    body: bytes = msgpack.packb([producer, timestamp, uuid, data], use_bin_type=True)
    return body


class Encoder:
    """:func:`encode` for one thread at a time, with one msgpack packer kept: ``packb``
    makes (and allocates the buffer of) a packer per call, which cost a front-end about a
    microsecond per event."""

    def __init__(self) -> None:
        self._pack = msgpack.Packer(use_bin_type=True).pack

    def __call__(self, fields: EventFields) -> bytes:
        """The body of ``fields``: the same bytes as :func:`encode` gives (a tuple packs as
        the same msgpack array as a list)."""
        body: bytes = self._pack(fields[1:])
        return body


def encode_row(row: Row) -> bytes:
    """:func:`encode` of a log's row ``(sequence, topic, producer, timestamp, uuid, data)``."""
    body: bytes = msgpack.packb([row[2], row[3], row[4], row[5]], use_bin_type=True)
    return body


def encoded_size(fields: EventFields) -> int:
    """``len(encode(fields))``, without encoding: msgpack's array of four ``bin`` parts."""
    return 1 + sum(len(part) + _bin_head(len(part)) for part in fields[1:])


def _bin_head(size: int) -> int:
    return 2 if size < 0x100 else 3 if size < 0x10000 else 5


def decode(prefix: str, subject: str, body: bytes) -> EventFields:
    """The fields of the event stored as ``body`` under ``subject``."""
    return row(0, subjects.topic(prefix, subject), body)[1:]


def row(sequence: int, topic: bytes, body: bytes) -> Row:
    """The log's row of a stored message: its sequence, its topic, its body unpacked."""
    producer, timestamp, uuid, data = msgpack.unpackb(body, raw=True)
    return (sequence, topic, producer, timestamp, uuid, data)


def failover(
    settings: JetStreamSettings,
    name: str = "bus-reader",
    retry: Retry = ONCE,
    timeout: float | None = None,
) -> Failover:
    """Connections to the servers in turn (those the cluster names too, leaving one in
    lame-duck mode), and operations tried again on the next within ``retry``'s bound
    (:mod:`bus.nats.failover`)."""
    return Failover(settings.servers, connector(settings, name, timeout), retry)


def stream_state(connection: Connection, stream: str) -> dict[str, Any]:
    """The stream's ``state`` (``first_seq``, ``last_seq``, ``messages``, ...), waited
    for :data:`bus.nats.ranged.CREATE_ATTEMPT` seconds: a stream with no leader
    (one being elected) does not answer, and a failover asks again."""
    asked = connection.request(jsapi.stream_info(stream), b"", timeout=CREATE_ATTEMPT)
    info = jsapi.answer(asked.payload)
    state: dict[str, Any] = info["state"]
    return state


def unpack_bodies(payloads: list[bytes]) -> list[list[bytes]]:
    """Messages' bodies unpacked, each ``[producer, timestamp, uuid, data]``; a body of
    another shape fails as :func:`row` fails on it."""
    bodies = list(map(_unpack, payloads))
    for body, payload in zip(bodies, payloads, strict=True):
        if type(body) is not list or len(body) != 4:
            row(0, b"", payload)  # raises
            raise ValueError(f"not an event body: {payload[:80]!r}")
    return bodies


_unpack = functools.partial(msgpack.unpackb, raw=True)


def decoded_rows(batch: Batch, topics: list[bytes]) -> list[Row]:
    """The log's rows of stored messages whose subjects gave ``topics``: what
    ``Events.decoded(batch, topics).rows()`` gives (compiled where bus/eventbus/_pubscan.c
    was built; from a body of another form than four ``bin`` on, msgpack reads them here)."""
    native = codec.native
    if native is None:
        return Events.decoded(batch, topics).rows()
    rows, index = native.stream_rows(batch.sequences, topics, batch.payloads, 0)
    if index < len(batch.sequences):  # the rest as Python reads it, errors alike
        rows += _rest(batch, topics, index).rows()
    return rows  # type: ignore[no-any-return]


def decoded_syncs(
    batch: Batch, topics: list[bytes], identity: bytes, encoding: codec.SequenceEncoding
) -> list[list[bytes]]:
    """The SYNC messages to ``identity`` of stored messages whose subjects gave
    ``topics``: what :func:`bus.eventbus.codec.sync_messages` makes of
    :func:`decoded_rows`, made in one step where bus/eventbus/_pubscan.c was built."""
    native = codec.native
    if native is None:
        return codec.sync_messages(identity, Events.decoded(batch, topics).rows(), encoding)
    binary = encoding is codec.SequenceEncoding.BINARY
    head = (identity, codec.SYNC)
    messages, index = native.stream_rows(batch.sequences, topics, batch.payloads, 0, head, binary)
    if index < len(batch.sequences):
        messages += codec.sync_messages(identity, _rest(batch, topics, index).rows(), encoding)
    return messages  # type: ignore[no-any-return]


def syncs_of(
    batch: Batch, topics: Topics, identity: bytes, encoding: codec.SequenceEncoding
) -> tuple[list[int], list[list[bytes]], int]:
    """The SYNC messages to ``identity`` of the messages of ``batch`` that name a topic,
    their sequences, and how many name none: what :func:`events_of` and then
    :func:`decoded_syncs` give, in one compiled step where bus/eventbus/_pubscan.c was built
    (each subject's topic looked up there: no column of topics made in between)."""
    native = codec.native
    done: list[int] = []
    messages: list[list[bytes]] = []
    if native is not None:
        binary = encoding is codec.SequenceEncoding.BINARY
        head = (identity, codec.SYNC)
        messages, index = native.stream_rows(
            batch.sequences, batch.subjects, batch.payloads, 0, head, binary, topics
        )
        if index == len(batch.sequences):
            return batch.sequences, messages, 0
        # A subject that names no topic, or a body of another form: the rest as Python
        # reads it (errors alike).
        done, batch = batch.sequences[:index], _after(batch, index)
    batch, names, skipped = events_of(batch, topics)
    messages += decoded_syncs(batch, names, identity, encoding)
    return done + batch.sequences, messages, skipped


def _after(batch: Batch, index: int) -> Batch:
    """The messages of ``batch`` from ``index`` on."""
    return Batch(
        batch.sequences[index:], batch.subjects[index:], batch.payloads[index:],
        batch.stamps[index:],
    )  # fmt: skip


def _rest(batch: Batch, topics: list[bytes], index: int) -> Events:
    """The events from ``index`` on, as Python reads them (errors alike)."""
    return Events.decoded(_after(batch, index), topics[index:])


@dataclass
class Events:
    """Events read from the stream as columns: sequences, topics, bodies (each
    ``[producer, timestamp, uuid, data]``) and when the stream stored each (ns)."""

    sequences: list[int]
    topics: list[bytes]
    bodies: list[list[bytes]]
    stamps: list[int]

    @classmethod
    def empty(cls) -> Events:
        """No events."""
        return cls([], [], [], [])

    @classmethod
    def decoded(cls, batch: Batch, topics: list[bytes]) -> Events:
        """The events of stored messages whose subjects gave ``topics``."""
        return cls(batch.sequences, topics, unpack_bodies(batch.payloads), batch.stamps)

    def __len__(self) -> int:
        return len(self.sequences)

    def rows(self) -> list[Row]:
        """The log's rows, as :func:`row` makes them."""
        return [
            (sequence, topic, producer, timestamp, uuid, data)
            for sequence, topic, (producer, timestamp, uuid, data) in zip(
                self.sequences, self.topics, self.bodies, strict=True
            )
        ]


class _Remembered(dict[bytes, _Value]):
    """One conversion, remembered for the keys seen last (a stream's topics repeat); all
    forgotten at once when ``size`` are held. A dict whose misses convert: a column of
    keys maps through ``map(remembered.__getitem__, keys)`` with no Python call per key
    already known."""

    def __init__(self, convert: Callable[[bytes], _Value], size: int = 65536) -> None:
        super().__init__()
        self._convert, self._size = convert, size

    def __missing__(self, key: bytes) -> _Value:
        if len(self) >= self._size:
            self.clear()
        value = self[key] = self._convert(key)
        return value

    def __call__(self, key: bytes) -> _Value:
        return self[key]


class Topics(_Remembered[bytes | None]):
    """Subjects back to topics (:func:`bus.eventbus.subjects.topic`), remembered; None
    for a subject that names no topic: an import's placeholder (``<prefix>.~gap``, which
    a replica behind the import's last purge still holds) or another writer's message."""

    def __init__(self, prefix: str) -> None:
        #: Some subject named no topic (since the start): only then is a column of
        #: topics looked through for one (:func:`events_of`).
        self.none_seen = False

        def topic(subject: bytes) -> bytes | None:
            try:
                return subjects.topic(prefix, subject.decode("ascii"))
            except (subjects.SubjectError, UnicodeDecodeError):
                self.none_seen = True
                return None

        super().__init__(topic)


def events_of(batch: Batch, topics: Topics) -> tuple[Batch, list[bytes], int]:
    """The events of ``batch`` with their topics, and how many messages were left out as
    naming no topic (see :class:`Topics`): none is an event, and one of them must not
    cost a reader the events around it."""
    names = list(map(topics.__getitem__, batch.subjects))
    if not topics.none_seen or None not in names:
        return batch, cast("list[bytes]", names), 0
    keep = [i for i, name in enumerate(names) if name is not None]
    return batch.only(keep), [cast(bytes, names[i]) for i in keep], len(names) - len(keep)


class Subjects(_Remembered[bytes]):
    """Topics to their subjects (:func:`bus.eventbus.subjects.subject`), remembered."""

    def __init__(self, prefix: str) -> None:
        super().__init__(lambda topic: subjects.subject(prefix, topic).encode("ascii"))

    @property
    def known(self) -> dict[bytes, bytes]:
        """The topics remembered, with their subjects (the same dict for ever)."""
        return self


class Appends:
    """Events as a front-end appends them to the stream, for one thread at a time: each
    ``(subject, uuid, body)``. Compiled where bus/eventbus/_pubscan.c was built (the same
    bytes: a topic met for the first time is converted here, then it goes on)."""

    def __init__(self, prefix: str) -> None:
        self._subject = Subjects(prefix)
        self._encode = Encoder()

    def __call__(self, fields: Sequence[EventFields]) -> list[tuple[bytes, bytes, bytes]]:
        native = codec.native
        if native is None or type(fields) is not list:
            return [self._one(event) for event in fields]
        known = self._subject.known
        items, index = native.stream_items(fields, 0, known)
        while index < len(fields):
            items.append(self._one(fields[index]))
            more, index = native.stream_items(fields, index + 1, known)
            items += more
        return items  # type: ignore[no-any-return]

    def _one(self, event: EventFields) -> tuple[bytes, bytes, bytes]:
        return self._subject(event[0]), event[3], self._encode(event)


class RangeReader:
    """Events with ``after < sequence <= upto`` under ``prefixes`` (all when empty), in
    the stream's order, read through a pull consumer whose subject filters keep what is
    filtered out on the server (:class:`bus.nats.ranged.RangeRead`), on a blocking
    connection of the reader's own. :meth:`next_events` gives the next events as columns,
    with the time the stream stored each (nanoseconds since the epoch); none once the range
    is read. Blocking: call it from a thread of its own (a Spark task, the reactor's pool).

    With a ``retry`` (:class:`bus.nats.failover.Retry`), a read that fails for passing
    reasons (a server lost, JetStream electing a leader) is made again on the next server
    from just after the last event it gave, within the retry's bound; without one, it
    fails at the first failure. Without ``stamps``, the times stored are 0 (rows and SYNC
    messages hold none: a reader of them spares an int an event).

    The first message may lie above ``after + 1`` when the stream's retention removed the
    start: opened with ``check_retention``, :attr:`first_stored` is the stream's first
    sequence then, and :meth:`take_removed` gives the ranges retention took from under
    the read (at its start, or before a read made again had reached them)."""

    def __init__(
        self,
        settings: JetStreamSettings,
        after: int,
        upto: int,
        name: str = "bus-reader",
        retry: Retry = ONCE,
        stamps: bool = True,
    ) -> None:
        self.settings, self.name = settings, name
        self.stamps = stamps
        self.after, self.upto = after, upto
        self.retry = retry
        #: Every event up to here was given (or left out by the prefixes).
        self.position = after
        self._failover: Failover | None = None
        self._read: RangeRead | None = None
        self._prefixes: list[bytes] = []
        self._filters: list[str] = []
        self._exact = True
        self._check_retention = False
        self._topics = Topics(settings.subject_prefix)
        self._behind_before = 0  # counted by reads made again since
        self._behind_taken = 0
        self._removed: list[tuple[int, int]] = []
        self.first_stored = 0
        #: Messages read that name no topic (:class:`Topics`), left out.
        self.skipped = 0

    def open(self, prefixes: Sequence[bytes] = (), check_retention: bool = False) -> RangeReader:
        """Start reading under ``prefixes`` (every topic when empty); with ``check_retention``,
        :attr:`first_stored` says where the stream starts now. Returns the reader."""
        self._prefixes = list(prefixes)
        self._filters, self._exact = subjects.filters(self.settings.subject_prefix, self._prefixes)
        if self.after >= self.upto:
            return self
        self._check_retention = check_retention
        self._failover = failover(self.settings, self.name, self.retry)
        try:
            read = self._failover.call(self._doing(), self._reading)
        except BaseException:
            self.close()
            raise
        self.first_stored = read.first_stored
        return self

    def _doing(self) -> str:
        return f"reading stream {self.settings.stream} after {self.position} up to {self.upto}"

    def _reading(self, connection: Connection) -> RangeRead:
        """The read on ``connection``: the one there is, or one made from :attr:`position`
        when there is none or it was on a connection since left."""
        read = self._read
        if read is not None and read.connection is connection:
            return read
        if read is not None:
            # Its connection is closed: its consumer goes by itself when idle.
            self._behind_before += read.behind
            self._read = None
        read = RangeRead(
            connection, self.settings.stream, self.position, self.upto, self._filters,
            stamps=self.stamps,
        ).open(self._check_retention)  # fmt: skip
        if self._check_retention and read.first_stored > self.position + 1:
            self._removed.append((self.position + 1, min(read.first_stored - 1, self.upto)))
        self._read = read
        return read

    @property
    def done(self) -> bool:
        """Everything of the range was read."""
        return self._read is None or self._read.done

    @property
    def consumer(self) -> str:
        """The name of its JetStream consumer now ("" before one is made)."""
        return self._read.consumer if self._read is not None else ""

    def next_events(self, count: int = FETCH) -> Events:
        """The next events (at most ``count``), the bodies unpacked; empty at the end."""
        found = self._next(count)
        return Events.decoded(*found) if found is not None else Events.empty()

    def next_rows(self, count: int = FETCH) -> list[Row]:
        """:meth:`next_events` as the log's rows."""
        found = self._next(count)
        return decoded_rows(*found) if found is not None else []

    def next_syncs(
        self, count: int, identity: bytes, encoding: codec.SequenceEncoding
    ) -> codec.SyncChunk:
        """:meth:`next_events` as a snapshot's SYNC messages to ``identity``."""
        if not self._exact:  # the prefixes are looked at here, each topic in turn
            found = self._next(count)
            if found is None:
                return codec.SyncChunk([], [])
            batch, topics = found
            return codec.SyncChunk(
                batch.sequences, decoded_syncs(batch, topics, identity, encoding)
            )
        while (stored := self._batch(count)) is not None:
            sequences, messages, skipped = syncs_of(stored, self._topics, identity, encoding)
            self.skipped += skipped
            if messages:
                return codec.SyncChunk(sequences, messages)
        return codec.SyncChunk([], [])

    def _batch(self, count: int) -> Batch | None:
        """The next stored messages (under the prefixes' subject filters), at most
        ``count``; None at the end."""
        if self._read is None or self._failover is None or self._read.done:
            return None
        batch = self._failover.call(
            self._doing(), lambda connection: self._reading(connection).next_batch(count)
        )
        if batch.sequences:
            self.position = batch.sequences[-1]
        return batch

    def _next(self, count: int) -> tuple[Batch, list[bytes]] | None:
        """The next stored messages under the prefixes, with their topics; None at the end."""
        topics, exact, prefixes = self._topics, self._exact, self._prefixes
        while (batch := self._batch(count)) is not None:
            batch, names, skipped = events_of(batch, topics)
            self.skipped += skipped
            if not exact:
                keep = [i for i, t in enumerate(names) if any(t.startswith(p) for p in prefixes)]
                if len(keep) < len(names):
                    batch = batch.only(keep)
                    names = [names[i] for i in keep]
            if names:
                return batch, names
        return None

    def take_removed(self) -> list[tuple[int, int]]:
        """Ranges ``(first, last)`` of the read that retention removed before they were
        read, found since the last call (with ``check_retention``)."""
        removed, self._removed = self._removed, []
        return removed

    def take_behind(self) -> int:
        """Times since the last call that the consumer's replica lagged behind the
        stream's leader at the read's end (:attr:`bus.nats.ranged.RangeRead.behind`)."""
        if self._read is None:
            return 0
        counted = self._behind_before + self._read.behind
        behind = counted - self._behind_taken
        self._behind_taken = counted
        return behind

    def close(self) -> None:
        """Delete the consumer (where its connection is still up) and leave the connection."""
        read, self._read = self._read, None
        connected, self._failover = self._failover, None
        try:
            if read is not None and connected is not None and read.connection is connected.current:
                read.close()  # its consumer deleted, where its connection is still up
        finally:
            if connected is not None:
                connected.close()
