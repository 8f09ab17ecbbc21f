"""ZGOSSIP discovery (bus.zre.gossip), sans I/O and through real sockets on loopback against
fakes of zyre's gossip written from what the real one sent (zyre git master d8370f7 on czmq
4.2.1): a zyre client says HELLO then PUBLISHes its UUID and mailbox, never PINGs, and says
HELLO again on INVALID; a zyre hub answers HELLO with every tuple, PING with PONG, and
forgets a client silent for a second (a PUBLISH from it then gets INVALID)."""

from __future__ import annotations

import uuid as uuidlib
from collections import Counter
from typing import Any

import pytest
import pytest_twisted
import zmq
from twisted.internet.task import Clock

from bus.testing import wait_until
from bus.zre import codec
from bus.zre import gossip_codec as wire
from bus.zre.config import ZreConfig
from bus.zre.gossip import GossipCore, parse_tuple_value
from bus.zre.gossip_codec import GossipHello, GossipPing, Invalid, Pong, Publish
from bus.zre.node import ZreNode
from tests.ports import free_ports
from tests.zre_helpers import EventLog, fast_config


class Wires:
    def __init__(self) -> None:
        self.clients: list[tuple[bytes, wire.GossipMessage]] = []
        self.remotes: list[tuple[str, wire.GossipMessage]] = []

    def to_client(self, identity: bytes, frame: bytes) -> None:
        self.clients.append((identity, wire.parse([frame])))

    def to_remote(self, endpoint: str, frame: bytes) -> None:
        self.remotes.append((endpoint, wire.parse([frame])))


def core(**settings: Any) -> tuple[GossipCore, Wires, list[tuple[str, str]], Counter[str], Clock]:
    clock, wires, delivered, drops = Clock(), Wires(), [], Counter[str]()
    gossip = GossipCore(
        clock.seconds,
        wires,
        lambda key, value: delivered.append((key, value)),
        lambda reason, detail, origin: drops.update([reason]),
        **settings,
    )
    return gossip, wires, delivered, drops, clock


HELLO, PING = wire.encode(GossipHello()), wire.encode(GossipPing())


def publish(key: str, value: str) -> list[bytes]:
    return [wire.encode(Publish(key, value))]


def test_the_hub_greets_with_every_tuple_and_forwards_new_ones_to_its_other_clients() -> None:
    gossip, wires, delivered, drops, _ = core()
    gossip.publish("OWN", "tcp://10.0.0.1:1")
    gossip.on_client(b"c1", [HELLO])
    assert wires.clients == [(b"c1", Publish("OWN", "tcp://10.0.0.1:1"))]
    gossip.on_client(b"c1", publish("ONE", "tcp://10.0.0.2:2"))
    gossip.on_client(b"c2", [HELLO])
    assert [m for i, m in wires.clients if i == b"c2"] == [
        Publish("OWN", "tcp://10.0.0.1:1"),
        Publish("ONE", "tcp://10.0.0.2:2"),
    ]
    wires.clients.clear()
    gossip.on_client(b"c2", publish("TWO", "tcp://10.0.0.3:3"))
    # Forwarded to c1 (not back to c2), and delivered to our node once.
    assert wires.clients == [(b"c1", Publish("TWO", "tcp://10.0.0.3:3"))]
    gossip.on_client(b"c1", publish("TWO", "tcp://10.0.0.3:3"))  # a duplicate: nothing
    assert delivered == [("ONE", "tcp://10.0.0.2:2"), ("TWO", "tcp://10.0.0.3:3")]
    gossip.on_client(b"c1", [PING])
    assert wires.clients[-1] == (b"c1", Pong()) and not drops


