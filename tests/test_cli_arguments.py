"""Every command-line tool checks its options when it parses them and says what is wrong in
one line (exit status 1, or 2 for a usage error), never a traceback; an unknown option is
named; and a program's options may stand on either side of its subcommand. Fuzzed: bad
values option by option, and whole command lines made of each tool's own options."""

from __future__ import annotations

import argparse
import contextlib
import io
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from unittest import mock

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bus.util.cliargs import CliParser, dashed_values, options_anywhere

BIN = Path(sys.executable).parent


# -- options on either side of the subcommand -------------------------------------------------


def _parser() -> CliParser:
    parser = CliParser(prog="tool")
    parser.add_argument("--server", default="s")
    parser.add_argument("--plain", action="store_true")
    commands = parser.add_subparsers(dest="command", required=True)
    ping = commands.add_parser("ping")
    ping.add_argument("--count", type=int, default=1)
    ping.add_argument("--fast", action="store_true")
    ping.add_argument("target", nargs="?")
    return parser


@pytest.mark.parametrize(
    "argv",
    [
        ["--server", "x", "--plain", "ping", "--count", "3", "--fast", "t"],
        ["ping", "--server", "x", "--plain", "--count", "3", "--fast", "t"],
        ["--count", "3", "--fast", "ping", "--server=x", "t", "--plain"],
        ["--count=3", "--server", "x", "ping", "t", "--fast", "--plain"],
    ],
)
def test_options_stand_on_either_side_of_the_subcommand(argv: list[str]) -> None:
    parser = _parser()
    args = parser.parse_args(options_anywhere(parser, argv))
    assert (args.server, args.plain, args.command, args.count, args.fast, args.target) == (
        "x", True, "ping", 3, True, "t",
    )  # fmt: skip


def test_a_subcommands_option_without_the_subcommand_is_not_taken_for_it() -> None:
    parser = _parser()
    assert options_anywhere(parser, ["--server", "x", "--count", "3"]) == ["--server", "x"]
    with pytest.raises(SystemExit):
        parser.parse_args(options_anywhere(parser, ["--count", "3"]))


def test_after_a_double_dash_nothing_moves() -> None:
    parser = _parser()
    assert options_anywhere(parser, ["ping", "--", "--server"]) == ["ping", "--", "--server"]


def test_a_value_that_begins_with_a_dash_is_its_options_value() -> None:
    parser = _parser()
    key = "-wF$P#V#!Jc-T>H1TZg.:l!<l%QY2WEa7B}z32U"
    for argv in (["--server", key, "ping"], ["ping", "--server", key], ["ping", "--count", "-3"]):
        args = parser.parse_args(options_anywhere(parser, argv))
        assert (args.server, args.count) == ((key, 1) if key in argv else ("s", -3))
    # one of the parser's own options is not taken for a value; after "--" nothing is joined
    assert dashed_values(parser, ["--server", "--plain", "ping"]) == ["--server", "--plain", "ping"]
    assert dashed_values(parser, ["ping", "--", "--server", "-x"]) == [
        "ping",
        "--",
        "--server",
        "-x",
    ]
    with pytest.raises(SystemExit):
        parser.parse_args(options_anywhere(parser, ["--server", "--plain", "ping"]))


# -- the examples of issue 33, as users run them ----------------------------------------------


