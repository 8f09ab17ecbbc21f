"""``dbp-cli services [NAME]``: ask the catalog (found by its SHALOM beacon unless
``--catalog`` names it) for every active service, or one, and print the answer as JSON.

``--dialect hermes`` asks Hermes' own catalog, which reads only 4-octet (float32) times."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from typing import Any

from bus.dbp.config import DEFAULT_BEACON_PORT
from bus.transport.curve_settings import add_client_curve_arguments


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="dbp-cli", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="command", required=True)
    services = sub.add_parser("services", help="list active services, or one")
    services.add_argument("name", nargs="?", default="", help="one service's name")
    services.add_argument("--catalog", default="", help="tcp://HOST:PORT (default: by beacon)")
    services.add_argument("--beacon-port", type=int, default=DEFAULT_BEACON_PORT)
    services.add_argument("--timeout", type=float, default=5.0, help="seconds to wait")
    services.add_argument(
        "--dialect",
        choices=("spec", "hermes"),
        default="spec",
        help="spec: 8-octet times (default); hermes: Hermes' catalog (4-octet times)",
    )
    add_client_curve_arguments(services)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
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
            except TimeoutError as error:
                result["error"] = str(error)
                return
        client = CatalogClient(endpoint, reactor, dialect=args.dialect, curve=curve)
        try:
            answer = client.services(args.name)
            timer = reactor.callLater(args.timeout, answer.cancel)
            try:
                result["answer"] = yield answer
            except defer.CancelledError:
                result["error"] = f"no answer from {endpoint} in {args.timeout}s"
                if args.dialect == "spec":
                    # Hermes' own catalog stops answering at the spec's 8-octet time.
                    result["error"] += " (if it is Hermes' own catalog: --dialect hermes)"
            else:
                timer.cancel()
        finally:
            client.close()

    _react(run)
    if "error" in result:
        sys.stderr.write(f"dbp-cli: {result['error']}\n")
        return 1
    answer = result["answer"]
    sys.stdout.write(json.dumps(answer, indent=1, sort_keys=True) + "\n")
    return 1 if args.name and "Error" in answer else 0


def _react(run: Any) -> None:
    from twisted.internet import reactor as global_reactor

    reactor: Any = global_reactor
    done = run(reactor)
    done.addErrback(lambda failure: sys.stderr.write(failure.getTraceback()))
    done.addBoth(lambda _: reactor.callLater(0, reactor.stop))
    reactor.run()


if __name__ == "__main__":
    raise SystemExit(main())
