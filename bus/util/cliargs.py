"""What the command-line tools share about their arguments (argparse): a mistake is one
line, options sit on either side of the subcommand, and values are checked as they are
parsed.

- :class:`CliParser`: an ``ArgumentParser`` whose usage error is one line on stderr,
  ``PROG: MESSAGE (see PROG --help)``, and exit status 2; its subcommands' parsers too.
- :func:`options_anywhere`: ``dbp-cli --dialect hermes services`` and ``dbp-cli services
  --dialect hermes`` are the same command line; so are ``mc0-cli --timeout 5 ping`` and
  ``mc0-cli ping --timeout 5``.
- :func:`add_version`: ``PROG --version`` prints ``PROG (bus) VERSION``, the same for
  every tool.
- Argument types (``type=``) that refuse a bad value at parse time with a sentence:
  :func:`positive_seconds`, :func:`seconds_or_zero`, :func:`duration`, :func:`port`,
  :func:`whole_number`, :func:`tcp_endpoint`, :func:`host_port`.
"""

from __future__ import annotations

import argparse
import math
import socket
import sys
from collections.abc import Callable, Sequence
from typing import Any, NoReturn

from bus import version_line

#: The exit status of a usage error (argparse's own).
USAGE = 2


class CliParser(argparse.ArgumentParser):
    """argparse, but a usage error is one line (``PROG: MESSAGE (see PROG --help)``)."""

    def error(self, message: str) -> NoReturn:
        top = self.prog.split(" ")[0]
        self.exit(USAGE, f"{self.prog}: {one_line(message)} (see {top} --help)\n")


def add_version(parser: argparse.ArgumentParser) -> None:
    """``--version``: ``PROG (bus) VERSION`` on stdout, and exit status 0."""
    parser.add_argument(
        "--version",
        action="version",
        version=version_line(parser.prog),
        help="print the version of bus and exit",
    )


def one_line(text: object) -> str:
    """``text`` on one line (an error message that came with line breaks)."""
    return " ".join(str(text).split())


def fail(prog: str, sentence: object, status: int = 1) -> NoReturn:
    """End the program with ``PROG: SENTENCE`` on stderr (one line) and ``status``."""
    sys.stderr.write(f"{prog}: {one_line(sentence)}\n")
    sys.stderr.flush()
    raise SystemExit(status)


def react(
    prog: str,
    run: Callable[[Any], Any],
    expected: tuple[type[BaseException], ...],
    describe: Callable[[BaseException], object] = lambda error: error,
) -> NoReturn:
    """Run ``run(reactor)`` (a Deferred) with Twisted's ``task.react``. A failure ends the
    program with one line, ``PROG: ...``, and status 1: ``describe(error)`` for an
    ``expected`` error, a request to report it for any other (a defect of the tool, never
    a traceback); a ``SystemExit`` (the command said why already) goes through."""
    from twisted.internet import defer, task

    def explain(failure: Any) -> Any:
        if failure.check(SystemExit):
            return failure
        error = failure.value
        if failure.check(*expected):
            what = describe(error)
        else:
            what = f"unexpected {type(error).__name__} ({error}): please report it"
        fail(prog, one_line(what) or type(error).__name__)

    task.react(lambda reactor: defer.maybeDeferred(run, reactor).addErrback(explain))
    raise AssertionError("task.react always exits")


# -- options on either side of the subcommand ------------------------------------------------


def _subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def _options(parser: argparse.ArgumentParser) -> dict[str, argparse.Action]:
    return dict(parser._option_string_actions)


def _takes_value(action: argparse.Action) -> bool:
    return action.nargs != 0


def options_anywhere(parser: argparse.ArgumentParser, argv: Sequence[str]) -> list[str]:
    """``argv`` with each option moved to the side of the subcommand that knows it: an
    option of the subcommand given before it goes after it, an option of the program given
    after the subcommand goes before it. Everything else keeps its place (and ``--`` ends
    the options, as usual); a parser without subcommands gets ``argv`` as it is."""
    args = list(argv)
    commands = _subcommands(parser)
    if not commands:
        return args
    top = _options(parser)
    anywhere: dict[str, argparse.Action] = {}
    for command in commands.values():
        anywhere.update(_options(command))
    before: list[str] = []
    early: list[str] = []  # the subcommand's options, given before it
    index = 0
    while index < len(args):
        arg = args[index]
        if arg == "--" or not arg.startswith("-") or arg == "-":
            break
        name = arg.partition("=")[0]
        action = top.get(name) or anywhere.get(name)
        taken = [arg]
        if action is not None and "=" not in arg and _takes_value(action):
            taken += args[index + 1 : index + 2]
        (before if name in top else early).extend(taken)
        index += len(taken)
    if index >= len(args) or args[index] not in commands:
        return args  # no subcommand: argparse says what is missing
    command_name = args[index]
    known = _options(commands[command_name])
    after: list[str] = []
    late: list[str] = []  # the program's options, given after the subcommand
    index += 1
    while index < len(args):
        arg = args[index]
        if arg == "--":
            after += args[index:]
            break
        name = arg.partition("=")[0]
        if not arg.startswith("-") or arg == "-" or name in known or name not in top:
            action = known.get(name) if arg.startswith("-") else None
            taken = [arg]
            if action is not None and "=" not in arg and _takes_value(action):
                taken += args[index + 1 : index + 2]
            after += taken
        else:
            taken = [arg]
            if "=" not in arg and _takes_value(top[name]):
                taken += args[index + 1 : index + 2]
            late += taken
        index += len(taken)
    return [*before, *late, command_name, *early, *after]


