"""``emqp-worker`` and ``twistd -n emqp-worker``: an eMQP worker you run rather than write,
in place of eventmq's ``emq-jobmanager`` (``emqp-worker -C /etc/eventmq.conf``).

It serves ``["run", {...}]`` bodies and the handlers of ``--handlers`` registries in a pool of
processes (or threads). Where each option's value comes from, strongest first: the command
line, ``EMQP_WORKER_<OPTION>`` variables, the ``[emqp-worker]`` table of the ``--config``
TOML file, then eventmq's own settings (``EVENTMQ_<NAME>`` variables over its INI file's
``[jobmanager]`` over ``[global]``; see :mod:`bus.emqp.eventmq_settings`), then the defaults.
"""

from __future__ import annotations

import argparse
import importlib
import json
import signal
import sys
from collections.abc import Mapping, Sequence
from types import FrameType
from typing import TYPE_CHECKING, Any

from twisted.logger import Logger
from twisted.python import usage

from bus.application.options import ConfigTables, ValueHint
from bus.application.sighup import on_sighup
from bus.emqp import codec
from bus.emqp.eventmq_settings import (
    SECTIONS,
    EventmqSettings,
    is_eventmq_config,
    read_eventmq_settings,
    value_in,
)
from bus.emqp.worker_process import JobHooks
from bus.extension import ServiceOptions, parse_duration
from bus.transport.curve_settings import CLIENT_CURVE_OPTIONS, client_curve_from
from bus.util.cliargs import Progress, interruptible, tcp_endpoint

if TYPE_CHECKING:
    from bus.emqp.worker import EmqpWorker
    from bus.extension import Composition, ProductService

log = Logger(namespace="bus.emqp.worker")

NAME = "emqp-worker"
#: The broker's worker port on this machine, as eventmq's WORKER_ADDR.
DEFAULT_BROKER = "tcp://127.0.0.1:47290"
DEFAULT_WEIGHT = codec.DEFAULT_WEIGHT


def queue_list(value: Any) -> tuple[tuple[int, str], ...]:
    """``10:default,5:mail`` (a bare name weighs 10), eventmq's JSON ``[[10, "default"]]``,
    or a TOML list of either form -> ``((10, "default"), (5, "mail"))``."""
    if isinstance(value, str):
        text = value.strip()
        items: list[Any] = json.loads(text) if text.startswith("[") else text.split(",")
    elif isinstance(value, list | tuple):
        items = list(value)
    else:
        raise TypeError(f"not a list of queues: {value!r}")
    queues: list[tuple[int, str]] = []
    for item in items:
        if isinstance(item, str):
            head, colon, tail = item.strip().partition(":")
            if colon and head.strip().isdigit():
                weight, name = int(head), tail.strip()
            else:  # a bare name (which may hold colons)
                weight, name = DEFAULT_WEIGHT, item.strip()
                front, colon, number = name.rpartition(":")
                if colon and front and number.isdigit():
                    raise ValueHint(f"{name!r}: the weight comes first, as in {number}:{front}")
        elif isinstance(item, list | tuple) and len(item) == 2:
            weight, name = int(item[0]), str(item[1])
        else:
            raise ValueError(f"not a queue: {item!r}")
        # What the broker would drop as a bad INFORM is refused here, where it is clear.
        if not name or len(name.encode()) > codec.MAX_QUEUE_NAME_BYTES:
            raise ValueError(f"not a queue name: {name!r}")
        if not 0 <= weight <= codec.MAX_WEIGHT:
            raise ValueError(f"queue weight {weight} out of range")
        queues.append((weight, name))
    if not 0 < len(queues) <= codec.MAX_QUEUES_PER_WORKER:
        raise ValueError(f"name 1 to {codec.MAX_QUEUES_PER_WORKER} queues")
    return tuple(queues)


queue_list.wants = 'weight:name,... (a bare name weighs 10) or [[weight, "name"], ...]'  # type: ignore[attr-defined]


def seconds(value: Any) -> float:
    """A duration option's value in seconds; ValueError names what is wrong with it."""
    try:
        return parse_duration(value)
    except usage.UsageError as error:
        raise ValueError(str(error)) from None


