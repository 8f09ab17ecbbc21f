"""Services composed into one process: started in order, stopped in reverse, each stop awaited.

:class:`ProductService` is the ``MultiService`` that ``twistd -n eventbus``, every protocol's own
plugin and tac files run. A service that cannot start stops the process with one line naming
the service, the option and the cause (and a non-zero exit status), never a bare traceback.
"""

from __future__ import annotations

import atexit
import contextlib
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from twisted.application.service import MultiService, Service
from twisted.internet import defer
from twisted.logger import Logger
from twisted.python.failure import Failure

from bus.application.activity import NO_ACTIVITY, ActivitySink, LocalBus
from bus.errors import StartFailed, StartupError
from bus.transport.inbound import DescriptorLimits
from bus.util.memory import freeze_startup_objects

log = Logger(namespace="bus")


class Composition:
    """What the product hands a service it builds (``build(options, composition)``): the
    reactor and clock it runs on, the sink for its activity, where ``/status`` is served.
    A service keeps its state under a ``--data-dir`` option of its own."""

    def __init__(self, reactor: Any = None) -> None:
        self._reactor = reactor
        self.local_bus: LocalBus | None = None
        #: ``host:port`` of the product's ``/status``, once it listens (services record it
        #: in their status.json, so that a CLI given a data directory finds its process).
        self.status_address: str | None = None

    @property
    def reactor(self) -> Any:
        """The reactor every composed service runs on (the one twistd installed)."""
        if self._reactor is None:
            from twisted.internet import reactor

            return reactor
        return self._reactor

    def clock(self) -> float:
        """Now, by the reactor's clock (seconds): what cores are given as their clock."""
        return float(self.reactor.seconds())

    def activity(self, producer: str) -> ActivitySink:
        """The sink a service publishes its activity into (the local bus, when composed)."""
        if self.local_bus is None:
            return NO_ACTIVITY
        return self.local_bus.activity_sink(producer)


@dataclass(slots=True)
class Composed:
    """One service of a composition, with the options it was built from, for ``/status``, the
    console and the messages that name its options."""

    name: str
    service: Service
    #: How this service's options are spelled on the command line (``spark-bridge-``).
    option_prefix: str = ""
    options: Mapping[str, Any] = field(default_factory=dict)


