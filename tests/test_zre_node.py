"""ZRE nodes of this project talking to each other through real sockets on loopback: UDP
beacons to 127.255.255.255 on a private port, ROUTER mailboxes and DEALERs on 127.0.0.1."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest
import pytest_twisted
import zmq
from twisted.internet import reactor

from bus.errors import StartupError
from bus.testing import RawPeer, wait_until
from bus.zre import codec
from bus.zre.codec import VERSION_20
from bus.zre.config import ZreConfig
from bus.zre.node import ZreNode
from tests.zre_helpers import EventLog, fast_config, free_udp_port

NodeMaker = Callable[..., tuple[ZreNode, EventLog]]


def ready(node: ZreNode, *others: ZreNode) -> Callable[[], bool]:
    return lambda: all(other.uuid in node.peers() for other in others)


@pytest_twisted.inlineCallbacks
def test_two_nodes_discover_each_other_by_beacon_and_exchange_whisper_and_shout(
    make_node: NodeMaker,
) -> Any:
    port = free_udp_port()
    a, a_events = make_node(fast_config(port, name="alpha", groups=["G"], headers={"K": "v"}))
    b, b_events = make_node(fast_config(port, name="beta"))
    yield wait_until(lambda: ready(a, b)() and ready(b, a)(), what="mutual ENTER")
    enter = b_events.of("ENTER", a.uuid)[0]
    assert (enter.name, enter.endpoint, enter.headers["K"]) == ("alpha", a.endpoint, "v")
    assert enter.endpoint.startswith("tcp://127.0.0.1:")
    assert int(a.endpoint.rpartition(":")[2]) >= 0xC000  # ZRE's ephemeral range
    assert [e.group for e in b_events.of("JOIN", a.uuid)] == ["G"]
    b.join("G")
    yield wait_until(lambda: a_events.of("JOIN", b.uuid), what="JOIN at a")
    assert a.whisper(b.uuid, [b"one", b"two"])
    assert b.shout("G", [b"to", b"all", b"\xff"]) == 1
    yield wait_until(lambda: b_events.of("WHISPER") and a_events.of("SHOUT"), what="delivery")
    assert b_events.of("WHISPER")[0].content == (b"one", b"two")
    shout = a_events.of("SHOUT")[0]
    assert (shout.peer, shout.group, shout.content) == (b.uuid, "G", (b"to", b"all", b"\xff"))
    b.leave("G")
    yield wait_until(lambda: a_events.of("LEAVE", b.uuid), what="LEAVE at a")
    assert a.core is not None and b.core is not None
    # Every JOIN/LEAVE carried exactly the sender's counter + 1.
    assert a.core.status_mismatches == b.core.status_mismatches == 0
    assert a.core.peers[b.uuid].status == b.core.status == 2
    a.leave("G")
    yield wait_until(lambda: b_events.of("LEAVE", a.uuid), what="LEAVE at b")
    assert b.shout("G", [b"nobody left"]) == 0


@pytest_twisted.inlineCallbacks
def test_leaving_beacon_makes_peers_exit_at_once(make_node: NodeMaker) -> Any:
    port = free_udp_port()
    a, a_events = make_node(fast_config(port, expired=60.0, evasive=30.0))
    b, _ = make_node(fast_config(port))
    yield wait_until(ready(a, b), what="ENTER")
    yield b.stopService()
    yield wait_until(lambda: a_events.of("EXIT", b.uuid), what="EXIT from the port-0 beacon")
    assert b.uuid not in a.peers()


@pytest_twisted.inlineCallbacks
def test_a_stall_of_the_process_is_not_taken_for_silence(make_node: NodeMaker) -> Any:
    # Two nodes in one process, EVASIVE after 0.3 s and EXIT after 1 s of silence: stalled for
    # 1.5 s (SIGSTOP, a VM's pause, a starved machine) three times, their first reaper ticks
    # after each come late with the other's beacons unread. Neither sees the other leave.
    port = free_udp_port()
    a, a_events = make_node(fast_config(port, evasive=0.3, expired=1.0))
    b, b_events = make_node(fast_config(port, evasive=0.3, expired=1.0))
    yield wait_until(lambda: ready(a, b)() and ready(b, a)(), what="mutual ENTER")
    assert a.core is not None and b.core is not None
    for stall in range(1, 4):
        woken = a.core.wakes.woken + 2, b.core.wakes.woken + 2
        yield wait_until(
            lambda n=woken: a.core.wakes.woken >= n[0] and b.core.wakes.woken >= n[1],
            what="their reapers",
        )
        reactor.callLater(0, time.sleep, 1.5)
        yield wait_until(
            lambda n=stall: all(
                node.core.wakes.held >= n and node.core.wakes.late_at is None for node in (a, b)
            ),
            what="a tick of each that judged after the stall",
        )
    assert a_events.of("EXIT") == b_events.of("EXIT") == []
    assert len(a_events.of("ENTER")) == len(b_events.of("ENTER")) == 1


@pytest_twisted.inlineCallbacks
def test_silent_peer_is_evasive_pinged_silent_then_expired(make_node: NodeMaker) -> Any:
    """A raw peer that greets, answers nothing and sends no beacon: EVASIVE (with a PING
    sent to it), SILENT, then EXIT."""
    node, events = make_node(fast_config(0, evasive=0.3, expired=3.0))
    peer_uuid = b"\x42" * 16
    mailbox = _RawMailbox()
    dealer = RawPeer(zmq.DEALER, node.endpoint, identity=codec.identity_of(peer_uuid))
    try:
        hello = codec.Hello(1, mailbox.endpoint, (), 0, "raw", {})
        dealer.send(codec.encode(hello))
        yield wait_until(lambda: events.of("ENTER", peer_uuid), what="ENTER")
        yield wait_until(lambda: events.of("EXIT", peer_uuid), what="EXIT", timeout=10)
        assert events.types(peer_uuid) == ["ENTER", "EVASIVE", "SILENT", "EXIT"]
        commands = [codec.parse(m[1:]) for m in mailbox.peer.messages]
        assert isinstance(commands[0], codec.Hello)
        assert any(isinstance(c, codec.Ping) for c in commands)
        assert [c.sequence for c in commands] == list(range(1, len(commands) + 1))
    finally:
        dealer.close()
        mailbox.close()


class Recorded:
    """An ActivitySink that records what a node publishes."""

    def __init__(self) -> None:
        self.events: list[tuple[str, Any]] = []

    def publish(self, topic: str, value: object) -> None:
        self.events.append((topic, value))


class _RawMailbox:
    """A ROUTER bound on 127.0.0.1 that records what a node's DEALER sends it."""

    def __init__(self) -> None:
        from bus.transport.zmqsocket import SocketFactory, SocketOptions
        from bus.util.reactor import reactor_of

        self.factory = SocketFactory(reactor_of(None))
        self.peer = type("Peer", (), {"messages": []})()
        self.socket = self.factory.socket(
            zmq.ROUTER, self.peer.messages.extend, SocketOptions(linger_ms=0)
        )
        self.endpoint = self.socket.bind("tcp://127.0.0.1:*")

    def close(self) -> None:
        self.factory.shutdown()


