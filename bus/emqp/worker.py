"""Twisted eMQP worker: INFORM with weighted queues, one READY per free slot, run each
REQUEST in a bounded thread or process pool, REPLY, heartbeat, and start over when the
broker dies, restarts or says KBYE.

    worker = EmqpWorker("tcp://127.0.0.1:47290", queues=[(10, "default")], slots=4)
    worker.register("resize", resize)         # body ["resize", params] -> resize(params)
    worker.startService()

A body ``["run", {"path": "pkg.mod" or "pkg.mod:Class", "callable": name, "args": [...],
"kwargs": {...}, "class_args": [...], "class_kwargs": {...}}]`` (what the original client's
``defer_job`` sends) imports and calls that callable, unless ``allow_run=False``. The result
goes back as the original job manager sends it, ``{"value": result}``, when the request
asks for ``reply-requested``; a handler that raises answers ``{"error": "handler-failed",
"message": ...}``, with eventmq's ``"value": str(exception)`` beside them for a ``run`` body.
A job past its timeout (the request's ``timeout:N``, else ``job_timeout``) has its process
killed (``pool="process"``).

``pool="process"`` runs each slot's jobs in a process of its own, started by a fork server
(a clean process, not a fork of this one with its reactor, sockets and threads): a job that
kills its process (``os._exit``, a segfault) answers ``handler-failed`` and only that
process is replaced. Handlers must then be picklable (module-level functions).

``stopService()`` with a ``grace_period`` stops taking jobs (no more READY), lets the running
ones finish and REPLY, then says KBYE; once the grace period is over, or at
:meth:`force_stop`, running jobs are ended (their processes killed) and the broker retries
them or tells their clients ``worker-left``. With the default grace period of 0 it says
KBYE at once.
"""

from __future__ import annotations

import concurrent.futures.process
import contextlib
import multiprocessing
import os
from collections import deque
from collections.abc import Callable, Iterable
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from typing import Any

import zmq
from twisted.application.service import Service
from twisted.internet import defer, threads
from twisted.logger import Logger
from twisted.python.failure import Failure
from twisted.python.threadpool import ThreadPool

from bus.emqp import codec
from bus.emqp.beats import HeardPeriod
from bus.emqp.codec import EmqpError
from bus.emqp.worker_process import (
    NO_HOOKS,
    Handler,
    JobHooks,
    nothing,
    run_callable,
    run_job,
    run_setup,
    start_job_process,
)
from bus.extension import SocketFactory, SocketOptions, StartupError, ZmqSocket, reactor_of
from bus.transport.curve import ClientCurve
from bus.util.droplog import DropCounter
from bus.util.periodic import Periodic
from bus.util.wakes import Wakes
from bus.util.workers import worker_pool

log = Logger(namespace="bus.emqp.worker")

#: How long the last KBYE may wait in the socket for the broker when the worker stops.
GOODBYE_LINGER_MS = 1000
#: How long a probe of a silent broker (its port, or whether it takes our key) may take.
_PROBE_SECONDS = 2.0


class NoHandler(Exception):
    """A request's body names no handler the worker has (and there is no default one)."""

    pass


class JobTimedOut(Exception):
    """A job ran past its timeout; its process was ended."""


def is_run_body(body: Any) -> bool:
    """``["run", {...}]``, eventmq's form: its failures also answer eventmq's ``value``."""
    return isinstance(body, list) and len(body) == 2 and body[0] == "run"


def format_queues(queues: Iterable[tuple[int, str]]) -> str:
    """``10:default,5:mail``, as ``--queues`` takes them."""
    return ",".join(f"{weight}:{name}" for weight, name in queues)


