"""ZRE over CURVE as zyre with a certificate speaks it (beacon version 3 with the public key,
X-PUBLICKEY in HELLO, CURVE mailboxes), through real sockets on loopback: two CURVE nodes
meet and talk, a CURVE node and a plain one never meet, an allow-list of peer keys refuses
the others (changed without a restart), and a key zyre would ignore (a first octet of zero)
is met."""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import pytest_twisted
import zmq
from zmq.utils import z85

from bus.testing import wait_until
from bus.transport.certs import write_certificate
from bus.zre import codec
from bus.zre.node import ZreNode
from tests.netns import LinePeer, NamespacePair, netns_pair, poll_until
from tests.zre_helpers import EventLog, fast_config, free_udp_port

__all__ = ["netns_pair"]

NodeMaker = Callable[..., tuple[ZreNode, EventLog]]


def cert(directory: Path, name: str, zero_first: bool = False) -> tuple[Path, bytes]:
    """A node's key pair written as NAME.key_secret (and NAME.key); its public key."""
    while True:
        public, secret = zmq.curve_keypair()
        if not zero_first or z85.decode(public)[0] == 0:
            break
    write_certificate(directory, name, public, secret, {})
    return directory / f"{name}.key_secret", public


def meets(node: ZreNode, other: ZreNode) -> Callable[[], bool]:
    return lambda: other.uuid in node.peers() and node.uuid in other.peers()


def test_curve_beacons_round_trip_and_a_zero_first_octet_is_a_key() -> None:
    node = bytes(range(16))
    key = bytes([0]) + bytes(range(1, 32))
    data = codec.encode_beacon(node, 0xC001, key)
    assert len(data) == 54 and data[:4] == b"ZRE\x03"
    assert codec.parse_beacon(data) == codec.Beacon(node, 0xC001, key)
    assert codec.parse_beacon(codec.encode_beacon(node, 0xC001)).public_key is None
    with pytest.raises(codec.ZreError, match="20/ZRE has no CURVE beacon"):
        codec.parse_beacon(data, codec.VERSION_20)
    with pytest.raises(codec.ZreError):
        codec.parse_beacon(data[:53])


@pytest_twisted.inlineCallbacks
def test_two_curve_nodes_talk_and_never_meet_a_plain_one(
    make_node: NodeMaker, tmp_path: Path
) -> Any:
    port = free_udp_port()
    a_cert, a_key = cert(tmp_path, "a")
    b_cert, b_key = cert(tmp_path, "b", zero_first=True)  # zyre would ignore b's beacons
    a, a_events = make_node(fast_config(port, name="a", groups=["G"], cert=a_cert))
    b, b_events = make_node(fast_config(port, name="b", groups=["G"], cert=b_cert))
    plain, plain_events = make_node(fast_config(port, name="plain", groups=["G"]))
    yield wait_until(meets(a, b), what="the CURVE nodes meet")
    enter = a_events.of("ENTER", b.uuid)[0]
    assert enter.headers[codec.PUBLIC_KEY_HEADER] == b_key.decode()
    assert a.whisper(b.uuid, [b"secret", b"two"])
    assert b.shout("G", [b"to the group"]) == 1  # a only: plain is not a peer
    yield wait_until(lambda: b_events.of("WHISPER") and a_events.of("SHOUT"), what="delivery")
    assert b_events.of("WHISPER")[0].content == (b"secret", b"two")
    yield wait_until(
        lambda: a.drops.counts["plain-beacon"] >= 2 and plain.drops.counts["curve-beacon"] >= 2,
        what="each side counting the other's beacons",
    )
    assert plain.peers() == [] and plain_events.of("ENTER") == []
    assert set(a.peers()) == {b.uuid}
    assert a.status()["curve"]["security"] == "curve"
    assert a.status()["curve"]["server_public_key"] == a_key.decode()


