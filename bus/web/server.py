"""``/status`` (JSON), ``/metrics`` (Prometheus text) and the console (``/``, see
:mod:`bus.web.console`) for every composed service, over HTTP.

One port for operators (``--http-port``, default 8642). ``/metrics`` is prometheus_client's
Twisted resource over a registry of our own: the services' counters, read on the reactor
thread at scrape time (the resource runs collectors in a worker thread), the process's
CPU, memory and descriptors, and the release (``bus_build_info``).
"""

from __future__ import annotations

import json
import os
import platform
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from twisted.application.service import Service
from twisted.internet import error as internet_error
from twisted.logger import Logger
from twisted.web import resource, server

from bus import __version__
from bus.application.contract import Measured
from bus.errors import StartupError
from bus.transport.security import is_loopback
from bus.web.actions import Actions, process_actions, refusal_at_headers
from bus.web.alerts.engine import AlertEngine
from bus.web.alerts.rules import Alert
from bus.web.alerts.service import AlertLoop
from bus.web.channel import (
    IDLE_TIMEOUT,
    ConnectionBounds,
    HeadersFirstChannel,
    RefusalCounts,
    TrustedProxies,
)
from bus.web.console.api import OPEN_SEGMENTS, Console, folder, put
from bus.web.console.tail import Source
from bus.web.console.view import Named, read_status

if TYPE_CHECKING:
    from bus.web.history import HistoryRecorder

log = Logger(namespace="bus.web.server")


def service_status(services: Named, started: float) -> dict[str, Any]:
    """What ``/status`` answers: each service's ``status()`` (or whether it runs)."""
    described: dict[str, Any] = {}
    for name, service in services:
        status, error = read_status(service)
        entry: dict[str, Any] = {"running": bool(service.running), **status}
        if error:
            entry["status_error"] = error
        described[name] = entry
    return {
        "version": __version__,
        "pid": os.getpid(),
        "uptime_s": round(time.time() - started, 3),
        "services": described,
    }


def service_metrics(services: Named) -> list[Any]:
    """``bus_service_up`` for every composed service, and the metrics of each running one that has
    them (:class:`bus.application.contract.Measured`)."""
    from bus.util.metrics import gauges_by

    families = [
        gauges_by(
            "bus_service_up",
            "1 when the service is running",
            "service",
            {name: float(bool(service.running)) for name, service in services},
        )
    ]
    for _name, service in services:
        if isinstance(service, Measured) and service.running:
            families.extend(service.metrics())
    return families


class _ServicesCollector:
    """prometheus_client collector: gathers on the reactor thread, yields in the scraper's."""

    def __init__(self, services: Named, reactor: Any) -> None:
        self._services = services
        self._reactor = reactor

    def collect(self) -> Iterable[Any]:
        from twisted.internet.threads import blockingCallFromThread

        return list(blockingCallFromThread(self._reactor, service_metrics, self._services))


def process_status() -> dict[str, Any]:
    """The process's descriptors and the bounds on connections others open to it."""
    import resource as rlimit

    from bus.transport.inbound import open_descriptors, policy

    soft, hard = rlimit.getrlimit(rlimit.RLIMIT_NOFILE)
    return {
        "descriptors": {"soft_limit": soft, "hard_limit": hard, "open": open_descriptors()},
        "inbound_connections": policy().status(),
    }


def process_metrics() -> list[Any]:
    """The process's descriptor limit and the connections others hold and were refused on its ZeroMQ
    ports."""
    from bus.transport.inbound import policy
    from bus.util.metrics import counters_by, gauge, gauges_by

    described = process_status()
    inbound = described["inbound_connections"]
    # Labelled by the socket's name alone: port numbers (ephemeral for some) and node
    # identities would make new series at every restart.
    held = gauges_by(
        "bus_inbound_connections",
        "Connections others hold open on each bound ZeroMQ port, by the port's name",
        "port",
        policy().held_by_name(),
    )
    return [
        gauge(
            "bus_descriptor_soft_limit",
            "The process's soft RLIMIT_NOFILE (raised to the hard one at start)",
            described["descriptors"]["soft_limit"],
        ),
        held,
        counters_by(
            "bus_inbound_connections_refused",
            "Connections others opened that were closed at once, by the limit they passed",
            "reason",
            inbound["refused"],
        ),
    ]


