"""The shipped rules evaluated in the product, over its own samples: what a Prometheus
scraping it would fire, without one.

:class:`Sampler` keeps the last value of every series the rules read and, for those read
over a window (``increase``, ``rate``, ``deriv``), the samples of that window.
:class:`AlertEngine` evaluates every rule at each sample (an injected clock, no I/O): a
series that meets its rule's condition is *pending* from then, *firing* once it has met
it for the rule's ``for``, and gone as soon as it does not. :func:`prometheus_json` shapes
the alerts as Prometheus's ``/api/v1/alerts`` does, so tools that read one read the other.

The product's series carry ``instance`` (its HTTP port, as a Prometheus target names it)
and ``job`` (``bus``), so that the annotations read as they do from a Prometheus.
"""

from __future__ import annotations

import math
import re
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

from bus.web.alerts.expr import Labels, Vector
from bus.web.alerts.rules import Alert, alerts

#: One sample as prometheus_client yields it: name, labels, value.
Sample = tuple[str, Mapping[str, str], float]


class _Window:
    """One series' samples within its window: (time, value, counter-adjusted value), at
    most one every ``resolution`` seconds besides the last (which each sample replaces
    until it is that old), so a window holds ~60 points whatever the sampling period."""

    __slots__ = ("points", "resolution")

    def __init__(self, resolution: float) -> None:
        self.points: deque[tuple[float, float, float]] = deque()
        self.resolution = resolution

    def add(self, now: float, value: float) -> None:
        points = self.points
        if points:
            _, last, adjusted = points[-1]
            # A counter that went down was reset: it grew by its new value since.
            adjusted += value - last if value >= last else value
            if len(points) >= 2 and now - points[-2][0] <= self.resolution:
                points.pop()  # the newest stands for the last `resolution` seconds
        else:
            adjusted = value
        points.append((now, value, adjusted))

    def trim(self, since: float) -> None:
        while self.points and self.points[0][0] < since:
            self.points.popleft()


class Sampler:
    """The series the rules read, sampled from the product's metric families."""

    def __init__(
        self,
        names: Iterable[str],
        windows: Mapping[str, float],
        labels: Mapping[str, str],
    ) -> None:
        """``names``: the series read; ``windows``: the longest window each ranged series
        is read over; ``labels``: added to every series (``instance``, ``job``)."""
        self._names = frozenset(names)
        self._windows = dict(windows)
        self.labels = dict(labels)
        self._now = 0.0
        self._instant: dict[str, Vector] = {}
        self._ranges: dict[str, dict[Labels, _Window]] = {name: {} for name in self._windows}

    def add(self, now: float, samples: Iterable[Sample]) -> None:
        """The samples taken at ``now`` (every series of the product; those the rules do not
        read are skipped)."""
        self._now = now
        instant: dict[str, Vector] = {}
        for name, own, value in samples:
            if name not in self._names:
                continue
            merged = dict(own)
            merged.update(self.labels)
            key = tuple(sorted(merged.items()))
            instant.setdefault(name, {})[key] = value
            ranged = self._ranges.get(name)
            if ranged is not None:
                window = ranged.get(key)
                if window is None:
                    window = ranged[key] = _Window(self._windows[name] / 60)
                window.add(now, value)
        self._instant = instant
        for name, series in self._ranges.items():
            since = now - self._windows[name]
            for key in list(series):
                series[key].trim(since)
                if not series[key].points:
                    del series[key]  # gone for a whole window

    def now(self) -> float:
        """The evaluation's time (that of the last samples, unless :meth:`at` moved it)."""
        return self._now

    def at(self, now: float) -> None:
        """Evaluate at ``now`` (no earlier than the last samples)."""
        self._now = max(now, self._now)

    def instant(self, name: str) -> Vector:
        """Every series ``name`` at the last samples."""
        return self._instant.get(name, {})

    def _points(self, name: str, window: float) -> Iterable[tuple[Labels, list[Any]]]:
        since = self._now - window
        for key, series in self._ranges.get(name, {}).items():
            points = [p for p in series.points if p[0] >= since]
            if len(points) >= 2:
                yield key, points

    def increase(self, name: str, window: float) -> Vector:
        """How much each counter grew in the window (resets counted from zero), extrapolated
        to the window's edges as Prometheus does."""
        out: Vector = {}
        start = self._now - window
        for key, points in self._points(name, window):
            first_t, first_v, first_adj = points[0]
            last_t, _, last_adj = points[-1]
            grown = last_adj - first_adj
            sampled = last_t - first_t
            if sampled <= 0:
                continue
            average = sampled / (len(points) - 1)
            to_start, to_end = first_t - start, self._now - last_t
            if grown > 0 and first_v >= 0:
                # A counter does not go below zero: extrapolate no further back than that.
                to_start = min(to_start, sampled * (first_v / grown))
            threshold = average * 1.1
            span = sampled
            span += to_start if to_start < threshold else average / 2
            span += to_end if to_end < threshold else average / 2
            out[key] = grown * span / sampled
        return out

    def deriv(self, name: str, window: float) -> Vector:
        """Least-squares slope per second of each gauge over the window."""
        out: Vector = {}
        for key, points in self._points(name, window):
            # Relative to the first point: a constant gauge gives exactly 0, not a rounding.
            t0, v0 = points[0][0], points[0][1]
            n = len(points)
            mean_t = sum(p[0] - t0 for p in points) / n
            mean_v = sum(p[1] - v0 for p in points) / n
            cov = sum((p[0] - t0 - mean_t) * (p[1] - v0 - mean_v) for p in points)
            var = sum((p[0] - t0 - mean_t) ** 2 for p in points)
            if var > 0:
                out[key] = cov / var
        return out


