"""``mc0-cli``: put a message, follow topics, or time round trips against an mc0 broker
(``mc0-keys``, now ``bus-keys``, makes a CURVE key pair: :mod:`bus.transport.keys_cli`).

    bus-keys alice ./mc0-clients            # alice.key (public) + alice.key_secret
    mc0-cli --cert ./mc0-clients/alice.key_secret sub mcollective.discovery
    mc0-cli put mcollective.discovery 'hello' --header X-reply-to=me
    mc0-cli ping --count 100

The server's public key comes from ``--server-key`` (40 Z85 characters or a ``.key``
certificate; default ``$MC0_SERVER_KEY``, else ``mc0-data/server.key`` when it exists, the
file a local broker makes). ``--plain`` talks to a broker run with ``--plain``.
Messages are printed as JSON lines: topic, headers, body (text, or ``{"$base64": ...}``).
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from twisted.internet import defer

from bus.util.cliargs import (
    CliParser,
    Progress,
    add_version,
    duration,
    interruptible,
    one_line,
    parse,
    positive_seconds,
    react,
    tcp_endpoint,
    whole_number,
)

DEFAULT_SERVER = os.environ.get("MC0_SERVER", "tcp://127.0.0.1:61616")
DEFAULT_SERVER_KEY_FILE = Path("mc0-data") / "server.key"


def _out(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def _err(line: str) -> None:
    sys.stderr.write(line + "\n")
    sys.stderr.flush()


def _text(value: bytes) -> Any:
    try:
        return value.decode("utf-8")
    except UnicodeDecodeError:
        return {"$base64": base64.b64encode(value).decode()}


def delivery_json(delivery: Any) -> str:
    """A MESSAGE as the JSON line ``mc0-cli sub`` prints."""
    return json.dumps(
        {
            "topic": _text(delivery.topic),
            "headers": {
                k.decode("utf-8", "replace"): _text(v) for k, v in delivery.headers.items()
            },
            "body": [_text(frame) for frame in delivery.body],
        },
        ensure_ascii=False,
    )


def _keys(args: argparse.Namespace) -> tuple[Any, Any]:
    """The broker's public key and this client's key pair (None, None with ``--plain``);
    ValueError or KeyFileError says what is wrong with them."""
    from bus.transport.curve import load_key_pair, load_public_key

    server_key = client_keys = None
    if not args.plain:
        source = args.server_key or os.environ.get("MC0_SERVER_KEY")
        if not source:
            if not DEFAULT_SERVER_KEY_FILE.exists():
                raise ValueError(
                    "the broker's public key is needed: --server-key KEY|FILE (or --plain)"
                )
            source = str(DEFAULT_SERVER_KEY_FILE)
        server_key = load_public_key(source)
        if args.cert:
            client_keys = load_key_pair(args.cert)
    return server_key, client_keys


def _connector(reactor: Any, args: argparse.Namespace, on_message: Any = None) -> Any:
    from bus.mc0.client import Mc0Connector
    from bus.mc0.codec import Framing

    server_key, client_keys = args.keys
    return Mc0Connector(
        args.servers,
        on_message,
        server_key=server_key,
        client_keys=client_keys,
        ttl=args.ttl,
        framing=Framing(args.framing),
        reactor=reactor,
    )


def _connected(
    reactor: Any, connector: Any, args: argparse.Namespace, done: str
) -> defer.Deferred[None]:
    args.progress.now(f"waiting for a broker at {', '.join(args.servers)} to open a session", done)
    started: defer.Deferred[None] = connector.start()
    return started.addTimeout(args.timeout, reactor)


@defer.inlineCallbacks
def put(reactor: Any, args: argparse.Namespace) -> Any:
    """``mc0-cli put``: one PUT, waiting for the broker's OK."""
    connector = _connector(reactor, args)
    try:
        yield _connected(reactor, connector, args, "nothing put")
        headers = list(args.header)
        body = [part.encode() for part in args.body]
        args.progress.now(
            f"waiting for the broker's OK for the message to {args.topic}",
            "the message was sent, not confirmed",
        )
        yield connector.put(args.topic.encode(), body, headers).addTimeout(args.timeout, reactor)
        _err(f"put to {args.topic}: OK")
    finally:
        yield connector.stop()


def sub(reactor: Any, args: argparse.Namespace) -> defer.Deferred[None]:
    """``mc0-cli sub``: the topics' messages as JSON lines, until ``--count`` of them or an
    interruption."""
    done: defer.Deferred[None] = defer.Deferred()
    seen = [0]

    def on_message(delivery: Any) -> None:
        _out(delivery_json(delivery))
        seen[0] += 1
        if args.count and seen[0] >= args.count and not done.called:
            done.callback(None)

    connector = _connector(reactor, args, on_message)

    def printed() -> str:
        return f"{seen[0]} message(s) printed"

    @defer.inlineCallbacks
    def run() -> Any:
        yield _connected(reactor, connector, args, "not subscribed")
        topics = ", ".join(args.topics)
        args.progress.now(f"waiting for the broker to subscribe this client to {topics}")
        yield connector.subscribe(*(t.encode() for t in args.topics)).addTimeout(
            args.timeout, reactor
        )
        _err(f"subscribed to {topics}")
        args.progress.now(f"following {topics}", printed)

    def finish(result: Any) -> Any:
        connector.stop()
        return result

    def failed(failure: Any) -> None:
        if not done.called:
            done.errback(failure)

    run().addErrback(failed)
    reactor.addSystemEventTrigger("before", "shutdown", connector.stop)
    return done.addBoth(finish)