seconds.wants = "a duration (30s, 250ms, 10m)"  # type: ignore[attr-defined]


def load_handlers(specs: Sequence[str]) -> dict[str, Any]:
    """The union of ``pkg.mod:NAME`` registries (``pkg.mod`` alone: ``pkg.mod:HANDLERS``),
    each a dict of body name -> callable; a later registry's name wins."""
    handlers: dict[str, Any] = {}
    for spec in specs:
        module_name, _, attribute = spec.partition(":")
        attribute = attribute or "HANDLERS"
        try:
            registry = getattr(importlib.import_module(module_name), attribute)
        except Exception as error:
            raise usage.UsageError(f"--handlers {spec}: {type(error).__name__}: {error}") from None
        if not isinstance(registry, Mapping):
            raise usage.UsageError(f"--handlers {spec}: not a dict of name -> callable")
        for name, handler in registry.items():
            if not isinstance(name, str) or not callable(handler):
                raise usage.UsageError(f"--handlers {spec}: {name!r} is not a name -> callable")
            handlers[name] = handler
    return handlers


#: emq-jobmanager's long options -> ours.
_JOBMANAGER_SPELLINGS = {"--broker-addr": "--broker", "--jobs": "--slots"}


def jobmanager_args(args: Sequence[str]) -> list[str]:
    """``emq-jobmanager``'s command line in our spellings, so that a unit file changes
    only its program: ``--broker-addr``, ``--jobs``, ``--config`` of an eventmq INI file,
    and ``-Q``/``--queues`` followed by space-separated names (we take no positional
    argument, so the words after ``-Q`` can only be queues)."""
    translated: list[str] = []
    index = 0
    while index < len(args):
        arg = args[index]
        index += 1
        if arg == "--":
            translated += args[index - 1 :]
            break
        name, equals, value = arg.partition("=") if arg.startswith("--") else (arg, "", "")
        name = _JOBMANAGER_SPELLINGS.get(name, name)
        if name == "--config":
            path = value if equals else (args[index] if index < len(args) else "")
            if path and is_eventmq_config(path, NAME, SECTIONS):
                name = "--eventmq-config"
        elif name in ("-Q", "--queues") and not equals:
            words = []
            while index < len(args) and not args[index].startswith("-"):
                words.append(args[index])
                index += 1
            translated += [name, ",".join(words)] if words else [name]
            continue
        translated.append(f"{name}={value}" if equals else name)
    return translated


