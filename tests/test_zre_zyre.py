"""Our node against a fake of zyre (tests/zre_peers/zyre_fake.py) through real sockets on
loopback: zyre's ELECT, LEADER and GOODBYE must not cut the link, and zyre's election must
finish with our node in the group (it answers ELECT and LEADER as a plain zyre member)."""

from __future__ import annotations

from typing import Any

import pytest_twisted

from bus.testing import wait_until
from bus.zre import codec
from bus.zre.node import ZreNode
from tests.zre_helpers import EventLog, fast_config, free_udp_port
from tests.zre_peers.zyre_fake import FakeZyre

#: What our node may send a peer that never spoke zyre's extensions (pyre dies on them).
SENDABLE = (codec.Hello, codec.Whisper, codec.Shout, codec.Join, codec.Leave, codec.Ping)


@pytest_twisted.inlineCallbacks
def test_zyre_contesting_a_group_keeps_its_link_and_goodbye_ends_it_at_once() -> Any:
    port = free_udp_port()
    # Long timers: an EXIT below can only come from GOODBYE.
    node = ZreNode(fast_config(port, name="bus", groups=["CONTEST"], evasive=30.0, expired=60.0))
    events = EventLog()
    node.add_listener(events)
    node.startService()
    zyre = FakeZyre(port, groups=["GLOBAL"])
    # A peer outside the contested group (as pyre): it is never sent an election message.
    quiet = FakeZyre(port, name="pyre-like", groups=["OTHER"])
    try:
        # Found by its beacon, greeted by us, greeted back.
        yield wait_until(lambda: {zyre.uuid, quiet.uuid} <= set(node.peers()), what="ENTERs")
        zyre.join("CONTEST")
        zyre.contest("CONTEST")
        # zyre sends LEADER only once we echoed its ELECT (we are its one member, it ours),
        # and reports it once we passed its LEADER on: the election finishes.
        yield wait_until(lambda: zyre.elected, what="zyre's election to finish")
        assert zyre.elected == [zyre.uuid_text]
        zyre.shout("CONTEST", [b"shout", b"two frames"])
        zyre.whisper([b"whisper"])
        yield wait_until(lambda: events.of("WHISPER", zyre.uuid), what="zyre's WHISPER")
        assert events.types(zyre.uuid) == ["ENTER", "JOIN", "JOIN", "LEADER", "SHOUT", "WHISPER"]
        [leader] = events.of("LEADER")
        assert (leader.group, leader.leader) == ("CONTEST", zyre.uuid_text)
        [shout] = events.of("SHOUT")
        assert (shout.group, shout.content) == ("CONTEST", (b"shout", b"two frames"))
        assert node.core is not None and node.core.elections.leaders == {"CONTEST": zyre.uuid_text}
        assert node.core.elections.running() == {}
        # No flapping: beacons keep coming, the link holds, nothing was out of sequence.
        beacons = node.beacons_received
        yield wait_until(lambda: node.beacons_received >= beacons + 5, what="more beacons")
        assert len(events.of("ENTER", zyre.uuid)) == 1 and not events.of("EXIT")
        assert node.drops.counts["sequence"] == 0 and node.drops.total == 0
        # Both ways: our SHOUT and WHISPER reach zyre's mailbox.
        assert node.shout("CONTEST", [b"back"]) == 1
        assert node.whisper(zyre.uuid, [b"to zyre"])
        yield wait_until(
            lambda: any(isinstance(m, codec.Whisper) for _, m in zyre.received), what="to zyre"
        )
        sent = [m for identity, m in zyre.received if identity == codec.identity_of(node.uuid)]
        # To zyre: one ELECT (the echo) and one LEADER, numbered with the rest.
        assert [type(m) for m in sent if not isinstance(m, SENDABLE)] == [
            codec.Elect,
            codec.Leader,
        ]
        assert [m.sequence for m in sent] == list(range(1, len(sent) + 1))
        to_quiet = [m for i, m in quiet.received if i == codec.identity_of(node.uuid)]
        assert to_quiet and all(isinstance(m, SENDABLE) for m in to_quiet)
        # GOODBYE: EXIT at once (60 s before expiry would say so).
        zyre.goodbye()
        yield wait_until(lambda: events.of("EXIT", zyre.uuid), timeout=10, what="EXIT")
        assert zyre.uuid not in node.peers()
        assert events.types(zyre.uuid)[-1] == "EXIT"
        assert node.status()["ignored"] == {}
    finally:
        quiet.close()
        zyre.close()
        yield node.stopService()


