"""The clients of the DBP nemesis (tests/test_dbp_nemesis.py), as Hermes' client and service
speak (a fresh REQ socket for each request, 4-octet times): asks every catalog instance for
the whole list in turn, and registers a new service in Hermes' form every second at one
instance after the other. Each request is a JSON line in OUT: ``{"kind": "info", "at": i,
"sent", "got", "answer": {name: active} or {"Error": ...}}`` (no ``answer``: none within
1.5 s) and ``{"kind": "register", "name", "at", "sent", "acked"}`` (``acked``: when its OwO
came, null for none within 5 s). Stops when STOP_FILE exists.

Usage: ``nemesis_client.py OUT STOP_FILE ENDPOINT...``.
"""

from __future__ import annotations

import json
import os
import struct
import sys
import time
from typing import Any

import zmq


def ask(context: Any, endpoint: str, command: bytes, body: bytes, timeout: float) -> Any:
    sock = context.socket(zmq.REQ)
    sock.linger = 0
    sock.connect(endpoint)
    sent = time.time()
    sock.send_multipart([command, struct.pack("f", sent), body])
    reply, got = None, None
    if sock.poll(int(timeout * 1000)):
        reply, got = sock.recv_multipart(), time.time()
    sock.close()
    return sent, got, reply


def main() -> None:
    out_path, stop_file, endpoints = sys.argv[1], sys.argv[2], sys.argv[3:]
    context = zmq.Context()
    registered = 0
    next_registration = time.time() + 1.0
    print(json.dumps({"event": "READY"}), flush=True)
    with open(out_path, "a") as out:
        while not os.path.exists(stop_file):
            for at, endpoint in enumerate(endpoints):
                sent, got, reply = ask(context, endpoint, b"u_U", b"", 1.5)
                record: dict[str, Any] = {"kind": "info", "at": at, "sent": sent, "got": got}
                if reply is not None and reply[0] == b"o_O":
                    listed = json.loads(reply[2])
                    if "Error" in listed:
                        record["answer"] = {"Error": listed["Error"]}
                    else:
                        record["answer"] = {n: bool(v.get("active")) for n, v in listed.items()}
                out.write(json.dumps(record) + "\n")
            if time.time() >= next_registration:
                registered += 1
                at = registered % len(endpoints)
                name = f"svc-{registered}"
                body = {
                    "name": name,
                    "interfaces": {"router": {"ip": "127.0.0.1", "port": 5246}},
                    "reg_time": time.time(),
                    "topics": None,
                }
                sent, got, reply = ask(context, endpoints[at], b"UwU", json.dumps(body).encode(), 5)
                acked = got if reply is not None and reply[0] == b"OwO" else None
                out.write(
                    json.dumps(
                        {"kind": "register", "name": name, "at": at, "sent": sent, "acked": acked}
                    )
                    + "\n"
                )
                next_registration = time.time() + 1.0
            out.flush()
    print(json.dumps({"event": "STOPPED", "registered": registered}), flush=True)


if __name__ == "__main__":
    main()
