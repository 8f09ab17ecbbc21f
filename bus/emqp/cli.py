"""``emqp-cli``: submit a request to an eMQP broker, show its status, manage its schedules,
move a stopped broker's store into JetStream.

    emqp-cli submit default '["run", {"path": "os.path", "callable": "join", "args": ["a", "b"]}]'
    emqp-cli submit emails '{"to": "x"}' --no-reply --guarantee --retries 3
    emqp-cli status
    emqp-cli schedule maint '["run", {"path": "app.jobs:cleanup"}]' --every 1h --guarantee
    emqp-cli schedule reports '["report", {}]' --cron '30 6 * * 1-5'
    emqp-cli schedules
    emqp-cli schedules import --redis redis://127.0.0.1:6379/0
    emqp-cli unschedule 3f2a...
    emqp-cli import-store --data-dir emqp-data --nats nats://h1:4222,nats://h2:4222

``submit`` prints the worker's value as JSON (or, with ``--no-reply``, the request's id once a
worker has it) and exits 0. Anything else ends with one sentence on stderr and exit status 1:
the broker's reason when it failed the request, or, when ``--wait`` ran out, what the broker's
admin port says it waits for (no worker serves the queue, its workers are all busy, a worker
has the request and has not replied, or nothing answered at all). Ctrl-C ends it with one
sentence saying what was and was not done, and exit status 130.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import socket
import sys
from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from twisted.internet import defer
from twisted.python.failure import Failure

from bus.transport.curve_settings import add_client_curve_arguments
from bus.transport.probe import Listener, probe_port
from bus.util.cliargs import (
    INTERRUPTED,
    CliParser,
    Progress,
    add_version,
    interruptible,
    parse,
    seconds_text,
    whole_number,
)

#: The ports when neither an option nor ``EMQP_BROKER``/``EMQP_ADMIN`` names them (the
#: environment is read when the parser is built, not when this module loads).
BROKER = "tcp://127.0.0.1:47291"
ADMIN = "tcp://127.0.0.1:47293"
#: An interactive default: long enough for most jobs, short enough that a request nobody
#: serves ends with an explanation rather than a silent terminal.
DEFAULT_SUBMIT_WAIT = 30.0
DEFAULT_STATUS_WAIT = 5.0
#: How long the admin port and the probe of a silent port get to explain a wait that ran out.
EXPLAIN_WAIT = 2.0
#: What ``--wait 0`` (never give up) hands to APIs that want a number of seconds.
FOREVER = 365 * 86_400.0


class CliError(Exception):
    """Ends the command: its message is the one line on stderr, exit status 1."""


def _plural(count: int, noun: str) -> str:
    return f"{count} {noun}" if count == 1 else f"{count} {noun}s"


# -- input, checked before anything is sent --------------------------------------------------


@dataclass(frozen=True, slots=True)
class Endpoint:
    """A ZeroMQ endpoint to connect to; ``host`` and ``port`` for tcp:// ones."""

    text: str
    url: str
    host: str | None = None
    port: int | None = None


def endpoint_of(text: str, what: str) -> Endpoint:
    """``HOST:PORT`` or a ZeroMQ endpoint. libzmq takes any tcp:// text at connect and then
    retries in silence (an unknown host, no port), so those are refused here."""
    url = text.strip() if "://" in text else f"tcp://{text.strip()}"
    scheme, _, address = url.partition("://")
    if scheme in ("ipc", "inproc") and address:
        return Endpoint(text, url)  # libzmq judges their paths and names at connect
    host, colon, port = address.rpartition(":")
    host = host.rpartition(";")[2]  # after a source address, if one was given
    if scheme != "tcp" or not colon or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise CliError(f"the {what} endpoint {text!r} is not valid: write tcp://HOST:PORT")
    name = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    try:
        socket.getaddrinfo(name, int(port), type=socket.SOCK_STREAM)
    except (OSError, UnicodeError) as problem:
        reason = getattr(problem, "strerror", None) or str(problem)
        raise CliError(
            f"the {what} endpoint {text!r} is not valid: host {name!r} cannot be resolved"
            f" ({reason})"
        ) from None
    return Endpoint(text, url, name, int(port))