@pytest_twisted.inlineCallbacks
def test_peer_option_discovers_without_udp_and_gossip_finds_the_rest(
    make_node: NodeMaker,
) -> Any:
    """No beacons at all (port 0): b and c know only a; they find each other through the
    endpoints a tells them about in its HELLO."""
    a, _ = make_node(fast_config(0, name="a"))
    b, _ = make_node(fast_config(0, name="b", peers=[a.endpoint]))
    yield wait_until(lambda: ready(a, b)() and ready(b, a)(), what="b meets a")
    c, _ = make_node(fast_config(0, name="c", peers=[a.endpoint]))
    yield wait_until(lambda: ready(c, a, b)() and ready(b, c)() and ready(a, c)(), what="full mesh")
    assert a.udp is None and b.udp is None and c.udp is None


@pytest_twisted.inlineCallbacks
def test_second_hello_from_a_known_peer_is_exit_then_enter(make_node: NodeMaker) -> Any:
    node, events = make_node(fast_config(0))
    mailbox = _RawMailbox()
    peer_uuid = b"\x07" * 16
    first = RawPeer(zmq.DEALER, node.endpoint, identity=codec.identity_of(peer_uuid))
    try:
        first.send(codec.encode(codec.Hello(1, mailbox.endpoint, ("X",), 1, "p", {})))
        yield wait_until(lambda: events.of("JOIN", peer_uuid), what="ENTER+JOIN")
        first.send(codec.encode(codec.Hello(1, mailbox.endpoint, (), 0, "p2", {})))
        yield wait_until(lambda: len(events.of("ENTER", peer_uuid)) == 2, what="second ENTER")
        assert events.types(peer_uuid) == ["ENTER", "JOIN", "EXIT", "ENTER"]
        assert events.of("ENTER", peer_uuid)[1].name == "p2"
    finally:
        first.close()
        mailbox.close()


