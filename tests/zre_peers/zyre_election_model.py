"""zyre's leader election as its source runs it (``zyre_node.c`` and ``zyre_election.c`` of
zyre's git master d8370f7, read for behaviour; not a translation), for a simulated network
in which our :class:`bus.zre.election.Elections` takes the place of one node.

What is modelled, from the source:

* ``zyre_set_contest_in_group`` marks a group as contested; a contester starts (or restarts,
  discarding a running election) an election, ELECT(itself) to the group's members, when a
  peer JOINs a group it is in, or says HELLO listing a contested group, or, for a group whose
  election is unfinished or whose leader it was, when a peer leaves (alone: it is the leader);
* ELECT: a better challenger (none yet, or smaller as text) resets the counts, becomes the
  followed one with the sender as father, and goes to every member but the father; every
  ELECT of the followed challenger counts; at the member count, the challenger itself sends
  LEADER(itself) to every member, anyone else echoes ELECT to its father;
* LEADER with a challenger followed: the first one (unless it names ourselves) sends
  LEADER(followed challenger) to every member; each counts; at the member count the leader
  is reported (when it is us or a known peer) and the election discarded; without a
  challenger followed, ignored. A node's own JOIN starts nothing.

Links are ZeroMQ's: each ordered pair of nodes is a FIFO; which link delivers next is the
simulation's choice (a seeded random generator), so one seed is one interleaving.
"""

from __future__ import annotations

import random
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from bus.zre.codec import Elect, Join, Leader
from bus.zre.election import Elections

Message = Join | Elect | Leader


@dataclass(slots=True)
class _Election:
    caw: str | None = None
    father: str | None = None
    erec: int = 0
    lrec: int = 0
    leader: str | None = None


class Network:
    """Nodes that all know each other, one FIFO per ordered pair."""

    def __init__(self, seed: int) -> None:
        self.random = random.Random(seed)
        self.nodes: dict[str, Node] = {}
        self.links: dict[tuple[str, str], deque[Message]] = {}

    def add(self, node: Node) -> None:
        node.network = self
        self.nodes[node.id] = node

    def send(self, source: str, target: str, message: Message) -> None:
        self.links.setdefault((source, target), deque()).append(message)

    def step(self) -> bool:
        busy = [pair for pair, queue in self.links.items() if queue]
        if not busy:
            return False
        source, target = self.random.choice(sorted(busy))
        self.nodes[target].receive(source, self.links[(source, target)].popleft())
        return True

    def settle(self, limit: int = 100_000) -> None:
        for _ in range(limit):
            if not self.step():
                return
        raise AssertionError("the election never went quiet")

    def run_interleaved(self, actions: Iterable[Callable[[], None]]) -> None:
        """Each action at a random moment of the traffic, then until quiet."""
        for action in actions:
            for _ in range(self.random.randrange(0, 12)):
                if not self.step():
                    break
            action()
        self.settle()


class Node:
    """One node: ``receive`` a message from a peer, ``join`` a group; ``reported`` holds the
    leaders it told its application about, in order."""

    network: Network

    def __init__(self, node_id: str) -> None:
        self.id = node_id
        self.own_groups: set[str] = set()
        self.peer_groups: dict[str, set[str]] = {}
        self.reported: list[str] = []

    def members(self, group: str) -> list[str]:
        return sorted(self.peer_groups.get(group, ()))

    def join(self, group: str) -> None:
        self.own_groups.add(group)
        for peer in sorted(self.network.nodes):
            if peer != self.id:
                self.network.send(self.id, peer, Join(0, group, 1))

    def receive(self, peer: str, message: Message) -> None:
        raise NotImplementedError


