"""``eventbus-cli``: publish an event, tail a subtree, dump a snapshot, show a server's status,
import a server's log into a JetStream stream.

    eventbus-cli publish /orders/42/ '{"total": 12.5}'
    eventbus-cli tail /orders/ --since 100
    eventbus-cli snapshot /orders/ /users/ > snapshot.jsonl
    eventbus-cli status --http 127.0.0.1:8642
    eventbus-cli status --data-dir /var/lib/eventbus
    eventbus-cli import-log --data-dir /var/lib/eventbus --nats nats://h1:4222,nats://h2:4222

Events are printed as JSON lines: seq, topic, producer, timestamp, uuid and the
msgpack data decoded (bytes as ``{"$base64": ...}``).
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import sys
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from twisted.internet import defer, task
from twisted.python.failure import Failure

from bus.eventbus.codec import Dialect, Event
from bus.eventbus.config import DEFAULT_DATA_DIR
from bus.transport.curve_settings import add_client_curve_arguments
from bus.util.cliargs import (
    CliParser,
    Progress,
    add_version,
    host_port,
    interruptible,
    one_line,
    parse,
    positive_seconds,
    react,
    whole_number,
)

DEFAULT_SERVER = os.environ.get("EVENTBUS_SERVER", "127.0.0.1:5556")
DEFAULT_DIALECT = os.environ.get("EVENTBUS_DIALECT", "spec")


def _jsonable(value: Any) -> Any:
    if isinstance(value, bytes):
        return {"$base64": base64.b64encode(value).decode()}
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    return value


def event_json(event: Event) -> str:
    """One event as the JSON line the commands print."""
    try:
        value = _jsonable(event.value())
    except Exception:
        value = {"$undecodable": base64.b64encode(event.data).decode()}
    return json.dumps(
        {
            "seq": event.sequence,
            "topic": event.topic.decode("utf-8", "replace"),
            "producer": event.producer.decode("utf-8", "replace"),
            "timestamp": event.timestamp.decode("ascii", "replace"),
            "uuid": event.uuid.decode("ascii", "replace"),
            "value": value,
        },
        ensure_ascii=False,
    )


def _parse_value(text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text  # a bare word is published as a string


def _out(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def _err(line: str) -> None:
    sys.stderr.write(line + "\n")
    sys.stderr.flush()


class DialectMismatch(ValueError):
    """The server answered, in the other dialect."""


def _original_hint(server: Any) -> str:
    return (
        f"{server} answers like the original Node.js Event BUS (decimal sequences, no "
        "heartbeat): try --dialect original"
    )


class SnapshotQuery:
    """One SYNCSTART on a fresh DEALER, its SYNCs handed to ``on_event``; fires with the
    SYNCEND's sequence, or fails with one line naming what it waited for and from where.

    In the spec dialect it recognises the original server's answer as it arrives: a
    decimal sequence where ours would be 8 octets (the original reads our binary sequence
    as NaN and, with its in-memory store, answers at once with a SYNCEND)."""

    def __init__(self, reactor: Any, factory: Any, server: Any, dialect: Dialect) -> None:
        self.reactor = reactor
        self.factory = factory
        self.server = server
        self.dialect = dialect

    def ask(
        self,
        subtrees: list[bytes],
        since: int,
        timeout: float,
        on_event: Any = lambda event: None,
    ) -> defer.Deferred[int]:
        """Ask for the events of ``subtrees`` above ``since``, each handed to ``on_event``; fires
        with the SYNCEND's sequence, or fails when none came within ``timeout`` seconds."""
        import uuid

        import zmq

        from bus.eventbus import codec
        from bus.extension import ConditionTimeout, SocketOptions

        done: defer.Deferred[int] = defer.Deferred()

        spec = self.dialect is Dialect.SPEC

        def on_replies(batch: list[list[bytes]]) -> None:
            for frames in batch:
                if done.called:
                    return
                if spec and len(frames) >= 3 and frames[2].isdigit():
                    done.errback(DialectMismatch(_original_hint(self.server)))
                    return
                try:
                    reply = codec.parse_snapshot_reply(frames)
                except codec.EventBusError as error:
                    done.errback(ValueError(f"{self.server} sent a bad snapshot reply: {error}"))
                    return
                if isinstance(reply, Event):
                    on_event(reply)
                else:
                    done.callback(reply.sequence)

        # A UUID as identity in both dialects: the original routes answers back only to a
        # client whose identity is valid UTF-8, and its answer is how we recognise it.
        identity = str(uuid.uuid4()).encode()
        dealer = self.factory.socket(
            zmq.DEALER, on_replies, SocketOptions(receive_hwm=0, linger_ms=0, identity=identity)
        )
        dealer.connect(self.server.snapshot)
        dealer.send_frames(self.dialect.sync_start(subtrees, since))

        def expired() -> None:
            if not done.called:
                done.errback(
                    ConditionTimeout(
                        f"timed out after {timeout:g}s waiting for SYNCEND from {self.server}"
                    )
                )

        timer = self.reactor.callLater(timeout, expired)

        def close(result: Any) -> Any:
            if timer.active():
                timer.cancel()
            dealer.shutdown()
            return result

        return done.addBoth(close)