def test_the_hub_refuses_a_client_it_does_not_hold_and_forgets_silent_ones() -> None:
    gossip, wires, delivered, drops, clock = core(client_expired=5.0)
    gossip.on_client(b"new", publish("K", "tcp://10.0.0.2:2"))
    assert wires.clients == [(b"new", Invalid())] and drops["gossip-not-greeted"] == 1
    gossip.on_client(b"c1", [HELLO])
    clock.advance(6)
    gossip.tick()
    assert gossip.clients == {}
    gossip.on_client(b"c1", publish("K", "tcp://10.0.0.2:2"))
    assert wires.clients[-1] == (b"c1", Invalid()) and delivered == []
    # Garbage is counted under the codec's reason, and answered with nothing.
    gossip.on_client(b"c1", [b"garbage"])
    assert drops["gossip-signature"] == 1


def test_held_state_is_bounded() -> None:
    gossip, _, _, drops, clock = core(max_tuples=2, max_clients=2)
    for n in range(3):
        gossip.on_client(bytes([n]), [HELLO])
    assert len(gossip.clients) == 2 and drops["gossip-clients-full"] == 1
    for n in range(3):
        gossip.on_client(b"\x02", publish(f"K{n}", "tcp://10.0.0.2:2"))
    assert len(gossip.tuples) == 2 and drops["gossip-full"] == 1
    gossip.on_client(b"\x02", publish("K0", "x" * 2000))
    assert drops["gossip-value"] == 1 and gossip.tuples["K0"].value == "tcp://10.0.0.2:2"
    gossip.on_client(b"\x02", [wire.encode(Publish("T", "tcp://10.0.0.9:9", ttl_ms=500))])
    gossip.unpublish("K0")
    clock.advance(1)
    gossip.tick()
    assert set(gossip.tuples) == {"K1"}


def test_the_client_greets_its_hubs_pings_them_and_greets_again_on_invalid() -> None:
    gossip, wires, delivered, drops, _ = core()
    gossip.publish("OWN", "tcp://10.0.0.1:1")
    gossip.add_remote("tcp://hub:1")
    assert [m for _, m in wires.remotes] == [GossipHello(), Publish("OWN", "tcp://10.0.0.1:1")]
    gossip.on_remote("tcp://hub:1", publish("HUB", "tcp://10.0.0.5:5"))
    assert delivered == [("HUB", "tcp://10.0.0.5:5")]
    wires.remotes.clear()
    gossip.ping()
    gossip.on_remote("tcp://hub:1", [wire.encode(Pong())])
    gossip.on_remote("tcp://hub:1", [wire.encode(Invalid())])
    assert [m for _, m in wires.remotes][:2] == [GossipPing(), GossipHello()]
    assert Publish("OWN", "tcp://10.0.0.1:1") in [m for _, m in wires.remotes]
    assert not drops


def test_tuple_values_as_zyre_writes_them() -> None:
    key = "k" * 40
    assert parse_tuple_value("tcp://10.0.0.1:5000") == ("tcp://10.0.0.1:5000", None)
    assert parse_tuple_value(f"tcp://h:1|{key}") == ("tcp://h:1", key.encode())
    assert parse_tuple_value("tcp://h:1|short") is None
    assert parse_tuple_value("udp://h:1") is None and parse_tuple_value("tcp://h") is None


class FakeZyreGossipClient:
    """A zyre node in gossip mode, from what the real one sent: a DEALER to the hub saying
    HELLO then PUBLISH(its UUID, its mailbox), never PING; its mailbox a ROUTER that records
    what arrives (our node's ZRE HELLO, when it was told about this one)."""

    def __init__(self, hub: str) -> None:
        self.context = zmq.Context.instance()
        self.uuid = uuidlib.uuid4().bytes
        self.mailbox = self.context.socket(zmq.ROUTER)
        port = self.mailbox.bind_to_random_port("tcp://127.0.0.1")
        self.endpoint = f"tcp://127.0.0.1:{port}"
        self.dealer = self.context.socket(zmq.DEALER)
        self.dealer.connect(hub)
        self.dealer.send(HELLO)
        self.dealer.send(wire.encode(Publish(self.uuid.hex().upper(), self.endpoint)))

    def heard(self) -> list[wire.GossipMessage]:
        return [wire.parse([f]) for f in self._drain(self.dealer)]

    def mailbox_frames(self) -> list[list[bytes]]:
        return self._drain(self.mailbox, multipart=True)  # type: ignore[return-value]

    @staticmethod
    def _drain(sock: zmq.Socket[bytes], multipart: bool = False) -> list[Any]:
        out: list[Any] = []
        while sock.poll(0):
            out.append(sock.recv_multipart() if multipart else sock.recv())
        return out

    def close(self) -> None:
        self.dealer.close(0)
        self.mailbox.close(0)


