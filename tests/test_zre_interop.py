"""Interop with the real pyre (zeromq-pyre 0.3.4 from PyPI) over real UDP broadcast and TCP,
inside two network namespaces joined by a veth pair that the test creates and deletes.

Our node (tests/zre_peers/bus_peer.py, or the zre-ping console script) runs in namespace A,
pyre (tests/zre_peers/pyre_peer.py) in namespace B; both beacon on UDP 5670 to the pair's
broadcast address. zyre (C), built from source, is in tests/test_zre_zyre_real.py.
"""

from __future__ import annotations

import json
import shutil
import signal
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.netns import LinePeer, NamespacePair, netns_pair, poll_until

__all__ = ["netns_pair"]

pytestmark = pytest.mark.netns

HERE = Path(__file__).parent / "zre_peers"
FAST = {"evasive": 1.0, "expired": 4.0, "beacon_interval": 0.5, "reap_interval": 0.1}

PeerMaker = Callable[..., LinePeer]


@pytest.fixture
def spawn(tmp_path: Path) -> Iterator[PeerMaker]:
    made: list[LinePeer] = []

    def make(kind: str, ns: str, name: str, *args: str) -> LinePeer:
        script = HERE / f"{kind}_peer.py"
        peer = LinePeer([sys.executable, str(script), name, *args], tmp_path / f"{name}.log", ns)
        made.append(peer)
        return peer

    yield make
    for peer in made:
        peer.stop()


def ours(
    spawn: PeerMaker, pair: NamespacePair, name: str, *groups: str, **settings: object
) -> LinePeer:
    options = json.dumps({**FAST, **settings})
    return spawn("bus", pair.a, name, "5670", pair.iface_a, options, *groups)


def theirs(spawn: PeerMaker, pair: NamespacePair, name: str, *groups: str) -> LinePeer:
    return spawn("pyre", pair.b, name, "5670", *groups)


@pytest.mark.parametrize("pyre_first", [False, True], ids=["ours-first", "pyre-first"])
def test_discovery_both_ways_join_leave_shout_whisper_multi_frame(
    netns_pair: NamespacePair, spawn: PeerMaker, pyre_first: bool
) -> None:
    pair = netns_pair
    if pyre_first:
        pyre = theirs(spawn, pair, "pyre", "CHAT")
        pyre_id = pyre.ready["peer"]
        bus = ours(spawn, pair, "bus")
    else:
        bus = ours(spawn, pair, "bus")
        bus.ready  # noqa: B018
        pyre = theirs(spawn, pair, "pyre", "CHAT")
        pyre_id = pyre.ready["peer"]
    bus_id = bus.ready["peer"]
    enter = bus.wait_for("ENTER", pyre_id)
    assert enter["name"] == "pyre"
    assert enter["endpoint"].startswith(f"tcp://{pair.addr_b}:")
    bus.wait_for("JOIN", pyre_id, group="CHAT")
    seen = pyre.wait_for("ENTER", bus_id)
    assert seen["endpoint"] == f"tcp://{pair.addr_a}:{bus.ready['endpoint'].rpartition(':')[2]}"
    assert bus.ready["endpoint"].startswith(f"tcp://{pair.addr_a}:")

    bus.send({"join": "CHAT"})
    pyre.wait_for("JOIN", bus_id, group="CHAT")
    bus.send({"shout": "CHAT", "content": ["one", "two", "three"]})
    assert pyre.wait_for("SHOUT", bus_id)["content"] == ["one", "two", "three"]
    pyre.send({"shout": "CHAT", "content": ["uno", "dos"]})
    assert bus.wait_for("SHOUT", pyre_id, group="CHAT")["content"] == ["uno", "dos"]
    bus.send({"whisper": pyre_id, "content": ["w1", "w2"]})
    assert pyre.wait_for("WHISPER", bus_id)["content"] == ["w1", "w2"]
    pyre.send({"whisper": bus_id, "content": ["x", "y", "z"]})
    assert bus.wait_for("WHISPER", pyre_id)["content"] == ["x", "y", "z"]

    # Several JOIN/LEAVEs each way: pyre asserts every status is our counter + 1.
    for group in ("A", "B"):
        bus.send({"join": group})
        pyre.send({"join": group})
    bus.send({"leave": "A"})
    pyre.send({"leave": "B"})
    pyre.wait_for("LEAVE", bus_id, group="A")
    bus.wait_for("LEAVE", pyre_id, group="B")
    # pyre is still in A (we left it), and we in B (pyre left it): both still talk.
    bus.send({"shout": "A", "content": ["still alive?"]})
    assert pyre.wait_for("SHOUT", bus_id, group="A")["content"] == ["still alive?"]
    pyre.send({"shout": "B", "content": ["yes"]})
    assert bus.wait_for("SHOUT", pyre_id, group="B")["content"] == ["yes"]
    assert pyre.process.poll() is None, pyre.log_path.read_text()[-2000:]
    assert not bus.events("EXIT") and not pyre.events("EXIT")