@defer.inlineCallbacks
def ping(reactor: Any, args: argparse.Namespace) -> Any:
    """``mc0-cli ping``: time the connection and ``--count`` NOOP round trips, printed as JSON."""
    connector = _connector(reactor, args)
    try:
        started = time.perf_counter()
        yield _connected(reactor, connector, args, "no NOOP sent")
        connected = time.perf_counter() - started
        times: list[float] = []
        for number in range(1, args.count + 1):
            args.progress.now(
                f"waiting for the answer to NOOP {number} of {args.count}",
                f"{len(times)} of {args.count} NOOPs answered, nothing printed",
            )
            sent = time.perf_counter()
            yield connector.noop().addTimeout(args.timeout, reactor)
            times.append(time.perf_counter() - sent)
        times.sort()
        _out(
            json.dumps(
                {
                    "connect_ms": round(connected * 1000, 3),
                    "noops": len(times),
                    "p50_ms": round(times[len(times) // 2] * 1000, 3),
                    "max_ms": round(times[-1] * 1000, 3),
                }
            )
        )
    finally:
        yield connector.stop()


def _header(text: str) -> tuple[bytes, bytes]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"{text!r}: write KEY=VALUE")
    return key.encode(), value.encode()


def build_parser() -> argparse.ArgumentParser:
    """``mc0-cli``'s command line."""
    parser = CliParser(
        prog="mc0-cli",
        description=__doc__.split("\n\n")[0],
        epilog="Options may stand on either side of the command. Exit status: 0 on success, "
        "1 with one sentence on stderr otherwise, 2 for a bad option.",
    )
    add_version(parser)
    parser.add_argument(
        "--server",
        action="append",
        type=tcp_endpoint,
        help=f"broker endpoint ({DEFAULT_SERVER}); repeat it for brokers of one topic space "
        "over NATS: a session goes to the next when one dies",
    )
    parser.add_argument("--server-key", help="broker public key: 40 Z85 characters or a .key file")
    parser.add_argument("--cert", help="this client's NAME.key_secret (default: a fresh key pair)")
    parser.add_argument("--plain", action="store_true", help="no CURVE (a --plain broker)")
    parser.add_argument("--ttl", default=30.0, type=duration, help="session TTL (30s)")
    parser.add_argument("--framing", choices=["delimited", "spec"], default="delimited")
    parser.add_argument(
        "--timeout", type=positive_seconds, default=10.0, help="seconds to wait for answers"
    )
    commands = parser.add_subparsers(dest="command", required=True)

    p = commands.add_parser("put", help="PUT one message and wait for its OK")
    p.add_argument("topic")
    p.add_argument("body", nargs="+", help="body frames")
    p.add_argument(
        "--header", action="append", default=[], type=_header, help="KEY=VALUE (repeatable)"
    )
    p.set_defaults(run=put)

    p = commands.add_parser("sub", help="print the MESSAGEs of topics as they come")
    p.add_argument("topics", nargs="+")
    p.add_argument(
        "--count", type=whole_number(0), default=0, help="exit after this many (0: never)"
    )
    p.set_defaults(run=sub)

    p = commands.add_parser("ping", help="time NOOP round trips")
    p.add_argument("--count", type=whole_number(1), default=10)
    p.set_defaults(run=ping)
    return parser


@interruptible("mc0-cli")
def main(argv: Sequence[str] | None = None) -> None:
    """Run ``mc0-cli`` on ``argv`` (default: the command line)."""
    import zmq

    from bus.mc0.client import Mc0CommandError, Mc0ConnectionLost
    from bus.transport.curve import KeyFileError

    args = parse(build_parser(), argv)
    args.servers = args.server or [DEFAULT_SERVER]
    args.progress = Progress(f"mc0-cli {args.command}")
    try:  # checked before anything runs, as the other options are
        args.keys = _keys(args)
    except (ValueError, KeyFileError) as error:
        _err(f"mc0-cli {args.command}: {one_line(error)}")
        raise SystemExit(1) from None

    def describe(error: BaseException) -> object:
        if isinstance(error, defer.TimeoutError):
            return "no answer in time"
        if isinstance(error, zmq.ZMQError):
            return f"cannot connect to {', '.join(args.servers)}: {zmq.strerror(error.errno or 0)}"
        return error

    react(
        f"mc0-cli {args.command}",
        lambda reactor: args.run(reactor, args),
        (defer.TimeoutError, zmq.ZMQError, ValueError, OSError, KeyFileError, Mc0CommandError,
         Mc0ConnectionLost),
        describe,
        progress=args.progress,
    )  # fmt: skip


if __name__ == "__main__":
    main()
