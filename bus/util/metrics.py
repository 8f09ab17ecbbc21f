"""Prometheus metric families built from the counters services keep as they work.

A service that wants to be scraped has ``metrics() -> list[Metric]``; it reads its own plain
attributes (incremented where the work happens) and wraps them here. Called on the reactor
thread (see :mod:`bus.web.server`), so the values are a consistent snapshot.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

__all__ = ["Metric", "counter", "counters_by", "gauge", "gauges_by", "gauges_by_labels"]


def counter(name: str, documentation: str, value: float) -> Metric:
    """A Prometheus counter family with one sample."""
    return CounterMetricFamily(name, documentation, value=value)


def gauge(name: str, documentation: str, value: float) -> Metric:
    """A Prometheus gauge family with one sample."""
    return GaugeMetricFamily(name, documentation, value=value)


def counters_by(name: str, documentation: str, label: str, values: Mapping[str, float]) -> Metric:
    """A Prometheus counter family, one sample per ``label`` value."""
    family = CounterMetricFamily(name, documentation, labels=[label])
    for key, value in sorted(values.items()):
        family.add_metric([key], value)
    return family


def gauges_by(name: str, documentation: str, label: str, values: Mapping[str, float]) -> Metric:
    """A Prometheus gauge family, one sample per ``label`` value."""
    family = GaugeMetricFamily(name, documentation, labels=[label])
    for key, value in sorted(values.items()):
        family.add_metric([key], value)
    return family


def gauges_by_labels(
    name: str,
    documentation: str,
    labels: Sequence[str],
    values: Mapping[tuple[str, ...], float],
) -> Metric:
    """A Prometheus gauge family, one sample per tuple of ``labels``' values."""
    family = GaugeMetricFamily(name, documentation, labels=list(labels))
    for key, value in sorted(values.items()):
        family.add_metric(list(key), value)
    return family
