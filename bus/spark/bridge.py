"""The Spark bridge: a Twisted service that journals a bus's PUB feed for PySpark.

It subscribes to everything (a full-feed :class:`bus.eventbus.client.EventBusSubscriber`,
so every sequence jump and every heartbeat ahead of it is a gap, healed at once by a
SYNCSTART from the last sequence held) and appends to a :class:`JournalWriter` in
strictly increasing sequence. Disk work (Parquet encoding, fsync, renames, retention)
runs on one worker thread, never on the reactor; one thread keeps the order.

After a restart it resumes above the journal's last written sequence: whatever was
buffered but not yet in a segment is simply fetched again from the bus's log. When the
bus no longer has a range (its retention removed it) the healed feed jumps, and the
bridge records that range as a known gap before going on, so the journal never holds a
hole it does not know about.

The journal belongs to one bus log: ``bridge.json`` keeps that log's store id, and a
bus answering with another store id is refused (its sequences mean other events).

A journal that cannot be written (a full disk, an I/O error) pauses the bridge rather
than stopping it: what the writer did not take stays in memory (reading the bus is
paused, so that is bounded; whatever the bus sends meanwhile is healed from its log),
one rate-limited error line says so, and the write is retried with backoff until it
succeeds; then the bridge reads the bus again and catches up by itself.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from typing import Any

from twisted.application.service import Service
from twisted.internet import defer
from twisted.internet.threads import deferToThreadPool
from twisted.logger import Logger

from bus.eventbus.codec import Event
from bus.extension import Metric, StartupError, counter, gauge
from bus.spark.config import BridgeConfig
from bus.spark.journal import JournalError, JournalWriter
from bus.util.droplog import RateLimit
from bus.util.files import replace_atomically
from bus.util.periodic import Periodic
from bus.util.workers import worker_pool

log = Logger(namespace="bus.spark.bridge")

BRIDGE_STATE = "bridge.json"

# ("events", (received_at, [Event, ...])): a run of consecutive events to append, or
# ("gap", (first, last)): a range the bus no longer has.
_Item = tuple[str, Any]


class StoreMismatch(Exception):
    """The bus serves another log than the one this journal was written from."""


class SparkBridgeService(Service):
    """Journals the PUB feed of the bus at ``servers`` (the first that answers; a callable when they
    are known only at start, as the local bus's are) into ``config``'s journal, without a gap it has
    not recorded."""

    name = "spark-bridge"

    def __init__(
        self,
        servers: Sequence[str] | Callable[[], Sequence[str]],
        config: BridgeConfig,
        reactor: Any = None,
        curve: Any = None,
    ) -> None:
        """``curve``: a ClientCurve, or a callable giving one (or None) at start: the bus
        speaks CURVE."""
        from bus.extension import reactor_of

        self._servers = servers
        self._curve = curve
        self.config = config
        self.reactor: Any = reactor_of(reactor)
        self.writer: JournalWriter | None = None
        self.subscriber: Any = None
        self.journaled = 0
        self.gaps_recorded = 0
        #: Highest sequence the writer has taken into the journal (segments roll after).
        self.handed_to_journal = 0
        self.failed: Exception | None = None
        # A daemon: a bridge never stopped must not keep the process from exiting (a write
        # cut short is a crash the journal already recovers from).
        self._pool = worker_pool("spark-bridge-writer")
        self._pending: list[_Item] = []
        self._pending_events = 0
        self._last = self._start = 0
        self._writing: defer.Deferred[None] | None = None
        self._periodic = Periodic(self.reactor, log)
        self._store_id: str | None = None
        self._state_saved = True
        self._paused = False
        self._backlogged = False
        #: Failed journal writes (each attempt); the last one's error while it lasts.
        self.journal_errors = 0
        self.journal_error: str | None = None
        self._blocked_since: float | None = None
        self._retry: Any = None
        self._retry_delay = config.storage_retry_min
        self._faults = RateLimit(time.monotonic)

    # -- lifecycle -----------------------------------------------------------------------

    def startService(self) -> None:
        from bus.eventbus.client import EventBusSubscriber

        config = self.config
        try:
            self.writer = JournalWriter(
                config.journal_dir, config.roll_events, config.roll_seconds, fsync=config.fsync
            )
        except (JournalError, OSError) as error:
            raise StartupError("journal-dir", f"cannot open the journal: {error}") from None
        self._store_id = self._read_state().get("store_id")
        self._last = self._start = self.writer.last_sequence() or 0
        self._pool.start()
        servers = self._servers() if callable(self._servers) else self._servers
        self.subscriber = EventBusSubscriber(
            servers,
            [],
            self._on_event,
            since=self._last,
            heartbeat_timeout=config.heartbeat_timeout,
            reactor=self.reactor,
            # The journal belongs to one bus log: know which before taking any event.
            wait_for_heartbeat=True,
            dialect=config.dialect,
            curve=self._curve() if callable(self._curve) else self._curve,
        )
        Service.startService(self)
        self.subscriber.startService()
        # Hand-overs at most 50 ms apart keep received_at and the segment roll close to
        # when events really arrived.
        self._periodic.every(min(config.roll_seconds, 0.05) or 0.05, self._tick)
        if config.retention_max_age is not None or config.retention_max_bytes is not None:
            self._periodic.every(config.retention_interval, self._prune)
        log.info(
            "spark bridge journaling {servers} into {journal} above sequence {since}",
            servers=", ".join(map(str, servers)),
            journal=str(config.journal_dir),
            since=self._last,
        )

    @defer.inlineCallbacks
    def stopService(self) -> Any:
        Service.stopService(self)
        self._periodic.stop_all()
        if self._retry is not None and self._retry.active():
            self._retry.cancel()
        self._retry = None
        if self.subscriber is not None:
            yield self.subscriber.stopService()
        # Everything received goes to disk before the writer closes; when the journal
        # cannot be written, one last attempt and no more (a stop never hangs on a disk).
        if self._writing is not None:
            yield self._writing
        if self._pending or self.journal_blocked:
            self._hand_over(final=True, retry=True)
            if self._writing is not None:
                yield self._writing
        writer, self.writer = self.writer, None
        durable = None
        if writer is not None:
            try:
                yield deferToThreadPool(self.reactor, self._pool, writer.close)
            except OSError as error:
                self._write_failed(error)
            durable = writer.durable_sequence()
        self._pool.stop()
        if self.journal_blocked:
            log.error(
                "spark bridge stopped with the journal {journal} not writable ({error}): "
                "it holds up to sequence {durable}; the {held} events above it are fetched "
                "again from the bus at the next start",
                journal=str(self.config.journal_dir),
                error=self.journal_error,
                durable=durable,
                held=self._last - (durable or 0),
            )
        log.info(
            "spark bridge stopped at sequence {sequence} ({journaled} events journaled)",
            sequence=self._last if durable is None else durable,
            journaled=self.journaled,
        )

    # -- the feed --------------------------------------------------------------------------

    def _on_event(self, event: Event) -> None:
        self._check_store()
        if self.failed is not None:
            return
        sequence = event.sequence
        expected = self._last + 1
        if sequence < expected:
            self._fail(
                StoreMismatch(
                    f"the bus sent sequence {sequence} after {self._last}: it serves another "
                    "log than the one this journal was written from"
                )
            )
            return
        if sequence > expected:
            # The healed feed skipped these: the bus's log no longer has them.
            self._pending.append(("gap", (expected, sequence - 1)))
        pending = self._pending
        if pending and pending[-1][0] == "events":
            pending[-1][1][1].append(event)
        else:
            # A run of events carries when its first one arrived: their received_at.
            pending.append(("events", (time.time(), [event])))
        self._pending_events += 1
        self._last = sequence
        if self._pending_events >= self.config.roll_events:
            self._hand_over()
        if self._pending_events >= self.config.max_pending and not self._backlogged:
            log.warn("journal writer behind by {n} events: pausing", n=self._pending_events)
            self._backlogged = True
            self._update_pause()

    def _check_store(self) -> None:
        seen = self.subscriber.core.store_id if self.subscriber is not None else None
        if self.failed is not None or seen is None or seen == self._store_id:
            return
        if self._store_id is None:
            self._store_id = seen
            self._state_saved = False
            self._save_state()
            return
        self._fail(
            StoreMismatch(f"journal belongs to bus store {self._store_id}, the bus serves {seen}")
        )

    def _fail(self, error: Exception) -> None:
        self.failed = error
        log.error("spark bridge stops journaling: {error}", error=str(error))
        if self.subscriber is not None and self.subscriber.running:
            self.subscriber.stopService()

    def _update_pause(self) -> None:
        """Stop reading the bus while the writer is behind or the journal cannot be
        written; read again once neither holds."""
        paused = self._backlogged or self.journal_blocked
        if paused == self._paused:
            return
        self._paused = paused
        if self.subscriber is None:
            return
        if paused:
            self.subscriber.pause()
        else:
            self.subscriber.resume()

    # -- when the journal cannot be written ------------------------------------------------

    @property
    def journal_blocked(self) -> bool:
        """True from a failed journal write until a write succeeds again."""
        return self._blocked_since is not None

    def _write_failed(self, error: BaseException) -> None:
        """Pause reading, say so (rate-limited), and retry later."""
        self.journal_errors += 1
        self.journal_error = str(error)
        if self._blocked_since is None:
            self._blocked_since = time.monotonic()
        self._update_pause()
        failures = self._faults.due("write")
        if failures is not None:
            writer = self.writer
            log.error(
                "journal {journal} cannot be written ({error}): spark bridge paused with "
                "{held} events held in memory above sequence {durable}; retrying "
                "({failures} failed attempts since the last report)",
                journal=str(self.config.journal_dir),
                error=str(error),
                held=self._pending_events,
                durable=None if writer is None else writer.durable_sequence(),
                failures=failures,
            )
        if self.running and self._retry is None:
            self._retry = self.reactor.callLater(self._retry_delay, self._retry_write)
            self._retry_delay = min(self._retry_delay * 2, self.config.storage_retry_max)

    def _write_recovered(self) -> None:
        assert self._blocked_since is not None
        log.info(
            "journal {journal} is written again after {seconds:.1f}s: spark bridge resumed",
            journal=str(self.config.journal_dir),
            seconds=time.monotonic() - self._blocked_since,
        )
        self._blocked_since = None
        self.journal_error = None
        self._retry_delay = self.config.storage_retry_min
        self._faults.reset("write")
        self._update_pause()

    def _retry_write(self) -> None:
        self._retry = None
        if not self._save_state():
            return
        if self._writing is None:
            self._hand_over(retry=True)

    def _save_state(self) -> bool:
        """Write bridge.json if it is due; False (and a retry) when it cannot be."""
        if self._state_saved or self._store_id is None:
            return True
        try:
            self._write_state({"store_id": self._store_id})
        except OSError as error:
            self._write_failed(error)
            return False
        self._state_saved = True
        return True

    # -- the writer thread ---------------------------------------------------------------------

    def _tick(self) -> None:
        self._check_store()
        if self._writing is None:
            self._hand_over()

    def _hand_over(self, final: bool = False, retry: bool = False) -> None:
        """Give what is pending to the writer thread. While the journal cannot be
        written only the retry timer (or the stop) hands over, ``retry`` set."""
        if self._writing is not None or (self.journal_blocked and not retry):
            return
        batch, self._pending = self._pending, []
        count, self._pending_events = self._pending_events, 0
        writer = self.writer
        if writer is None:
            return
        # After a failed write, what the writer already took goes to disk first.
        flush_first = self.journal_blocked

        def write() -> None:
            if flush_first:
                writer.flush()
            for kind, value in batch:
                if kind == "gap":
                    first, last = value
                    writer.note_gap(first, last, "not in the bus's log any more (bus retention)")
                else:
                    received, events = value
                    writer.append(events, received)
            if final:
                writer.flush()
            else:
                writer.maybe_roll(time.time())

        last_handed = self._last

        def written(_: object) -> None:
            self._writing = None
            self.journaled += count
            self.handed_to_journal = last_handed
            self.gaps_recorded += sum(1 for kind, _ in batch if kind == "gap")
            if self.journal_blocked:
                self._write_recovered()
            if self._backlogged and self._pending_events < self.config.max_pending // 2:
                self._backlogged = False
                self._update_pause()

        def failed(failure: Any) -> None:
            self._writing = None
            error = failure.value
            if not isinstance(error, OSError) or writer is not self.writer:
                self._fail(error)
                return
            # The disk refused: keep what the writer did not take, in front of what
            # arrived meanwhile, and try again later.
            taken = writer.last_sequence() or 0
            kept = _not_taken(batch, taken)
            kept_events = sum(len(value[1]) for kind, value in kept if kind == "events")
            self.journaled += count - kept_events
            self.gaps_recorded += sum(1 for kind, _ in batch if kind == "gap")
            self.gaps_recorded -= sum(1 for kind, _ in kept if kind == "gap")
            self._pending[:0] = kept
            self._pending_events += kept_events
            self._write_failed(error)

        self._writing = deferToThreadPool(self.reactor, self._pool, write)
        self._writing.addCallbacks(written, failed)

    def _prune(self) -> Any:
        writer = self.writer
        if writer is None:
            return None
        config = self.config
        return deferToThreadPool(
            self.reactor,
            self._pool,
            writer.prune,
            config.retention_max_age,
            config.retention_max_bytes,
        )

    # -- state -----------------------------------------------------------------------------

    def _read_state(self) -> dict[str, Any]:
        try:
            return dict(json.loads((self.config.journal_dir / BRIDGE_STATE).read_text()))
        except FileNotFoundError:
            return {}

    def _write_state(self, state: dict[str, Any]) -> None:
        replace_atomically(self.config.journal_dir / BRIDGE_STATE, json.dumps(state), fsync=True)

    #: The console's charts (see :mod:`bus.web.console.view`).
    console_rates = {"journaled": "journaled"}

    def status(self) -> dict[str, Any]:
        """Sequences received and journaled, what waits for the writer, gaps, and whether the
        journal blocks, for ``/status``."""
        return {
            "sequence": self._last,
            "journaled": self.journaled,
            "pending": self._pending_events,
            "gaps_recorded": self.gaps_recorded,
            "store_id": self._store_id,
            "failed": None if self.failed is None else str(self.failed),
            "paused": self._paused,
            "journal_blocked": self.journal_blocked,
            "journal_errors": self.journal_errors,
            "journal_error": self.journal_error,
            "bus_sequence": self._bus_sequence(),
            "journal_lag": self._journal_lag(),
        }

    def _bus_sequence(self) -> int:
        core = self.subscriber.core if self.subscriber is not None else None
        return max(core.server_sequence if core is not None else 0, self._last)

    def _journal_lag(self) -> int:
        """Events the bus has announced that the writer has not taken yet."""
        return max(0, self._bus_sequence() - max(self.handed_to_journal, self._start))

    def metrics(self) -> list[Metric]:
        """The same as :meth:`status`, as Prometheus families."""
        return [
            counter(
                "spark_bridge_events_journaled", "Events written to the journal", self.journaled
            ),
            counter(
                "spark_bridge_gaps_recorded",
                "Ranges the bus no longer had, recorded as known gaps",
                self.gaps_recorded,
            ),
            gauge(
                "spark_bridge_pending_events", "Events waiting for the writer", self._pending_events
            ),
            gauge(
                "spark_bridge_journal_lag_events",
                "Sequences the bus has announced that the journal does not hold yet",
                self._journal_lag(),
            ),
            gauge("spark_bridge_sequence", "Highest sequence received from the bus", self._last),
            gauge(
                "spark_bridge_journal_blocked",
                "1 while the journal cannot write (full disk): the bridge is paused",
                float(self.journal_blocked),
            ),
            gauge(
                "spark_bridge_paused",
                "1 while the bridge does not read the bus (its writer is behind or the journal "
                "cannot write)",
                float(self._paused),
            ),
            counter(
                "spark_bridge_journal_errors", "Journal writes that failed", self.journal_errors
            ),
            gauge(
                "spark_bridge_failed",
                "1 when the bridge stopped journaling",
                float(self.failed is not None),
            ),
        ]


def _not_taken(batch: list[_Item], taken: int) -> list[_Item]:
    """The items (or the tails of event runs) above sequence ``taken``: what a failed
    write left for the next attempt (the writer holds everything up to ``taken``)."""
    kept: list[_Item] = []
    for kind, value in batch:
        if kind == "gap":
            if value[1] > taken:
                kept.append((kind, value))
        else:
            received, events = value
            rest = [event for event in events if event.sequence > taken]
            if rest:
                kept.append((kind, (received, rest)))
    return kept
