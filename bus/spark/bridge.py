"""The Spark bridge: a Twisted service that journals a bus's PUB feed for PySpark.

It subscribes to everything (a full-feed :class:`~bus.eventbus.client.EventBusSubscriber`,
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
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from twisted.application.service import Service
from twisted.internet import defer
from twisted.internet.threads import deferToThreadPool
from twisted.logger import Logger

from bus.eventbus.codec import Event
from bus.periodic import Periodic
from bus.spark.journal import JournalWriter
from bus.workers import worker_pool

log = Logger(namespace="bus.spark.bridge")

BRIDGE_STATE = "bridge.json"

# ("events", (received_at, [Event, ...])): a run of consecutive events to append, or
# ("gap", (first, last)): a range the bus no longer has.
_Item = tuple[str, Any]


@dataclass(frozen=True, slots=True)
class BridgeConfig:
    journal_dir: Path
    roll_events: int = 20_000
    roll_seconds: float = 0.1
    retention_max_age: float | None = None
    retention_max_bytes: int | None = None
    retention_interval: float = 60.0
    heartbeat_timeout: float = 3.5
    fsync: bool = True
    #: Events held in memory for the writer before the bridge stops reading the bus
    #: (ZeroMQ then drops at the HWM and the gap is healed from the bus's log later).
    max_pending: int = 1_000_000


class StoreMismatch(Exception):
    """The bus serves another log than the one this journal was written from."""


class SparkBridgeService(Service):
    name = "spark-bridge"

    def __init__(
        self,
        servers: Sequence[str] | Callable[[], Sequence[str]],
        config: BridgeConfig,
        reactor: Any = None,
    ) -> None:
        from bus.transport.zmqsocket import reactor_of

        self._servers = servers
        self.config = config
        self.reactor: Any = reactor_of(reactor)
        self.writer: JournalWriter | None = None
        self.subscriber: Any = None
        self.journaled = 0
        self.gaps_recorded = 0
        self.failed: Exception | None = None
        # A daemon: a bridge never stopped must not keep the process from exiting (a write
        # cut short is a crash the journal already recovers from).
        self._pool = worker_pool("spark-bridge-writer")
        self._pending: list[_Item] = []
        self._pending_events = 0
        self._last = 0
        self._writing: defer.Deferred[None] | None = None
        self._periodic = Periodic(self.reactor, log)
        self._store_id: str | None = None
        self._paused = False

    # -- lifecycle -----------------------------------------------------------------------

    def startService(self) -> None:
        from bus.eventbus.client import EventBusSubscriber

        config = self.config
        self.writer = JournalWriter(
            config.journal_dir, config.roll_events, config.roll_seconds, fsync=config.fsync
        )
        self._store_id = self._read_state().get("store_id")
        self._last = self.writer.last_sequence() or 0
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
        if self.subscriber is not None:
            yield self.subscriber.stopService()
        # Everything received goes to disk before the writer closes.
        while self._writing is not None or self._pending:
            if self._writing is not None:
                yield self._writing
            else:
                self._hand_over(final=True)
        writer, self.writer = self.writer, None
        if writer is not None:
            yield deferToThreadPool(self.reactor, self._pool, writer.close)
        self._pool.stop()
        log.info(
            "spark bridge stopped at sequence {sequence} ({journaled} events journaled)",
            sequence=self._last,
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
        if self._pending_events >= self.config.max_pending and not self._paused:
            self._pause(True)

    def _check_store(self) -> None:
        seen = self.subscriber.core.store_id if self.subscriber is not None else None
        if self.failed is not None or seen is None or seen == self._store_id:
            return
        if self._store_id is None:
            self._store_id = seen
            self._write_state({"store_id": seen})
            return
        self._fail(
            StoreMismatch(f"journal belongs to bus store {self._store_id}, the bus serves {seen}")
        )

    def _fail(self, error: Exception) -> None:
        self.failed = error
        log.error("spark bridge stops journaling: {error}", error=str(error))
        if self.subscriber is not None and self.subscriber.running:
            self.subscriber.stopService()

    def _pause(self, paused: bool) -> None:
        """Stop (or resume) reading the bus while the writer catches up."""
        self._paused = paused
        if self.subscriber is None:
            return
        if paused:
            log.warn("journal writer behind by {n} events: pausing", n=self._pending_events)
            self.subscriber.pause()
        else:
            self.subscriber.resume()

    # -- the writer thread ---------------------------------------------------------------------

    def _tick(self) -> None:
        self._check_store()
        if self._writing is None:
            self._hand_over()

    def _hand_over(self, final: bool = False) -> None:
        if self._writing is not None:
            return
        batch, self._pending = self._pending, []
        count, self._pending_events = self._pending_events, 0
        writer = self.writer
        if writer is None:
            return

        def write() -> None:
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

        def written(_: object) -> None:
            self._writing = None
            self.journaled += count
            self.gaps_recorded += sum(1 for kind, _ in batch if kind == "gap")
            if self._paused and self._pending_events < self.config.max_pending // 2:
                self._pause(False)

        def failed(failure: Any) -> None:
            self._writing = None
            self._fail(failure.value)

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
        path = self.config.journal_dir / BRIDGE_STATE
        temporary = path.with_name(path.name + ".tmp")
        with open(temporary, "w") as out:
            json.dump(state, out)
            out.flush()
            os.fsync(out.fileno())
        os.replace(temporary, path)

    def status(self) -> dict[str, Any]:
        return {
            "sequence": self._last,
            "journaled": self.journaled,
            "pending": self._pending_events,
            "gaps_recorded": self.gaps_recorded,
            "store_id": self._store_id,
            "failed": None if self.failed is None else str(self.failed),
        }