def _curve(args: argparse.Namespace) -> Any:
    """CURVE to the server (``--server-key``, ``--cert``), or None; ValueError names a bad
    key file."""
    from bus.transport.curve import KeyFileError, client_curve

    try:
        return client_curve(args.server_key, args.cert)
    except KeyFileError as error:
        raise ValueError(str(error)) from None


def _first(*waits: defer.Deferred[Any]) -> defer.Deferred[Any]:
    """Fires as the first of ``waits`` fires, with its result or failure."""
    first: defer.Deferred[Any] = defer.Deferred()

    def settle(outcome: Any) -> None:
        if first.called:
            return
        if isinstance(outcome, Failure):
            first.errback(outcome)
        else:
            first.callback(outcome)

    for wait in waits:
        wait.addBoth(settle)
    return first


def _mismatch_only(probe: defer.Deferred[Any]) -> defer.Deferred[Any]:
    """``probe``'s DialectMismatch; any other outcome never fires."""

    def failed(failure: Failure) -> Any:
        return failure if failure.check(DialectMismatch) else defer.Deferred()

    return probe.addCallbacks(lambda _: defer.Deferred(), failed)


@defer.inlineCallbacks
def _with_hint(reactor: Any, args: argparse.Namespace, waiting: Any) -> Any:
    """Wait for ``waiting``; if it times out and the server speaks CURVE to a command given
    no key, refuses the key it was given, or answers like the original Node.js
    implementation, say so in the same line."""
    from bus.eventbus.client import ServerAddress
    from bus.extension import ConditionTimeout
    from bus.transport.probe import probe_key, probe_port, refused_key

    try:
        result = yield waiting
    except ConditionTimeout as error:
        server = ServerAddress.parse(args.server)
        curve = _curve(args)
        if curve is None and (yield probe_port(reactor, server.host, server.port, 2.0)) == "curve":
            raise ConditionTimeout(
                f"{error}; {server} speaks CURVE: give --server-key (and --cert)"
            ) from None
        if curve is not None and (
            (yield probe_key(reactor, server.snapshot, curve, 2.0)) == "refused"
        ):
            raise ConditionTimeout(f"{error}; {refused_key(server.snapshot, curve)}") from None
        if Dialect(args.dialect) is Dialect.SPEC and (
            yield _answers_like_the_original(reactor, server, _curve(args))
        ):
            raise ConditionTimeout(f"{error}; {_original_hint(server)}") from None
        raise
    return result


@defer.inlineCallbacks
def _answers_like_the_original(reactor: Any, server: Any, curve: Any = None) -> Any:
    from bus.eventbus import codec
    from bus.eventbus.codec import EventBusError
    from bus.extension import ConditionTimeout, SocketFactory

    factory = SocketFactory(reactor, curve=curve)
    query = SnapshotQuery(reactor, factory, server, Dialect.ORIGINAL)
    try:
        yield query.ask([codec.PROBE_SUBTREE], 0, timeout=2.0)
    except (ConditionTimeout, EventBusError):
        return False
    finally:
        factory.shutdown()
    return True


