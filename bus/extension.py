"""What a service needs to join the product, in one module: the one door for services of
other distributions (see docs/extending.md and ``examples/echo-service``), and the one the
built-in services use for the same things.

Each name is loaded from its home module the first time it is asked for, so that a tap
importing :class:`ServiceOptions` does not load txZMQ, and ``twistd --help`` stays cheap
(DESIGN.md: lazy txzmq imports).

Errors (:mod:`bus.errors`)
    :class:`ProtocolError` (a codec's one exception for malformed input),
    :class:`StartupError` (an option that cannot be honoured, named), :class:`StartFailed`,
    :class:`StorageError`.
Options and composition (:mod:`bus.application`)
    :class:`ServiceOptions` (the base of every tap's ``Options``); :func:`parse_duration`,
    :func:`parse_size`, :func:`parse_bool` (values as people write them); :class:`Composition` (what a tap's ``build``
    adds to the product), :class:`ProductService`, :func:`standalone` (``twistd -n NAME``).
What a service reports
    :class:`ActivitySink` and :data:`NO_ACTIVITY` (its activity, published on the bus when
    composed); ``Metric``, :func:`counter`, :func:`gauge`, :func:`counters_by`,
    :func:`gauges_by` (``/metrics``); the typed contract of ``/status`` and the console:
    :class:`Reports`, :class:`Measured`, :class:`Detailed`, :class:`Charted`,
    :class:`Observable`; :class:`Acting`, :data:`Action` and :class:`ActionRefused` (what
    an operator may do to it through the HTTP port's actions, behind its token).
Sockets (:mod:`bus.transport`)
    :class:`SocketFactory`, :class:`SocketOptions`, :class:`ZmqSocket`, :func:`reactor_of`
    (ZeroMQ on the reactor); :class:`DescriptorBudget` (one service's share of the
    process's descriptors); :func:`curve_options`, :func:`curve_settings`,
    :class:`CurveSettings` (CURVE on a service's ports, as the built-in services offer it);
    :func:`listen_shared`, :class:`BeaconSender` (UDP ports and beacons).
Testing
    :class:`RawPeer` (a raw ZeroMQ peer on the reactor), :func:`wait_until` and
    :class:`ConditionTimeout` (waiting for a condition with a deadline, never a sleep).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

#: Exported name -> the module that defines it.
_HOMES = {
    "ProtocolError": "bus.errors",
    "StartupError": "bus.errors",
    "StartFailed": "bus.errors",
    "StorageError": "bus.errors",
    "ServiceOptions": "bus.application.options",
    "parse_duration": "bus.util.values",
    "parse_size": "bus.util.values",
    "parse_bool": "bus.util.values",
    "Composition": "bus.application.composition",
    "ProductService": "bus.application.composition",
    "standalone": "bus.application.composition",
    "ActivitySink": "bus.application.activity",
    "NO_ACTIVITY": "bus.application.activity",
    "Metric": "bus.util.metrics",
    "counter": "bus.util.metrics",
    "gauge": "bus.util.metrics",
    "counters_by": "bus.util.metrics",
    "gauges_by": "bus.util.metrics",
    "Reports": "bus.application.contract",
    "Measured": "bus.application.contract",
    "Detailed": "bus.application.contract",
    "Charted": "bus.application.contract",
    "Observable": "bus.application.contract",
    "Acting": "bus.application.contract",
    "Action": "bus.application.contract",
    "ActionRefused": "bus.application.contract",
    "SocketFactory": "bus.transport.zmqsocket",
    "SocketOptions": "bus.transport.zmqsocket",
    "ZmqSocket": "bus.transport.zmqsocket",
    "reactor_of": "bus.util.reactor",
    "DescriptorBudget": "bus.transport.fdbudget",
    "curve_options": "bus.transport.curve_settings",
    "curve_settings": "bus.transport.curve_settings",
    "CurveSettings": "bus.transport.curve_settings",
    "listen_shared": "bus.transport.udp",
    "BeaconSender": "bus.transport.udp",
    "RawPeer": "bus.transport.testing",
    "wait_until": "bus.util.polling",
    "ConditionTimeout": "bus.util.polling",
}

#: Literal, so that mypy sees what the door re-exports; a test holds it equal to ``_HOMES``.
__all__ = [
    "NO_ACTIVITY",
    "Acting",
    "Action",
    "ActionRefused",
    "ActivitySink",
    "BeaconSender",
    "Charted",
    "Composition",
    "ConditionTimeout",
    "CurveSettings",
    "DescriptorBudget",
    "Detailed",
    "Measured",
    "Metric",
    "Observable",
    "ProductService",
    "ProtocolError",
    "RawPeer",
    "Reports",
    "ServiceOptions",
    "SocketFactory",
    "SocketOptions",
    "StartFailed",
    "StartupError",
    "StorageError",
    "ZmqSocket",
    "counter",
    "counters_by",
    "curve_options",
    "curve_settings",
    "gauge",
    "gauges_by",
    "listen_shared",
    "parse_bool",
    "parse_duration",
    "parse_size",
    "reactor_of",
    "standalone",
    "wait_until",
]

if TYPE_CHECKING:
    from bus.application.activity import NO_ACTIVITY, ActivitySink
    from bus.application.composition import Composition, ProductService, standalone
    from bus.application.contract import (
        Acting,
        Action,
        ActionRefused,
        Charted,
        Detailed,
        Measured,
        Observable,
        Reports,
    )
    from bus.application.options import ServiceOptions
    from bus.errors import ProtocolError, StartFailed, StartupError, StorageError
    from bus.transport.curve_settings import CurveSettings, curve_options, curve_settings
    from bus.transport.fdbudget import DescriptorBudget
    from bus.transport.testing import RawPeer
    from bus.transport.udp import BeaconSender, listen_shared
    from bus.transport.zmqsocket import SocketFactory, SocketOptions, ZmqSocket
    from bus.util.metrics import Metric, counter, counters_by, gauge, gauges_by
    from bus.util.polling import ConditionTimeout, wait_until
    from bus.util.reactor import reactor_of
    from bus.util.values import parse_bool, parse_duration, parse_size


if not TYPE_CHECKING:  # hidden from mypy, which would type every name Any through it

    def __getattr__(name: str) -> Any:
        """Load an exported name from its home module on first use (PEP 562)."""
        home = _HOMES.get(name)
        if home is None:
            raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(home), name)
        globals()[name] = value
        return value

    def __dir__() -> list[str]:
        """Every exported name, loaded or not."""
        return sorted([*globals(), *__all__])
