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
- **broadcasts**: :meth:`StreamCore.committed` takes the stream's events in order and
  makes them broadcasts; a sequence seen already (a feed that restarted) is skipped, and
  a jump (events the stream's limits removed before this front-end read them) is counted.
"""

from __future__ import annotations

from collections.abc import Callable

from twisted.logger import Logger

from bus.eventbus import subjects
from bus.eventbus.codec import EventFields
from bus.eventbus.core import Broadcast, Intake
from bus.eventbus.eventlog import Row

#: The longest subject a front-end hands to NATS: a server's default control line is 4096
#: bytes, and the PUB line adds the command, a reply inbox, headers and sizes.
MAX_SUBJECT_BYTES = 3800


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
    ) -> None:
        super().__init__(
            max_data_bytes=max_data_bytes, clock=clock, logger=logger, local_limit=local_limit
        )
        self.batch_limit = batch_limit
        self.hold_limit = hold_limit
        self.subject_prefix = subject_prefix
        self.max_subject_bytes = max_subject_bytes
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

    def accept(self, fields: list[EventFields]) -> None:
        # A subject longer than the server's control line would cost the connection (NATS
        # closes it, and the batch would be resent for ever): such a topic is dropped here.
        # An escape is 3 bytes for 1, so only a topic past a third of the limit can be.
        limit = self.max_subject_bytes
        if any(3 * len(event[0]) > limit - len(self.subject_prefix) for event in fields):
            fields = [event for event in fields if self._fits(event)]
        self.pending.extend(fields)
        if len(self.pending) + len(self.in_flight) >= self.hold_limit:
            self.holding = True

    def _fits(self, event: EventFields) -> bool:
        length = len(subjects.subject(self.subject_prefix, event[0]))
        if length <= self.max_subject_bytes:
            return True
        self.drops.drop(
            "subject-too-long",
            f"topic {event[0][:60]!r}... is a {length}-byte subject (at most "
            f"{self.max_subject_bytes})",
            b"local",
        )
        return False

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
        stored = sum(1 for sequence in sequences if sequence)
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
