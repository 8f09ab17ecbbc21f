"""Ctrl-C in the middle of a wait ends every command-line tool with one line saying what it
did and did not do, and exit status 130, as shells expect; never a traceback, never 0.

Each command waits on something that never answers: a TCP listener of the test's own that
accepts and stays silent (the command then waits on its ZeroMQ handshake or its HTTP
answer). SIGINT goes once the command has shown it waits: it connected to the listener, or
it printed its READY line (zre-ping). ``bus-cluster``'s Ctrl-C is in test_cluster_cli.py.

Issue 45: ``mc0-cli put`` ended with an ``ImportError: sys.meta_path is None`` traceback
and status 0, ``eventbus-cli publish`` and ``snapshot`` in silence with status 0."""

from __future__ import annotations

import select
import signal
import socket
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.processes import START_BOUND, CommandProcess, wait_for

BIN = Path(sys.executable).parent
#: Longer than any test: the command waits until interrupted.
FOREVER = "600"


class Listener:
    """A TCP port on 127.0.0.1 that accepts connections and never says a word."""

    def __init__(self) -> None:
        self.socket = socket.socket()
        self.socket.bind(("127.0.0.1", 0))
        self.socket.listen(16)
        self.port = self.socket.getsockname()[1]
        self.accepted: list[socket.socket] = []

    def connected(self) -> bool:
        """Whether a connection came (accepted now, held open)."""
        while select.select([self.socket], [], [], 0)[0]:
            self.accepted.append(self.socket.accept()[0])
        return bool(self.accepted)

    def close(self) -> None:
        for sock in [*self.accepted, self.socket]:
            sock.close()


class Command(CommandProcess):
    """A tool in a child process (Ctrl-C reaches it: tests/conftest.py)."""

    def __init__(self, tool: str, args: list[str]) -> None:
        self.program = tool
        super().__init__(*args)

    def alive(self) -> bool:
        if self.process.poll() is not None:
            raise AssertionError(
                f"{self.program} ended ({self.process.returncode}) before it waited: {self.err}"
            )
        return True


@pytest.fixture
def listeners() -> Iterator[list[Listener]]:
    made = [Listener(), Listener()]
    yield made
    for listener in made:
        listener.close()


# (the tool and its command as its line names them, its arguments with {port} and {other}
# for the listeners' ports, what its line says was or was not done)
WAITING = [
    ("eventbus-cli publish", ["publish", "/a/", "1", "--server", "127.0.0.1:{port}", "--timeout",
                      FOREVER], "the event was not sent"),
    ("eventbus-cli snapshot", ["snapshot", "--server", "127.0.0.1:{port}", "--timeout", FOREVER],
     "0 event(s) printed, the snapshot not complete"),
    ("eventbus-cli tail", ["tail", "/a/", "--server", "127.0.0.1:{port}", "--timeout", FOREVER],
     "waiting for the first snapshot from 127.0.0.1:{port}; no event printed"),
    ("eventbus-cli status", ["status", "--http", "127.0.0.1:{port}", "--timeout", FOREVER],
     "waiting for http://127.0.0.1:{port}/status's status; nothing printed"),
    ("mc0-cli put", ["--plain", "--timeout", FOREVER, "--server", "tcp://127.0.0.1:{port}", "put",
                 "t", "m"], "to open a session; nothing put"),
    ("mc0-cli sub", ["--plain", "--timeout", FOREVER, "--server", "tcp://127.0.0.1:{port}", "sub",
                 "t"], "not subscribed"),
    ("mc0-cli ping", ["--plain", "--timeout", FOREVER, "--server", "tcp://127.0.0.1:{port}",
                 "ping"], "no NOOP sent"),
    ("dbp-cli services", ["services", "--catalog", "tcp://127.0.0.1:{port}", "--timeout", FOREVER],
     "waiting for tcp://127.0.0.1:{port} to answer; asked, nothing printed"),
    ("emqp-cli status", ["status", "--admin", "tcp://127.0.0.1:{port}", "--wait", FOREVER],
     "before tcp://127.0.0.1:{port} answered STATUS"),
    ("emqp-cli submit", ["submit", "default", "[]", "--broker", "tcp://127.0.0.1:{port}", "--admin",
                  "tcp://127.0.0.1:{other}", "--wait", FOREVER],
     "before the broker at tcp://127.0.0.1:{port} dispatched the request"),
    *[
        (f"emqp-cli {command}", [command, *given, "--admin", "tcp://127.0.0.1:{port}", "--wait",
                                 FOREVER], f"before tcp://127.0.0.1:{{port}} answered {verb}")
        for command, given, verb in [
            ("schedule", ["q", "[]", "--every", "1h"], "SCHEDULE"),
            ("unschedule", ["abc"], "UNSCHEDULE"),
            ("schedules", [], "SCHEDULES"),
        ]
    ],
    ("emqp-worker", ["--broker", "tcp://127.0.0.1:{port}"],
     "serving the broker at tcp://127.0.0.1:{port}; 0 job(s) run, 0 failed; it has stopped"),
]  # fmt: skip


@pytest.mark.parametrize(("prog", "template", "said"), WAITING)
def test_ctrl_c_mid_wait_ends_with_one_line_and_130(
    listeners: list[Listener], prog: str, template: list[str], said: str
) -> None:
    tool = prog.split()[0]
    ports = {"port": listeners[0].port, "other": listeners[1].port}
    command = Command(tool, [arg.format(**ports) for arg in template])
    try:
        wait_for(
            lambda: command.alive() and listeners[0].connected(),
            timeout=START_BOUND,
            what=f"{tool} to connect",
        )
        command.process.send_signal(signal.SIGINT)
        assert command.process.wait(START_BOUND) == 130, command.err
        err = command.err
    finally:
        command.close()
    assert "Traceback" not in err
    lines = err.splitlines()
    if tool != "emqp-worker":  # the worker logs on stderr: its last line is the one
        assert len(lines) == 1, err
    assert lines[-1].startswith(f"{prog}: interrupted after "), err
    assert said.format(**ports) in lines[-1], err


def test_ctrl_c_ends_zre_ping_with_what_it_did(tmp_path: Path) -> None:
    """zre-ping runs until stopped: its READY line says it runs, Ctrl-C says what it did."""
    command = Command(
        "zre-ping",
        ["--port", "0", "--gossip-bind", "tcp://127.0.0.1:0", "--interval", "0.2s"],
    )
    try:
        wait_for(
            lambda: command.alive() and '"READY"' in command.out,
            timeout=START_BOUND,
            what="zre-ping's READY",
        )
        command.process.send_signal(signal.SIGINT)
        assert command.process.wait(START_BOUND) == 130, command.err
        [line] = command.err.splitlines()
    finally:
        command.close()
    assert line.startswith("zre-ping: interrupted after ")
    assert "meeting peers in GLOBAL as " in line
    assert "shout(s) sent to each group" in line and line.endswith("it has left the network")
