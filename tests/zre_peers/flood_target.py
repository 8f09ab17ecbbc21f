"""A ZRE node and an eMQP broker in one reactor, in a process with 256 file descriptors:
the target of tests/test_zre_flood.py's forged beacons.

Usage: ``flood_target.py BEACON_PORT DATA_DIR LOG_FILE``. Prints one JSON line
``{"event": "READY", "mailbox": ..., "admin": ..., "ports": [...]}``; then answers each
``status`` line on stdin with ``{"event": "STATUS", ...the node's status...}``; stops when
stdin closes.
"""

from __future__ import annotations

import json
import resource
import sys
from typing import Any

# Before anything opens a descriptor: the limit the whole process lives with.
resource.setrlimit(resource.RLIMIT_NOFILE, (256, 256))

from twisted.internet import reactor, stdio  # noqa: E402
from twisted.logger import globalLogBeginner, textFileLogObserver  # noqa: E402
from twisted.protocols.basic import LineReceiver  # noqa: E402

from bus.testing import start_broker  # noqa: E402
from bus.zre.config import ZreConfig  # noqa: E402
from bus.zre.node import ZreNode  # noqa: E402


def emit(line: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(line, sort_keys=True) + "\n")
    sys.stdout.flush()


class Commands(LineReceiver):
    delimiter = b"\n"

    def __init__(self, node: ZreNode) -> None:
        self.node = node

    def lineReceived(self, line: bytes) -> None:
        if line.strip() == b"status":
            emit({"event": "STATUS", **self.node.status()})

    def connectionLost(self, reason: Any = None) -> None:
        if reactor.running:  # type: ignore[attr-defined]
            reactor.stop()  # type: ignore[attr-defined]


def main() -> None:
    port, data_dir, log_file = int(sys.argv[1]), sys.argv[2], sys.argv[3]
    globalLogBeginner.beginLoggingTo(
        [textFileLogObserver(open(log_file, "a"))], redirectStandardIO=False
    )
    broker = start_broker(data_dir, reactor=reactor)
    node = ZreNode(ZreConfig(name="target", port=port), reactor=reactor)
    node.startService()
    ports = [int(e.rpartition(":")[2]) for e in [node.endpoint, *broker.endpoints.values()]]
    emit(
        {
            "event": "READY",
            "mailbox": node.endpoint,
            "admin": broker.endpoints["admin"],
            "ports": ports,
        }
    )
    stdio.StandardIO(Commands(node))

    def stop() -> Any:
        broker.stopService()
        return node.stopService()

    reactor.addSystemEventTrigger("before", "shutdown", stop)  # type: ignore[attr-defined]
    reactor.run()  # type: ignore[attr-defined]


if __name__ == "__main__":
    main()
