"""The ZRE state machine alone: a fake link layer records frames, a Clock drives time."""

from __future__ import annotations

from collections import Counter

from twisted.internet.task import Clock

from bus.zre import codec
from bus.zre.codec import VERSION_20, VERSION_36, Hello, Join, Leave, Ping, PingOk, Shout, Whisper
from bus.zre.core import PEERS_HEADER, ZreCore, ZreEvent, ZreSettings

OWN = b"\x10" * 16
PEER = b"\x20" * 16
OTHER = b"\x30" * 16


class FakeLinks:
    def __init__(self, version: int = VERSION_36) -> None:
        self.version = version
        #: Links open at once, at most (a descriptor budget); every link ever opened.
        self.capacity = 1_000_000
        self.opened = 0
        self.connected: dict[str, str] = {}
        self.closed: list[str] = []
        self.sent: dict[str, list[codec.Message]] = {}
        self.server_keys: dict[str, bytes | None] = {}

    def connect(self, key: str, endpoint: str, server_key: bytes | None = None) -> bool:
        if len(self.connected) >= self.capacity:
            return False
        self.connected[key] = endpoint
        self.server_keys[key] = server_key
        self.opened += 1
        return True

    def send(self, key: str, frames: list[bytes]) -> bool:
        self.sent.setdefault(key, []).append(codec.parse(frames, self.version))
        return True

    def close(self, key: str) -> None:
        self.closed.append(key)
        self.connected.pop(key, None)

    def rekey(self, old: str, new: str) -> None:
        self.connected[new] = self.connected.pop(old)
        self.sent[new] = self.sent.pop(old, [])


class Harness:
    def __init__(self, version: int = VERSION_36, **settings: object) -> None:
        self.clock = Clock()
        self.links = FakeLinks(version)
        self.events: list[ZreEvent] = []
        self.drops: Counter[str] = Counter()
        config = ZreSettings(OWN, "own", "tcp://127.0.0.1:50000", version, **settings)  # type: ignore[arg-type]
        self.core = ZreCore(
            config,
            self.links,
            self.clock.seconds,
            self.events.append,
            lambda reason, detail, peer: self.drops.update([reason]),
        )

    def hello_from(
        self,
        node: bytes,
        sequence: int = 1,
        groups: tuple[str, ...] = (),
        status: int = 0,
        **headers: str,
    ) -> None:
        hello = Hello(
            sequence, f"tcp://127.0.0.1:{node[0] + 50000}", groups, status, f"n{node[0]}", headers
        )
        self.core.on_message(codec.identity_of(node), codec.encode(hello, self.core.version))

    def message_from(self, node: bytes, message: codec.Message) -> None:
        self.core.on_message(codec.identity_of(node), codec.encode(message, self.core.version))

    def sent_to(self, node: bytes) -> list[codec.Message]:
        return self.links.sent.get(node.hex(), [])

    def types(self) -> list[str]:
        return [event.type for event in self.events]


def test_join_and_leave_carry_our_counter_plus_one_to_every_greeted_peer() -> None:
    h = Harness()
    h.hello_from(PEER)
    h.hello_from(OTHER)
    h.core.join("A")
    h.core.join("A")  # already in: nothing sent, no increment
    h.core.join("B")
    h.core.leave("A")
    h.core.leave("Z")  # not in: nothing
    for node in (PEER, OTHER):
        sent = h.sent_to(node)
        assert isinstance(sent[0], Hello) and sent[0].status == 0
        assert [(type(m).__name__, m.group, m.status) for m in sent[1:]] == [  # type: ignore[union-attr]
            ("Join", "A", 1),
            ("Join", "B", 2),
            ("Leave", "A", 3),
        ]
        assert [m.sequence for m in sent] == [1, 2, 3, 4]
    # A newcomer's HELLO carries the current groups and status.
    h.hello_from(b"\x40" * 16)
    hello = h.sent_to(b"\x40" * 16)[0]
    assert isinstance(hello, Hello) and (hello.groups, hello.status) == (("B",), 3)