class _Status(resource.Resource):
    isLeaf = True

    def __init__(self, services: Named, started: float) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        self._services = services
        self._started = started

    def render_GET(self, request: Any) -> bytes:
        request.setHeader(b"content-type", b"application/json")
        body = json.dumps(service_status(self._services, self._started), indent=1, default=str)
        return body.encode() + b"\n"


class _QuietSite(server.Site):
    """No access log line per request: a scraper every few seconds would drown the log.
    GET and HEAD only, others refused at their headers, and the connections bounded (see
    :mod:`bus.web.channel`)."""

    noisy = False
    protocol = HeadersFirstChannel  # type: ignore[assignment]
    #: The bounds every connection of the site is kept in (None: unbounded).
    bounds: ConnectionBounds | None = None
    #: Whether a request bears the token (None: the site wants none).
    bears_token: Callable[[Any], bool] | None = None
    #: Why a POST is not let on to its body (see :func:`bus.web.actions.refusal_at_headers`);
    #: None: no POST at all.
    admit_body: (
        Callable[[Any, bytes, int | None, bool, bool], tuple[int, str, str] | None] | None
    ) = None

    def log(self, request: Any) -> None:
        pass


class StatusWebService(Service):
    """Serves ``/status``, ``/metrics`` and the console about ``services`` on
    ``interface:port``."""

    def __init__(
        self,
        services: Named,
        port: int,
        interface: str = "127.0.0.1",
        reactor: Any = None,
        on_listening: Callable[[str], None] | None = None,
        token_file: Path | None = None,
        metrics_open: bool = False,
        tail_source: Source | None = None,
        trusted_proxies: TrustedProxies | None = None,
        history_dir: Path | None = None,
        history_interval: float = 10.0,
        history_keep: float = 86400.0,
        alert_for: Callable[[Alert], float] | None = None,
    ) -> None:
        """``token_file``: every request must bear its token (see :mod:`bus.web.auth`),
        ``/metrics`` excepted with ``metrics_open``. ``tail_source``: the Event BUS the
        console's topic tail watches (see :mod:`bus.web.console.tail`).
        ``trusted_proxies``: reverse proxies whose forwarding header names the client
        (see :mod:`bus.web.channel`). ``history_dir``: where the console's rates are kept,
        ``history_keep`` seconds of them at ``history_interval`` (see
        :mod:`bus.web.history`; None: not kept). ``alert_for``: each shipped rule's ``for``
        in the console's alerts (its own by default; see
        :func:`bus.web.alerts.engine.parse_for`)."""
        from bus.util.reactor import reactor_of

        self.services = services
        self.token_file = token_file
        self.metrics_open = metrics_open
        #: The guard of the whole site when a token is required (its refusals counted).
        self.guard: Any = None
        self.requested_port = port
        self.interface = "0.0.0.0" if interface == "*" else interface
        self.reactor: Any = reactor_of(reactor)
        self.port = 0
        self._listening: Any = None
        self.tail_source: Source = tail_source or (lambda: None)
        #: Requests refused at their headers (a method not served, a body) and connections
        #: the bounds closed, by reason.
        self.header_refusals = RefusalCounts(self.reactor.seconds)
        #: Which connections are read, held or closed (see :mod:`bus.web.channel`).
        self.bounds = ConnectionBounds(
            self.header_refusals, self.reactor, trusted_proxies or TrustedProxies()
        )
        #: The console (once started).
        self.console: Console | None = None
        #: The operators' actions (once started; not named ``actions``, which would make
        #: the port itself look like an :class:`bus.application.contract.Acting` service).
        self.operator_actions: Actions | None = None
        #: Told ``host:port`` (as a client on this machine reaches it) once listening.
        self.on_listening = on_listening
        self.history_dir = history_dir
        self.history_interval = history_interval
        self.history_keep = history_keep
        #: What samples the console's rates to disk (once started, with a history_dir).
        self.history: HistoryRecorder | None = None
        self.alert_for = alert_for
        #: The shipped rules evaluated over this process's metrics (once listening).
        self.alerts: AlertLoop | None = None

    def startService(self) -> None:
        from prometheus_client import CollectorRegistry, Info
        from prometheus_client.process_collector import ProcessCollector
        from prometheus_client.twisted import MetricsResource

        started = time.time()
        registry = CollectorRegistry(auto_describe=False)
        registry.register(_ServicesCollector(self.services, self.reactor))
        ProcessCollector(registry=registry)
        # bus_build_info{version, python} 1: which release answers, for dashboards and alerts.
        Info("bus_build", "The release of bus and the Python that runs it", registry=registry).info(
            {"version": __version__, "python": platform.python_version()}
        )
        root = folder()
        put(root, b"status", _Status(self.services, started))
        put(root, b"metrics", MetricsResource(registry))  # type: ignore[no-untyped-call]
        # The alerts' instance is the port (known once listening), as a Prometheus names it.
        engine = AlertEngine({"job": "bus", "instance": ""}, for_seconds=self.alert_for)
        self.alerts = AlertLoop(engine, self.reactor, lambda: service_metrics(self.services))
        self.console = Console(
            self.services, self.reactor, started, self.tail_source, alerts=self.alerts
        )
        if self.history_dir is not None:
            self._start_history(self.history_dir)
        self.console.mount(root)  # "/" (a postpath of one empty segment) is the page
        self.operator_actions = Actions(self.services, process_actions)
        self.operator_actions.mount(root)
        site = _QuietSite(self._guarded(root), timeout=IDLE_TIMEOUT)  # type: ignore[no-untyped-call]
        site.bounds = self.bounds
        if self.guard is not None:
            site.bears_token = self.guard.bears_token
        token_required = self.guard is not None

        def admit_body(
            request: Any, path: bytes, length: int | None, chunked: bool, bears: bool
        ) -> tuple[int, str, str] | None:
            return refusal_at_headers(request, path, length, chunked, token_required, bears)

        site.admit_body = admit_body
        try:
            self._listening = self.reactor.listenTCP(
                self.requested_port, site, backlog=1024, interface=self.interface
            )
        except internet_error.CannotListenError as error:
            raise StartupError(
                "http-port", f"cannot listen on {self.interface}: {error.socketError}"
            ) from None
        self.port = self._listening.getHost().port
        host = "127.0.0.1" if self.interface == "0.0.0.0" else self.interface
        engine.sampler.labels["instance"] = f"{host}:{self.port}"
        self.alerts.start()
        if self.on_listening is not None:
            self.on_listening(f"{host}:{self.port}")
        Service.startService(self)
        log.info(
            "console on http://{host}:{port}/, status on /status, metrics on /metrics{token}",
            host=self.interface,
            port=self.port,
            token=""
            if self.guard is None
            else " (bearer token required" + (", /metrics open)" if self.metrics_open else ")"),
        )
        if self.guard is None and not is_loopback(self.interface):
            log.warn(
                "/status and /metrics on {host}:{port} are open to anyone who can reach it "
                "(give --http-token-file, or --http-bind 127.0.0.1)",
                host=self.interface,
                port=self.port,
            )

    def _start_history(self, directory: Path) -> None:
        from bus.web.history import HistoryRecorder, HistoryResource, RateArchive

        archive = RateArchive(directory, self.history_interval, self.history_keep)
        recorder = HistoryRecorder(self.services, archive, self.reactor)
        try:
            recorder.start()
        except OSError as error:
            raise StartupError("http-history-dir", f"cannot use {directory}: {error}") from None
        self.history = recorder
        assert self.console is not None
        self.console.resources[b"history"] = HistoryResource(archive, self.reactor)

    def _guarded(self, root: resource.Resource) -> resource.Resource:
        """Every resource of the site behind the bearer token, when one is required."""
        if self.token_file is None:
            return root
        from bus.web.auth import BearerGuard, TokenFile

        opened = [*OPEN_SEGMENTS, b"metrics"] if self.metrics_open else list(OPEN_SEGMENTS)
        self.guard = BearerGuard(root, TokenFile(self.token_file), opened)
        return self.guard  # type: ignore[no-any-return]

    def stopService(self) -> Any:
        Service.stopService(self)
        if self.alerts is not None:
            self.alerts.stop()
        if self.console is not None:
            self.console.stop()
        if self.history is not None:
            self.history.stop()
            self.history = None
        self.bounds.stop()
        listening, self._listening = self._listening, None
        return None if listening is None else listening.stopListening()

    def status(self) -> dict[str, Any]:
        """The port itself: endpoint, token, refusals, its connections and their bounds, the
        process and the console."""
        guard = self.guard
        return {
            "endpoint": f"http://{self.interface}:{self.port}/",
            "token_required": guard is not None,
            "metrics_open": self.metrics_open or guard is None,
            "refused": dict(guard.refusals) if guard is not None else {},
            "refused_at_headers": dict(self.header_refusals.counts),
            "connections": self.bounds.status(),
            "process": process_status(),
            "console": self.console.status() if self.console is not None else None,
            "actions": self.operator_actions.status()
            if self.operator_actions is not None
            else None,
            "history": self.history.archive.status() if self.history is not None else None,
            "alerts": self.alerts.status() if self.alerts is not None else None,
        }

    def metrics(self) -> list[Any]:
        """The HTTP port's refusals, its connections and :func:`process_metrics`."""
        from bus.util.metrics import counters_by, gauges_by

        refused = dict(self.guard.refusals) if self.guard is not None else {}
        bounds = self.bounds.status()
        return [
            counters_by(
                "bus_http_refusals",
                "HTTP requests refused for want of the bearer token, by reason",
                "reason",
                refused,
            ),
            *process_metrics(),
            counters_by(
                "bus_http_refused_at_headers",
                "HTTP requests refused at their headers (a method not served, a body, too many "
                "in progress from one client) and connections the bounds closed (displaced, "
                "headers past their deadline, no place at all), by reason",
                "reason",
                dict(self.header_refusals.counts),
            ),
            gauges_by(
                "bus_http_connections",
                "HTTP connections open now: waiting for a request (or idle between two) and "
                "serving one",
                "state",
                {state: float(bounds[state]) for state in ("waiting", "serving")},
            ),
            *(self.operator_actions.metrics() if self.operator_actions is not None else []),
            *self._history_metrics(),
        ]

    def _history_metrics(self) -> list[Any]:
        from bus.util.metrics import counter, counters_by

        if self.history is None:
            return []
        kept = self.history.archive.status()
        return [
            counter(
                "bus_http_history_samples",
                "Rates the console's history wrote to disk (one per series and interval)",
                kept["written"],
            ),
            counter(
                "bus_http_history_write_errors",
                "Writes of the console's history that failed (a full disk)",
                kept["write_errors"],
            ),
            counter(
                "bus_http_history_invalid_slots",
                "Slots of the console's history files read with a wrong checksum (skipped)",
                kept["invalid_slots"],
            ),
            counters_by(
                "bus_http_history_files",
                "Files of the console's history found at start that were created, extended "
                "(cut short), reset (not a ring of this shape: moved aside) or unreadable",
                "result",
                kept["files"],
            ),
        ]
