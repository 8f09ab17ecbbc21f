"""``zre-ping``: join groups (``--group``, repeatable), shout a line to each every interval,
greet every peer that enters, and print every event as one JSON line on stdout (like zyre's
zpinger).

The first line is ``{"event": "READY", "peer": <own uuid>, "name": ..., "endpoint": ...}``;
then one line per event with ``event``, ``peer`` (32 hex digits), ``name`` and, where they
apply, ``group``, ``content`` (one item per frame: the text when it is UTF-8, else
``{"base64": ...}``), ``headers``, ``endpoint`` and (LEADER, from zyre's elections)
``leader``. SIGTERM or Ctrl-C leaves cleanly (a
36/ZRE node sends its leaving beacon): SIGTERM with exit status 0, Ctrl-C with one line on
stderr saying what it did and status 130.
"""

from __future__ import annotations

import argparse
import base64
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bus.util.cliargs import Progress, dashed_values, interruptible
from bus.util.memory import freeze_startup_objects
from bus.zre.codec import VERSION_20, VERSION_36
from bus.zre.config import DEFAULT_PORT, ZreConfig
from bus.zre.core import ZreEvent


def content_json(content: Sequence[bytes]) -> list[Any]:
    """Content frames as JSON: text where a frame is UTF-8, else ``{"base64": ...}``."""
    items: list[Any] = []
    for frame in content:
        try:
            items.append(frame.decode("utf-8"))
        except UnicodeDecodeError:
            items.append({"base64": base64.b64encode(frame).decode("ascii")})
    return items


def event_json(event: ZreEvent) -> dict[str, Any]:
    """One node event as the JSON line ``zre-ping`` prints."""
    line: dict[str, Any] = {"event": event.type, "peer": event.peer_hex, "name": event.name}
    if event.group is not None:
        line["group"] = event.group
    if event.type in ("WHISPER", "SHOUT"):
        line["content"] = content_json(event.content)
    if event.type == "ENTER":
        line["headers"] = dict(event.headers)
    if event.endpoint:
        line["endpoint"] = event.endpoint
    if event.type == "LEADER":
        line["leader"] = event.leader
    return line


def emit(line: dict[str, Any]) -> None:
    """Print ``line`` as one JSON line on stdout, at once."""
    sys.stdout.write(json.dumps(line, sort_keys=True) + "\n")
    sys.stdout.flush()


def parser() -> argparse.ArgumentParser:
    """``zre-ping``'s command line."""
    from bus.util.cliargs import (
        CliParser,
        add_version,
        bind_endpoint,
        duration,
        port,
        tcp_endpoint,
    )

    def peer(text: str) -> str:
        """``tcp://HOST:PORT`` (a host that resolves), with ``|KEY`` for CURVE."""
        endpoint, bar, key = text.partition("|")
        return tcp_endpoint(endpoint) + bar + key

    p = CliParser(prog="zre-ping", description=__doc__.split("\n\n")[0])
    add_version(p)
    p.add_argument("--interface", default="lo", help="network interface (default lo)")
    p.add_argument(
        "--group",
        action="append",
        default=[],
        help="group to join and shout to (repeatable; default GLOBAL)",
    )
    p.add_argument("--name", default="", help="this node's name")
    p.add_argument(
        "--zre-version",
        choices=["1", "2"],
        default="2",
        help="2: 36/ZRE, 1: 20/ZRE (as twistd -n eventbus spells it; --version 1 also works)",
    )
    p.add_argument(
        "--peer",
        action="append",
        default=[],
        type=peer,
        help="tcp://HOST:PORT to greet (with --cert: tcp://HOST:PORT|KEY)",
    )
    p.add_argument(
        "--cert",
        type=Path,
        default=None,
        help="speak CURVE with this secret key (NAME.key_secret), as zyre with a certificate",
    )
    p.add_argument(
        "--peer-certs",
        type=Path,
        default=None,
        help="with --cert: meet only peers whose keys are in this directory's *.key files",
    )
    p.add_argument(
        "--gossip-bind",
        default=None,
        type=bind_endpoint,
        help="run a ZGOSSIP hub on tcp://HOST:PORT (zyre_gossip_bind)",
    )
    p.add_argument(
        "--gossip-connect",
        action="append",
        default=[],
        type=peer,
        help="a ZGOSSIP hub tcp://HOST:PORT to be a client of (with --cert: |KEY for CURVE)",
    )
    p.add_argument("--interval", type=duration, default=1.0, help="between shouts")
    p.add_argument(
        "--port",
        type=port,
        default=None,
        help=f"UDP beacon port (0: off; default {DEFAULT_PORT}, or off with --gossip-*)",
    )
    p.add_argument("--evasive", type=duration, default=5.0)
    p.add_argument("--expired", type=duration, default=30.0)
    return p