class Options(ServiceOptions):
    """``emqp-worker``'s options, eventmq's job manager settings beneath them."""

    service = NAME
    env_prefix = "EMQP_WORKER"
    # A TOML file shared with the product may hold the product's tables too.
    extra_tables = frozenset({NAME})
    synopsis = "[options]"
    longdesc = (
        'Serve an eMQP broker\'s jobs: INFORM the --queues, run ["run", {...}] bodies and '
        "the --handlers registries' handlers in --slots processes (or threads), REPLY, "
        "heartbeat. Reads eventmq's settings too (-C FILE, EVENTMQ_* variables), under its "
        "own options, and emq-jobmanager's command line. SIGTERM: running jobs finish, then "
        "KBYE; a second one ends them. SIGHUP: the settings are read again."
    )
    optFlags = [
        ["no-run", None, 'Refuse ["run", {...}] bodies: serve the --handlers only.'],
    ]
    optMulti = [
        [
            "handlers",
            None,
            "pkg.mod:NAME, a dict of body name -> callable: a body [name, params] runs "
            "callable(params) (pkg.mod alone: pkg.mod:HANDLERS). Module-level functions, "
            "picklable for the process pool.",
        ],
    ]
    optParameters = [
        [
            "broker",
            "B",
            DEFAULT_BROKER,
            "The broker's worker endpoint (eventmq: WORKER_ADDR; emq-jobmanager's --broker-addr).",
        ],
        [
            "queues",
            "Q",
            f"{DEFAULT_WEIGHT}:default",
            'Queues served, weight:name comma-separated (a bare name weighs 10) or JSON [[10, "default"]] '
            "(eventmq: QUEUES); emq-jobmanager's space-separated names too (-Q default mail).",
            queue_list,
        ],
        [
            "slots",
            "J",
            4,
            "Jobs run at once (eventmq: CONCURRENT_JOBS; emq-jobmanager's --jobs).",
            int,
        ],
        ["name", "n", None, "This worker's name in its log (emq-jobmanager's --name)."],
        *CLIENT_CURVE_OPTIONS,
        ["pool", None, "process", "process (a process per slot) or thread."],
        [
            "heartbeat-interval",
            None,
            "3s",
            "HEARTBEAT period (eventmq: HEARTBEAT_INTERVAL).",
            seconds,
        ],
        [
            "heartbeat-liveness",
            None,
            3,
            "Heartbeat periods of broker silence before connecting again "
            "(eventmq: HEARTBEAT_LIVENESS).",
            int,
        ],
        [
            "grace-period",
            None,
            "300s",
            "After SIGTERM, how long running jobs may finish before they are ended "
            "(0: at once; eventmq: KILL_GRACE_PERIOD).",
            seconds,
        ],
        [
            "job-timeout",
            None,
            "0",
            "How long a job may run when its request names no timeout:N; past its timeout "
            "(either) its process is ended (0: as long as it takes; eventmq: GLOBAL_TIMEOUT).",
            seconds,
        ],
        [
            "setup-func",
            None,
            None,
            "pkg.mod.function called once in each job process as it starts "
            "(eventmq: SUBPROCESS_SETUP_FUNC).",
        ],
        [
            "job-entry-func",
            None,
            None,
            "pkg.mod.function called before every job (eventmq: JOB_ENTRY_FUNC).",
        ],
        [
            "job-exit-func",
            None,
            None,
            "pkg.mod.function called after every job (eventmq: JOB_EXIT_FUNC).",
        ],
        [
            "max-jobs-per-process",
            None,
            0,
            "A job process is replaced after this many jobs (0: never; eventmq: MAX_JOB_COUNT).",
            int,
        ],
        [
            "stats-interval",
            None,
            "10s",
            "How often a line of jobs run and failed is logged, when they changed (0: never).",
            seconds,
        ],
        [
            "eventmq-config",
            "C",
            None,
            "eventmq's INI file, read in [global] then [jobmanager] (default: "
            "$EVENTMQ_CONFIG_FILE, else /etc/eventmq.conf when it exists); --config FILE "
            "too when FILE is one, as emq-jobmanager takes it.",
        ],
    ]

    def __init__(self) -> None:
        ServiceOptions.__init__(self)
        self.eventmq = EventmqSettings()
        self._args: list[str] = []

    def parse_layered(self, options: Sequence[str] | None = None) -> None:
        self._args = jobmanager_args(sys.argv[1:] if options is None else options)
        ServiceOptions.parse_layered(self, self._args)

    def apply_defaults(
        self,
        tables: ConfigTables,
        environ: Mapping[str, str],
        path: str = "",
        also_known: Any = (),
    ) -> None:
        """eventmq's settings first, as defaults; the TOML table and EMQP_WORKER_* over
        them (then the command line, parsed after this)."""
        eventmq_path = (
            value_in(self._args, "--eventmq-config", "-C")
            or environ.get(f"{self.env_prefix}_EVENTMQ_CONFIG")
            or tables.get(self.service, {}).get("eventmq-config")
            or None
        )
        self.eventmq = read_eventmq_settings(
            None if eventmq_path is None else str(eventmq_path), environ
        )
        specs = {spec.name: spec for spec in self.option_specs()}
        for name, (value, source) in self.eventmq.options().items():
            self[name] = self._coerced(specs[name], value, source)
        ServiceOptions.apply_defaults(self, tables, environ, path, also_known)

    def postOptions(self) -> None:
        try:
            self["queues"] = queue_list(self["queues"])
        except (ValueError, TypeError) as error:
            raise usage.UsageError(f"--queues: {error}") from None
        if self["pool"] not in ("process", "thread"):
            raise usage.UsageError("--pool must be process or thread")
        for name in ("slots", "heartbeat-liveness"):
            if int(self[name]) < 1:
                raise usage.UsageError(f"--{name} must be at least 1")
        if int(self["max-jobs-per-process"]) < 0:
            raise usage.UsageError("--max-jobs-per-process must be 0 or more")
        for name in ("heartbeat-interval", "grace-period", "stats-interval", "job-timeout"):
            self[name] = parse_duration(self[name])
        if self["heartbeat-interval"] <= 0:
            raise usage.UsageError("--heartbeat-interval must be above 0")
        for name in ("setup-func", "job-entry-func", "job-exit-func"):
            function = str(self[name] or "")
            if function and not (":" in function or "." in function.strip(".")):
                raise usage.UsageError(f"--{name} {function}: write pkg.mod.function")
        self["hooks"] = JobHooks(
            str(self["setup-func"] or ""),
            str(self["job-entry-func"] or ""),
            str(self["job-exit-func"] or ""),
        )
        self["handler-table"] = load_handlers(self["handlers"])
        try:  # said now, in one line, rather than once the worker starts
            self["broker"] = tcp_endpoint(str(self["broker"]))
        except argparse.ArgumentTypeError as error:
            raise usage.UsageError(f"--broker: {error}") from None
        client_curve_from(self)


