"""What the command-line tools share about their arguments (argparse) and their end: a
mistake is one line, options sit on either side of the subcommand, values are checked as
they are parsed, and Ctrl-C ends a command with one line and exit status 130.

- :class:`CliParser`: an ``ArgumentParser`` whose usage error is one line on stderr,
  ``PROG: MESSAGE (see PROG --help)``, and exit status 2; its subcommands' parsers too.
  An unknown option is named even when a required argument is missing too.
- :func:`options_anywhere`: ``dbp-cli --dialect hermes services`` and ``dbp-cli services
  --dialect hermes`` are the same command line; so are ``mc0-cli --timeout 5 ping`` and
  ``mc0-cli ping --timeout 5``. A value that begins with a dash (a Z85 key may) is
  taken as a value: :func:`dashed_values`.
- :func:`add_version`: ``PROG --version`` prints ``PROG (bus) VERSION``, the same for
  every tool.
- Argument types (``type=``) that refuse a bad value at parse time with a sentence:
  :func:`positive_seconds`, :func:`seconds_or_zero`, :func:`duration`, :func:`port`,
  :func:`whole_number`, :func:`tcp_endpoint`, :func:`bind_endpoint`, :func:`host_port`,
  :func:`directory`.
- :class:`Progress`: what a command has done and waits for, kept as it goes, and Ctrl-C:
  the reactor stops (what the command waits for is cancelled first, so it cleans up), and
  the command ends with ``PROG: interrupted after 2.7 s, waiting for ...; what was done``
  and status :data:`INTERRUPTED`. :func:`react` runs a command so; :func:`interruptible`
  wraps a ``main`` so that a Ctrl-C before its reactor runs ends the same way.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import math
import re
import signal
import socket
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NoReturn, ParamSpec, TypeVar

from bus import version_line

#: The exit status of a usage error (argparse's own).
USAGE = 2
#: The exit status of a command that Ctrl-C (SIGINT) ended, as shells give it: 128 + 2.
INTERRUPTED = 128 + signal.SIGINT

# argparse's own test for a negative number (taken as a value, not an option).
_NEGATIVE = re.compile(r"^-\d+$|^-\d*\.\d+$")


class CliParser(argparse.ArgumentParser):
    """argparse, but a usage error is one line (``PROG: MESSAGE (see PROG --help)``)."""

    #: The exit status of a usage error.
    usage_status = USAGE
    _given: list[str] = []

    def parse_known_args(  # type: ignore[override]
        self, args: Sequence[str] | None = None, namespace: Any = None
    ) -> tuple[argparse.Namespace, list[str]]:
        """argparse's, the arguments kept to name an unknown option in :meth:`error`."""
        self._given = list(sys.argv[1:] if args is None else args)
        parsed, extras = super().parse_known_args(args, namespace)
        for action in self._actions:
            # argparse (3.11) gives a one-value positional that a second "--" left without
            # its value as [], unconverted (bus-keys -- --help --): a missing argument.
            if (
                not action.option_strings
                and action.nargs is None
                and isinstance(getattr(parsed, action.dest, None), list)
            ):
                self.error(f"the following arguments are required: {action.dest}")
        return parsed, extras

    def error(self, message: str) -> NoReturn:
        # argparse checks required arguments before it looks at what it did not know: an
        # unknown option is the likelier mistake, and the one to name.
        unknown = self._unknown_options()
        if unknown and message.startswith("the following arguments are required"):
            message = f"unrecognized arguments: {' '.join(unknown)}"
        top = self.prog.split(" ")[0]
        self.exit(self.usage_status, f"{self.prog}: {one_line(message)} (see {top} --help)\n")

    def _unknown_options(self) -> list[str]:
        """The options given that neither this parser nor any of its subcommands knows (an
        unambiguous abbreviation counts as known, as argparse takes it)."""
        known = set(self._option_string_actions)
        for command in _subcommands(self).values():
            known.update(command._option_string_actions)
        unknown = []
        for arg in self._given:
            if arg == "--":
                break
            if not arg.startswith("-") or arg == "-" or _NEGATIVE.match(arg):
                continue
            name = arg.partition("=")[0]
            if name in known or (
                name.startswith("--") and any(option.startswith(name) for option in known)
            ):
                continue
            if not name.startswith("--") and name[:2] in known:
                continue  # -v3, -vq: a short option with its value or others
            unknown.append(arg)
        return unknown


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


# -- Ctrl-C and the end of a command ----------------------------------------------------------

P = ParamSpec("P")
T = TypeVar("T")

#: Seconds a command interrupted by Ctrl-C gets to close what it opened (a second Ctrl-C
#: ends it at once).
CLEANUP_BOUND = 5.0


def seconds_text(value: float) -> str:
    """``2.7 s``: a duration as the commands' lines say it."""
    return f"{round(value, 1):g} s"


