"""Connection floods for tests: thousands of TCP connections held open on a ZeroMQ port from
one source address, as a hostile peer holds them, and the process they flood watched from
outside (its descriptors and CPU time through /proc).

Kinds of connection:

- ``idle``: a finished ZMTP 3.0 NULL handshake (greeting and READY), then silence;
- ``silent``: TCP only, nothing sent (libzmq waits for a greeting);
- ``curve-greeting``: a ZMTP greeting asking for CURVE, then silence (a CURVE port's
  handshake left hanging).
"""

from __future__ import annotations

import os
import select
import socket
import struct
import time
from pathlib import Path

# ZMTP 3.0 greeting: signature, version 3.0, mechanism (20 octets), as-server 0, filler.
_SIGNATURE = b"\xff" + b"\0" * 8 + b"\x7f"


def greeting(mechanism: bytes) -> bytes:
    return _SIGNATURE + b"\x03\x00" + mechanism.ljust(20, b"\0") + b"\0" + b"\0" * 31


def ready(socket_type: bytes) -> bytes:
    """The NULL mechanism's READY command naming our socket type."""
    name = b"Socket-Type"
    body = b"\x05READY" + bytes([len(name)]) + name + struct.pack(">I", len(socket_type))
    body += socket_type
    return b"\x04" + bytes([len(body)]) + body


class Flood:
    """``count`` connections of ``kind`` to ``port`` from ``source``, held until closed."""

    def __init__(
        self,
        port: int,
        count: int,
        kind: str = "idle",
        source: str = "127.0.0.2",
        socket_type: bytes = b"DEALER",
    ) -> None:
        self.sockets: list[socket.socket] = []
        opening = {
            "idle": greeting(b"NULL") + ready(socket_type),
            "silent": b"",
            "curve-greeting": greeting(b"CURVE"),
        }[kind]
        # All at once, non-blocking: the server takes them as fast as it accepts.
        connecting = []
        for _ in range(count):
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.bind((source, 0))
            sock.setblocking(False)
            sock.connect_ex(("127.0.0.1", port))
            connecting.append(sock)
        poller = select.poll()
        by_fd = {sock.fileno(): sock for sock in connecting}
        for fd in by_fd:
            poller.register(fd, select.POLLOUT)
        deadline = time.monotonic() + 30
        while by_fd and time.monotonic() < deadline:
            for fd, _ in poller.poll(1000):
                poller.unregister(fd)
                sock = by_fd.pop(fd)
                if sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR) != 0:
                    sock.close()
                    continue
                try:
                    if opening:
                        sock.send(opening)
                except OSError:
                    sock.close()  # the server shut it at once: what the bounds are for
                    continue
                self.sockets.append(sock)
        for sock in by_fd.values():
            sock.close()

    def still_open(self) -> int:
        """How many of ours the server has not closed (a closed one reads end of file)."""
        count = 0
        for sock in self.sockets:
            sock.setblocking(False)
            try:
                while True:
                    data = sock.recv(65536)
                    if not data:
                        break
            except BlockingIOError:
                count += 1
            except OSError:
                pass
        return count

    def close(self) -> None:
        for sock in self.sockets:
            sock.close()
        self.sockets.clear()


def closed_by_server(sock: socket.socket, wait: float = 0.2) -> bool:
    """Whether the server closed this connection (it reads end of file or a reset)."""
    sock.settimeout(wait)
    try:
        return sock.recv(1) == b""
    except TimeoutError:
        return False
    except OSError:
        return True


def open_descriptors(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def cpu_seconds(pid: int) -> float:
    """User and system CPU time of every thread of ``pid`` so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    ticks = os.sysconf("SC_CLK_TCK")
    return (int(fields[11]) + int(fields[12])) / ticks


def cpu_share(pid: int, seconds: float = 2.0) -> float:
    """Cores ``pid`` used over the next ``seconds`` (1.0: one core busy all along)."""
    before, start = cpu_seconds(pid), time.monotonic()
    time.sleep(seconds)
    return (cpu_seconds(pid) - before) / (time.monotonic() - start)