class ZyreModel(Node):
    """A zyre node (contesting the groups in ``contest``, or plain)."""

    def __init__(self, node_id: str, contest: Iterable[str] = ()) -> None:
        super().__init__(node_id)
        self.contest = set(contest)
        self.elections: dict[str, _Election] = {}

    def _to_group(self, group: str, message: Message, but: str | None = None) -> None:
        for member in self.members(group):
            if member != but:
                self.network.send(self.id, member, message)

    def _start(self, group: str) -> None:
        self.elections[group] = _Election(caw=self.id)
        self._to_group(group, Elect(0, group, self.id))

    def receive(self, peer: str, message: Message) -> None:
        if isinstance(message, Join):
            self.peer_groups.setdefault(message.group, set()).add(peer)
            if message.group in self.own_groups and message.group in self.contest:
                self._start(message.group)
        elif isinstance(message, Elect):
            group, challenger = message.group, message.challenger
            e = self.elections.setdefault(group, _Election())
            if e.caw is None or challenger < e.caw:
                e.caw, e.father, e.erec, e.lrec, e.leader = challenger, peer, 0, 0, None
                self._to_group(group, Elect(0, group, challenger), but=peer)
            if challenger == e.caw:
                e.erec += 1
                if e.erec == len(self.members(group)):
                    if e.caw == self.id:
                        self._to_group(group, Leader(0, group, self.id))
                    elif e.father is not None:
                        self.network.send(self.id, e.father, Elect(0, group, e.caw))
        elif isinstance(message, Leader):
            group = message.group
            e = self.elections.setdefault(group, _Election())
            if e.caw is None:
                return  # "no CAW": ignored
            if message.leader != self.id and e.lrec == 0:
                self._to_group(group, Leader(0, group, e.caw))
            e.lrec += 1
            e.leader = message.leader
            if e.lrec == len(self.members(group)):
                if e.leader == self.id or e.leader in self.network.nodes:
                    self.reported.append(e.leader)
                del self.elections[group]


class OursInModel(Node):
    """Our :class:`Elections` as one node of the simulation."""

    def __init__(self, node_id: str) -> None:
        super().__init__(node_id)
        self.elections = Elections(
            lambda group: [m.encode() for m in self.members(group)],
            lambda group: group in self.own_groups,
        )

    def receive(self, peer: str, message: Message) -> None:
        if isinstance(message, Join):
            self.peer_groups.setdefault(message.group, set()).add(peer)
            # As the node's core does on a JOIN (or a HELLO naming the group).
            sends = self.elections.member_joined(message.group, peer.encode())
        elif isinstance(message, Elect):
            sends = self.elections.on_elect(peer.encode(), message.group, message.challenger)
        else:
            outcome = self.elections.on_leader(peer.encode(), message.group, message.leader)
            if outcome is None:
                return
            decided, sends = outcome
            if decided is not None and decided in self.network.nodes:
                self.reported.append(decided)
        for target, answer in sends or ():
            self.network.send(self.id, target.decode(), answer)


@dataclass(slots=True)
class Outcome:
    """The leader each node reported last (None: none), by node id."""

    leaders: dict[str, str | None] = field(default_factory=dict)

    @property
    def split(self) -> bool:
        named = {leader for leader in self.leaders.values() if leader is not None}
        return len(named) > 1

    @property
    def agreed(self) -> bool:
        return len(set(self.leaders.values())) == 1 and None not in self.leaders.values()


def contest_run(seed: int, fourth: str, position: int, group: str = "ELG") -> Outcome:
    """Three contesting zyres and a fourth node (``"ours"`` or ``"zyre"``, which does not
    contest) join ``group``; the fourth joins at ``position`` (0: first, 3: last, after the
    three settled). Node ids are random 32-hex-digit UUIDs, as zyre writes them."""
    network = Network(seed)
    ids = [network.random.getrandbits(128).to_bytes(16, "big").hex().upper() for _ in range(4)]
    zyres = [ZyreModel(node_id, contest=[group]) for node_id in ids[:3]]
    last: Node = OursInModel(ids[3]) if fourth == "ours" else ZyreModel(ids[3])
    for node in (*zyres, last):
        network.add(node)
    order: list[Node] = list(zyres)
    order.insert(position, last)
    if position == 3:
        network.run_interleaved([lambda n=node: n.join(group) for node in zyres])
        network.run_interleaved([lambda: last.join(group)])
    else:
        network.run_interleaved([lambda n=node: n.join(group) for node in order])
    return Outcome({node.id: (node.reported or [None])[-1] for node in network.nodes.values()})
