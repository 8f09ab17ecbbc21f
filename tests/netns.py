"""Network namespaces a test creates for UDP broadcast, and JSON-line peer processes in them.

Two namespaces joined by a veth pair, each end with its own 10.x address: broadcasts stay
on that pair, never on the machine's real interfaces. Deleting the namespaces deletes the
pair. Where namespaces cannot be made (no root, no iproute2) the tests skip with the reason,
except under CI (``CI`` or ``BUS_NETNS_TESTS=required``), where that is a failure.
"""

from __future__ import annotations

import ctypes
import json
import os
import secrets
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, NoReturn, TextIO, TypeVar

import pytest

from tests.processes import START_BOUND

T = TypeVar("T")
CLONE_NEWNET = 0x40000000


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, text=True, timeout=20)


class NamespacePair:
    """Namespaces ``a`` and ``b``; ``a`` has ``iface_a`` = ``addr_a``, ``b`` the other end."""

    def __init__(self) -> None:
        tag = secrets.token_hex(3)
        self.a, self.b = f"zre-a-{tag}", f"zre-b-{tag}"
        self.iface_a, self.iface_b = f"zva{tag}", f"zvb{tag}"
        subnet = f"10.{100 + secrets.randbelow(150)}.{secrets.randbelow(250)}"
        self.addr_a, self.addr_b = f"{subnet}.1", f"{subnet}.2"
        self.broadcast = f"{subnet}.255"
        self.created: list[str] = []

    def create(self) -> None:
        for ns in (self.a, self.b):
            _ip("netns", "add", ns)
            self.created.append(ns)
            _ip("-n", ns, "link", "set", "lo", "up")
        _ip("-n", self.a, "link", "add", self.iface_a, "type", "veth", "peer", "name", self.iface_b)
        _ip("-n", self.a, "link", "set", self.iface_b, "netns", self.b)
        for ns, iface, addr in (
            (self.a, self.iface_a, self.addr_a),
            (self.b, self.iface_b, self.addr_b),
        ):
            _ip("-n", ns, "addr", "add", f"{addr}/24", "broadcast", self.broadcast, "dev", iface)
            _ip("-n", ns, "link", "set", iface, "up")

    def block_udp(self, ns: str, port: int) -> None:
        """Lose every UDP datagram ``ns`` sends to ``port`` (policy routing into a blackhole:
        TCP to the same address goes on)."""
        _ip("-n", ns, "route", "replace", "blackhole", "default", "table", "100")
        _ip("-n", ns, "rule", "add", "ipproto", "udp", "dport", str(port), "table", "100")

    def unblock_udp(self, ns: str, port: int) -> None:
        _ip("-n", ns, "rule", "del", "ipproto", "udp", "dport", str(port), "table", "100")

    def delete(self) -> None:
        for ns in self.created:
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=20)
        self.created.clear()


def cannot(what: str, error: Exception) -> NoReturn:
    """The test skipped with the reason, or failed where namespaces are required: under CI
    (``CI``, or ``BUS_NETNS_TESTS=required``, which .ci/run sets: the nemesis tests run
    there, never skipped)."""
    detail = getattr(error, "stderr", "") or str(error)
    reason = f"{what}: {detail.strip()}"
    if os.environ.get("CI") or os.environ.get("BUS_NETNS_TESTS") == "required":
        pytest.fail(reason)
    pytest.skip(reason)


@pytest.fixture
def netns_pair() -> Iterator[NamespacePair]:
    pair = NamespacePair()
    try:
        pair.create()
    except (OSError, subprocess.CalledProcessError) as error:
        pair.delete()
        cannot("cannot create a network namespace here", error)
    try:
        yield pair
    finally:
        pair.delete()