class _JobProcess:
    """One slot of the process pool: a pool of a single process, so that a job that kills
    its process breaks that pool alone and no other job fails with it."""

    def __init__(self, hooks: JobHooks, context: Any) -> None:
        self._hooks = hooks
        self._context = context
        self.executor = self._new()
        self.busy = False
        #: Jobs given to the current process.
        self.jobs = 0
        #: Its job ran past its timeout and the process was killed.
        self.timed_out = False

    def _new(self) -> ProcessPoolExecutor:
        return ProcessPoolExecutor(
            max_workers=1,
            mp_context=self._context,
            initializer=start_job_process,
            initargs=(self._hooks, os.getpid()),
        )

    def start(self) -> None:
        """Start the process now (and run its setup hook) rather than at the first job."""
        self.executor.submit(nothing)

    def submit(self, function: Callable[..., Any], *args: Any) -> Future[Any]:
        self.jobs += 1
        try:
            return self.executor.submit(function, *args)
        except BrokenProcessPool:  # its process died between two jobs
            self.replace()
            self.jobs += 1
            return self.executor.submit(function, *args)

    def replace(self) -> None:
        old, self.executor = self.executor, self._new()
        self.jobs = 0
        self.timed_out = False
        old.shutdown(wait=False, cancel_futures=True)

    def kill(self) -> None:
        # ProcessPoolExecutor has no public way to end a running job before Python 3.14
        # (kill_workers): its process table is the only handle on the process.
        processes = getattr(self.executor, "_processes", None) or {}
        for process in list(processes.values()):
            with contextlib.suppress(Exception):
                process.kill()

    def shutdown(self) -> None:
        """End the pool without waiting for its jobs. Python 3.11's exit wakes every pool's
        manager thread through a pipe that thread may be closing just then: a worker stopped
        with Ctrl-C printed a traceback of EBADF at its exit (CPython gh-125451, fixed in
        3.12 and 3.13, not in 3.11; seen again in CI, four test processes on two cores). The
        thread, woken by this shutdown already, is taken off the list the exit wakes; the
        exit still joins it, as it joins every thread that is not a daemon."""
        # Read before the shutdown, which forgets it.
        manager = getattr(self.executor, "_executor_manager_thread", None)
        self.executor.shutdown(wait=False, cancel_futures=True)
        wakeups = getattr(concurrent.futures.process, "_threads_wakeups", None)
        if manager is not None and wakeups is not None:
            wakeups.pop(manager, None)


