"""Our node beside the real zyre (git master d8370f7, built from source with czmq; see
bench/README.md), in network namespaces this test creates and deletes (hosts on a bridge,
10.x addresses). Skipped, with the reason, where zyre is not built (it is on no registry).

* ZGOSSIP both ways: our hub with zyre clients, a zyre hub with our node and a zyre joining
  through it, and the same over CURVE (zyre with a certificate, czmq with its draft API);
* elections: three contesting zyres and our node joining first and last: no split.
  ``bench/zre_zyre_elections.py`` runs many more, with a plain zyre as the control.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import zmq

from bus.transport.certs import write_certificate
from tests.netns import Hosts, LinePeer, make_hosts, poll_until
from tests.zre_zyre_real import (
    BUS_PEER,
    SKIP_REASON,
    election_run,
    start_zyre,
    zyre_peer_program,
)

pytestmark = [
    pytest.mark.netns,
    pytest.mark.skipif(zyre_peer_program() is None, reason=SKIP_REASON),
]


@pytest.fixture
def hosts() -> Iterator[Hosts]:
    made = make_hosts(["n0", "n1", "n2"])
    try:
        yield made
    finally:
        made.delete()


@pytest.fixture
def started() -> Iterator[list[LinePeer]]:
    peers: list[LinePeer] = []
    yield peers
    for peer in peers:
        peer.stop()


def program() -> str:
    found = zyre_peer_program()
    assert found is not None
    return found


def zyre(
    hosts: Hosts, started: list[LinePeer], tmp: Path, host: str, name: str, *args: str
) -> LinePeer:
    endpoint = f"tcp://{hosts.addresses[host]}:*"
    peer = start_zyre(
        program(), hosts, host, name, tmp, "--endpoint", endpoint, "--join", "G", *args
    )
    started.append(peer)
    return peer


def ours(
    hosts: Hosts, started: list[LinePeer], tmp: Path, host: str, name: str, **settings: object
) -> LinePeer:
    iface = f"h{hosts.names.index(host)}{hosts.tag}"
    argv = [*hosts.prefix(host), sys.executable, str(BUS_PEER), name, "0", iface]
    peer = LinePeer(
        [*argv, json.dumps({"reap_interval": 0.1, **settings}), "G"], tmp / f"{name}.log"
    )
    started.append(peer)
    return peer


def meshed(peers: list[LinePeer]) -> None:
    ids = [peer.ready["peer"] for peer in peers]
    for peer, own in zip(peers, ids, strict=True):
        for other in ids:
            if other != own:
                peer.wait_for("ENTER", other, timeout=20)
                peer.wait_for("JOIN", other, timeout=10, group="G")


def test_our_hub_meshes_zyre_clients_and_a_zyre_hub_meshes_ours(
    hosts: Hosts, started: list[LinePeer], tmp_path: Path
) -> None:
    hub_endpoint = f"tcp://{hosts.addresses['n0']}:31999"
    hub = ours(hosts, started, tmp_path, "n0", "hub", gossip_bind=hub_endpoint)
    hub.ready  # noqa: B018
    z1 = zyre(hosts, started, tmp_path, "n1", "zy1", "--gossip-connect", hub_endpoint)
    z2 = zyre(hosts, started, tmp_path, "n2", "zy2", "--gossip-connect", hub_endpoint)
    meshed([hub, z1, z2])
    hub.send({"shout": "G", "content": ["from our hub"]})
    for peer in (z1, z2):
        line = peer.wait_for("SHOUT", hub.ready["peer"], timeout=10)
        assert line["content"] == ["from our hub"]
    for peer in started:
        peer.stop()
    started.clear()

    # A zyre hub; our node, then a zyre, join through it (zpinger -g): all three meet.
    zyre_hub = f"tcp://{hosts.addresses['n0']}:31998"
    # (The zyres expire a silent peer only after a minute.)
    slow = ("--evasive", "30000", "--expired", "60000")
    zh = zyre(hosts, started, tmp_path, "n0", "zyh", "--gossip-bind", zyre_hub, *slow)
    zh.ready  # noqa: B018
    mine = ours(hosts, started, tmp_path, "n1", "ours", gossip_connect=[zyre_hub])
    mine.wait_for("ENTER", zh.ready["peer"], timeout=20)
    z3 = zyre(hosts, started, tmp_path, "n2", "zy3", "--gossip-connect", zyre_hub, *slow)
    meshed([zh, mine, z3])
    status = _status(mine)
    assert status["gossip"]["remotes"] == [zyre_hub] and status["dropped"] == {}
    # Our node leaves: its GOODBYE makes each zyre drop it at once, as zyre's own would.
    mine.send({"stop": True})
    for peer in (zh, z3):
        peer.wait_for("EXIT", mine.ready["peer"], timeout=15)


def _status(peer: LinePeer) -> dict[str, object]:
    before = len(peer.events("STATUS"))
    peer.send({"status": True})
    poll_until(lambda: len(peer.events("STATUS")) > before, 10, "STATUS")
    return peer.events("STATUS")[-1]


def test_gossip_over_curve_with_zyre_both_ways(
    hosts: Hosts, started: list[LinePeer], tmp_path: Path
) -> None:
    if not program().endswith("_drafts"):
        pytest.skip("zyre's gossip speaks CURVE only on a czmq built with its draft API")
    public, secret = zmq.curve_keypair()
    write_certificate(tmp_path, "ours", public, secret, {})
    cert = str(tmp_path / "ours.key_secret")
    # A zyre hub with a certificate: our node and a zyre connect with its key.
    zyre_hub = f"tcp://{hosts.addresses['n0']}:31997"
    zh = zyre(hosts, started, tmp_path, "n0", "zyh", "--curve", "--gossip-bind", zyre_hub)
    key = zh.ready["public_key"]
    mine = ours(hosts, started, tmp_path, "n1", "ours", cert=cert,
                gossip_connect=[f"{zyre_hub}|{key}"])  # fmt: skip
    z2 = zyre(
        hosts, started, tmp_path, "n2", "zy2", "--curve", "--gossip-connect", f"{zyre_hub}|{key}"
    )
    meshed([zh, mine, z2])
    for peer in started:
        peer.stop()
    started.clear()
    # Our hub over CURVE, zyre clients with certificates of their own.
    hub_endpoint = f"tcp://{hosts.addresses['n0']}:31996"
    hub = ours(hosts, started, tmp_path, "n0", "hub", cert=cert, gossip_bind=hub_endpoint)
    with_key = f"{hub_endpoint}|{hub.ready['public_key']}"
    z1 = zyre(hosts, started, tmp_path, "n1", "zy1", "--curve", "--gossip-connect", with_key)
    z2 = zyre(hosts, started, tmp_path, "n2", "zy2b", "--curve", "--gossip-connect", with_key)
    meshed([hub, z1, z2])
    assert _status(hub)["curve"]["security"] == "curve"  # type: ignore[index]


@pytest.mark.parametrize("position", [0, 3], ids=["ours-first", "ours-last"])
def test_three_contesting_zyres_and_our_node_never_split(position: int, tmp_path: Path) -> None:
    four = make_hosts(["n0", "n1", "n2", "n3"])
    try:
        run = election_run(program(), four, "ours", position, tmp_path)
    finally:
        four.delete()
    assert not run.split, run.leaders
    # Our node names a leader only one of the zyres named too.
    if run.leaders["fourth"] is not None:
        named = [v for k, v in run.leaders.items() if k != "fourth"]
        assert run.leaders["fourth"] in named, run.leaders