# -- values checked as they are parsed -------------------------------------------------------


def _number(text: str, what: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not {what}") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"{text!r} is not {what}")
    return value


def positive_seconds(text: str) -> float:
    """A number of seconds, more than 0."""
    value = _number(text, "a number of seconds")
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{text!r}: give more than 0 seconds")
    return value


def seconds_or_zero(text: str) -> float:
    """A number of seconds, 0 or more (0 usually means: no limit)."""
    value = _number(text, "a number of seconds")
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text!r}: give 0 or more seconds")
    return value


def duration(text: str) -> float:
    """A duration (``30s``, ``250ms``, ``10m``, a number of seconds), more than 0: seconds."""
    from twisted.python import usage

    from bus.util.values import parse_duration

    try:
        value = parse_duration(text)
    except usage.UsageError as error:
        raise argparse.ArgumentTypeError(str(error)) from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{text!r}: give a duration of more than 0")
    return value


def whole_number(low: int = 0, high: int | None = None) -> Callable[[str], int]:
    """A type: a whole number from ``low`` (to ``high``)."""

    def whole(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
        if value < low or (high is not None and value > high):
            span = f"from {low} to {high}" if high is not None else f"{low} or more"
            raise argparse.ArgumentTypeError(f"{text!r}: give a whole number {span}")
        return value

    whole.__name__ = "whole number"
    return whole


def port(text: str) -> int:
    """A TCP or UDP port number, 0 (the system picks, or off) to 65535."""
    return whole_number(0, 65535)(text)


def _resolvable(host: str, port_number: int, text: str) -> None:
    name = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    try:
        socket.getaddrinfo(name, port_number, type=socket.SOCK_STREAM)
    except (OSError, UnicodeError) as problem:
        reason = getattr(problem, "strerror", None) or str(problem)
        raise argparse.ArgumentTypeError(
            f"{text!r}: host {name!r} cannot be resolved ({reason})"
        ) from None


def host_port(text: str) -> str:
    """``HOST:PORT`` (a port from 1 to 65535, a host that resolves); kept as given."""
    address = text.strip().removeprefix("tcp://")
    host, colon, number = address.rpartition(":")
    if not colon or not host or not number.isdigit() or not 0 < int(number) < 65536:
        raise argparse.ArgumentTypeError(f"{text!r} is not HOST:PORT")
    _resolvable(host, int(number), text)
    return text.strip()


def tcp_endpoint(text: str) -> str:
    """A ZeroMQ endpoint to connect to: ``tcp://HOST:PORT`` (``HOST:PORT`` alone is taken
    as tcp), or ``ipc://PATH``. libzmq takes any tcp:// text and then retries in silence
    (an unknown host, no port), so those are refused here."""
    url = text.strip() if "://" in text else f"tcp://{text.strip()}"
    scheme, _, address = url.partition("://")
    if scheme == "ipc" and address:
        return url
    host, colon, number = address.rpartition(":")
    host = host.rpartition(";")[2]  # after a source address, if one was given
    if scheme != "tcp" or not colon or not host or not number.isdigit():
        raise argparse.ArgumentTypeError(f"{text!r} is not an endpoint: write tcp://HOST:PORT")
    if not 0 < int(number) < 65536:
        raise argparse.ArgumentTypeError(f"{text!r}: the port is not from 1 to 65535")
    _resolvable(host, int(number), text)
    return url


def parse(parser: argparse.ArgumentParser, argv: Sequence[str] | None) -> Any:
    """``parser.parse_args`` over ``argv`` (default: ``sys.argv[1:]``), options anywhere."""
    args = list(sys.argv[1:] if argv is None else argv)
    return parser.parse_args(options_anywhere(parser, args))
