"""What every reader of the Event BUS stream shares, with no reactor: the message body,
the client's connection options, and an ordered read of a sequence range.

The front-ends (:mod:`bus.eventbus.jetstream`, on their asyncio thread) read snapshots
with it; Spark's executors (:mod:`bus.spark.stream_source`) read their partitions with
it on a loop of their own.

A message's body is msgpack ``[producer, timestamp, uuid, data]`` (data: the event's own
msgpack bytes); the subject gives the topic back (:mod:`bus.eventbus.subjects`).
"""

from __future__ import annotations

import ssl
from collections.abc import Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any

import msgpack

from bus.eventbus import subjects

if TYPE_CHECKING:  # Spark's executors import this module: nothing of Twisted's
    from bus.eventbus.codec import EventFields
    from bus.eventbus.config import JetStreamSettings
    from bus.eventbus.eventlog import Row

#: Messages asked of the server at once.
FETCH = 1000
#: Fetches in a row that may time out while events are pending before the read fails.
MAX_SLOW_FETCHES = 20


def encode(fields: EventFields) -> bytes:
    _topic, producer, timestamp, uuid, data = fields
    body: bytes = msgpack.packb([producer, timestamp, uuid, data], use_bin_type=True)
    return body


def decode(prefix: str, subject: str, body: bytes) -> EventFields:
    producer, timestamp, uuid, data = msgpack.unpackb(body, raw=True)
    return (subjects.topic(prefix, subject), producer, timestamp, uuid, data)


def connect_options(settings: JetStreamSettings) -> dict[str, Any]:
    """nats-py's ``connect`` arguments for the servers, credentials and TLS settings say."""
    options: dict[str, Any] = {
        "servers": list(settings.servers),
        "connect_timeout": settings.connect_timeout,
    }
    if settings.creds is not None:
        options["user_credentials"] = str(settings.creds)
    if settings.tls_ca or settings.tls_cert:
        context = ssl.create_default_context(
            cafile=str(settings.tls_ca) if settings.tls_ca else None
        )
        if settings.tls_cert is not None:
            context.load_cert_chain(
                str(settings.tls_cert), str(settings.tls_key) if settings.tls_key else None
            )
        options["tls"] = context
    return options


class RangeReader:
    """Events with ``after < sequence <= upto`` under ``prefixes`` (all when empty), in
    the stream's order, through an ephemeral pull consumer whose subject filters keep
    what is filtered out on the server. :meth:`next` gives the next rows, each with the
    time the stream stored it; an empty list once the range is read.

    The first message may lie above ``after + 1`` when the stream's retention removed the
    start: opened with ``check_retention``, :attr:`first_stored` is the stream's first
    sequence then."""

    def __init__(self, js: Any, stream: str, prefix: str, after: int, upto: int) -> None:
        self._js, self._stream, self._prefix = js, stream, prefix
        self.after, self.upto = after, upto
        self._sub: Any = None
        self._prefixes: list[bytes] = []
        self._exact = True
        self._done = after >= upto
        self._slow = 0
        self.first_stored = 0

    async def open(
        self, prefixes: Sequence[bytes] = (), check_retention: bool = False
    ) -> RangeReader:
        from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

        if self._done:
            return self
        if check_retention:
            info = await self._js.stream_info(self._stream)
            self.first_stored = int(info.state.first_seq)
        self._prefixes = list(prefixes)
        filters, self._exact = subjects.filters(self._prefix, self._prefixes)
        config = ConsumerConfig(
            deliver_policy=DeliverPolicy.BY_START_SEQUENCE,
            opt_start_seq=self.after + 1,
            ack_policy=AckPolicy.NONE,
            inactive_threshold=30.0,
            filter_subjects=filters if len(filters) > 1 else None,
        )
        self._sub = await self._js.pull_subscribe(
            filters[0] if len(filters) == 1 else "", stream=self._stream, config=config
        )
        if (await self._sub.consumer_info()).num_pending == 0:
            self._done = True  # nothing under the filters above ``after``
        return self

    @property
    def done(self) -> bool:
        """Everything of the range was read."""
        return self._done

    async def next(self, count: int = FETCH) -> list[tuple[Row, datetime | None]]:
        rows: list[tuple[Row, datetime | None]] = []
        while not self._done and len(rows) < count:
            try:
                messages = await self._sub.fetch(min(count - len(rows), FETCH), timeout=0.5)
            except TimeoutError:
                # A slow answer is not the end: only the consumer's count of what is left
                # under the filters says so.
                if (await self._sub.consumer_info()).num_pending == 0:
                    self._done = True
                    break
                self._slow += 1
                if self._slow > MAX_SLOW_FETCHES:
                    raise TimeoutError(
                        f"stream {self._stream} sent nothing for {MAX_SLOW_FETCHES} fetches "
                        f"though events above {self.after} are pending"
                    ) from None
                continue
            self._slow = 0
            for message in messages:
                metadata = message.metadata
                sequence = int(metadata.sequence.stream)
                if sequence > self.upto:
                    self._done = True
                    break
                fields = decode(self._prefix, message.subject, message.data)
                if self._exact or any(fields[0].startswith(p) for p in self._prefixes):
                    rows.append(((sequence, *fields), metadata.timestamp))
                if metadata.num_pending == 0 or sequence == self.upto:
                    self._done = True
                    break
        return rows

    async def close(self) -> None:
        if self._sub is not None:
            sub, self._sub = self._sub, None
            await sub.unsubscribe()