class ProductService(MultiService):
    """Starts its services in the order added and stops them in reverse, awaiting each stop.

    A service's ``startService`` may return a Deferred (as Buildbot's services do): the
    next one starts once it fires. :meth:`when_started` tells when all have started. When
    one fails to start, the failure is logged as one critical line; with
    ``exit_on_failure`` (twistd and tac files) the process then ends with status 1, at once
    when the reactor is not running yet, else once the started services have stopped.
    """

    def __init__(self, exit_on_failure: bool = False, reactor: Any = None) -> None:
        MultiService.__init__(self)
        self.exit_on_failure = exit_on_failure
        self._reactor = reactor
        self.composed: list[Composed] = []
        self._running: list[Composed] = []
        self._start_result: StartFailed | bool | None = None
        self._start_waiters: list[defer.Deferred[None]] = []
        self._stopping: defer.Deferred[None] | None = None
        #: Bounds on connections others open to every ZeroMQ port (0: the defaults).
        self.max_connections = 0
        self.max_connections_per_address = 0
        #: The descriptor limit as found at start and as raised (None before the start).
        self.descriptor_limits: DescriptorLimits | None = None

    @property
    def reactor(self) -> Any:
        """The reactor given, else the global one (imported only when first asked for)."""
        if self._reactor is None:
            from twisted.internet import reactor

            self._reactor = reactor
        return self._reactor

    def add(
        self,
        name: str,
        service: Service,
        option_prefix: str = "",
        options: Mapping[str, Any] | None = None,
    ) -> None:
        """Compose ``service`` under ``name``; it starts after those added before it."""
        service.setName(name)
        self.composed.append(Composed(name, service, option_prefix, options or {}))
        self.addService(service)  # type: ignore[no-untyped-call]

    # -- starting --------------------------------------------------------------------------------

    def startService(self) -> None:
        """Start the services in order; :meth:`when_started` tells how it went."""
        from bus.transport.inbound import configure, raise_descriptor_limit

        Service.startService(self)
        self._stopping = None
        self._start_result = None
        # Before any port is bound: the room the system allows, and what others may take.
        self.descriptor_limits = raise_descriptor_limit()
        configure(self.max_connections, self.max_connections_per_address)
        self._start_from(0)

    def _start_from(self, index: int) -> None:
        while index < len(self.composed):
            entry = self.composed[index]
            try:
                result = entry.service.startService()
            except Exception as error:
                self._start_failed(entry, Failure(error))
                return
            self._running.append(entry)
            if isinstance(result, defer.Deferred):
                result.addCallbacks(
                    lambda _, i=index: self._start_from(i + 1),
                    lambda failure, e=entry: self._start_failed(e, failure, started=True),
                )
                return
            index += 1
        from bus.transport.frames import native as native_frames
        from bus.transport.inbound import policy

        limits, bounds = self.descriptor_limits, policy()
        assert limits is not None  # raised in startService, before any service started
        log.info(
            "started {services} (ZeroMQ messages read and sent {how}); descriptors: soft "
            "limit {soft}{raised}, hard {hard}; connections others open at most {per_port} a "
            "port, {per_address} an address, {share} in all",
            services=", ".join(entry.name for entry in self.composed),
            how="by the compiled helper" if native_frames is not None else "through pyzmq",
            soft=limits.soft,
            raised=f" (raised from {limits.found})" if limits.found != limits.soft else "",
            hard=limits.hard,
            per_port=bounds.per_port,
            per_address=bounds.per_address,
            share=bounds.budget.capacity,
        )
        # Every service has started: what startup made leaves the GC's scans (bus.util.memory).
        self.reactor.callLater(0, freeze_startup_objects)
        self._settle(True)

    def _start_failed(self, entry: Composed, failure: Failure, started: bool = False) -> None:
        if started and entry in self._running:
            self._running.remove(entry)
        error = failure.value if isinstance(failure.value, BaseException) else Exception(failure)
        line = describe_start_failure(entry, error)
        if not isinstance(error, StartupError):  # a bug, not a setting: keep its traceback
            log.failure("{line}", failure, line=line)
        log.critical("{line}", line=line)
        stopping = self._stop_running()
        self._settle(StartFailed(line))
        if not self.exit_on_failure:
            return
        # The started services stop (awaited, which needs the reactor running), then the
        # process ends with status 1; the critical line above is the message.
        atexit.register(_exit_with, 1)
        self.reactor.callWhenRunning(lambda: stopping.addBoth(lambda _: self.reactor.stop()))

    def when_started(self) -> defer.Deferred[None]:
        """Fires once every service has started, or fails with :class:`StartFailed`."""
        waiter: defer.Deferred[None] = defer.Deferred()
        if self._start_result is None:
            self._start_waiters.append(waiter)
        else:
            self._fire(waiter)
        return waiter

    def _settle(self, result: StartFailed | bool) -> None:
        self._start_result = result
        waiters, self._start_waiters = self._start_waiters, []
        for waiter in waiters:
            self._fire(waiter)

    def _fire(self, waiter: defer.Deferred[None]) -> None:
        if isinstance(self._start_result, StartFailed):
            waiter.errback(self._start_result)
        else:
            waiter.callback(None)

    # -- stopping --------------------------------------------------------------------------------

    def stopService(self) -> defer.Deferred[None]:
        """Stop the running services in reverse order, each stop awaited."""
        if self._stopping is None:
            Service.stopService(self)
            self._stopping = self._stop_running()
        return self._stopping

    @defer.inlineCallbacks
    def _stop_running(self) -> Any:
        while self._running:
            entry = self._running.pop()
            log.info("stopping {name}", name=entry.name)
            try:
                yield entry.service.stopService()
            except Exception:
                log.failure("{name} failed to stop cleanly", name=entry.name)
            else:
                log.info("stopped {name}", name=entry.name)


def describe_start_failure(entry: Composed, error: BaseException) -> str:
    """``cannot start eventbus: --port 5556: address already in use (tcp://...)``."""
    if isinstance(error, StartupError):
        return error.line(entry.name, entry.option_prefix, entry.options.get(error.option))
    return f"cannot start {entry.name}: {type(error).__name__}: {error}"


def _exit_with(status: int) -> None:
    """Leave with ``status`` once twistd has finished (pid file, log) and Python is exiting:
    twistd itself always exits 0 after a reactor stop."""
    import os

    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(status)


def standalone(
    name: str,
    build: Callable[[Any, Composition], Service],
    options: Mapping[str, Any],
) -> ProductService:
    """One service as its own process (``twistd -n spark-bridge``), with the same start and
    stop rules as the whole product."""
    product = ProductService(exit_on_failure=True)
    hold_cpu_latency(product, options)
    bound_inbound(product, options)
    product.add(name, build(options, Composition()), "", options)
    return product


def bound_inbound(product: ProductService, options: Mapping[str, Any]) -> None:
    """``--max-connections`` and ``--max-connections-per-address``: applied at start, after
    the descriptor limit was raised, before any port is bound."""
    product.max_connections = int(options.get("max-connections") or 0)
    product.max_connections_per_address = int(options.get("max-connections-per-address") or 0)


def hold_cpu_latency(product: ProductService, options: Mapping[str, Any]) -> None:
    """``--cpu-latency-us``, when given: added first, so that it is held before any service
    serves and released after the last one stopped."""
    if options.get("cpu-latency-us") is None:
        return
    from bus.application.cpulatency import CpuLatencyService

    product.add("cpu-latency", CpuLatencyService(int(options["cpu-latency-us"])), "", options)
