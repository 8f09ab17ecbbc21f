"""``twistd -n zre``: one ZRE node; composed, the ``zre`` service of ``twistd -n eventbus``
(options prefixed ``--zre-``), publishing the network's membership on the bus under
``/zre/...``. Options also come from ``ZRE_<OPTION>`` variables and the ``[zre]`` table of
a ``--config`` file."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from twisted.python import usage

from bus.extension import ServiceOptions, parse_duration

if TYPE_CHECKING:
    from bus.extension import Composition, ProductService
    from bus.zre.config import ZreConfig
    from bus.zre.node import ZreNode

from bus.zre.config import DEFAULT_PORT

#: Started after the Event BUS when both run: composed, it publishes its activity
#: onto the local bus (the bridge journals it), which the Event BUS's build provides.
AFTER = ("eventbus",)


class Options(ServiceOptions):
    """``twistd zre``'s options (``--zre-*`` of ``twistd eventbus``)."""

    service = "zre"
    env_prefix = "ZRE"
    synopsis = "[--name NAME] [--interface lo] [--group G]... [--peer tcp://HOST:PORT]..."
    longdesc = (
        "Run a ZRE node: a UDP beacon on the interface's broadcast address (loopback by "
        "default), a mailbox on an ephemeral port, groups, WHISPER and SHOUT. 36/ZRE (zyre, "
        "pyre) by default; --version 1 speaks the 20/ZRE draft with its ZRE/LOG service."
    )
    optParameters = [
        ["name", None, "", "The node's name (default: the first 6 hex digits of its UUID)."],
        ["interface", None, "lo", "Network interface for beacons and the mailbox."],
        [
            "port",
            None,
            None,
            f"UDP beacon port (0: no beacon, --peer only; default {DEFAULT_PORT}, or none "
            "with --gossip-bind/--gossip-connect, as zyre's gossip mode).",
            int,
        ],
        ["version", None, "2", "2: 36/ZRE (zyre, pyre); 1: the 20/ZRE draft with ZRE/LOG."],
        ["evasive", None, "5s", "Silence after which a peer is pinged (EVASIVE)."],
        ["expired", None, "30s", "Silence after which a peer is gone (EXIT)."],
        ["beacon-interval", None, "1s", "Time between beacons."],
        [
            "max-pending-peers",
            None,
            100,
            "Peers found by beacon and not greeted yet, at most (more are refused, counted).",
            int,
        ],
        ["pending-expired", None, "5s", "A peer found by beacon without HELLO this long: gone."],
        [
            "cert",
            None,
            None,
            "Speak CURVE with this secret key (NAME.key_secret), as zyre with a certificate: "
            "beacon version 3 with the public key, meeting only nodes that do the same.",
        ],
        [
            "peer-certs",
            None,
            None,
            "With --cert: meet only peers whose public keys are in this directory's *.key "
            "files (re-read when it changes).",
        ],
        [
            "gossip-bind",
            None,
            None,
            "Run a ZGOSSIP hub on tcp://HOST:PORT (zyre_gossip_bind): discovery without UDP "
            "(with --cert: over CURVE).",
        ],
    ]
    optMulti = [
        ["group", None, "Group to join."],
        ["header", None, "HELLO header as KEY=VALUE."],
        [
            "peer",
            None,
            "Mailbox endpoint tcp://HOST:PORT of a peer to greet without UDP (with --cert: "
            "tcp://HOST:PORT|KEY, the peer's Z85 public key).",
        ],
        [
            "gossip-connect",
            None,
            "A ZGOSSIP hub tcp://HOST:PORT to be a client of (zyre_gossip_connect); "
            "tcp://HOST:PORT|KEY (with --cert): over CURVE, KEY the hub's Z85 public key.",
        ],
    ]

    def opt_version(self, value: str) -> None:  # type: ignore[override]
        """2: 36/ZRE (zyre, pyre); 1: the 20/ZRE draft with ZRE/LOG."""
        # Replaces usage.Options' --version (which prints Twisted's): the issue's spelling.
        self["version"] = value

    def postOptions(self) -> None:
        self["zre-config"] = config_from_options(self)