@pytest.mark.parametrize(
    ("command", "said"),
    [
        (["dbp-cli", "services", "--catalog", "bogus"], "--catalog: 'bogus' is not an endpoint"),
        (["dbp-cli", "services", "--timeout", "-1"], "--timeout: '-1': give more than 0"),
        (["dbp-cli", "--timeout", "-1", "services"], "--timeout: '-1': give more than 0"),
        (["mc0-cli", "--server", "bogus", "ping"], "--server: 'bogus' is not an endpoint"),
        (["mc0-cli", "--ttl", "-5", "ping"], "--ttl: not a duration: '-5'"),
        (["mc0-cli", "--timeout", "-1", "ping"], "--timeout: '-1': give more than 0"),
        # a subcommand's option and no subcommand: the command is what is missing
        (["dbp-cli", "--timeout", "5"], "the following arguments are required: command"),
        (["mc0-cli", "--timeout", "5"], "the following arguments are required: command"),
        (["mc0-cli", "ping", "--timeout", "-1"], "--timeout: '-1': give more than 0"),
        (["mc0-cli", "--plain", "ping", "--server-key", "x"], None),  # --plain: no key read
        (["mc0-cli", "ping", "--server-key", "nosuch.key"], "nosuch.key: not a CURVE public"),
        (["eventbus-cli", "status", "--http", "bogus"], "--http: 'bogus' is not HOST:PORT"),
        (["eventbus-cli", "--timeout", "-1", "status"], "--timeout: '-1': give more than 0"),
        (["emqp-worker", "--broker", "bogus"], "--broker: 'bogus' is not an endpoint"),
        (["zre-ping", "--port", "-1"], "--port: '-1': give a whole number from 0 to 65535"),
        (["bus-cluster", "--front-ends", "0"], "--front-ends: '0': give a whole number"),
        (
            ["bus-cluster", "--with", "mc0,zre"],
            "--with: zre: name any of mc0, dbp, emqp, emqp-pubsub",
        ),
        # issue 45: what a tool can judge is refused at once, an unknown option is named
        (["eventbus-cli", "publish", "", "1"], "argument topic: '': empty topic"),
        (["eventbus-cli", "publish", "$", "1"], "topics starting with $ are reserved"),
        (["eventbus-cli", "publish", "/a/", "--producer", "p" * 2000], "longer than 1024 bytes"),
        (["zre-ping", "--gossip-bind", "tcp://127.0.0.1:99999"], "port is not from 0 to 65535"),
        (["zre-ping", "--gossip-connect", "tcp://nosuch.invalid:1"], "cannot be resolved"),
        (["zre-ping", "--peer", "tcp://nosuch.invalid:1"], "cannot be resolved"),
        (["bus-keys", "x", "/nonexistent/dir"], "its parent '/nonexistent' is not a directory"),
        (["bus-cluster", "--dir", "/nonexistent/dir"], "its parent '/nonexistent' is not a"),
        (["bus-cluster", "--dir", "/proc/nope"], "/proc/nope: No such file or directory"),
        (["bus-cluster", "roll", "--stop", "kill {pid}"], "unknown field {pid}"),
        (["bus-cluster", "step-down", "n1", "--nats", "nats://:4222"], "nats://:4222: no host"),
        (["bus-cluster", "step-down"], "the following arguments are required: NAME"),
        (["bus-cluster", "roll", "--nats", "nats://h1:4222"], "--nats needs --stop and --start"),
        (["bus-cluster", "roll", "--stop", "true"], "--stop is for a cluster named with --nats"),
        (["bus-cluster", "wait-current", "n1", "--nats-password-file", "x"], "needs its user"),
        *[
            ([tool, "--bogus"], "unrecognized arguments: --bogus")
            for tool in (
                "eventbus-cli",
                "emqp-cli",
                "mc0-cli",
                "dbp-cli",
                "zre-ping",
                "bus-keys",
                "mc0-keys",
                "bus-cluster",
            )
        ],
        (["emqp-worker", "--bogus"], "unknown option --bogus"),
        (["emqp-cli", "--bogus", "status"], "unrecognized arguments: --bogus"),
        (["dbp-cli", "services", "--bogus"], "unrecognized arguments: --bogus"),
    ],
)
def test_a_bad_option_is_one_line_and_a_failure_status(
    tmp_path: Path, command: list[str], said: str | None
) -> None:
    if said is None:  # a command that runs: given no broker, it says so in time
        command = [*command, "--server", "tcp://127.0.0.1:9", "--timeout", "0.2"]
    run = subprocess.run(
        [str(BIN / command[0]), *command[1:]],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=60,
    )
    assert run.returncode in (1, 2), run
    assert list(tmp_path.iterdir()) == [], "a refused command made nothing"
    [line] = run.stderr.splitlines()
    assert "Traceback" not in run.stderr
    assert line.startswith(command[0])
    assert said is None or said in line, line


# -- every tool, fuzzed with bad values -------------------------------------------------------