@pytest_twisted.inlineCallbacks
def test_sequence_gap_drops_the_peer_and_early_messages_are_dropped(
    make_node: NodeMaker,
) -> Any:
    node, events = make_node(fast_config(0))
    mailbox = _RawMailbox()
    peer_uuid = b"\x09" * 16
    dealer = RawPeer(zmq.DEALER, node.endpoint, identity=codec.identity_of(peer_uuid))
    try:
        dealer.send(codec.encode(codec.Whisper(1, (b"too early",))))
        yield wait_until(lambda: node.drops.counts["unknown-peer"] == 1, what="early drop")
        dealer.send(codec.encode(codec.Hello(1, mailbox.endpoint, (), 0, "p", {})))
        dealer.send(codec.encode(codec.Whisper(2, (b"in order",))))
        dealer.send(codec.encode(codec.Whisper(4, (b"gap",))))
        yield wait_until(lambda: events.of("EXIT", peer_uuid), what="EXIT on the gap")
        assert [e.content for e in events.of("WHISPER")] == [(b"in order",)]
        assert node.drops.counts["sequence"] == 1
    finally:
        dealer.close()
        mailbox.close()


@pytest_twisted.inlineCallbacks
def test_20zre_nodes_talk_and_ignore_36zre_nodes(make_node: NodeMaker) -> Any:
    port = free_udp_port()
    old_a, a_events = make_node(fast_config(port, version=VERSION_20, name="old-a", groups=["G"]))
    old_b, b_events = make_node(fast_config(port, version=VERSION_20, name="old-b"))
    new, new_events = make_node(fast_config(port, name="new"))
    yield wait_until(lambda: ready(old_a, old_b)() and ready(old_b, old_a)(), what="20/ZRE")
    assert b_events.of("ENTER", old_a.uuid)[0].name == "old-a"
    assert old_b.whisper(old_a.uuid, [b"hi"])
    yield wait_until(lambda: a_events.of("WHISPER"), what="20/ZRE whisper")
    # The 36/ZRE node greeted them; they recognised it and never sent it a 20/ZRE frame.
    yield wait_until(
        lambda: old_a.drops.counts["dialect-36"] and old_b.drops.counts["dialect-36"],
        what="36/ZRE HELLO seen",
    )
    assert not new.peers() and not new_events.events
    assert new.drops.counts.get("version", 0) == 0
    assert old_a.core is not None and all(
        p.foreign for p in old_a.core.peers.values() if p.uuid == new.uuid
    )


@pytest_twisted.inlineCallbacks
def test_zrelog_records_reach_the_log_service(make_node: NodeMaker) -> Any:
    port = free_udp_port()
    activity = Recorded()
    collector, _ = make_node(
        fast_config(port, version=VERSION_20, name="collector"), activity=activity
    )
    sender, _ = make_node(fast_config(port, version=VERSION_20, name="sender"))
    yield wait_until(ready(sender, collector), what="ENTER")
    assert collector.log_endpoint.startswith("tcp://127.0.0.1:")
    assert int(collector.log_endpoint.rpartition(":")[2]) >= 0xC000
    # PUB/SUB: records sent before the subscription arrives are lost; keep acting until
    # one arrives (the collector's JOINs are what the sender sees and logs).
    groups = iter(range(1000))

    def joined_and_logged() -> bool:
        collector.join(f"g{next(groups)}")
        return collector.log_records > 0

    yield wait_until(joined_and_logged, interval=0.05, what="a ZRE/LOG record")
    assert sender.log_records_sent > 0
    # Received records are published on the bus (here a recording sink).
    [(topic, record), *_] = [(t, v) for t, v in activity.events if t.startswith("/zre/log/")]
    assert topic == f"/zre/log/{codec.node_hash(sender.uuid):04x}/"
    assert (record["level"], record["event"]) == ("INFO", "JOIN")
    assert record["data"].startswith("JOIN collector g")
    assert record["peer"] == codec.node_hash(collector.uuid)
    # And the collector's own view of the network, as membership events.
    assert f"/zre/peers/{sender.uuid_hex}/enter/" in [t for t, _ in activity.events]


