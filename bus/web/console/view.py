"""What the console shows of each composed service: its ``status()``, its ``details()``
when it has one (lists the operator browses: workers, the catalog, peers), and the
counters its charts are drawn from (``console_rates``).

A service declares its charts as ``console_rates = {"events": "accepted"}``: a label and
the dotted path of a cumulative count in its status. Everything is bounded: a list or a
mapping longer than :data:`LIMIT` is cut, and ``<key>_omitted`` says how many were left
out, so a console never receives what it cannot draw.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping, Sequence
from typing import Any

from twisted.application.service import Service

from bus import __version__
from bus.application.contract import Charted, Detailed, Reports

#: The most entries of one list or mapping a console is sent.
LIMIT = 50

Named = Sequence[tuple[str, Service]]


def bounded(status: Mapping[str, Any], limit: int = LIMIT) -> dict[str, Any]:
    """``status`` with every list and mapping in it cut to ``limit`` entries: the number
    left out goes beside a cut list as ``<key>_omitted``, into a cut mapping as
    ``_omitted``. The top level (what the service's code names) is kept whole."""
    out: dict[str, Any] = {}
    for key, item in status.items():
        if isinstance(item, list | tuple) and len(item) > limit:
            out[f"{key}_omitted"] = len(item) - limit
        out[str(key)] = _cut(item, limit)
    return out


def _cut(value: Any, limit: int) -> Any:
    if isinstance(value, Mapping):
        items = list(value.items())
        out = {str(key): _cut(item, limit) for key, item in items[:limit]}
        if len(items) > limit:
            out["_omitted"] = len(items) - limit
        return out
    if isinstance(value, list | tuple):
        return [_cut(item, limit) for item in value[:limit]]
    return value


def lookup(status: Mapping[str, Any], path: str) -> float | None:
    """The number at the dotted ``path`` of ``status``; None if there is none."""
    value: Any = status
    for part in path.split("."):
        if not isinstance(value, Mapping) or part not in value:
            return None
        value = value[part]
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)


def counters(service: Service, status: Mapping[str, Any]) -> dict[str, float]:
    """The cumulative counts a service's charts are drawn from, and ``dropped`` (the sum of
    its drops by reason) for every service that counts drops."""
    found: dict[str, float] = {}
    rates = service.console_rates if isinstance(service, Charted) else {}
    for label, path in rates.items():
        value = lookup(status, path)
        if value is not None:
            found[label] = value
    dropped = status.get("dropped")
    if isinstance(dropped, Mapping):
        found["dropped"] = float(sum(v for v in dropped.values() if isinstance(v, int | float)))
    return found


def read_status(service: Service, details: bool = False) -> tuple[dict[str, Any], str]:
    """What a running service's ``status()`` (and with ``details``, its ``details()``)
    return, merged (see :mod:`bus.application.contract`), and the repr of the error one raised (""
    if none): a status bug must not take a page down. Empty for a stopped service."""
    found: dict[str, Any] = {}
    if not service.running:
        return found, ""
    try:
        if isinstance(service, Reports):
            found.update(service.status())
        if details and isinstance(service, Detailed):
            found.update(service.details())
    except Exception as error:
        return found, repr(error)
    return found, ""


def describe(name: str, service: Service) -> tuple[dict[str, Any], dict[str, float]]:
    """One service as the console shows it, and its counters."""
    entry: dict[str, Any] = {"name": name, "running": bool(service.running)}
    status, error = read_status(service, details=True)
    if error:
        entry["status_error"] = error
    status.pop("config", None)  # the same every second; /status has it
    entry["status"] = bounded(status)
    return entry, counters(service, status)


def snapshot(services: Named, started: float) -> tuple[dict[str, Any], dict[str, dict[str, float]]]:
    """The whole system as the console shows it, and every service's counters."""
    described, counts = [], {}
    for name, service in services:
        entry, found = describe(name, service)
        described.append(entry)
        counts[name] = found
    state = {
        "time": round(time.time(), 3),
        "version": __version__,
        "pid": os.getpid(),
        "uptime_s": round(time.time() - started, 3),
        "services": described,
    }
    return state, counts