def poll_until(predicate: Callable[[], object], timeout: float = 15.0, what: str = "") -> None:
    """Poll ``predicate`` every 10 ms until it holds; fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what or predicate}")
        time.sleep(0.01)


class LinePeer:
    """A process that prints one JSON object a line and reads JSON commands a line."""

    def __init__(self, argv: list[str], log_path: Path, netns: str | None = None) -> None:
        command = ["ip", "netns", "exec", netns, *argv] if netns else argv
        self.log_path = log_path
        self._log: TextIO = open(log_path, "w")
        self.process = subprocess.Popen(
            command,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._log,
            text=True,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
        self.lines: list[dict[str, Any]] = []
        #: When each line arrived here (time.monotonic()), for latency measurements.
        self.arrived: list[float] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            line = line.strip()
            if line:
                self.arrived.append(time.monotonic())
                self.lines.append(json.loads(line))

    def send(self, command: dict[str, Any]) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write(json.dumps(command) + "\n")
        self.process.stdin.flush()

    def events(self, kind: str, peer: str | None = None) -> list[dict[str, Any]]:
        return [
            line
            for line in list(self.lines)
            if line["event"] == kind and (peer is None or line["peer"] == peer)
        ]

    def wait_for(
        self, kind: str, peer: str | None = None, timeout: float = 15.0, **fields: Any
    ) -> dict[str, Any]:
        def found() -> dict[str, Any] | None:
            for line in self.events(kind, peer):
                if all(line.get(k) == v for k, v in fields.items()):
                    return line
            return None

        poll_until(
            lambda: found() is not None or self.process.poll() is not None,
            timeout,
            f"{kind} {fields}",
        )
        line = found()
        if line is None:
            raise AssertionError(
                f"peer exited ({self.process.returncode}) before {kind} {fields}; "
                f"log: {self.log_path.read_text()[-2000:]}"
            )
        return line

    def arrival(self, line: dict[str, Any]) -> float:
        return self.arrived[next(i for i, seen in enumerate(self.lines) if seen is line)]

    @property
    def ready(self) -> dict[str, Any]:
        """Its READY line: it is up (a process that ended before is said at once)."""
        return self.wait_for("READY", timeout=START_BOUND)

    def stop(self, timeout: float = 10.0) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self._log.close()

    def kill(self) -> None:
        self.process.kill()
        self.process.wait()


def readdress_without_broadcast(ns: str, iface: str, addr: str) -> None:
    """Give ``iface`` in ``ns`` its address again as ``ip addr add ADDR/24 dev IF`` (no
    ``brd``): psutil then reports the address itself as the interface's broadcast."""
    _ip("-n", ns, "addr", "del", f"{addr}/24", "dev", iface)
    _ip("-n", ns, "addr", "add", f"{addr}/24", "dev", iface)


class Hosts:
    """Hosts as network namespaces on one switch: a namespace holding a bridge, and one
    namespace per host joined to it by a veth pair, each with its own 10.x address. A
    partition is a blackhole route each way between two groups of hosts (what one side
    sends the other is dropped); :meth:`heal` removes them all. :meth:`delete` removes
    every namespace, and with them every interface and route the test made."""

    def __init__(self, names: list[str]) -> None:
        tag = secrets.token_hex(3)
        self.tag = tag
        self.switch = f"sw-{tag}"
        self.names = list(names)
        self.namespaces = {name: f"{name}-{tag}" for name in names}
        subnet = f"10.{100 + secrets.randbelow(150)}.{secrets.randbelow(250)}"
        self.addresses = {name: f"{subnet}.{i + 1}" for i, name in enumerate(names)}
        self.created: list[str] = []
        self._cuts: list[tuple[str, str]] = []

    def create(self) -> None:
        _ip("netns", "add", self.switch)
        self.created.append(self.switch)
        _ip("-n", self.switch, "link", "add", "br0", "type", "bridge")
        _ip("-n", self.switch, "link", "set", "br0", "up")
        for i, name in enumerate(self.names):
            ns = self.namespaces[name]
            _ip("netns", "add", ns)
            self.created.append(ns)
            _ip("-n", ns, "link", "set", "lo", "up")
            outside, inside = f"s{i}{self.tag}", f"h{i}{self.tag}"
            _ip("-n", self.switch, "link", "add", outside, "type", "veth", "peer", "name", inside)
            _ip("-n", self.switch, "link", "set", inside, "netns", ns)
            _ip("-n", self.switch, "link", "set", outside, "master", "br0", "up")
            _ip("-n", ns, "addr", "add", f"{self.addresses[name]}/24", "dev", inside)
            _ip("-n", ns, "link", "set", inside, "up")

    def prefix(self, name: str) -> list[str]:
        """The command prefix that runs a program on host ``name``."""
        return ["ip", "netns", "exec", self.namespaces[name]]

    def inside(self, name: str, call: Callable[[], T]) -> T:
        """``call()`` made from host ``name``: in a thread of this process that entered the
        host's network namespace (setns(2) moves only the calling thread; the sockets it
        opens stay there), so that a test reads what only the hosts reach without starting
        a process. What it raises is raised here."""
        result: list[T] = []
        failed: list[BaseException] = []

        def run() -> None:
            try:
                fd = os.open(f"/var/run/netns/{self.namespaces[name]}", os.O_RDONLY)
                try:
                    if ctypes.CDLL(None, use_errno=True).setns(fd, CLONE_NEWNET) != 0:
                        raise OSError(ctypes.get_errno(), f"setns into {name}'s namespace")
                finally:
                    os.close(fd)
                result.append(call())
            except BaseException as error:
                failed.append(error)

        thread = threading.Thread(target=run, name=f"inside-{name}", daemon=True)
        thread.start()
        thread.join()
        if failed:
            raise failed[0]
        return result[0]

    def cut(self, side: list[str], rest: list[str] | None = None) -> None:
        """Drop everything between the hosts of ``side`` and those of ``rest`` (default:
        every other host); each side still reaches its own."""
        others = rest if rest is not None else [n for n in self.names if n not in side]
        for a in side:
            for b in others:
                for here, there in ((a, b), (b, a)):
                    _ip("-n", self.namespaces[here], "route", "add", "blackhole",
                        f"{self.addresses[there]}/32")  # fmt: skip
                    self._cuts.append((here, there))

    def heal(self) -> None:
        for here, there in self._cuts:
            _ip("-n", self.namespaces[here], "route", "del", "blackhole",
                f"{self.addresses[there]}/32")  # fmt: skip
        self._cuts.clear()

    def delete(self) -> None:
        for ns in reversed(self.created):
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=20)
        self.created.clear()


