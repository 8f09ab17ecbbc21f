"""eventmq's own settings, read as its programs read them, so that ``emqp-worker -C
/etc/eventmq.conf`` (for ``emq-jobmanager``) and ``twistd -n emqp -C /etc/eventmq.conf``
(for ``emq-router``) serve from the same configuration.

eventmq reads an INI file (``-C``, else ``$EVENTMQ_CONFIG_FILE``, else ``/etc/eventmq.conf``;
a file that does not exist is no error) first in its ``[global]`` section, then in the
program's own (``[jobmanager]``; ``[router]`` here, which eventmq 0.3.13's router itself never
reads); for every setting an ``EVENTMQ_<NAME>`` variable wins over the file. Names are
case-insensitive in the file (``worker_addr`` is ``WORKER_ADDR``).

:func:`read_eventmq_settings` returns the values and where each came from, for a
:class:`Program` (:data:`JOBMANAGER`, :data:`ROUTER`): which settings it takes (its
``option_of``: which of our options each sets) and which it does not reproduce
(``not_honoured``: each one that is set is worth one line in the log). Every other eventmq
setting (another program's, logging) is ignored.
"""

from __future__ import annotations

import configparser
import os
import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from twisted.python import usage

DEFAULT_CONFIG_FILE = "/etc/eventmq.conf"
SECTIONS = ("global", "jobmanager")
ENV_PREFIX = "EVENTMQ_"

#: eventmq setting -> the ``emqp-worker`` option it sets (in the option's own syntax).
OPTION_OF: dict[str, str] = {
    "WORKER_ADDR": "broker",
    "QUEUES": "queues",
    "CONCURRENT_JOBS": "slots",
    "HEARTBEAT_INTERVAL": "heartbeat-interval",
    "HEARTBEAT_LIVENESS": "heartbeat-liveness",
    "KILL_GRACE_PERIOD": "grace-period",
    "SUBPROCESS_SETUP_FUNC": "setup-func",
    "JOB_ENTRY_FUNC": "job-entry-func",
    "JOB_EXIT_FUNC": "job-exit-func",
    "MAX_JOB_COUNT": "max-jobs-per-process",
    "GLOBAL_TIMEOUT": "job-timeout",
}

#: Settings that change what eventmq's job manager does in ways this worker does not
#: follow, with what it does instead.
NOT_HONOURED: dict[str, str] = {
    "DISABLE_HEARTBEATS": "heartbeats are always on",
    "HEARTBEAT_TIMEOUT": (
        "the broker counts as gone after heartbeat-interval x heartbeat-liveness of silence"
    ),
    "RECONNECT_TIMEOUT": (
        "an unanswered INFORM is sent again after heartbeat-interval x heartbeat-liveness"
    ),
    "WORKER_ADDR_FAILOVER": "one broker address only (--broker)",
    "WORKER_ADDR_DEFAULT": "one broker address only (--broker)",
    "DEFAULT_ENCODING": "frames are UTF-8",
    "HWM": "the worker's socket holds up to 10000 outgoing messages",
    "MAX_SOCKETS": "the worker opens one socket",
    "DEFAULT_QUEUE_NAME": "the queues served are --queues (default 10:default)",
    "DEFAULT_QUEUE_WEIGHT": "the queues served are --queues (a bare name weighs 10)",
    "SUPER_DEBUG": "the worker logs no message-by-message lines",
    "HIDE_HEARTBEAT_LOGS": "the worker logs no heartbeats",
}

#: eventmq's router setting -> the ``twistd emqp`` option it sets. The three addresses
#: (``tcp://HOST:PORT``) set the port and ``bind``; ``HEARTBEAT_TIMEOUT`` (seconds of a
#: worker's silence) sets ``heartbeat-liveness`` in intervals (see ``bus.emqp.tap``).
ROUTER_OPTION_OF: dict[str, str] = {
    "BACKEND_ADDR": "worker-port",
    "FRONTEND_ADDR": "client-port",
    "ADMINISTRATIVE_ADDR": "admin-port",
    "HWM": "queue-limit",
    "HEARTBEAT_INTERVAL": "heartbeat-interval",
    "HEARTBEAT_TIMEOUT": "heartbeat-liveness",
}

