"""Shared by the ZRE tests: nodes on loopback with a beacon port of their own, event logs."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from typing import Any

from bus.zre.config import ZreConfig
from bus.zre.core import ZreEvent
from tests.ports import free_ports


def free_udp_port() -> int:
    """A UDP port no one on this machine listens on now (the tests' private beacon port:
    127.255.255.255 reaches every process of the machine on that port)."""
    return free_ports(1)


class EventLog:
    """Every event a node emits, in order."""

    def __init__(self) -> None:
        self.events: list[ZreEvent] = []

    def __call__(self, event: ZreEvent) -> None:
        self.events.append(event)

    def of(self, kind: str, peer: bytes | None = None) -> list[ZreEvent]:
        return [e for e in self.events if e.type == kind and (peer is None or e.peer == peer)]

    def types(self, peer: bytes | None = None) -> list[str]:
        return [e.type for e in self.events if peer is None or e.peer == peer]


def fast_config(port: int, **settings: Any) -> ZreConfig:
    """Beacons every 100 ms and a 50 ms reaper, so tests settle quickly."""
    base = ZreConfig(port=port, beacon_interval=0.1, reap_interval=0.05)
    return replace(base, **settings)


def started(nodes: list[Any]) -> Iterator[Any]:
    for node in nodes:
        node.startService()
        yield node
