"""``dbp-cli services [NAME]``: ask the catalog (found by its SHALOM beacon unless
``--catalog`` names it) for every active service, or one, and print the answer as JSON.

``--dialect hermes`` asks Hermes' own catalog, which reads only 4-octet (float32) times.
Options may stand before ``services`` too (``dbp-cli --dialect hermes services``). A bad
option is one line on stderr and exit status 2; no answer, one line and exit status 1."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from typing import Any

from bus.dbp.config import DEFAULT_BEACON_PORT
from bus.transport.curve_settings import add_client_curve_arguments
from bus.util.cliargs import (
    CliParser,
    add_version,
    one_line,
    parse,
    positive_seconds,
    tcp_endpoint,
    whole_number,
)


def parser() -> argparse.ArgumentParser:
    """``dbp-cli``'s command line."""
    p = CliParser(prog="dbp-cli", description=__doc__.split("\n\n")[0])
    add_version(p)
    sub = p.add_subparsers(dest="command", required=True)
    services = sub.add_parser(
        "services",
        help="list active services, or one",
        description="Its options may also come before `services`.",
    )
    services.add_argument("name", nargs="?", default="", help="one service's name")
    services.add_argument(
        "--catalog", default=None, type=tcp_endpoint, help="tcp://HOST:PORT (default: by beacon)"
    )
    services.add_argument("--beacon-port", type=whole_number(1, 65535), default=DEFAULT_BEACON_PORT)
    services.add_argument("--timeout", type=positive_seconds, default=5.0, help="seconds to wait")
    services.add_argument(
        "--dialect",
        choices=("spec", "hermes"),
        default="spec",
        help="spec: 8-octet times (default); hermes: Hermes' catalog (4-octet times)",
    )
    add_client_curve_arguments(services)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``dbp-cli`` on ``argv`` (default: the command line); the exit status."""
    p = parser()
    args = parse(p, argv)
    import zmq
    from twisted.internet import defer

    from bus.dbp.client import CatalogClient, find_catalog
    from bus.transport.curve import KeyFileError, client_curve

    result: dict[str, Any] = {}
    try:
        curve = client_curve(args.server_key, args.cert)
    except KeyFileError as error:
        sys.stderr.write(f"dbp-cli: {error}\n")
        return 1

    @defer.inlineCallbacks
    def run(reactor: Any) -> Any:
        endpoint = args.catalog
        if not endpoint:
            try:
                endpoint = yield find_catalog(reactor, args.beacon_port, args.timeout)
            except (TimeoutError, OSError) as error:
                result["error"] = str(error)
                return
        try:
            client = CatalogClient(endpoint, reactor, dialect=args.dialect, curve=curve)
        except zmq.ZMQError as error:
            result["error"] = f"cannot connect to {endpoint}: {zmq.strerror(error.errno or 0)}"
            return
        try:
            answer = client.services(args.name)
            timer = reactor.callLater(args.timeout, answer.cancel)
            try:
                result["answer"] = yield answer
            except defer.CancelledError:
                result["error"] = f"no answer from {endpoint} in {args.timeout:g}s"
                if args.dialect == "spec":
                    # Hermes' own catalog stops answering at the spec's 8-octet time.
                    result["error"] += " (if it is Hermes' own catalog: --dialect hermes)"
            else:
                timer.cancel()
        finally:
            client.close()

    _react(run, result)
    if "answer" not in result:
        reason = result.get("error", "no answer")
        sys.stderr.write(f"dbp-cli {args.command}: {one_line(reason)}\n")
        return 1
    answer = result["answer"]
    sys.stdout.write(json.dumps(answer, indent=1, sort_keys=True) + "\n")
    return 1 if args.name and "Error" in answer else 0


def _react(run: Any, result: dict[str, Any]) -> None:
    from twisted.internet import reactor as global_reactor

    reactor: Any = global_reactor

    def unexpected(failure: Any) -> None:  # a defect of this tool: still one line
        value = failure.value
        result["error"] = f"unexpected {type(value).__name__} ({value}): please report it"

    done = run(reactor)
    done.addErrback(unexpected)
    done.addBoth(lambda _: reactor.callLater(0, reactor.stop))
    reactor.run()


if __name__ == "__main__":
    raise SystemExit(main())
