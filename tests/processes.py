"""Servers in child processes, as users run them (twistd)."""

from __future__ import annotations

import fcntl
import importlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import IO, Any, TypeVar

import psutil
from twisted.internet import defer

from tests.ports import free_port, free_ports

T = TypeVar("T")

TWISTD = str(Path(sys.executable).with_name("twistd"))
ROOT = Path(__file__).resolve().parent.parent
# twistd re-raises the signal that stopped the reactor once shutdown is complete.
CLEAN_EXIT = (0, -signal.SIGTERM)

#: How long a child may take to start (Python, Twisted's imports, its own set-up) before a
#: wait on it is taken for a hang. eventbus-cli starts in 0.75 s on a quiet machine; with
#: the suite's workers and other processes on two cores it took several times that (CI saw
#: two of them not finished within 10 s). A wait on a child ends when the child reports
#: (it is ready, it ended, it died): this bound is only ever reached by a hang.
START_BOUND = 120.0

#: Each tool's module, the function there that builds its parser, and the option that
#: bounds what it does once it runs (seconds; 0: no bound).
_OWN_BOUNDS = {
    "eventbus-cli": ("bus.eventbus.cli", "build_parser", "timeout"),
    "emqp-cli": ("bus.emqp.cli", "build_parser", "wait"),
    "mc0-cli": ("bus.mc0.cli", "build_parser", "timeout"),
    "dbp-cli": ("bus.dbp.cli", "parser", "timeout"),
}


def own_bound(program: str, args: Sequence[str]) -> float:
    """How long ``program`` run with ``args`` may work once started, by its own option
    (``--timeout``, emqp-cli's ``--wait``), read with the tool's own parser: its default
    when the arguments do not say. 0 for a tool without such an option, or arguments it
    refuses (it ends at once)."""
    if program not in _OWN_BOUNDS:
        return 0.0
    from bus.util.cliargs import parse

    module, factory, option = _OWN_BOUNDS[program]
    parser = getattr(importlib.import_module(module), factory)()
    parser.error = lambda message: sys.exit(2)  # type: ignore[method-assign]
    try:
        parsed = parse(parser, list(args))
    except SystemExit:
        return 0.0
    return max(0.0, float(getattr(parsed, option, 0.0) or 0.0))


def resident() -> int:
    """This process's resident memory in bytes (a leak check's measure)."""
    return int(psutil.Process().memory_info().rss)


def ended(process: subprocess.Popen[Any], within: float, what: str = "") -> defer.Deferred[int]:
    """Fire with ``process``'s exit status once it has ended, waited for on the reactor (the
    servers of this process keep serving meanwhile). ``within``: the bound the child keeps
    on its own work once it runs (a CLI's ``--timeout``); the wait fails only
    :data:`START_BOUND` seconds after that, for a child that hangs."""
    from bus.testing import wait_until

    waited = wait_until(
        lambda: process.poll() is not None,
        timeout=START_BOUND + within,
        interval=0.02,
        what=what or f"{process.args!r} to end",
    )
    return waited.addCallback(lambda _: process.returncode)


def only_line(result: subprocess.CompletedProcess[str]) -> str:
    """The one line a command that refused to start ended with: status 1, nothing else
    said, no traceback."""
    output = result.stdout + result.stderr
    assert result.returncode == 1, output
    assert "Traceback" not in output
    lines = output.splitlines()
    assert len(lines) == 1, output
    return lines[0]


def exit_status(process: subprocess.Popen[Any], within: float = 0.0) -> int:
    """``process``'s exit status once it has ended, waited for by blocking (no reactor to
    keep): ``within`` its own bound once it runs, and :data:`START_BOUND` for its start."""
    try:
        return process.wait(START_BOUND + within)
    except subprocess.TimeoutExpired:
        raise AssertionError(
            f"{process.args!r} still running {START_BOUND + within:g} s after it started"
        ) from None


def reported(
    condition: Callable[[], object], *children: subprocess.Popen[Any], what: str
) -> defer.Deferred[None]:
    """Wait on the reactor until ``condition()`` holds: what a child that is starting does
    once it runs (it is ready, it wrote a line, it registered). Fails as soon as one of
    ``children`` has ended without it, and after :data:`START_BOUND` for one that hangs."""
    from bus.testing import wait_until

    def done() -> bool:
        if condition():
            return True
        for child in children:
            if child.poll() is not None:
                raise AssertionError(f"{child.args!r} exited with {child.returncode} before {what}")
        return False

    return wait_until(done, timeout=START_BOUND, interval=0.02, what=what)


