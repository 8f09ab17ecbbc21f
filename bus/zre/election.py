"""Our part in zyre's leader elections, sans I/O: we never contest, but we must answer.

zyre (its draft API ``zyre_set_contest_in_group``) elects a group's leader with an echo
wave. This is what a zyre node that does not contest does (``zyre_node.c`` and
``zyre_election.c`` of its git master d8370f7), and so what we do, step for step, so that
the zyres around us cannot tell us from one of their own:

* an ELECT naming a *better* challenger than the one followed (none yet, or a smaller one,
  compared as text) starts the wave over: the challenger is followed, the peer it came from
  becomes the *father*, the counts of ELECT and LEADER go back to zero, and ELECT(challenger)
  goes to every member of the group except the father;
* every ELECT naming the followed challenger (the better one just followed included) counts
  once, messages not peers; when the count equals the number of the group's members, the
  ELECT is echoed to the father (so the very first ELECT is echoed at once only when its
  sender is the one member);
* an ELECT naming a worse challenger is ignored;
* a LEADER while a challenger is followed: the first one of the wave sends LEADER(the
  followed challenger) to every member; every LEADER counts; when the count equals the
  number of members, the election is over; a LEADER while none is followed is ignored;
* the leader we report is the challenger whose wave we followed to the end. zyre reports
  the last LEADER's leader instead, but a LEADER names its sender's challenger, not the
  leader: a contester that restarted its election late (on a HELLO that came after it had
  followed the best wave) sends LEADER(itself) into the count, and a LEADER of an election
  just over can land in the count of the next one. Where such a LEADER came last, zyre's
  rule made our node name another leader than the zyres (issue 35, two of three splits
  captured against zyre; naming the smallest id of the count instead failed on the second
  case). The messages we send are zyre's either way; only what we report differs, and only
  when the LEADERs disagree;
* a member that does not contest never starts, nor restarts, an election (the contesters
  start theirs over on membership changes);
* a peer that becomes a member while we follow a wave gets ELECT(the followed challenger)
  from us, as it would have had it been a member when the wave came. zyre sends it nothing:
  the newcomer then never has the ELECT of every member that it waits for before echoing
  the wave, and the election stalls (issue 35, captured against zyre: the best
  challenger's ELECT reached our node just before the newcomer's HELLO).

We send to every member of the group, as zyre does: in a group where zyre holds elections,
zyre's contesters send ELECT to every member themselves. Only groups we joined are followed
(zyre's contesters send their elections to a group's members only), so a peer cannot make us
keep state for groups of its choosing.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from dataclasses import dataclass

from bus.zre.codec import Elect, Leader

#: Where one of our answers goes: (peer UUID, message); the core numbers and sends it.
Send = tuple[bytes, Elect | Leader]


@dataclass(slots=True)
class _Election:
    """One group's election as we follow it (zyre's ``zyre_election_t``)."""

    #: The current active wave: the challenger we follow.
    challenger: str
    father: bytes
    #: ELECT(challenger) messages had (messages, not peers, as zyre counts them).
    elects: int = 0
    #: LEADER messages had.
    leaders: int = 0


class Elections:
    """Answers zyre's ELECT and LEADER for the groups we are in.

    ``members(group)`` names the peers in ``group`` (ready ones, by UUID); ``joined(group)``
    says whether we are in it.
    """

    def __init__(
        self,
        members: Callable[[str], Collection[bytes]],
        joined: Callable[[str], bool],
    ) -> None:
        self._members = members
        self._joined = joined
        self._running: dict[str, _Election] = {}
        #: Each group's last decided leader.
        self.leaders: dict[str, str] = {}
        self.answered = 0

    def on_elect(self, peer: bytes, group: str, challenger: str) -> list[Send] | None:
        """What to send for ``peer``'s ELECT; None when it is ignored (not our group, or a
        challenger worse than the one we follow)."""
        if not self._joined(group):
            return None
        members = self._members(group)
        election = self._running.get(group)
        sends: list[Send] = []
        if election is None or challenger < election.challenger:
            # A better challenger: follow it, and tell every member but its messenger.
            election = self._running[group] = _Election(challenger, father=peer)
            sends = [(m, Elect(0, group, challenger)) for m in members if m != peer]
        elif challenger != election.challenger:
            return None  # worse than the one we follow: zyre ignores it too
        election.elects += 1
        if election.elects == len(members):
            # Every member's ELECT (by count) had: echo to the father.
            sends.append((election.father, Elect(0, group, challenger)))
        self.answered += len(sends)
        return sends

    def on_leader(
        self, peer: bytes, group: str, leader: str
    ) -> tuple[str | None, list[Send]] | None:
        """The leader decided by this LEADER (None: not yet), and what to send: on the first
        LEADER of a wave, LEADER(the followed challenger) to every member. None when it is
        ignored (no election under way in a group of ours)."""
        election = self._running.get(group) if self._joined(group) else None
        if election is None:
            return None  # zyre: "we have no CAW", ignored
        members = self._members(group)
        sends: list[Send] = []
        if election.leaders == 0:
            sends = [(m, Leader(0, group, election.challenger)) for m in members]
        election.leaders += 1
        self.answered += len(sends)
        if election.leaders != len(members):
            return None, sends
        del self._running[group]
        self.leaders[group] = election.challenger
        return election.challenger, sends

    def member_joined(self, group: str, peer: bytes) -> list[Send]:
        """``peer`` became a member of ``group``: ELECT(the followed challenger) to it when
        we follow a wave (not to the wave's father: it is a member already)."""
        election = self._running.get(group) if self._joined(group) else None
        if election is None or peer == election.father:
            return []
        self.answered += 1
        return [(peer, Elect(0, group, election.challenger))]

    def left(self, group: str) -> None:
        """We left ``group``."""
        self._running.pop(group, None)

    def following(self, group: str) -> str | None:
        """The challenger followed in ``group`` (None: no election under way)."""
        election = self._running.get(group)
        return election.challenger if election is not None else None

    def running(self) -> dict[str, str]:
        """Each group's election under way: the challenger we follow."""
        return {group: e.challenger for group, e in self._running.items()}
