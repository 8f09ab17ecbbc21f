"""The services the product knows, in the order they start (and stop in reverse): the built-in
ones, then those other distributions declare in the entry point group ``bus.services``.

Each entry's ``tap`` module holds its twistd ``Options`` (a :class:`bus.application.options.ServiceOptions`),
``build(options, composition)`` and ``makeService(options)`` for running it alone (see
docs/extending.md). A third-party distribution declares one in its ``pyproject.toml``::

    [project.entry-points."bus.services"]
    echo = "echo_service.tap"

Nothing here imports a tap module: the plugin files and ``--help`` stay cheap. The entry
points are read when first asked for (:func:`services`), never at import: a bad one (a name
that clashes, or that is not a module) is left out with one line in
:func:`discovery_problems`, naming its distribution.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from importlib import metadata
from typing import Any

#: The entry point group third-party services are declared in.
ENTRY_POINT_GROUP = "bus.services"

_NAME = re.compile(r"^[a-z][a-z0-9-]{0,31}$")


@dataclass(frozen=True, slots=True)
class ServiceEntry:
    """A service the product can compose: its name (``--services``) and the module of its tap."""

    name: str
    tap: str
    #: Part of the default ``--services`` (the protocols; the bridge is asked for).
    default: bool
    #: The distribution that declared it; empty for the built-in services.
    distribution: str = ""


BUILTIN_SERVICES: tuple[ServiceEntry, ...] = (
    ServiceEntry("eventbus", "bus.eventbus.tap", default=True),
    ServiceEntry("emqp", "bus.emqp.tap", default=True),
    ServiceEntry("emqp-pubsub", "bus.emqp.pubsub_tap", default=True),
    ServiceEntry("mc0", "bus.mc0.tap", default=True),
    ServiceEntry("dbp", "bus.dbp.tap", default=True),
    ServiceEntry("zre", "bus.zre.tap", default=True),
    ServiceEntry("spark-bridge", "bus.spark.tap", default=False),
)

#: Names a service may not take: the product's own sections and the CLI's.
_RESERVED = frozenset({"http", "cpu-latency", "emqp-worker"})


@functools.cache
def _declared() -> tuple[tuple[ServiceEntry, ...], tuple[str, ...]]:
    """Third-party services from the entry points, and one line per one left out."""
    try:
        points = metadata.entry_points(group=ENTRY_POINT_GROUP)
    except Exception as error:  # a broken installed distribution must not stop the product
        return (), (f"cannot read the {ENTRY_POINT_GROUP!r} entry points: {error}",)
    taken = {entry.name for entry in BUILTIN_SERVICES} | _RESERVED
    found: list[ServiceEntry] = []
    problems: list[str] = []
    for point in sorted(points, key=lambda p: (p.name, p.value)):
        distribution = point.dist.name if point.dist is not None else "an unknown distribution"
        where = f"service {point.name!r} of {distribution}"
        if not _NAME.fullmatch(point.name):
            problems.append(f"{where}: a name is 1-32 lower-case letters, digits and dashes")
        elif point.name in taken:
            problems.append(f"{where}: the name is taken (built-in or declared twice)")
        elif point.attr:
            problems.append(f"{where}: {point.value!r} must name a module (its tap), not an object")
        else:
            taken.add(point.name)
            found.append(ServiceEntry(point.name, point.module, False, distribution))
    return tuple(found), tuple(problems)


def services() -> tuple[ServiceEntry, ...]:
    """The built-in services, then the declared ones (the entry points read once)."""
    return BUILTIN_SERVICES + _declared()[0]


def service_names() -> tuple[str, ...]:
    """The names of :func:`services`, in order."""
    return tuple(entry.name for entry in services())


def discovery_problems() -> tuple[str, ...]:
    """One line per declared service left out, naming its distribution."""
    return _declared()[1]


def __getattr__(name: str) -> Any:
    """The module's former constants, computed when first asked for."""
    lazy = {
        "SERVICES": services,
        "SERVICE_NAMES": service_names,
        "DECLARED_SERVICES": lambda: _declared()[0],
        "DISCOVERY_PROBLEMS": discovery_problems,
    }
    if name in lazy:
        return lazy[name]()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def entry(name: str) -> ServiceEntry:
    """The declared or built-in service named ``name``; KeyError if none is."""
    for candidate in services():
        if candidate.name == name:
            return candidate
    raise KeyError(name)
