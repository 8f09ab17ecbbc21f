"""The durable event log: SQLite in WAL mode in the data directory.

Every accepted event is committed before it is broadcast. With ``synchronous=NORMAL``
(the default) a commit reaches the operating system before ``append`` returns, so
events survive ``kill -9`` of the server; ``durability="full"`` also fsyncs every
commit, so they survive a power loss too, at the cost of one fsync per batch.

The sequence is the table's integer primary key and never goes backwards: the highest
sequence ever assigned is kept in ``meta`` before retention deletes anything.
Snapshot reads are chunked by sequence, so nothing is ever loaded whole in memory.

Retention deletes a chunk of events per step, and a step's cost follows its chunk, never the
size of the log: age and count retention delete the oldest events (``seq <= bound``, the bound
found from the oldest batches' numbers: receipt times never go backwards, so the events older
than a cutoff come first), a part of the chunk per transaction, so that a step can stop between
two once it spent its budget; count retention knows how many events the log holds
(counted once after the store opens, a chunk a step, then kept as events come and go);
latest-per-topic compaction knows each topic's newest sequence and the events superseded since
(:class:`_Superseded`: seen as they are appended, the events already there read once, a chunk a
step, after the first compaction step), so a step deletes a chunk of superseded events by their
sequences, with no index to keep. :class:`Retention` sizes the chunks by their measured time
(:class:`bus.util.chunking.ChunkSizer`).

A write the store cannot make (a full disk, an I/O error) raises :class:`StorageError`
and leaves the store as it was before the call: SQLite rolls a failed transaction back
itself (on SQLITE_FULL it already has), and only a transaction still open is rolled
back here. The caller may retry the same call later. An age or count step commits its parts
one by one: one that fails after others ends the step with what they deleted (and the next
step meets the failure), so a step that raises has changed nothing either.

:class:`bus.eventbus.upkeep.LogUpkeep` does a log's background work on the reactor for the
service: checkpoints on a worker thread, retention a step per reactor turn, the close at stop.
"""

from __future__ import annotations

import contextlib
import sqlite3
import time
import uuid
from array import array
from bisect import bisect_left, bisect_right
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from heapq import heappop, heappush
from pathlib import Path
from typing import TYPE_CHECKING

from bus.eventbus import logbatch
from bus.eventbus.codec import Event, EventFields
from bus.extension import StorageError
from bus.util.chunking import Budget, ChunkSizer
from bus.util.sqlitewal import (
    DEFAULT_WAL_LIMIT,
    Checkpointer,
    Durability,
    WalStatus,
    final_checkpoint,
    open_exclusive,
    open_wal,
)

if TYPE_CHECKING:
    from bus.eventbus.eventlog import EventLog, Row

DB_NAME = "events.sqlite3"


def prefix_upper_bound(prefix: bytes) -> bytes | None:
    """The smallest byte string greater than every string starting with ``prefix``."""
    stripped = prefix.rstrip(b"\xff")
    if not stripped:
        return None
    return stripped[:-1] + bytes([stripped[-1] + 1])


def _rollback(db: sqlite3.Connection) -> None:
    """Roll back what a failed write left open. On SQLITE_FULL (and some I/O errors)
    SQLite has already rolled the transaction back, and a ROLLBACK would only fail
    with "no transaction is active"."""
    if db.in_transaction:
        # Should this fail too, the original error is still the one that matters.
        with contextlib.suppress(sqlite3.Error):
            db.execute("ROLLBACK")


def _write(db: sqlite3.Connection, statements: Callable[[], object]) -> None:
    """Run ``statements`` in one transaction: committed, or rolled back and raised as
    :class:`StorageError` (any other exception is re-raised after the rollback)."""
    try:
        db.execute("BEGIN")
        statements()
        db.execute("COMMIT")
    except sqlite3.Error as error:
        _rollback(db)
        raise StorageError(error) from error
    except BaseException:
        _rollback(db)
        raise


#: How long one retention step should hold the thread that runs it (the reactor's), in
#: seconds: chunks are sized to it from the steps' measured times, well under the 5 ms that a
#: step may take at most (on a busy machine, steps sized for 2 ms took up to 4 ms of CPU).
STEP_TARGET = 0.0015

#: The thread's CPU time a retention step may take before it stops, at the end of the part of
#: its work under way (a region of the log, the events being read, a part of a chunk): a chunk
#: is sized by what earlier steps cost, and in the soak a spell of the machine made steps of the
#: same chunk take 5-7 times their usual CPU (10-13 ms; the kernel's mostly, all of the step's
#: statements slower, right after a WAL checkpoint), where a budget ends them at 2.5 ms and the
#: part under way.
STEP_BUDGET = 0.0025

#: Events a compaction step reads between two looks at its budget: about 0.1 ms of work, so
#: that a spell of the machine running ten times slower makes one stretch 1 ms, not the 4-7 ms
#: that 256 events took in such spells (steps of the first pass after an open).
READ_BETWEEN_CHECKS = 64

#: An age or count step deletes (or counts) its chunk in this many parts, each deletion its own
#: transaction, and looks at its budget after each: a part costs about a sixth of a step
#: (~0.25 ms), so that one begun just under the budget in a spell 7 times slower ends by about
#: 4.3 ms. A commit is up to half of a deletion's cost (a WAL frame written per page the
#: deletes touched, the kernel's time mostly) and grows with what its transaction deleted: one
#: commit for all the parts would leave the spell's slowness outside the budget's reach. Each
#: part costs a commit of its own (the B-tree's inner pages written again), so no more parts.
PARTS_PER_STEP = 6
#: A batch deleted whole costs a compaction step about this many times less an event than one
#: written again without its superseded events, so a part counts its events so much less
#: (parts of events counted alike, in a log of batches superseded whole, made compaction's
#: CPU per event removed 1.55 times what one transaction a step cost, for no shorter step).
WHOLE_PER_REWRITTEN = 4
#: Events a part deletes at least (a step of fewer is one part): steps whose chunks the sizer
#: shrank (a busy machine's wall times) must not pay a part's own cost six times for a few
#: events each (without a floor, a run under 1.4 cores of other work took 4,956 steps of about
#: 30 events to remove 150,000, at 66 us of CPU per event).
PART_EVENTS = 128


#: Events a read under topic prefixes looks at, at most (a snapshot of a subtree few events
#: match reads the log a bound at a time, a reactor turn each): a few ms of the reactor.
SCAN_EVENTS = 8192

