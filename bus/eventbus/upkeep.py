"""The event log's upkeep on the reactor: WAL checkpoints on a worker thread, retention a
step per reactor turn, and the close that waits (so long) for a running checkpoint; their
failures counted and reported rate-limited. Apart from :mod:`bus.eventbus.store`, which
stays free of Twisted: Spark's executors read the settings that name its retention."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from twisted.internet.defer import Deferred
from twisted.internet.task import CooperativeTask, Cooperator
from twisted.logger import Logger
from twisted.python.failure import Failure

from bus.eventbus.store import Retention, step_sizer
from bus.extension import Metric, StorageError, counter, gauge
from bus.util.droplog import RateLimit
from bus.util.workers import SerialWork

if TYPE_CHECKING:
    from bus.eventbus.eventlog import EventLog


@dataclass(frozen=True, slots=True)
class RetentionPass:
    """What one retention pass did."""

    #: When it started (the service's clock, epoch seconds) and how long it ran (seconds).
    started: float
    seconds: float
    removed: int
    #: Steps (one per reactor turn) and the longest of them (seconds): how long retention
    #: held the reactor at most.
    steps: int
    longest_step: float
    #: The reactor thread's CPU time in its steps (seconds; the WAL checkpoints that copy
    #: what it changed run on their own thread), and in its longest step by CPU: the work
    #: of a step, where its wall time also counts other processes' turns on the CPU.
    cpu: float = 0.0
    longest_step_cpu: float = 0.0


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
        timer: Callable[[], float] = time.perf_counter,
        cpu_timer: Callable[[], float] = time.thread_time,
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
        #: Measures retention steps (monotonic seconds); it sizes their chunks too.
        self.timer = timer
        #: The reactor thread's CPU time (seconds), for what retention steps cost.
        self.cpu_timer = cpu_timer
        self._sizer = step_sizer(timer)
        #: Events retention removed since the start, in how many passes, and the last pass.
        self.removed = 0
        self.passes = 0
        self.last_pass: RetentionPass | None = None
        #: The longest retention step since the start (seconds), by wall and by CPU time,
        #: and the steps' CPU time in all.
        self.longest_step = 0.0
        self.longest_step_cpu = 0.0
        self.cpu = 0.0

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
        # One step per reactor turn: a Cooperator's default runs steps for 10 ms a turn.
        cooperator = Cooperator(
            terminationPredicateFactory=lambda: lambda: True,
            scheduler=lambda work: self.reactor.callLater(0, work),
        )
        self._retention = cooperator.cooperate(self._retention_pass(self.clock()))

    def _retention_pass(self, now: float) -> Iterator[None]:
        timer, cpu_timer = self.timer, self.cpu_timer
        deleted = steps = 0
        longest = cpu = longest_cpu = 0.0
        began = timer()
        try:
            passing = iter(self.retention.steps(self._log, now, self._sizer))
            while True:
                started, cpu_started = timer(), cpu_timer()
                step = next(passing, None)
                longest = max(longest, timer() - started)
                spent = cpu_timer() - cpu_started
                cpu += spent
                longest_cpu = max(longest_cpu, spent)
                if step is None:
                    break
                deleted += step
                steps += 1
                yield None
        except StorageError as error:
            self._failed("retention", error)
        finally:
            self._retention = None
            self.removed += deleted
            self.passes += 1
            self.longest_step = max(self.longest_step, longest)
            self.longest_step_cpu = max(self.longest_step_cpu, longest_cpu)
            self.cpu += cpu
            self.last_pass = RetentionPass(
                now, timer() - began, deleted, steps, longest, cpu, longest_cpu
            )
        if deleted:
            self.logger.info(
                "retention removed {deleted} events in {steps} steps over {seconds:.3f} s, "
                "the longest {longest_ms:.2f} ms",
                deleted=deleted,
                steps=steps,
                seconds=self.last_pass.seconds,
                longest_ms=longest * 1000,
            )

    def status(self) -> dict[str, Any]:
        """Retention's figures for status.json: events removed, passes, the longest step
        since the start (how long retention held the reactor at most) and the last pass."""
        last = self.last_pass
        return {
            "retention_removed": self.removed,
            "retention_passes": self.passes,
            "retention_longest_step_ms": round(self.longest_step * 1000, 3),
            "retention_longest_step_cpu_ms": round(self.longest_step_cpu * 1000, 3),
            "retention_cpu_s": round(self.cpu, 6),
            "retention_last_pass": None
            if last is None
            else {
                "started": round(last.started, 3),
                "seconds": round(last.seconds, 6),
                "removed": last.removed,
                "steps": last.steps,
                "longest_step_ms": round(last.longest_step * 1000, 3),
                "cpu_s": round(last.cpu, 6),
                "longest_step_cpu_ms": round(last.longest_step_cpu * 1000, 3),
            },
        }

    def metrics(self) -> list[Metric]:
        """Prometheus families of retention's figures."""
        return [
            counter(
                "eventbus_retention_removed", "Events retention removed from the log", self.removed
            ),
            counter(
                "eventbus_retention_cpu_seconds",
                "CPU time of the reactor thread in retention steps",
                self.cpu,
            ),
            gauge(
                "eventbus_retention_longest_step_seconds",
                "Longest retention step since the start (how long it held the reactor at most)",
                self.longest_step,
            ),
        ]

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
