"""What a composed service may offer the product's operators, as typed protocols.

A service is a Twisted ``IService``; beyond that it may offer any
of these, and ``/status``, ``/metrics`` and the console use what it offers (checked with
``isinstance`` at run time, and by mypy for the services of this package: see the bottom
of this module). A third-party service states the same methods and is served alike
(``docs/extending.md``).

- :class:`Reports`: ``status()``, a JSON-ready dict (``/status``, the console);
- :class:`Measured`: ``metrics()``, Prometheus metric families (``/metrics``);
- :class:`Detailed`: ``details(limit)``, longer lists the console shows (peers, services);
- :class:`Charted`: ``console_rates``, the console's charts: a label and the path of a
  cumulative count in ``status()``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable


@runtime_checkable
class Reports(Protocol):
    def status(self) -> dict[str, Any]: ...


@runtime_checkable
class Measured(Protocol):
    def metrics(self) -> list[Any]: ...


@runtime_checkable
class Detailed(Protocol):
    def details(self, limit: int = 100) -> dict[str, Any]: ...


@runtime_checkable
class Charted(Protocol):
    @property
    def console_rates(self) -> Mapping[str, str]: ...


class Observable(Reports, Measured, Protocol):
    """Every service of this package: its status and its metrics."""


if TYPE_CHECKING:  # mypy checks that each service of the package keeps the contract
    from bus.dbp.server import CatalogService
    from bus.emqp.server import EmqpService
    from bus.eventbus.server import EventBusService
    from bus.mc0.server import Mc0Service
    from bus.spark.bridge import SparkBridgeService
    from bus.web.server import StatusWebService
    from bus.zre.node import ZreNode

    def _observable(
        service: EventBusService
        | EmqpService
        | CatalogService
        | Mc0Service
        | ZreNode
        | SparkBridgeService
        | StatusWebService,
    ) -> Observable:
        return service

    def _charted(
        service: EventBusService
        | EmqpService
        | CatalogService
        | Mc0Service
        | ZreNode
        | SparkBridgeService,
    ) -> Charted:
        return service

    def _detailed(service: CatalogService | Mc0Service | ZreNode) -> Detailed:
        return service
