"""Property-based fuzzing of a RUNNING ZRE node through real sockets.

Hypothesis generates batches mixing garbage mailbox messages (random frames, near-valid 36/ZRE
and 20/ZRE messages, valid commands from peers that never said HELLO, non-ZRE identities),
garbage UDP datagrams to the beacon port, and valid in-sequence WHISPERs, zyre's ELECT and
LEADER and commands no one defined (ids 0 and 11-255) from a peer that did greet. After
every example the node must still answer (a PING from the greeted peer gets its PING-OK),
every valid WHISPER must be delivered once and in order (ELECT, LEADER and unknown
commands counted as ignored, their sequence numbers counted), and the drop counters must
hold exactly the reasons the codec gives for every bad input. The oracle is the codec
(unit-tested in test_zre_codec.py).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
import pytest_twisted
import zmq
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bus.testing import wait_until
from bus.transport.zmqsocket import SocketFactory, SocketOptions
from bus.util.reactor import reactor_of
from bus.zre import codec
from bus.zre.codec import VERSION_20, VERSION_36, Hello, Ping, PingOk, Whisper, ZreError
from bus.zre.node import ZreNode
from tests.zre_helpers import EventLog, fast_config, free_udp_port

GOOD = b"\x61" * 16
STRANGER = b"\x62" * 16
Action = tuple[str, Any]


def mailbox_outcome(identity: bytes, frames: list[bytes]) -> str | None:
    """The drop reason for a message from a peer that never said HELLO (None: a HELLO)."""
    try:
        codec.uuid_of_identity(identity)
    except ZreError as error:
        return error.reason
    try:
        message = codec.parse(frames, VERSION_36)
    except ZreError as error:
        return error.reason
    return None if isinstance(message, Hello) else "unknown-peer"


def udp_outcome(data: bytes) -> str | None:
    try:
        codec.parse_beacon(data)
    except ZreError as error:
        return error.reason
    return None


@st.composite
def near_valid_frames(draw: st.DrawFn) -> list[bytes]:
    version = draw(st.sampled_from([VERSION_36, VERSION_20]))
    common: list[codec.Message] = [
        Whisper(1, (b"w",)),
        codec.Shout(2, "G", (b"s",)),
        codec.Join(3, "G", 1),
        codec.Leave(4, "G", 2),
        Ping(5),
        PingOk(6),
        Hello(1, "tcp://127.0.0.1:1", (), 0, "x", {}),
    ]
    zyre_only: list[codec.Message] = [
        codec.Elect(7, "G", "C"),
        codec.Leader(8, "G", "L"),
        codec.Goodbye(9),
        codec.Unknown(10, 11, b"\x01x", (b"c",)),
    ]
    message = draw(st.sampled_from(common + zyre_only if version == VERSION_36 else common))
    frames = codec.encode(message, version)
    head = bytearray(frames[0])
    how = draw(st.sampled_from(["as-is", "flip", "cut", "extra"]))
    if how == "flip":
        head[draw(st.integers(0, len(head) - 1))] = draw(st.integers(0, 255))
    elif how == "cut":
        head = head[: draw(st.integers(0, len(head) - 1))]
    elif how == "extra":
        frames.append(draw(st.binary(max_size=8)))
    return [bytes(head), *frames[1:]]


mailbox_garbage = st.tuples(
    st.sampled_from([codec.identity_of(STRANGER), b"\x7f\x01\x02", b"\x01" + b"\x63" * 16]),
    st.one_of(st.lists(st.binary(max_size=40), min_size=1, max_size=4), near_valid_frames()),
).filter(lambda case: mailbox_outcome(*case) is not None)  # a valid HELLO would add a peer

udp_garbage = st.one_of(
    st.binary(max_size=60),
    st.binary(min_size=18, max_size=18).map(lambda rest: b"ZRE\x01" + rest[:16] + b"\x00"),
    st.binary(min_size=18, max_size=18).map(lambda rest: b"ZRE\x02" + rest),
).filter(lambda data: udp_outcome(data) is not None)

short_text = st.text(max_size=40)  # at most 160 octets: fits a one-octet length
unknown_command = st.one_of(st.just(0), st.integers(11, 255))

batches = st.lists(
    st.one_of(
        mailbox_garbage.map(lambda case: ("mailbox", case)),
        udp_garbage.map(lambda data: ("udp", data)),
        st.lists(st.binary(max_size=30), min_size=1, max_size=3).map(lambda c: ("whisper", c)),
        st.tuples(short_text, short_text).map(lambda fields: ("elect", fields)),
        st.tuples(short_text, short_text).map(lambda fields: ("leader", fields)),
        st.tuples(unknown_command, st.binary(max_size=20), st.lists(st.binary(max_size=8))).map(
            lambda fields: ("unknown", fields)
        ),
    ),
    min_size=1,
    max_size=15,
)


@dataclass
class FuzzedNode:
    node: ZreNode
    events: EventLog
    factory: SocketFactory
    good: Any
    strangers: dict[bytes, Any]
    replies: list[list[bytes]]
    udp: Any
    sequence: int = 1
    delivered: list[tuple[bytes, ...]] = field(default_factory=list)


@pytest.fixture(scope="module")
def fuzzed() -> Iterator[FuzzedNode]:
    import socket

    port = free_udp_port()
    node = ZreNode(fast_config(port, evasive=600.0, expired=1200.0))
    events = EventLog()
    node.add_listener(events)
    node.startService()
    factory = SocketFactory(reactor_of(None))
    replies: list[list[bytes]] = []
    mailbox = factory.socket(zmq.ROUTER, replies.extend, SocketOptions(linger_ms=0))
    endpoint = mailbox.bind("tcp://127.0.0.1:*")

    def dealer(identity: bytes) -> Any:
        sock = factory.socket(
            zmq.DEALER, None, SocketOptions(identity=identity, linger_ms=0, send_hwm=100_000)
        )
        sock.connect(node.endpoint)
        return sock

    good = dealer(codec.identity_of(GOOD))
    good.send_frames(codec.encode(Hello(1, endpoint, (), 0, "good", {})))
    strangers = {
        i: dealer(i) for i in (codec.identity_of(STRANGER), b"\x7f\x01\x02", b"\x01" + b"\x63" * 16)
    }
    udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    udp.connect(("127.0.0.1", port))
    try:
        pytest_twisted.blockon(wait_until(lambda: GOOD in node.peers(), what="good peer ready"))
        yield FuzzedNode(node, events, factory, good, strangers, replies, udp)
    finally:
        udp.close()
        factory.shutdown()
        pytest_twisted.blockon(node.stopService())


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(batch=batches)
@pytest_twisted.inlineCallbacks
def test_node_survives_garbage_and_accounts_for_every_input(
    fuzzed: FuzzedNode, batch: list[Action]
) -> Any:
    f = fuzzed
    node = f.node
    drops_before = Counter(node.drops.counts)
    received_before = node.messages_received
    datagrams_before = node.udp.received if node.udp else 0
    events_before = len(f.events.events)
    assert node.core is not None
    ignored_before = Counter(node.core.ignored)
    expected_drops: Counter[str] = Counter()
    expected_ignored: Counter[str] = Counter()
    expected_events: list[tuple[str, Any]] = []
    mailbox_sent = datagrams_sent = 0
    for kind, item in batch:
        if kind == "mailbox":
            identity, frames = item
            f.strangers[identity].send_frames(frames)
            expected_drops[mailbox_outcome(identity, frames)] += 1  # type: ignore[index]
            mailbox_sent += 1
        elif kind == "udp":
            f.udp.send(item)
            expected_drops[udp_outcome(item)] += 1  # type: ignore[index]
            datagrams_sent += 1
        else:
            f.sequence += 1
            message: codec.Message
            if kind == "whisper":
                message = Whisper(f.sequence, tuple(item))
                expected_events.append(("WHISPER", tuple(item)))
            elif kind == "elect":
                message = codec.Elect(f.sequence, *item)
                expected_ignored["elect"] += 1
            elif kind == "leader":
                message = codec.Leader(f.sequence, *item)
                # No election of ours under way (the node is in no group): ignored, as zyre.
                expected_ignored["leader"] += 1
            else:
                command, body, content = item
                message = codec.Unknown(f.sequence, command, body, tuple(content))
                expected_ignored["unknown-command"] += 1
            f.good.send_frames(codec.encode(message))
            mailbox_sent += 1
    # The probe: the greeted peer's PING, answered with PING-OK once all before it is handled.
    f.sequence += 1
    replies_before = len(f.replies)
    f.good.send_frames(codec.encode(Ping(f.sequence)))
    mailbox_sent += 1
    yield wait_until(
        lambda: any(isinstance(codec.parse(m[1:]), PingOk) for m in f.replies[replies_before:]),
        what="PING-OK to the probe",
    )
    yield wait_until(
        lambda: (
            node.messages_received - received_before == mailbox_sent
            and (node.udp.received if node.udp else 0) - datagrams_before >= datagrams_sent
        ),
        what="every message and datagram read",
    )
    delivered = [
        (e.type, e.content if e.type == "WHISPER" else (e.group, e.leader))
        for e in f.events.events[events_before:]
    ]
    assert delivered == expected_events
    assert Counter(node.drops.counts) - drops_before == expected_drops
    assert node.core is not None
    assert Counter(node.core.ignored) - ignored_before == expected_ignored
    assert node.peers() == [GOOD]
    assert f.events.types(GOOD).count("ENTER") == 1 and "EXIT" not in f.events.types()
