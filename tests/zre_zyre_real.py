"""The real zyre (C, git master, built from source) beside our node, in network namespaces
the caller creates: finding the built peer program, and one election run.

zyre is on no package registry; bench/README.md ("zyre") says how to build it and
``bench/zre_zyre_peer.c`` (a JSON-line zyre node). ``ZYRE_PEER`` names the built program
(default ``/tmp/zre-build/zre_zyre_peer_drafts``, then ``/tmp/zre-build/zre_zyre_peer``).
"""

from __future__ import annotations

import json
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from tests.netns import Hosts, LinePeer, poll_until

HERE = Path(__file__).parent
BUS_PEER = HERE / "zre_peers" / "bus_peer.py"
_CANDIDATES = ("/tmp/zre-build/zre_zyre_peer_drafts", "/tmp/zre-build/zre_zyre_peer")


def zyre_peer_program() -> str | None:
    """The built zre_zyre_peer, or None."""
    for candidate in (os.environ.get("ZYRE_PEER", ""), *_CANDIDATES):
        if candidate and os.access(candidate, os.X_OK):
            return candidate
    return None


SKIP_REASON = (
    "the real zyre is not built here: build it and bench/zre_zyre_peer.c as bench/README.md "
    "says (zyre is on no package registry), or set ZYRE_PEER to the built program"
)

#: Our node's timers in these runs (the zyres beacon every 250 ms too).
FAST = {"beacon_interval": 0.25, "reap_interval": 0.1}


def start_zyre(
    program: str, hosts: Hosts, host: str, name: str, log_dir: Path, *args: str
) -> LinePeer:
    iface = f"h{hosts.names.index(host)}{hosts.tag}"
    argv = [*hosts.prefix(host), program, name, "--interface", iface, *args]
    return LinePeer(argv, log_dir / f"{name}.log")


def start_ours(
    hosts: Hosts, host: str, name: str, log_dir: Path, groups: list[str], **settings: object
) -> LinePeer:
    iface = f"h{hosts.names.index(host)}{hosts.tag}"
    options = json.dumps({**FAST, **settings})
    argv = [*hosts.prefix(host), sys.executable, str(BUS_PEER), name, "5670", iface, options]
    return LinePeer([*argv, *groups], log_dir / f"{name}.log")


@dataclass(slots=True)
class ElectionRun:
    """Each node's last reported leader (upper-case id; None: none), by node name."""

    fourth: str
    position: int
    leaders: dict[str, str | None] = field(default_factory=dict)
    #: Each node's UUID (lower-case hex), by node name.
    ids: dict[str, str] = field(default_factory=dict)
    #: Every LEADER each node reported: (wall-clock time it reached us, node, leader id).
    reports: list[tuple[float, str, str]] = field(default_factory=list)

    @property
    def split(self) -> bool:
        return len({leader for leader in self.leaders.values() if leader}) > 1

    @property
    def agreed(self) -> bool:
        values = set(self.leaders.values())
        return len(values) == 1 and None not in values


def _meshed(peers: list[LinePeer], ids: list[str]) -> bool:
    return all(
        all(peer.events("ENTER", other) for other in ids if other != own)
        for peer, own in zip(peers, ids, strict=True)
    )


#: A run is over once no LEADER came for this long (see :func:`election_run`).
QUIET = 1.5


def _settle(peers: list[LinePeer], limit: float, until_all: bool = False) -> None:
    """Wait until no LEADER came for :data:`QUIET` seconds (or, ``until_all``, every peer
    reported one), at most ``limit`` seconds."""
    deadline = time.monotonic() + limit
    quiet_since, seen = time.monotonic(), -1
    while time.monotonic() < deadline:
        count = sum(len(p.events("LEADER")) for p in peers)
        if count != seen:
            quiet_since, seen = time.monotonic(), count
        if until_all and all(p.events("LEADER") for p in peers):
            return
        if time.monotonic() - quiet_since > QUIET:
            return
        time.sleep(0.05)


def election_run(
    program: str, hosts: Hosts, fourth: str, position: int, log_dir: Path, group: str = "ELG"
) -> ElectionRun:
    """Three zyres contesting ``group`` (hosts 0-2) and a fourth node (host 3: ``"ours"``,
    or ``"zyre"``, a zyre that does not contest) started at ``position`` (0: first; 3: last,
    once the three settled). Each node waits for the mesh before the next starts; the run
    ends once no LEADER came for :data:`QUIET` seconds (every node reported one or not), or
    after 8 s. An election's messages all go in milliseconds; one that stalls stays stalled
    until a peer expires (zyre restarts elections only on a HELLO, JOIN, LEAVE or EXIT), so
    waiting longer changes no run's verdict, only its length."""
    started: list[LinePeer] = []
    ids: list[str] = []
    names: list[str] = []
    verbose = ("--verbose",) if os.environ.get("ZYRE_VERBOSE") else ()
    contest = ("--interval", "250", "--contest", group, "--join", group, *verbose)

    def start(index: int) -> None:
        host = hosts.names[index]
        if index == 3:
            plain = ("--interval", "250", "--join", group)
            peer = (
                start_ours(hosts, host, "fourth", log_dir, [group])
                if fourth == "ours"
                else start_zyre(program, hosts, host, "fourth", log_dir, *plain)
            )
        else:
            peer = start_zyre(program, hosts, host, f"zy{index}", log_dir, *contest)
        started.append(peer)
        names.append("fourth" if index == 3 else f"zy{index}")
        ids.append(peer.ready["peer"])
        poll_until(lambda: _meshed(started, ids), 15, "the mesh")

    try:
        order = [0, 1, 2]
        order.insert(position, 3)
        for index in order:
            if index == 3 and position == 3:
                # Last: once the three zyres each reported a leader, or stalled.
                _settle(started, 6, until_all=True)
            start(index)
        _settle(started, 8)
        run = ElectionRun(fourth, position, ids=dict(zip(names, ids, strict=True)))
        wall = time.time() - time.monotonic()
        for name, peer in zip(names, started, strict=True):
            reports = peer.events("LEADER")
            run.leaders[name] = str(reports[-1]["leader"]).upper() if reports else None
            for line in reports:
                when = wall + peer.arrival(line)
                run.reports.append((when, name, str(line["leader"]).upper()))
        return run
    finally:
        for peer in started:
            peer.stop()