def make_hosts(names: list[str]) -> Hosts:
    """:class:`Hosts` made, or the test skipped (failed under CI) with the reason."""
    hosts = Hosts(names)
    try:
        hosts.create()
    except (OSError, subprocess.CalledProcessError) as error:
        hosts.delete()
        cannot("cannot create network namespaces here", error)
    return hosts


def hosts_while_used(names: list[str]) -> Iterator[Hosts]:
    """:func:`make_hosts` for a fixture: the hosts, deleted (with all they hold) after."""
    made = make_hosts(names)
    try:
        yield made
    finally:
        made.delete()


def read_records(path: Path) -> list[dict[str, Any]]:
    """A JSON-lines file a client wrote (none yet: nothing)."""
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


class HostService:
    """A ``twistd -n`` service on a host of :class:`Hosts`, restartable: start ``N`` logs to
    ``ROOT/NAME-N.log``; its data directory is ``ROOT/NAME`` and it serves once the
    status.json it writes there names its endpoints."""

    def __init__(
        self,
        hosts: Hosts,
        name: str,
        root: Path,
        argv: list[str],
        env: dict[str, str] | None = None,
    ) -> None:
        self.hosts, self.name, self.root = hosts, name, root
        self.data = root / name
        self.argv = argv
        self.env = env or {}
        self.process: subprocess.Popen[bytes] | None = None
        self.starts = 0

    def start(self) -> None:
        self.starts += 1
        (self.data / "status.json").unlink(missing_ok=True)
        log = (self.root / f"{self.name}-{self.starts}.log").open("ab")
        self.process = subprocess.Popen(
            [*self.hosts.prefix(self.name), *self.argv],
            stdout=log,
            stderr=subprocess.STDOUT,
            env={**os.environ, "PYTHONUNBUFFERED": "1", **self.env},
        )
        log.close()

    def status(self) -> dict[str, Any]:
        """Its status.json, or ``{}`` while there is none (yet)."""
        try:
            return dict(json.loads((self.data / "status.json").read_text()))
        except (OSError, ValueError):
            return {}

    #: A line its log says once it serves (None: its status.json names its endpoints).
    ready_line: str | None = None

    def log(self, start: int | None = None) -> str:
        """What a start of it (by default this one) has logged so far."""
        path = self.root / f"{self.name}-{start or self.starts}.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def assert_no_traceback(self) -> None:
        """No start of it logged a traceback."""
        for start in range(1, self.starts + 1):
            assert "Traceback" not in self.log(start), f"{self.name}-{start}.log"

    def ready(self) -> bool:
        assert self.process is not None
        if self.process.poll() is not None:
            raise AssertionError(f"{self.name} exited with {self.process.returncode}")
        if self.ready_line is not None:
            return self.ready_line in self.log()
        return bool(self.status().get("endpoints"))

    def signal(self, sig: int) -> None:
        assert self.process is not None
        self.process.send_signal(sig)
        if sig == signal.SIGKILL:
            self.process.wait(10)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGCONT)
            self.process.terminate()
            try:
                self.process.wait(20)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)


def nats_on_hosts(hosts: Hosts, names: list[str], directory: Path) -> Any:
    """A :class:`bus.nats.servers.NatsCluster` with one nats-server on each of ``names``'
    hosts (its address, the usual ports: every host is a namespace of its own), started
    inside that host."""
    from bus.nats.servers import NatsCluster

    return NatsCluster(
        directory,
        size=len(names),
        hosts=[hosts.addresses[name] for name in names],
        client_ports=[4222] * len(names),
        route_ports=[6222] * len(names),
        prefix=lambda node: hosts.prefix(node.name),
    )
