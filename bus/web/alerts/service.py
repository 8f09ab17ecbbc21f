"""The alert engine on the reactor: the product's metric families sampled every
``interval`` seconds (the console's sampling period), whether or not a console is open,
since a ``for`` counts from when a condition began; and ``/api/v1/alerts``."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from twisted.internet import task
from twisted.logger import Logger
from twisted.web import resource

from bus.web.alerts.engine import AlertEngine, Sample, alert_json, prometheus_json

log = Logger(namespace="bus.web.alerts")


def flatten(families: Iterable[Any]) -> Iterator[Sample]:
    """Every sample of prometheus_client metric families, as (name, labels, value)."""
    for family in families:
        for sample in family.samples:
            yield sample.name, sample.labels, float(sample.value)


class AlertLoop:
    """Evaluates ``engine`` over ``collect()`` (metric families, on the reactor thread)
    every ``interval`` seconds while started."""

    def __init__(
        self,
        engine: AlertEngine,
        reactor: Any,
        collect: Callable[[], Iterable[Any]],
        interval: float = 1.0,
    ) -> None:
        self.engine = engine
        self.reactor = reactor
        self.interval = interval
        self._collect = collect
        self._loop: task.LoopingCall | None = None
        #: Evaluations that raised (logged; the loop goes on).
        self.failures = 0
        #: CPU seconds of the reactor thread the evaluations took (collecting the metrics included).
        self.cpu_s = 0.0

    def start(self) -> None:
        """Evaluate now and every ``interval`` seconds."""
        self._loop = task.LoopingCall(self.tick)
        self._loop.clock = self.reactor
        self._loop.start(self.interval, now=True)

    def tick(self) -> None:
        """One evaluation (a failure is logged and counted, never ends the loop)."""
        started = time.thread_time()
        try:
            self.engine.evaluate(self.reactor.seconds(), flatten(self._collect()))
        except Exception:
            self.failures += 1
            log.failure("alert evaluation failed")
        self.cpu_s += time.thread_time() - started

    def stop(self) -> None:
        """Stop evaluating."""
        if self._loop is not None and self._loop.running:
            self._loop.stop()
        self._loop = None

    def listed(self) -> list[dict[str, Any]]:
        """The alerts pending and firing, as the API lists them."""
        return [alert_json(alert) for alert in self.engine.alerts()]

    def status(self) -> dict[str, Any]:
        """For ``/status``: how many are pending and firing, and the evaluations."""
        states = [alert.state for alert in self.engine.alerts()]
        return {
            "rules": len(self.engine.rules),
            "interval_s": self.interval,
            "firing": states.count("firing"),
            "pending": states.count("pending"),
            "evaluations": self.engine.evaluations,
            "failures": self.failures,
            "cpu_s": round(self.cpu_s, 3),
        }


class AlertsResource(resource.Resource):
    """``GET /api/v1/alerts``: the alerts pending and firing, shaped as Prometheus's."""

    isLeaf = True

    def __init__(self, loop: AlertLoop) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        self.loop = loop

    def render_GET(self, request: Any) -> bytes:
        """The alerts as JSON, never cached."""
        request.setHeader(b"content-type", b"application/json")
        request.setHeader(b"cache-control", b"no-store")
        body = prometheus_json(self.loop.engine.alerts())
        return json.dumps(body).encode() + b"\n"
