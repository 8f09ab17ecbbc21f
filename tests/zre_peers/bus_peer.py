"""This project's ZRE node driven over stdin/stdout like tests/zre_peers/pyre_peer.py, so the
interop tests drive both the same way inside a network namespace.

Usage: ``bus_peer.py NAME PORT INTERFACE [options as JSON] [GROUP...]``.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

from twisted.internet import reactor, stdio
from twisted.protocols.basic import LineReceiver

from bus.util.memory import freeze_startup_objects
from bus.zre.cli import emit, event_json
from bus.zre.config import ZreConfig
from bus.zre.node import ZreNode


class Commands(LineReceiver):
    delimiter = b"\n"

    def __init__(self, node: ZreNode) -> None:
        self.node = node

    def lineReceived(self, line: bytes) -> None:
        command = json.loads(line)
        content = [part.encode() for part in command.get("content", [])]
        node = self.node
        if "join" in command:
            node.join(command["join"])
        elif "leave" in command:
            node.leave(command["leave"])
        elif "shout" in command:
            node.shout(command["shout"], content)
        elif "whisper" in command:
            node.whisper(bytes.fromhex(command["whisper"]), content)
        elif "status" in command:
            emit(
                {"event": "STATUS", "peer": node.uuid_hex, "name": node.node_name, **node.status()}
            )
        elif "stop" in command:
            reactor.stop()  # type: ignore[attr-defined]

    def connectionLost(self, reason: Any = None) -> None:
        if reactor.running:  # type: ignore[attr-defined]
            reactor.stop()  # type: ignore[attr-defined]


def _trace_elections(node: ZreNode) -> None:
    """ZRE_TRACE=1: every ELECT and LEADER in and what it made us send, on stderr."""
    assert node.core is not None
    elections = node.core.elections
    on_elect, on_leader = elections.on_elect, elections.on_leader

    def names(sends: Any) -> list[str]:
        return [f"{type(m).__name__}->{p.hex()[:6]}" for p, m in sends or ()]

    def elect(peer: bytes, group: str, challenger: str) -> Any:
        sends = on_elect(peer, group, challenger)
        sys.stderr.write(f"ELECT from {peer.hex()[:6]} {challenger[:6]}: {names(sends)}\n")
        return sends

    def leader(peer: bytes, group: str, leader: str) -> Any:
        out = on_leader(peer, group, leader)
        sends = out[1] if out else None
        sys.stderr.write(
            f"LEADER from {peer.hex()[:6]} {leader[:6]}: {out and out[0]} {names(sends)}\n"
        )
        return out

    elections.on_elect = elect  # type: ignore[method-assign]
    elections.on_leader = leader  # type: ignore[method-assign]


def main() -> None:
    name, port, interface = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    settings = json.loads(sys.argv[4]) if len(sys.argv) > 4 else {}
    for path in ("cert", "peer_certs"):
        if settings.get(path):
            settings[path] = Path(settings[path])
    config = ZreConfig(name=name, port=port, interface=interface, groups=sys.argv[5:], **settings)
    node = ZreNode(config, reactor=reactor)
    node.add_listener(lambda event: emit(event_json(event)))
    # As the product (bus.application.composition) and zre-ping do: a full collection scanning what
    # startup made stalled this process 20-30 ms a second after it started, amid elections.
    freeze_startup_objects()
    node.startService()
    if os.environ.get("ZRE_TRACE") and node.core is not None:
        _trace_elections(node)
    ready = {"event": "READY", "peer": node.uuid_hex, "name": name, "endpoint": node.endpoint}
    if node.gossip_endpoint:
        ready["gossip_endpoint"] = node.gossip_endpoint
    if node.curve.keys is not None:
        ready["public_key"] = node.curve.keys.public.decode()
    emit(ready)
    stdio.StandardIO(Commands(node))
    reactor.addSystemEventTrigger("before", "shutdown", node.stopService)  # type: ignore[attr-defined]
    reactor.run()  # type: ignore[attr-defined]
    emit({"event": "STOPPED", "peer": node.uuid_hex, "name": name})


if __name__ == "__main__":
    main()
