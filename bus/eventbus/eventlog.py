"""What the Event BUS needs of its durable log, as typed protocols.

:class:`EventLog` is what a server alone needs: append a batch and learn its sequences,
read a range under subtree filters, the last sequence, the store id clients check,
retention, close. :class:`bus.eventbus.store.EventStore` (SQLite, one machine) and
:class:`bus.eventbus.jetstream.JetStreamLog` (a replicated JetStream stream, behind the
front-ends) keep it, behind the same core.
:class:`PairLog` adds what the Binary Star pair needs to copy one log into another,
which only the SQLite log does. mypy checks ``EventStore`` against both (bottom).

Rows are ``(sequence, topic, producer, timestamp, uuid, data)``; fields are
``(topic, producer, timestamp, uuid, data)``, as :mod:`bus.eventbus.codec` names them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from twisted.internet.defer import Deferred

from bus.eventbus.codec import EventFields, SequenceEncoding, SyncChunk

#: One stored event as the log reads it.
Row = tuple[int, bytes, bytes, bytes, bytes, bytes]


class RowSource(Protocol):
    """What snapshots read: a range of rows under subtree filters, at once (a log on this
    machine) or later (a replicated stream, as a Deferred)."""

    @property
    def last_sequence(self) -> int:
        """The highest sequence committed."""
        ...

    def read_rows(
        self,
        after: int,
        upto: int,
        prefixes: Iterable[bytes],
        limit: int,
    ) -> list[Row] | Deferred[list[Row]]:
        """At most ``limit`` rows with ``after < sequence <= upto`` under ``prefixes`` (every topic
        when empty), in order."""
        ...


@runtime_checkable
class SyncSource(Protocol):
    """A log that makes a snapshot's messages itself where it reads them (the JetStream
    log, on its reader's thread): no rows made on the reactor only to be taken apart."""

    def read_syncs(
        self,
        after: int,
        upto: int,
        prefixes: Iterable[bytes],
        limit: int,
        identity: bytes,
        encoding: SequenceEncoding,
    ) -> Deferred[SyncChunk]:
        """:meth:`RowSource.read_rows`, as the SYNC messages to ``identity``."""
        ...


class EventLog(Protocol):
    """A durable, gapless sequence of events. A write that fails raises
    :class:`bus.errors.StorageError` and leaves the log as it was."""

    #: Where it is (for the operator's lines); a replicated log names its stream.
    path: Path

    @property
    def store_id(self) -> str:
        """Names this log: a log made again is another log (clients and the Spark bridge
        start over when it changes)."""
        ...

    @property
    def last_sequence(self) -> int:
        """The highest sequence ever committed (kept through restarts and retention)."""
        ...

    def append_fields(self, fields: Sequence[EventFields], received: float) -> int:
        """Commit ``fields`` under consecutive new sequences, all or none; return the
        first sequence (the next one when ``fields`` is empty)."""
        ...

    def read_rows(
        self,
        after: int,
        upto: int | None = None,
        prefixes: Iterable[bytes] = (),
        limit: int = 1000,
    ) -> list[Row]:
        """Events with ``after < sequence <= upto`` whose topic starts with one of
        ``prefixes`` (every topic when empty), in order, at most ``limit``."""
        ...

    def first_sequence(self) -> int | None:
        """The lowest sequence still held; None when the log holds no event."""
        ...

    def count(self) -> int:
        """Events held now."""
        ...

    def size(self) -> int:
        """Bytes the log takes where it is kept."""
        ...

    # Retention, a step at a time (the service spreads them over reactor turns); a step's
    # cost follows its chunk, not the size of the log. A log whose steps have parts may stop
    # after one once ``out_of_time`` says so (a step's budget of the thread's time).
    def expire_older_than(
        self, cutoff: float, chunk: int = 5000, out_of_time: Callable[[], bool] | None = None
    ) -> int:
        """Delete up to ``chunk`` events received before ``cutoff`` (epoch seconds); how many."""
        ...

    def trim_to_count(
        self, max_count: int, chunk: int = 5000, out_of_time: Callable[[], bool] | None = None
    ) -> tuple[int, bool]:
        """Delete up to ``chunk`` of the oldest events beyond the newest ``max_count``: how many,
        and whether no more than ``max_count`` are left (a step may delete nothing and not
        be finished: the SQLite log counts its events first)."""
        ...

    def compact_step(
        self, chunk: int = 5000, out_of_time: Callable[[], bool] | None = None
    ) -> tuple[int, bool]:
        """Keep only each topic's latest event, looking at the next ``chunk`` events: how many
        were deleted, and whether a pass over the log ended."""
        ...

    def checkpoint(self) -> tuple[int, int]:
        """Make what was committed durable in the log's main file (SQLite: its WAL checkpointed);
        pages in the WAL and pages checkpointed. Safe from a worker thread."""
        ...

    def close(self, checkpoint_running: bool = False) -> None:
        """Close, with a last checkpoint unless one runs (``checkpoint_running``)."""
        ...


class PairLog(EventLog, Protocol):
    """What the Binary Star pair adds: copying the active's log into the passive's."""

    directory: Path

    def append_at(self, events: Sequence[tuple[int, EventFields]], received: float) -> None:
        """Commit events under the sequences given (the active's), each above the last one held."""
        ...

    def truncate_after(self, sequence: int) -> int:
        """Delete every event above ``sequence`` and make it the last one; how many were deleted."""
        ...

    def skip_to(self, sequence: int) -> None:
        """Make ``sequence`` the last one assigned, without an event."""
        ...

    def adopt_store_id(self, store_id: str) -> None:
        """Take another log's identity (an empty log only: a new passive)."""
        ...

    def set_aside(self, store_id: str) -> PairLog:
        """Close this log and keep it for the operator; return a new, empty one (in the
        same place) under ``store_id``."""
        ...

    def ids_present(self, after: int, ids: Iterable[bytes]) -> set[bytes]:
        """Which of ``ids`` (event UUIDs) the log holds above ``after``."""
        ...

    def event_ids(self, sequences: Iterable[int]) -> dict[int, bytes]:
        """The UUIDs of the events held at ``sequences`` (those not held left out)."""
        ...

    def meta(self, key: str) -> str | None:
        """A value kept beside the log under ``key`` (the pair's term), or None."""
        ...

    def set_meta(self, key: str, value: str) -> None:
        """Keep ``value`` under ``key``, durably."""
        ...


if TYPE_CHECKING:  # the SQLite log keeps both
    from bus.eventbus.store import EventStore

    def _pair_log(store: EventStore) -> PairLog:
        return store
