"""Helpers for testing code that talks to the bus (like ``treq.testing``).

    bus = start_bus(tmp_path)                      # a real server on free ports
    peer = RawPeer.sub(bus.endpoints["publisher"])  # a reactor-driven raw socket
    yield wait_until(lambda: len(peer.messages) == 3)

Everything here runs on the reactor: never block the test in pyzmq calls while a
server in the same process has to answer.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bus.eventbus.config import EventBusConfig
from bus.transport.testing import RawPeer
from bus.util.polling import ConditionTimeout, wait_until

if TYPE_CHECKING:
    from bus.emqp.server import EmqpService
    from bus.eventbus.eventlog import EventLog
    from bus.eventbus.server import EventBusService

    def _event_log(log: MemoryEventLog) -> EventLog:
        return log


__all__ = [
    "ConditionTimeout",
    "MemoryEventLog",
    "RawPeer",
    "start_broker",
    "start_bus",
    "wait_until",
]


class MemoryEventLog:
    """An Event BUS log in memory (:class:`bus.eventbus.eventlog.EventLog`), for tests of
    the core (:class:`bus.eventbus.core.EventBusCore`) with no disk. Set :attr:`refusing`
    to a reason and every append fails with :class:`bus.errors.StorageError`, changing
    nothing, as a full disk does."""

    def __init__(self, store_id: str = "memory") -> None:
        self.path = Path(":memory:")
        self.store_id = store_id
        self.rows: list[tuple[int, bytes, bytes, bytes, bytes, bytes, float]] = []
        self.last_sequence = 0
        self.refusing: str | None = None
        self.closed = False

    def append_fields(self, fields: Any, received: float) -> int:
        """Append under the next sequences; StorageError while :attr:`refusing`."""
        from bus.errors import StorageError

        first = self.last_sequence + 1
        if self.refusing is not None and fields:
            raise StorageError(OSError(28, self.refusing))
        for sequence, event in enumerate(fields, first):
            self.rows.append((sequence, *event, received))
        self.last_sequence = first + len(fields) - 1 if fields else self.last_sequence
        return first

    def read_rows(
        self, after: int, upto: int | None = None, prefixes: Any = (), limit: int = 1000
    ) -> list[tuple[int, bytes, bytes, bytes, bytes, bytes]]:
        """Rows above ``after`` (up to ``upto``) under ``prefixes``, at most ``limit``."""
        wanted = [p for p in prefixes if p]
        found = []
        for row in self.rows:
            sequence, topic = row[0], row[1]
            if sequence <= after or (upto is not None and sequence > upto):
                continue
            if wanted and not any(topic.startswith(p) for p in wanted):
                continue
            found.append(row[:6])
            if len(found) >= limit:
                break
        return found

    def first_sequence(self) -> int | None:
        """The lowest sequence held (None when empty)."""
        return self.rows[0][0] if self.rows else None

    def count(self) -> int:
        """How many events are held."""
        return len(self.rows)

    def size(self) -> int:
        """The data's bytes held."""
        return sum(len(row[5]) for row in self.rows)

    def expire_older_than(
        self, cutoff: float, chunk: int = 5000, out_of_time: Callable[[], bool] | None = None
    ) -> int:
        """Remove events received before ``cutoff``, in one step (of one part); how many."""
        kept = [row for row in self.rows if row[6] >= cutoff]
        expired, self.rows = len(self.rows) - len(kept), kept
        return expired

    def trim_to_count(
        self, max_count: int, chunk: int = 5000, out_of_time: Callable[[], bool] | None = None
    ) -> tuple[int, bool]:
        """Keep the newest ``max_count``, in one step (of one part): how many were removed,
        and True."""
        extra = max(0, len(self.rows) - max_count)
        del self.rows[:extra]
        return extra, True

    def compact_step(
        self, chunk: int = 5000, out_of_time: Callable[[], bool] | None = None
    ) -> tuple[int, bool]:
        """Keep the latest event per topic, in one step (of one part: no time to look at)."""
        latest = {row[1]: row[0] for row in self.rows}
        kept = [row for row in self.rows if latest[row[1]] == row[0]]
        removed, self.rows = len(self.rows) - len(kept), kept
        return removed, True

    def checkpoint(self) -> tuple[int, int]:
        """Nothing to do in memory."""
        return 0, 0

    def close(self, checkpoint_running: bool = False) -> None:
        """Mark it closed."""
        self.closed = True


def start_bus(data_dir: Path | str, reactor: Any = None, **settings: Any) -> EventBusService:
    """Start an :class:`bus.eventbus.server.EventBusService` on free ports of 127.0.0.1
    (``settings`` override :class:`EventBusConfig` fields). Stop it with
    ``stopService()``."""
    from bus.eventbus.server import EventBusService

    config = replace(
        EventBusConfig(port=0, data_dir=Path(data_dir), stats_interval=0, heartbeat_interval=0.2),
        **settings,
    )
    service = EventBusService(config, reactor=reactor)
    service.startService()
    return service


def start_broker(
    data_dir: Path | str, reactor: Any = None, activity: Any = None, **settings: Any
) -> EmqpService:
    """Start an eMQP broker on free ports of 127.0.0.1 with its store in ``data_dir``;
    ``settings`` override :class:`bus.emqp.core.BrokerSettings` fields (or, for those it
    lacks, :class:`bus.emqp.config.EmqpConfig` fields). Its ``endpoints`` name the ports."""
    from bus.application.activity import NO_ACTIVITY
    from bus.emqp.config import EmqpConfig
    from bus.emqp.core import BrokerSettings
    from bus.emqp.server import EmqpService

    broker_fields = set(BrokerSettings.__dataclass_fields__)
    broker = BrokerSettings(**{k: v for k, v in settings.items() if k in broker_fields})
    fields: dict[str, Any] = {"worker_port": 0, "client_port": 0, "admin_port": 0}
    fields["stats_interval"] = 0
    fields.update((k, v) for k, v in settings.items() if k not in broker_fields)
    config = EmqpConfig(data_dir=Path(data_dir), broker=broker, **fields)
    service = EmqpService(config, activity or NO_ACTIVITY, reactor=reactor)
    service.startService()
    return service