@pytest_twisted.inlineCallbacks
def test_an_elect_relayed_before_the_newcomers_hello_is_answered_after_it() -> Any:
    """Issue 35, through real sockets: a contester relays a newcomer's ELECT to us before the
    newcomer's HELLO came (it greeted the contester first). zyre's count would then run one
    member short: the wave echoed to the relay at once and never passed on to the newcomer,
    whose election stalls. The node answers the relay once the HELLO came, as if it had come
    first: ELECT to the newcomer, then one echo to the relay after the newcomer's own."""
    port = free_udp_port()
    node = ZreNode(fast_config(port, name="bus", groups=["G"], evasive=30.0, expired=60.0))
    node.startService()
    relay = FakeZyre(port, name="relay", groups=["G"])
    newcomer = FakeZyre(port, name="newcomer", groups=["G"], greet_back=False)
    ours = codec.identity_of(node.uuid)
    challenger = newcomer.uuid_text

    def elects(fake: FakeZyre) -> list[codec.Message]:
        return [m for i, m in fake.received if i == ours and isinstance(m, codec.Elect)]

    try:
        yield wait_until(lambda: relay.uuid in node.peers(), what="the relay's HELLO")
        # The node heard the newcomer's beacon and greeted it; the newcomer has not answered.
        yield wait_until(lambda: newcomer.unanswered is not None, what="our HELLO to it")
        relay.send(codec.Elect(0, "G", challenger))
        assert node.core is not None
        yield wait_until(lambda: node.core.elections_held == 1, what="the relay held")
        assert node.core.elections.running() == {} and elects(relay) == []
        newcomer.greet()
        newcomer.send(codec.Elect(0, "G", challenger))
        # Sent to the newcomer first, but on another connection than the echo: the relay's
        # mailbox may be read first.
        yield wait_until(
            lambda: elects(relay) and elects(newcomer), what="the echo to the relay, the ELECT"
        )
        assert elects(newcomer) == [codec.Elect(2, "G", challenger)]
        [echo] = elects(relay)
        assert echo.challenger == challenger  # type: ignore[union-attr]
        assert node.core.elections.running() == {"G": challenger}
        assert node.status()["elections_held"] == 1 and node.drops.total == 0
    finally:
        newcomer.close()
        relay.close()
        yield node.stopService()


@pytest_twisted.inlineCallbacks
def test_a_stray_leader_that_comes_last_does_not_name_the_leader() -> Any:
    """Issue 35, through real sockets: three zyres finish a wave for the best of them; the
    worst, which restarted its election late, sends LEADER(itself) last. zyre would report
    that one; the node reports the challenger whose wave it followed, as the zyres did."""
    port = free_udp_port()
    node = ZreNode(fast_config(port, name="bus", groups=["G"], evasive=30.0, expired=60.0))
    events = EventLog()
    node.add_listener(events)
    node.startService()
    zyres = sorted(
        (FakeZyre(port, name=f"z{n}", groups=["G"]) for n in range(3)),
        key=lambda z: z.uuid_text,
    )
    best, middle, worst = zyres
    try:
        yield wait_until(lambda: {z.uuid for z in zyres} <= set(node.peers()), what="HELLOs")
        for zyre in zyres:
            zyre.send(codec.Elect(0, "G", best.uuid_text))
        best.send(codec.Leader(0, "G", best.uuid_text))
        middle.send(codec.Leader(0, "G", best.uuid_text))
        # Sent once the node read the others (HELLOs, ELECTs, LEADERs), so that it comes last.
        yield wait_until(lambda: node.messages_received >= 8, what="the two LEADERs")
        assert node.core is not None and node.core.elections.running() == {"G": best.uuid_text}
        worst.send(codec.Leader(0, "G", worst.uuid_text))
        yield wait_until(lambda: events.of("LEADER"), what="the decision")
        [leader] = events.of("LEADER")
        assert (leader.peer, leader.leader) == (best.uuid, best.uuid_text)
        assert node.core.elections.leaders == {"G": best.uuid_text}
    finally:
        for zyre in zyres:
            zyre.close()
        yield node.stopService()


@pytest_twisted.inlineCallbacks
def test_a_member_that_joins_during_a_wave_gets_its_elect() -> Any:
    """Issue 35, through real sockets: the node follows a wave (its challenger's ELECT came
    first) when a newcomer's HELLO names the group. A plain zyre never sends the newcomer
    that wave's ELECT, and the newcomer, which waits for one from every member, stalls; the
    node sends it one, as if the newcomer had been a member when the wave came."""
    port = free_udp_port()
    node = ZreNode(fast_config(port, name="bus", groups=["G"], evasive=30.0, expired=60.0))
    node.startService()
    challenger = FakeZyre(port, name="challenger", groups=["G"])
    newcomer = FakeZyre(port, name="newcomer", groups=["G"], greet_back=False)
    ours = codec.identity_of(node.uuid)

    def elects(fake: FakeZyre) -> list[codec.Message]:
        return [m for i, m in fake.received if i == ours and isinstance(m, codec.Elect)]

    try:
        yield wait_until(lambda: challenger.uuid in node.peers(), what="the challenger's HELLO")
        challenger.send(codec.Elect(0, "G", challenger.uuid_text))
        # Its one member's ELECT: echoed to it at once; the node follows its wave.
        yield wait_until(lambda: elects(challenger), what="the echo")
        yield wait_until(lambda: newcomer.unanswered is not None, what="our HELLO to it")
        newcomer.greet()
        yield wait_until(lambda: elects(newcomer), what="the wave's ELECT to the newcomer")
        assert elects(newcomer) == [codec.Elect(2, "G", challenger.uuid_text)]
        assert node.core is not None
        assert node.core.elections.running() == {"G": challenger.uuid_text}
        assert len(elects(challenger)) == 1 and node.drops.total == 0
    finally:
        newcomer.close()
        challenger.close()
        yield node.stopService()
