"""How a service tells the system what it does: events on the bus, in-process.

When the Event BUS runs in the same process, composition hands every other service an
:class:`ActivitySink` bound to the bus: ``publish("/emqp/job/queued/", {...})`` stores the event
in the bus's own log under the next sequence and broadcasts it, with no socket hop, so the
Spark pipeline sees the whole system's activity. Without a local bus the sink is
:data:`NO_ACTIVITY`, which drops everything, so services never test for the bus themselves.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol


class ActivitySink(Protocol):
    """Where a service publishes its activity (``Composition.activity``)."""

    def publish(self, topic: str, value: object) -> None:
        """Queue one event (``topic`` starts and ends with ``/``; ``value`` is anything
        msgpack encodes). Never blocks; a bad topic or value raises ``ValueError``."""


class LocalBus(Protocol):
    """What an Event BUS in the same process offers the other services."""

    def activity_sink(self, producer: str) -> ActivitySink:
        """The sink for ``producer``'s activity, published on this bus."""

    def client_addresses(self) -> Sequence[str]:
        """``host:port`` a client in this process connects to (for the Spark bridge)."""

    def client_curve(self) -> Any:
        """The ``ClientCurve`` such a client connects with, or None (plain text); known
        once the bus has started."""

    def watch(self, watcher: Callable[[int, list[Any]], None]) -> Callable[[], None]:
        """Call ``watcher(first_sequence, fields)`` with each batch as it is broadcast
        (fields: topic, producer, timestamp, uuid, data); returns what stops it."""


class _NoActivity:
    def publish(self, topic: str, value: object) -> None:
        pass


NO_ACTIVITY: ActivitySink = _NoActivity()