def test_pyre_stopping_sends_the_leaving_beacon_and_ours_does_too(
    netns_pair: NamespacePair, spawn: PeerMaker
) -> None:
    pair = netns_pair
    # Expiry far away: only the leaving beacon can make the EXITs below happen in time.
    bus = ours(spawn, pair, "bus", evasive=20.0, expired=60.0)
    pyre = theirs(spawn, pair, "pyre")
    bus_id, pyre_id = bus.ready["peer"], pyre.ready["peer"]
    bus.wait_for("ENTER", pyre_id)
    pyre.wait_for("ENTER", bus_id)
    pyre.send({"stop": True})
    pyre.wait_for("STOPPED")
    bus.wait_for("EXIT", pyre_id, timeout=10)
    # And ours: a second pyre sees our leaving beacon (pyre expires after 30 s otherwise).
    other = theirs(spawn, pair, "pyre2")
    other.wait_for("ENTER", bus_id)
    bus.process.send_signal(signal.SIGTERM)
    other.wait_for("EXIT", bus_id, timeout=10)


def test_killed_pyre_is_evasive_silent_then_expired(
    netns_pair: NamespacePair, spawn: PeerMaker
) -> None:
    pair = netns_pair
    bus = ours(spawn, pair, "bus")
    pyre = theirs(spawn, pair, "pyre")
    pyre_id = pyre.ready["peer"]
    bus.wait_for("ENTER", pyre_id)
    pyre.kill()  # no leaving beacon
    bus.wait_for("EXIT", pyre_id, timeout=15)
    kinds = [line["event"] for line in bus.lines if line.get("peer") == pyre_id]
    assert kinds == ["ENTER", "EVASIVE", "SILENT", "EXIT"]


def test_ping_ok_keeps_a_peer_found_without_udp(
    netns_pair: NamespacePair, spawn: PeerMaker
) -> None:
    """Our node without beacons (port 0) greets pyre through --peer: no beacon refreshes
    pyre, so it turns evasive every second and is pinged; pyre's PING-OK keeps it."""
    pair = netns_pair
    pyre = theirs(spawn, pair, "pyre")
    endpoint = pyre.ready["endpoint"]
    pyre_id = pyre.ready["peer"]
    options = json.dumps({**FAST, "peers": [endpoint]})
    bus = spawn("bus", pair.a, "bus", "0", pair.iface_a, options)
    bus.wait_for("ENTER", pyre_id)
    pyre.wait_for("ENTER", bus.ready["peer"])
    # Two evasive periods answered by PING-OK, and past the 4 s expiry: still there.
    poll_until(lambda: len(bus.events("EVASIVE", pyre_id)) >= 5, 20, "five EVASIVE rounds")
    assert not bus.events("EXIT", pyre_id) and not bus.events("SILENT", pyre_id)


