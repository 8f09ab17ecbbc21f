"""Our part in zyre's leader elections, sans I/O: we never contest, but we must answer.

zyre (its draft API ``zyre_set_contest_in_group``) elects a group's leader with an echo
wave, as run on the wire by zyre's git master (tried against it in network namespaces):

* a contester sends ELECT(its UUID) to every member of the group;
* a member that sees a better challenger than the one it follows (none yet, or a smaller
  UUID, compared as text) follows it: the peer it came from becomes its *father*, and it
  passes ELECT(challenger) on to every other member;
* a member that has had ELECT(challenger) from every member of the group echoes it to its
  father; the challenger, once it has had all of them, sends LEADER(itself) to all;
* a member passes the first LEADER of a wave on to every member, and zyre reports the
  leader to its application only after a LEADER from every member.

So one member that counts ELECT and answers nothing stalls the election for every zyre in
the group, and one that joins restarts it (zyre's contesters start over on each JOIN).
We answer as a member that never contests, but only to peers that sent us ELECT or LEADER
themselves: pyre does not know these commands and drops the link on them. Only groups we
joined are followed (zyre sends elections to a group's members only), so a peer cannot
make us keep state for groups of its choosing.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from dataclasses import dataclass, field

from bus.zre.codec import Elect, Leader

#: Where one of our answers goes: (peer UUID, message); the core numbers and sends it.
Send = tuple[bytes, Elect | Leader]


@dataclass(slots=True)
class _Wave:
    """The election we take part in for one group: the challenger we follow."""

    challenger: str
    father: bytes
    #: Members we passed ELECT(challenger) on to; each answers with one of its own.
    told: set[bytes] = field(default_factory=set)
    #: Members whose ELECT(challenger) we had.
    heard: set[bytes] = field(default_factory=set)
    echoed: bool = False
    #: The leader its LEADER named, once one came (the wave is over).
    leader: str | None = None


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
        #: Peers that sent us ELECT or LEADER: they know these commands (zyre does).
        self.speakers: set[bytes] = set()
        self._waves: dict[str, _Wave] = {}
        self.answered = 0

    def _speaking(self, group: str) -> list[bytes]:
        return [peer for peer in self._members(group) if peer in self.speakers]

    def on_elect(self, peer: bytes, group: str, challenger: str) -> list[Send] | None:
        """What to send for ``peer``'s ELECT; None when we take no part (not our group,
        or a challenger worse than the one we follow)."""
        self.speakers.add(peer)
        if not self._joined(group):
            return None
        wave = self._waves.get(group)
        sends: list[Send] = []
        if wave is None or wave.leader is not None or challenger < wave.challenger:
            # A better challenger (or a new election): follow it, pass it on.
            wave = self._waves[group] = _Wave(challenger, father=peer)
            for member in self._speaking(group):
                if member != peer:
                    wave.told.add(member)
                    sends.append((member, Elect(0, group, challenger)))
        elif challenger != wave.challenger:
            return None  # worse than the one we follow: zyre ignores it too
        wave.heard.add(peer)
        if peer != wave.father and peer not in wave.told:
            # A member we did not know spoke elections: it counts on our ELECT as well.
            wave.told.add(peer)
            sends.append((peer, Elect(0, group, challenger)))
        if not wave.echoed and wave.heard >= wave.told | {wave.father}:
            wave.echoed = True
            sends.append((wave.father, Elect(0, group, challenger)))
        self.answered += len(sends)
        return sends

    def on_leader(self, peer: bytes, group: str, leader: str) -> tuple[bool, list[Send]]:
        """Whether this LEADER is news (an event for our listeners), and what to send:
        the first LEADER of a wave goes on to every member that speaks elections."""
        self.speakers.add(peer)
        wave = self._waves.get(group)
        if wave is None:
            return True, []  # not a wave of ours: tell, pass nothing on
        if wave.leader is not None:
            news = wave.leader != leader
            wave.leader = leader
            return news, []
        wave.leader = leader
        sends: list[Send] = [(member, Leader(0, group, leader)) for member in self._speaking(group)]
        self.answered += len(sends)
        return True, sends

    def membership_changed(self, group: str) -> None:
        """A member joined or left ``group``: zyre's contesters start over, so do we."""
        wave = self._waves.get(group)
        if wave is not None and wave.leader is None:
            del self._waves[group]

    def left(self, group: str) -> None:
        """We left ``group``."""
        self._waves.pop(group, None)

    def forget(self, peer: bytes) -> None:
        self.speakers.discard(peer)

    def waves(self) -> dict[str, str | None]:
        """Each group's election as we follow it: its leader, or None while it runs."""
        return {group: wave.leader for group, wave in self._waves.items()}
