"""What every reader of the Event BUS stream shares, with no reactor: the message body,
the client's connection options, and an ordered read of a sequence range.

The front-ends (:mod:`bus.eventbus.jetstream`, on threads of the reactor's pool) read
snapshots with it; Spark's executors (:mod:`bus.spark.stream_source`) read their
partitions with it in their task's thread. Both read through :mod:`bus.natswire`, about
ten times as fast as nats-py for a message per event (docs/cluster.md).

A message's body is msgpack ``[producer, timestamp, uuid, data]`` (data: the event's own
msgpack bytes); the subject gives the topic back (:mod:`bus.eventbus.subjects`).
"""

from __future__ import annotations

import functools
import ssl
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import msgpack

from bus.eventbus import subjects
from bus.natswire import jsapi
from bus.natswire.blocking import Connection
from bus.natswire.ranged import FETCH, Batch, RangeRead

if TYPE_CHECKING:  # Spark's executors import this module: nothing of Twisted's
    from bus.eventbus.codec import EventFields
    from bus.eventbus.config import JetStreamSettings
    from bus.eventbus.eventlog import Row


def encode(fields: EventFields) -> bytes:
    _topic, producer, timestamp, uuid, data = fields
    body: bytes = msgpack.packb([producer, timestamp, uuid, data], use_bin_type=True)
    return body


def decode(prefix: str, subject: str, body: bytes) -> EventFields:
    return row(0, subjects.topic(prefix, subject), body)[1:]


def row(sequence: int, topic: bytes, body: bytes) -> Row:
    """The log's row of a stored message: its sequence, its topic, its body unpacked."""
    producer, timestamp, uuid, data = msgpack.unpackb(body, raw=True)
    return (sequence, topic, producer, timestamp, uuid, data)


def tls_context(settings: JetStreamSettings) -> ssl.SSLContext | None:
    """The TLS context the settings ask for, None for none."""
    if not (settings.tls_ca or settings.tls_cert):
        return None
    context = ssl.create_default_context(cafile=str(settings.tls_ca) if settings.tls_ca else None)
    if settings.tls_cert is not None:
        context.load_cert_chain(
            str(settings.tls_cert), str(settings.tls_key) if settings.tls_key else None
        )
    return context


def connect_options(settings: JetStreamSettings) -> dict[str, Any]:
    """nats-py's ``connect`` arguments for the servers, credentials and TLS settings say."""
    options: dict[str, Any] = {
        "servers": list(settings.servers),
        "connect_timeout": settings.connect_timeout,
    }
    if settings.creds is not None:
        options["user_credentials"] = str(settings.creds)
    context = tls_context(settings)
    if context is not None:
        options["tls"] = context
    return options


def connection(
    settings: JetStreamSettings, name: str = "bus-reader", timeout: float | None = None
) -> Connection:
    """A blocking connection to the first server that admits it (:mod:`bus.natswire`)."""
    return Connection(
        settings.servers,
        timeout=settings.connect_timeout if timeout is None else timeout,
        tls=tls_context(settings),
        creds=settings.creds,
        name=name,
    )


def stream_state(connection: Connection, stream: str) -> dict[str, Any]:
    """The stream's ``state`` (``first_seq``, ``last_seq``, ``messages``, ...)."""
    info = jsapi.answer(connection.request(jsapi.stream_info(stream), b"").payload)
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


class _Remembered:
    """One conversion, remembered for the keys seen last (a stream's topics repeat); all
    forgotten at once when ``size`` are held."""

    def __init__(self, convert: Callable[[bytes], bytes], size: int = 65536) -> None:
        self._convert, self._size = convert, size
        self._known: dict[bytes, bytes] = {}

    def __call__(self, key: bytes) -> bytes:
        value = self._known.get(key)
        if value is None:
            if len(self._known) >= self._size:
                self._known.clear()
            value = self._known[key] = self._convert(key)
        return value


class Topics(_Remembered):
    """Subjects back to topics (:func:`bus.eventbus.subjects.topic`), remembered."""

    def __init__(self, prefix: str) -> None:
        super().__init__(lambda subject: subjects.topic(prefix, subject.decode("ascii")))


class Subjects(_Remembered):
    """Topics to their subjects (:func:`bus.eventbus.subjects.subject`), remembered."""

    def __init__(self, prefix: str) -> None:
        super().__init__(lambda topic: subjects.subject(prefix, topic).encode("ascii"))


class RangeReader:
    """Events with ``after < sequence <= upto`` under ``prefixes`` (all when empty), in
    the stream's order, read through a pull consumer whose subject filters keep what is
    filtered out on the server (:class:`bus.natswire.ranged.RangeRead`), on a blocking
    connection of the reader's own. :meth:`next_events` gives the next events as columns,
    with the time the stream stored each (nanoseconds since the epoch); none once the range
    is read. Blocking: call it from a thread of its own (a Spark task, the reactor's pool).

    The first message may lie above ``after + 1`` when the stream's retention removed the
    start: opened with ``check_retention``, :attr:`first_stored` is the stream's first
    sequence then."""

    def __init__(
        self, settings: JetStreamSettings, after: int, upto: int, name: str = "bus-reader"
    ) -> None:
        self.settings, self.name = settings, name
        self.after, self.upto = after, upto
        self._connection: Connection | None = None
        self._read: RangeRead | None = None
        self._prefixes: list[bytes] = []
        self._exact = True
        self._topics = Topics(settings.subject_prefix)
        self._behind_taken = 0
        self.first_stored = 0

    def open(self, prefixes: Sequence[bytes] = (), check_retention: bool = False) -> RangeReader:
        self._prefixes = list(prefixes)
        filters, self._exact = subjects.filters(self.settings.subject_prefix, self._prefixes)
        if self.after >= self.upto:
            return self
        self._connection = connection(self.settings, self.name)
        try:
            self._read = RangeRead(
                self._connection, self.settings.stream, self.after, self.upto, filters
            ).open(check_retention)
        except BaseException:
            self.close()
            raise
        self.first_stored = self._read.first_stored
        return self

    @property
    def done(self) -> bool:
        """Everything of the range was read."""
        return self._read is None or self._read.done

    def next_events(self, count: int = FETCH) -> Events:
        """The next events (at most ``count``), the bodies unpacked; empty at the end."""
        if self._read is None:
            return Events.empty()
        topics, exact, prefixes = self._topics, self._exact, self._prefixes
        while not self._read.done:
            batch = self._read.next_batch(count)
            names = list(map(topics, batch.subjects))
            if not exact:
                keep = [i for i, t in enumerate(names) if any(t.startswith(p) for p in prefixes)]
                if len(keep) < len(names):
                    batch = Batch(
                        [batch.sequences[i] for i in keep],
                        [batch.subjects[i] for i in keep],
                        [batch.payloads[i] for i in keep],
                        [batch.stamps[i] for i in keep],
                    )
                    names = [names[i] for i in keep]
            if names:
                return Events.decoded(batch, names)
        return Events.empty()

    def take_behind(self) -> int:
        """Times since the last call that the consumer's replica lagged behind the
        stream's leader at the read's end (:attr:`bus.natswire.ranged.RangeRead.behind`)."""
        if self._read is None:
            return 0
        behind = self._read.behind - self._behind_taken
        self._behind_taken = self._read.behind
        return behind

    def close(self) -> None:
        read, self._read = self._read, None
        connection, self._connection = self._connection, None
        try:
            if read is not None:
                read.close()
        finally:
            if connection is not None:
                connection.close()
