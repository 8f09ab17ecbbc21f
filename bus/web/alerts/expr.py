"""The conditions of the shipped alerts, as a small structure that gives both their PromQL
text (for ``docs/prometheus/alerts.yml``) and their value over the product's own samples
(for the console), so that the two cannot say different things.

Only what the rules use is here: a series by name and label matchers, ``increase``,
``rate`` and ``deriv`` over a window, a comparison with a number (a filter, as in PromQL),
``and on (...)``, ``or``, ``sum by``, ``count without``, ``time() - series`` and a recorded
series. A vector is a mapping of label sets (sorted tuples of pairs, no metric name) to
values, as an instant query answers.

In the product the range functions are not extrapolated to the window's edges as
Prometheus's are: ``increase(x[5m]) > 0`` agrees, a threshold above zero may be crossed a
sample later or earlier.
"""

from __future__ import annotations

import operator
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Protocol

#: A series' labels, sorted by name (the metric's name is not one of them).
Labels = tuple[tuple[str, str], ...]
#: An instant vector: each series' labels and value.
Vector = dict[Labels, float]


class Samples(Protocol):
    """What the expressions read: the product's series now and over their windows."""

    def now(self) -> float:
        """The evaluation's time, seconds since the epoch."""
        ...

    def instant(self, name: str) -> Vector:
        """Every series named ``name`` at the last sample."""
        ...

    def increase(self, name: str, window: float) -> Vector:
        """How much each counter ``name`` grew within the last ``window`` seconds (a reset
        counts from zero); a series needs two samples in the window."""
        ...

    def deriv(self, name: str, window: float) -> Vector:
        """The least-squares slope per second of each gauge ``name`` over the window; a
        series needs two samples in the window."""
        ...


class Expr:
    """A condition's node: its PromQL text and its value over :class:`Samples`."""

    def promql(self) -> str:
        """The node as PromQL."""
        raise NotImplementedError

    def evaluate(self, samples: Samples) -> Vector:
        """The node's instant vector over ``samples``."""
        raise NotImplementedError

    def windows(self) -> Iterator[tuple[str, float]]:
        """The series read over a window (name, seconds): the sampler keeps that much."""
        return iter(())

    def names(self) -> Iterator[str]:
        """Every series name the node reads."""
        return iter(())


def duration(seconds: float) -> str:
    """``seconds`` as PromQL writes a duration (``5m``, ``30s``, ``1h``)."""
    whole = int(seconds)
    for unit, size in (("h", 3600), ("m", 60)):
        if whole >= size and whole % size == 0:
            return f"{whole // size}{unit}"
    return f"{whole}s"


def number(value: float) -> str:
    """A threshold as the rules write it (``0``, ``10000``, ``0.5``)."""
    return str(int(value)) if value == int(value) else repr(value)


@dataclass(frozen=True)
class Series(Expr):
    """``name{label="value", label=~"regex"}``: matchers are (label, op, value), op ``=``,
    ``!=`` or ``=~``."""

    name: str
    matchers: tuple[tuple[str, str, str], ...] = ()

    def promql(self) -> str:
        if not self.matchers:
            return self.name
        inner = ", ".join(f'{label}{op}"{value}"' for label, op, value in self.matchers)
        return f"{self.name}{{{inner}}}"

    def matches(self, labels: Labels) -> bool:
        """Whether a series' labels pass every matcher."""
        found = dict(labels)
        for label, op, value in self.matchers:
            have = found.get(label, "")
            if op == "=" and have != value:
                return False
            if op == "!=" and have == value:
                return False
            if op == "=~" and re.fullmatch(value, have) is None:
                return False
        return True

    def select(self, vector: Vector) -> Vector:
        """The series of ``vector`` that pass the matchers."""
        if not self.matchers:
            return vector
        return {labels: value for labels, value in vector.items() if self.matches(labels)}

    def evaluate(self, samples: Samples) -> Vector:
        return self.select(samples.instant(self.name))

    def names(self) -> Iterator[str]:
        yield self.name


@dataclass(frozen=True)
class Over(Expr):
    """``function(series[window])``: ``increase``, ``rate`` or ``deriv``."""

    function: str
    series: Series
    window: float

    def promql(self) -> str:
        return f"{self.function}({self.series.promql()}[{duration(self.window)}])"

    def evaluate(self, samples: Samples) -> Vector:
        if self.function == "deriv":
            return self.series.select(samples.deriv(self.series.name, self.window))
        grown = self.series.select(samples.increase(self.series.name, self.window))
        if self.function == "rate":
            return {labels: value / self.window for labels, value in grown.items()}
        return grown

    def windows(self) -> Iterator[tuple[str, float]]:
        yield self.series.name, self.window

    def names(self) -> Iterator[str]:
        yield self.series.name


def increase(series: Series, window: float) -> Over:
    """``increase(series[window])``."""
    return Over("increase", series, window)


def rate(series: Series, window: float) -> Over:
    """``rate(series[window])``."""
    return Over("rate", series, window)


def deriv(series: Series, window: float) -> Over:
    """``deriv(series[window])``."""
    return Over("deriv", series, window)


_COMPARE = {
    "==": operator.eq,
    "!=": operator.ne,
    ">": operator.gt,
    ">=": operator.ge,
    "<": operator.lt,
    "<=": operator.le,
}