def former_spelling(argv: Sequence[str]) -> list[str]:
    """``--version 1|2`` (its spelling before 0.1.1, and twistd -n zre's) as ``--zre-version``:
    ``--version`` alone prints the version of bus."""
    args = list(argv)
    for index, arg in enumerate(args):
        if arg == "--":
            break
        if arg.startswith("--version="):
            args[index] = "--zre-version=" + arg.partition("=")[2]
        elif arg == "--version" and index + 1 < len(args) and not args[index + 1].startswith("-"):
            args[index] = "--zre-version"
    return args


@interruptible("zre-ping")
def main(argv: Sequence[str] | None = None) -> int:
    """Run ``zre-ping`` on ``argv`` (default: the command line) until SIGTERM (exit status 0)
    or Ctrl-C (one line saying what it did, status 130)."""
    p = parser()
    args = p.parse_args(dashed_values(p, former_spelling(sys.argv[1:] if argv is None else argv)))
    groups = list(dict.fromkeys(args.group)) or ["GLOBAL"]
    from twisted.internet import reactor as global_reactor

    from bus.extension import StartupError
    from bus.util.periodic import Periodic
    from bus.zre.node import ZreNode, log

    config = ZreConfig(
        name=args.name,
        interface=args.interface,
        port=args.port,
        groups=groups,
        version=VERSION_20 if args.zre_version == "1" else VERSION_36,
        peers=list(args.peer),
        evasive=args.evasive,
        expired=args.expired,
        cert=args.cert,
        peer_certs=args.peer_certs,
        gossip_bind=args.gossip_bind,
        gossip_connect=list(args.gossip_connect),
    )
    if args.peer_certs and not args.cert:
        sys.stderr.write("zre-ping: --peer-certs needs --cert\n")
        return 2
    if any("|" in hub for hub in args.gossip_connect) and not args.cert:
        sys.stderr.write("zre-ping: --gossip-connect with a hub's KEY needs --cert\n")
        return 2
    reactor: Any = global_reactor
    progress = Progress("zre-ping", "starting its node", "nothing sent")
    # Before the READY line: from then on a Ctrl-C stops the reactor, not the program.
    progress.catch(reactor)
    node = ZreNode(config, reactor=reactor)
    shouts = events = peers = 0

    def on_event(event: ZreEvent) -> None:
        nonlocal events, peers
        emit(event_json(event))
        events += 1
        peers += event.type == "ENTER"
        if event.type == "ENTER":
            node.whisper(event.peer, [f"hello from {node.node_name}".encode()])

    def shout() -> None:
        nonlocal shouts
        shouts += 1
        for group in groups:
            node.shout(group, [f"ping {shouts} from {node.node_name}".encode()])

    node.add_listener(on_event)
    # As the product does once its services started (bus.application.composition): what importing made
    # leaves the collector's scans, so no full collection (20-30 ms) stalls the node later.
    freeze_startup_objects()
    try:
        node.startService()
    except StartupError as error:
        sys.stderr.write(f"zre-ping: {error}\n")
        return 2
    ready = {"event": "READY", "peer": node.uuid_hex, "name": node.node_name}
    ready["endpoint"] = node.endpoint
    if node.gossip_endpoint:
        ready["gossip_endpoint"] = node.gossip_endpoint
    emit(ready)
    progress.now(
        f"meeting peers in {', '.join(groups)} as {node.node_name}",
        lambda: (
            f"{shouts} shout(s) sent to each group, {peers} peer(s) met, "
            f"{events} event(s) printed; it has left the network"
        ),
    )
    periodic = Periodic(reactor, log)
    periodic.every(args.interval, shout)

    def stop() -> Any:
        periodic.stop_all()
        return node.stopService()

    reactor.addSystemEventTrigger("before", "shutdown", stop)
    reactor.run()
    if progress.interrupted:
        progress.end()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
