"""The console's resources on the HTTP port: the page and its API.

* ``GET /``: the console (HTML, CSS and JavaScript shipped as package data: no build step,
  no CDN, works offline);
* ``GET /api/v1/state``: every composed service as the console shows it (JSON);
* ``GET /api/v1/stream``: Server-Sent Events, ``history`` (the rates of the minutes
  watched) once, then ``state`` every second;
* ``GET /api/v1/history``: the rates kept on disk (see :mod:`bus.web.history`), when the
  HTTP port keeps them;
* ``GET /api/v1/alerts``: the shipped rules' alerts pending and firing, evaluated in the
  product (:mod:`bus.web.alerts`), shaped as Prometheus's ``/api/v1/alerts``; each
  ``state`` frame carries them too (``alerts``);
* ``GET /api/v1/tail?topic=/orders/``: Server-Sent Events, ``tail``, then ``event`` for
  each event of the subtree (at most 20 a second) and ``skipped`` (how many were not sent)
  each second some were.

With ``--http-token-file`` the API wants the token as every resource does; the page and
its static files hold no data and are served to anyone (the page asks for the token).
"""

from __future__ import annotations

import json
from importlib import resources as package_files
from typing import Any

from twisted.web import pages, resource, server

from bus.web.alerts.service import AlertLoop, AlertsResource
from bus.web.console.history import RateHistory
from bus.web.console.stream import StreamHub, sse
from bus.web.console.tail import Source, TailHub
from bus.web.console.view import Named, snapshot

#: What the page is made of: file name -> content type.
STATIC = {
    "index.html": b"text/html; charset=utf-8",
    "console.js": b"text/javascript; charset=utf-8",
    "actions.js": b"text/javascript; charset=utf-8",
    "alerts.js": b"text/javascript; charset=utf-8",
    "console.css": b"text/css; charset=utf-8",
}

#: What the page may load: its own files, the API, and nothing from anywhere else.
CSP = (
    b"default-src 'self'; img-src 'self' data:; connect-src 'self'; "
    b"frame-ancestors 'none'; base-uri 'none'; form-action 'none'"
)

#: The first path segments served without the token (no data in them).
OPEN_SEGMENTS = (b"", b"static")


class Console:
    """The console's state: the services it shows, their rate history, the open streams."""

    def __init__(
        self,
        services: Named,
        reactor: Any,
        started: float,
        source: Source,
        period: float = 1.0,
        alerts: AlertLoop | None = None,
    ) -> None:
        self.services = services
        #: The shipped rules evaluated in the product (None: no alerts on this port).
        self.alerts = alerts
        self.reactor = reactor
        self.started = started
        self.period = period
        self.history = RateHistory()
        self.streams = StreamHub(reactor, period, self._tick, self._welcome)
        self.tails = TailHub(reactor, source)
        #: More paths of the API (name -> resource), put under ``/api/v1`` by :meth:`mount`.
        self.resources: dict[bytes, resource.Resource] = {}
        #: Service name -> (running, since when, by the wall clock): up or down since.
        self._since: dict[str, tuple[bool, float]] = {}

    def state(self) -> dict[str, Any]:
        """Every service now, with its counters and its rates of the last sample."""
        state, counts = snapshot(self.services, self.started)
        last = self.history.samples[-1] if self.history.samples else {"rates": {}}
        return self._annotate(state, counts, last["rates"])

    def _sample(self) -> dict[str, Any]:
        state, counts = snapshot(self.services, self.started)
        sample = self.history.add(self.reactor.seconds(), counts, 3 * self.period)
        state["t"] = sample["t"]  # the sample's time: its rates join the page's charts
        return self._annotate(state, counts, sample["rates"])

    def _annotate(
        self, state: dict[str, Any], counts: dict[str, Any], rates: dict[str, Any]
    ) -> dict[str, Any]:
        """Each service's counters, rates, and since when it is up (or down)."""
        now = state["time"]
        for entry in state["services"]:
            name, running = entry["name"], entry["running"]
            entry["counters"] = counts.get(name, {})
            entry["rates"] = rates.get(name, {})
            known = self._since.get(name)
            if known is None or known[0] != running:
                # First seen (the console starts after every service): since the process.
                since = self.started if known is None and running else now
                known = self._since[name] = (running, since)
            uptime = entry["status"].get("uptime_s")
            entry["since"] = known[1]
            if running:
                entry["uptime_s"] = uptime if isinstance(uptime, int | float) else now - known[1]
        if self.alerts is not None:
            state["alerts"] = self.alerts.listed()
        return state

    def _tick(self) -> bytes:
        return sse("state", self._sample())

    def _welcome(self) -> bytes:
        samples = self.history.samples
        if samples and self.reactor.seconds() - samples[-1]["t"] <= 3 * self.period:
            # Sampled a moment ago: consoles opening together must not make rates of a
            # millisecond's difference.
            state = self.state()
        else:
            # The first console in a while: this sample starts a run, the next tick's
            # rates are measured from it (taken before the history is sent).
            state = self._sample()
        return sse("history", self.history.recent()) + sse("state", state)

    def status(self) -> dict[str, Any]:
        """The console's streams and tails, for ``/status``."""
        return {
            "streams": len(self.streams.streams),
            "streams_opened": self.streams.opened,
            "streams_refused": self.streams.refused,
            "frames_skipped": self.streams.skipped,
            "tail": self.tails.status(),
        }

    def stop(self) -> None:
        """Close every open stream and tail."""
        self.streams.close_all()
        self.tails.close()

    def mount(self, root: resource.Resource) -> None:
        """Put the page at ``/`` and the API under ``/api/v1`` of ``root``."""
        api, version = folder(), folder()
        put(api, b"v1", version)
        put(version, b"state", _State(self))
        put(version, b"stream", _Stream(self))
        put(version, b"tail", _Tail(self))
        for segment, child in self.resources.items():
            put(version, segment, child)
        if self.alerts is not None:
            put(version, b"alerts", AlertsResource(self.alerts))
        put(root, b"api", api)
        files = {name: _read(name) for name in STATIC}
        static = folder()
        for name, kind in STATIC.items():
            put(static, name.encode(), _File(files[name], kind))
        put(root, b"static", static)
        put(root, b"", _File(files["index.html"], STATIC["index.html"]))


