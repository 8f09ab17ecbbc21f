"""eventmq's own settings for its job manager, read as ``emq-jobmanager`` reads them, so that
``emqp-worker -C /etc/eventmq.conf`` serves from the same configuration.

eventmq reads an INI file (``-C``, else ``$EVENTMQ_CONFIG_FILE``, else ``/etc/eventmq.conf``;
a file that does not exist is no error) first in its ``[global]`` section, then in
``[jobmanager]``; for every setting an ``EVENTMQ_<NAME>`` variable wins over the file. Names
are case-insensitive in the file (``worker_addr`` is ``WORKER_ADDR``).

:func:`read_eventmq_settings` returns the values and where each came from;
:data:`OPTION_OF` says which ``emqp-worker`` option each one sets. :data:`NOT_HONOURED`
names the settings whose behaviour the worker does not reproduce: each one that is set is
worth one line in the log. Every other eventmq setting (the router's, the scheduler's,
logging) means nothing to a worker and is ignored.
"""

from __future__ import annotations

import configparser
import os
from collections.abc import Mapping
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

#: Boolean settings worth a line only when they differ from eventmq's default (its own
#: test for true: a ``t`` in the value).
_NOTICED_WHEN: dict[str, bool] = {
    "DISABLE_HEARTBEATS": True,
    "SUPER_DEBUG": True,
    "HIDE_HEARTBEAT_LOGS": False,
}

#: eventmq's older spelling of the setup hook: a module and a function name apart.
_OLD_SETUP = ("SETUP_PATH", "SETUP_CALLABLE")


@dataclass(frozen=True, slots=True)
class EventmqSettings:
    """eventmq settings that mean something to a worker: name -> (value, source)."""

    values: dict[str, tuple[str, str]] = field(default_factory=dict)
    #: The INI file read, if one was.
    path: str | None = None

    def options(self) -> dict[str, tuple[str, str]]:
        """``emqp-worker`` option -> (value, source) for the settings it honours."""
        chosen = {
            OPTION_OF[name]: value for name, value in self.values.items() if name in OPTION_OF
        }
        if not chosen.get("setup-func", ("", ""))[0] and all(
            name in self.values for name in _OLD_SETUP
        ):
            (path, source), (function, _) = (self.values[name] for name in _OLD_SETUP)
            if path and function:  # eventmq drops a :Class part of SETUP_PATH
                chosen["setup-func"] = (f"{path.partition(':')[0]}.{function}", source)
        return chosen

    def not_honoured(self) -> list[str]:
        """One line per setting given whose behaviour the worker does not reproduce."""
        lines = []
        for name, instead in NOT_HONOURED.items():
            if name not in self.values:
                continue
            value, source = self.values[name]
            if name in _NOTICED_WHEN and ("t" in value.lower()) != _NOTICED_WHEN[name]:
                continue
            if name == "DEFAULT_ENCODING" and value.lower().replace("-", "") == "utf8":
                continue
            lines.append(f"eventmq's {name}={value} ({source}) is not honoured: {instead}")
        return lines


def _wanted() -> tuple[str, ...]:
    return (*OPTION_OF, *NOT_HONOURED, *_OLD_SETUP)


def read_eventmq_settings(
    path: str | None = None, environ: Mapping[str, str] = os.environ
) -> EventmqSettings:
    """The settings of eventmq's file and variables, as its job manager takes them. ``path``
    is ``-C``; it must exist, unlike eventmq's variable and default path, whose absence
    eventmq ignores. A file that cannot be parsed is a usage error naming it."""
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
        for section in SECTIONS:  # [jobmanager] after [global]: it wins
            if parser.has_section(section):
                for name, value in parser.items(section):
                    if name.upper() in _wanted():
                        values[name.upper()] = (value.strip(), f"{path} [{section}]")
    elif explicit:
        raise usage.UsageError(f"--eventmq-config {path}: no such file")
    for name in _wanted():
        variable = f"{ENV_PREFIX}{name}"
        if variable in environ:
            values[name] = (environ[variable].strip(), f"environment {variable}")
    return EventmqSettings(values, read_path)


__all__ = [
    "DEFAULT_CONFIG_FILE",
    "NOT_HONOURED",
    "OPTION_OF",
    "EventmqSettings",
    "read_eventmq_settings",
]
