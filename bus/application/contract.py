"""What a composed service may offer the product's operators, as typed protocols.

A service is a Twisted ``IService``; beyond that it may offer any
of these, and ``/status``, ``/metrics`` and the console use what it offers (checked with
``isinstance`` at run time, and by mypy for the services of this package:
``tests/contract_check.py``, which ``make lint`` checks). A third-party service states the same methods and is served alike
(``docs/extending.md``).

- :class:`Reports`: ``status()``, a JSON-ready dict (``/status``, the console);
- :class:`Measured`: ``metrics()``, Prometheus metric families (``/metrics``);
- :class:`Detailed`: ``details(limit)``, longer lists the console shows (peers, services);
- :class:`Charted`: ``console_rates``, the console's charts: a label and the path of a
  cumulative count in ``status()``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol, runtime_checkable


@runtime_checkable
class Reports(Protocol):
    """A service that says how it is: ``/status`` and the console's cards."""

    def status(self) -> dict[str, Any]:
        """The service's state as JSON-ready values: settings, counts, peers."""
        ...


@runtime_checkable
class Measured(Protocol):
    """A service that offers Prometheus metric families on ``/metrics``."""

    def metrics(self) -> list[Any]:
        """Its metric families (``prometheus_client`` ``Metric`` objects), built now."""
        ...


@runtime_checkable
class Detailed(Protocol):
    """A service with lists too long for ``/status``, which the console pages through."""

    def details(self, limit: int = 100) -> dict[str, Any]:
        """Its longer lists (peers, services), at most ``limit`` entries each."""
        ...


@runtime_checkable
class Charted(Protocol):
    """A service whose rates the console charts."""

    @property
    def console_rates(self) -> Mapping[str, str]:
        """Chart label -> dotted path of a cumulative count in ``status()``."""
        ...


class Observable(Reports, Measured, Protocol):
    """Every service of this package: its status and its metrics."""