@dataclass(frozen=True)
class Compare(Expr):
    """``expr OP number``: the series of ``expr`` whose value passes, value kept."""

    expr: Expr
    op: str
    value: float

    def promql(self) -> str:
        return f"{self.expr.promql()} {self.op} {number(self.value)}"

    def evaluate(self, samples: Samples) -> Vector:
        test = _COMPARE[self.op]
        return {k: v for k, v in self.expr.evaluate(samples).items() if test(v, self.value)}

    def windows(self) -> Iterator[tuple[str, float]]:
        return self.expr.windows()

    def names(self) -> Iterator[str]:
        return self.expr.names()


def _operand(expr: Expr) -> str:
    return f"({expr.promql()})" if isinstance(expr, Compare) else expr.promql()


def _key(labels: Labels, on: tuple[str, ...]) -> tuple[str, ...]:
    found = dict(labels)
    return tuple(found.get(label, "") for label in on)


@dataclass(frozen=True)
class _Binary(Expr):
    """Two operands: what either reads is what the node reads."""

    left: Expr
    right: Expr

    def windows(self) -> Iterator[tuple[str, float]]:
        yield from self.left.windows()
        yield from self.right.windows()

    def names(self) -> Iterator[str]:
        yield from self.left.names()
        yield from self.right.names()


@dataclass(frozen=True)
class And(_Binary):
    """``left and on (labels) right``: the series of ``left`` that have a match in
    ``right`` on those labels."""

    on: tuple[str, ...] = ("job", "instance")

    def promql(self) -> str:
        left = self.left.promql() if isinstance(self.left, And) else _operand(self.left)
        return f"{left} and on ({', '.join(self.on)}) {_operand(self.right)}"

    def evaluate(self, samples: Samples) -> Vector:
        left = self.left.evaluate(samples)
        if not left:
            return left
        keys = {_key(labels, self.on) for labels in self.right.evaluate(samples)}
        return {k: v for k, v in left.items() if _key(k, self.on) in keys}


@dataclass(frozen=True)
class Or(_Binary):
    """``left or right``: every series of ``left``, and those of ``right`` whose labels
    ``left`` has not."""

    def promql(self) -> str:
        return f"{self.left.promql()} or {self.right.promql()}"

    def evaluate(self, samples: Samples) -> Vector:
        out = dict(self.left.evaluate(samples))
        for labels, value in self.right.evaluate(samples).items():
            out.setdefault(labels, value)
        return out


@dataclass(frozen=True)
class Aggregate(Expr):
    """``sum by (labels) (expr)`` or ``count without (labels) (expr)``."""

    function: str
    clause: str
    labels: tuple[str, ...]
    expr: Expr

    def promql(self) -> str:
        return f"{self.function} {self.clause} ({', '.join(self.labels)}) ({self.expr.promql()})"

    def evaluate(self, samples: Samples) -> Vector:
        groups: dict[Labels, float] = {}
        for labels, value in self.expr.evaluate(samples).items():
            if self.clause == "by":
                key = tuple(pair for pair in labels if pair[0] in self.labels)
            else:
                key = tuple(pair for pair in labels if pair[0] not in self.labels)
            add = value if self.function == "sum" else 1.0
            groups[key] = groups.get(key, 0.0) + add
        return groups

    def windows(self) -> Iterator[tuple[str, float]]:
        return self.expr.windows()

    def names(self) -> Iterator[str]:
        return self.expr.names()


def sum_by(labels: tuple[str, ...], expr: Expr) -> Aggregate:
    """``sum by (labels) (expr)``."""
    return Aggregate("sum", "by", labels, expr)


def count_without(labels: tuple[str, ...], expr: Expr) -> Aggregate:
    """``count without (labels) (expr)``."""
    return Aggregate("count", "without", labels, expr)


@dataclass(frozen=True)
class SecondsSince(Expr):
    """``time() - series``: how long ago a timestamp gauge's instant was."""

    series: Series

    def promql(self) -> str:
        return f"time() - {self.series.promql()}"

    def evaluate(self, samples: Samples) -> Vector:
        now = samples.now()
        return {k: now - v for k, v in self.series.evaluate(samples).items()}

    def names(self) -> Iterator[str]:
        return self.series.names()


@dataclass(frozen=True)
class Recorded(Expr):
    """A recording rule's series: written by its name, evaluated from its ``parts`` (each
    an expression and the labels the rule adds to it)."""

    name: str
    parts: tuple[tuple[Expr, Mapping[str, str]], ...]
    #: A comment written above the recording rules in the YAML.
    comment: str = ""

    def promql(self) -> str:
        return self.name

    def evaluate(self, samples: Samples) -> Vector:
        out: Vector = {}
        for expr, extra in self.parts:
            for labels, value in expr.evaluate(samples).items():
                merged = dict(labels)
                merged.update(extra)
                out[tuple(sorted(merged.items()))] = value
        return out

    def windows(self) -> Iterator[tuple[str, float]]:
        for expr, _ in self.parts:
            yield from expr.windows()

    def names(self) -> Iterator[str]:
        for expr, _ in self.parts:
            yield from expr.names()