def wait_for(
    condition: Callable[[], T], timeout: float = 60.0, interval: float = 0.05, what: str = ""
) -> T:
    """Poll ``condition`` until it returns something truthy; fail after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what or condition}")
        time.sleep(interval)


def _output_file() -> IO[str]:
    """A temporary file for a child's output, which the child always appends to. The
    child's descriptor is a copy of ours: one open file, one position. A read here seeks
    to the start before it reads, and a line the child wrote in between went to the start,
    over its first lines (eventbus-cli tail's 196 printed over its 182), unless the file
    appends."""
    made = tempfile.TemporaryFile("w+")
    flags = fcntl.fcntl(made.fileno(), fcntl.F_GETFL)
    fcntl.fcntl(made.fileno(), fcntl.F_SETFL, flags | os.O_APPEND)
    return made


class CommandProcess:
    """A command-line tool of the venv (``program``, set by a subclass) in a child process,
    its output in files so that a test can read it while the command runs (a pipe could fill
    up and block it)."""

    program = ""

    def __init__(self, *args: str) -> None:
        self.args = args
        self.stdout = _output_file()
        self.stderr = _output_file()
        self.process = subprocess.Popen(
            [str(Path(sys.executable).with_name(self.program)), *args],
            stdout=self.stdout,
            stderr=self.stderr,
        )

    @staticmethod
    def _read(stream: Any) -> str:
        stream.seek(0)
        return str(stream.read())

    @property
    def out(self) -> str:
        return self._read(self.stdout)

    @property
    def err(self) -> str:
        return self._read(self.stderr)

    @property
    def code(self) -> int | None:
        return self.process.poll()

    def finished(self) -> bool:
        return self.process.poll() is not None

    def ended(self) -> defer.Deferred[int]:
        """Its exit status once it has ended (:func:`ended`), within its own bound."""
        what = f"{self.program} {' '.join(self.args)} to end"
        return ended(self.process, own_bound(self.program, self.args), what)

    def lines(self) -> list[dict[str, Any]]:
        """Its standard output as JSON lines."""
        return [json.loads(line) for line in self.out.splitlines()]

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()
        self.stdout.close()
        self.stderr.close()


class TwistdProcess:
    """A twistd command in a child process, its output in a log file."""

    def __init__(
        self, command: list[str], log_path: Path, env: dict[str, str], cwd: Path | None = None
    ) -> None:
        self.log_path = log_path
        self.log = open(log_path, "ab")
        self.process = subprocess.Popen(
            command, stdout=self.log, stderr=subprocess.STDOUT, env=env, cwd=cwd
        )

    def output(self) -> str:
        return self.log_path.read_text()

    def stop(self, sig: int = signal.SIGTERM) -> int:
        """:func:`stopped` with ``sig``: its exit status."""
        return stopped(self.process, self.log, sig)


def stopped(process: subprocess.Popen[Any], log: IO[Any], sig: int) -> int:
    """``sig`` to a twistd child (once it catches it, when it is one twistd catches: its
    services start before its reactor runs and installs the handlers, and a SIGTERM in
    between ends it without stopping them), its exit awaited, its log closed."""
    if sig in (signal.SIGTERM, signal.SIGINT):
        with_handler(process, sig)
    if process.poll() is None:
        process.send_signal(sig)
    code = process.wait(timeout=30)
    log.close()
    return code


def catches(pid: int, sig: int) -> bool:
    """Whether process ``pid`` has a handler for ``sig`` (its SigCgt in /proc)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    for line in status.splitlines():
        if line.startswith("SigCgt:"):
            return bool(int(line.split()[1], 16) >> (sig - 1) & 1)
    return False


def with_handler(process: subprocess.Popen[Any], sig: int, bound: float = START_BOUND) -> None:
    """Wait until ``process`` catches ``sig``, has ended, or ``bound`` seconds passed."""
    deadline = time.monotonic() + bound
    while process.poll() is None and not catches(process.pid, sig):
        if time.monotonic() > deadline:
            return
        time.sleep(0.02)


class ServerProcess(TwistdProcess):
    """twistd in a child process; its endpoints come from the status.json it writes."""

    def __init__(
        self,
        data_dir: Path,
        *args: str,
        tac: bool = False,
        port: int = 0,
        log_path: Path | None = None,
        http: bool = False,
    ) -> None:
        self.data_dir = data_dir
        #: With ``http``: the port of its /status, read by :meth:`live_status`.
        self.http_port = free_port() if http else 0
        self.status_path = data_dir / "status.json"
        self.status_path.unlink(missing_ok=True)  # a killed server's last word
        log_path = log_path or data_dir.parent / f"{data_dir.name}.log"
        # The product composes mc0 and a DBP catalog by default: free ports, and their data
        # beside the server's log (off the data directory's disk, which a test may fill).
        # And a ZRE node: without beacons, or every other ZRE node on the loopback (another
        # test's) would put its ENTER and JOIN events on this server's bus.
        env = dict(
            os.environ,
            PYTHONUNBUFFERED="1",
            EVENTBUS_HTTP_PORT=str(self.http_port),  # parallel tests: no fixed HTTP port
            MC0_PORT="0",
            MC0_DATA_DIR=str(log_path.parent / f"{data_dir.name}-mc0"),
            DBP_PORT="0",
            DBP_DATA_DIR=str(log_path.parent / f"{data_dir.name}-dbp"),
            ZRE_PORT="0",
        )
        if tac:
            env.update(
                EVENTBUS_PORT=str(port),
                EVENTBUS_DATA_DIR=str(data_dir),
                EVENTBUS_STATS_INTERVAL="0.1s",
                EVENTBUS_HEARTBEAT_INTERVAL="0.1s",
            )
            command = [TWISTD, "-n", "--pidfile=", "-y", str(ROOT / "examples" / "eventbus.tac")]
        else:
            command = [
                TWISTD, "-n", "--pidfile=", "eventbus", "--port", str(port),
                "--data-dir", str(data_dir), "--stats-interval", "0.1s",
                "--heartbeat-interval", "0.1s", *args,
            ]  # fmt: skip
        super().__init__(command, log_path, env)

    def status(self) -> dict[str, Any]:
        try:
            return dict(json.loads(self.status_path.read_text()))
        except (FileNotFoundError, json.JSONDecodeError):
            return {}

    def live_status(self) -> dict[str, Any]:
        """The bus's /status over HTTP (``http=True``): unlike status.json, it needs no disk
        space, so it is current while the data directory's disk is full."""
        url = f"http://127.0.0.1:{self.http_port}/status"
        try:
            with urllib.request.urlopen(url, timeout=5) as response:
                return dict(json.loads(response.read())["services"]["eventbus"])
        except (OSError, ValueError, KeyError):
            return {}

    def ready(self) -> bool:
        """Its endpoints in status.json, and (``http=True``) its /status answering: the
        product starts its HTTP port last, after the bus wrote status.json."""
        if self.process.poll() is not None:
            raise AssertionError(f"server exited with {self.process.returncode}")
        if not self.status().get("endpoints"):
            return False
        return not self.http_port or bool(self.live_status())

    @property
    def address(self) -> str:
        return self.status()["endpoints"]["snapshot"].removeprefix("tcp://")


def broker_ports() -> dict[str, int]:
    """A broker's three ports from below the kernel's ephemeral range (tests/ports.py): a
    broker started again binds the same ones, and a port the kernel picked may go to
    another test's connection in between (seen: "Address already in use")."""
    first = free_ports(3)
    return {"worker": first, "client": first + 1, "admin": first + 2}


class BrokerProcess:
    """``twistd -n emqp`` in a child process, on ``ports`` (default :func:`broker_ports`,
    so that a restart may bind them again); its endpoints come from its status.json."""

    def __init__(
        self,
        data_dir: Path,
        ports: dict[str, int] | None = None,
        *args: str,
        log_path: Path | None = None,
    ) -> None:
        self.data_dir = data_dir
        data_dir.mkdir(parents=True, exist_ok=True)
        (data_dir / "status.json").unlink(missing_ok=True)
        ports = ports or broker_ports()
        command = [
            TWISTD, "-n", "--pidfile=", "emqp", "--data-dir", str(data_dir),
            "--worker-port", str(ports["worker"]), "--client-port", str(ports["client"]),
            "--admin-port", str(ports["admin"]), "--stats-interval", "0.1s",
            "--heartbeat-interval", "0.2s", *args,
        ]  # fmt: skip
        self.log_path = log_path or data_dir.parent / f"{data_dir.name}.log"
        self.log = open(self.log_path, "ab")
        self.process = subprocess.Popen(
            command, stdout=self.log, stderr=subprocess.STDOUT, env=dict(os.environ)
        )

    def status(self) -> dict[str, Any]:
        try:
            return dict(json.loads((self.data_dir / "status.json").read_text()))
        except (FileNotFoundError, json.JSONDecodeError):
            return {}

    def ready(self) -> bool:
        if self.process.poll() is not None:
            raise AssertionError(f"exited: {self.log_path.read_text()}")
        return bool(self.status().get("endpoints"))

    @property
    def endpoints(self) -> dict[str, str]:
        return dict(self.status()["endpoints"])

    def ports(self) -> dict[str, int]:
        return {name: int(address.rsplit(":", 1)[1]) for name, address in self.endpoints.items()}

    def stop(self, sig: int = signal.SIGTERM) -> int:
        return stopped(self.process, self.log, sig)