def test_missing_interface_is_a_startup_error() -> None:
    node = ZreNode(ZreConfig(interface="no-such-if0", port=0))
    with pytest.raises(StartupError) as error:
        node.startService()
    assert error.value.option == "interface"


class _NotRunningYet:
    """The reactor as twistd holds it while it starts services: not running yet (its
    ``callWhenRunning`` calls are kept for :meth:`run`); everything else is the real one."""

    running = False

    def __init__(self, reactor: Any) -> None:
        self._reactor = reactor
        self._hooks: list[Callable[[], object]] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self._reactor, name)

    def callWhenRunning(self, call: Callable[..., object], *args: Any) -> None:
        self._hooks.append(lambda: call(*args))

    def run(self) -> None:
        self.running = True
        for hook in self._hooks:
            hook()


@pytest_twisted.inlineCallbacks
def test_the_first_beacon_waits_until_the_node_can_answer() -> Any:
    # zyre's first beacon goes out once its node polls; a peer that hears it greets at once.
    # twistd starts services before it runs the reactor: our first beacon waits for it.
    from twisted.internet import reactor

    port = free_udp_port()
    held = _NotRunningYet(reactor)
    node = ZreNode(fast_config(port, name="early"), reactor=held)
    node.startService()
    try:
        assert node.beacon is not None and node.beacon.sent == 0
        held.run()
        assert node.beacon.sent == 1  # at once, once running
    finally:
        yield node.stopService()


@pytest_twisted.inlineCallbacks
def test_a_batch_is_answered_whole_before_listeners_hear_of_it() -> Any:
    # zyre's node actor greets and answers in its own thread; its application reads the
    # events later. Ours: a mailbox batch, and what came in meanwhile, is handled whole
    # (every peer greeted back) before a listener hears of any of it, in order.
    node = ZreNode(fast_config(0, name="busy", groups=["G"]))
    seen: list[tuple[str, bytes, bool]] = []

    def listener(event: Any) -> None:
        assert node.core is not None
        peers = node.core.peers.values()
        seen.append((event.type, event.peer, len(peers) == 3 and all(p.hello_sent for p in peers)))

    node.add_listener(listener)
    node.startService()
    peers = [bytes([n]) * 16 for n in (0x21, 0x22, 0x23)]

    def hello(port: int) -> list[bytes]:
        return codec.encode(codec.Hello(1, f"tcp://127.0.0.1:{port}", ("G",), 1, "p", {}), 2)

    late = zmq.Context.instance().socket(zmq.DEALER)
    late.set(zmq.IDENTITY, codec.identity_of(peers[2]))
    late.set(zmq.LINGER, 0)
    try:
        late.connect(node.endpoint)
        late.send_multipart(hello(1))
        # It waits in the mailbox (the reactor has not run since): the drain reads it.
        assert node.mailbox is not None and node.mailbox.socket.poll(5000, zmq.POLLIN)
        node._on_mailbox([[codec.identity_of(p), *hello(2 + i)] for i, p in enumerate(peers[:2])])
        assert [(kind, peer) for kind, peer, _ in seen] == [
            (kind, peer) for peer in peers for kind in ("ENTER", "JOIN")
        ]
        assert all(greeted for _, _, greeted in seen)
    finally:
        late.close(0)
        yield node.stopService()


@pytest_twisted.inlineCallbacks
def test_a_bad_beacon_is_logged_with_its_sender_address() -> Any:
    import socket

    from twisted.logger import formatEvent, globalLogPublisher

    port = free_udp_port()
    node = ZreNode(fast_config(port, name="listener"))
    lines: list[str] = []

    def observer(event: dict[str, Any]) -> None:
        if "dropped" in str(event.get("log_format", "")):
            lines.append(formatEvent(event))

    globalLogPublisher.addObserver(observer)
    node.startService()
    sender = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        sender.sendto(b"ZRE\x01" + b"\x00" * 5, ("127.0.0.1", port))  # too short a beacon
        yield wait_until(lambda: lines, what="the drop's line")
    finally:
        sender.close()
        globalLogPublisher.removeObserver(observer)
        yield node.stopService()
    assert lines[0].endswith("peer 127.0.0.1"), lines  # an address, not hex of its text