@pytest.mark.skipif(
    shutil.which("zre-ping", path=str(Path(sys.executable).parent)) is None,
    reason="zre-ping not installed",
)
def test_zre_ping_against_pyre(netns_pair: NamespacePair, spawn: PeerMaker, tmp_path: Path) -> None:
    pair = netns_pair
    pyre = theirs(spawn, pair, "pyre", "GLOBAL")
    pyre_id = pyre.ready["peer"]
    ping = LinePeer(
        [
            str(Path(sys.executable).parent / "zre-ping"),
            "--interface",
            pair.iface_a,
            "--name",
            "pinger",
            "--interval",
            "200ms",
        ],
        tmp_path / "zre-ping.log",
        pair.a,
    )
    try:
        ready = ping.ready
        assert set(ready) == {"event", "peer", "name", "endpoint"}
        assert ready["name"] == "pinger" and len(ready["peer"]) == 32
        enter = ping.wait_for("ENTER", pyre_id)
        assert enter["name"] == "pyre" and "headers" in enter and "endpoint" in enter
        ping.wait_for("JOIN", pyre_id, group="GLOBAL")
        greeting = pyre.wait_for("WHISPER", ready["peer"])
        assert greeting["content"] == ["hello from pinger"]
        shout = pyre.wait_for("SHOUT", ready["peer"], group="GLOBAL")
        assert shout["content"][0].startswith("ping ")
        pyre.send({"whisper": ready["peer"], "content": ["hi", "there"]})
        assert ping.wait_for("WHISPER", pyre_id)["content"] == ["hi", "there"]
        ping.process.send_signal(signal.SIGTERM)
        assert ping.process.wait(10) == 0
        pyre.wait_for("EXIT", ready["peer"], timeout=10)
    finally:
        ping.stop()


def test_a_20zre_node_never_sends_pyre_a_frame_it_cannot_parse(
    netns_pair: NamespacePair, spawn: PeerMaker
) -> None:
    """Same beacon, other dialect: pyre greets our 20/ZRE node in 36/ZRE, our node recognises
    it and stays silent (a 20/ZRE HELLO would kill pyre), while a 36/ZRE node of ours and
    pyre go on talking on the same network."""
    pair = netns_pair
    pyre = theirs(spawn, pair, "pyre", "G")
    pyre_id = pyre.ready["peer"]
    old = ours(spawn, pair, "old", version=1)
    new = ours(spawn, pair, "new")
    new.wait_for("ENTER", pyre_id)
    pyre.wait_for("ENTER", new.ready["peer"])
    old_id = old.ready["peer"]
    # Several beacon rounds and the 20/ZRE node's greeting delay have passed.
    poll_until(lambda: len(new.events("JOIN")) >= 1, 15, "JOIN at the 36/ZRE node")
    new.send({"join": "G"})
    pyre.wait_for("JOIN", new.ready["peer"], group="G")
    pyre.send({"shout": "G", "content": ["after the wait"]})
    new.send({"shout": "G", "content": ["from new"]})
    assert pyre.wait_for("SHOUT", new.ready["peer"])["content"] == ["from new"]
    assert new.wait_for("SHOUT", pyre_id)["content"] == ["after the wait"]
    assert pyre.process.poll() is None, pyre.log_path.read_text()[-2000:]
    assert not pyre.events("ENTER", old_id) and not old.events("ENTER", pyre_id)

    # pyre and our 36/ZRE node greeted it, and it knows both for what they are: it sent
    # nothing at all, to anyone.
    def old_status() -> dict[str, object]:
        count = len(old.events("STATUS"))
        old.send({"status": True})
        poll_until(lambda: len(old.events("STATUS")) > count, 10, "STATUS")
        return old.events("STATUS")[-1]

    poll_until(lambda: old_status()["peers_foreign"] == 2, 15, "both 36/ZRE peers recognised")
    status = old_status()
    assert status["messages_sent"] == 0 and status["peers"] == 0
    assert status["dropped"]["dialect-36"] >= 2  # type: ignore[index]
    # The two dialects of ours ignore each other too.
    assert not new.events("ENTER", old_id) and not old.events("ENTER", new.ready["peer"])