@dataclass
class Active:
    """An alert pending or firing: its rule, labels, since when, its value now."""

    rule: Alert
    labels: dict[str, str]
    state: str
    active_at: float
    value: float
    annotations: dict[str, str]

    @property
    def service(self) -> str:
        """The console card it belongs to."""
        return self.labels.get("service") or self.rule.service


_TEMPLATE = re.compile(r"\{\{\s*\$(labels\.(\w+)|value)(\s*\|\s*humanize)?\s*\}\}")


def go_float(value: float) -> str:
    """``value`` as Go prints a float64 (``{{ $value }}`` in a Prometheus template)."""
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    if value == 0:
        return "0"
    sign, digits, exponent = Decimal(repr(value)).normalize().as_tuple()
    assert isinstance(exponent, int)
    text = "".join(map(str, digits))
    point = exponent + len(digits) - 1  # the decimal exponent of the first digit
    minus = "-" if sign else ""
    if point < -4 or point >= 6:  # strconv.FormatFloat(v, "g", -1, 64)
        mantissa = text[0] + ("." + text[1:] if len(text) > 1 else "")
        return f"{minus}{mantissa}e{'-' if point < 0 else '+'}{abs(point):02d}"
    return minus + format(Decimal(repr(abs(value))).normalize(), "f")


def humanize(value: float) -> str:
    """Prometheus's ``humanize``: SI prefixes, four significant digits."""
    if value == 0 or math.isnan(value) or math.isinf(value):
        return f"{value:.4g}"
    prefixes = ["", "k", "M", "G", "T", "P", "E", "Z", "Y"]
    if abs(value) >= 1:
        index = 0
        while abs(value) >= 1000 and index < len(prefixes) - 1:
            value /= 1000
            index += 1
        return f"{value:.4g}{prefixes[index]}"
    small = ["", "m", "u", "n", "p", "f", "a", "z", "y"]
    index = 0
    while abs(value) < 1 and index < len(small) - 1:
        value *= 1000
        index += 1
    return f"{value:.4g}{small[index]}"


def render(template: str, labels: Mapping[str, str], value: float) -> str:
    """An annotation's template with its labels and value filled in (the forms the shipped
    rules use: ``$labels.NAME``, ``$value``, ``$value | humanize``)."""

    def fill(match: re.Match[str]) -> str:
        if match.group(2) is not None:
            return labels.get(match.group(2), "")
        return humanize(value) if match.group(3) else go_float(value)

    return _TEMPLATE.sub(fill, template)