@defer.inlineCallbacks
def publish(reactor: Any, args: argparse.Namespace) -> Any:
    """``eventbus-cli publish``: one event, confirmed stored when asked (``--confirm``)."""
    import zmq

    from bus.eventbus import codec
    from bus.eventbus.client import EventBusPublisher, ServerAddress
    from bus.extension import SocketFactory, SocketOptions, wait_until

    servers = args.server_list or [DEFAULT_SERVER]
    args.server = servers[0]
    if len(servers) > 1 and args.confirm and Dialect(args.dialect).has_heartbeats:
        return (yield _publish_confirmed(reactor, args, servers))
    factory = SocketFactory(reactor, curve=_curve(args))
    dialect = Dialect(args.dialect)
    server = ServerAddress.parse(args.server)
    confirmations: list[list[bytes]] = []
    progress: Progress = args.progress
    try:
        query = SnapshotQuery(reactor, factory, server, dialect)
        progress.now(f"waiting for {server} to answer", "the event was not sent")
        if args.confirm and dialect.has_heartbeats:
            # Listen first, so the broadcast of our event (sent only once stored) is seen.
            listener = factory.socket(zmq.SUB, confirmations.extend, SocketOptions(linger_ms=0))
            listener.subscribe(codec.HEARTBEAT_TOPIC)
            listener.subscribe(args.topic.encode())
            listener.connect(server.publisher)
            heard = wait_until(
                lambda: any(m[0] == codec.HEARTBEAT_TOPIC for m in confirmations),
                timeout=args.timeout,
                reactor=reactor,
                what=f"a heartbeat from {server}",
            )
            # The original never heartbeats, but may answer a snapshot probe at once.
            probe = query.ask([codec.PROBE_SUBTREE], 0, args.timeout)
            yield _with_hint(reactor, args, _first(heard, _mismatch_only(probe)))
        elif args.confirm:
            # No heartbeat to say the server lives, nor that a SUB is heard: ask its log.
            since = yield query.ask([codec.PROBE_SUBTREE], 0, args.timeout)
        publisher = EventBusPublisher(
            server, args.producer, reactor=reactor, factory=factory, dialect=dialect
        )
        event_id = publisher.publish(args.topic, _parse_value(args.value))
        progress.now(f"sending the event to {server}", f"event {event_id} not sent")
        yield publisher.flush()
        progress.now(
            f"waiting for {server} to confirm it stored the event",
            f"event {event_id} was sent, its storage not confirmed",
        )
        if not args.confirm:
            _out(json.dumps({"uuid": event_id}))
            return
        if dialect.has_heartbeats:
            rights = " (over CURVE the server drops a PUB outside its key's publish subtrees)"
            yield wait_until(
                lambda: any(len(m) == 6 and m[4] == event_id.encode() for m in confirmations),
                timeout=args.timeout,
                reactor=reactor,
                what=f"the event's broadcast from {server}{rights if args.cert else ''}",
            )
            stored = next(m for m in confirmations if len(m) == 6 and m[4] == event_id.encode())
            sequence, _ = codec.decode_sequence(stored[1])
        else:
            sequence = yield _find_in_log(reactor, query, args, event_id, since)
        _out(json.dumps({"uuid": event_id, "seq": sequence}))
    finally:
        factory.shutdown()


@defer.inlineCallbacks
def _publish_confirmed(reactor: Any, args: argparse.Namespace, servers: list[str]) -> Any:
    """Through the first of several servers that answers; resent after a failover (JetStream
    front-ends store it once), confirmed by the log itself."""
    from bus.eventbus.confirmed import ConfirmedPublisher
    from bus.extension import ConditionTimeout

    publisher = ConfirmedPublisher(servers, args.producer, reactor=reactor, curve=_curve(args))
    publisher.startService()
    try:
        event_id = str(uuid.uuid4())
        args.progress.now(
            f"waiting for one of {', '.join(servers)} to confirm the event",
            f"event {event_id} may have been sent, its storage not confirmed",
        )
        stored = publisher.publish(args.topic, _parse_value(args.value), event_id=event_id)
        stored.addTimeout(args.timeout, reactor)
        try:
            sequence = yield stored
        except defer.TimeoutError:
            raise ConditionTimeout(
                f"timed out after {args.timeout:g}s: none of {', '.join(servers)} confirmed "
                "the event"
            ) from None
        _out(json.dumps({"uuid": event_id, "seq": sequence}))
    finally:
        yield publisher.stopService().addErrback(lambda _: None)


