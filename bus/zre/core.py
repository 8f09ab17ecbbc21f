"""The ZRE node's state machine: beacons, messages, API calls and time in; links, frames
and events out. No sockets here: :class:`Links` is whatever carries frames (the Twisted
node's DEALER sockets, or a fake in unit tests), the clock is injected.

Rules it keeps (36/ZRE as zyre and pyre speak it, 20/ZRE as the draft writes it):

* a peer is known by its UUID; it is *ready* once its HELLO arrived (ENTER), and anything
  else it sends before that is dropped;
* our messages to a peer carry a sequence starting at 1 with HELLO and rising by one; a
  peer's messages must do the same, else the peer is dropped (EXIT);
* our group status rises by one per JOIN or LEAVE and each JOIN/LEAVE carries the new value
  (a wrong value kills pyre and aborts zyre); a peer's wrong value is counted and followed;
* a second HELLO from a ready peer is EXIT then ENTER;
* zyre's extensions count in the sequence like any message: GOODBYE is EXIT at once;
  ELECT and LEADER are answered as a zyre member that never contests answers them
  (:mod:`bus.zre.election`), and an election decided (a LEADER from every member) is an
  event naming the leader; an ELECT or LEADER that counts and names a node that has not
  greeted us yet waits for its HELLO (at most ``election_hold``), with the group's election
  messages behind it, so that a newcomer is a member before its wave is counted; any
  well-framed unknown command is counted (``ignored``) and otherwise not acted on;
* peers found by beacon and not greeted yet are bounded (``max_pending``; a forged beacon
  flood is refused and counted) and forgotten after ``pending_expired`` without a HELLO;
* silent for ``evasive``: EVASIVE and a PING; for twice that, SILENT; for ``expired``: EXIT;
  but a tick that comes late (the node did not run: :mod:`bus.util.wakes`) judges no one's
  silence, nor does any in the half ``reap_interval`` after it;
* a 20/ZRE node waits ``hello_wait`` before greeting a peer found by beacon: a 36/ZRE peer
  greets first (as zyre and pyre do at once), is recognised, and is never sent a 20/ZRE
  frame (it cannot parse them).
"""

from __future__ import annotations

import uuid as uuidlib
from collections import Counter, deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from zmq.utils import z85

from bus.util.wakes import Wakes
from bus.zre import codec
from bus.zre.codec import (
    VERSION_20,
    VERSION_36,
    Elect,
    Goodbye,
    Hello,
    Join,
    Leader,
    Leave,
    Message,
    Ping,
    PingOk,
    Shout,
    Unknown,
    Whisper,
    ZreError,
)
from bus.zre.election import Elections

#: HELLO header with the endpoints of the peers a node knows, so that a node that found
#: one peer through ``--peer`` finds the rest (networks without broadcast).
PEERS_HEADER = "X-ZRE-PEERS"
#: HELLO header of the ZRE/LOG service (20/ZRE).
LOG_HEADER = "X-ZRELOG"
#: 20/ZRE's HELLO has no name field: our 20/ZRE nodes send it as this header.
NAME_HEADER = "X-ZRE-NAME"

EVENT_TYPES = (
    "ENTER",
    "EXIT",
    "JOIN",
    "LEAVE",
    "WHISPER",
    "SHOUT",
    "EVASIVE",
    "SILENT",
    "LEADER",
)


@dataclass(slots=True)
class ZreEvent:
    """What a node tells its listeners. Every listener gets the same object: read it, do not
    change it (not frozen: a frozen dataclass costs four times as much to build, one per
    delivery)."""

    type: str
    peer: bytes
    name: str
    group: str | None = None
    content: tuple[bytes, ...] = ()
    headers: Mapping[str, str] = field(default_factory=dict)
    endpoint: str = ""
    #: LEADER: the elected node of ``group``, as the peer wrote it (zyre: its UUID as text).
    leader: str = ""

    @property
    def peer_hex(self) -> str:
        """The peer's UUID as 32 hex digits."""
        return uuidlib.UUID(bytes=self.peer).hex