def test_peer_membership_status_is_followed_and_mismatches_counted() -> None:
    h = Harness()
    h.hello_from(PEER, groups=("A",), status=5)
    h.message_from(PEER, Join(2, "B", 6))
    h.message_from(PEER, Leave(3, "A", 9))  # should be 7: counted, followed
    h.message_from(PEER, Join(4, "C", 10))
    assert h.drops["status"] == 1 and h.core.status_mismatches == 1
    assert h.core.peers[PEER].status == 10
    assert h.core.peers[PEER].groups == {"B", "C"}
    assert h.types() == ["ENTER", "JOIN", "JOIN", "LEAVE", "JOIN"]
    assert h.core.shout("C", [b"x"]) == 1 and h.core.shout("A", [b"x"]) == 0


def test_evasive_ping_silent_then_expired_on_the_clock() -> None:
    h = Harness(evasive=5.0, expired=30.0)
    h.hello_from(PEER)
    for second in range(1, 31):
        h.clock.advance(1)
        h.core.tick()
        if second == 4:
            assert h.types() == ["ENTER"]
        if second == 5:
            assert h.types() == ["ENTER", "EVASIVE"]
            assert isinstance(h.sent_to(PEER)[-1], Ping)
        if second == 10:
            assert h.types() == ["ENTER", "EVASIVE", "SILENT"]
    assert h.types() == ["ENTER", "EVASIVE", "SILENT", "EXIT"]
    assert PEER.hex() in h.links.closed


def test_a_node_that_did_not_run_judges_no_one_before_it_read_what_waited() -> None:
    h = Harness(evasive=5.0, expired=30.0)
    h.hello_from(PEER)
    h.hello_from(OTHER)
    h.core.tick()
    h.clock.advance(40)  # stopped (SIGSTOP, a VM's pause): its first tick comes late
    h.core.tick()
    assert h.types() == ["ENTER", "ENTER"] and h.core.wakes.held == 1
    h.message_from(PEER, PingOk(2))  # what waited in its socket
    h.clock.advance(0.1)  # still settling
    h.core.tick()
    assert h.types() == ["ENTER", "ENTER"]
    h.clock.advance(1)
    h.core.tick()
    assert h.types() == ["ENTER", "ENTER", "EXIT"] and set(h.core.peers) == {PEER}


def test_ping_ok_or_any_message_resets_the_timers() -> None:
    h = Harness(evasive=5.0, expired=30.0)
    h.hello_from(PEER)
    h.clock.advance(6)
    h.core.tick()
    h.message_from(PEER, PingOk(2))
    h.clock.advance(4)
    h.core.tick()
    assert h.types() == ["ENTER", "EVASIVE"]
    h.message_from(PEER, Ping(3))
    assert isinstance(h.sent_to(PEER)[-1], PingOk)


def test_a_peer_found_by_beacon_that_never_says_hello_is_forgotten() -> None:
    h = Harness(expired=30.0, pending_expired=5.0)
    h.core.on_beacon(codec.Beacon(PEER, 51000), "127.0.0.1")
    assert isinstance(h.sent_to(PEER)[0], Hello)
    for _ in range(5):
        h.clock.advance(1)
        h.core.on_beacon(codec.Beacon(PEER, 51000), "127.0.0.1")  # beacons keep coming
        h.core.tick()
    # Forgotten after pending_expired, not after expired (which is for greeted peers).
    assert PEER not in h.core.peers and h.drops["no-hello"] == 1
    assert h.events == [] and h.links.closed == [PEER.hex()]  # never entered: no EXIT
    h.core.on_beacon(codec.Beacon(PEER, 51000), "127.0.0.1")  # starts over
    assert PEER in h.core.peers and h.links.opened == 2


def test_sequences_pyre_wrap_and_gaps() -> None:
    h = Harness()
    h.hello_from(PEER)
    h.core.peers[PEER].want_sequence = 65533
    h.message_from(PEER, Whisper(65534, (b"a",)))
    h.message_from(PEER, Whisper(0, (b"b",)))  # pyre wraps modulo 65535
    h.message_from(PEER, Whisper(1, (b"c",)))
    assert [e.content for e in h.events if e.type == "WHISPER"] == [(b"a",), (b"b",), (b"c",)]
    h.message_from(PEER, Whisper(3, (b"gap",)))
    assert h.types()[-1] == "EXIT" and h.drops["sequence"] == 1


