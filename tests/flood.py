"""Connection floods for tests: thousands of TCP connections held open on a ZeroMQ port from
one source address, as a hostile peer holds them, and the process they flood watched from
outside (its descriptors and CPU time through /proc).

Kinds of connection:

- ``idle``: a finished ZMTP 3.0 NULL handshake (greeting and READY), then silence;
- ``silent``: TCP only, nothing sent (libzmq waits for a greeting);
- ``curve-greeting``: a ZMTP greeting asking for CURVE, then silence (a CURVE port's
  handshake left hanging).

:class:`Slowloris` is the HTTP kind: half-sent requests, a header line now and then.
"""

from __future__ import annotations

import errno
import os
import select
import socket
import struct
import threading
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


class Slowloris:
    """An HTTP slowloris in a thread of its own: ``per_source`` connections from each of
    ``sources`` to ``port``, each sending ``GET path HTTP/1.1`` and then one more header line
    every ``interval`` seconds, never the blank line that ends the headers. A connection the
    server closes is opened again at the next round, as an attacker keeps up the pressure.
    Counts the connections it opened and those the server closed (end of file, an
    answer, or a reset)."""

    def __init__(
        self,
        port: int,
        sources: list[str],
        per_source: int,
        interval: float = 1.0,
        path: str = "/status",
    ) -> None:
        self.port = port
        self.interval = interval
        self.request_line = f"GET {path} HTTP/1.1\r\nHost: x\r\n".encode()
        self.slots: list[dict[str, object]] = [
            {"source": source, "sock": None, "lines": 0}
            for source in sources
            for _ in range(per_source)
        ]
        self.opened = 0
        self.closed = 0
        #: Rounds done: every slot was tried (opened, or sent its next line).
        self.rounds = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="slowloris", daemon=True)

    def __enter__(self) -> Slowloris:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join(30)
        for slot in self.slots:
            sock = slot["sock"]
            if isinstance(sock, socket.socket):
                sock.close()

    def connected(self) -> int:
        """Slots whose connection is open and has sent at least its request line."""
        return sum(1 for slot in self.slots if slot["sock"] is not None and slot["lines"])

    def _run(self) -> None:
        while not self._stop.is_set():
            for slot in self.slots:
                self._step(slot)
            self.rounds += 1
            self._stop.wait(self.interval)

    def _step(self, slot: dict[str, object]) -> None:
        sock = slot["sock"]
        if not isinstance(sock, socket.socket):
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.setblocking(False)
            sock.bind((str(slot["source"]), 0))
            sock.connect_ex(("127.0.0.1", self.port))
            slot.update(sock=sock, lines=0)
            self.opened += 1
            return  # its first line at the next round, once connected
        try:
            answer: bytes | None = sock.recv(4096)
        except BlockingIOError:
            answer = None  # nothing from the server: as it should be
        except OSError as error:
            answer = None if error.errno == errno.ENOTCONN else b""
        if answer is not None:  # an answer (a 408) or the end: the server is done with it
            self._closed(slot, sock)
            return
        lines = int(str(slot["lines"]))
        line = self.request_line if lines == 0 else b"X-Slow-%d: x\r\n" % lines
        try:
            sock.send(line)
        except BlockingIOError:
            return
        except OSError as error:
            if error.errno != errno.ENOTCONN:
                self._closed(slot, sock)
            return
        slot["lines"] = lines + 1

    def _closed(self, slot: dict[str, object], sock: socket.socket) -> None:
        sock.close()
        slot.update(sock=None, lines=0)
        self.closed += 1


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
