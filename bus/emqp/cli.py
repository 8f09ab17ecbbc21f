"""``emqp-cli``: submit a request to an eMQP broker, or show its status.

    emqp-cli submit default '["run", {"path": "os.path", "callable": "join", "args": ["a", "b"]}]'
    emqp-cli submit emails '{"to": "x"}' --no-reply --guarantee --retries 3
    emqp-cli status

``submit`` prints the worker's value as JSON (or, with ``--no-reply``, the request's id once a
worker has it) and exits 1 with the broker's reason when the request failed.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from typing import Any

from twisted.internet import defer, task

DEFAULT_BROKER = os.environ.get("EMQP_BROKER", "tcp://127.0.0.1:47291")
DEFAULT_ADMIN = os.environ.get("EMQP_ADMIN", "tcp://127.0.0.1:47293")


def _endpoint(text: str) -> str:
    return text if "://" in text else f"tcp://{text}"


@defer.inlineCallbacks
def submit(reactor: Any, args: argparse.Namespace) -> Any:
    from bus.emqp.client import EmqpClient, JobFailed

    try:
        body = json.loads(args.body)
    except json.JSONDecodeError as error:
        raise ValueError(f"BODY is not JSON: {error}") from None
    client = EmqpClient(_endpoint(args.broker), reactor)
    submitted = client.submit(
        args.queue,
        body,
        reply=not args.no_reply,
        guarantee=args.guarantee,
        retries=args.retries,
        timeout=args.timeout,
    )
    waiting = reactor.callLater(args.wait, submitted.cancel) if args.wait > 0 else None
    try:
        value = yield submitted
    except JobFailed as failed:
        reason = f"{failed.reason}: {failed.message}"
        raise ValueError(f"request {failed.msgid} failed: {reason}") from None
    except defer.CancelledError:
        raise TimeoutError(f"no answer from {args.broker} within {args.wait}s") from None
    finally:
        if waiting is not None and waiting.active():
            waiting.cancel()
        client.close()
    sys.stdout.write(json.dumps(value) + "\n")


@defer.inlineCallbacks
def status(reactor: Any, args: argparse.Namespace) -> Any:
    from bus.emqp.client import query_status

    value = yield query_status(_endpoint(args.admin), reactor, timeout=args.wait)
    sys.stdout.write(json.dumps(value, indent=1, sort_keys=True) + "\n")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="emqp-cli", description=__doc__.split("\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    sub = commands.add_parser("submit", help="send a REQUEST and print its result")
    sub.add_argument("queue")
    sub.add_argument("body", help="the request body, JSON")
    sub.add_argument("--broker", default=DEFAULT_BROKER, help="client port [%(default)s]")
    sub.add_argument("--no-reply", action="store_true", help="only wait for the dispatch")
    sub.add_argument("--guarantee", action="store_true", help="stored until its worker replies")
    sub.add_argument("--retries", type=int, default=0, help="re-dispatches allowed")
    sub.add_argument("--timeout", type=int, default=0, help="seconds a worker has (0: none)")
    sub.add_argument("--wait", type=float, default=0, help="give up after this long (0: never)")
    sub.set_defaults(run=submit)
    sub = commands.add_parser("status", help="print the broker's STATUS as JSON")
    sub.add_argument("--admin", default=DEFAULT_ADMIN, help="admin port [%(default)s]")
    sub.add_argument("--wait", type=float, default=5.0, help="give up after this long")
    sub.set_defaults(run=status)
    return parser


def main(argv: Sequence[str] | None = None) -> None:
    args = build_parser().parse_args(argv)

    def explain(failure: Any) -> None:
        failure.trap(ValueError, OSError, TimeoutError)
        sys.stderr.write(f"emqp-cli {args.command}: {failure.value}\n")
        raise SystemExit(1)

    task.react(lambda reactor: args.run(reactor, args).addErrback(explain))


if __name__ == "__main__":
    main()
