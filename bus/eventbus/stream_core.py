"""The rules of an Event BUS front-end whose log is a replicated stream, sans I/O.

A front-end keeps no log of its own (``--store jetstream``): what it collects goes to
the stream, and what it broadcasts is what the stream committed, read back in the
stream's order (so every front-end broadcasts every event, published anywhere, under one
sequence space). :class:`StreamCore` decides:

- **appends**: accepted events wait in :attr:`StreamCore.pending`; one batch at a time is
  handed to the service (:meth:`StreamCore.take_append`), so a retried batch never
  overtakes a later one. The stream's acknowledgement (:meth:`StreamCore.appended`) frees
  the next; a refusal (:meth:`StreamCore.append_refused`: no quorum, no leader, no answer)
  keeps the batch, which the service resends whole after its delay
  (:meth:`StreamCore.retry`): events the stream had already taken are dropped there as
  duplicates by their uuid.
- **the collector's pause**: while a batch is refused, or once ``hold_limit`` events
  wait, the collector is not read (ZeroMQ back-pressure to publishers) until half of them
  are stored: a pause and a resume per batch stored would cost more than the batch.
- **what the servers take**: an event whose message would be larger than the servers'
  ``max_payload``, or whose subject would make a longer command line than they read, is
  dropped as it is accepted and counted (``too-large-for-stream``, ``subject-too-long``):
  sent, it would cost the connection and be resent for ever, pausing the collector for
  every publisher. Nothing a publisher sends can do that.
- **broadcasts**: :meth:`StreamCore.committed` takes the stream's events in order and
  makes them broadcasts; a sequence seen already (a feed that restarted) is skipped, and
  a jump (events the stream's limits removed before this front-end read them) is counted.
"""

from __future__ import annotations

from collections.abc import Callable

from twisted.logger import Logger

from bus.eventbus import subjects
from bus.eventbus.codec import (
    MAX_PRODUCER_BYTES,
    MAX_TIMESTAMP_BYTES,
    UUID_BYTES,
    EventFields,
)
from bus.eventbus.core import Broadcast, Intake
from bus.eventbus.eventlog import Row
from bus.eventbus.stream_read import encoded_size
from bus.nats import jsapi
from bus.nats.handshake import DEFAULT_MAX_PAYLOAD
from bus.nats.limits import DEFAULT_CONTROL_LINE

#: The longest subject a front-end hands to NATS unless told what its servers read: a
#: server's default control line less the rest of a publish's line.
MAX_SUBJECT_BYTES = DEFAULT_CONTROL_LINE - jsapi.PUBLISH_LINE_BEYOND_SUBJECT

#: The most bytes an event's message holds beyond its data: the header block and the
#: body's other fields at their longest (the data's own length prefix included).
_BEYOND_DATA = (
    jsapi.headers_most(b"u" * UUID_BYTES)
    + encoded_size(
        (
            b"",
            b"p" * MAX_PRODUCER_BYTES,
            b"t" * MAX_TIMESTAMP_BYTES,
            b"u" * UUID_BYTES,
            b"d" * 65536,
        )
    )
    - 65536
)


def largest_data(max_payload: int) -> int:
    """The largest event data whose message surely fits in ``max_payload`` bytes (what
    the servers take), whatever its other fields."""
    return max(0, max_payload - _BEYOND_DATA)


