"""mypy's check that each service of the library keeps the operators' contract
(:mod:`bus.application.contract`): ``make lint`` runs mypy on this file. It is never
imported; the library itself imports no service to check it (that drew a circle)."""

from __future__ import annotations

from bus.application.contract import Charted, Detailed, Observable
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
