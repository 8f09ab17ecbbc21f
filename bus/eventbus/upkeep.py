"""The event log's upkeep on the reactor: WAL checkpoints on a worker thread, retention a
chunk per reactor turn, and the close that waits (so long) for a running checkpoint; their
failures counted and reported rate-limited. Apart from :mod:`bus.eventbus.store`, which
stays free of Twisted: Spark's executors read the settings that name its retention."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from twisted.internet.defer import Deferred
from twisted.internet.task import CooperativeTask, Cooperator
from twisted.logger import Logger
from twisted.python.failure import Failure

from bus.eventbus.store import Retention
from bus.extension import StorageError
from bus.util.droplog import RateLimit
from bus.util.workers import SerialWork

if TYPE_CHECKING:
    from bus.eventbus.eventlog import EventLog


class LogUpkeep:
    """A log's background work on the reactor: WAL checkpoints on a worker thread (SQLite
    releases the GIL meanwhile), retention passes a chunk per reactor turn, and the close
    at stop. A failure loses nothing stored and the next period tries again: it is counted
    (:attr:`failures`) and reported in one line at most every ten seconds."""

    def __init__(
        self,
        reactor: Any,
        log: Callable[[], EventLog],
        retention: Retention,
        *,
        clock: Callable[[], float],
        logger: Logger,
    ) -> None:
        self.reactor = reactor
        # Asked each time: a pair may replace the log.
        self._log = log
        self.retention = retention
        self.clock = clock
        self.logger = logger
        #: Failed operations: checkpoints, retention steps, the final checkpoint at close.
        self.failures = 0
        self._reports = RateLimit(clock)
        self._checkpoints = SerialWork(reactor, "eventbus-checkpoint", self._checkpoint_failed)
        self._retention: CooperativeTask[Iterator[None]] | None = None

    def start(self) -> None:
        """Start the checkpoints' worker thread."""
        self._checkpoints.start()

    def checkpoint(self) -> None:
        """Move the WAL into the database on the worker thread (unless one still runs)."""
        self._checkpoints.run(self._log().checkpoint)

    def _checkpoint_failed(self, failure: Failure) -> None:
        if isinstance(failure.value, StorageError):
            self._failed("WAL checkpoint", failure.value)
        else:
            self.logger.failure("WAL checkpoint failed", failure)

    def retain(self) -> None:
        """Start a retention pass (:meth:`Retention.steps`), unless the last one still runs."""
        if self._retention is not None:
            return
        cooperator = Cooperator(scheduler=lambda work: self.reactor.callLater(0, work))
        self._retention = cooperator.cooperate(self._retention_pass(self.clock()))

    def _retention_pass(self, now: float) -> Iterator[None]:
        deleted = 0
        try:
            for step in self.retention.steps(self._log, now):
                deleted += step
                yield None
        except StorageError as error:
            self._failed("retention", error)
        finally:
            self._retention = None
        if deleted:
            self.logger.info("retention removed {deleted} events", deleted=deleted)

    def _failed(self, what: str, error: StorageError) -> None:
        self.failures += 1
        failures = self._reports.due(what)
        if failures is not None:
            self.logger.warn(
                "event log {what} failed ({error}); {failures} failures since the last "
                "report; nothing stored is lost, it is retried",
                what=what,
                error=str(error),
                failures=failures,
            )

    def close(self, timeout: float) -> Deferred[None]:
        """End the retention pass, then close the log once a running checkpoint is done, or
        without it once ``timeout`` seconds say it will not be soon (a stop never hangs on
        the disk). Fires then, whatever the close met (it says so in the log)."""
        if self._retention is not None:
            self._retention.stop()
            self._retention = None
        return self._checkpoints.idle(timeout).addCallback(self._close, timeout)

    def _close(self, checkpoint_finished: bool, timeout: float) -> None:
        log = self._log()
        try:
            if checkpoint_finished:
                self._checkpoints.stop()
            else:
                self.logger.warn(
                    "a WAL checkpoint still runs after {timeout}s: closing without it",
                    timeout=timeout,
                )
            log.close(checkpoint_running=not checkpoint_finished)
        except StorageError as error:
            self.failures += 1
            self.logger.error(
                "event log {path} closed without its final checkpoint ({error}): the WAL "
                "keeps every stored event and the next start reads it",
                path=str(log.path),
                error=str(error),
            )
        except Exception:
            self.logger.failure("closing the event log failed")