#: Router settings whose behaviour the broker does not reproduce, with what it does instead.
ROUTER_NOT_HONOURED: dict[str, str] = {
    "DISABLE_HEARTBEATS": "heartbeats are always on",
    "DEFAULT_QUEUE_NAME": (
        "a request for a queue no worker serves waits in that queue's own buffer"
    ),
    "DEFAULT_QUEUE_WEIGHT": "a worker that INFORMs no queues serves default at weight 10",
    "QUEUES": "a worker that INFORMs no queues serves default at weight 10",
    "WAL_ENABLED": "guaranteed requests are kept in the job store of --data-dir, no WAL file",
    "MAX_SOCKETS": "the broker opens its three ports' sockets",
    "DEFAULT_ENCODING": "frames are UTF-8",
    "SUPER_DEBUG": "the broker logs no message-by-message lines",
    "HIDE_HEARTBEAT_LOGS": "the broker logs no heartbeats",
}

#: Boolean settings worth a line only when they differ from eventmq's default (its own
#: test for true: a ``t`` in the value).
_NOTICED_WHEN: dict[str, bool] = {
    "DISABLE_HEARTBEATS": True,
    "SUPER_DEBUG": True,
    "HIDE_HEARTBEAT_LOGS": False,
    "WAL_ENABLED": True,
}

#: eventmq's older spelling of the setup hook: a module and a function name apart.
_OLD_SETUP = ("SETUP_PATH", "SETUP_CALLABLE")


@dataclass(frozen=True, slots=True)
class Program:
    """One of eventmq's programs, as far as its settings go: the INI sections it reads
    (the last wins), the settings we honour (-> our option) and those we do not."""

    name: str
    sections: tuple[str, ...]
    option_of: Mapping[str, str]
    not_honoured: Mapping[str, str]
    #: Further names read (eventmq's older spellings).
    also: tuple[str, ...] = ()

    def wanted(self) -> tuple[str, ...]:
        """Every setting name the program reads."""
        return (*self.option_of, *self.not_honoured, *self.also)


#: ``emq-jobmanager``, for ``emqp-worker``.
JOBMANAGER = Program("jobmanager", SECTIONS, OPTION_OF, NOT_HONOURED, _OLD_SETUP)
#: ``emq-router``, for ``twistd -n emqp``.
ROUTER = Program("router", ("global", "router"), ROUTER_OPTION_OF, ROUTER_NOT_HONOURED)


@dataclass(frozen=True, slots=True)
class EventmqSettings:
    """eventmq settings that mean something to one program: name -> (value, source)."""

    values: dict[str, tuple[str, str]] = field(default_factory=dict)
    #: The INI file read, if one was.
    path: str | None = None
    program: Program = JOBMANAGER

    def options(self) -> dict[str, tuple[str, str]]:
        """Our option -> (value, source) for the settings honoured, in eventmq's syntax."""
        option_of = self.program.option_of
        chosen = {
            option_of[name]: value for name, value in self.values.items() if name in option_of
        }
        if (
            self.program is JOBMANAGER
            and not chosen.get("setup-func", ("", ""))[0]
            and all(name in self.values for name in _OLD_SETUP)
        ):
            (path, source), (function, _) = (self.values[name] for name in _OLD_SETUP)
            if path and function:  # eventmq drops a :Class part of SETUP_PATH
                chosen["setup-func"] = (f"{path.partition(':')[0]}.{function}", source)
        return chosen

    def not_honoured(self) -> list[str]:
        """One line per setting given whose behaviour we do not reproduce."""
        lines = []
        for name, instead in self.program.not_honoured.items():
            if name not in self.values:
                continue
            value, source = self.values[name]
            if name in _NOTICED_WHEN and ("t" in value.lower()) != _NOTICED_WHEN[name]:
                continue
            if name == "DEFAULT_ENCODING" and value.lower().replace("-", "") == "utf8":
                continue
            if name == "DEFAULT_QUEUE_NAME" and value == "default":
                continue
            if name == "DEFAULT_QUEUE_WEIGHT" and value == "10":
                continue
            lines.append(f"eventmq's {name}={value} ({source}) is not honoured: {instead}")
        return lines