def test_20zre_node_waits_for_a_beacon_found_peer_to_greet_first() -> None:
    h = Harness(VERSION_20, hello_wait=2.0)
    # A 36/ZRE peer (pyre, zyre) greets at once: recognised, never sent a 20/ZRE frame.
    h.core.on_beacon(codec.Beacon(PEER, 51000), "127.0.0.1")
    hello36 = codec.encode(Hello(1, "tcp://127.0.0.1:51000", (), 0, "pyre", {}), VERSION_36)
    h.core.on_message(codec.identity_of(PEER), hello36)
    # A 20/ZRE peer's HELLO is answered at once.
    h.core.on_beacon(codec.Beacon(OTHER, 52000), "127.0.0.1")
    h.hello_from(OTHER, X_ZRE_NAME="ignored")
    assert isinstance(h.sent_to(OTHER)[0], Hello)
    # A silent one is greeted once the wait is over.
    third = b"\x50" * 16
    h.core.on_beacon(codec.Beacon(third, 53000), "127.0.0.1")
    h.core.join("G")
    assert h.sent_to(third) == []
    h.clock.advance(2.5)
    h.core.tick()
    [hello] = h.sent_to(third)
    assert isinstance(hello, Hello) and hello.groups == ("G",) and hello.status == 1
    assert h.sent_to(PEER) == [] and h.core.peers[PEER].foreign
    assert h.drops["dialect-36"] == 1
    assert h.core.whisper(PEER, [b"x"]) is False


def test_peer_endpoints_gossip_and_seed_links_are_adopted_and_retried() -> None:
    h = Harness()
    seed = "tcp://127.0.0.1:50032"  # PEER's endpoint in hello_from
    h.core.connect_endpoint(seed, seed=True)
    assert h.links.connected == {f"endpoint:{seed}": seed}
    h.hello_from(PEER, **{PEERS_HEADER: "tcp://127.0.0.1:50048,tcp://127.0.0.1:50000"})
    # The pending link became PEER's (sequence continues at 2); the told-about endpoint
    # (not our own) got a link of its own.
    assert h.links.connected[PEER.hex()] == seed
    assert "endpoint:tcp://127.0.0.1:50048" in h.links.connected
    assert "endpoint:tcp://127.0.0.1:50000" not in h.links.connected
    h.core.join("G")
    assert [m.sequence for m in h.sent_to(PEER)] == [1, 2]
    # Losing the seed peer greets its endpoint again.
    h.message_from(PEER, Whisper(5, (b"gap",)))
    assert f"endpoint:{seed}" in h.links.connected


def test_api_refuses_empty_content_and_unready_peers() -> None:
    h = Harness()
    for call in (lambda: h.core.whisper(PEER, []), lambda: h.core.shout("G", [])):
        try:
            call()
        except ValueError:
            pass
        else:
            raise AssertionError("empty content accepted")
    assert h.core.whisper(PEER, [b"x"]) is False
    h.hello_from(PEER, groups=("G",))
    assert h.core.whisper(PEER, [b"a", b"b"]) is True
    assert h.core.shout("G", [b"c"]) == 1
    assert [type(m) for m in h.sent_to(PEER)] == [Hello, Whisper, Shout]


def test_leaving_beacon_exits_and_own_beacons_are_ignored() -> None:
    h = Harness()
    h.core.on_beacon(codec.Beacon(OWN, 50000), "127.0.0.1")
    assert not h.core.peers
    h.core.on_beacon(codec.Beacon(PEER, 51000), "127.0.0.1")
    h.hello_from(PEER)
    h.core.on_beacon(codec.Beacon(PEER, 0), "127.0.0.1")
    assert h.types() == ["ENTER", "EXIT"]


# -- zyre's extensions -------------------------------------------------------------------------