class ReachedTheReactor(Exception):
    """A bad value got past the checks: the command went on to run."""


def _refuse_to_run(*args: Any, **kwargs: Any) -> Any:
    raise ReachedTheReactor(args)


@contextlib.contextmanager
def _nothing_runs() -> Iterator[None]:
    """Whatever would start the reactor, a server or a worker raises ReachedTheReactor."""
    from twisted.internet import reactor, task
    from twisted.logger import globalLogBeginner

    import bus.nats.cli
    import bus.zre.node

    handlers = {number: signal.getsignal(number) for number in (signal.SIGINT, signal.SIGTERM)}
    with contextlib.ExitStack() as stack:
        for target, name in [
            # The reactor may run in this process (pytest-twisted): nothing is scheduled on it.
            (reactor, "callWhenRunning"),
            (reactor, "run"),
            (task, "react"),
            (globalLogBeginner, "beginLoggingTo"),
            (bus.nats.cli, "NatsCluster"),
            (bus.nats.cli, "operate"),
            (bus.zre.node, "ZreNode"),
        ]:
            stack.enter_context(mock.patch.object(target, name, _refuse_to_run))
        try:
            yield
        finally:
            for number, handler in handlers.items():  # the tools set theirs
                signal.signal(number, handler)


def _main(tool: str) -> Callable[[list[str]], Any]:
    if tool == "dbp-cli":
        from bus.dbp.cli import main as dbp

        return dbp
    if tool == "mc0-cli":
        from bus.mc0.cli import main as mc0

        return mc0
    if tool == "eventbus-cli":
        from bus.eventbus.cli import main as eventbus

        return eventbus
    if tool == "emqp-cli":
        from bus.emqp.cli import main as emqp

        return emqp
    if tool == "emqp-worker":
        from bus.emqp.worker_tap import main as worker

        return worker
    if tool == "zre-ping":
        from bus.zre.cli import main as zre

        return zre
    if tool == "bus-keys":
        from bus.transport.keys_cli import main as keys

        return keys
    from bus.nats.cli import main as cluster

    return cluster


def outcome_in_process(tool: str, argv: list[str]) -> tuple[int | None, str]:
    """Exit status and stderr of ``tool``'s main() over ``argv``; None for the status of
    a command line it took (it went on to run)."""
    err = io.StringIO()
    with (
        _nothing_runs(),
        contextlib.redirect_stderr(err),
        contextlib.redirect_stdout(io.StringIO()),
    ):
        try:
            code = _main(tool)(argv)
        except SystemExit as ended:
            code = ended.code
        except ReachedTheReactor:
            return None, err.getvalue()
    if isinstance(code, str):  # SystemExit("message"): printed by Python as one line
        err.write(code + "\n")
        code = 1
    return int(code or 0), err.getvalue()


def run_in_process(tool: str, argv: list[str]) -> tuple[int, str]:
    """Exit status and stderr of ``tool``'s main() over ``argv``, which it must refuse."""
    code, err = outcome_in_process(tool, argv)
    if code is None:
        pytest.fail(f"{tool} {argv}: a bad value was accepted and the command ran")
    return code, err


_words = st.text(alphabet="abcdefghijklmnopqrstuvwxyz_.", min_size=1, max_size=12)
_junk = st.text(max_size=20).filter(lambda s: "\x00" not in s)
_negative = st.one_of(
    st.integers(max_value=-1).map(str),
    st.floats(max_value=-1e-9, allow_nan=False, allow_infinity=False).map(repr),
)
_not_a_number = st.one_of(st.sampled_from(["", "x", "1e", "--", "nan", "inf", "-inf"]), _words)

