"""Prometheus metric families built from the counters services keep as they work.

A service that wants to be scraped has ``metrics() -> list[Metric]``; it reads its own plain
attributes (incremented where the work happens) and wraps them here. Called on the reactor
thread (see :mod:`bus.web.server`), so the values are a consistent snapshot.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

if TYPE_CHECKING:
    from bus.util.sqlitewal import WalStatus

__all__ = [
    "Metric",
    "counter",
    "counters_by",
    "gauge",
    "gauges_by",
    "gauges_by_labels",
    "wal_metrics",
]


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


def wal_metrics(prefix: str, wal: WalStatus) -> list[Metric]:
    """A store's WAL figures (:class:`bus.util.sqlitewal.WalStatus`) as Prometheus families
    named ``<prefix>_wal_...``."""
    return [
        gauge(f"{prefix}_wal_bytes", "Size of the store's SQLite WAL file", wal.wal_bytes),
        counter(f"{prefix}_wal_checkpoints", "PASSIVE checkpoints of the WAL", wal.checkpoints),
        counter(
            f"{prefix}_wal_restarts",
            "RESTART checkpoints that started the WAL over (it was above its bound)",
            wal.restarts,
        ),
        counter(
            f"{prefix}_wal_restarts_busy",
            "RESTART attempts that met a commit or read in progress (tried again)",
            wal.restarts_busy,
        ),
        gauge(
            f"{prefix}_wal_longest_hold_seconds",
            "Longest RESTART checkpoint since the start (how long it held writers at most)",
            wal.longest_hold,
        ),
    ]