class EmqpWorker(Service):
    """An eMQP worker as a Twisted service: it INFORMs ``queues``, offers ``slots`` READYs, runs
    each request's handler in its pool, REPLYs, and starts over with a broker that restarted."""

    def __init__(
        self,
        endpoint: str,
        queues: Iterable[tuple[int, str]] = codec.DEFAULT_QUEUES,
        slots: int = 4,
        handlers: dict[str, Handler] | None = None,
        pool: str = "thread",
        allow_run: bool = True,
        heartbeat_interval: float = 3.0,
        heartbeat_liveness: int = 3,
        grace_period: float | None = 0.0,
        hooks: JobHooks = NO_HOOKS,
        max_jobs_per_process: int = 0,
        stats_interval: float = 0.0,
        job_timeout: float = 0.0,
        worker_name: str = "",
        reactor: Any = None,
        curve: ClientCurve | None = None,
    ) -> None:
        """``grace_period``: seconds :meth:`stopService` lets running jobs finish (None: as
        long as they take). ``hooks``: eventmq's setup, entry and exit callables.
        ``max_jobs_per_process``: a job process is replaced after so many jobs (0: never).
        ``stats_interval``: seconds between lines of jobs run and failed, when they changed
        (0: none). ``job_timeout``: seconds a job may run when its request names no
        ``timeout:N`` (0: as long as it takes; eventmq's ``GLOBAL_TIMEOUT``); past its
        timeout a job's process is killed (the process pool only: a thread cannot be
        ended). ``worker_name``: its name in its log. ``curve``: connect as a CURVE client (a
        broker with ``--server-cert``)."""
        self.curve = curve
        if pool not in ("thread", "process"):
            raise ValueError("pool must be thread or process")
        self.endpoint = endpoint
        self.queues = tuple(queues)
        self.slots = slots
        self.handlers: dict[str, Handler] = dict(handlers or {})
        if allow_run:
            self.handlers.setdefault("run", run_callable)
        self.pool_kind = pool
        self.heartbeat_interval = heartbeat_interval
        self.heartbeat_liveness = heartbeat_liveness
        self.grace_period = grace_period
        self.hooks = hooks
        self.max_jobs_per_process = max_jobs_per_process
        self.stats_interval = stats_interval
        self.job_timeout = job_timeout
        # Not ``name``: a Service's name is its place in a MultiService.
        self.worker_name = worker_name
        self.reactor: Any = reactor_of(reactor)
        self.wakes = Wakes(heartbeat_interval, self.reactor.seconds)
        self._factory: SocketFactory | None = None
        self._socket: ZmqSocket | None = None
        self._threads: ThreadPool | None = None
        self._job_processes: list[_JobProcess] = []
        self._process_context: Any = None
        #: A new broker, queues or slots to take once the running jobs have ended.
        self._rejoin: tuple[str, tuple[tuple[int, str], ...], int] | None = None
        #: Requests beyond the free processes (a broker that sent more than our READYs).
        self._waiting_jobs: deque[tuple[defer.Deferred[Any], Handler, Any, float]] = deque()
        self._periodic = Periodic(self.reactor, log)
        self.drops = DropCounter(log, "broker message", self.reactor.seconds)
        #: Incremented at every (re)connection: results of an older session get no REPLY.
        self.session = 0
        self.registered = False
        #: Stopping: no more READY; running jobs finish and REPLY, then KBYE.
        self.draining = False
        #: KBYE said and the socket closed (the pools may still be ending).
        self._finished_stopping = False
        #: Everything ended: stopService's Deferreds have fired.
        self._stopped = False
        self._stop_waiters: list[defer.Deferred[None]] | None = None
        self._grace_timer: Any = None
        self.running_jobs = 0
        self.completed = 0
        self.failed = 0
        self.timed_out = 0
        self.processes_replaced = 0
        self.informs = 0
        self.heartbeats_received = 0
        self._last_heard = 0.0
        #: The broker's heartbeat period as its HEARTBEATs show it: silence is counted
        #: against the longer of it and ours (:mod:`bus.emqp.beats`); the period told.
        self.broker_beats = HeardPeriod()
        self._period_told: float | None = None
        #: This connection's first HEARTBEAT came: the broker's greeting (sent with the
        #: ACK of our INFORM, out of its rhythm), not counted in its period.
        self._greeted = False
        self._stats_logged = (0, 0)
        #: A probe of the silent broker is under way; what it told last (told once).
        self._probing = False
        self._silence_told: str | None = None

    def register(self, name: str, handler: Handler) -> None:
        """Run ``handler(params)`` for bodies ``[name, params]``."""
        self.handlers[name] = handler

    # -- lifecycle ---------------------------------------------------------------------------------

    def startService(self) -> None:
        Service.startService(self)
        self.draining = False
        self._finished_stopping = self._stopped = False
        self._stop_waiters = None
        self._factory = SocketFactory(self.reactor, curve=self.curve)
        if self.pool_kind == "thread":
            # Daemon threads: a handler that never returns does not keep the process alive.
            self._threads = worker_pool("emqp-worker", self.slots)
            self._threads.start()
            if self.hooks.setup:  # the threads' process is this one: set it up once
                try:
                    run_setup(self.hooks)
                except Exception:
                    log.failure("setup {setup} failed", setup=self.hooks.setup)
        else:
            self._process_context = multiprocessing.get_context("forkserver")
            self._job_processes = []
            self._resize_processes(self.slots)
        try:
            self._connect()
        except zmq.ZMQError as error:
            raise StartupError("broker", f"{error} ({self.endpoint})") from None
        self._start_timers()
        log.info(
            "eMQP worker{named}: broker {broker}, queues {queues}, slots {slots}, pool {pool}",
            named=f" {self.worker_name}" if self.worker_name else "",
            broker=self.endpoint,
            queues=format_queues(self.queues),
            slots=self.slots,
            pool=self.pool_kind,
        )

    def _start_timers(self) -> None:
        self._periodic.every(self.heartbeat_interval, self._tick)
        if self.stats_interval > 0:
            self._periodic.every(self.stats_interval, self._log_stats)

    def _resize_processes(self, slots: int) -> None:
        while len(self._job_processes) < slots:
            job_process = _JobProcess(self.hooks, self._process_context)
            job_process.start()
            self._job_processes.append(job_process)
        while len(self._job_processes) > slots:
            self._job_processes.pop().shutdown()  # called when all are idle

    def set_timers(self, heartbeat_interval: float, stats_interval: float) -> None:
        """New periods for the heartbeat and the stats line, from now on."""
        self.heartbeat_interval, self.stats_interval = heartbeat_interval, stats_interval
        if self.running:
            self._periodic.stop_all()
            self._start_timers()

    def rejoin(self, endpoint: str, queues: Iterable[tuple[int, str]], slots: int) -> None:
        """Serve ``queues`` of the broker at ``endpoint`` with ``slots`` slots: once the
        running jobs have ended and REPLYed (no READY meanwhile), a new connection and
        INFORM, as a KBYE would make."""
        self._rejoin = (endpoint, tuple(queues), slots)
        if self.running_jobs == 0:
            self._rejoin_now()
        else:
            log.info(
                "taking the new broker, queues or slots once {running} running job(s) end",
                running=self.running_jobs,
            )

    def _rejoin_now(self) -> None:
        if self._rejoin is None or self.draining or not self.running:
            self._rejoin = None
            return
        if self._rejoin[0] != self.endpoint:
            self.broker_beats.forget()
        (self.endpoint, self.queues, slots), self._rejoin = self._rejoin, None
        socket = self._socket
        if self.registered and socket is not None and not socket.closed:
            # The broker forgets this connection now rather than after its silence.
            socket.send_frames(codec.kbye())
            with contextlib.suppress(zmq.ZMQError):
                socket.socket.set(zmq.LINGER, GOODBYE_LINGER_MS)
        if slots != self.slots:
            self.slots = slots
            if self._threads is not None:
                self._threads.adjustPoolsize(min(1, slots), slots)
            else:
                self._resize_processes(slots)
        self._connect()
        log.info(
            "serving broker {broker}, queues {queues}, slots {slots}",
            broker=self.endpoint,
            queues=format_queues(self.queues),
            slots=self.slots,
        )

    def stopService(self) -> defer.Deferred[None]:
        """Take no more jobs; fires once the running ones have finished (or were ended when
        the grace period ran out), KBYE was sent and the socket is closed."""
        if self._stop_waiters is not None:
            return self._when_stopped()
        if not self.running:
            return defer.succeed(None)
        Service.stopService(self)
        self.draining = True
        self._stop_waiters = []
        stopped = self._when_stopped()
        grace = self.grace_period
        if self.running_jobs and (grace is None or grace > 0):
            log.info(
                "stopping: no more jobs taken; waiting for {running} running job(s) "
                "{limit} before they are ended",
                running=self.running_jobs,
                limit="with no limit" if grace is None else f"at most {grace:g}s",
            )
            if grace is not None:
                self._grace_timer = self.reactor.callLater(grace, self._grace_over)
        else:
            self._goodbye(kill=True, join_threads=True)
        return stopped

    def force_stop(self) -> None:
        """End the running jobs now (a second SIGTERM): KBYE, so that the broker retries
        them or tells their clients ``worker-left``, then kill their processes (threads
        cannot be killed: they are daemons, left to the process's exit)."""
        if self._finished_stopping or not (self.running or self.draining):
            return
        if not self.draining:
            self.stopService()
            if self._finished_stopping:
                return
        log.warn("ending {running} running job(s) now", running=self.running_jobs)
        self._goodbye(kill=True, join_threads=False)

    def _grace_over(self) -> None:
        self._grace_timer = None
        log.warn("grace period of {grace:g}s over", grace=self.grace_period)
        self.force_stop()

    def _when_stopped(self) -> defer.Deferred[None]:
        waiter: defer.Deferred[None] = defer.Deferred()
        if self._stop_waiters is None or self._stopped:
            waiter.callback(None)
        else:
            self._stop_waiters.append(waiter)
        return waiter

    def _goodbye(self, kill: bool, join_threads: bool) -> None:
        """KBYE, close the socket, end the pools; then fire the stop waiters."""
        if self._finished_stopping:
            return
        self._finished_stopping = True
        if self._grace_timer is not None and self._grace_timer.active():
            self._grace_timer.cancel()
        self._grace_timer = None
        self._periodic.stop_all()
        socket, self._socket = self._socket, None
        if socket is not None and not socket.closed:
            if self.registered:
                socket.send_frames(codec.kbye())
            # The worker's socket never lingers (a reconnection must not send stale
            # messages); the KBYE must leave before the socket closes.
            with contextlib.suppress(zmq.ZMQError):
                socket.socket.set(zmq.LINGER, GOODBYE_LINGER_MS)
        self.registered = False
        if self._factory is not None:
            self._factory.shutdown()
        for job_process in self._job_processes:
            if kill:
                job_process.kill()
            job_process.shutdown()
        self._job_processes = []
        waiting, self._waiting_jobs = self._waiting_jobs, deque()
        for deferred, *_ in waiting:
            deferred.errback(defer.CancelledError("the worker stopped"))
        log.info(
            "eMQP worker stopped: {completed} jobs run, {failed} failed",
            completed=self.completed,
            failed=self.failed,
        )
        threads_pool, self._threads = self._threads, None
        if threads_pool is not None and join_threads:
            joined = threads.deferToThread(threads_pool.stop)
            joined.addBoth(lambda _: self._fire_stop_waiters())
        else:
            self._fire_stop_waiters()

    def _fire_stop_waiters(self) -> None:
        self._stopped = True
        waiters, self._stop_waiters = self._stop_waiters or [], []
        for waiter in waiters:
            waiter.callback(None)

    def _connect(self) -> None:
        """A fresh socket (nothing stale queued in it) and an INFORM."""
        assert self._factory is not None
        if self._socket is not None:
            self._socket.shutdown()
        self.session += 1
        self.registered = False
        self._greeted = False
        self._socket = self._factory.socket(
            zmq.DEALER,
            self._on_messages,
            SocketOptions(identity=codec.new_msgid(), linger_ms=0, send_hwm=10_000),
            name="emqp-worker",
        )
        self._socket.connect(self.endpoint)
        self._last_heard = self.reactor.seconds()
        self.informs += 1
        self._socket.send_frames(codec.inform(self.queues, codec.WORKER))

    def silence_bound(self) -> float:
        """Seconds of broker silence after which it is taken as gone: liveness heartbeat
        periods, ours or the broker's (as its HEARTBEATs show it) whichever is longer. By
        ours alone, a broker that heartbeats less often would be left between two of its
        HEARTBEATs, again and again, and the jobs running with it lost."""
        period = max(self.heartbeat_interval, self.broker_beats.period or 0.0)
        return period * self.heartbeat_liveness

    def _tick(self) -> None:
        silent = self.reactor.seconds() - self._last_heard
        # A tick after a stall of this process judges nothing: the broker's messages may
        # wait unread (bus.util.wakes).
        judging = self.wakes.judging()
        if judging and not self.draining and silent > self.silence_bound():
            log.warn("broker silent for {silent:.1f}s: connecting again", silent=silent)
            self._explain_silence()
            self._connect()
            return
        # Draining, heartbeats go on: a broker that forgot us would retry our running jobs.
        self._send(codec.heartbeat(self.reactor.seconds()))

    def _explain_silence(self) -> None:
        """Why the broker may be silent, when a probe can tell (an error line, once until
        the broker is heard or the reason changes): its port speaks CURVE and this worker
        was given no key, or it refused this worker's key (not on its allow-list, or a
        certificate without the worker role). Libzmq alone reports neither."""
        if self._probing:
            return
        from bus.transport.probe import probe_key, probe_port, refused_key, tcp_address

        endpoint = self.endpoint
        said: defer.Deferred[str | None]
        if self.curve is None:
            address = tcp_address(endpoint)
            if address is None:
                return
            said = probe_port(self.reactor, *address, _PROBE_SECONDS).addCallback(
                lambda listener: (
                    f"broker {endpoint} speaks CURVE: give --server-key (and --cert)"
                    if listener == "curve"
                    else None
                )
            )
        else:
            curve = self.curve
            said = probe_key(self.reactor, endpoint, curve, _PROBE_SECONDS).addCallback(
                lambda verdict: (
                    refused_key(endpoint, curve, role="worker") if verdict == "refused" else None
                )
            )
        self._probing = True

        def tell(sentence: str | None) -> None:
            self._probing = False
            if sentence is not None and sentence != self._silence_told and self.running:
                self._silence_told = sentence
                log.error("{sentence}", sentence=sentence)

        def failed(failure: Failure) -> None:
            self._probing = False
            log.failure("probing the silent broker", failure)

        said.addCallbacks(tell, failed)

    def _log_stats(self) -> None:
        now = (self.completed, self.failed)
        if now != self._stats_logged:
            self._stats_logged = now
            log.info(
                "jobs: {completed} run, {failed} failed, {running} running",
                completed=self.completed,
                failed=self.failed,
                running=self.running_jobs,
            )

    # -- messages ----------------------------------------------------------------------------------

    def _on_messages(self, batch: list[list[bytes]]) -> None:
        self._last_heard = self.reactor.seconds()
        self._silence_told = None
        for frames in batch:
            try:
                command = codec.parse(frames)
            except EmqpError as error:
                self.drops.drop(error.reason, str(error))
                continue
            if isinstance(command, codec.Request):
                # Also while draining: the broker sent it against a READY it had.
                self._run(command)
            elif isinstance(command, codec.Heartbeat):
                self.heartbeats_received += 1
                self._heard_beat(command)
            elif isinstance(command, codec.Ack):
                if not self.registered and not self.draining:
                    self.registered = True
                    free = 0 if self._rejoin is not None else self.slots - self.running_jobs
                    for _ in range(free):
                        self._send(codec.ready())
            elif isinstance(command, codec.Kbye | codec.Disconnect):
                if self.draining:  # forgotten while leaving: nobody to answer any more
                    self.registered = False
                else:
                    # The broker forgot us (stopped, restarted), or never heard our INFORM
                    # (sent to a broker that was stopping): start over. It says KBYE once.
                    self._connect()
                    return
            else:
                self.drops.drop("unexpected-command", type(command).__name__)

    def _heard_beat(self, beat: codec.Heartbeat) -> None:
        if not self._greeted:
            self._greeted = True
            return
        self.broker_beats.heard(beat.sent_at, self.reactor.seconds())
        period = self.broker_beats.period
        told = self._period_told
        if period is None or period <= self.heartbeat_interval:
            return
        if told is None or abs(period - told) > 0.1 * told:
            self._period_told = period
            log.info(
                "the broker heartbeats every {period:.1f}s, less often than this worker "
                "({interval:g}s): it is taken as gone after {bound:.1f}s of silence",
                period=period,
                interval=self.heartbeat_interval,
                bound=self.silence_bound(),
            )

    def _send(self, frames: list[bytes]) -> None:
        if self._socket is not None and not self._socket.closed:
            self._socket.send_frames(frames)

    def _run(self, request: codec.Request) -> None:
        self.running_jobs += 1
        session = self.session
        body = request.value()
        # eventmq's rule: a request's timeout:N, else the global one (0 is none).
        timeout = request.headers.timeout or self.job_timeout
        try:
            deferred = self._execute(body, timeout)
        except NoHandler as error:
            deferred = defer.fail(error)
        deferred.addCallbacks(
            lambda value: codec.result_value(value),
            self._failure_result,
            errbackArgs=(is_run_body(body), request.headers.timeout is not None),
        )
        deferred.addCallback(self._finished, request, session)
        deferred.addErrback(lambda failure: log.failure("finishing a job failed", failure))

    def _execute(self, body: Any, timeout: float) -> defer.Deferred[Any]:
        if isinstance(body, list) and len(body) == 2 and isinstance(body[0], str):
            name, params = body
        else:
            name, params = "", body
        handler = self.handlers.get(name) or self.handlers.get("")
        if handler is None:
            raise NoHandler(f"no handler for {name!r}")
        if self.pool_kind == "process":
            return self._in_process(handler, params, timeout)
        if self._threads is None:
            return defer.fail(defer.CancelledError("the worker stopped"))
        return threads.deferToThreadPool(
            self.reactor, self._threads, run_job, self.hooks, handler, params
        )

    def _in_process(self, handler: Handler, params: Any, timeout: float) -> defer.Deferred[Any]:
        if self._finished_stopping:
            return defer.fail(defer.CancelledError("the worker stopped"))
        for job_process in self._job_processes:
            if not job_process.busy:
                return self._run_in(job_process, handler, params, timeout)
        waiting: defer.Deferred[Any] = defer.Deferred()
        self._waiting_jobs.append((waiting, handler, params, timeout))
        return waiting

    def _run_in(
        self, job_process: _JobProcess, handler: Handler, params: Any, timeout: float
    ) -> defer.Deferred[Any]:
        job_process.busy = True
        try:
            future = job_process.submit(run_job, self.hooks, handler, params)
        except Exception as error:
            job_process.busy = False
            return defer.fail(error)
        deferred = _from_future(self.reactor, future)
        if timeout > 0:
            # From the job's start in its process, as eventmq counts it.
            timer = self.reactor.callLater(timeout, self._time_out, job_process, timeout)
            deferred.addBoth(self._ended_in_time, timer, job_process, timeout)
        deferred.addBoth(self._process_free, job_process)
        return deferred

    def _time_out(self, job_process: _JobProcess, timeout: float) -> None:
        # eventmq's job manager abandons such a job to run on; killing its process keeps a
        # retried request from running twice at once and frees the slot for real.
        log.warn("a job ran past its timeout of {timeout:g}s: ending its process", timeout=timeout)
        job_process.timed_out = True
        job_process.kill()

    def _ended_in_time(
        self, result: Any, timer: Any, job_process: _JobProcess, timeout: float
    ) -> Any:
        if timer.active():
            timer.cancel()
        elif job_process.timed_out and isinstance(result, Failure):
            self.timed_out += 1
            return Failure(JobTimedOut(f"the job ran past its timeout of {timeout:g}s"))
        return result  # it ended just before its process was killed: its result stands

    def _process_free(self, result: Any, job_process: _JobProcess) -> Any:
        job_process.busy = False
        if self._finished_stopping:
            return result
        if job_process.timed_out:
            job_process.replace()
        elif isinstance(result, Failure) and result.check(BrokenProcessPool):
            log.warn("a job ended its process: starting another")
            self.processes_replaced += 1
            job_process.replace()
        elif 0 < self.max_jobs_per_process <= job_process.jobs:
            job_process.replace()  # eventmq's MAX_JOB_COUNT: a fresh process now and then
        if self._waiting_jobs:
            waiting, handler, params, timeout = self._waiting_jobs.popleft()
            self._run_in(job_process, handler, params, timeout).chainDeferred(waiting)
        return result

    def _failure_result(
        self, failure: Failure, eventmq_form: bool, broker_times_out: bool
    ) -> bytes | None:
        """``{"error": reason, "message": text}``; for a ``run`` body also eventmq's
        ``"value"``: ``str(exception)`` for a job that raised, ``"TimeoutError"``. None:
        no REPLY."""
        self.failed += 1
        error = failure.value
        if failure.check(JobTimedOut):
            if broker_times_out:
                # The broker keeps the same timeout:N: it retries the request or answers
                # the client itself; a REPLY that beat its deadline would end the request.
                return None
            return codec.error_result("timeout", f"{error}: its process was ended")
        if failure.check(BrokenProcessPool):
            text = "the job's process died (a signal, os._exit or a crash): it was replaced"
            value = text
        else:
            text, value = f"{type(error).__name__}: {error}", str(error)
        return codec.error_result("handler-failed", text, value if eventmq_form else None)

    def _finished(self, result: bytes | None, request: codec.Request, session: int) -> None:
        self.running_jobs -= 1
        self.completed += 1
        if self._finished_stopping:
            return
        if (
            result is not None
            and self.registered
            and session == self.session
            and request.headers.reply_requested
        ):
            self._send(codec.reply(result, request.msgid))
        if self.draining:
            if self.running_jobs == 0:
                self._goodbye(kill=False, join_threads=True)
        elif self._rejoin is not None:
            if self.running_jobs == 0:
                self._rejoin_now()
        elif self.registered:
            self._send(codec.ready())


def _from_future(reactor: Any, future: Future[Any]) -> defer.Deferred[Any]:
    deferred: defer.Deferred[Any] = defer.Deferred()

    def settle(done: Future[Any]) -> None:
        if done.cancelled():
            reactor.callFromThread(deferred.errback, defer.CancelledError())
            return
        error = done.exception()
        if error is not None:
            reactor.callFromThread(deferred.errback, error)
        else:
            reactor.callFromThread(deferred.callback, done.result())

    future.add_done_callback(settle)
    return deferred


__all__ = ["EmqpWorker", "Handler", "JobHooks", "format_queues", "run_callable"]
