"""Prints every UDP datagram heard on ``0.0.0.0:PORT`` as a JSON line
``{"event": "HEARD", "data": text, "from": address}``, until terminated.

Usage: ``beacon_listener.py PORT``.
"""

from __future__ import annotations

import json
import socket
import sys


def main() -> None:
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("0.0.0.0", int(sys.argv[1])))
    print(json.dumps({"event": "READY"}), flush=True)
    while True:
        data, (host, _) = sock.recvfrom(2048)
        line = {"event": "HEARD", "data": data.decode("latin-1"), "from": host}
        print(json.dumps(line), flush=True)


if __name__ == "__main__":
    main()