BAD: dict[str, st.SearchStrategy[str]] = {
    # a number of seconds above 0
    "seconds": st.one_of(_negative, st.just("0"), _not_a_number),
    # a duration above 0 (30s, 250ms, ...)
    "duration": st.one_of(_negative, st.sampled_from(["0", "0s", "5x", "s", "1.s", "nan"]), _words),
    "port": st.one_of(
        st.integers(max_value=-1).map(str), st.integers(min_value=65536).map(str), _not_a_number
    ),
    "first-port": st.one_of(
        st.integers(max_value=0).map(str), st.integers(min_value=65536).map(str), _not_a_number
    ),
    "count": st.one_of(st.integers(max_value=-1).map(str), _not_a_number),
    "positive-count": st.one_of(st.integers(max_value=0).map(str), _not_a_number),
    # endpoints that fail before any name is looked up
    "endpoint": st.one_of(
        st.sampled_from(["", "bogus", "tcp://", "tcp://host", "tcp://:5", "udp://127.0.0.1:5"]),
        st.sampled_from(["tcp://127.0.0.1:0", "tcp://127.0.0.1:65536", "127.0.0.1:x"]),
        _words,
        st.integers(min_value=65536).map(lambda n: f"tcp://127.0.0.1:{n}"),
    ),
    "host-port": st.one_of(
        st.sampled_from(["", "bogus", "127.0.0.1", ":5", "127.0.0.1:0", "127.0.0.1:99999"]),
        _words,
    ),
    "header": _junk.filter(lambda s: "=" not in s or s.startswith("=")),
    "choice": _junk.filter(
        lambda s: s not in ("spec", "hermes", "original", "delimited", "1", "2")
    ),
    "role": _words.filter(
        lambda s: s not in ("worker", "client", "admin", "publisher", "subscriber")
    ),
    "subtree": _words,  # a subtree starts with /
    "key": st.sampled_from(["x", "nosuch.key", "A" * 39, "/nonexistent/a.key"]),
}

#: (tool, argv with {} for the value, kind of bad value)
CASES = [
    ("dbp-cli", ["services", "--catalog", "{}"], "endpoint"),
    ("dbp-cli", ["--catalog", "{}", "services"], "endpoint"),
    ("dbp-cli", ["services", "--timeout", "{}"], "seconds"),
    ("dbp-cli", ["--timeout", "{}", "services"], "seconds"),
    ("dbp-cli", ["services", "--beacon-port", "{}"], "first-port"),
    ("dbp-cli", ["--dialect", "{}", "services"], "choice"),
    ("dbp-cli", ["services", "--server-key", "{}"], "key"),
    ("mc0-cli", ["--server", "{}", "ping"], "endpoint"),
    ("mc0-cli", ["ping", "--server", "{}"], "endpoint"),
    ("mc0-cli", ["--ttl", "{}", "ping"], "duration"),
    ("mc0-cli", ["ping", "--ttl", "{}"], "duration"),
    ("mc0-cli", ["--timeout", "{}", "ping"], "seconds"),
    ("mc0-cli", ["ping", "--timeout", "{}"], "seconds"),
    ("mc0-cli", ["ping", "--count", "{}"], "positive-count"),
    ("mc0-cli", ["sub", "t", "--count", "{}"], "count"),
    ("mc0-cli", ["put", "t", "b", "--header", "{}"], "header"),
    ("mc0-cli", ["--framing", "{}", "ping"], "choice"),
    ("mc0-cli", ["ping", "--server-key", "{}"], "key"),
    ("eventbus-cli", ["status", "--http", "{}"], "host-port"),
    ("eventbus-cli", ["--http", "{}", "status"], "host-port"),
    ("eventbus-cli", ["status", "--timeout", "{}"], "seconds"),
    ("eventbus-cli", ["--timeout", "{}", "snapshot"], "seconds"),
    ("eventbus-cli", ["snapshot", "--server", "{}"], "host-port"),
    ("eventbus-cli", ["tail", "--server", "{}"], "host-port"),
    ("eventbus-cli", ["tail", "--since", "{}"], "count"),
    ("eventbus-cli", ["publish", "/x/", "--timeout", "{}"], "seconds"),
    ("eventbus-cli", ["snapshot", "--dialect", "{}"], "choice"),
    ("eventbus-cli", ["snapshot", "--server-key", "{}"], "key"),
    ("emqp-cli", ["status", "--wait", "{}"], "count"),
    ("emqp-cli", ["--wait", "{}", "status"], "count"),
    ("emqp-cli", ["status", "--admin", "{}"], "endpoint"),
    ("emqp-cli", ["--admin", "{}", "schedules"], "endpoint"),
    ("emqp-cli", ["submit", "q", "[]", "--broker", "{}"], "endpoint"),
    ("emqp-cli", ["submit", "q", "[]", "--retries", "{}"], "count"),
    ("emqp-cli", ["submit", "q", "[]", "--timeout", "{}"], "count"),
    ("emqp-cli", ["schedule", "q", "[]", "--every", "{}"], "duration"),
    ("emqp-cli", ["schedule", "q", "[]", "--every", "1h", "--runs", "{}"], "positive-count"),
    ("emqp-cli", ["schedules", "import", "--rdb", "x", "--db", "{}"], "count"),
    ("emqp-cli", ["status", "--server-key", "{}"], "key"),
    ("emqp-worker", ["--broker", "{}"], "endpoint"),
    ("emqp-worker", ["--slots", "{}"], "positive-count"),
    ("emqp-worker", ["--heartbeat-interval", "{}"], "duration"),
    ("emqp-worker", ["--grace-period", "{}"], "_negative"),
    ("emqp-worker", ["--server-key", "{}"], "key"),
    ("zre-ping", ["--port", "{}"], "port"),
    ("zre-ping", ["--interval", "{}"], "duration"),
    ("zre-ping", ["--evasive", "{}"], "duration"),
    ("zre-ping", ["--expired", "{}"], "duration"),
    ("zre-ping", ["--peer", "{}"], "endpoint"),
    ("zre-ping", ["--zre-version", "{}"], "choice"),
    ("bus-keys", ["alice", "{dir}", "--role", "{}"], "role"),
    ("bus-keys", ["--role", "{}", "make", "alice", "{dir}"], "role"),
    ("bus-keys", ["alice", "{dir}", "--publish", "{}"], "subtree"),
    ("bus-keys", ["show", "{}"], "key"),
    ("bus-cluster", ["--port", "{}"], "first-port"),
    ("bus-cluster", ["--front-ends", "{}"], "positive-count"),
    ("bus-cluster", ["--nats-port", "{}"], "first-port"),
]
BAD["_negative"] = _negative