def build(options: usage.Options | Mapping[str, Any], composition: Composition) -> EmqpWorker:
    """The worker; the eventmq settings it read are logged, and once the reactor runs a
    second SIGTERM or SIGINT ends the running jobs."""
    from bus.emqp.worker import EmqpWorker

    settings: EventmqSettings = getattr(options, "eventmq", EventmqSettings())
    if settings.path is not None:
        log.info("eventmq settings read from {path}", path=settings.path)
    for line in settings.not_honoured():
        log.warn("{line}", line=line)
    if options["pool"] == "thread" and float(options["job-timeout"]) > 0:
        log.warn("--pool thread: a job cannot be ended at its timeout (a thread cannot be killed)")
    handlers = dict(options["handler-table"])
    if options["no-run"]:
        handlers.pop("run", None)
    worker = EmqpWorker(
        options["broker"],
        queues=options["queues"],
        slots=int(options["slots"]),
        handlers=handlers,
        pool=options["pool"],
        allow_run=not options["no-run"],
        heartbeat_interval=float(options["heartbeat-interval"]),
        heartbeat_liveness=int(options["heartbeat-liveness"]),
        grace_period=float(options["grace-period"]),
        hooks=options["hooks"],
        max_jobs_per_process=int(options["max-jobs-per-process"]),
        stats_interval=float(options["stats-interval"]),
        job_timeout=float(options["job-timeout"]),
        worker_name=str(options.get("name") or ""),
        curve=client_curve_from(options),
    )
    # Once running: the reactor has installed its handlers by then, and ours wrap them.
    worker.reactor.callWhenRunning(end_jobs_at_second_signal, worker)
    if isinstance(options, Options):  # a command line to read again (not a tac's mapping)
        on_sighup(worker.reactor, lambda: reload_settings(worker, options))
    return worker


#: Options a SIGHUP applies to the running worker; any other that changed waits for the
#: next start (the pool, the hooks, the handlers, CURVE keys...).
_RELOADED = frozenset(
    {
        "broker",
        "queues",
        "slots",
        "heartbeat-interval",
        "heartbeat-liveness",
        "grace-period",
        "stats-interval",
        "job-timeout",
        "max-jobs-per-process",
    }
)


def _shown(name: str, value: Any) -> str:
    if name == "queues":
        from bus.emqp.worker import format_queues

        return format_queues(value)
    return str(value)