@defer.inlineCallbacks
def _find_in_log(
    reactor: Any, query: SnapshotQuery, args: argparse.Namespace, event_id: str, since: int
) -> Any:
    """The sequence the server stored ``event_id`` under, asked of its log until found."""
    from bus.extension import ConditionTimeout

    deadline = reactor.seconds() + args.timeout
    found: list[int] = []
    wanted = event_id.encode()
    while not found:
        left = deadline - reactor.seconds()
        if left <= 0:
            raise ConditionTimeout(
                f"timed out after {args.timeout:g}s waiting for the event in {query.server}'s "
                "log (it was sent)"
            )
        yield query.ask(
            [args.topic.encode()],
            since,
            left,
            lambda event: found.append(event.sequence) if event.uuid == wanted else None,
        )
        if not found:
            yield task.deferLater(reactor, min(0.1, max(left, 0)), lambda: None)
    return found[0]


@defer.inlineCallbacks
def snapshot(reactor: Any, args: argparse.Namespace) -> Any:
    """``eventbus-cli snapshot``: every event of the subtrees as JSON lines, then a count on
    stderr."""
    from bus.eventbus.client import ServerAddress
    from bus.extension import SocketFactory

    factory = SocketFactory(reactor, curve=_curve(args))
    count = 0

    def on_event(event: Event) -> None:
        nonlocal count
        count += 1
        _out(event_json(event))

    try:
        server = ServerAddress.parse(args.server)
        args.progress.now(
            f"waiting for the end of {server}'s snapshot (SYNCEND)",
            lambda: f"{count} event(s) printed, the snapshot not complete",
        )
        query = SnapshotQuery(reactor, factory, server, Dialect(args.dialect))
        asked = query.ask([s.encode() for s in args.subtrees], args.since, args.timeout, on_event)
        end = yield _with_hint(reactor, args, asked)
        _err(f"{count} events, snapshot complete at sequence {end}")
    finally:
        factory.shutdown()


@defer.inlineCallbacks
def tail(reactor: Any, args: argparse.Namespace) -> Any:
    """``eventbus-cli tail``: the subtrees' events as JSON lines, from a snapshot and then live,
    until interrupted."""
    from bus.eventbus.client import EventBusSubscriber, FileCursor
    from bus.extension import wait_until

    servers = args.server_list or [DEFAULT_SERVER]
    printed, last = 0, 0

    def on_event(event: Event) -> None:
        nonlocal printed, last
        _out(event_json(event))
        printed, last = printed + 1, event.sequence

    def done() -> str:
        if not printed:
            return "no event printed"
        return f"{printed} event(s) printed, the last of sequence {last}"

    subscriber = EventBusSubscriber(
        servers,
        args.subtrees,
        on_event,
        since=args.since,
        cursor=FileCursor(args.cursor) if args.cursor else None,
        reactor=reactor,
        dialect=args.dialect,
        curve=_curve(args),
    )
    subscriber.startService()
    reactor.addSystemEventTrigger("before", "shutdown", subscriber.stopService)
    # Until the first snapshot is in, a server that does not answer is an error, not a wait.
    args.server = servers[0]
    addresses = ", ".join(map(str, servers))
    args.progress.now(f"waiting for the first snapshot from {addresses}", done)
    caught_up = wait_until(
        lambda: subscriber.core.stats.snapshots > 0 and not subscriber.core.syncing,
        timeout=args.timeout,
        reactor=reactor,
        what=f"the first snapshot from {', '.join(map(str, servers))}",
    )
    try:
        yield _with_hint(reactor, args, caught_up)
    except Exception:
        yield subscriber.stopService()
        raise
    args.progress.now(f"following {addresses}", done)
    yield defer.Deferred()  # live events until interrupted


@defer.inlineCallbacks
def _fetch_status(reactor: Any, address: str, timeout: float, token: bytes | None = None) -> Any:
    """``/status`` of the process serving it on ``address`` (host:port), as JSON;
    ``token``: the bearer token its --http-token-file holds."""
    from twisted.web.client import Agent, readBody
    from twisted.web.http_headers import Headers

    agent = Agent(reactor, connectTimeout=timeout)
    url = f"http://{address}/status"
    headers = Headers({b"authorization": [b"Bearer " + token]} if token else {})
    response = yield agent.request(b"GET", url.encode(), headers).addTimeout(timeout, reactor)
    body = yield readBody(response)
    if response.code == 401:
        raise OSError(
            "HTTP 401: it wants a bearer token (--token-file)"
            if token is None
            else "HTTP 401: the server refused the token of --token-file"
        )
    if response.code != 200:
        raise OSError(f"HTTP {response.code}")
    return json.loads(body)