class Links(Protocol):
    """Outgoing connections, one per peer (a DEALER with our identity), named by key."""

    def connect(self, key: str, endpoint: str, server_key: bytes | None = None) -> bool:
        """Open the link (a CURVE client of ``server_key``, a Z85 public key, when given);
        False when it cannot be opened (no descriptors to spare)."""
        ...

    def send(self, key: str, frames: list[bytes]) -> bool:
        """Send ``frames`` on link ``key``; False when they were not sent (no such link, or its
        queue is full)."""
        ...

    def close(self, key: str) -> None:
        """Close link ``key``."""
        ...

    def rekey(self, old: str, new: str) -> None:
        """Name link ``old`` ``new`` from now on (a link opened to an endpoint becomes its
        peer's)."""
        ...


@dataclass(slots=True)
class ZreSettings:
    """The node's identity (UUID, name, mailbox), dialect, headers, timeouts and bounds."""

    uuid: bytes
    name: str
    endpoint: str
    version: int = VERSION_36
    headers: dict[str, str] = field(default_factory=dict)
    evasive: float = 5.0
    expired: float = 30.0
    #: 20/ZRE only: how long to wait for a peer found by beacon to greet first.
    hello_wait: float = 2.0
    #: Peers found by beacon that have not said HELLO yet, at most (each holds a link).
    max_pending: int = 100
    #: A peer found by beacon that says no HELLO this long after we could greet it is
    #: forgotten (zyre and pyre answer at once); its next beacon starts over.
    pending_expired: float = 5.0
    #: Our CURVE public key (Z85) when the node speaks CURVE, as zyre with a certificate:
    #: then only peers that announce a key (a version 3 beacon, an X-PUBLICKEY header) are
    #: met, and each link is a CURVE client of its peer's key.
    public_key: bytes | None = None
    #: With CURVE: whether a peer's key (Z85) may be met (an allow-list; None: any key).
    key_allowed: Callable[[bytes], bool] | None = None
    #: How long an ELECT or LEADER naming a node that has not greeted us yet waits for its
    #: HELLO (see :meth:`ZreCore._election`); it comes within milliseconds.
    election_hold: float = 0.5
    #: How often :meth:`ZreCore.tick` is called (a later tick says the node did not run).
    reap_interval: float = 1.0


@dataclass(slots=True)
class Peer:
    """A node we know: its link, what its HELLO said, its groups, and the sequences both ways."""

    uuid: bytes
    key: str
    endpoint: str
    discovered_at: float
    last_seen: float
    name: str = ""
    headers: dict[str, str] = field(default_factory=dict)
    groups: set[str] = field(default_factory=set)
    status: int = 0
    ready: bool = False
    want_sequence: int = 0
    sent_sequence: int = 0
    hello_sent: bool = False
    hello_due: float = 0.0
    #: 20/ZRE node: this peer speaks 36/ZRE; never send it anything.
    foreign: bool = False
    #: Its CURVE public key (Z85), when the node speaks CURVE.
    public_key: bytes | None = None
    evasive: bool = False
    silent: bool = False

    @property
    def hex(self) -> str:
        """The peer's UUID as 32 hex digits."""
        return uuidlib.UUID(bytes=self.uuid).hex


@dataclass(slots=True)
class PendingLink:
    """A link opened to an endpoint before the UUID behind it is known (``--peer``)."""

    endpoint: str
    opened_at: float
    sent_sequence: int = 0
    hello_sent: bool = False
    seed: bool = False


@dataclass(slots=True)
class _HeldElection:
    """An election message waiting for the HELLO of the node it names."""

    node: bytes
    message: Elect | Leader
    arrived: float


#: Identities remembered by the mailbox's reader before it starts over (a flood of made-up
#: ones costs a reset, not memory).
_MAX_IDENTITIES = 4096

DropHandler = Callable[[str, str, bytes], None]
EventHandler = Callable[[ZreEvent], None]


