"""A fake of Hermes' Service, written from its wire facts (shared/specs/README.md, DBP):
each request from a fresh REQ socket, closed after the reply; times packed with
``struct.pack('f')``; registration ``{"name", "interfaces": {"router": {"ip": "127.0.0.1",
"port": 5246}}, "reg_time", "topics": null}``; no heartbeat, no DISCONNECT.

Usage: ``hermes_service.py ENDPOINT NAME``: registers, prints the reply as a JSON line
``{"event": "REPLY", "command", "time_size", "body"}``, then reads JSON lines from stdin:
``{"update": {...}}`` sends an update (another fresh socket) and prints its reply.
"""

from __future__ import annotations

import json
import struct
import sys
import time
from typing import Any

import zmq


def request(endpoint: str, command: bytes, body: dict[str, Any]) -> None:
    context = zmq.Context.instance()
    sock = context.socket(zmq.REQ)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.RCVTIMEO, 20_000)
    try:
        sock.connect(endpoint)
        sock.send_multipart([command, struct.pack("f", time.time()), json.dumps(body).encode()])
        reply = sock.recv_multipart()
    except zmq.Again:
        reply = []
    finally:
        sock.close()
    line = {
        "event": "REPLY",
        "command": reply[0].decode("latin-1") if reply else None,
        "time_size": len(reply[1]) if len(reply) > 1 else None,
        "body": reply[2].decode("utf-8", "replace") if len(reply) > 2 else None,
    }
    print(json.dumps(line), flush=True)


def main() -> None:
    endpoint, name = sys.argv[1], sys.argv[2]
    interfaces = {"router": {"ip": "127.0.0.1", "port": 5246}}
    registration = {
        "name": name,
        "interfaces": interfaces,
        "reg_time": time.asctime(),
        "topics": None,
    }
    request(endpoint, b"UwU", registration)
    for line in sys.stdin:
        command = json.loads(line)
        if "update" in command:
            request(endpoint, b"UoU", {"name": name, **command["update"]})


if __name__ == "__main__":
    main()