def put(parent: Any, name: bytes, child: Any) -> None:
    """``parent.putChild`` (twisted.web's resources are untyped)."""
    parent.putChild(name, child)


class _Folder(resource.Resource):
    def getChild(self, path: bytes, request: Any) -> Any:
        # Resource's own default is a deprecated page that does not escape the path.
        return pages.notFound()


def folder() -> Any:
    """A resource of children only, answering 404 (escaped) for any other path."""
    return _Folder()  # type: ignore[no-untyped-call]


def _read(name: str) -> bytes:
    return package_files.files("bus.web.console").joinpath("static", name).read_bytes()


class _File(resource.Resource):
    isLeaf = True

    def __init__(self, body: bytes, kind: bytes) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        self.body = body
        self.kind = kind

    def render_GET(self, request: Any) -> bytes:
        request.setHeader(b"content-type", self.kind)
        request.setHeader(b"cache-control", b"no-cache")
        # The page runs its own script and nothing else, and is never framed: what a
        # publisher put in a topic or a value can only ever be text on it.
        request.setHeader(b"content-security-policy", CSP)
        request.setHeader(b"x-content-type-options", b"nosniff")
        request.setHeader(b"x-frame-options", b"DENY")
        return self.body


class _ConsoleLeaf(resource.Resource):
    """One path of the console's API, answered from ``console``."""

    isLeaf = True

    def __init__(self, console: Console) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        self.console = console


class _State(_ConsoleLeaf):
    def render_GET(self, request: Any) -> bytes:
        request.setHeader(b"content-type", b"application/json")
        request.setHeader(b"cache-control", b"no-store")
        return json.dumps(self.console.state(), default=str).encode() + b"\n"


class _Stream(_ConsoleLeaf):
    def render_GET(self, request: Any) -> Any:
        if not self.console.streams.open(request):
            return _error(request, "too many consoles are open")
        return server.NOT_DONE_YET


class _Tail(_ConsoleLeaf):
    def render_GET(self, request: Any) -> Any:
        prefix = (request.args.get(b"topic") or [b"/"])[0]
        if not prefix.startswith(b"/") or len(prefix) > 255:
            request.setResponseCode(400)
            return _error(request, "topic: a subtree, such as /orders/ (at most 255 bytes)")
        why = self.console.tails.open(request, prefix)
        if why is not None:
            return _error(request, why)
        return server.NOT_DONE_YET


def _error(request: Any, message: str) -> bytes:
    request.setHeader(b"content-type", b"application/json")
    return json.dumps({"error": message}).encode() + b"\n"