def _token(args: argparse.Namespace) -> bytes | None:
    if not args.token_file:
        return None
    from bus.util.httpaction import ActionFailed, read_token

    try:
        return read_token(args.token_file)
    except ActionFailed as error:  # a status read is refused as its other bad values are
        raise ValueError(str(error)) from None


def _reason(error: Exception) -> str:
    return str(error) or type(error).__name__


def _read_status_file(path: Path) -> dict[str, Any] | None:
    try:
        value = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except ValueError as error:
        raise ValueError(f"{path} is not JSON: {error}") from None
    if not isinstance(value, dict):
        raise ValueError(f"{path} is not a status file")
    return value


def _written_ago(recorded: dict[str, Any]) -> str:
    written = recorded.get("time")
    if not isinstance(written, int | float):
        return ""
    return f", written {max(0.0, time.time() - written):.1f} s ago"


@defer.inlineCallbacks
def status(reactor: Any, args: argparse.Namespace) -> Any:
    """The status of the server whose data directory is named; else of the one answering
    on ``--http``, falling back to the default data directory's status.json."""
    token = _token(args)
    where = args.data_dir if args.data_dir is not None else f"http://{args.http}/status"
    args.progress.now(f"waiting for {where}'s status", "nothing printed")
    if args.data_dir is not None:
        yield _status_of(reactor, Path(args.data_dir), args.timeout, token, args.progress)
        return
    try:
        live = yield _fetch_status(reactor, args.http, args.timeout, token)
    except Exception as error:  # refused, timed out, not ours: say so, then try the file
        if args.progress.interrupted:  # Ctrl-C: no fallback, the interruption is said
            raise
        reason = _reason(error)
    else:
        _out(json.dumps(live, indent=2, sort_keys=True))
        return
    path = Path(DEFAULT_DATA_DIR) / "status.json"
    recorded = _read_status_file(path)
    if recorded is None:
        _err(
            f"eventbus-cli status: no answer from http://{args.http}/status ({reason}) and no "
            f"{path}: is a server running (--http-port, or --data-dir with --stats-interval > 0)?"
        )
        raise SystemExit(1)
    _err(f"no answer from http://{args.http}/status ({reason}); showing {path}")
    _out(json.dumps(recorded, indent=2, sort_keys=True))


@defer.inlineCallbacks
def _status_of(
    reactor: Any, data_dir: Path, timeout: float, token: bytes | None, progress: Progress
) -> Any:
    """The server that keeps ``data_dir``: its live ``/status`` when its status.json says
    where that is and the bus there is the same store, else the file itself."""
    path = data_dir / "status.json"
    recorded = _read_status_file(path)
    if recorded is None:
        _err(
            f"eventbus-cli status: no {path}: is a server running with --data-dir {data_dir} "
            "(and --stats-interval > 0)?"
        )
        raise SystemExit(1)
    address = recorded.get("http")
    if not address:
        _err(f"showing {path}{_written_ago(recorded)} (that server serves no /status)")
        _out(json.dumps(recorded, indent=2, sort_keys=True))
        return
    try:
        live = yield _fetch_status(reactor, address, timeout, token)
    except Exception as error:
        if progress.interrupted:
            raise
        reason = _reason(error)
    else:
        bus = live.get("services", {}).get("eventbus", {})
        if bus.get("store_id") == recorded.get("store_id"):
            _out(json.dumps(live, indent=2, sort_keys=True))
            return
        reason = f"the bus there keeps another store, not {data_dir}'s"
    _err(f"no answer about {data_dir} from http://{address}/status ({reason}); showing {path}"
         f"{_written_ago(recorded)}")  # fmt: skip
    _out(json.dumps(recorded, indent=2, sort_keys=True))


# -- import-log --------------------------------------------------------------------------------