@pytest.mark.parametrize(("tool", "template", "kind"), CASES)
def test_bad_values_are_refused_in_one_line(
    tmp_path: Path, tool: str, template: list[str], kind: str
) -> None:
    @settings(
        max_examples=25,
        deadline=None,
        suppress_health_check=[HealthCheck.function_scoped_fixture],
    )
    @given(value=BAD[kind])
    def refused(value: str) -> None:
        argv = [value if a == "{}" else a.replace("{dir}", str(tmp_path)) for a in template]
        code, err = run_in_process(tool, argv)
        assert code in (1, 2), (argv, code, err)
        assert "Traceback" not in err
        lines = err.splitlines()
        assert len(lines) == 1 and lines[0].startswith(tool), (argv, err)

    with mock.patch.dict("os.environ", {"HOME": str(tmp_path)}):
        refused()


# -- every tool, fuzzed with command lines of its own options ---------------------------------


def _parsers(tool: str) -> list[argparse.ArgumentParser]:
    """The parsers of ``tool`` (its subcommands' too, through :func:`_subcommand_parsers`)."""
    if tool == "eventbus-cli":
        from bus.eventbus.cli import build_parser as eventbus

        return [eventbus()]
    if tool == "emqp-cli":
        from bus.emqp.cli import build_parser as emqp

        return [emqp()]
    if tool == "mc0-cli":
        from bus.mc0.cli import build_parser as mc0

        return [mc0()]
    if tool == "dbp-cli":
        from bus.dbp.cli import parser as dbp

        return [dbp()]
    if tool == "zre-ping":
        from bus.zre.cli import parser as zre

        return [zre()]
    if tool == "bus-keys":
        from bus.transport.keys_cli import parser_for

        return [parser_for(command) for command in ("make", "set", "show")]
    from bus.nats.cli import parser as cluster

    return [cluster()]