@pytest_twisted.inlineCallbacks
def test_a_plain_hello_is_refused_by_a_curve_node(make_node: NodeMaker, tmp_path: Path) -> Any:
    port = free_udp_port()
    a_cert, _ = cert(tmp_path, "a")
    a, _ = make_node(fast_config(port, name="a", cert=a_cert))
    # A plain node told a's mailbox (no key): its HELLO never reaches a's core in plain
    # text, since a's mailbox speaks CURVE only.
    plain, _ = make_node(fast_config(0, name="plain", peers=[a.endpoint]))
    yield wait_until(lambda: a.curve.refusals.get("handshake", 0) >= 1, what="refused")
    assert a.peers() == [] and plain.peers() == []


@pytest_twisted.inlineCallbacks
def test_the_peer_allow_list_refuses_others_and_is_re_read(
    make_node: NodeMaker, tmp_path: Path
) -> Any:
    port = free_udp_port()
    allowed = tmp_path / "peers"
    allowed.mkdir()
    a_cert, _ = cert(tmp_path, "a")
    b_cert, b_key = cert(tmp_path, "b")
    a, a_events = make_node(fast_config(port, name="a", cert=a_cert, peer_certs=allowed))
    b, _ = make_node(fast_config(port, name="b", cert=b_cert))
    yield wait_until(
        lambda: a.drops.counts["refused-key"] >= 1 and a.curve.refusals.get("unknown-key", 0),
        what="a refusing b's beacon and its HELLO's handshake",
    )
    assert a_events.of("ENTER") == []
    write_certificate(allowed, "b", b_key, None, {})
    yield wait_until(meets(a, b), timeout=15, what="b met once on the list")


@pytest.mark.netns
def test_two_curve_nodes_in_namespaces_and_a_plain_one_refused(
    tmp_path: Path, netns_pair: NamespacePair
) -> None:
    """Our nodes in two network namespaces joined by a veth pair (beacons on its 10.x
    broadcast address): over CURVE they meet and talk; a plain node beside one of them
    never meets either."""
    pair = netns_pair
    script = Path(__file__).parent / "zre_peers" / "bus_peer.py"
    fast = {"evasive": 1.0, "expired": 4.0, "beacon_interval": 0.5, "reap_interval": 0.1}
    peers: list[LinePeer] = []

    def node(ns: str, iface: str, name: str, **settings: object) -> LinePeer:
        options = json.dumps({**fast, **settings})
        argv = [sys.executable, str(script), name, "5670", iface, options, "CHAT"]
        peer = LinePeer(argv, tmp_path / f"{name}.log", ns)
        peers.append(peer)
        return peer

    try:
        a_cert, _ = cert(tmp_path, "a")
        b_cert, b_key = cert(tmp_path, "b")
        a = node(pair.a, pair.iface_a, "a", cert=str(a_cert))
        b = node(pair.b, pair.iface_b, "b", cert=str(b_cert))
        plain = node(pair.b, pair.iface_b, "plain")
        a_id, b_id, plain_id = a.ready["peer"], b.ready["peer"], plain.ready["peer"]
        enter = a.wait_for("ENTER", b_id)
        assert enter["endpoint"].startswith(f"tcp://{pair.addr_b}:")
        assert enter["headers"][codec.PUBLIC_KEY_HEADER] == b_key.decode()
        b.wait_for("ENTER", a_id)
        a.send({"shout": "CHAT", "content": ["over", "curve"]})
        assert b.wait_for("SHOUT", a_id)["content"] == ["over", "curve"]
        b.send({"whisper": a_id, "content": ["back"]})
        assert a.wait_for("WHISPER", b_id)["content"] == ["back"]

        def counted() -> bool:
            a.send({"status": True})
            time.sleep(0.2)
            statuses = a.events("STATUS")
            return bool(statuses) and statuses[-1]["dropped"].get("plain-beacon", 0) >= 1

        poll_until(counted, what="a counting the plain node's beacons")
        assert not plain.events("ENTER") and not a.events("ENTER", plain_id)
    finally:
        for peer in peers:
            peer.stop()