#: Counting the events held costs about a tenth of deleting them (a range COUNT against a
#: DELETE, measured): a counting step takes this many times its chunk of sequences.
COUNTED_PER_DELETED = 8
#: Reading events' topics for compaction costs about a third of deleting them: a reading step
#: takes this many times its chunk of events.
SCANNED_PER_DELETED = 3


def step_sizer(clock: Callable[[], float] = time.perf_counter) -> ChunkSizer:
    """Chunk sizes for retention steps of :data:`STEP_TARGET` (one per kind of step), their
    time measured by ``clock`` (monotonic seconds)."""
    return ChunkSizer(STEP_TARGET, first=256, smallest=16, largest=65_536, clock=clock)


@dataclass(frozen=True, slots=True)
class Retention:
    """What to keep. ``None`` means no limit; everything is kept by default."""

    max_age: float | None = None
    max_count: int | None = None
    latest_per_topic: bool = False

    @property
    def enabled(self) -> bool:
        """Some limit is set: retention has work to do."""
        return self.max_age is not None or self.max_count is not None or self.latest_per_topic

    def steps(
        self,
        log: Callable[[], EventLog],
        now: float,
        sizer: ChunkSizer | None = None,
        budget_clock: Callable[[], float] = time.thread_time,
    ) -> Iterator[int]:
        """One pass over the log ``log()`` gives (asked again at every step: a pair may
        replace it), deleting what these limits do not keep at ``now``: by age, then by
        count, then all but each topic's latest event. One chunk a step, each step yielding
        how many events it deleted; ``sizer`` sizes the chunks by the steps' measured time
        (a new one per pass when not given); a step of a log whose steps have parts (the
        SQLite log's) also stops once it spent :data:`STEP_BUDGET` by ``budget_clock`` (the
        thread's CPU time). A StorageError ends the pass and leaves the log consistent; the
        next pass goes on from there."""
        sizer = sizer if sizer is not None else step_sizer()
        if self.max_age is not None:
            cutoff = now - self.max_age

            def expire(chunk: int, out_of_time: Callable[[], bool]) -> tuple[int, bool]:
                deleted = log().expire_older_than(cutoff, chunk, out_of_time)
                # Fewer than a chunk may be a hole in the sequence or the budget, not the end.
                return deleted, not deleted

            yield from _stepping(lambda: "age", expire, sizer, budget_clock)
        if self.max_count is not None:
            max_count = self.max_count

            def trim(chunk: int, out_of_time: Callable[[], bool]) -> tuple[int, bool]:
                return log().trim_to_count(max_count, chunk, out_of_time)

            yield from _stepping(lambda: "count", trim, sizer, budget_clock)
        if self.latest_per_topic:

            def reading_or_deleting() -> str:
                # Reading the log's topics and deleting differ in cost per event: each its own.
                current = log()
                reading = isinstance(current, EventStore) and current.compaction_reading
                return "latest-read" if reading else "latest"

            def compact(chunk: int, out_of_time: Callable[[], bool]) -> tuple[int, bool]:
                return log().compact_step(chunk, out_of_time)

            yield from _stepping(reading_or_deleting, compact, sizer, budget_clock)


def _stepping(
    kind: Callable[[], str],
    step: Callable[[int, Callable[[], bool]], tuple[int, bool]],
    sizer: ChunkSizer,
    budget_clock: Callable[[], float],
) -> Iterator[int]:
    """The steps of one retention mode until one says it finished (``step(chunk,
    out_of_time)`` returns (deleted, finished)), yielding what each deleted (a step that
    deleted nothing and finished is not one). Each takes the chunk ``sizer`` gives its
    ``kind()`` and a budget of :data:`STEP_BUDGET`; a step the budget cut short did less than
    its chunk and teaches the sizer nothing (a spell of the machine, which the budget bounds
    while it lasts)."""
    clock = sizer.clock
    finished = False
    while not finished:
        named = kind()
        chunk, started = sizer.chunk(named), clock()
        budget = Budget(STEP_BUDGET, budget_clock)
        deleted, finished = step(chunk, budget.spent)
        if not finished and not budget.over:
            sizer.took(named, chunk, clock() - started)
        if deleted or not finished:
            yield deleted


#: Superseded sequences are handed out to be deleted by region of the log, this many
#: sequences wide: the victims of one step lie in few batches, and a batch is written again
#: once for all the victims it holds, not once per victim.
REGION = 256
#: Superseded sequences next to each other (a region's all, or the rest of it) that a
#: compaction step deletes without reading their batches: every batch that begins among them
#: and ends among them holds only them, so it goes with one DELETE of their range, and only
#: the batches at its two ends are read. Topics superseded in turn leave such runs: in the
#: bench's log of two-event commits, reading a region's 128 batches into Python was about a
#: third of compaction's CPU.
RUN_EVENTS = 16


