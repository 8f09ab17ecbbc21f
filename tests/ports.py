"""Ports for tests that must name them before a server binds them (a pair's peer link, a
restart on the same port, a child process started with ``--port``).

A port picked from the kernel (bind to 0, close) lies in ``ip_local_port_range``, where
the kernel also picks the source port of every outgoing connection: in the second before
a child process binds it, another test's connection may take it. These ports come from
below that range, which the kernel never hands out by itself, and a lock file per block
(held until the test process exits) keeps parallel pytest-xdist workers off each other's.
"""

from __future__ import annotations

import errno
import fcntl
import os
import random
import socket
import tempfile
from pathlib import Path
from typing import IO, Any

from bus.transport.zmqsocket import ephemeral_range

#: Ports are handed out in blocks this large (a caller may take up to this many in a row).
BLOCK = 8
_LOCKS = Path(tempfile.gettempdir()) / "bus-test-ports"
_held: list[IO[bytes]] = []


def _range() -> tuple[int, int]:
    """Ports below the kernel's ephemeral range (and above the usual services)."""
    return 20000, max(20000 + 64 * BLOCK, ephemeral_range()[0])


def _bindable(port: int) -> bool:
    for kind in (socket.SOCK_STREAM, socket.SOCK_DGRAM):
        with socket.socket(socket.AF_INET, kind) as probe:
            try:
                probe.bind(("127.0.0.1", port))
            except OSError:
                return False
    return True


def free_ports(count: int = 1) -> int:
    """The first of ``count`` consecutive ports free for TCP and UDP on 127.0.0.1, kept
    for this process: no other test process gets them."""
    if not 1 <= count <= BLOCK:
        raise ValueError(f"at most {BLOCK} ports in a row")
    _LOCKS.mkdir(exist_ok=True)
    low, high = _range()
    blocks = list(range(low // BLOCK, high // BLOCK))
    random.shuffle(blocks)
    for block in blocks:
        lock = open(_LOCKS / str(block), "ab")
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as error:
            lock.close()
            if error.errno in (errno.EWOULDBLOCK, errno.EACCES):
                continue
            raise
        base = block * BLOCK
        if all(_bindable(port) for port in range(base, base + count)):
            _held.append(lock)
            return base
        lock.close()
    raise RuntimeError(f"no {count} free ports in a row below {high} (pid {os.getpid()})")


def free_port() -> int:
    """One port, as :func:`free_ports`."""
    return free_ports(1)


def nats_cluster(directory: Path, size: int, **settings: Any) -> Any:
    """A :class:`bus.nats.servers.NatsCluster` on ports kept for this test process, not ones
    the kernel could hand to another connection before nats-server binds them."""
    from bus.nats.servers import NatsCluster

    clients, routes = free_ports(size), free_ports(size)
    return NatsCluster(
        directory,
        size=size,
        client_ports=range(clients, clients + size),
        route_ports=range(routes, routes + size),
        **settings,
    )
