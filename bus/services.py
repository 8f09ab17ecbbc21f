"""The services the product knows, in the order they start (and stop in reverse).

Each entry's ``tap`` module holds its twistd ``Options`` (a :class:`bus.options.ServiceOptions`),
``build(options, composition)`` and ``makeService(options)`` for running it alone. Nothing
here imports a tap module: the plugin files and ``--help`` stay cheap.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class ServiceEntry:
    name: str
    tap: str
    #: Part of the default ``--services`` (the protocols; the bridge is asked for).
    default: bool


SERVICES: tuple[ServiceEntry, ...] = (
    ServiceEntry("eventbus", "bus.eventbus.tap", default=True),
    ServiceEntry("emqp", "bus.emqp.tap", default=True),
    ServiceEntry("mc0", "bus.mc0.tap", default=True),
    ServiceEntry("dbp", "bus.dbp.tap", default=True),
    ServiceEntry("zre", "bus.zre.tap", default=True),
    ServiceEntry("spark-bridge", "bus.spark.tap", default=False),
)

SERVICE_NAMES: tuple[str, ...] = tuple(entry.name for entry in SERVICES)


def entry(name: str) -> ServiceEntry:
    for candidate in SERVICES:
        if candidate.name == name:
            return candidate
    raise KeyError(name)