def _words_of(tool: str) -> tuple[list[str], list[str], list[str]]:
    """``tool``'s options that take a value, its flags, and its subcommands' names."""
    if tool == "emqp-worker":
        from bus.emqp.worker_tap import Options

        names = Options().longOpt
        valued = [f"--{n[:-1]}" for n in names if n.endswith("=") and n != "handlers="]
        flags = [f"--{n}" for n in names if not n.endswith("=")]
        return valued, [*flags, "-Q", "-J"], []
    valued: list[str] = []
    flags: list[str] = []
    commands: list[str] = []
    pending = _parsers(tool)
    while pending:
        parser = pending.pop()
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                commands.extend(action.choices)
                pending.extend(action.choices.values())
            elif action.option_strings:
                (valued if action.nargs != 0 else flags).extend(action.option_strings)
    if tool == "bus-keys":
        commands += ["make", "set", "show"]
    return sorted(set(valued)), sorted(set(flags)), sorted(set(commands))


#: Values as people mistype them and as they mean them; none names a Python module (an
#: emqp-worker option imports what it names) or a host that is slow to look up.
_VALUE = st.one_of(
    st.sampled_from([
        "", "0", "1", "2", "-1", "65535", "65536", "99999", "1.5", "nan", "inf", "1e9", "30s",
        "250ms", "0s", "x", "-", "--", "tcp://127.0.0.1:9", "tcp://127.0.0.1:0",
        "tcp://nosuch.invalid:1", "tcp://*:*", "tcp://127.0.0.1:99999", "ipc://x",
        "127.0.0.1:9", "localhost:1", "/orders/", "$", "/", "a=b", "=", "spec", "hermes",
        "original", "delimited", "worker", "admin", "10:default", "{tmp}", "{tmp}/new",
        "{tmp}/no/such", "/proc/nope", "nosuch.key", "\u00e9", "[]", "{}", "null",
    ]),
    st.integers(-(10**6), 10**6).map(str),
    st.text(alphabet=" -:/.,=|*0123456789\u00e9x", max_size=10),
)  # fmt: skip

_TOOLS = ["eventbus-cli", "emqp-cli", "mc0-cli", "dbp-cli", "zre-ping", "bus-keys",
          "bus-cluster", "emqp-worker"]  # fmt: skip


@st.composite
def _command_lines(draw: st.DrawFn, tool: str) -> list[str]:
    valued, flags, commands = _words_of(tool)
    token = st.one_of(
        st.sampled_from(valued).flatmap(lambda o: st.tuples(st.just(o), _VALUE).map(list)),
        st.sampled_from(valued).flatmap(lambda o: _VALUE.map(lambda v: [f"{o}={v}"])),
        st.sampled_from(flags).map(lambda f: [f]),
        _VALUE.map(lambda v: [v]),
        st.sampled_from(["--bogus", "-Z", "--", "--help", "--version"]).map(lambda w: [w]),
    )
    first = [draw(st.sampled_from(commands))] if commands and draw(st.booleans()) else []
    rest = draw(st.lists(token, max_size=6))
    words = first + [word for group in rest for word in group]
    at = draw(st.integers(0, len(words)))
    if commands and draw(st.booleans()):  # the subcommand after some options
        words.insert(at, draw(st.sampled_from(commands)))
    return words


@pytest.mark.parametrize("tool", _TOOLS)
def test_any_command_line_ends_in_one_line_or_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, tool: str
) -> None:
    """Whatever the command line: the tool runs (it reached its reactor), or ends with
    status 0 (--help, --version), or with 1 or 2 and one line on stderr naming the tool;
    never a traceback."""
    monkeypatch.chdir(tmp_path)  # bus-keys and bus-cluster write where they are told
    monkeypatch.setenv("HOME", str(tmp_path))

    @settings(
        max_examples=150,
        deadline=None,
        suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
    )
    @given(argv=_command_lines(tool))
    def ends_well(argv: list[str]) -> None:
        argv = [word.replace("{tmp}", str(tmp_path)) for word in argv]
        code, said = outcome_in_process(tool, argv)
        if code is None:
            return  # a command line it takes
        assert "Traceback" not in said, (argv, said)
        assert code in (0, 1, 2, 130), (argv, code, said)
        if code:
            lines = said.splitlines()
            assert len(lines) == 1 and lines[0].startswith(tool), (argv, said)

    ends_well()