def _retention(args: argparse.Namespace) -> tuple[Any, str]:
    """The retention the stream's limits are made of: the options given, else what the
    data directory's status.json says its server last ran with, else none; and whence."""
    from bus.eventbus.store import Retention
    from bus.util.values import optional_duration

    given = (args.retention_max_age, args.retention_max_count, args.retention_latest_per_topic)
    if any(value not in (None, False) for value in given):
        return (
            Retention(
                max_age=optional_duration(args.retention_max_age),
                max_count=args.retention_max_count,
                latest_per_topic=args.retention_latest_per_topic,
            ),
            "the options",
        )
    path = Path(args.data_dir) / "status.json"
    recorded = _read_status_file(path)
    kept = ((recorded or {}).get("config") or {}).get("retention")
    if not isinstance(kept, dict):
        return Retention(), "none given, and no status.json of the server says one"
    try:
        retention = Retention(
            max_age=None if kept.get("max_age") is None else float(kept["max_age"]),
            max_count=None if kept.get("max_count") is None else int(kept["max_count"]),
            latest_per_topic=bool(kept.get("latest_per_topic")),
        )
    except (TypeError, ValueError):
        raise ValueError(f"{path}: its retention is not readable: {kept!r}") from None
    return retention, f"{path}, as the server last ran"


def import_log(args: argparse.Namespace) -> None:
    """``eventbus-cli import-log``: the server's SQLite log into a new JetStream stream,
    every sequence kept (:mod:`bus.eventbus.migrate`). Blocking: no reactor."""
    from twisted.python import usage

    from bus.errors import StartupError, StorageError
    from bus.eventbus.config import JetStreamSettings
    from bus.eventbus.migrate import ImportRefused, LogImport, retention_text
    from bus.eventbus.store import LogExport
    from bus.nats import jsapi
    from bus.nats.options import nats_settings_from_arguments
    from bus.util.cliargs import fail

    prog = "eventbus-cli import-log"
    progress: Progress = args.progress
    try:
        settings = nats_settings_from_arguments(args, JetStreamSettings)
        retention, whence = _retention(args)
    except (usage.UsageError, StartupError, ValueError) as error:
        fail(prog, error)
    progress.now(f"opening {Path(args.data_dir)}'s log", "nothing written")
    try:
        log = LogExport(args.data_dir)
    except StorageError as error:
        fail(prog, error)
    terminal = sys.stderr.isatty()
    total = log.last_sequence
    shown = [0.0]
    reached = [0]

    def stored(sequence: int) -> None:
        reached[0] = sequence
        now = time.monotonic()
        if terminal and now - shown[0] >= 0.2:
            shown[0] = now
            sys.stderr.write(f"\rimporting: sequence {sequence:,} of {total:,}\x1b[K")
            sys.stderr.flush()

    held = f"{log.count:,} events, sequences {log.first_sequence or 0:,} to {total:,}"
    _err(
        f"{prog}: {log.path} (store {log.store_id}: {held}) into stream {settings.stream} on "
        f"{', '.join(settings.servers)}; limits from {whence}: {retention_text(retention)}"
    )
    progress.now(
        f"writing into stream {settings.stream}",
        lambda: (
            f"stored up to sequence {reached[0]:,} of {total:,}; the stream stays marked "
            "unfinished: the same command with --resume goes on"
        ),
    )
    progress.catch(None)
    job = LogImport(
        log, settings, retention, resume=args.resume, say=lambda line: _err(f"{prog}: {line}"),
        stored=stored, stop=lambda: progress.interrupted,
    )  # fmt: skip
    try:
        done = job.run()
    except (ImportRefused, StorageError, jsapi.JetStreamError, TimeoutError) as error:
        if terminal:
            sys.stderr.write("\n")
        fail(prog, error)
    except Exception as error:  # a defect of the tool: one line, never a traceback
        fail(prog, f"unexpected {type(error).__name__} ({error}): please report it")
    finally:
        log.close()
    if terminal:
        sys.stderr.write("\n")
    if done.interrupted:
        progress.end()
    _out(
        json.dumps(
            {
                "stream": done.stream,
                "store_id": done.store_id,
                "first_sequence": done.first_sequence,
                "last_sequence": done.last_sequence,
                "events": done.events,
                "holes": done.holes,
                "held": done.held,
                "resumed": done.resumed,
                "atomic_batches": done.atomic,
                "seconds": round(done.seconds, 3),
                "rate": round(done.rate),
            }
        )
    )
    _err(
        f"{prog}: stream {done.stream} holds the log's {done.held:,} events under their "
        f"sequences ({done.first_sequence:,} to {done.last_sequence:,}); {done.events:,} events "
        f"and {done.holes:,} holes written in {done.seconds:.1f} s ({done.rate:,.0f}/s). "
        f"Start front-ends with --store jetstream --nats-stream {done.stream} and "
        f"retention {retention_text(retention)}"
    )