class _Superseded:
    """Latest-per-topic compaction's knowledge of the log: each topic's newest sequence seen,
    and the sequences seen to be superseded, to delete, by region of the log (:data:`REGION`).
    Events appended are seen as they are committed; those already there when it began (up to
    ``unseen_upto``) are read a chunk at a time. Memory: an entry per topic held (its name
    and an int), 8 bytes per superseded event until it is deleted."""

    def __init__(self, unseen_upto: int) -> None:
        self.latest: dict[bytes, int] = {}
        #: Superseded sequences by region, and the regions that hold some (a heap).
        self.regions: dict[int, array[int]] = {}
        self._order: list[int] = []
        self.waiting = 0
        #: Events up to here were read; those above ``unseen_upto`` are seen as appended.
        self.read_upto = 0
        self.unseen_upto = unseen_upto

    @property
    def reading(self) -> bool:
        """Some events that were there before it began are not read yet."""
        return self.read_upto < self.unseen_upto

    def _superseded(self, sequence: int) -> None:
        region = sequence // REGION
        held = self.regions.get(region)
        if held is None:
            held = self.regions[region] = array("q")
            heappush(self._order, region)
        held.append(sequence)
        self.waiting += 1

    def see(self, topic: bytes, sequence: int) -> None:
        """An event of ``topic`` is at ``sequence``: one of the two is superseded."""
        previous = self.latest.get(topic)
        if previous is None or previous < sequence:
            self.latest[topic] = sequence
            if previous is not None:
                self._superseded(previous)
        else:
            self._superseded(sequence)

    def appended(self, first: int, fields: Sequence[EventFields]) -> None:
        """Events appended under ``first`` and the next sequences: each the newest of its topic."""
        latest = self.latest
        for sequence, event in enumerate(fields, first):
            previous = latest.get(event[0])
            latest[event[0]] = sequence
            if previous is not None:
                self._superseded(previous)

    def take(self, most: int) -> list[int]:
        """The superseded sequences of the lowest region that holds some (its lowest ``most``
        when it holds more), in order, handed out to be deleted; none when none wait. A step
        takes a region at a time as it goes: taking its whole chunk first, a step that its
        budget stopped early gave most of it back, twice the work for nothing (0.13 ms a
        step, ten times that in a spell of the machine)."""
        order, regions = self._order, self.regions
        if not order or most <= 0:
            return []
        part = sorted(regions[order[0]])
        if len(part) <= most:
            del regions[heappop(order)]
        else:  # the region's lowest, the rest kept for the next step
            regions[order[0]] = array("q", part[most:])
            del part[most:]
        self.waiting -= len(part)
        return part

    def give_back(self, sequences: list[int]) -> None:
        """Superseded sequences handed out and not deleted (increasing): to hand out again,
        a region's at a time (a step's budget may leave most of what it took)."""
        start = 0
        while start < len(sequences):
            region = sequences[start] // REGION
            stop = bisect_left(sequences, (region + 1) * REGION, start)
            held = self.regions.get(region)
            if held is None:
                held = self.regions[region] = array("q")
                heappush(self._order, region)
            held.extend(sequences[start:stop])
            self.waiting += stop - start
            start = stop

    def removed_through(self, bound: int, rows: Iterable[tuple[int, bytes]]) -> None:
        """Every event up to ``bound`` was deleted (``rows``: their sequences and topics)."""
        latest = self.latest
        for sequence, topic in rows:
            if latest.get(topic) == sequence:
                del latest[topic]
        self.read_upto = max(self.read_upto, min(bound, self.unseen_upto))
        # Superseded events an age or count step deleted are not handed out: a compaction
        # step would open a write for them and find nothing, and they would wait in memory.
        order, regions = self._order, self.regions
        while order and (order[0] + 1) * REGION - 1 <= bound:
            self.waiting -= len(regions.pop(heappop(order)))
        if order and order[0] * REGION <= bound:
            held = regions[order[0]]
            kept = array("q", (sequence for sequence in held if sequence > bound))
            self.waiting -= len(held) - len(kept)
            if kept:
                regions[order[0]] = kept
            else:
                del regions[heappop(order)]


def _all_in(seqs: bytes, victims: list[int], start: int, stop: int, first: int, last: int) -> bool:
    """Every sequence a batch holds (``seqs``) is one of ``victims[start:stop]``."""
    return set(logbatch.sequences_of(first, last, seqs)) <= set(victims[start:stop])


#: A batch as compaction looks at it: ``(id, first, last, held, seqs)``; or, with id None,
#: the batches inside a run of superseded sequences: ``(None, lowest id, highest id, events,
#: None)``.
_Looked = tuple[int | None, int, int, int, bytes | None]
#: The columns of a batch as compaction looks at it.
_LOOKED_COLUMNS = "id, first, last, held, seqs"


def _run_and_its_ends(db: sqlite3.Connection, low: int, high: int) -> list[_Looked]:
    """What compaction looks at to delete the events from ``low`` to ``high``, every one of
    them superseded: the batch that began before ``low`` and holds some of them, the
    batches that begin among them and end there too (whole victims, their range and their
    events counted in SQLite), and the batch that begins among them and goes on past
    ``high``. Batches do not overlap and each one's id is at most its first sequence, so a
    batch whose id is from ``low`` to ``high`` and which is not the last of them holds only
    sequences of the run."""
    columns = _LOOKED_COLUMNS
    looked: list[_Looked] = []
    before = db.execute(
        f"SELECT {columns} FROM batches WHERE id < ? ORDER BY id DESC LIMIT 1", (low,)
    ).fetchone()
    if before is not None and before[2] >= low:
        looked.append(before)
    after = db.execute(
        f"SELECT {columns} FROM batches WHERE id <= ? ORDER BY id DESC LIMIT 1", (high,)
    ).fetchone()
    inside_to = high
    if after is not None and after[0] >= low and after[2] > high:
        inside_to = after[0] - 1
    else:
        after = None
    count, held = db.execute(
        "SELECT count(*), ifnull(sum(held), 0) FROM batches WHERE id >= ? AND id <= ?",
        (low, inside_to),
    ).fetchone()
    if count:
        looked.append((None, low, inside_to, held, None))
    if after is not None:
        looked.append(after)
    return looked


def _batches_ready(db: sqlite3.Connection) -> int:
    """The log's tables made if need be, and a log of release 0.1.1 or earlier (a row per
    event) moved into batches, its old pages given back: how many events were moved."""
    db.executescript(logbatch.SCHEMA)
    if not logbatch.has_old_rows(db):
        return 0
    moved = 0

    def move() -> None:
        nonlocal moved
        moved = logbatch.migrate(db)

    _write(db, move)
    logbatch.reclaim(db)
    return moved