def reload_settings(worker: EmqpWorker, options: Options) -> None:
    """At SIGHUP (:mod:`bus.application.sighup`), as eventmq's job manager does: the same command line
    over the files and variables as they are now. Apply what changed and can change while running, log every change, and go on with
    the settings as they were when they cannot be read: a SIGHUP never ends the worker."""
    if worker.draining or not worker.running:
        log.info("SIGHUP while stopping: ignored")
        return
    fresh = Options()
    try:
        fresh.parse_layered(options._args)
    except Exception as error:  # a usage error, or a --handlers module that fails
        log.error("SIGHUP: settings not read again, kept as they were: {error}", error=error)
        return
    changed = {
        spec.name: (options[spec.name], fresh[spec.name])
        for spec in Options.option_specs()
        if options[spec.name] != fresh[spec.name]
    }
    if not changed:
        log.info("SIGHUP: settings read again, nothing changed")
        return
    for line in fresh.eventmq.not_honoured():
        if line not in options.eventmq.not_honoured():
            log.warn("{line}", line=line)
    for name, (old, new) in sorted(changed.items()):
        log.info(
            "SIGHUP: {name} {old} -> {new}{later}",
            name=name,
            old=_shown(name, old),
            new=_shown(name, new),
            later="" if name in _RELOADED else " (takes effect when emqp-worker starts again)",
        )
        if name in _RELOADED:
            options[name] = new
    options.eventmq = fresh.eventmq
    worker.heartbeat_liveness = int(options["heartbeat-liveness"])
    worker.grace_period = float(options["grace-period"])
    worker.job_timeout = float(options["job-timeout"])
    worker.max_jobs_per_process = int(options["max-jobs-per-process"])
    if {"heartbeat-interval", "stats-interval"} & set(changed):
        worker.set_timers(float(options["heartbeat-interval"]), float(options["stats-interval"]))
    if {"broker", "queues", "slots"} & set(changed):
        worker.rejoin(options["broker"], options["queues"], int(options["slots"]))


def end_jobs_at_second_signal(worker: EmqpWorker) -> None:
    """The first SIGTERM or SIGINT goes to the reactor's handler (a gentle stop: running
    jobs finish); one more while the worker drains ends the running jobs at once."""

    def wrap(number: int, previous: Any) -> None:
        def handle(signum: int, frame: FrameType | None) -> None:
            if worker.draining:
                worker.reactor.callFromThread(second_signal, signum)
            else:
                previous(signum, frame)

        signal.signal(number, handle)

    def second_signal(number: int) -> None:
        log.warn("{signal} again: ending the running jobs", signal=signal.Signals(number).name)
        worker.force_stop()

    for number in (signal.SIGTERM, signal.SIGINT):
        previous = signal.getsignal(number)
        if callable(previous):
            wrap(number, previous)


def makeService(options: usage.Options | Mapping[str, Any]) -> ProductService:
    """The worker alone (``emqp-worker``, ``twistd -n emqp-worker``)."""
    from bus.extension import standalone

    return standalone(NAME, build, options)


@interruptible(NAME)
def main(argv: Sequence[str] | None = None) -> int:
    """``emqp-worker [options]``: the worker in the foreground, its log on stderr; exits 0
    once stopped by SIGTERM, 130 after Ctrl-C (its last line says what it did), 1 when it
    cannot start, 2 on a usage error."""
    options = Options()
    options.synopsis = f"Usage: {NAME} [options]"
    try:
        options.parseOptions(list(sys.argv[1:] if argv is None else argv))
    except usage.UsageError as error:
        said = " ".join(str(error).split())
        print(f"{NAME}: {said} (see {NAME} --help)", file=sys.stderr)
        return 2
    from twisted.internet import reactor as global_reactor
    from twisted.logger import ILogObserver, globalLogBeginner, textFileLogObserver

    observer = ILogObserver(textFileLogObserver(sys.stderr))
    globalLogBeginner.beginLoggingTo([observer], redirectStandardIO=False)
    reactor: Any = global_reactor
    service = makeService(options)
    worker: Any = next(entry.service for entry in service.composed if entry.name == NAME)
    progress = Progress(
        NAME,
        f"serving the broker at {options['broker']}",
        lambda: f"{worker.completed} job(s) run, {worker.failed} failed; it has stopped",
    )
    # The first Ctrl-C stops the reactor: the worker lets its running jobs finish (a second
    # one ends them, see end_jobs_at_second_signal).
    progress.catch(reactor)
    reactor.callWhenRunning(service.startService)
    reactor.addSystemEventTrigger("before", "shutdown", service.stopService)
    reactor.run()
    if progress.interrupted:
        progress.end()
    return 0


__all__ = ["Options", "build", "load_handlers", "main", "makeService", "queue_list"]