def _checked(text: str, check: Any) -> str:
    """``text`` if the server's own ``check`` of its bytes passes (an argument type)."""
    from bus.eventbus.codec import EventBusError

    try:
        check(text.encode("utf-8", "surrogateescape"))
    except EventBusError as error:
        raise argparse.ArgumentTypeError(f"{text!r}: {error}, the server would drop it") from None
    return text


def _topic(text: str) -> str:
    """A topic the server takes in a PUB (its rules, from the codec)."""
    from bus.eventbus.codec import check_published_topic

    return _checked(text, check_published_topic)


def _producer(text: str) -> str:
    from bus.eventbus.codec import check_producer

    return _checked(text, check_producer)


def build_parser() -> argparse.ArgumentParser:
    """``eventbus-cli``'s command line."""
    parser = CliParser(
        prog="eventbus-cli",
        description=__doc__.split("\n\n")[0],
        epilog="A command's options may also stand before it (eventbus-cli --timeout 5 status).",
    )
    add_version(parser)
    commands = parser.add_subparsers(dest="command", required=True)

    def server_option(p: argparse.ArgumentParser) -> None:
        p.add_argument(
            "--server",
            default=DEFAULT_SERVER,
            type=host_port,
            help="host:port of the bus (base port P)",
        )

    def dialect_option(p: argparse.ArgumentParser) -> None:
        add_client_curve_arguments(p)  # every command that speaks ZeroMQ to the bus
        p.add_argument(
            "--dialect",
            choices=[d.value for d in Dialect],
            default=DEFAULT_DIALECT,
            help="spec (default) or original: the Node.js server (decimal sequences, no heartbeat)",
        )

    p = commands.add_parser("publish", help="publish one event")
    p.add_argument(
        "--server",
        dest="server_list",
        action="append",
        type=host_port,
        help="host:port; repeat for failover servers, e.g. JetStream front-ends "
        f"(default {DEFAULT_SERVER})",
    )
    p.add_argument("topic", type=_topic, help="topic, e.g. /orders/42/")
    p.add_argument("value", nargs="?", default="null", help="JSON value (a bare word is a string)")
    p.add_argument("--producer", type=_producer, default=f"eventbus-cli@{os.uname().nodename}")
    p.add_argument(
        "--no-confirm",
        dest="confirm",
        action="store_false",
        help="do not wait for the bus to broadcast the event back",
    )
    p.add_argument("--timeout", type=positive_seconds, default=10.0)
    dialect_option(p)
    p.set_defaults(run=publish)

    p = commands.add_parser("tail", help="print events of subtrees as they come")
    p.add_argument("subtrees", nargs="*", help="subtree prefixes (none: everything)")
    p.add_argument(
        "--server",
        dest="server_list",
        action="append",
        type=host_port,
        help=f"host:port; repeat for failover servers (default {DEFAULT_SERVER})",
    )
    p.add_argument("--since", type=whole_number(0), default=None, help="start above this sequence")
    p.add_argument("--cursor", help="file that keeps the last sequence, to resume")
    p.add_argument(
        "--timeout", type=positive_seconds, default=10.0, help="for the first snapshot (seconds)"
    )
    dialect_option(p)
    p.set_defaults(run=tail)

    p = commands.add_parser("snapshot", help="dump the stored events of subtrees and exit")
    server_option(p)
    p.add_argument("subtrees", nargs="*")
    p.add_argument("--since", type=whole_number(0), default=0)
    p.add_argument("--timeout", type=positive_seconds, default=60.0)
    dialect_option(p)
    p.set_defaults(run=snapshot)

    p = commands.add_parser(
        "status", help="show a server's /status (falls back to a local status.json)"
    )
    p.add_argument(
        "--http",
        default=os.environ.get("EVENTBUS_HTTP", "127.0.0.1:8642"),
        type=host_port,
        help="host:port of the server's --http-port (default %(default)s)",
    )
    p.add_argument(
        "--data-dir",
        default=os.environ.get("EVENTBUS_DATA_DIR"),
        help="show the server that keeps this data directory (its /status, else its "
        f"status.json); without it, the server on --http, else {DEFAULT_DATA_DIR}/status.json",
    )
    p.add_argument(
        "--token-file",
        default=os.environ.get("EVENTBUS_HTTP_TOKEN_FILE"),
        help="file of the bearer token the server's --http-token-file holds",
    )
    p.add_argument("--timeout", type=positive_seconds, default=3.0)
    p.set_defaults(run=status)

    p = commands.add_parser(
        "import-log",
        help="import a stopped server's log into a new JetStream stream, every sequence kept",
        description=(
            "Write the SQLite log of a server's data directory into a new JetStream stream "
            "as front-ends write it, each event under its own sequence (the holes retention "
            "left included), so that a subscriber's cursor from that server resumes at a "
            "front-end with no hole and no repeat, under the same store id. The server must "
            "be stopped: the log is opened alone (refused while a server has it open; a "
            "server cannot open it while the import runs). A stream that holds events is "
            "refused. Interrupted (Ctrl-C, a lost server), the stream stays marked unfinished "
            "and front-ends refuse it: the same command with --resume goes on. Prints a JSON "
            "line: what was written, and the rate."
        ),
        epilog="Exit status: 0 once the stream holds the whole log, 1 with one sentence "
        "on stderr otherwise, 130 after Ctrl-C.",
    )
    p.add_argument(
        "--data-dir",
        required=True,
        help="the stopped server's data directory (its events.sqlite3)",
    )
    from bus.nats.options import add_nats_arguments

    add_nats_arguments(p, "EVENTBUS", "eventbus")
    p.add_argument(
        "--retention-max-age",
        metavar="DURATION",
        help="the stream's max_age (counted from the import: JetStream keeps the time each "
        "message was stored)",
    )
    p.add_argument("--retention-max-count", type=whole_number(1), help="the stream's max_msgs")
    p.add_argument(
        "--retention-latest-per-topic",
        action="store_true",
        help="the stream's max_msgs_per_subject 1",
    )
    p.add_argument(
        "--resume", action="store_true", help="go on with an import of this log interrupted"
    )
    p.set_defaults(run=import_log, blocking=True)

    from bus.util.httpaction import add_http_arguments

    p = commands.add_parser(
        "drop-snapshot",
        help="end a snapshot client's streams (through the bus process's HTTP port)",
        description="End every snapshot stream of a client and forget its waiting requests, "
        "through the HTTP port of the process that runs the bus (its actions want the "
        "port's bearer token): the client (as /status lists it in snapshot_clients) gets "
        "no SYNCEND, its place goes to the next. Prints what was done as a JSON line.",
        epilog="Exit status: 0 once done, 1 with one sentence on stderr otherwise.",
    )
    p.add_argument("client", help="the client's id, as /status lists it (hex)")
    add_http_arguments(p, "EVENTBUS")
    p.set_defaults(run=drop_snapshot, blocking=True)
    return parser