class EventStore:
    """Append-only event log with sequence-range reads and chunked retention, a row per
    batch of events (:mod:`bus.eventbus.logbatch`)."""

    def __init__(
        self,
        directory: Path | str,
        durability: Durability = "normal",
        wal_limit: int | None = DEFAULT_WAL_LIMIT,
        secure_delete: bool = False,
    ) -> None:
        self.directory = Path(directory)
        #: Freed pages zeroed (``secure_delete=ON``) rather than left as they are (``FAST``).
        self.secure_delete = secure_delete
        self.path = self.directory / DB_NAME
        self._durability: Durability = durability
        #: The WAL file's bound (bytes; None: none): see :class:`bus.util.sqlitewal.Checkpointer`.
        self.wal_limit = wal_limit or None
        self._db = open_wal(self.path, durability)
        self._checkpointer = Checkpointer(self.path, self.wal_limit)
        #: Events moved from an older release's format at this open (0: none).
        self.migrated = 0
        try:
            self._open()
        except sqlite3.Error as error:
            self._db.close()
            raise StorageError(error) from error
        except StorageError:
            self._db.close()
            raise
        #: Events held, once counted (count retention needs it): None until then.
        self._held: int | None = None
        #: While counting: the batches up to this id were counted, and how many events they hold.
        self._counted_upto = 0
        self._counted = 0
        #: What latest-per-topic compaction knows, from its first step on (None before).
        self._superseded: _Superseded | None = None
        self._closed = False

    def _open(self) -> None:
        db = self._db
        # Deleted batches' pages go to the free list as they are. A build with
        # SQLITE_SECURE_DELETE (Debian's) zeroes every page a deleted row held and writes it
        # again, to the WAL and then the database: for a batch of 50 events, a dozen pages
        # written twice to free them, most of what removing an event cost and of a
        # retention step's commit (bench/README.md, "Retention steps in slow spells"). Where
        # removed events must leave no bytes behind, the operator asks for that cost.
        db.execute(f"PRAGMA secure_delete={'ON' if self.secure_delete else 'FAST'}")
        self.migrated = _batches_ready(db)
        self.store_id = self._meta("store_id") or self._init_store_id()
        newest = db.execute(
            "SELECT last, received FROM batches ORDER BY id DESC LIMIT 1"
        ).fetchone()
        top, received = (0, 0.0) if newest is None else (int(newest[0]), float(newest[1]))
        self._last_received = received
        #: The last sequence as ``meta`` keeps it (committed), so that it is written once.
        self._high_water_kept = int(self._meta("high_water") or 0)
        self._last = max(top, self._high_water_kept)

    # -- meta ----------------------------------------------------------------------------

    def _meta(self, key: str) -> str | None:
        row = self._db.execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
        return None if row is None else str(row[0])

    def _put_meta(self, key: str, value: object) -> None:
        """Inside the caller's transaction: ``value`` under ``key``."""
        self._db.execute(
            "INSERT INTO meta VALUES (?, ?) ON CONFLICT(key) DO UPDATE SET value = excluded.value",
            (key, value),
        )

    def _init_store_id(self) -> str:
        store_id = str(uuid.uuid4())
        self._db.execute("INSERT INTO meta VALUES ('store_id', ?)", (store_id,))
        return store_id

    # -- writing -------------------------------------------------------------------------

    @property
    def last_sequence(self) -> int:
        """The highest sequence ever committed (survives restarts and retention)."""
        return self._last

    def append(self, events: Sequence[Event], received: float) -> list[Event]:
        """Assign the next sequences to ``events`` (whose own sequence is ignored), commit
        them in one transaction, and return them with their sequences."""
        fields = [(e.topic, e.producer, e.timestamp, e.uuid, e.data) for e in events]
        first = self.append_fields(fields, received)
        return [Event(t, seq, p, ts, u, d) for seq, (t, p, ts, u, d) in enumerate(fields, first)]

    def append_fields(self, fields: Sequence[EventFields], received: float) -> int:
        """Commit ``(topic, producer, timestamp, uuid, data)`` tuples in one transaction
        under consecutive new sequences; return the first one."""
        first = self._last + 1
        if not fields:
            return first
        # Receipt times never go backwards, so age retention can cut by sequence.
        received = max(received, self._last_received)
        self._insert(logbatch.consecutive_rows(first, fields, received))
        self._last = first + len(fields) - 1
        self._last_received = received
        if self._held is not None:
            self._held += len(fields)
        if self._superseded is not None:
            self._superseded.appended(first, fields)
        return first

    def _insert(self, rows: list[logbatch.Stored]) -> None:
        db = self._db
        if len(rows) == 1:
            row = rows[0]
            _write(db, lambda: db.execute(logbatch.INSERT, row))
        else:
            _write(db, lambda: db.executemany(logbatch.INSERT, rows))

    def append_at(self, events: Sequence[tuple[int, EventFields]], received: float) -> None:
        """Commit events under the sequences given (a pair's passive copies its active's
        log): each above the last one held, in increasing order. Nothing is written
        when they are not."""
        if not events:
            return
        previous = self._last
        for sequence, _ in events:
            if sequence <= previous:
                raise ValueError(f"sequence {sequence} does not follow {previous}")
            previous = sequence
        received = max(received, self._last_received)
        self._insert(logbatch.numbered_rows(events, received))
        self._last = previous
        self._last_received = received
        if self._held is not None:
            self._held += len(events)
        if self._superseded is not None:
            for sequence, fields in events:
                self._superseded.see(fields[0], sequence)

    def truncate_after(self, sequence: int) -> int:
        """Delete every event above ``sequence`` and make it the last one: a server that
        rejoins its pair drops the tail its new active never had. Returns how many."""
        if sequence >= self._last:
            return 0
        db = self._db
        deleted = 0

        def truncate() -> None:
            nonlocal deleted
            after = db.execute(
                "SELECT COALESCE(SUM(held), 0) FROM batches WHERE id > ?", (sequence,)
            ).fetchone()[0]
            db.execute("DELETE FROM batches WHERE id > ?", (sequence,))
            straddling = self._rewrite_straddling(sequence, lambda s: s <= sequence)
            deleted = int(after) + len(straddling)
            self._put_meta("high_water", sequence)

        _write(db, truncate)
        self._last = self._high_water_kept = sequence
        self._removed(deleted)  # a batch counted already may have lost some: counted again
        if self._superseded is not None:  # what it saw above is gone: read the log again
            self._superseded = _Superseded(sequence)
        newest = db.execute("SELECT received FROM batches ORDER BY id DESC LIMIT 1").fetchone()
        self._last_received = 0.0 if newest is None else float(newest[0])
        return deleted

    def _rewrite_straddling(
        self, bound: int, keep: Callable[[int], bool]
    ) -> list[tuple[int, bytes]]:
        """Inside a transaction: the batch holding sequences on both sides of ``bound`` (if
        any) keeps the events ``keep`` accepts; the ``(sequence, topic)`` of those it lost."""
        stored = self._db.execute(
            f"SELECT {logbatch.REWRITTEN} FROM batches WHERE id <= ? AND last > ? "
            "ORDER BY id DESC LIMIT 1",
            (bound, bound),
        ).fetchone()
        return [] if stored is None else logbatch.rewrite(self._db, stored, keep)

    def skip_to(self, sequence: int) -> None:
        """Make ``sequence`` the last one assigned without an event: the next event gets
        the one after (a new active in an async pair steps over what it may have missed)."""
        if sequence <= self._last:
            return
        previous, self._last = self._last, sequence
        try:
            _write(self._db, self._save_high_water)
        except StorageError:
            self._last = previous
            raise
        self._high_water_kept = sequence

    def adopt_store_id(self, store_id: str) -> None:
        """Take another log's identity: only for an empty log (a new passive)."""
        if self.count():
            raise ValueError("a log holding events keeps its identity")
        db = self._db

        _write(db, lambda: self._put_meta("store_id", store_id))
        self.store_id = store_id

    def meta(self, key: str) -> str | None:
        """A value kept beside the log (e.g. the pair's term)."""
        return self._meta(key)

    def set_meta(self, key: str, value: str) -> None:
        """Keep ``value`` under ``key`` beside the log, committed at once."""
        _write(self._db, lambda: self._put_meta(key, value))

    # -- reading -------------------------------------------------------------------------

    def ids_present(self, after: int, ids: Iterable[bytes]) -> set[bytes]:
        """Which of ``ids`` (event UUIDs) the log holds above sequence ``after``."""
        wanted = set(ids)
        found: set[bytes] = set()
        if not wanted:
            return found
        for _sequence, fields in logbatch.events_from(self._db, after):
            if fields[3] in wanted:
                found.add(fields[3])
        return found

    def event_ids(self, sequences: Iterable[int]) -> dict[int, bytes]:
        """The UUIDs of the events held at ``sequences`` (missing ones left out)."""
        found: dict[int, bytes] = {}
        held: dict[int, bytes] = {}
        last = -1
        for sequence in sorted(set(sequences)):
            if sequence > last:  # the batch that would hold it, read whole
                stored = self._db.execute(
                    "SELECT first, last, seqs, events FROM batches WHERE id <= ? "
                    "ORDER BY id DESC LIMIT 1",
                    (sequence,),
                ).fetchone()
                if stored is None:
                    continue
                first, last, seqs, packed = stored
                held = {
                    number: fields[3]
                    for number, fields in logbatch.events_of(first, last, seqs, packed)
                }
            if sequence in held:
                found[sequence] = held[sequence]
        return found

    def read(
        self,
        after: int,
        upto: int | None = None,
        prefixes: Iterable[bytes] = (),
        limit: int = 1000,
    ) -> list[Event]:
        """Events with ``after < seq <= upto`` whose topic starts with one of ``prefixes``
        (all topics when empty), in sequence order, at most ``limit`` of them."""
        return [Event(t, s, p, ts, u, d) for s, t, p, ts, u, d in self.read_rows(
            after, upto, prefixes, limit, scan=None
        )]  # fmt: skip

    def read_rows(
        self,
        after: int,
        upto: int | None = None,
        prefixes: Iterable[bytes] = (),
        limit: int = 1000,
        scan: int | None = SCAN_EVENTS,
    ) -> logbatch.Rows:
        """:meth:`read` as plain rows ``(seq, topic, producer, timestamp, uuid, data)``: for
        the snapshot's hot path, which turns them into messages without an Event each. A
        read under prefixes looks at about ``scan`` events at most (None: no bound), and
        then says where it stopped (:attr:`bus.eventbus.logbatch.Rows.scanned`)."""
        return logbatch.read_rows(
            self._db, after, upto, prefixes, limit, max(scan, limit) if scan else None
        )

    def count(self) -> int:
        """Events held now (kept in memory once count retention counted them)."""
        if self._held is not None:
            return self._held
        return int(self._db.execute("SELECT COALESCE(SUM(held), 0) FROM batches").fetchone()[0])

    def first_sequence(self) -> int | None:
        """The lowest sequence still held; None when the log is empty."""
        row = self._db.execute("SELECT first FROM batches ORDER BY id LIMIT 1").fetchone()
        return None if row is None else int(row[0])

    def size(self) -> int:
        """Bytes on disk: the database and its write-ahead log."""
        total = 0
        for path in (self.path, self.path.with_name(self.path.name + "-wal")):
            with contextlib.suppress(FileNotFoundError):
                total += path.stat().st_size
        return total

    # -- retention -----------------------------------------------------------------------

    def _delete_through(self, bound: int, held: int, cut: bool) -> int:
        """Delete every event with ``seq <= bound``, ``held`` of them (:meth:`_oldest` found
        them, and nothing wrote since), the last batch cut through when ``cut`` (written
        again with the events above the bound); one transaction."""
        db = self._db
        tracked = self._superseded
        gone: list[tuple[int, bytes]] = []

        def delete() -> None:
            self._save_high_water()
            whole = "FROM batches WHERE id <= ? AND last <= ?"
            if tracked is not None and tracked.latest:  # compaction forgets their topics
                for first, last, seqs, packed in db.execute(
                    f"SELECT first, last, seqs, events {whole}", (bound, bound)
                ):
                    gone.extend(
                        (sequence, fields[0])
                        for sequence, fields in logbatch.events_of(first, last, seqs, packed)
                    )
            db.execute(f"DELETE {whole}", (bound, bound))
            if cut:
                gone.extend(self._rewrite_straddling(bound, lambda sequence: sequence > bound))

        _write(db, delete)
        self._high_water_kept = self._last
        self._removed(held, upto=bound)
        if tracked is not None:
            tracked.removed_through(bound, gone)
        return held

    def _removed(self, deleted: int, *, upto: int | None = None) -> None:
        """Keep the count of events held: ``deleted`` of them are gone (all in batches whose
        id is at or below ``upto``, when given). A count under way stays right when they
        all lay in batches it counted already, and starts over otherwise."""
        if self._held is not None:
            self._held -= deleted
        elif deleted and (upto is None or upto > self._counted_upto):
            self._counted_upto = self._counted = 0
        elif deleted:
            self._counted -= deleted

    def _save_high_water(self) -> None:
        """Inside the caller's transaction: the last sequence kept in ``meta``, unless a
        commit already kept it (an age or count step's parts save it once)."""
        if self._last != self._high_water_kept:
            self._put_meta("high_water", self._last)

    def expire_older_than(
        self, cutoff: float, chunk: int = 5000, out_of_time: Callable[[], bool] | None = None
    ) -> int:
        """Delete up to ``chunk`` of the oldest events, those received before ``cutoff``
        (epoch seconds), in parts (:meth:`_delete_oldest`). Receipt times never go backwards:
        they are the oldest events."""
        return self._delete_oldest(chunk, out_of_time, cutoff=cutoff)

    def trim_to_count(
        self, max_count: int, chunk: int = 5000, out_of_time: Callable[[], bool] | None = None
    ) -> tuple[int, bool]:
        """Delete up to ``chunk`` of the oldest events beyond the newest ``max_count``, in
        parts (:meth:`_delete_oldest`).

        Returns (deleted, finished): finished once no more than ``max_count`` are held. The
        first calls after the store opened count the events held, the batches of ``chunk``
        times :data:`COUNTED_PER_DELETED` sequences a call (in parts too), deleting nothing
        meanwhile."""
        if self._held is None:
            self._count_some(chunk * COUNTED_PER_DELETED, out_of_time)
            return 0, False
        excess = self._held - max_count
        if excess <= 0:
            return 0, True
        deleted = self._delete_oldest(min(excess, chunk), out_of_time, keep=max_count)
        return deleted, deleted >= excess

    def _delete_oldest(
        self,
        most: int,
        out_of_time: Callable[[], bool] | None,
        cutoff: float | None = None,
        keep: int | None = None,
    ) -> int:
        """Delete up to ``most`` of the oldest events (with ``cutoff``, only those received
        before it; with ``keep``, never one of the newest ``keep``: count retention) in parts
        of ``most`` / :data:`PARTS_PER_STEP` (:data:`PART_EVENTS` at least), each its own
        transaction (:meth:`_delete_through`), and stop after a part once ``out_of_time`` says
        so. A part that fails after others ends the step with what they deleted (each part is
        whole and counted, and the next step meets the failure again); the first one raises,
        having changed nothing. With ``keep``, a part that finds fewer events than the count says
        (someone else deleted some) deletes nothing and starts the count over."""
        part = max(PART_EVENTS, most // PARTS_PER_STEP)
        deleted = 0
        while deleted < most:
            wanted = min(part, most - deleted)
            bound, found, cut = self._oldest(wanted, cutoff, most - deleted)
            if bound is None:
                break
            # Each sequence holds one event at most: fewer sequences above the bound than the
            # events to keep means the count of events held is wrong.
            if keep is not None and (found < wanted or self._last - bound < keep):
                self._held = None
                self._counted_upto = self._counted = 0
                break
            try:
                deleted += self._delete_through(bound, found, cut)
            except StorageError:
                if not deleted:
                    raise
                break
            if out_of_time is not None and out_of_time():
                break
        return deleted

    def _oldest(
        self, size: int, cutoff: float | None = None, most: int | None = None
    ) -> tuple[int | None, int, bool]:
        """The sequence at or below which lie the ``size`` oldest events (or, with
        ``cutoff``, those of them received before it), how many there are, and whether the
        bound cuts a batch; None when there are none. With ``most``, the bound is the end of
        the batch that ``size`` ends in, as long as that stays within ``most`` events (a
        batch is then deleted whole, not written again with its rest). It reads the oldest
        batches' numbers (``size`` / the events a batch holds), not their events."""
        bound: int | None = None
        found = 0
        most = size if most is None else most
        cursor = self._db.execute(
            "SELECT first, last, held, received, seqs FROM batches ORDER BY id"
        )
        try:
            for first, last, held, received, seqs in cursor:
                if cutoff is not None and received >= cutoff:
                    break
                if found + held > most:
                    return logbatch.sequence_at(first, last, seqs, size - found - 1), size, True
                found += held
                bound = last
                if found >= size:
                    break
        finally:
            cursor.close()
        return bound, found, False

    def _count_some(self, sequences: int, out_of_time: Callable[[], bool] | None = None) -> None:
        """Count the events of the batches of the next ``sequences`` sequences, in parts of
        a :data:`PARTS_PER_STEP`-th, stopping after one once ``out_of_time`` says so; once
        the count reaches the last sequence, it is the number of events held, kept from then
        on."""
        top = self._last
        if not self._counted_upto:  # the oldest batch first, then on from its last sequence
            oldest = self._db.execute(
                "SELECT last, held FROM batches ORDER BY id LIMIT 1"
            ).fetchone()
            self._counted_upto, self._counted = (top, 0) if oldest is None else oldest
            sequences -= 1
        end = min(self._counted_upto + sequences, top)
        part = max(1, sequences // PARTS_PER_STEP)
        while self._counted_upto < end:
            upto = min(self._counted_upto + part, end)
            self._counted += int(
                self._db.execute(
                    "SELECT COALESCE(SUM(held), 0) FROM batches WHERE id > ? AND id <= ?",
                    (self._counted_upto, upto),
                ).fetchone()[0]
            )
            self._counted_upto = upto
            if out_of_time is not None and out_of_time():
                break
        if self._counted_upto >= top:
            self._held = self._counted

    @property
    def compaction_reading(self) -> bool:
        """Compaction's next step reads events that were in the log before it began."""
        tracked = self._superseded
        return tracked is None or tracked.reading

    def compact_step(
        self, chunk: int = 5000, out_of_time: Callable[[], bool] | None = None
    ) -> tuple[int, bool]:
        """Latest-value-per-topic compaction, a step: read the topics of up to ``chunk``
        times :data:`SCANNED_PER_DELETED` events that were in the log before compaction's
        first step (after each open, one pass reads them all), or delete up to ``chunk``
        superseded events. With ``out_of_time``, the step stops early once it says so
        (asked every :data:`READ_BETWEEN_CHECKS` events read, or after each batch written
        again and each region of the log deleted from; a step does one at least).

        Returns (deleted, finished): finished once every superseded event seen is deleted."""
        tracked = self._superseded
        if tracked is None:
            tracked = self._superseded = _Superseded(self._last)
        if tracked.reading:
            limit = chunk * SCANNED_PER_DELETED
            events = logbatch.topics_from(self._db, tracked.read_upto, tracked.unseen_upto)
            for read, (sequence, topic) in enumerate(events, 1):
                tracked.see(topic, sequence)
                if read == limit or (
                    out_of_time is not None and not read % READ_BETWEEN_CHECKS and out_of_time()
                ):
                    events.close()
                    tracked.read_upto = sequence
                    return 0, False
            tracked.read_upto = tracked.unseen_upto
            return 0, False
        victims: list[int] = []

        def take_more() -> bool:  # up to a chunk of victims, a region at a time
            region = tracked.take(chunk - len(victims))
            victims.extend(region)
            return bool(region)

        if not take_more():
            return 0, True
        try:
            deleted, left = self._delete_sequences(victims, chunk, out_of_time, take_more)
        except StorageError:
            tracked.give_back(victims)  # nothing was deleted: the next pass tries them again
            raise
        tracked.give_back(left)
        return deleted, not tracked.waiting

    def _delete_sequences(
        self,
        sequences: list[int],
        work: int | None = None,
        out_of_time: Callable[[], bool] | None = None,
        take_more: Callable[[], bool] | None = None,
    ) -> tuple[int, list[int]]:
        """Delete the events at ``sequences`` (increasing; some may be gone already): a batch
        that holds only them is deleted, one that holds others too is written again without
        them. With ``work``, batches are written again only until their events come to it
        (one at least): how long a step takes follows its work, where the victims alone say
        little (one in each of many batches costs a batch each). With ``out_of_time``, the
        work goes in parts of a :data:`PARTS_PER_STEP`-th (:data:`PART_EVENTS` at least), each
        its own transaction, as an age or count step's, and it stops after a part, a batch
        written again or a region of the log (:data:`REGION`), once that says so. A part that
        fails after others ends it with what they deleted; the first one raises, having
        changed nothing. Once it went through ``sequences``, ``take_more()`` may add more to
        them (False: none). Returns how many events were deleted, and the sequences left for
        later."""
        part = None
        if out_of_time is not None and work is not None:
            part = max(PART_EVENTS, work // PARTS_PER_STEP)
        deleted = spent = done = 0
        while done < len(sequences) or (take_more is not None and take_more()):
            try:
                removed, worked, upto, more = self._delete_part(
                    sequences, done, work, spent, part, out_of_time, take_more
                )
            except StorageError:
                if not deleted:
                    raise
                break
            if upto == done:
                break
            deleted += removed
            spent += worked
            self._removed(removed, upto=sequences[upto - 1])
            done = upto
            if not more or (out_of_time is not None and out_of_time()):
                break
        return deleted, sequences[done:]

    def _delete_part(
        self,
        sequences: list[int],
        done: int,
        work: int | None,
        spent_before: int,
        part: int | None,
        out_of_time: Callable[[], bool] | None,
        take_more: Callable[[], bool] | None = None,
    ) -> tuple[int, int, int, bool]:
        """One transaction of :meth:`_delete_sequences`, from ``sequences[done]``, reading the
        batches a region of the log at a time: until the batches it wrote again held ``part``
        events, those it deleted whole counting a :data:`WHOLE_PER_REWRITTEN`-th (all of them
        when None), or the step's ``work`` is spent (``spent_before`` by the parts before: a
        batch written again at least when none), or ``out_of_time`` says so (asked after each
        batch written again and at a region's end). A region's victims that are next to each
        other (:data:`RUN_EVENTS` at least) go by range, only the batches at their ends read
        (:func:`_run_and_its_ends`): the run counts as whole batches do, and a part ends after
        the run that fills it (a region's at most: :data:`REGION` events counting a
        :data:`WHOLE_PER_REWRITTEN`-th).
        Returns the events deleted, the work done, the index in ``sequences`` it got to, and
        whether more may follow (False once the step's work is spent)."""
        db = self._db
        deleted = spent = 0
        reached = done
        more = True
        #: Runs of batches next to each other that go whole, deleted by range.
        whole_runs: list[list[int]] = []
        #: Of ``spent``, the events of batches deleted whole.
        whole = 0

        def flush() -> None:
            # Before each look at the budget, so that it sees what the deletes cost: left to
            # the commit, a part's thousand rows of batches of two went on past it (3-4 ms in
            # the machine's slow spells). Asked after each batch written again, mostly with
            # nothing to delete: no statement then.
            if whole_runs:
                db.executemany("DELETE FROM batches WHERE id >= ? AND id <= ?", whole_runs)
                whole_runs.clear()

        def delete() -> None:
            nonlocal deleted, spent, reached, more, whole
            self._save_high_water()
            while reached < len(sequences) or (take_more is not None and take_more()):
                # The batches of the next region's victims, read in one go: the victims of a
                # step lie in few regions (_Superseded.take), often in batches of only them.
                region_end = sequences[reached] // REGION * REGION + REGION - 1
                end = bisect_right(sequences, region_end, reached)
                low, high = sequences[reached], sequences[end - 1]
                if end - reached >= RUN_EVENTS and high - low == end - 1 - reached:
                    near = _run_and_its_ends(db, low, high)
                else:
                    cursor = logbatch.batches_from(db, low - 1, high, _LOOKED_COLUMNS)
                    near = cursor.fetchall()
                    cursor.close()
                following = False  # the last batch looked at went whole
                for batch, first, last, held, seqs in near:
                    if batch is None:  # the batches inside a run: whole, counted, not read
                        whole_runs.append([first, last])
                        following = False
                        deleted += held
                        spent += held
                        whole += held
                        reached = bisect_right(sequences, last, reached, end)
                        if part is not None and (
                            spent - whole + whole // WHOLE_PER_REWRITTEN >= part
                        ):
                            return
                        continue
                    start = bisect_left(sequences, first, reached, end)
                    stop = bisect_right(sequences, last, start, end)
                    if start == stop:
                        following = False
                        continue
                    if stop - start == held and (
                        seqs is None or _all_in(seqs, sequences, start, stop, first, last)
                    ):
                        if following:
                            whole_runs[-1][1] = batch
                        else:
                            whole_runs.append([batch, batch])
                        following = True
                        deleted += held
                        spent += held
                        whole += held
                    else:
                        following = False
                        spent_so_far = spent_before + spent
                        if work is not None and spent_so_far and spent_so_far + held > work:
                            more = False
                            return
                        (packed,) = db.execute(
                            "SELECT events FROM batches WHERE id = ?", (batch,)
                        ).fetchone()
                        row = (batch, first, last, seqs, packed)
                        deleted += logbatch.drop(db, row, frozenset(sequences[start:stop]))
                        spent += held
                        reached = stop
                        # A region may hold several batches to write again (0.3 ms or more),
                        # ten times as long in a spell of the machine: the budget is asked
                        # after each one.
                        if out_of_time is not None:
                            flush()
                            if out_of_time():
                                return
                    reached = stop
                    if part is not None and (spent - whole + whole // WHOLE_PER_REWRITTEN >= part):
                        return  # a part may end inside a region: the next reads the rest
                reached = end
                if out_of_time is not None:
                    flush()
                    if out_of_time():
                        return

        def delete_and_flush() -> None:
            delete()
            flush()

        _write(db, delete_and_flush)
        self._high_water_kept = self._last
        return deleted, spent, reached, more

    # -- lifecycle -----------------------------------------------------------------------

    def checkpoint(self) -> tuple[int, int]:
        """Copy committed WAL pages into the database without blocking the writer
        (PASSIVE, on a connection of its own) and, once the WAL holds more than
        :attr:`wal_limit`, start it over (RESTART: appends wait while it copies the last
        frames). Safe to call from one worker thread while the owner appends. Returns
        (pages in the WAL, pages checkpointed).

        A checkpoint that cannot write (the database file cannot grow on a full disk)
        raises :class:`StorageError`; the WAL keeps every commit, so nothing is lost."""
        return self._checkpointer.run()

    def wal_status(self) -> WalStatus:
        """The WAL's size and what the checkpoints did (restarts, the longest hold)."""
        return self._checkpointer.status()

    def set_aside(self, store_id: str) -> EventStore:
        """Close this log, rename its files ``events.sqlite3.replaced-<store id>*`` (kept
        for the operator: :attr:`path` names them after) and return a new, empty log in
        the same directory under ``store_id`` (a passive of another bus's log)."""
        self.close()
        aside = f"{DB_NAME}.replaced-{self.store_id}"
        try:
            for suffix in ("", "-wal", "-shm"):
                path = self.directory / f"{DB_NAME}{suffix}"
                if path.exists():
                    path.rename(self.directory / f"{aside}{suffix}")
        except OSError as error:
            raise StorageError(error) from error
        self.path = self.directory / aside
        fresh = EventStore(self.directory, self._durability, self.wal_limit, self.secure_delete)
        fresh.adopt_store_id(store_id)
        return fresh

    def close(self, checkpoint_running: bool = False) -> None:
        """Close, after a last checkpoint that empties the WAL.

        While a checkpoint() runs (or the caller says one will, ``checkpoint_running``)
        its connection is left to it and the final checkpoint is skipped (it would wait
        for the running one).

        The connection is closed in every case. A final checkpoint that fails (a full
        disk) raises :class:`StorageError` after that: the WAL keeps every commit and
        the next open reads it, so nothing is lost."""
        if self._closed:
            return
        self._closed = True
        try:
            if self._checkpointer.close() and not checkpoint_running:
                final_checkpoint(self._db)
        finally:
            self._db.close()


class LogExport:
    """A log read whole by a process that has it alone (``eventbus-cli import-log``): no
    server may have it open (:class:`bus.util.sqlitewal.InUse` says so at once), and none
    can open it while this is open. Nothing is written, except that a log of an older
    release is moved to this release's rows first, as a server's open would."""

    def __init__(self, directory: Path | str) -> None:
        self.directory = Path(directory)
        self.path = self.directory / DB_NAME
        self._db = open_exclusive(self.path)
        db = self._db
        try:
            tables = {row[0] for row in db.execute("SELECT name FROM sqlite_master")}
            if "meta" not in tables or not tables & {"events", "batches"}:
                raise StorageError(sqlite3.DatabaseError(f"{self.path} is not an Event BUS log"))
            _batches_ready(db)
            #: The log's identity, as its server named it to clients.
            self.store_id = self._meta("store_id") or ""
            ends = db.execute("SELECT MIN(first), MAX(last) FROM batches").fetchone()
            #: The highest sequence ever assigned (retention and a pair's skips included).
            self.last_sequence = max(int(ends[1] or 0), int(self._meta("high_water") or 0))
            #: The lowest sequence held; None when the log holds no event.
            self.first_sequence: int | None = None if ends[0] is None else int(ends[0])
            #: Events held.
            self.count = int(db.execute("SELECT COALESCE(SUM(held), 0) FROM batches").fetchone()[0])
        except sqlite3.Error as error:
            db.close()
            raise StorageError(sqlite3.DatabaseError(f"{self.path}: {error}")) from error
        except StorageError:
            db.close()
            raise

    def _meta(self, key: str) -> str | None:
        row = self._db.execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
        return None if row is None else str(row[0])

    def rows(self, after: int, limit: int = 5000) -> list[Row]:
        """At most ``limit`` events above ``after``, in order: ``(seq, topic, producer,
        timestamp, uuid, data)``."""
        return logbatch.read_rows(self._db, after, None, (), limit)

    def count_between(self, after: int, upto: int) -> int:
        """Events held with ``after < seq <= upto``."""
        counted = 0
        cursor = logbatch.batches_from(self._db, after, upto, "first, last, held, seqs")
        try:
            for first, last, held, seqs in cursor:
                if first > after and last <= upto:
                    counted += held
                else:
                    numbers = logbatch.sequences_of(first, last, seqs)
                    counted += sum(1 for sequence in numbers if after < sequence <= upto)
        finally:
            cursor.close()
        return counted

    def _events(self) -> Iterator[tuple[int, EventFields]]:
        return logbatch.events_from(self._db, 0)

    def repeats(self) -> set[int]:
        """The sequences of events whose uuid an earlier event of the log holds (SQLite
        keeps every copy a publisher sent; a server that resends keeps one)."""
        db = self._db  # the ids go through a temporary table: a log may not fit in memory
        db.execute("CREATE TEMP TABLE IF NOT EXISTS ids (seq INTEGER PRIMARY KEY, uuid BLOB)")
        db.execute("DELETE FROM temp.ids")
        db.executemany(
            "INSERT INTO temp.ids VALUES (?, ?)",
            ((sequence, fields[3]) for sequence, fields in self._events()),
        )
        rows = db.execute(
            "SELECT ids.seq FROM temp.ids AS ids JOIN (SELECT uuid, MIN(seq) AS first "
            "FROM temp.ids GROUP BY uuid HAVING COUNT(*) > 1) AS repeated "
            "ON ids.uuid = repeated.uuid WHERE ids.seq > repeated.first"
        )
        found = {int(seq) for (seq,) in rows}
        db.execute("DROP TABLE temp.ids")
        return found

    def largest(self) -> tuple[int, int]:
        """The sequence and size (producer, timestamp, uuid and data) of the largest
        event; ``(0, 0)`` for an empty log."""
        best = (0, 0)
        for sequence, (_topic, producer, timestamp, event_id, data) in self._events():
            size = len(producer) + len(timestamp) + len(event_id) + len(data)
            if size > best[1]:
                best = (sequence, size)
        return best

    def topics_longer_than(self, length: int) -> list[bytes]:
        """The distinct topics of more than ``length`` bytes."""
        return sorted({fields[0] for _, fields in self._events() if len(fields[0]) > length})

    def received_between(self) -> tuple[float, float] | None:
        """When the oldest and the newest events held were received (epoch seconds)."""
        oldest = self._db.execute("SELECT received FROM batches ORDER BY id LIMIT 1").fetchone()
        if oldest is None:
            return None
        newest = self._db.execute("SELECT received FROM batches ORDER BY id DESC LIMIT 1")
        return float(oldest[0]), float(newest.fetchone()[0])

    def close(self) -> None:
        """Close the log (and its lock)."""
        self._db.close()
