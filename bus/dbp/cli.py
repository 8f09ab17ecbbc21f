"""``dbp-cli services [NAME]``: ask the catalog (found by its SHALOM beacon unless
``--catalog`` names it) for every active service, or one, and print the answer as JSON.

``--dialect hermes`` asks Hermes' own catalog, which reads only 4-octet (float32) times.
Options may stand before ``services`` too (``dbp-cli --dialect hermes services``). A bad
option is one line on stderr and exit status 2; no answer, one line and exit status 1;
Ctrl-C, one line and exit status 130."""

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
    Progress,
    add_version,
    fail,
    interruptible,
    parse,
    positive_seconds,
    react,
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


class NoAnswer(Exception):
    """The command got no answer: its message says from where and what to try."""


@interruptible("dbp-cli")
def main(argv: Sequence[str] | None = None) -> None:
    """Run ``dbp-cli`` on ``argv`` (default: the command line) and exit with its status."""
    p = parser()
    args = parse(p, argv)
    import zmq
    from twisted.internet import defer

    from bus.dbp.client import CatalogClient, find_catalog
    from bus.transport.curve import KeyFileError, client_curve

    try:
        curve = client_curve(args.server_key, args.cert)
    except KeyFileError as error:
        fail("dbp-cli", error)
    progress = Progress(f"dbp-cli {args.command}")

    @defer.inlineCallbacks
    def run(reactor: Any) -> Any:
        endpoint = args.catalog
        if not endpoint:
            progress.now(
                f"waiting for a catalog's beacon on UDP port {args.beacon_port}", "nothing asked"
            )
            try:
                endpoint = yield find_catalog(reactor, args.beacon_port, args.timeout)
            except (TimeoutError, OSError) as error:
                raise NoAnswer(str(error)) from None
        try:
            client = CatalogClient(endpoint, reactor, dialect=args.dialect, curve=curve)
        except zmq.ZMQError as error:
            raise NoAnswer(
                f"cannot connect to {endpoint}: {zmq.strerror(error.errno or 0)}"
            ) from None
        try:
            progress.now(f"waiting for {endpoint} to answer", "asked, nothing printed")
            answer = client.services(args.name)
            timer = reactor.callLater(args.timeout, answer.cancel)
            try:
                found = yield answer
            except defer.CancelledError:
                why = f"no answer from {endpoint} in {args.timeout:g}s"
                if args.dialect == "spec":
                    # Hermes' own catalog stops answering at the spec's 8-octet time.
                    why += " (if it is Hermes' own catalog: --dialect hermes)"
                raise NoAnswer(why) from None
            finally:
                if timer.active():
                    timer.cancel()
        finally:
            client.close()
        sys.stdout.write(json.dumps(found, indent=1, sort_keys=True) + "\n")
        if args.name and "Error" in found:
            raise SystemExit(1)

    react(f"dbp-cli {args.command}", run, (NoAnswer,), progress=progress)


if __name__ == "__main__":
    main()