class Progress:
    """What a command has done and what it waits for, kept as it goes, for the one line
    that Ctrl-C ends it with: ``PROG: interrupted after 2.7 s, DOING; DONE`` (``DOING``:
    ``waiting for the event's broadcast from 127.0.0.1:5556``; ``DONE``: ``the event was
    sent, not confirmed``), and exit status :data:`INTERRUPTED`."""

    def __init__(
        self,
        prog: str,
        doing: str = "before it began",
        done: str | Callable[[], str] = "nothing done",
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.prog = prog
        self.doing = doing
        self._done = done
        self._clock = clock
        self.started = clock()
        #: Whether Ctrl-C came (once :meth:`catch` took it over).
        self.interrupted = False

    def now(self, doing: str, done: str | Callable[[], str] | None = None) -> None:
        """The command is ``doing`` this now, having done ``done`` (a callable: asked
        only if the line is written, for counts that change at every event)."""
        self.doing = doing
        if done is not None:
            self._done = done

    def did(self, done: str | Callable[[], str]) -> None:
        """What the command has done now (what it is doing unchanged)."""
        self._done = done

    @property
    def done(self) -> str:
        """What the command has done, as its line says it."""
        return self._done() if callable(self._done) else self._done

    def elapsed(self) -> str:
        """Time since the command began, as its line says it."""
        return seconds_text(self._clock() - self.started)

    def sentence(self) -> str:
        """``interrupted after 2.7 s, DOING; DONE``."""
        return f"interrupted after {self.elapsed()}, {self.doing}; {self.done}"

    def end(self) -> NoReturn:
        """End the program with :meth:`sentence` and :data:`INTERRUPTED`."""
        fail(self.prog, self.sentence(), INTERRUPTED)

    def catch(self, reactor: Any = None, stop: Callable[[], object] | None = None) -> None:
        """From now on Ctrl-C sets :attr:`interrupted` and calls ``stop`` (on ``reactor``'s
        thread, when there is one) to end what the command waits for; with a reactor, it
        stops once ``stop`` let the command end or after :data:`CLEANUP_BOUND` seconds
        (``stop`` None: at once). A second Ctrl-C stops it at once. Where SIGINT is ignored
        (a command started in the background) it stays ignored."""
        if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
            return

        def pressed(number: int, frame: Any) -> None:
            if reactor is None:
                self.interrupted = True
                if stop is not None:
                    stop()
            elif self.interrupted:
                reactor.callFromThread(_stop_reactor, reactor)
            else:
                self.interrupted = True
                reactor.callFromThread(self._interrupt, reactor, stop)

        signal.signal(signal.SIGINT, pressed)

    @staticmethod
    def _interrupt(reactor: Any, stop: Callable[[], object] | None) -> None:
        if stop is None:
            _stop_reactor(reactor)
            return
        reactor.callLater(CLEANUP_BOUND, _stop_reactor, reactor)
        stop()


def _stop_reactor(reactor: Any) -> None:
    from twisted.internet.error import ReactorNotRunning

    with contextlib.suppress(ReactorNotRunning):
        reactor.stop()


def interruptible(prog: str) -> Callable[[Callable[P, T]], Callable[P, T]]:
    """A command's ``main``: Ctrl-C before its reactor takes SIGINT over (while it loads,
    parses or checks its input) ends it with one line and :data:`INTERRUPTED`, never a
    KeyboardInterrupt's traceback."""

    def wrap(main: Callable[P, T]) -> Callable[P, T]:
        @functools.wraps(main)
        def wrapped(*args: P.args, **kwargs: P.kwargs) -> T:
            started = time.monotonic()
            try:
                return main(*args, **kwargs)
            except KeyboardInterrupt:
                took = seconds_text(time.monotonic() - started)
                fail(prog, f"interrupted after {took}, before it began; nothing done", INTERRUPTED)

        return wrapped

    return wrap


def react(
    prog: str,
    run: Callable[[Any], Any],
    expected: tuple[type[BaseException], ...],
    describe: Callable[[BaseException], object] = lambda error: error,
    progress: Progress | None = None,
) -> NoReturn:
    """Run ``run(reactor)`` (a Deferred) on the reactor until it ends. A failure ends the
    program with one line, ``PROG: ...``, and status 1: ``describe(error)`` for an
    ``expected`` error, a request to report it for any other (a defect of the tool, never
    a traceback); a ``SystemExit`` (the command said why already) goes through. Ctrl-C
    cancels ``run``'s Deferred (its ``finally`` clauses close what it opened while the
    reactor still runs) and ends with ``progress``'s line and :data:`INTERRUPTED`."""
    from twisted.internet import defer
    from twisted.internet import reactor as global_reactor
    from twisted.python.failure import Failure

    reactor: Any = global_reactor
    progress = progress or Progress(prog)
    outcome: list[Any] = []
    running: list[defer.Deferred[Any]] = []

    def finished(result: Any) -> None:
        outcome.append(result)
        _stop_reactor(reactor)

    def start() -> None:
        done = defer.maybeDeferred(run, reactor)
        running.append(done)
        done.addBoth(finished)

    def cancel() -> None:
        for each in running:
            each.cancel()

    progress.catch(reactor, cancel)
    reactor.callWhenRunning(start)
    reactor.run()
    result = outcome[0] if outcome else None
    if progress.interrupted and (not outcome or isinstance(result, Failure)):
        progress.end()
    if not outcome:  # stopped from outside (SIGTERM)
        fail(prog, f"stopped after {progress.elapsed()}, {progress.doing}; {progress.done}")
    if isinstance(result, Failure):
        error: Any = result.value
        if result.check(SystemExit):
            raise error
        if result.check(*expected):
            what = describe(error)
        else:
            what = f"unexpected {type(error).__name__} ({error}): please report it"
        fail(prog, one_line(what) or type(error).__name__)
    raise SystemExit(0)


# -- options on either side of the subcommand ------------------------------------------------


def _subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def _command_required(parser: argparse.ArgumentParser) -> bool:
    return any(
        isinstance(action, argparse._SubParsersAction) and action.required
        for action in parser._actions
    )


def _options(parser: argparse.ArgumentParser) -> dict[str, argparse.Action]:
    return dict(parser._option_string_actions)


def _takes_value(action: argparse.Action) -> bool:
    return action.nargs != 0


def dashed_values(parser: argparse.ArgumentParser, argv: Sequence[str]) -> list[str]:
    """``argv`` with a one-value option and a value that begins with a dash joined into one
    argument (``--server-key -a1...`` -> ``--server-key=-a1...``), as getopt (and so twistd)
    reads them: argparse alone takes such a value for an option and says the value is
    missing. One Z85 key in 85 begins with ``-``. A value that is itself one of the
    parser's options is left apart, so a forgotten value is still said to be missing."""
    options = _options(parser)
    for command in _subcommands(parser).values():
        options = {**_options(command), **options}
    args = list(argv)
    out: list[str] = []
    index = 0
    while index < len(args):
        arg = args[index]
        if arg == "--":
            return out + args[index:]
        action = options.get(arg)
        if action is None or action.nargs not in (None, 1) or index + 1 >= len(args):
            out.append(arg)
            index += 1
            continue
        value = args[index + 1]
        if value.startswith("-") and value != "--" and value.partition("=")[0] not in options:
            out.append(f"{arg}={value}" if arg.startswith("--") else arg + value)
        else:
            out += [arg, value]
        index += 2
    return out


def options_anywhere(parser: argparse.ArgumentParser, argv: Sequence[str]) -> list[str]:
    """``argv`` with each option moved to the side of the subcommand that knows it: an
    option of the subcommand given before it goes after it, an option of the program given
    after the subcommand goes before it. Everything else keeps its place (and ``--`` ends
    the options, as usual); a parser without subcommands gets ``argv`` as it is. A value
    that begins with a dash is joined to its option first (:func:`dashed_values`)."""
    args = dashed_values(parser, argv)
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
        (early if action is not None and name not in top else before).extend(taken)
        index += len(taken)
    if index >= len(args) and early and _command_required(parser):
        # Only a subcommand's options and no subcommand: without them argparse says the
        # command is missing (with them, it took an option's value for the command).
        return before
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


def bind_endpoint(text: str) -> str:
    """A ZeroMQ endpoint to bind: ``tcp://HOST:PORT`` (``HOST``: an address, an interface
    or ``*``; ``PORT``: 0 to 65535, or ``*`` for one the system picks), or ``ipc://PATH``.
    libzmq takes the port modulo 65536 in silence, so one out of range is refused here."""
    url = text.strip()
    scheme, _, address = url.partition("://")
    if scheme == "ipc" and address:
        return url
    host, colon, number = address.rpartition(":")
    if scheme != "tcp" or not colon or not host or not (number.isdigit() or number == "*"):
        raise argparse.ArgumentTypeError(f"{text!r} is not an endpoint: write tcp://HOST:PORT")
    if number != "*" and not 0 <= int(number) <= 65535:
        raise argparse.ArgumentTypeError(f"{text!r}: the port is not from 0 to 65535")
    return url


def directory(text: str) -> Path:
    """A directory to write in: one that exists, or one its parent can hold (made when
    used, and said then). A path whose parent does not exist is refused: a mistyped path
    must not become a tree of new directories."""
    path = Path(text).expanduser()
    if path.is_dir():
        return path
    if path.exists():
        raise argparse.ArgumentTypeError(f"{text!r} is not a directory")
    if not path.parent.is_dir():
        raise argparse.ArgumentTypeError(
            f"{text!r}: its parent {str(path.parent)!r} is not a directory"
        )
    return path


def made(path: Path) -> bool:
    """Make ``path`` (a directory whose parent exists) unless it exists: True if made.
    OSError says why it cannot be."""
    if path.is_dir():
        return False
    path.mkdir()
    return True


def parse(parser: argparse.ArgumentParser, argv: Sequence[str] | None) -> Any:
    """``parser.parse_args`` over ``argv`` (default: ``sys.argv[1:]``), options anywhere."""
    args = list(sys.argv[1:] if argv is None else argv)
    return parser.parse_args(options_anywhere(parser, args))