class AlertEngine:
    """Every shipped rule over a :class:`Sampler`: pending, firing, since when."""

    def __init__(
        self,
        labels: Mapping[str, str],
        rules: Iterable[Alert] | None = None,
        for_seconds: Callable[[Alert], float] | None = None,
    ) -> None:
        """``labels``: every series' ``instance`` and ``job``; ``for_seconds``: a rule's
        ``for`` (its own by default; tests shorten it)."""
        self.rules = list(alerts() if rules is None else rules)
        self._for = for_seconds or (lambda rule: rule.for_)
        names: set[str] = set()
        windows: dict[str, float] = {}
        for rule in self.rules:
            names.update(rule.expr.names())
            for name, window in rule.expr.windows():
                windows[name] = max(window, windows.get(name, 0.0))
        self.sampler = Sampler(names, windows, labels)
        #: (alert name, labels) -> the alert, pending or firing.
        self.active: dict[tuple[str, Labels], Active] = {}
        #: Evaluations done.
        self.evaluations = 0

    def evaluate(self, now: float, samples: Iterable[Sample]) -> None:
        """Take the samples of ``now`` and move every alert on."""
        self.sampler.add(now, samples)
        self.step(now)

    def step(self, now: float) -> None:
        """Move every alert on at ``now``, over the samples taken so far."""
        self.sampler.at(now)
        self.evaluations += 1
        seen: set[tuple[str, Labels]] = set()
        for rule in self.rules:
            hold = self._for(rule)
            for labels, value in rule.expr.evaluate(self.sampler).items():
                key = (rule.name, labels)
                seen.add(key)
                alert = self.active.get(key)
                if alert is None:
                    series = dict(labels)
                    full = {**series, "alertname": rule.name, "severity": rule.severity}
                    alert = self.active[key] = Active(rule, full, "pending", now, value, {})
                alert.value = value
                if alert.state == "pending" and now - alert.active_at >= hold:
                    alert.state = "firing"
                alert.annotations = {
                    "summary": render(rule.summary, alert.labels, value),
                    "description": render(rule.description, alert.labels, value),
                }
        for key in [key for key in self.active if key not in seen]:
            del self.active[key]  # resolved

    def alerts(self) -> list[Active]:
        """The alerts pending and firing: firing first, then the oldest first."""
        return sorted(
            self.active.values(),
            key=lambda a: (a.state != "firing", a.active_at, a.rule.name),
        )


def _rfc3339(seconds: float) -> str:
    stamp = datetime.fromtimestamp(seconds, UTC).isoformat(timespec="milliseconds")
    return stamp.replace("+00:00", "Z")


def _go_e(value: float) -> str:
    """``value`` as Go's ``strconv.FormatFloat(v, 'e', -1, 64)`` (the API's ``value``)."""
    if math.isnan(value) or math.isinf(value):
        return go_float(value)
    if value == 0:
        return "0e+00"
    sign, digits, exponent = Decimal(repr(value)).normalize().as_tuple()
    assert isinstance(exponent, int)
    text = "".join(map(str, digits))
    point = exponent + len(digits) - 1
    mantissa = text[0] + ("." + text[1:] if len(text) > 1 else "")
    return f"{'-' if sign else ''}{mantissa}e{'-' if point < 0 else '+'}{abs(point):02d}"


def alert_json(alert: Active) -> dict[str, Any]:
    """One alert as Prometheus's API gives it, with ``service`` (the console's card)."""
    return {
        "labels": alert.labels,
        "annotations": alert.annotations,
        "state": alert.state,
        "activeAt": _rfc3339(alert.active_at),
        "value": _go_e(alert.value),
        "service": alert.service,
    }


def prometheus_json(active: Iterable[Active]) -> dict[str, Any]:
    """``/api/v1/alerts`` as Prometheus answers it."""
    return {"status": "success", "data": {"alerts": [alert_json(a) for a in active]}}


def parse_for(text: str) -> Callable[[Alert], float]:
    """``--http-alert-for``: ``NAME=DURATION`` pairs, comma-separated, ``*`` for every rule
    (``*=2s,EmqpQueueWithoutWorkers=10s``); a duration is seconds or PromQL's ``30s``,
    ``2m``, ``1h``. Rules not named keep their own ``for``."""
    chosen: dict[str, float] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        name, sep, value = part.partition("=")
        if not sep or not name.strip():
            raise ValueError(f"{part!r}: NAME=DURATION")
        chosen[name.strip()] = seconds(value.strip())
    known = {rule.name for rule in alerts()} | {"*"}
    unknown = sorted(set(chosen) - known)
    if unknown:
        raise ValueError(f"no such rule: {', '.join(unknown)}")

    def hold(rule: Alert) -> float:
        return chosen.get(rule.name, chosen.get("*", rule.for_))

    return hold


def seconds(text: str) -> float:
    """A duration: ``90``, ``1.5``, ``30s``, ``2m``, ``1h``."""
    units = {"s": 1, "m": 60, "h": 3600}
    scale = units.get(text[-1:], 0)
    value = float(text[:-1] if scale else text)
    if value < 0 or math.isnan(value):
        raise ValueError(f"{text!r}: a duration of zero or more")
    return value * (scale or 1)