@pytest_twisted.inlineCallbacks
def test_zre_ping_and_twistd_zre_take_a_certificate(tmp_path: Path) -> Any:
    import subprocess

    from tests.processes import TWISTD, reported

    port = free_udp_port()
    ping_cert, _ = cert(tmp_path, "ping")
    twistd_cert, _ = cert(tmp_path, "twistd")
    node_cert, _ = cert(tmp_path, "node")
    bin_dir = Path(sys.executable).parent
    log = open(tmp_path / "children.log", "ab")
    children = [
        subprocess.Popen(
            [str(bin_dir / "zre-ping"), "--port", str(port), "--name", "ping", "--cert",
             str(ping_cert), "--interval", "200ms", "--group", "G"],
            stdout=log, stderr=subprocess.STDOUT,
        ),
        subprocess.Popen(
            [TWISTD, "-n", "--pidfile=", "zre", "--port", str(port), "--name", "daemon",
             "--beacon-interval", "100ms", "--cert", str(twistd_cert)],
            stdout=log, stderr=subprocess.STDOUT, cwd=tmp_path,
        ),
    ]  # fmt: skip
    node = ZreNode(fast_config(port, name="node", groups=["G"], cert=node_cert))
    events = EventLog()
    node.add_listener(events)
    node.startService()
    try:
        yield reported(
            lambda: {e.name for e in events.of("ENTER")} >= {"ping", "daemon"},
            *children,
            what="both children met over CURVE",
        )
        yield wait_until(lambda: events.of("SHOUT"), timeout=10, what="zre-ping's shout")
        assert all(codec.PUBLIC_KEY_HEADER in e.headers for e in events.of("ENTER"))
    finally:
        for child in children:
            child.terminate()
            try:
                child.wait(15)
            except subprocess.TimeoutExpired:
                child.kill()
                child.wait()
        log.close()
        yield node.stopService()


@pytest_twisted.inlineCallbacks
def test_zyre_with_a_certificate_and_our_node_talk_over_curve(tmp_path: Path) -> Any:
    """Against the fake of zyre given a certificate (tests/zre_peers/zyre_fake.py, written
    from the real zyre's behaviour in namespaces): it finds us by beacon, we greet it with
    X-PUBLICKEY over its CURVE mailbox, it connects back to ours with our key."""
    from bus.transport.curve import CurveKeyPair
    from tests.zre_peers.zyre_fake import FakeZyre

    port = free_udp_port()
    node_cert, node_key = cert(tmp_path, "node")
    node = ZreNode(fast_config(port, name="bus", groups=["CHAT"], cert=node_cert))
    events = EventLog()
    node.add_listener(events)
    node.startService()
    zyre = FakeZyre(port, groups=["CHAT"], keys=CurveKeyPair.generate())
    plain = ZreNode(fast_config(port, name="plain"))
    plain.startService()
    try:
        yield wait_until(lambda: zyre.uuid in node.peers() and zyre.greeted, what="met")
        hello = next(m for _, m in zyre.received if isinstance(m, codec.Hello))
        assert dict(hello.headers)[codec.PUBLIC_KEY_HEADER] == node_key.decode()
        zyre.shout("CHAT", [b"from zyre"])
        zyre.whisper([b"psst"])
        yield wait_until(lambda: events.of("WHISPER", zyre.uuid), what="zyre's WHISPER")
        assert [e.content for e in events.of("SHOUT", zyre.uuid)] == [(b"from zyre",)]
        assert node.whisper(zyre.uuid, [b"back"])
        yield wait_until(
            lambda: any(isinstance(m, codec.Whisper) for _, m in zyre.received), what="to zyre"
        )
        # The plain node counts zyre's CURVE beacons and never greets it.
        yield wait_until(lambda: plain.drops.counts["curve-beacon"] >= 1, what="counted")
        assert zyre.uuid not in plain.peers()
        assert zyre.downgrades_refused == 0  # no plain HELLO ever reached it
    finally:
        zyre.close()
        yield plain.stopService()
        yield node.stopService()
