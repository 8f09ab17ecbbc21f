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
  cumulative count in ``status()``;
- :class:`Acting`: ``actions()``, what an operator may do to it through the HTTP port
  (``POST /api/v1/actions/SERVICE/ACTION``, see :mod:`bus.web.actions`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
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


#: An operator's action: given the JSON object of the request's body, it returns a JSON-ready
#: dict (or a Deferred firing with one) saying what it did, or raises :class:`ActionRefused`.
Action = Callable[[Mapping[str, Any]], Any]


class ActionRefused(Exception):
    """An action that cannot be done as asked, answered with the HTTP ``status``: 400 for
    parameters it cannot use, 404 for no such queue, worker, schedule or client, 409 for
    a service that cannot do it now."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        #: The HTTP status of the answer.
        self.status = status
        #: What the operator is told.
        self.message = message


@runtime_checkable
class Acting(Protocol):
    """A service an operator may act on (the HTTP port's actions, behind its token)."""

    def actions(self) -> Mapping[str, Action]:
        """Action name (``purge``) -> the :data:`Action` that does it."""
        ...
