"""A DBP service (bus.dbp.client.ServiceRegistration) driven over stdin/stdout, for tests that
run it inside a network namespace: it finds the catalog by its SHALOM beacon, registers
``NAME`` at ``ADDRESS:PORT`` and prints JSON lines; ``{"status": true}`` prints its state.

Usage: ``service_peer.py NAME ADDRESS PORT [BEACON_PORT [CATALOGS]]``; ``CATALOGS``:
comma-separated endpoints of a shared catalog's instances, given instead of the beacon's.
"""

from __future__ import annotations

import json
import sys
from typing import Any

from twisted.internet import defer, reactor, stdio
from twisted.protocols.basic import LineReceiver

from bus.dbp.client import ServiceRegistration, find_catalog


def emit(line: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(line, sort_keys=True) + "\n")
    sys.stdout.flush()


class Commands(LineReceiver):
    delimiter = b"\n"

    def __init__(self, service: ServiceRegistration) -> None:
        self.service = service

    def lineReceived(self, line: bytes) -> None:
        if "status" in json.loads(line):
            s = self.service
            emit(
                {
                    "event": "STATUS",
                    "state": s.state,
                    "path": s.path,
                    "sent_udp": s.sent_udp,
                    "sent_zmq": s.sent_zmq,
                    "catalog_udp_seen": s.last_catalog_udp > 0,
                    "registrations": s.registrations,
                    "moves": s.moves,
                    "catalog": s.catalog,
                }
            )

    def connectionLost(self, reason: Any = None) -> None:
        if reactor.running:  # type: ignore[attr-defined]
            reactor.stop()  # type: ignore[attr-defined]


@defer.inlineCallbacks
def main() -> Any:
    name, address, port = sys.argv[1], sys.argv[2], int(sys.argv[3])
    beacon_port = int(sys.argv[4]) if len(sys.argv) > 4 else 5245
    if len(sys.argv) > 5:
        endpoints: str | list[str] = sys.argv[5].split(",")
    else:
        endpoints = yield find_catalog(reactor, beacon_port, timeout=20)
    emit({"event": "FOUND", "endpoint": endpoints})
    service = ServiceRegistration(
        endpoints,
        {"name": name, "address": address, "port": port, "function": "test", "heartbeat": 0.2},
    )
    service.startService()
    reactor.addSystemEventTrigger("before", "shutdown", service.stopService)  # type: ignore[attr-defined]
    config = yield service.registered
    emit({"event": "REGISTERED", "config": config})
    stdio.StandardIO(Commands(service))


if __name__ == "__main__":
    reactor.callWhenRunning(main)  # type: ignore[attr-defined]
    reactor.run()  # type: ignore[attr-defined]