def read_eventmq_settings(
    path: str | None = None,
    environ: Mapping[str, str] = os.environ,
    program: Program = JOBMANAGER,
) -> EventmqSettings:
    """The settings of eventmq's file and variables, as ``program`` takes them. ``path``
    is ``-C``; it must exist, unlike eventmq's variable and default path, whose absence
    eventmq ignores. A file that cannot be parsed is a usage error naming it."""
    wanted = program.wanted()
    if path is None:
        path = environ.get(f"{ENV_PREFIX}CONFIG_FILE") or DEFAULT_CONFIG_FILE
        explicit = False
    else:
        explicit = True
    values: dict[str, tuple[str, str]] = {}
    read_path: str | None = None
    if os.path.isfile(path):
        parser = configparser.ConfigParser(interpolation=None)
        try:
            parser.read(path, encoding="utf-8")
        except (configparser.Error, OSError, UnicodeDecodeError) as error:
            raise usage.UsageError(f"eventmq config {path}: {error}") from None
        read_path = path
        for section in program.sections:  # [jobmanager] after [global]: it wins
            if parser.has_section(section):
                for name, value in parser.items(section):
                    if name.upper() in wanted:
                        values[name.upper()] = (value.strip(), f"{path} [{section}]")
    elif explicit:
        raise usage.UsageError(f"--eventmq-config {path}: no such file")
    for name in wanted:
        variable = f"{ENV_PREFIX}{name}"
        if variable in environ:
            values[name] = (environ[variable].strip(), f"environment {variable}")
    return EventmqSettings(values, read_path, program)


def value_in(args: Sequence[str], long: str, short: str) -> str | None:
    """The value of ``--long X``, ``--long=X``, ``-s X`` or ``-sX`` in a command line."""
    for index, arg in enumerate(args):
        if arg == "--":
            break
        if arg in (long, short) and index + 1 < len(args):
            return args[index + 1]
        if arg.startswith(long + "="):
            return arg.partition("=")[2]
        if arg.startswith(short) and not arg.startswith("--") and len(arg) > len(short):
            return arg[len(short) :]
    return None


def is_eventmq_config(path: str, ours: str, sections: Sequence[str]) -> bool:
    """Whether ``--config`` names eventmq's INI file (its programs' long form of ``-C``)
    rather than our TOML: not TOML, or TOML without our table ``ours``, with one of
    eventmq's ``sections``."""
    try:
        with open(path, encoding="utf-8") as handle:
            text = handle.read()
    except (OSError, UnicodeDecodeError):
        return False  # the TOML reader says why
    try:
        tables = tomllib.loads(text)
    except tomllib.TOMLDecodeError:
        parser = configparser.ConfigParser(interpolation=None)
        try:
            parser.read_string(text, source=path)
        except configparser.Error:
            return False
        found = set(parser.sections())
    else:
        if ours in tables:
            return False
        found = set(tables)
    return bool(found & set(sections))


__all__ = [
    "DEFAULT_CONFIG_FILE",
    "JOBMANAGER",
    "NOT_HONOURED",
    "OPTION_OF",
    "ROUTER",
    "ROUTER_NOT_HONOURED",
    "ROUTER_OPTION_OF",
    "EventmqSettings",
    "Program",
    "is_eventmq_config",
    "read_eventmq_settings",
    "value_in",
]