def test_elect_and_unknown_commands_count_in_the_sequence_and_keep_the_link() -> None:
    """zyre's ELECT (and any well-framed command we do not serve) is accepted: the WHISPER
    after it is in sequence, the peer stays; nothing is sent back for it."""
    h = Harness()
    h.hello_from(PEER)
    h.message_from(PEER, codec.Elect(2, "G", "20202020202020202020202020202020"))
    h.message_from(PEER, codec.Unknown(3, 42, b"\x01x"))
    h.message_from(PEER, Whisper(4, (b"after",)))
    assert h.types() == ["ENTER", "WHISPER"]
    assert h.events[-1].content == (b"after",)
    assert h.core.ignored == {"elect": 1, "unknown-command": 1}
    assert h.drops == {} and h.core.sequence_gaps == 0
    assert [type(m) for m in h.sent_to(PEER)] == [Hello]  # no answer to ELECT
    # Still a sequence: a gap after them is a gap.
    h.message_from(PEER, codec.Elect(6, "G", "x"))
    assert h.types()[-1] == "EXIT" and h.drops["sequence"] == 1


def test_a_decided_election_is_an_event_naming_the_leader() -> None:
    h = Harness()
    h.core.join("G")
    h.hello_from(PEER, groups=("G",))
    leader = PEER.hex().upper()
    # A LEADER with no election under way is ignored (zyre: "no CAW").
    h.message_from(PEER, codec.Leader(2, "G", leader))
    assert h.core.ignored == {"leader": 1}
    h.message_from(PEER, codec.Elect(3, "G", leader))  # the one member: echoed at once
    h.message_from(PEER, codec.Leader(4, "G", leader))  # LEADER from every member: decided
    h.message_from(PEER, Shout(5, "G", (b"s",)))
    assert h.types() == ["ENTER", "JOIN", "LEADER", "SHOUT"]
    event = h.events[2]
    assert (event.peer, event.name, event.group, event.leader) == (PEER, "n32", "G", leader)
    sent = h.sent_to(PEER)
    assert [type(m) for m in sent][-2:] == [codec.Elect, codec.Leader]
    # An election naming a node we do not know waits for its HELLO, then for no longer than
    # election_hold, and decides nothing we can tell about.
    other = "30303030303030303030303030303030"
    h.message_from(PEER, codec.Elect(6, "G", other))
    h.message_from(PEER, codec.Leader(7, "G", other))
    assert h.core.elections.running() == {} and h.core.elections_held == 1
    h.clock.advance(0.5)
    h.core.tick()
    assert h.core.elections.running() == {}  # decided at once: PEER is the one member
    assert h.types()[-1] == "SHOUT" and h.core.ignored["leader-unknown"] == 1


NEWCOMER = b"\x50" * 16


def test_a_relayed_elect_naming_a_newcomer_waits_for_its_hello() -> None:
    """Issue 35: a contester relays a newcomer's ELECT as soon as the newcomer greeted it;
    when the relay comes before the newcomer's own HELLO, zyre's count runs one member short
    (the wave is echoed twice to its father and never reaches the newcomer, whose election
    stalls). The relay waits for the HELLO, so the newcomer is a member when it counts."""
    h = Harness()
    h.core.join("G")
    h.hello_from(PEER, groups=("G",))
    h.hello_from(OTHER, groups=("G",))
    h.core.on_beacon(codec.Beacon(NEWCOMER, 50123), "127.0.0.1")  # greeted, no HELLO yet
    newcomer = NEWCOMER.hex().upper()
    h.message_from(PEER, codec.Elect(2, "G", newcomer))  # relayed: waits
    h.message_from(OTHER, codec.Elect(2, "G", newcomer))  # behind it, in order
    assert h.core.elections.running() == {} and h.core.elections_held == 1
    assert [type(m) for m in h.sent_to(OTHER)] == [Hello]
    h.hello_from(NEWCOMER, groups=("G",))
    # Now answered as if the HELLO had come first: the wave goes on to the newcomer too.
    assert h.core.elections.running() == {"G": newcomer}
    assert h.sent_to(NEWCOMER)[-1] == codec.Elect(2, "G", newcomer)
    assert h.sent_to(OTHER)[-1] == codec.Elect(2, "G", newcomer)
    # The newcomer's own ELECT makes three, the members: echoed once, to the father.
    h.message_from(NEWCOMER, codec.Elect(2, "G", newcomer))
    assert [m for m in h.sent_to(PEER) if isinstance(m, codec.Elect)] == [
        codec.Elect(2, "G", newcomer)
    ]