def config_from_options(options: usage.Options | dict[str, Any]) -> ZreConfig:
    """The node's settings from its options; a usage error names the option at fault."""
    from bus.zre.config import ZreConfig

    version = str(options["version"]).strip()
    if version not in ("1", "2"):
        raise usage.UsageError("--version must be 2 (36/ZRE) or 1 (20/ZRE)")
    port = None if options.get("port") is None else int(options["port"])
    if port is not None and not 0 <= port <= 65535:
        raise usage.UsageError("--port must be 0-65535")
    headers: dict[str, str] = {}
    for item in options.get("header") or []:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise usage.UsageError(f"--header wants KEY=VALUE, not {item!r}")
        headers[key] = value
    cert = options.get("cert") or None
    certs = options.get("peer-certs") or None
    if certs and not cert:
        raise usage.UsageError("--peer-certs needs --cert (CURVE)")
    for given in options.get("peer") or []:
        endpoint, _, key = given.partition("|")
        host, _, number = endpoint.removeprefix("tcp://").rpartition(":")
        if not endpoint.startswith("tcp://") or not host or not number.isdigit():
            raise usage.UsageError(f"--peer wants tcp://HOST:PORT, not {given!r}")
        if cert and len(key) != 40:
            raise usage.UsageError(f"--peer with --cert wants tcp://HOST:PORT|KEY, not {given!r}")
    gossip_bind = options.get("gossip-bind") or None
    if gossip_bind is not None and not _is_tcp_endpoint(gossip_bind):
        raise usage.UsageError(f"--gossip-bind wants tcp://HOST:PORT, not {gossip_bind!r}")
    gossip_connect = list(options.get("gossip-connect") or [])
    for given in gossip_connect:
        endpoint, bar, key = given.partition("|")
        if not _is_tcp_endpoint(endpoint) or (bar and len(key) != 40):
            raise usage.UsageError(
                f"--gossip-connect wants tcp://HOST:PORT or tcp://HOST:PORT|KEY, not {given!r}"
            )
        if bar and not cert:
            raise usage.UsageError("--gossip-connect with a hub's KEY needs --cert (CURVE)")
    name = options.get("name") or ""
    if len(name.encode()) > 255:
        raise usage.UsageError("--name is at most 255 octets")
    evasive = parse_duration(options["evasive"])
    expired = parse_duration(options["expired"])
    if not 0 < evasive < expired:
        raise usage.UsageError("--evasive must be above 0 and below --expired")
    interval = parse_duration(options["beacon-interval"])
    if interval <= 0:
        raise usage.UsageError("--beacon-interval must be above 0")
    max_pending = int(options.get("max-pending-peers", 100))
    if max_pending < 1:
        raise usage.UsageError("--max-pending-peers must be at least 1")
    pending_expired = parse_duration(options.get("pending-expired", "5s"))
    if pending_expired <= 0:
        raise usage.UsageError("--pending-expired must be above 0")
    return ZreConfig(
        name=name,
        interface=options["interface"],
        port=port,
        groups=list(options.get("group") or []),
        headers=headers,
        version=int(version),
        peers=list(options.get("peer") or []),
        evasive=evasive,
        expired=expired,
        beacon_interval=interval,
        max_pending_peers=max_pending,
        pending_expired=pending_expired,
        cert=Path(cert) if cert else None,
        peer_certs=Path(certs) if certs else None,
        gossip_bind=gossip_bind,
        gossip_connect=gossip_connect,
    )


def _is_tcp_endpoint(endpoint: str) -> bool:
    host, _, number = endpoint.removeprefix("tcp://").rpartition(":")
    # libzmq takes a port beyond 65535 modulo 65536, in silence.
    port_ok = number == "*" or (number.isdigit() and int(number) <= 65535)
    return endpoint.startswith("tcp://") and bool(host) and port_ok


def build(options: usage.Options | dict[str, Any], composition: Composition) -> ZreNode:
    """The node; composed with the Event BUS, its events go onto the bus under ``/zre/``."""
    from bus.zre.node import ZreNode

    config = options.get("zre-config") or config_from_options(options)
    return ZreNode(config, activity=composition.activity("zre"))


def makeService(options: usage.Options | dict[str, Any]) -> ProductService:
    """The node alone (``twistd -n zre``)."""
    from bus.extension import standalone

    return standalone("zre", build, options)