def _body_of(text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError as problem:
        raise CliError(f"the request body is not valid JSON ({problem})") from None


def _check_submit(args: argparse.Namespace) -> None:
    from bus.emqp import codec

    try:
        codec.queue_name(args.queue.encode("utf-8", "surrogateescape"))
    except codec.EmqpError as problem:
        raise CliError(f"the queue name {args.queue!r} is not valid ({problem})") from None
    if not 0 <= args.retries <= codec.MAX_RETRIES:
        raise CliError(f"--retries must be between 0 and {codec.MAX_RETRIES}")
    if not 0 <= args.timeout <= codec.MAX_TIMEOUT:
        raise CliError(f"--timeout must be between 0 and {codec.MAX_TIMEOUT} seconds")
    args.body = _body_of(args.body)
    args.broker = endpoint_of(args.broker, "broker")
    args.admin = endpoint_of(args.admin, "admin")
    if args.broker.url == args.admin.url:
        raise CliError(
            f"--broker and --admin both name {args.broker.url}: the broker's client port"
            " and its admin port are two ports"
        )


def _check_status(args: argparse.Namespace) -> None:
    args.admin = endpoint_of(args.admin, "admin")


def _connected(make: Callable[[], Any], endpoint: Endpoint, what: str) -> Any:
    import zmq

    try:
        return make()
    except zmq.ZMQError as problem:
        reason = zmq.strerror(problem.errno or 0)
        raise CliError(f"the {what} endpoint {endpoint.text!r} is not valid ({reason})") from None


# -- one run on the reactor -------------------------------------------------------------------


class Run:
    """One command on the reactor: its exit status, and an interruption (Ctrl-C, SIGTERM)
    turned into the end of whatever it waits for, so that it still says why it stopped."""

    def __init__(self, reactor: Any, args: argparse.Namespace) -> None:
        self.reactor = reactor
        self.args = args
        #: CURVE to the broker (``--server-key``, ``--cert``), or None.
        self.curve = args.curve
        self.started = reactor.seconds()
        self.code = 1
        self._reported = False
        self._on_interrupt: list[Callable[[], None]] = []
        self._stopping = False

    def elapsed(self) -> str:
        """Time since the command started, as the messages write it."""
        return seconds_text(self.reactor.seconds() - self.started)

    def say(self, sentence: str) -> None:
        """Write the command's one line on stderr; later ones are not written."""
        if not self._reported:
            self._reported = True
            sys.stderr.write(f"emqp-cli {self.args.command}: {sentence}\n")

    def start(self) -> None:
        """Run the command; the reactor stops when it ends, with :attr:`code` set."""
        self.reactor.addSystemEventTrigger("before", "shutdown", self._shutting_down)
        self.started = self.reactor.seconds()
        finished: defer.Deferred[None] = defer.maybeDeferred(self.args.run, self)
        finished.addCallbacks(self._succeeded, self._failed)
        finished.addBoth(self._stop)

    def when_interrupted(self, listener: Callable[[], None]) -> None:
        """Call ``listener`` if the command is interrupted before it ends."""
        self._on_interrupt.append(listener)

    def _succeeded(self, _: object) -> None:
        self.code = 0
        self._reported = True

    def _failed(self, failure: Failure) -> None:
        if failure.check(CliError):
            self.say(str(failure.value))
        else:  # a defect of this tool: still one line, never a traceback
            value = failure.value
            self.say(f"unexpected {type(value).__name__} ({value}): please report it")

    def _stop(self, _: object) -> None:
        if not self._stopping:
            self._stopping = True
            self.reactor.stop()

    def _shutting_down(self) -> None:
        self._stopping = True
        if self._reported:
            return
        listeners, self._on_interrupt = self._on_interrupt, []
        for listener in listeners:
            listener()  # what was waited for ends now, and the command says so
        self.say(f"interrupted after {self.elapsed()}")


@dataclass(frozen=True, slots=True)
class Ended:
    """How a wait of :func:`wait_for` ended, and with what."""

    how: Literal["answered", "out-of-time", "interrupted"]
    #: The awaited value, or its Failure, when ``how`` is ``answered``.
    result: Any = None


def wait_for(run: Run, awaited: defer.Deferred[Any], seconds: float) -> defer.Deferred[Ended]:
    """A Deferred of its own that ends once: with ``awaited``'s result, after ``seconds``
    (0: never), or at an interruption; it never fails. A command yields on this one, not on
    ``awaited``: cleaning up afterwards (a client's close() fails what it still has pending)
    then cannot fire the Deferred its generator is suspended on and re-enter it."""
    ended: defer.Deferred[Ended] = defer.Deferred()
    done = False

    def end(how: Literal["answered", "out-of-time", "interrupted"], result: Any = None) -> None:
        nonlocal done
        if done:
            return
        done = True
        if timer is not None and timer.active():
            timer.cancel()
        if how != "answered":
            awaited.cancel()  # lets its owner release what it holds (sockets, timers)
        ended.callback(Ended(how, result))

    def answered(result: Any) -> None:
        end("answered", result)  # a Failure is handled: it is the caller's to judge

    timer = run.reactor.callLater(seconds, end, "out-of-time") if seconds > 0 else None
    awaited.addBoth(answered)
    run.when_interrupted(lambda: end("interrupted"))
    return ended


# -- what listens at a port that did not answer -----------------------------------------------


def probe(reactor: Any, endpoint: Endpoint, seconds: float) -> defer.Deferred[Listener]:
    """What listens at a tcp:// endpoint, judged by a plain TCP connection."""
    if endpoint.host is None or endpoint.port is None:
        return defer.succeed("unknown")
    return probe_port(reactor, endpoint.host, endpoint.port, seconds)


@defer.inlineCallbacks
def _refusal(
    run: Run, endpoint: Endpoint, listener: Listener | None, role: str
) -> Generator[defer.Deferred[Any], Any, str | None]:
    """The sentence for a CURVE port that refuses this command's key (None: it takes it,
    or this is not a CURVE port spoken to with a key)."""
    from bus.transport.probe import probe_key, refused_key

    if listener != "curve" or run.curve is None:
        return None
    verdict = yield probe_key(run.reactor, endpoint.url, run.curve, EXPLAIN_WAIT)
    return refused_key(endpoint.url, run.curve, role) if verdict == "refused" else None


def _port_said(
    listener: Listener, endpoint: Endpoint, role: str, silence: str, curve: Any = None
) -> str:
    """A clause about a port that gave no eMQP answer; ``silence`` says what it did not do;
    ``curve``: whether this command spoke CURVE (``--server-key``)."""
    url = endpoint.url
    if listener == "curve":
        if curve is None:
            return f"{url} speaks CURVE and {silence}: give --server-key (and --cert)"
        return (
            f"{url} speaks CURVE and {silence} (a key it refuses, not on its allow-list or "
            f"without the {role} role, gets no answer at all)"
        )
    return {
        "nothing": f"nothing listens at {url}",
        "unreachable": f"{url} cannot be reached",
        "zeromq": f"{url} speaks ZeroMQ but {silence} (is it the broker's {role} port?)",
        "other": f"{url} is not an eMQP broker's {role} port (it does not speak ZeroMQ)",
        "silent": f"{url} accepts connections but is not an eMQP broker's {role} port",
        "unknown": f"{url} {silence}",
    }[listener]


def _print(answer: str) -> None:
    try:
        sys.stdout.write(answer + "\n")
        sys.stdout.flush()
    except BrokenPipeError:
        # Python would complain again when it flushes stdout at exit.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        raise CliError("the output was closed before the answer was written") from None


def _quietly(deferred: defer.Deferred[Any]) -> defer.Deferred[Any]:
    """The value, or None for a failure (an explanation is best effort)."""
    return deferred.addErrback(lambda _: None)


# -- submit -------------------------------------------------------------------------------------


_REFUSALS = {
    "queue-full": "the broker refused the request: the buffer of queue {queue!r} is full",
    "too-many-queues": "the broker refused the request: it has too many queues to open {queue!r}",
    "duplicate-msgid": "the broker refused the request: its id is already in progress",
    "forbidden-queue": "the broker refused the request: this client's key (--cert) may not "
    "use queue {queue!r}",
    "timeout": "no reply came within the request's --timeout of {timeout}",
    "worker-lost": "the request's worker died or went silent before it replied",
    "worker-left": "the request's worker left before it replied",
    "handler-failed": "the worker's handler failed: {message}",
}


def failure_sentence(failed: Any, args: argparse.Namespace) -> str:
    """A :class:`bus.emqp.client.JobFailed`, told as a sentence."""
    message = " ".join(str(failed.message).split())
    template = _REFUSALS.get(failed.reason, "the request failed: {message}")
    sentence = template.format(
        queue=args.queue, timeout=seconds_text(args.timeout), message=message or failed.reason
    )
    retried = failed.reason in ("timeout", "worker-lost", "worker-left")
    if retried and (args.retries > 0 or args.guarantee):
        sentence += ", and its retries are spent"
    return f"{sentence} ({failed.reason})"


@defer.inlineCallbacks
def submit(run: Run) -> Generator[defer.Deferred[Any], Any, None]:
    """``emqp-cli submit``: send a REQUEST and print the worker's value (or, with ``--no-reply``,
    the request's id once a worker has it)."""
    from bus.emqp import codec
    from bus.emqp.client import EmqpClient, JobFailed

    args = run.args
    client = _connected(
        lambda: EmqpClient(args.broker.url, run.reactor, curve=run.curve), args.broker, "broker"
    )
    msgid = codec.new_msgid()
    submitted = client.submit(
        args.queue,
        args.body,
        reply=not args.no_reply,
        guarantee=args.guarantee,
        retries=args.retries,
        timeout=args.timeout,
        msgid=msgid,
    )
    waited = wait_for(run, submitted, args.wait)
    dispatched = told_to_leave = False

    def close(ended: Ended) -> Ended:
        nonlocal dispatched, told_to_leave
        dispatched, told_to_leave = client.dispatched > 0, client.kbyes > 0
        client.close()
        return ended

    ended = yield waited.addCallback(close)
    if ended.how == "answered":
        result = ended.result
        if isinstance(result, Failure):
            if result.check(JobFailed):
                raise CliError(failure_sentence(result.value, args))
            result.raiseException()
        _print(json.dumps(result))
        return
    if ended.how == "interrupted":
        if dispatched:
            raise CliError(
                f"interrupted after {run.elapsed()}: request {msgid.decode()} went to a worker,"
                " which has not replied yet"
            )
        raise CliError(
            f"interrupted after {run.elapsed()}, before the broker at {args.broker.url}"
            " dispatched the request"
        )
    if told_to_leave and not dispatched:
        raise CliError(
            f"{args.broker.url} answered KBYE: it is an eMQP broker's worker port, not its"
            " client port"
        )
    explained = yield wait_for(run, _why_no_answer(run, msgid, dispatched), 0)
    if explained.how == "interrupted":
        raise CliError(f"interrupted after {run.elapsed()}, while asking why no answer came")
    raise CliError(f"{explained.result}; gave up after {seconds_text(args.wait)}")


@defer.inlineCallbacks
def _why_no_answer(run: Run, msgid: bytes, dispatched: bool) -> Generator[Any, Any, str]:
    """Why the wait ran out, from the broker's admin port and a look at the client port."""
    from bus.emqp.client import query_status

    args = run.args
    asked = _quietly(
        defer.maybeDeferred(
            query_status, args.admin.url, run.reactor, timeout=EXPLAIN_WAIT, curve=run.curve
        )
    )
    looked = _quietly(probe(run.reactor, args.broker, EXPLAIN_WAIT))
    status, listener = yield defer.gatherResults([asked, looked])
    status = status if isinstance(status, dict) else None
    if dispatched:
        worker = next(
            (
                job.get("worker")
                for job in (status or {}).get("in_flight", [])
                if isinstance(job, dict) and job.get("msgid") == msgid.decode()
            ),
            None,
        )
        by = f" ({worker})" if worker else ""
        return f"request {msgid.decode()} went to a worker{by}, which has not replied"
    queue = (status or {}).get("queues", {}).get(args.queue)
    if (
        listener in ("zeromq", "curve", "unknown")
        and isinstance(queue, dict)
        and queue.get("depth")
    ):
        return _queue_said(status or {}, args.queue, queue)
    refused = yield _quietly(_refusal(run, args.broker, listener, "client"))
    client_said = refused or _port_said(
        listener or "unknown", args.broker, "client", "did not acknowledge the request", run.curve
    )
    if status is None:
        admin_said = f"the admin port {args.admin.url} did not answer STATUS either"
        if run.curve is not None:
            admin_said += " (over CURVE, to a key without the admin role it never does)"
    elif queue is None or not queue.get("depth"):
        admin_said = (
            f"the broker at {args.admin.url} has no request waiting in queue {args.queue!r}"
        )
    else:
        admin_said = (
            f"the broker at {args.admin.url} says: {_queue_said(status, args.queue, queue)}"
        )
    return f"{client_said}, and {admin_said}"


def _queue_said(status: dict[str, Any], name: str, queue: dict[str, Any]) -> str:
    workers = int(queue.get("workers", 0))
    waiting = int(queue.get("depth", 0))
    if workers == 0:
        return f"no worker serves queue {name!r} (the request waits in its buffer)"
    running = sum(
        1
        for job in status.get("in_flight", [])
        if isinstance(job, dict) and job.get("queue") == name
    )
    busy = f"{_plural(running, 'request')} in flight, {waiting} waiting, this one included"
    if int(queue.get("free_slots", 0)) == 0:
        if workers == 1:
            return f"the one worker of queue {name!r} is busy ({busy})"
        return f"all {workers} workers of queue {name!r} are busy ({busy})"
    served = f"queue {name!r} has {_plural(workers, 'worker')}"
    return f"{served} but has not dispatched the request ({busy})"


# -- status -------------------------------------------------------------------------------------


@defer.inlineCallbacks
def _ask_admin(
    run: Run, ask: Callable[[float], defer.Deferred[Any]], what: str
) -> Generator[defer.Deferred[Any], Any, Any]:
    """One request to the admin port: its answer, or a sentence (CliError) saying why none
    came. ``ask(timeout)`` sends it; ``what`` names it (``STATUS``, ``SCHEDULE``...)."""
    args = run.args
    timeout = args.wait if args.wait > 0 else FOREVER
    asked = _connected(lambda: ask(timeout), args.admin, "admin")
    ended = yield wait_for(run, asked, 0)  # the request keeps the time itself
    if ended.how == "interrupted":
        raise CliError(
            f"interrupted after {run.elapsed()}, before {args.admin.url} answered {what}"
        )
    result = ended.result
    if not isinstance(result, Failure):
        return result
    from bus.emqp.client import JobFailed

    failed = result.value
    if isinstance(failed, JobFailed):
        message = " ".join(str(failed.message).split()) or failed.reason
        raise CliError(f"the broker refused the {what}: {message} ({failed.reason})")
    if not result.check(TimeoutError):
        result.raiseException()
    looked = yield wait_for(run, probe(run.reactor, args.admin, EXPLAIN_WAIT), 0)
    if looked.how == "interrupted":
        raise CliError(
            f"interrupted after {run.elapsed()}: {args.admin.url} did not answer {what} within"
            f" {seconds_text(args.wait)}"
        )
    listener: Listener = looked.result
    refused = yield wait_for(run, _refusal(run, args.admin, listener, "admin"), 0)
    if refused.how == "answered" and isinstance(refused.result, str):
        said = refused.result
    else:
        said = _port_said(listener, args.admin, "admin", f"did not answer {what}", run.curve)
    raise CliError(f"{said}; gave up after {seconds_text(args.wait)}")


@defer.inlineCallbacks
def status(run: Run) -> Generator[defer.Deferred[Any], Any, None]:
    """``emqp-cli status``: the broker's STATUS, as JSON."""
    from bus.emqp.client import query_status

    url = run.args.admin.url
    answer = yield _ask_admin(
        run, lambda t: query_status(url, run.reactor, timeout=t, curve=run.curve), "STATUS"
    )
    _print(json.dumps(answer, indent=1, sort_keys=True))


@defer.inlineCallbacks
def schedule(run: Run) -> Generator[defer.Deferred[Any], Any, None]:
    """``emqp-cli schedule``: add (or replace) a schedule and print the broker's answer."""
    from bus.emqp.client import add_schedule

    args = run.args
    url = args.admin.url

    def ask(timeout: float) -> defer.Deferred[Any]:
        return add_schedule(
            url, args.queue, args.body, interval=args.every, cron=args.cron,
            guarantee=args.guarantee, haste=not args.no_haste, runs=args.runs,
            reactor=run.reactor, timeout=timeout, curve=run.curve,
        )  # fmt: skip

    answer = yield _ask_admin(run, ask, "SCHEDULE")
    _print(json.dumps(answer, sort_keys=True))


@defer.inlineCallbacks
def unschedule(run: Run) -> Generator[defer.Deferred[Any], Any, None]:
    """``emqp-cli unschedule``: remove a schedule by its id; an error when the broker keeps none."""
    from bus.emqp.client import remove_schedule

    args = run.args
    url = args.admin.url
    answer = yield _ask_admin(
        run,
        lambda t: remove_schedule(url, args.id, run.reactor, timeout=t, curve=run.curve),
        "UNSCHEDULE",
    )
    if not answer.get("removed"):
        raise CliError(f"the broker keeps no schedule {args.id!r}")
    _print(json.dumps(answer, sort_keys=True))


@defer.inlineCallbacks
def schedules(run: Run) -> Generator[defer.Deferred[Any], Any, None]:
    """``emqp-cli schedules``: every schedule the broker keeps, as JSON lines."""
    from bus.emqp.client import list_schedules

    url = run.args.admin.url
    answer = yield _ask_admin(
        run, lambda t: list_schedules(url, run.reactor, timeout=t, curve=run.curve), "SCHEDULES"
    )
    for entry in answer:
        _print(json.dumps(entry, sort_keys=True))


# -- schedules import: eventmq's Redis into this broker ------------------------------------------


def _same_schedule(there: dict[str, Any], spec: Any) -> bool:
    """Whether the broker's listed schedule is ``spec`` (a ScheduleSpec), ``nohaste`` aside
    (it only says when the first run was)."""

    def headers(text: str) -> set[str]:
        return {part.strip() for part in text.split(",") if part.strip()} - {"nohaste"}

    return (
        there.get("queue") == spec.queue.decode("utf-8", "replace")
        and there.get("interval") == spec.interval
        and there.get("cron") == spec.cron
        and headers(str(there.get("headers", "")))
        == headers(spec.headers.decode("utf-8", "replace"))
    )


@dataclass
class _Outcomes:
    imported: int = 0
    already_there: int = 0
    refused: list[str] | None = None

    def summary(self, listed: int, unique: int, source: str) -> str:
        refused = self.refused or []
        said = (
            f"{self.imported} imported, {self.already_there} already there,"
            f" {len(refused)} refused, of {_plural(unique, 'schedule')} in {source}"
        )
        if listed > unique:
            said += f" (interval_jobs names {listed - unique} of them more than once)"
        if refused:
            said += ": " + "; ".join(refused)
        return said


@defer.inlineCallbacks
def import_schedules(run: Run) -> Generator[defer.Deferred[Any], Any, None]:
    """Each schedule eventmq's scheduler keeps in Redis, sent to the broker as eventmq's
    SCHEDULE; one JSON line each on stdout, a summary on stderr."""
    from bus.emqp.client import JobFailed, list_schedules, send_schedule
    from bus.emqp.schedules import ScheduleError, ScheduleSpec

    args = run.args
    url = args.admin.url
    stored, listed = args.stored
    existing = yield _ask_admin(
        run, lambda t: list_schedules(url, run.reactor, timeout=t, curve=run.curve), "SCHEDULES"
    )
    on_the_broker = {entry["id"]: entry for entry in existing if isinstance(entry, dict)}
    outcomes = _Outcomes(refused=[])
    assert outcomes.refused is not None
    progress = sys.stderr.isatty()

    def told(entry: Any, outcome: str, why: str | None = None, **more: Any) -> None:
        line = {"key": entry.key, "outcome": outcome, **more}
        if why is not None:
            line["why"] = why
        _print(json.dumps(line, sort_keys=True))
        if outcome == "refused":
            assert outcomes.refused is not None
            outcomes.refused.append(f"{entry.key[:12]}: {why}")
        if progress:
            done = outcomes.imported + outcomes.already_there + len(outcomes.refused or [])
            sys.stderr.write(f"\rimporting: {done}/{len(stored)}")
            sys.stderr.flush()

    def refusal_of(failure: Failure) -> Any:
        failure.trap(JobFailed)
        failed: Any = failure.value
        return {"refused": f"{failed.message or failed.reason} ({failed.reason})"}

    for entry in stored:
        if entry.problem is not None:
            told(entry, "refused", entry.problem)
            continue
        sent = entry if args.haste else entry.without_haste()
        try:
            spec = ScheduleSpec.from_frames(sent.fields)
        except ScheduleError as error:
            told(entry, "refused", str(error))
            continue
        shown: dict[str, Any] = {
            "queue": spec.queue.decode("utf-8", "replace"),
            "interval": spec.interval,
            "cron": spec.cron,
            "schedule": spec.id,
        }
        there = on_the_broker.get(spec.id)
        if there is not None and not args.replace:
            outcomes.already_there += 1
            if _same_schedule(there, spec):
                told(entry, "already-there", **shown)
            else:
                told(
                    entry, "already-there", "the broker has a different schedule of this job:"
                    " kept (--replace sends this one)", **shown,
                )  # fmt: skip
            continue
        fields = sent.fields

        def ask(timeout: float, fields: list[bytes] = fields) -> defer.Deferred[Any]:
            return send_schedule(
                url, fields, run.reactor, timeout=timeout, curve=run.curve
            ).addErrback(refusal_of)

        try:
            answer = yield _ask_admin(run, ask, "SCHEDULE")
        except CliError as error:
            if progress:
                sys.stderr.write("\n")
            summary = outcomes.summary(listed, len(stored), args.source)
            raise CliError(f"{error}; before that, {summary}") from None
        if "refused" in answer:
            told(entry, "refused", answer["refused"], **shown)
        else:
            outcomes.imported += 1
            told(entry, "imported", **shown)
    if progress and stored:
        sys.stderr.write("\n")
    summary = outcomes.summary(listed, len(stored), args.source)
    if outcomes.refused:
        raise CliError(summary)
    sys.stderr.write(f"emqp-cli schedules: {summary}\n")


def _check_import(args: argparse.Namespace) -> None:
    from bus.emqp.eventmq_redis import RedisReadError, read_dump, read_redis

    _check_status(args)
    if (args.redis is None) == (args.rdb is None):
        raise CliError(
            "name one of --redis redis://HOST:PORT/DB (eventmq's running Redis) and --rdb FILE"
            " (a dump of it)"
        )
    try:
        if args.redis is not None:
            args.source = args.redis
            args.stored = read_redis(args.redis)
        else:
            args.source = f"{args.rdb} (database {args.db})"
            args.stored = read_dump(Path(args.rdb), args.db, args.redis_server)
    except RedisReadError as error:
        raise CliError(str(error)) from None


def _check_schedules(args: argparse.Namespace) -> None:
    if args.action == "import":
        args.run = import_schedules
        _check_import(args)
        return
    given = [f"--{name.replace('_', '-')}" for name in _IMPORT_ONLY if getattr(args, name)]
    if given:
        raise CliError(f"{', '.join(given)}: only with `schedules import`")
    _check_status(args)


_IMPORT_ONLY = ("redis", "rdb", "redis_server", "replace", "haste")


def _check_schedule(args: argparse.Namespace) -> None:
    from bus.emqp import codec
    from bus.extension import parse_duration

    try:
        codec.queue_name(args.queue.encode("utf-8", "surrogateescape"))
    except codec.EmqpError as problem:
        raise CliError(f"the queue name {args.queue!r} is not valid ({problem})") from None
    if (args.every is None) == (args.cron is None):
        raise CliError("name one of --every (an interval such as 30s or 1h) and --cron")
    if args.every is not None:
        try:
            args.every = parse_duration(args.every)
        except Exception as problem:
            raise CliError(f"--every: {problem}") from None
        if args.every <= 0:
            raise CliError("--every must be more than 0 (30s, 5m, 1h)")
    if args.runs is not None and args.runs < 1:
        raise CliError("--runs must be 1 or more")
    args.body = _body_of(args.body)
    _check_status(args)


def import_store(args: argparse.Namespace) -> int:
    """``emqp-cli import-store``: a stopped broker's stored requests and schedules moved
    into JetStream (:mod:`bus.emqp.migrate`). Blocking: no reactor. Its exit status."""
    from twisted.python import usage

    from bus.emqp.config import JetStreamSettings
    from bus.emqp.migrate import ImportRefused, StoreMove
    from bus.emqp.store import StoreExport, kept_broker_id
    from bus.errors import StartupError, StorageError
    from bus.nats import jsapi
    from bus.nats.codec import ProtocolError
    from bus.nats.handshake import ConnectError
    from bus.nats.options import nats_settings_from_arguments
    from bus.nats.publish import PublishError

    prog = "emqp-cli import-store"
    try:
        settings = nats_settings_from_arguments(args, JetStreamSettings)
    except (usage.UsageError, StartupError, ValueError) as error:
        raise CliError(str(error)) from None
    try:
        store = StoreExport(args.data_dir)
    except StorageError as error:
        raise CliError(str(error)) from None
    try:
        try:
            broker_id = (
                args.nats_broker_id.encode()
                if args.nats_broker_id
                else kept_broker_id(args.data_dir)
            )
        except OSError as error:
            raise CliError(f"cannot keep the broker's id in {args.data_dir}: {error}") from None
        sys.stderr.write(
            f"{prog}: {store.path} into stream {settings.stream} and bucket "
            f"KV_{settings.stream}_SCHEDULES on {', '.join(settings.servers)}, for broker "
            f"{broker_id.decode('ascii', 'replace')}\n"
        )
        progress = Progress(prog)
        progress.now(
            f"moving {store.path} into stream {settings.stream}",
            "the stream stays marked unfinished (brokers refuse it): the same command with "
            "--resume goes on; the store keeps everything until the end",
        )
        # Ctrl-C interrupts it where it is: each step is one the stream or the store takes
        # whole or not at all, and --resume finds which were taken.

        def say(line: str) -> None:
            sys.stderr.write(f"{prog}: {line}\n")

        move = StoreMove(store, settings, broker_id, resume=args.resume, say=say)
        try:
            done = move.run()
        except KeyboardInterrupt:
            progress.end()
        except (ImportRefused, StorageError, jsapi.JetStreamError, TimeoutError) as error:
            raise CliError(str(error)) from None
        except (OSError, ConnectError, ProtocolError, PublishError) as error:
            raise CliError(
                f"the NATS servers failed the import ({error}): what the stream took is "
                "kept, --resume goes on from there"
            ) from None
    finally:
        store.close()
    _print(
        json.dumps(
            {
                "stream": done.stream,
                "broker_id": done.broker_id,
                "requests": done.requests,
                "schedules": done.schedules,
                "resumed": done.resumed,
                "seconds": round(done.seconds, 3),
            }
        )
    )
    sys.stderr.write(
        f"{prog}: {_plural(done.requests, 'request')} and {_plural(done.schedules, 'schedule')} "
        f"moved into stream {done.stream} and its bucket, and deleted from {args.data_dir}'s "
        f"store; start the brokers with --store jetstream (this data directory's broker keeps "
        f"id {done.broker_id}: its clients' answers reach it)\n"
    )
    return 0


# -- the command line ---------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    """``emqp-cli``'s command line (``EMQP_BROKER`` and ``EMQP_ADMIN`` set the default
    endpoints)."""
    exit_status = (
        "Exit status: 0 on success, 1 with one sentence on stderr otherwise, 130 after Ctrl-C."
    )
    broker = os.environ.get("EMQP_BROKER", BROKER)
    admin = os.environ.get("EMQP_ADMIN", ADMIN)
    parser = CliParser(
        prog="emqp-cli",
        description=(__doc__ or "").split("\n")[0],
        epilog=f"A command's options may also stand before it. {exit_status}",
    )
    add_version(parser)
    commands = parser.add_subparsers(dest="command", required=True)
    sub = commands.add_parser(
        "submit",
        help="send a REQUEST and print its result",
        description=(
            "Send a REQUEST and print the worker's value as JSON (with --no-reply: the"
            " request's id once a worker has it). When --wait runs out, the broker's admin"
            " port is asked why, and the answer is the error message."
        ),
        epilog=exit_status,
    )
    sub.add_argument("queue")
    sub.add_argument("body", help="the request body, JSON")
    sub.add_argument("--broker", default=broker, help="client port [%(default)s]")
    sub.add_argument(
        "--admin", default=admin, help="admin port, asked why no answer came [%(default)s]"
    )
    sub.add_argument("--no-reply", action="store_true", help="only wait for the dispatch")
    sub.add_argument("--guarantee", action="store_true", help="stored until its worker replies")
    sub.add_argument("--retries", type=int, default=0, help="re-dispatches allowed")
    sub.add_argument("--timeout", type=int, default=0, help="seconds a worker has (0: none)")
    sub.add_argument(
        "--wait",
        type=float,
        default=DEFAULT_SUBMIT_WAIT,
        metavar="SECONDS",
        help="give up after this long without the answer (0: wait forever) [%(default)g]",
    )
    add_client_curve_arguments(sub)
    sub.set_defaults(run=submit, check=_check_submit)

    def admin_options(sub: argparse.ArgumentParser) -> None:
        sub.add_argument("--admin", default=admin, help="admin port [%(default)s]")
        add_client_curve_arguments(sub)
        sub.add_argument(
            "--wait",
            type=float,
            default=DEFAULT_STATUS_WAIT,
            metavar="SECONDS",
            help="give up after this long (0: wait forever) [%(default)g]",
        )

    sub = commands.add_parser(
        "status", help="print the broker's STATUS as JSON", epilog=exit_status
    )
    admin_options(sub)
    sub.set_defaults(run=status, check=_check_status)

    sub = commands.add_parser(
        "schedule",
        help="have the broker send BODY to QUEUE every interval or at cron times",
        description=(
            "Add (or replace: the same body is the same schedule) a schedule in the broker's"
            " scheduler, and print its id. An interval schedule runs at once, then every"
            " interval; after a broker restart a schedule that missed runs runs once."
        ),
        epilog=exit_status,
    )
    sub.add_argument("queue")
    sub.add_argument("body", help='the request body, JSON (eventmq\'s ["run", {...}] too)')
    sub.add_argument("--every", metavar="DURATION", help="interval: 30s, 5m, 1h, 1d")
    sub.add_argument(
        "--cron", metavar="LINE", help="five cron fields (six: seconds last), in the broker's zone"
    )
    sub.add_argument("--guarantee", action="store_true", help="each run stored until replied")
    sub.add_argument(
        "--no-haste",
        action="store_true",
        help="first run after one interval (cron: at its first time)",
    )
    sub.add_argument("--runs", type=int, help="end the schedule after this many runs")
    admin_options(sub)
    sub.set_defaults(run=schedule, check=_check_schedule)
    sub = commands.add_parser("unschedule", help="remove a schedule by its id", epilog=exit_status)
    sub.add_argument("id", help="the id `schedule` printed (or `schedules` lists)")
    admin_options(sub)
    sub.set_defaults(run=unschedule, check=_check_status)
    sub = commands.add_parser(
        "schedules",
        help="list the broker's schedules, one JSON line each; or import eventmq's",
        description=(
            "List the broker's schedules, one JSON line each. `schedules import` reads the"
            " schedules eventmq's scheduler keeps in Redis (--redis URL, or a dump file with"
            " --rdb) and sends each to the broker as eventmq's SCHEDULE: one JSON line each"
            " (imported, already-there, refused and why), then a summary on stderr; exit"
            " status 1 if any was refused."
        ),
        epilog=exit_status,
    )
    sub.add_argument("action", nargs="?", choices=["import"], help="import eventmq's schedules")
    sub.add_argument(
        "--redis", metavar="URL", help="eventmq's running Redis: redis://[:PASSWORD@]HOST:PORT/DB"
    )
    sub.add_argument(
        "--rdb", metavar="FILE", help="a dump (RDB) of it, read by a private redis-server"
    )
    sub.add_argument(
        "--db", type=whole_number(0), default=0, help="with --rdb: the database [%(default)s]"
    )
    sub.add_argument(
        "--redis-server", metavar="PATH", help="with --rdb: the redis-server program [on PATH]"
    )
    sub.add_argument(
        "--replace",
        action="store_true",
        help="send a schedule even when the broker has a different one of the same job",
    )
    sub.add_argument(
        "--haste",
        action="store_true",
        help="run each at once, as a new SCHEDULE (by default each resumes as eventmq's"
        " scheduler resumes it after a restart: after one interval, cron at its next time)",
    )
    admin_options(sub)
    sub.set_defaults(run=schedules, check=_check_schedules)
    sub = commands.add_parser(
        "import-store",
        help="move a stopped broker's stored requests and schedules into JetStream",
        description=(
            "Move the guaranteed requests a broker's SQLite store holds (not yet answered) "
            "into the JetStream stream brokers started with --store jetstream read, and its "
            "schedules into their bucket, as those brokers write them: a broker on the stream "
            "dispatches each request once, and fires each schedule at its next due time. "
            "They are deleted from the store once the stream and the bucket hold them all. "
            "The broker must be stopped (the store is opened alone). A stream that holds "
            "requests, or a bucket that holds schedules, is refused; an interrupted import "
            "leaves the stream marked (brokers refuse it) and --resume finishes it."
        ),
        epilog=exit_status,
    )
    sub.add_argument("--data-dir", required=True, help="the stopped broker's data directory")
    from bus.nats.options import add_nats_arguments

    add_nats_arguments(sub, "EMQP", "emqp")
    sub.add_argument(
        "--nats-broker-id",
        help="the id of the broker that will serve the requests' clients, as its "
        "--nats-broker-id (default: the one the data directory keeps, made there if "
        "missing, as the broker makes it)",
    )
    sub.add_argument(
        "--resume", action="store_true", help="go on with an import of this store interrupted"
    )
    sub.set_defaults(blocking=import_store)
    _action_commands(commands)
    return parser


#: The operator's actions through the HTTP port: command -> (action, what it names, help).
ACTIONS = {
    "purge": ("purge", "queue", "forget every request of a queue that waits for a worker"),
    "pause": ("pause", "queue", "hold a queue's requests: none dispatched until resumed"),
    "resume": ("resume", "queue", "dispatch a paused queue's requests again"),
    "remove-schedule": ("remove-schedule", "schedule", "remove a schedule by its id"),
    "forget-worker": ("forget-worker", "worker", "forget a worker (as /status names it)"),
}


def _action_commands(commands: Any) -> None:
    from bus.util.httpaction import add_http_arguments

    for command, (action, names, text) in ACTIONS.items():
        sub = commands.add_parser(
            command,
            help=f"{text} (through the broker process's HTTP port)",
            description=f"{text[0].upper()}{text[1:]}, through the HTTP port of the process "
            "that runs the broker (its actions want the port's bearer token). Prints what "
            "was done as a JSON line.",
            epilog="Exit status: 0 once done, 1 with one sentence on stderr otherwise.",
        )
        sub.add_argument(names)
        add_http_arguments(sub, "EMQP")
        sub.set_defaults(blocking=_act, action=(action, names))


def _act(args: argparse.Namespace) -> int:
    """One action through the HTTP port; its result as a JSON line."""
    from bus.util.httpaction import ActionFailed, act_from

    action, names = args.action
    try:
        result = act_from(args, "emqp", action, {names: getattr(args, names)})
    except ActionFailed as problem:
        raise CliError(str(problem)) from None
    sys.stdout.write(json.dumps(result, sort_keys=True) + "\n")
    return 0


@interruptible("emqp-cli")
def main(argv: Sequence[str] | None = None) -> None:
    """Run ``emqp-cli`` on ``argv`` (default: the command line) and exit with its status."""
    args = parse(build_parser(), argv)
    if getattr(args, "blocking", None) is not None:
        try:
            code = args.blocking(args)
        except CliError as problem:
            sys.stderr.write(f"emqp-cli {args.command}: {problem}\n")
            code = 1
        raise SystemExit(code)
    try:
        if not (args.wait >= 0 and math.isfinite(args.wait)):
            raise CliError("--wait must be 0 (wait forever) or more seconds")
        args.check(args)
        args.curve = _curve(args)
        code = _run(args)
    except CliError as problem:
        sys.stderr.write(f"emqp-cli {args.command}: {problem}\n")
        code = 1
    raise SystemExit(code)


def _curve(args: argparse.Namespace) -> Any:
    from bus.transport.curve import KeyFileError, client_curve

    try:
        return client_curve(args.server_key, args.cert)
    except KeyFileError as problem:
        raise CliError(str(problem)) from None


def _run(args: argparse.Namespace) -> int:
    from twisted.internet import reactor as global_reactor

    reactor: Any = global_reactor
    run = Run(reactor, args)
    # Ctrl-C stops the reactor: the Run ends what it waits for and says so (its shutdown
    # trigger, as for SIGTERM), and the status is 130.
    progress = Progress(f"emqp-cli {args.command}")
    progress.catch(reactor)
    # Started once the reactor runs, so that an interruption always finds the Run ready
    # to end what it waits for.
    reactor.callWhenRunning(run.start)
    reactor.run()
    return INTERRUPTED if progress.interrupted and run.code else run.code


if __name__ == "__main__":
    main()
