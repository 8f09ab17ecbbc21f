"""A real pyre node (zeromq-pyre from PyPI) driven over stdin/stdout, for the interop tests.

Prints ``READY`` then every pyre event as one JSON line, in zre-ping's format; reads JSON
commands, one a line: ``{"join": G}``, ``{"leave": G}``, ``{"shout": G, "content": [...]}``,
``{"whisper": HEX, "content": [...]}``, ``{"stop": true}`` (pyre's stop: leaving beacon).
"""

from __future__ import annotations

import json
import os
import sys
import uuid
from typing import Any

import zmq
from pyre import Pyre


def emit(line: dict[str, object]) -> None:
    sys.stdout.write(json.dumps(line, sort_keys=True) + "\n")
    sys.stdout.flush()


def text(frames: list[bytes]) -> list[str]:
    return [frame.decode("utf-8", "replace") for frame in frames]


def main() -> None:
    name, port = sys.argv[1], int(sys.argv[2])
    node = Pyre(name)
    node.set_port(str(port).encode())
    for group in sys.argv[3:]:
        node.join(group)
    node.start()
    emit({"event": "READY", "peer": node.uuid().hex, "name": name, "endpoint": node.endpoint()})
    poller = zmq.Poller()
    poller.register(node.socket(), zmq.POLLIN)
    poller.register(sys.stdin.fileno(), zmq.POLLIN)
    pending = b""
    while True:
        items = dict(poller.poll())
        if node.socket() in items:
            frames = node.recv()
            kind = frames[0].decode()
            line: dict[str, object] = {
                "event": kind,
                "peer": uuid.UUID(bytes=frames[1]).hex,
                "name": frames[2].decode(),
            }
            if kind == "ENTER":
                line["headers"] = json.loads(frames[3].decode())
                line["endpoint"] = frames[4].decode()
            elif kind in ("JOIN", "LEAVE"):
                line["group"] = frames[3].decode()
            elif kind == "WHISPER":
                line["content"] = text(frames[3:])
            elif kind == "SHOUT":
                line["group"] = frames[3].decode()
                line["content"] = text(frames[4:])
            emit(line)
        if sys.stdin.fileno() in items:
            # os.read, not readline: a buffered reader would hide lines from the poller.
            chunk = os.read(sys.stdin.fileno(), 65536)
            if not chunk:
                break
            pending += chunk
            while b"\n" in pending:
                command_line, pending = pending.split(b"\n", 1)
                if not execute(node, json.loads(command_line)):
                    node.stop()
                    emit({"event": "STOPPED", "peer": node.uuid().hex, "name": name})
                    return
    node.stop()
    emit({"event": "STOPPED", "peer": node.uuid().hex, "name": name})


def execute(node: Pyre, command: dict[str, Any]) -> bool:
    """Run one command; False for stop."""
    content = [str(part).encode() for part in command.get("content", [])]
    if "join" in command:
        node.join(command["join"])
    elif "leave" in command:
        node.leave(command["leave"])
    elif "shout" in command:
        node.shout(command["shout"], content)
    elif "whisper" in command:
        node.whisper(uuid.UUID(hex=command["whisper"]), content)
    elif "stop" in command:
        return False
    return True


if __name__ == "__main__":
    main()