def drop_snapshot(args: argparse.Namespace) -> None:
    """``eventbus-cli drop-snapshot``: one action through the HTTP port. Blocking."""
    from bus.util.cliargs import fail
    from bus.util.httpaction import ActionFailed, act_from

    try:
        result = act_from(args, "eventbus", "drop-snapshot", {"client": args.client})
    except ActionFailed as problem:
        fail("eventbus-cli drop-snapshot", problem)
    sys.stdout.write(json.dumps(result, sort_keys=True) + "\n")


@interruptible("eventbus-cli")
def main(argv: Sequence[str] | None = None) -> None:
    """Run ``eventbus-cli`` on ``argv`` (default: the command line)."""
    from bus.extension import ConditionTimeout

    args = parse(build_parser(), argv)
    args.progress = Progress(f"eventbus-cli {args.command}")
    if getattr(args, "blocking", False):
        args.run(args)
        raise SystemExit(0)
    if hasattr(args, "server_key"):
        try:  # a bad key file is said before anything runs
            _curve(args)
        except ValueError as error:
            _err(f"eventbus-cli {args.command}: {one_line(error)}")
            raise SystemExit(1) from None

    react(
        f"eventbus-cli {args.command}",
        lambda reactor: args.run(reactor, args),
        (ConditionTimeout, ValueError, OSError, defer.TimeoutError),
        progress=args.progress,
    )


if __name__ == "__main__":
    main()
