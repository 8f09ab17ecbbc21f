"""Our part in zyre's leader election (bus.zre.election), sans I/O: the echo wave as zyre's
git master runs it, answered only to peers that speak it."""

from __future__ import annotations

from bus.zre.codec import Elect, Leader
from bus.zre.election import Elections

A, B, C, PYRE = (bytes([n]) * 16 for n in (1, 2, 3, 4))


def elections(members: list[bytes], joined: bool = True) -> Elections:
    return Elections(lambda group: members, lambda group: joined)


def test_a_lone_member_echoes_at_once_and_passes_the_leader_on() -> None:
    e = elections([A, PYRE])
    assert e.on_elect(A, "G", "AAAA") == [(A, Elect(0, "G", "AAAA"))]
    assert e.on_leader(A, "G", "AAAA") == (True, [(A, Leader(0, "G", "AAAA"))])
    # Every member passes LEADER on: the later ones are no news and go nowhere.
    assert e.on_leader(A, "G", "AAAA") == (False, [])
    assert e.waves() == {"G": "AAAA"}


def test_the_wave_passes_on_to_speakers_and_echoes_once_all_answered() -> None:
    e = elections([A, B, C, PYRE])
    e.speakers.update({B, C})  # they spoke elections before
    # A's challenge: passed on to B and C (never to PYRE), no echo yet.
    assert e.on_elect(A, "G", "AAAA") == [(B, Elect(0, "G", "AAAA")), (C, Elect(0, "G", "AAAA"))]
    assert e.on_elect(B, "G", "AAAA") == []
    # The last answer completes it: echo to the father, A.
    assert e.on_elect(C, "G", "AAAA") == [(A, Elect(0, "G", "AAAA"))]
    assert e.on_elect(C, "G", "AAAA") == []  # never twice


def test_a_better_challenger_restarts_the_wave_and_a_worse_one_is_ignored() -> None:
    e = elections([A, B])
    e.speakers.add(B)
    assert e.on_elect(B, "G", "BBBB") == [(B, Elect(0, "G", "BBBB"))]
    # "AAAA" < "BBBB": follow A now, passing it on to B.
    assert e.on_elect(A, "G", "AAAA") == [(B, Elect(0, "G", "AAAA"))]
    assert e.on_elect(B, "G", "CCCC") is None
    assert e.on_elect(B, "G", "AAAA") == [(A, Elect(0, "G", "AAAA"))]


def test_a_member_that_reveals_itself_late_gets_our_elect_too() -> None:
    e = elections([A, B])
    assert e.on_elect(A, "G", "AAAA") == [(A, Elect(0, "G", "AAAA"))]  # B unknown: echo
    # B speaks: it counts on an ELECT from every member, ours included.
    assert e.on_elect(B, "G", "AAAA") == [(B, Elect(0, "G", "AAAA"))]


def test_groups_we_did_not_join_are_not_followed() -> None:
    e = elections([A], joined=False)
    assert e.on_elect(A, "X", "AAAA") is None
    assert e.on_leader(A, "X", "AAAA") == (True, [])
    assert e.waves() == {}


def test_a_membership_change_ends_a_running_wave_not_a_finished_one() -> None:
    e = elections([A, B])
    e.on_elect(A, "G", "AAAA")
    e.membership_changed("G")
    assert e.waves() == {}
    e.on_elect(A, "G", "AAAA")
    e.on_leader(A, "G", "AAAA")
    e.membership_changed("G")
    assert e.waves() == {"G": "AAAA"}
    # A new election after a finished one starts fresh, whatever its challenger.
    assert e.on_elect(B, "G", "BBBB") == [(A, Elect(0, "G", "BBBB"))]