@pytest_twisted.inlineCallbacks
def test_our_hub_tells_a_zyre_client_of_us_and_greets_it() -> Any:
    hub = f"tcp://127.0.0.1:{free_ports(1)}"
    node = ZreNode(fast_config(0, name="hub", gossip_bind=hub))
    events = EventLog()
    node.add_listener(events)
    node.startService()
    zyre = FakeZyreGossipClient(hub)
    try:
        heard: list[wire.GossipMessage] = []
        frames: list[list[bytes]] = []

        def progress() -> bool:
            heard.extend(zyre.heard())
            frames.extend(zyre.mailbox_frames())
            return bool(heard) and bool(frames)

        # The hub answers the client's HELLO with our tuple, and the client's tuple makes our
        # node greet its mailbox (a ZRE HELLO, identity 0x01 + our UUID).
        yield wait_until(progress, what="our tuple and our HELLO")
        assert heard[0] == Publish(node.uuid_hex.upper(), node.endpoint)
        assert frames[0][0] == b"\x01" + node.uuid
        status = node.status()["gossip"]
        assert status["hub"] == hub and status["clients"] == 1 and status["tuples"] == 2
        assert node.drops.total == 0
    finally:
        zyre.close()
        yield node.stopService()


@pytest_twisted.inlineCallbacks
def test_leaving_our_node_says_goodbye_to_a_zyre_it_met_through_gossip() -> Any:
    # zyre in gossip mode has no leaving beacon: zyre_node_stop sends GOODBYE to its peers,
    # and a gossiping zyre drops the sender on it (EXIT) rather than after its expiry.
    hub = f"tcp://127.0.0.1:{free_ports(1)}"
    node = ZreNode(fast_config(0, name="hub", gossip_bind=hub))
    node.startService()
    zyre = FakeZyreGossipClient(hub)
    frames: list[list[bytes]] = []
    try:
        # Our node greets the zyre it was told of (HELLO, sequence 1).
        yield wait_until(lambda: frames.extend(zyre.mailbox_frames()) or bool(frames))
        yield node.stopService()
        yield wait_until(lambda: frames.extend(zyre.mailbox_frames()) or len(frames) > 1)
    finally:
        zyre.close()
        yield node.stopService()
    said = [codec.parse(message[1:], codec.VERSION_36) for message in frames]
    assert [type(m).__name__ for m in said] == ["Hello", "Goodbye"]
    assert said[1].sequence == 2
    assert {message[0] for message in frames} == {b"\x01" + node.uuid}


def test_gossip_turns_the_beacon_off_unless_a_port_is_given() -> None:
    from bus.zre.cli import parser
    from bus.zre.tap import Options

    # As zyre: zyre_gossip_bind / zyre_gossip_connect before zyre_start mean no UDP beacon.
    assert ZreConfig().beacon_port == 5670
    assert ZreConfig(gossip_bind="tcp://10.0.0.1:5000").beacon_port == 0
    assert ZreConfig(gossip_connect=["tcp://10.0.0.1:5000"]).beacon_port == 0
    assert ZreConfig(port=5671, gossip_connect=["tcp://10.0.0.1:5000"]).beacon_port == 5671
    hub = ["--gossip-connect", "tcp://10.0.0.1:5000"]
    for args, port in (([], 5670), (hub, 0), ([*hub, "--port", "5670"], 5670)):
        options = Options()
        options.parseOptions(args)
        assert options["zre-config"].beacon_port == port, args
    assert parser().parse_args(hub).port is None