def test_held_election_messages_keep_each_peers_order() -> None:
    """A JOIN, LEAVE or exit of a peer whose ELECT is held goes after that ELECT; LEADER
    naming a newcomer waits too; a peer we know already is answered at once."""
    h = Harness()
    h.core.join("G")
    h.hello_from(PEER, groups=("G",))
    h.hello_from(OTHER, groups=("G",))
    newcomer = NEWCOMER.hex().upper()
    h.message_from(PEER, codec.Elect(2, "G", newcomer))
    assert h.core.elections.running() == {}
    h.message_from(PEER, codec.Leave(3, "G", 1))  # PEER's own order: its ELECT first
    assert h.core.elections.running() == {"G": newcomer}
    assert h.types()[-1] == "LEAVE"
    # A LEADER naming a node that has not greeted us waits as well.
    h.message_from(OTHER, codec.Leader(2, "G", newcomer))
    assert h.core.ignored["leader"] == 0 and h.core.elections_held == 2
    h.core.on_beacon(codec.Beacon(OTHER, 0), "127.0.0.1")  # OTHER leaves: its LEADER first
    assert h.types()[-1] == "EXIT" and h.core.elections.running() == {}
    # Named a ready peer: no wait.
    peer = PEER.hex().upper()
    h.message_from(PEER, codec.Join(4, "G", 2))
    h.message_from(PEER, codec.Elect(5, "G", peer))
    assert h.core.elections.running() == {"G": peer} and h.core.elections_held == 2


def test_goodbye_is_exit_at_once() -> None:
    h = Harness(expired=30.0)
    h.hello_from(PEER, groups=("G",))
    h.message_from(PEER, codec.Goodbye(2))
    assert h.types() == ["ENTER", "JOIN", "EXIT"]  # no clock advanced: at once
    assert PEER not in h.core.peers and PEER.hex() in h.links.closed
    assert "G" not in h.core.peer_groups and h.core.shout("G", [b"x"]) == 0
    assert h.drops == {}


def test_goodbye_before_hello_is_dropped_not_acted_on() -> None:
    h = Harness()
    h.message_from(PEER, codec.Goodbye(1))
    assert h.drops["unknown-peer"] == 1 and h.events == []


def test_leaving_in_gossip_mode_says_goodbye_to_the_greeted_peers_chosen() -> None:
    h = Harness()
    h.hello_from(PEER)
    h.hello_from(OTHER)
    h.core.on_beacon(codec.Beacon(b"\x40" * 16, 50_040), "127.0.0.1")  # greeted, no HELLO yet
    told = h.core.goodbye(lambda node: node != OTHER)
    assert sorted(told) == sorted([PEER.hex(), (b"\x40" * 16).hex()])
    # Each in its link's sequence, after our HELLO; nothing to the one left out.
    assert h.links.sent[PEER.hex()] == [h.links.sent[PEER.hex()][0], codec.Goodbye(2)]
    assert h.links.sent[(b"\x40" * 16).hex()][-1] == codec.Goodbye(2)
    assert [type(m) for m in h.links.sent[OTHER.hex()]] == [Hello]


# -- forged beacons ------------------------------------------------------------------------------


def forged(index: int) -> codec.Beacon:
    return codec.Beacon(index.to_bytes(4, "big") + b"\xf0" * 12, 1024 + index % 60000)


