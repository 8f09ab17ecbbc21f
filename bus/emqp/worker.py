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
"message": ...}``.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterable
from concurrent.futures import Future, ProcessPoolExecutor
from typing import Any

import zmq
from twisted.application.service import Service
from twisted.internet import defer, threads
from twisted.logger import Logger
from twisted.python.threadpool import ThreadPool

from bus.droplog import DropCounter
from bus.emqp import codec
from bus.emqp.codec import EmqpError
from bus.periodic import Periodic
from bus.transport.zmqsocket import SocketFactory, SocketOptions, ZmqSocket, reactor_of
from bus.workers import worker_pool

log = Logger(namespace="bus.emqp.worker")

Handler = Callable[[Any], Any]


class NoHandler(Exception):
    pass


def run_callable(params: dict[str, Any]) -> Any:
    """The original's ``run`` subcommand: import ``path`` (``pkg.mod`` or ``pkg.mod:Class``),
    instantiate the class if one is named, call ``callable`` with ``args``/``kwargs``; a
    ``path`` of ``pkg.mod:function`` without ``callable`` names the function itself."""
    if not isinstance(params, dict):
        raise TypeError("run wants an object with path and callable")
    module_name, _, after = str(params["path"]).partition(":")
    target: Any = importlib.import_module(module_name)
    if "callable" in params:
        if after:  # pkg.mod:Class, the original's form for a method
            cls = getattr(target, after)
            target = cls(*params.get("class_args") or (), **params.get("class_kwargs") or {})
        name = str(params["callable"])
    else:  # pkg.mod:function
        name = after
    function = getattr(target, name)
    return function(*params.get("args") or (), **params.get("kwargs") or {})


def _call(handler: Handler, params: Any) -> Any:
    return handler(params)


class EmqpWorker(Service):
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
        reactor: Any = None,
    ) -> None:
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
        self.reactor: Any = reactor_of(reactor)
        self._factory: SocketFactory | None = None
        self._socket: ZmqSocket | None = None
        self._threads: ThreadPool | None = None
        self._processes: ProcessPoolExecutor | None = None
        self._periodic = Periodic(self.reactor, log)
        self.drops = DropCounter(log, "broker message", self.reactor.seconds)
        #: Incremented at every (re)connection: results of an older session get no REPLY.
        self.session = 0
        self.registered = False
        self.running_jobs = 0
        self.completed = 0
        self.failed = 0
        self.informs = 0
        self.heartbeats_received = 0
        self._last_heard = 0.0

    def register(self, name: str, handler: Handler) -> None:
        """Run ``handler(params)`` for bodies ``[name, params]``."""
        self.handlers[name] = handler

    # -- lifecycle ---------------------------------------------------------------------------------

    def startService(self) -> None:
        Service.startService(self)
        self._factory = SocketFactory(self.reactor)
        if self.pool_kind == "thread":
            # Daemon threads: a handler that never returns does not keep the process alive.
            self._threads = worker_pool("emqp-worker", self.slots)
            self._threads.start()
        else:
            self._processes = ProcessPoolExecutor(max_workers=self.slots)
        self._connect()
        self._periodic.every(self.heartbeat_interval, self._tick)

    def stopService(self) -> defer.Deferred[None]:
        if not self.running:
            return defer.succeed(None)
        Service.stopService(self)
        self._periodic.stop_all()
        if self._socket is not None and self.registered:
            self._socket.send_frames(codec.kbye())
        if self._factory is not None:
            self._factory.shutdown()
        self._socket = None
        self.registered = False
        if self._processes is not None:
            self._processes.shutdown(wait=False, cancel_futures=True)
            self._processes = None
        threads_pool, self._threads = self._threads, None
        if threads_pool is not None:
            return threads.deferToThread(threads_pool.stop)
        return defer.succeed(None)

    def _connect(self) -> None:
        """A fresh socket (nothing stale queued in it) and an INFORM."""
        assert self._factory is not None
        if self._socket is not None:
            self._socket.shutdown()
        self.session += 1
        self.registered = False
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

    def _tick(self) -> None:
        silent = self.reactor.seconds() - self._last_heard
        if silent > self.heartbeat_interval * self.heartbeat_liveness:
            log.warn("broker silent for {silent:.1f}s: connecting again", silent=silent)
            self._connect()
            return
        if self._socket is not None:
            self._socket.send_frames(codec.heartbeat(self.reactor.seconds()))

    # -- messages ----------------------------------------------------------------------------------

    def _on_messages(self, batch: list[list[bytes]]) -> None:
        self._last_heard = self.reactor.seconds()
        for frames in batch:
            try:
                command = codec.parse(frames)
            except EmqpError as error:
                self.drops.drop(error.reason, str(error))
                continue
            if isinstance(command, codec.Request):
                self._run(command)
            elif isinstance(command, codec.Heartbeat):
                self.heartbeats_received += 1
            elif isinstance(command, codec.Ack):
                if not self.registered:
                    self.registered = True
                    for _ in range(self.slots - self.running_jobs):
                        self._send(codec.ready())
            elif isinstance(command, codec.Kbye | codec.Disconnect):
                if self.registered:  # the broker forgot us (stopped, restarted): start over
                    self._connect()
                    return
            else:
                self.drops.drop("unexpected-command", type(command).__name__)

    def _send(self, frames: list[bytes]) -> None:
        if self._socket is not None and not self._socket.closed:
            self._socket.send_frames(frames)

    def _run(self, request: codec.Request) -> None:
        self.running_jobs += 1
        session = self.session
        try:
            deferred = self._execute(request.value())
        except NoHandler as error:
            deferred = defer.fail(error)
        deferred.addCallbacks(
            lambda value: codec.result_value(value),
            self._failure_result,
        )
        deferred.addCallback(self._finished, request, session)
        deferred.addErrback(lambda failure: log.failure("finishing a job failed", failure))

    def _execute(self, body: Any) -> defer.Deferred[Any]:
        if isinstance(body, list) and len(body) == 2 and isinstance(body[0], str):
            name, params = body
        else:
            name, params = "", body
        handler = self.handlers.get(name) or self.handlers.get("")
        if handler is None:
            raise NoHandler(f"no handler for {name!r}")
        if self._processes is not None:
            return _from_future(self.reactor, self._processes.submit(_call, handler, params))
        assert self._threads is not None
        return threads.deferToThreadPool(self.reactor, self._threads, handler, params)

    def _failure_result(self, failure: Any) -> bytes:
        self.failed += 1
        error = failure.value
        return codec.error_result("handler-failed", f"{type(error).__name__}: {error}")

    def _finished(self, result: bytes, request: codec.Request, session: int) -> None:
        self.running_jobs -= 1
        self.completed += 1
        if not self.running or not self.registered:
            return
        if session == self.session and request.headers.reply_requested:
            self._send(codec.reply(result, request.msgid))
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


__all__ = ["EmqpWorker", "Handler", "run_callable"]
