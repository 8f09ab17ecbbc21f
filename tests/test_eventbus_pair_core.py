"""Binary Star's rules for an Event BUS pair, on a clock (sans-I/O)."""

from __future__ import annotations

from dataclasses import replace

from bus.eventbus.pair_codec import PeerState
from bus.eventbus.pair_core import PairCore

F = 1.0  # failover timeout
A = 1.0  # alone timeout


def core(role: str = "backup", term: int = 0, sequence: int = 0, window: int = 0) -> PairCore:
    said: list[str] = []
    made = PairCore(
        role,  # type: ignore[arg-type]
        term=term,
        failover_timeout=F,
        alone_timeout=A,
        now=0.0,
        sequence=lambda: sequence,
        window=window,
        say=said.append,
    )
    made.said = said  # type: ignore[attr-defined]
    return made


def peer(state: str, role: str = "primary", **fields: int | bool) -> PeerState:
    base = PeerState(role, state, 1, "store", 100, 100, True, 1, 0)
    return replace(base, **fields)  # type: ignore[arg-type]


def ticking(pair: PairCore, until: float, start: float = 0.0, step: float = 0.01) -> None:
    """Tick the core every ``step`` seconds (as the service's 10 ms timer does)."""
    now = start
    while now < until:
        now = round(now + step, 6)
        pair.tick(now)


def test_a_waiting_backup_becomes_passive_on_hearing_the_active() -> None:
    backup = core("backup")
    change = backup.heard(peer("active"), 0.1)
    assert change is not None and (change.old, change.new) == ("waiting", "passive")
    assert "active" in change.reason
    assert backup.transitions["passive"] == 1


def test_two_waiting_servers_let_the_newer_log_lead_then_the_primary() -> None:
    primary = core("primary", term=0, sequence=0)
    change = primary.heard(peer("waiting", role="backup", term=0, sequence=0), 0.1)
    assert change is not None and change.new == "active" and primary.term == 1
    backup = core("backup", term=0, sequence=0)
    assert backup.heard(peer("waiting", role="primary", term=0, sequence=0), 0.1) is None
    assert backup.state == "waiting"
    # The backup's log is newer (it took over last): it leads, whatever the roles.
    newer_backup = core("backup", term=3, sequence=10)
    change = newer_backup.heard(peer("waiting", role="primary", term=2, sequence=50), 0.1)
    assert change is not None and change.new == "active" and newer_backup.term == 4
    stale_primary = core("primary", term=2, sequence=50)
    assert stale_primary.heard(peer("waiting", role="backup", term=3, sequence=10), 0.1) is None


def test_a_passive_takes_over_only_after_silence_and_a_vote_and_in_sync() -> None:
    backup = core("backup", sequence=100)
    backup.heard(peer("active", paired=True, released=100), 0.0)
    assert backup.state == "passive" and not backup.in_sync  # the change itself
    backup.heard(peer("active", paired=True, released=100, beat=2), 0.1)
    assert backup.in_sync
    # A vote while the active speaks: nothing.
    assert backup.vote(0.2) is None
    ticking(backup, 0.75, start=0.2)
    for beat in range(3, 10):  # the active keeps speaking until 2.0
        backup.heard(peer("active", paired=True, released=100, beat=beat), beat * 0.25)
        ticking(backup, beat * 0.25 + 0.25, start=beat * 0.25)
    assert backup.state == "passive"
    # Silence alone (the vote is long past): nothing.
    ticking(backup, 4.0, start=2.5)
    assert backup.state == "passive"
    # Silence and a vote: take over, with a new term.
    change = backup.vote(4.0)
    assert change is not None and change.new == "active" and backup.term == 2
    assert "silent" in change.reason and "client" in change.reason


def test_a_vote_counts_when_the_silence_comes_later() -> None:
    backup = core("backup", sequence=100)
    backup.heard(peer("active"), 0.0)
    backup.heard(peer("active", beat=2), 0.1)
    assert backup.vote(0.5) is None
    ticking(backup, 1.05, start=0.5)
    assert backup.state == "passive"
    ticking(backup, 1.15, start=1.05)  # silent for F, the vote 0.6 s old: still counts
    assert backup.state == "active"


def test_a_passive_not_in_sync_never_takes_over() -> None:
    backup = core("backup", sequence=40)
    backup.heard(peer("active", paired=False), 0.0)
    backup.heard(peer("active", paired=False, beat=2), 0.1)
    assert not backup.in_sync
    ticking(backup, 2.0, start=0.1)
    assert backup.vote(2.0) is None
    assert backup.state == "passive" and backup.refused_takeovers >= 1
    assert any("not in sync" in text for text in backup.said)  # type: ignore[attr-defined]
    # Paired, but this log holds less than the active released: not in sync either.
    behind = core("backup", sequence=40)
    behind.heard(peer("active"), 0.0)
    behind.heard(peer("active", paired=True, released=100, beat=2), 0.1)
    assert not behind.in_sync
    # With an async window the passive may trail by that much.
    window = core("backup", sequence=40, window=100)
    window.heard(peer("active"), 0.0)
    window.heard(peer("active", paired=True, released=100, beat=2), 0.1)
    assert window.in_sync