def test_forged_beacon_flood_is_bounded_counted_and_expires_oldest_first() -> None:
    h = Harness(max_pending=100, pending_expired=5.0)
    for index in range(5_000):
        h.core.on_beacon(forged(index), "127.0.0.1")
    # At most the bound holds a link; the rest cost a counter each.
    assert len(h.core.unready) == len(h.links.connected) == 100
    assert h.drops["pending-full"] == 4_900
    first = list(h.core.unready)
    assert first == [forged(i).uuid for i in range(100)]  # oldest first
    h.clock.advance(3)
    for index in range(5_000, 5_050):
        h.core.on_beacon(forged(index), "127.0.0.1")  # still full: refused
    h.core.tick()
    assert len(h.core.unready) == 100 and h.drops["no-hello"] == 0
    for _ in range(5):  # a running node ticks every second
        h.clock.advance(0.5)
        h.core.tick()
    # The first 100 waited 5.5 s without a HELLO: gone, links closed, oldest first.
    assert h.drops["no-hello"] == 100 and h.core.unready == {}
    assert h.links.closed == [uuid.hex() for uuid in first]
    assert h.links.connected == {}
    for index in range(5_050, 10_000):
        h.core.on_beacon(forged(index), "127.0.0.1")
    assert len(h.core.unready) == len(h.links.connected) == 100
    assert h.links.opened == 200
    assert h.drops["pending-full"] == 4_950 + 4_850
    # A real peer that greets us over TCP still gets in while the flood fills the bound.
    h.hello_from(PEER)
    assert PEER in h.core.peers and h.core.peers[PEER].ready and h.types() == ["ENTER"]


def test_a_greeting_peer_leaves_the_pending_set() -> None:
    h = Harness(max_pending=1)
    h.core.on_beacon(codec.Beacon(PEER, 50032), "127.0.0.1")
    h.core.on_beacon(codec.Beacon(OTHER, 50048), "127.0.0.1")
    assert h.drops["pending-full"] == 1 and OTHER not in h.core.peers
    h.hello_from(PEER)  # greets: no longer pending, so room for the next one
    assert h.core.unready == {}
    h.core.on_beacon(codec.Beacon(OTHER, 50048), "127.0.0.1")
    assert OTHER in h.core.unready
    h.clock.advance(6)
    h.core.tick()
    # The pending one is forgotten; the greeted one is not (it has until ``expired``).
    assert OTHER not in h.core.peers and h.drops["no-hello"] == 1
    assert h.core.peers[PEER].ready and "EXIT" not in h.types()


def test_own_and_known_beacons_open_no_second_link() -> None:
    h = Harness()
    h.core.on_beacon(codec.Beacon(OWN, 50000), "127.0.0.1")  # our own UUID
    h.core.on_beacon(codec.Beacon(OTHER, 50000), "127.0.0.1")  # names our own mailbox
    assert h.links.opened == 0 and h.drops["own-endpoint"] == 1
    h.hello_from(PEER)
    for _ in range(3):
        h.core.on_beacon(codec.Beacon(PEER, 50032), "127.0.0.1")
    h.core.on_beacon(codec.Beacon(PEER, 50033), "127.0.0.1")  # same UUID, other port
    assert h.links.opened == 1


def test_a_link_that_cannot_be_opened_leaves_no_peer_behind() -> None:
    h = Harness()
    h.links.capacity = 0
    h.core.on_beacon(codec.Beacon(PEER, 50032), "127.0.0.1")
    h.core.connect_endpoint("tcp://127.0.0.1:50099")
    assert h.core.peers == {} and h.core.unready == {} and h.core.pending == {}
    h.hello_from(OTHER)  # a HELLO whose link back cannot be opened: no half peer
    assert h.core.peers == {} and h.events == []
    h.links.capacity = 10
    h.core.on_beacon(codec.Beacon(PEER, 50032), "127.0.0.1")
    assert PEER in h.core.unready


def test_20zre_node_opens_no_link_for_a_known_36zre_peer() -> None:
    h = Harness(VERSION_20, hello_wait=2.0, pending_expired=5.0)
    h.core.on_beacon(codec.Beacon(PEER, 51000), "127.0.0.1")
    hello36 = codec.encode(Hello(1, "tcp://127.0.0.1:51000", (), 0, "zyre", {}), VERSION_36)
    h.core.on_message(codec.identity_of(PEER), hello36)
    h.clock.advance(10)
    h.core.tick()  # never greeted us in 20/ZRE: its link is closed
    assert PEER not in h.core.peers and h.links.connected == {}
    for _ in range(5):
        h.core.on_beacon(codec.Beacon(PEER, 51000), "127.0.0.1")
    assert h.links.opened == 1 and PEER not in h.core.peers