class StreamCore(Intake):
    """A front-end's intake, appends and broadcasts (see the module's text)."""

    def __init__(
        self,
        *,
        released: int,
        max_data_bytes: int,
        clock: Callable[[], float],
        logger: Logger,
        local_limit: int = 200_000,
        batch_limit: int = 1000,
        hold_limit: int = 10_000,
        subject_prefix: str = "eventbus",
        max_subject_bytes: int = MAX_SUBJECT_BYTES,
        max_message_bytes: int = DEFAULT_MAX_PAYLOAD,
    ) -> None:
        super().__init__(
            max_data_bytes=max_data_bytes, clock=clock, logger=logger, local_limit=local_limit
        )
        self.batch_limit = batch_limit
        self.hold_limit = hold_limit
        self.subject_prefix = subject_prefix
        self.max_subject_bytes = max_subject_bytes
        self.max_message_bytes = max_message_bytes
        #: The highest sequence broadcast (what heartbeats and snapshots go up to).
        self.released = released
        #: Accepted, not yet handed to the stream, in order.
        self.pending: list[EventFields] = []
        #: Handed to the stream, not yet acknowledged (or refused: then resent whole).
        self.in_flight: list[EventFields] = []
        self.refused = False
        #: Sequences the feed gave twice (skipped), and sequences it never gave (removed
        #: by the stream's limits before this front-end read them).
        self.repeated = 0
        self.skipped = 0
        #: Events the stream acknowledged as held already (the same uuid, resent).
        self.duplicates = 0
        #: The backlog reached ``hold_limit`` and has not yet drained to half of it.
        self.holding = False

    # -- appends -------------------------------------------------------------------------------

    @property
    def max_message_bytes(self) -> int:
        """The most bytes (headers and body) of one of the stream's messages."""
        return self._max_message_bytes

    @max_message_bytes.setter
    def max_message_bytes(self, limit: int) -> None:
        self._max_message_bytes = limit
        self._sure_data = largest_data(limit)

    def accept(self, fields: list[EventFields]) -> None:
        # What the servers cannot take would cost the connection (NATS closes it, and the
        # batch would be resent for ever): dropped here. Checked exactly only past what
        # surely fits: an escape is 3 bytes for 1, so only a topic past a third of the
        # subject's limit can be too long, and only data near max_payload too large.
        topic_sure = (self.max_subject_bytes - len(self.subject_prefix) - 1) // 3
        data_sure = self._sure_data
        if any(len(event[0]) > topic_sure or len(event[4]) > data_sure for event in fields):
            fields = [event for event in fields if self._fits(event)]
        self.pending.extend(fields)
        if len(self.pending) + len(self.in_flight) >= self.hold_limit:
            self.holding = True

    def _fits(self, event: EventFields) -> bool:
        length = len(subjects.subject(self.subject_prefix, event[0]))
        if length > self.max_subject_bytes:
            self.drops.drop(
                "subject-too-long",
                f"topic {event[0][:60]!r}... is a {length}-byte subject (the NATS servers "
                f"take at most {self.max_subject_bytes})",
                b"local",
            )
            return False
        size = encoded_size(event) + jsapi.headers_most(event[3])
        if size > self.max_message_bytes:
            self.drops.drop(
                "too-large-for-stream",
                f"an event of {len(event[4])} data bytes on {event[0][:60]!r} makes a "
                f"{size}-byte message (the NATS servers take at most {self.max_message_bytes})",
                b"local",
            )
            return False
        return True

    def too_large(self, indexes: list[int], limit: int) -> None:
        """The servers refused to take those events of the batch in flight (found by the
        writer, before anything was sent: a server with a lower ``max_payload`` than
        known): they are dropped and counted, the rest is taken again first."""
        self.max_message_bytes = min(self.max_message_bytes, limit)
        skip = set(indexes)
        batch, self.in_flight = self.in_flight, []
        for index in indexes:
            event = batch[index]
            self.drops.drop(
                "too-large-for-stream",
                f"an event of {len(event[4])} data bytes on {event[0][:60]!r} is more than "
                f"the NATS server takes ({limit} bytes a message)",
                b"local",
            )
        self.pending[:0] = [event for index, event in enumerate(batch) if index not in skip]

    @property
    def collector_paused(self) -> bool:
        """The collector is not read: the stream refuses appends, or as many events wait as may."""
        return self.refused or self.holding

    def take_append(self) -> list[EventFields] | None:
        """The next batch to hand to the stream, or None (one is in flight, or refused,
        or nothing waits)."""
        if self.in_flight or not self.pending:
            return None
        batch = self.pending[: self.batch_limit]
        del self.pending[: len(batch)]
        self.in_flight = batch
        return batch

    def appended(self, sequences: list[int]) -> None:
        """The stream stored the batch in flight under ``sequences`` (0: the stream held
        that event already)."""
        batch, self.in_flight = self.in_flight, []
        self.refused = False
        self.storage_error = None
        if self.holding and len(self.pending) <= self.hold_limit // 2:
            self.holding = False
        stored = len(sequences) - sequences.count(0)
        self.duplicates += len(batch) - stored
        self.accepted += len(batch)
        self.bytes_accepted += sum(len(event[4]) for event in batch)

    def append_refused(self, error: str) -> None:
        """The stream did not store the batch in flight: it waits, whole, for :meth:`retry`."""
        self.append_failures += 1
        self.storage_error = error
        if not self.refused:
            self.refused = True
            self.refused_storage += len(self.in_flight)
            self.blocked_since = self.clock()

    def retry(self) -> list[EventFields]:
        """The refused batch, to hand to the stream again."""
        return self.in_flight

    @property
    def waiting(self) -> list[EventFields]:
        """What waits for the stream while it refuses (the batch, then what came after)."""
        return [*self.in_flight, *self.pending] if self.refused else []

    def backlog(self) -> int:
        return len(self.pending) + len(self.in_flight)

    # -- broadcasts ----------------------------------------------------------------------------

    def committed(self, rows: list[Row]) -> None:
        """Events the stream holds, in its order: broadcast each once, in order."""
        released = self.released
        run_first = 0
        run: list[EventFields] = []
        broadcasts = self.broadcasts
        for row in rows:
            sequence = row[0]
            if sequence <= released:
                self.repeated += 1
                continue
            if sequence != released + 1:
                self.skipped += sequence - released - 1
                if run:
                    broadcasts.append(Broadcast(run_first, run))
                    run = []
            if not run:
                run_first = sequence
            run.append(row[1:6])
            released = sequence
        if run:
            broadcasts.append(Broadcast(run_first, run))
        self.released = released