@pytest_twisted.inlineCallbacks
def test_a_gossiping_node_opens_no_udp_socket() -> Any:
    hub = f"tcp://127.0.0.1:{free_ports(1)}"
    # No port given (fast_config gives one): the default, which gossip turns off.
    node = ZreNode(ZreConfig(name="hub", gossip_bind=hub, reap_interval=0.05))
    node.startService()
    try:
        assert node.udp is None and node.beacon is None
        assert node.status()["beacon"] is None and node.status()["gossip"]["hub"] == hub
    finally:
        yield node.stopService()


class FakeZyreGossipHub:
    """A zyre hub, from what the real one sent: HELLO answered with every tuple, PING with
    PONG; a PUBLISH stored and forwarded; a client silent 1 s forgotten (INVALID)."""

    def __init__(self) -> None:
        self.router = zmq.Context.instance().socket(zmq.ROUTER)
        port = self.router.bind_to_random_port("tcp://127.0.0.1")
        self.endpoint = f"tcp://127.0.0.1:{port}"
        self.tuples: dict[str, str] = {}
        self.pings = 0

    def serve(self) -> None:
        while self.router.poll(0):
            identity, frame = self.router.recv_multipart()
            message = wire.parse([frame])
            if isinstance(message, GossipHello):
                for key, value in self.tuples.items():
                    self.router.send_multipart([identity, wire.encode(Publish(key, value))])
            elif isinstance(message, GossipPing):
                self.pings += 1
                self.router.send_multipart([identity, wire.encode(Pong())])
            elif isinstance(message, Publish):
                self.tuples[message.key] = message.value

    def close(self) -> None:
        self.router.close(0)


@pytest_twisted.inlineCallbacks
def test_our_client_publishes_itself_to_a_zyre_hub_and_greets_the_peers_it_holds() -> Any:
    hub = FakeZyreGossipHub()
    other = zmq.Context.instance().socket(zmq.ROUTER)
    other_port = other.bind_to_random_port("tcp://127.0.0.1")
    other_uuid = uuidlib.uuid4().bytes
    hub.tuples[other_uuid.hex().upper()] = f"tcp://127.0.0.1:{other_port}"
    node = ZreNode(fast_config(0, name="client", gossip_connect=[hub.endpoint]))
    node.startService()
    try:

        def served() -> bool:
            hub.serve()
            return node.uuid_hex.upper() in hub.tuples and hub.pings > 0 and other.poll(0)

        yield wait_until(served, what="our tuple, a PING and our HELLO to the peer")
        assert hub.tuples[node.uuid_hex.upper()] == node.endpoint
        identity, *_ = other.recv_multipart()
        assert identity == b"\x01" + node.uuid
    finally:
        other.close(0)
        hub.close()
        yield node.stopService()


def test_the_gossip_options_as_twistd_and_zre_ping_take_them() -> None:
    from twisted.python import usage

    from bus.zre.cli import parser
    from bus.zre.tap import Options

    options = Options()
    options.parseOptions(
        ["--gossip-bind", "tcp://10.0.0.1:5000", "--gossip-connect", "tcp://10.0.0.2:5000"]
    )
    config = options["zre-config"]
    assert config.gossip_bind == "tcp://10.0.0.1:5000"
    assert config.gossip_connect == ["tcp://10.0.0.2:5000"]
    for bad in (
        ["--gossip-bind", "udp://x:1"],
        ["--gossip-bind", "tcp://127.0.0.1:99999"],  # libzmq would bind 34463
        ["--gossip-connect", f"tcp://h:1|{'k' * 40}"],
    ):
        with pytest.raises(usage.UsageError):
            Options().parseOptions(bad)
    hub = "tcp://127.0.0.1:1"  # zre-ping resolves the host, as for --peer
    args = parser().parse_args(["--group", "A", "--group", "B", "--gossip-connect", hub])
    assert args.group == ["A", "B"] and args.gossip_connect == [hub]