def test_a_waiting_primary_takes_over_on_silence_and_a_vote_a_waiting_backup_never() -> None:
    primary = core("primary")
    backup = core("backup")
    for pair in (primary, backup):
        ticking(pair, 1.5)
        pair.vote(1.5)
    assert primary.state == "active" and primary.term == 1
    assert backup.state == "waiting"


def test_an_active_that_was_not_running_doubts_until_the_peer_answers() -> None:
    primary = core("primary", term=1, sequence=100)
    primary.heard(peer("waiting", role="backup", term=0, sequence=0), 0.0)
    assert primary.state == "active"
    beat = primary.next_beat()
    primary.heard(peer("passive", role="backup", echo=beat), 0.1)
    change = primary.tick(5.0)  # SIGSTOP for 4.9 s
    assert change is not None and change.new == "doubt"
    # A state queued before the pause (echoing an old beat) is not trusted.
    assert primary.heard(peer("passive", role="backup", echo=beat), 5.01) is None
    assert primary.state == "doubt"
    # One that answers a beat sent since: the peer took over -> passive.
    fresh = primary.next_beat()
    change = primary.heard(peer("active", role="backup", term=2, echo=fresh), 5.2)
    assert change is not None and change.new == "passive"


def test_an_active_in_doubt_resumes_when_the_peer_is_still_passive_or_silent() -> None:
    primary = core("primary", term=1, sequence=100)
    primary.heard(peer("waiting", role="backup", term=0, sequence=0), 0.0)
    term = primary.term
    primary.tick(3.0)
    assert primary.state == "doubt"
    fresh = primary.next_beat()
    change = primary.heard(peer("passive", role="backup", echo=fresh), 3.1)
    assert change is not None and change.new == "active" and primary.term == term
    primary.tick(9.0)
    assert primary.state == "doubt"
    ticking(primary, 10.05, start=9.0)
    assert primary.state == "active"


def test_a_passive_that_was_not_running_is_not_in_sync_until_told_again() -> None:
    backup = core("backup", sequence=100)
    backup.heard(peer("active"), 0.0)
    backup.heard(peer("active", beat=2), 0.1)
    assert backup.in_sync
    backup.tick(4.0)
    assert not backup.in_sync and backup.stalls == 1
    # Stale states (queued while stopped) do not restore it.
    backup.heard(peer("active", beat=3, echo=0), 4.01)
    assert not backup.in_sync
    # The silence counts from the wake-up: no takeover on the old silence.
    assert backup.vote(4.02) is None and backup.state == "passive"
    fresh = backup.next_beat()
    backup.heard(peer("active", beat=4, echo=fresh), 4.2)
    assert backup.in_sync


def test_two_actives_the_older_log_yields() -> None:
    old = core("primary", term=1, sequence=500)
    old.heard(peer("waiting", role="backup", term=0, sequence=0), 0.0)
    assert old.state == "active"
    assert old.term == 2
    change = old.heard(peer("active", role="backup", term=3, sequence=400), 0.1)
    assert change is not None and change.new == "passive"
    assert "both active" in change.reason
    new = core("backup", term=1, sequence=400)
    new.heard(peer("active", role="primary", term=1, sequence=300, released=300, beat=1), 0.0)
    assert new.state == "passive"
    new.heard(peer("active", role="primary", term=1, sequence=300, released=300, beat=2), 0.1)
    assert new.in_sync
    ticking(new, 1.5, start=0.1)
    new.vote(1.5)
    assert new.state == "active" and new.term == 2
    # The old active comes back believing it is active: its term is older, it yields.
    assert new.heard(peer("active", role="primary", term=1, sequence=500, beat=3), 1.6) is None
    assert new.state == "active"


def test_two_servers_in_doubt_let_the_newer_log_go_on() -> None:
    newer = core("primary", term=2, sequence=100)
    older = core("backup", term=1, sequence=500)
    for pair in (newer, older):
        pair.heard(peer("waiting", role="backup" if pair is newer else "primary",
                        term=0, sequence=0), 0.0)  # fmt: skip
        pair.tick(3.0)
        assert pair.state == "doubt"
    beat_newer, beat_older = newer.next_beat(), older.next_beat()
    change = newer.heard(peer("doubt", role="backup", term=older.term, sequence=500,
                              echo=beat_newer), 3.1)  # fmt: skip
    assert change is not None and change.new == "active"
    assert older.heard(peer("doubt", role="primary", term=newer.term, sequence=100,
                            echo=beat_older), 3.1) is None  # fmt: skip
    assert older.state == "doubt"
    change = older.heard(peer("active", role="primary", term=newer.term, sequence=100,
                              echo=beat_older), 3.3)  # fmt: skip
    assert change is not None and change.new == "passive"