class ZreCore:
    """A ZRE node's peers and groups: beacons, messages and calls in; links, frames and events out
    (see the module's text)."""

    def __init__(
        self,
        settings: ZreSettings,
        links: Links,
        clock: Callable[[], float],
        emit: EventHandler,
        drop: DropHandler,
    ) -> None:
        self.settings = settings
        self.links = links
        self.clock = clock
        self.emit = emit
        self.drop = drop
        self.peers: dict[bytes, Peer] = {}
        self.pending: dict[str, PendingLink] = {}
        #: Whether a tick may judge silence (not one after a stall of the node).
        self.wakes = Wakes(settings.reap_interval, clock)
        self.own_groups: list[str] = []
        self.peer_groups: dict[str, set[bytes]] = {}
        self.status = 0
        self.seeds: set[str] = set()
        #: UUIDs that greeted a 20/ZRE node in 36/ZRE (bounded).
        self.foreign: dict[bytes, float] = {}
        self.status_mismatches = 0
        self.sequence_gaps = 0
        self.sent = 0
        #: Valid messages accepted (their sequence counted) but not acted on, by reason.
        self.ignored: Counter[str] = Counter()
        #: Peers found by beacon, not greeted yet, oldest first (a subset of ``peers``).
        self.unready: dict[bytes, Peer] = {}
        #: ROUTER identity -> UUID, as read before (bounded).
        self._nodes: dict[bytes, bytes] = {}
        # A group's members are ready peers (a HELLO or a JOIN made them members).
        self.elections = Elections(
            lambda group: self.peer_groups.get(group, ()),
            lambda group: group in self.own_groups,
        )
        #: Each group's election messages waiting for a newcomer's HELLO, in arrival order.
        self._held: dict[str, deque[_HeldElection]] = {}
        #: Election messages that had to wait for a HELLO (the first of each wait).
        self.elections_held = 0

    @property
    def version(self) -> int:
        """The dialect spoken: 2 (36/ZRE) or 1 (20/ZRE)."""
        return self.settings.version

    # -- discovery ---------------------------------------------------------------------------

    def on_beacon(self, beacon: codec.Beacon, host: str) -> None:
        """A beacon from ``host``: a new peer is linked and greeted, a known one is seen, a leaving
        one is removed."""
        if beacon.uuid == self.settings.uuid:
            return
        peer = self.peers.get(beacon.uuid)
        if beacon.leaving:
            if peer is not None:
                self.remove_peer(peer)
            return
        if peer is not None:
            peer.last_seen = self.clock()
            return
        met, server_key = self._beacon_key(beacon)
        if not met:
            return
        if beacon.uuid in self.foreign:
            # A 36/ZRE peer of a 20/ZRE node: we never talk to it, so hold no link for it.
            self.foreign[beacon.uuid] = self.clock()
            return
        endpoint = f"tcp://{host}:{beacon.port}"
        if endpoint == self.settings.endpoint:
            self.drop("own-endpoint", f"beacon naming our own mailbox {endpoint}", beacon.uuid)
            return
        if len(self.unready) >= self.settings.max_pending:
            # A forged flood costs a counter, never a socket (zyre and pyre greet us over
            # TCP on our own beacon too, so a real peer still gets in).
            self.drop("pending-full", f"{len(self.unready)} peers not greeted yet", beacon.uuid)
            return
        self.require_peer(beacon.uuid, endpoint, by_beacon=True, public_key=server_key)

    def _beacon_key(self, beacon: codec.Beacon) -> tuple[bool, bytes | None]:
        """Whether a beacon's node is ours to meet (a CURVE node and a plain one never meet;
        a refused key is counted), and the Z85 key it announces (None without CURVE)."""
        if self.settings.public_key is None:
            if beacon.public_key is not None:
                self.drop("curve-beacon", "a CURVE node's beacon (we speak plain)", beacon.uuid)
                return False, None
            return True, None
        if beacon.public_key is None:
            self.drop("plain-beacon", "a plain node's beacon (we speak CURVE)", beacon.uuid)
            return False, None
        key = z85.encode(beacon.public_key)
        return self._key_allowed(key, beacon.uuid), key

    def _key_allowed(self, key: bytes, node: bytes) -> bool:
        allowed = self.settings.key_allowed
        if allowed is None or allowed(key):
            return True
        self.drop("refused-key", f"peer key {key.decode('ascii')} is not on the list", node)
        return False

    def require_peer(
        self,
        node: bytes,
        endpoint: str,
        by_beacon: bool = False,
        public_key: bytes | None = None,
    ) -> Peer | None:
        """The peer ``node``, found now at ``endpoint`` (None: no link could be opened);
        ``public_key``: its Z85 key, to which the link is a CURVE client."""
        peer = self.peers.get(node)
        if peer is not None:
            return peer
        # A node restarted on the same endpoint with a new UUID replaces the old one.
        for other in list(self.peers.values()):
            if other.endpoint == endpoint:
                self.remove_peer(other)
        now = self.clock()
        key = uuidlib.UUID(bytes=node).hex
        peer = Peer(node, key, endpoint, now, now, public_key=public_key)
        pending = self.pending.pop(endpoint, None)
        if pending is not None:
            # The link opened to this endpoint becomes the peer's.
            self.links.rekey(_pending_key(endpoint), key)
            peer.sent_sequence = pending.sent_sequence
            peer.hello_sent = pending.hello_sent
            peer.hello_due = pending.opened_at + self.settings.hello_wait
            self.peers[node] = peer
        else:
            if not self.links.connect(key, endpoint, public_key):
                return None  # the link layer counted why
            self.peers[node] = peer
            if node in self.foreign:
                peer.foreign = True
            elif self.version == VERSION_20 and by_beacon:
                peer.hello_due = now + self.settings.hello_wait
            else:
                self._send_hello(peer)
        if by_beacon:
            self.unready[node] = peer
        return peer

    def connect_endpoint(self, endpoint: str, seed: bool = False) -> None:
        """Open a link to ``endpoint`` and greet whoever is there (``--peer``). A node that
        speaks CURVE needs the peer's key: ``tcp://host:port|KEY`` (zyre's gossip form)."""
        endpoint, _, key = endpoint.partition("|")
        server_key = key.encode("ascii", "replace") if key else None
        if self.settings.public_key is not None:
            if server_key is None or len(server_key) != 40:
                self.drop("no-public-key", f"{endpoint}: a CURVE node needs endpoint|KEY", b"")
                return
            if not self._key_allowed(server_key, b""):
                return
        else:
            server_key = None
        if seed:
            self.seeds.add(endpoint)
        if endpoint == self.settings.endpoint or endpoint in self.pending:
            return
        if endpoint in self._endpoints():
            return
        now = self.clock()
        link = PendingLink(endpoint, now, seed=endpoint in self.seeds)
        if not self.links.connect(_pending_key(endpoint), endpoint, server_key):
            return  # the link layer counted why
        self.pending[endpoint] = link
        link.sent_sequence = 1
        link.hello_sent = True
        self._send(_pending_key(endpoint), self._hello(1))

    def _endpoints(self) -> set[str]:
        return {peer.endpoint for peer in self.peers.values()}

    # -- messages from peers -----------------------------------------------------------------

    def on_messages(self, batch: Iterable[Sequence[bytes]]) -> None:
        """Messages read from the mailbox together, each the ROUTER identity then the
        message's frames (one clock reading for them all)."""
        now = self.clock()
        on_message = self._on_message
        for frames in batch:
            if len(frames) < 2:
                self.drop("no-identity", "message without identity and body", b"")
                continue
            on_message(frames[0], frames[1:], now)

    def on_message(self, identity: bytes, frames: Sequence[bytes]) -> None:
        """A message read from the mailbox, from the peer whose DEALER has ``identity``."""
        self._on_message(identity, frames, self.clock())

    def _on_message(self, identity: bytes, frames: Sequence[bytes], now: float) -> None:
        node = self._nodes.get(identity)
        if node is None:
            try:
                node = codec.uuid_of_identity(identity)
            except ZreError as error:
                self.drop(error.reason, str(error), identity)
                return
            if len(self._nodes) >= _MAX_IDENTITIES:
                self._nodes.clear()
            self._nodes[identity] = node
        version = self.settings.version
        if version == VERSION_20 and frames and codec.sniff_version(frames[0]) == 2:
            self._foreign_peer(node)
            self.drop("dialect-36", "36/ZRE message to a 20/ZRE node", identity)
            return
        try:
            message = codec.parse(frames, version)
        except ZreError as error:
            self.drop(error.reason, str(error), identity)
            return
        if isinstance(message, Hello):
            self._on_hello(node, message, identity, now)
            return
        peer = self.peers.get(node)
        if peer is None:
            self.drop("unknown-peer", f"{codec.command_name(message)} before HELLO", identity)
            return
        if not peer.ready:
            self.drop("not-ready", f"{codec.command_name(message)} before HELLO", identity)
            return
        sequence, want = message.sequence, peer.want_sequence
        # pyre wraps after 65534 (modulo 65535), zyre after 65535: both are in order.
        if sequence == ((want + 1) & 0xFFFF) or (want == 65534 and sequence == 0):
            peer.want_sequence = sequence
        else:
            self.sequence_gaps += 1
            self.drop("sequence", f"expected {(want + 1) & 0xFFFF}, got {sequence}", identity)
            self.remove_peer(peer)
            return
        self._refresh(peer, now)
        # The data path first.
        if isinstance(message, Shout):
            self.emit(ZreEvent("SHOUT", node, peer.name, message.group, message.content))
        elif isinstance(message, Whisper):
            self.emit(ZreEvent("WHISPER", node, peer.name, None, message.content))
        elif isinstance(message, Elect | Leader):
            self._election(node, message, now)
        elif isinstance(message, Goodbye):
            # zyre in gossip mode says it is leaving: gone now, as zyre itself does.
            self.remove_peer(peer)
        elif isinstance(message, Unknown):
            self.ignored["unknown-command"] += 1
        elif isinstance(message, Join | Leave):
            self._on_membership(peer, message, identity)
        elif isinstance(message, Ping):
            self._send_to(peer, PingOk(0))

    def _on_hello(self, node: bytes, hello: Hello, identity: bytes, now: float) -> None:
        if node == self.settings.uuid:
            self.drop("own-hello", "a HELLO with our own UUID", identity)
            return
        if hello.sequence != 1:
            self.drop("sequence", f"HELLO with sequence {hello.sequence}", identity)
            return
        public_key: bytes | None = None
        if self.settings.public_key is not None:
            # As zyre: a HELLO without a key would downgrade the link; a key not on the
            # list is refused.
            announced = dict(hello.headers).get(codec.PUBLIC_KEY_HEADER, "")
            if len(announced) != 40:
                self.drop("no-public-key", "a HELLO without X-PUBLICKEY (we speak CURVE)", node)
                return
            public_key = announced.encode("ascii", "replace")
            if not self._key_allowed(public_key, node):
                return
        peer = self.peers.get(node)
        if peer is not None and peer.ready:
            # The peer restarted its conversation: it leaves, then enters anew.
            self.remove_peer(peer)
            peer = None
        if peer is None:
            peer = self.require_peer(node, hello.endpoint, public_key=public_key)
            if peer is None:
                return
        if public_key is not None:
            peer.public_key = public_key
        self.unready.pop(node, None)
        peer.ready = True
        peer.foreign = False
        peer.want_sequence = 1
        peer.endpoint = hello.endpoint
        peer.headers = dict(hello.headers)
        peer.name = hello.name or peer.headers.get(NAME_HEADER, "") or hello.endpoint
        self._refresh(peer, now)
        if not peer.hello_sent:
            self._send_hello(peer)
        self.emit(
            ZreEvent("ENTER", node, peer.name, headers=dict(peer.headers), endpoint=peer.endpoint)
        )
        for group in hello.groups:
            self._peer_joins(peer, group)
        peer.status = hello.status
        for group in list(self._held):
            self._release(group, now)
        told = _told_endpoints(peer.headers.get(PEERS_HEADER, ""))
        if told:
            known = self._endpoints()
            for endpoint in told:
                if len(self.pending) >= self.settings.max_pending:
                    # A HELLO may name any number of endpoints: each would hold a link.
                    self.drop("pending-full", "endpoints told in X-ZRE-PEERS", identity)
                    break
                if endpoint not in known:
                    self.connect_endpoint(endpoint)

    def _on_membership(self, peer: Peer, message: Join | Leave, identity: bytes) -> None:
        self._release_from(peer.uuid, message.group)
        expected = (peer.status + 1) & 0xFF
        if message.status != expected:
            self.status_mismatches += 1
            self.drop(
                "status",
                f"{codec.command_name(message)} {message.group!r} with status "
                f"{message.status}, expected {expected}",
                identity,
            )
        peer.status = message.status
        if isinstance(message, Join):
            self._peer_joins(peer, message.group)
        else:
            self._peer_leaves(peer, message.group)

    def _election(self, node: bytes, message: Elect | Leader, now: float) -> None:
        """An ELECT or LEADER from ``node``, answered now or, when it counts and names a node
        that has not greeted us yet (:meth:`_may_wait`), once that node's HELLO came (or
        ``election_hold`` passed).

        zyre's echo wave counts messages against the group's members, so a member must
        count a newcomer's wave with the newcomer among them: a contester relays the
        newcomer's ELECT as soon as the newcomer greeted *it*, and when that relay comes
        before the newcomer's own HELLO here (it greeted us last), a member counts one member
        short, echoes to its father twice and never passes the wave on to the newcomer,
        whose election then stalls. Holding the relay (and the group's election messages
        behind it, in order) until the HELLO is an order the network could have delivered
        too: the HELLO comes on another link than anything held, and each link's messages
        keep their order (see :meth:`_release_from`)."""
        group = message.group
        queue = self._held.get(group)
        if queue is None:
            if group not in self.own_groups or not self._may_wait(message):
                self._on_election(node, message)
                return
            queue = self._held[group] = deque()
            self.elections_held += 1
        queue.append(_HeldElection(node, message, now))
        self._release(group, now)

    def _may_wait(self, message: Elect | Leader) -> bool:
        """Whether a message opens a wait: only one that names a node not greeted yet and
        that counts (an ELECT that starts a wave, a LEADER while one is followed): one that
        is ignored whatever the members are never holds the group's next messages back."""
        if self._greeted_us(message):
            return False
        following = self.elections.following(message.group)
        if isinstance(message, Elect):
            return following is None or message.challenger < following
        return following is not None

    def _greeted_us(self, message: Elect | Leader) -> bool:
        """Whether the node an election message names is a ready peer (or one we never wait
        for: ourselves, or not an id at all)."""
        named = message.challenger if isinstance(message, Elect) else message.leader
        try:
            node = bytes.fromhex(named)
        except ValueError:
            return True
        if len(node) != 16 or node == self.settings.uuid:
            return True
        peer = self.peers.get(node)
        return peer is not None and peer.ready

    def _release(self, group: str, now: float, force: bool = False) -> None:
        """Answer ``group``'s held election messages, in order, up to the first one that
        still has to wait for a HELLO (none with ``force``)."""
        queue = self._held.get(group)
        hold = self.settings.election_hold
        while queue:
            head = queue[0]
            if not force and now - head.arrived < hold and self._may_wait(head.message):
                return
            queue.popleft()
            self._on_election(head.node, head.message)
        self._held.pop(group, None)

    def _release_from(self, node: bytes, group: str | None = None) -> None:
        """Before a membership change that ``node`` makes (a JOIN, a LEAVE, its exit): answer
        the held election messages it sent first, so that its own messages keep their order
        (a newcomer's HELLO goes ahead of held messages: none of them can be its own)."""
        for name in [group] if group is not None else list(self._held):
            queue = self._held.get(name)
            if queue and any(held.node == node for held in queue):
                self._release(name, self.clock(), force=True)

    def _on_election(self, node: bytes, message: Elect | Leader) -> None:
        if isinstance(message, Leader):
            outcome = self.elections.on_leader(node, message.group, message.leader)
            if outcome is None:
                self.ignored["leader"] += 1  # no election of ours under way (zyre: "no CAW")
                return
            decided, sends = outcome
            self._answer(sends)
            if decided is not None:
                self._decided(message.group, decided)
            return
        answers = self.elections.on_elect(node, message.group, message.challenger)
        if answers is None:
            self.ignored["elect"] += 1  # not our group, or a challenger zyre ignores too
        else:
            self._answer(answers)

    def _decided(self, group: str, leader: str) -> None:
        """An election is over: tell about its leader, as zyre does, only when the leader is a
        peer we know (the event names the leader, not the peer whose LEADER came last)."""
        try:
            node = bytes.fromhex(leader)
        except ValueError:
            node = b""
        peer = self.peers.get(node)
        if peer is None or not peer.ready:
            self.ignored["leader-unknown"] += 1
            return
        self.emit(ZreEvent("LEADER", node, peer.name, group=group, leader=leader))

    def _answer(self, sends: list[tuple[bytes, Elect | Leader]]) -> None:
        for node, message in sends:
            peer = self.peers.get(node)
            if peer is not None and peer.ready:
                self._send_to(peer, message)

    def _peer_joins(self, peer: Peer, group: str) -> None:
        if group in peer.groups:
            return
        peer.groups.add(group)
        self.peer_groups.setdefault(group, set()).add(peer.uuid)
        self.emit(ZreEvent("JOIN", peer.uuid, peer.name, group=group))
        self._answer(self.elections.member_joined(group, peer.uuid))

    def _peer_leaves(self, peer: Peer, group: str) -> None:
        if group not in peer.groups:
            return
        peer.groups.discard(group)
        members = self.peer_groups.get(group)
        if members is not None:
            members.discard(peer.uuid)
            if not members:
                del self.peer_groups[group]
        self.emit(ZreEvent("LEAVE", peer.uuid, peer.name, group=group))

    def _refresh(self, peer: Peer, now: float) -> None:
        peer.last_seen = now
        peer.evasive = peer.silent = False

    def foreign_count(self) -> int:
        """36/ZRE peers of a 20/ZRE node heard from within ``expired`` (we hold no link to
        them once their greeting has expired: their beacons only refresh this)."""
        now = self.clock()
        return sum(1 for seen in self.foreign.values() if now - seen < self.settings.expired)

    def _foreign_peer(self, node: bytes) -> None:
        peer = self.peers.get(node)
        if peer is not None and not peer.hello_sent:
            peer.foreign = True
        if len(self.foreign) >= 10_000:
            self.foreign.pop(next(iter(self.foreign)))
        self.foreign[node] = self.clock()

    # -- leaving -----------------------------------------------------------------------------

    def remove_peer(self, peer: Peer) -> None:
        """Forget ``peer``: its link, its groups, and (when it was ready) an EXIT event."""
        if self.peers.get(peer.uuid) is not peer:
            return
        if peer.ready:
            self._release_from(peer.uuid)
        del self.peers[peer.uuid]
        self.unready.pop(peer.uuid, None)
        self.links.close(peer.key)
        for group in list(peer.groups):
            members = self.peer_groups.get(group)
            if members is not None:
                members.discard(peer.uuid)
                if not members:
                    del self.peer_groups[group]
        if peer.ready:
            self.emit(ZreEvent("EXIT", peer.uuid, peer.name, endpoint=peer.endpoint))
        if peer.endpoint in self.seeds:
            # A seed we lost is greeted again, so the node finds its way back.
            self.connect_endpoint(peer.endpoint)

    # -- time --------------------------------------------------------------------------------

    def tick(self) -> None:
        """Once a second or so: greet, ping, expire (not at a late tick)."""
        now = self.clock()
        settings = self.settings
        judging = self.wakes.judging()
        # Oldest first, and only until the first one still young: the flood-bounded set.
        for peer in list(self.unready.values()) if judging else ():
            greeted_at = max(peer.discovered_at, peer.hello_due)
            if now - greeted_at < settings.pending_expired:
                break
            self.drop("no-hello", f"no HELLO from {peer.endpoint}", peer.uuid)
            self.remove_peer(peer)
        for peer in list(self.peers.values()):
            if not peer.hello_sent and not peer.foreign and now >= peer.hello_due:
                self._send_hello(peer)
            if not judging:
                continue
            if not peer.ready:
                if now - peer.discovered_at >= settings.expired:
                    # Never greeted us: forget it; its next beacon starts over.
                    self.drop("no-hello", f"no HELLO from {peer.endpoint}", peer.uuid)
                    self.remove_peer(peer)
                continue
            idle = now - peer.last_seen
            if idle >= settings.expired:
                self.remove_peer(peer)
            elif idle >= 2 * settings.evasive and not peer.silent:
                peer.silent = True
                self.emit(ZreEvent("SILENT", peer.uuid, peer.name))
            elif idle >= settings.evasive and not peer.evasive:
                peer.evasive = True
                self.emit(ZreEvent("EVASIVE", peer.uuid, peer.name))
                self._send_to(peer, Ping(0))
        for group in list(self._held):
            self._release(group, now)
        for endpoint, link in list(self.pending.items()) if judging else ():
            if now - link.opened_at >= settings.expired:
                del self.pending[endpoint]
                self.links.close(_pending_key(endpoint))
                if link.seed:
                    self.connect_endpoint(endpoint)

    # -- our own API -------------------------------------------------------------------------

    def join(self, group: str) -> None:
        """Join ``group`` and tell every peer greeted."""
        if group in self.own_groups:
            return
        self.own_groups.append(group)
        self.status = (self.status + 1) & 0xFF
        for peer in self._greeted():
            self._send_to(peer, Join(0, group, self.status))

    def leave(self, group: str) -> None:
        """Leave ``group`` and tell every peer greeted."""
        if group not in self.own_groups:
            return
        self.own_groups.remove(group)
        self.elections.left(group)
        self._held.pop(group, None)
        self.status = (self.status + 1) & 0xFF
        for peer in self._greeted():
            self._send_to(peer, Leave(0, group, self.status))

    def whisper(self, node: bytes, content: Sequence[bytes]) -> bool:
        """Send ``content`` (one or more frames) to one peer; False if it is not ready."""
        self._check_content(content)
        peer = self.peers.get(node)
        if peer is None or not peer.ready or not peer.hello_sent:
            return False
        return self._send_to(peer, Whisper(0, tuple(content)))

    def shout(self, group: str, content: Sequence[bytes]) -> int:
        """Send ``content`` to every ready peer in ``group``; returns how many."""
        self._check_content(content)
        members = self.peer_groups.get(group)
        if not members:
            return 0
        # Encoded once; each peer's copy differs only in its sequence number.
        head, *rest = codec.encode(Shout(0, group, tuple(content)), self.version)
        before, after = codec.around_sequence(head, self.version)
        peers, send, octets = self.peers, self.links.send, codec.sequence_octets
        tried = sent = 0
        for node in list(members):
            peer = peers.get(node)
            if peer is None or not peer.ready or not peer.hello_sent or peer.foreign:
                continue
            peer.sent_sequence = sequence = (peer.sent_sequence + 1) & 0xFFFF
            tried += 1
            if send(peer.key, [before + octets(sequence) + after, *rest]):
                sent += 1
        self.sent += tried
        return sent

    def _check_content(self, content: Sequence[bytes]) -> None:
        # pyre dies on a WHISPER without content; 20/ZRE content is exactly one frame.
        if not content:
            raise ValueError("content needs at least one frame")
        if self.version == VERSION_20 and len(content) != 1:
            raise ValueError("20/ZRE content is exactly one frame")

    def _greeted(self) -> list[Peer]:
        return [peer for peer in self.peers.values() if peer.hello_sent]

    # -- sending -----------------------------------------------------------------------------

    def _hello(self, sequence: int) -> Hello:
        settings = self.settings
        headers = dict(settings.headers)
        known = [
            p.endpoint if p.public_key is None else f"{p.endpoint}|{p.public_key.decode()}"
            for p in self.peers.values()
            if p.ready
        ]
        if settings.public_key is not None:
            headers[codec.PUBLIC_KEY_HEADER] = settings.public_key.decode("ascii")
        if known:
            headers[PEERS_HEADER] = ",".join(sorted(known))
        if self.version == VERSION_20:
            headers[NAME_HEADER] = settings.name
            # A 20/ZRE header is one string of at most 255 octets.
            headers = {k: v for k, v in headers.items() if len(f"{k}={v}".encode()) <= 255}
        return Hello(
            sequence, settings.endpoint, tuple(self.own_groups), self.status, settings.name, headers
        )

    def _send_hello(self, peer: Peer) -> None:
        if peer.foreign:
            return
        peer.hello_sent = True
        peer.sent_sequence = 0
        self._send_to(peer, self._hello(0))

    def _send_to(self, peer: Peer, message: Message) -> bool:
        if peer.foreign or (not peer.hello_sent and not isinstance(message, Hello)):
            return False
        peer.sent_sequence = sequence = (peer.sent_sequence + 1) & 0xFFFF
        self.sent += 1
        frames = codec.encode(message, self.version)
        frames[0] = codec.with_sequence(frames[0], sequence, self.version)
        return self.links.send(peer.key, frames)

    def _send(self, key: str, message: Message) -> bool:
        self.sent += 1
        return self.links.send(key, codec.encode(message, self.version))

    # -- stopping ----------------------------------------------------------------------------

    def goodbye(self, told: Callable[[bytes], bool]) -> list[str]:
        """Leaving in gossip mode, as zyre's ``zyre_node_stop``: GOODBYE to every peer we
        greeted for which ``told(uuid)`` holds (there is no leaving beacon to tell them). The
        keys of the links that carry one."""
        keys = []
        for peer in self._greeted():
            if told(peer.uuid) and self._send_to(peer, Goodbye(0)):
                keys.append(peer.key)
        return keys

    def close(self) -> None:
        """Close every link and forget every peer."""
        for peer in list(self.peers.values()):
            self.links.close(peer.key)
        for endpoint in list(self.pending):
            self.links.close(_pending_key(endpoint))
        self.peers.clear()
        self.unready.clear()
        self.pending.clear()
        self.peer_groups.clear()
        self._held.clear()


def _pending_key(endpoint: str) -> str:
    return f"endpoint:{endpoint}"


def _told_endpoints(value: str) -> list[str]:
    """The endpoints of X-ZRE-PEERS (``tcp://...``, with ``|KEY`` between CURVE nodes)."""
    return [part for part in (p.strip() for p in value.split(",")) if part.startswith("tcp://")]


__all__ = [
    "EVENT_TYPES",
    "VERSION_20",
    "VERSION_36",
    "Links",
    "Peer",
    "ZreCore",
    "ZreEvent",
    "ZreSettings",
]
