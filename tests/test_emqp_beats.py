"""The broker's heartbeat period as a worker learns it from its HEARTBEATs (bus.emqp.beats)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from bus.emqp.beats import KEEP, LONGEST, HeardPeriod


def test_the_period_is_the_shortest_recent_gap_by_the_senders_clock() -> None:
    beats = HeardPeriod()
    beats.heard(b"1000.0", arrived=5.0)
    assert beats.period is None  # one HEARTBEAT: no gap yet
    # The arrivals bunch up (a busy receiver); the sender's times say 3 s apart.
    beats.heard(b"1003.0", arrived=5.1)
    assert beats.period == 3.0
    beats.heard(b"1009.0", arrived=11.0)  # one missed: a longer gap does not count
    assert beats.period == 3.0
    for sent in (1012.5, 1016.0, 1019.5, 1023.0):  # the broker now beats every 3.5 s
        beats.heard(repr(sent).encode(), arrived=0.0)
    assert beats.period == 3.5  # the 3 s gap is older than the last KEEP
    assert KEEP == 4


def test_without_the_senders_time_the_arrivals_count() -> None:
    beats = HeardPeriod()
    beats.heard(b"", arrived=10.0)
    beats.heard(b"", arrived=12.0)
    assert beats.period == 2.0
    # A peer that starts sending its time: a clock of its own, no gap across the two.
    beats.heard(b"5000.0", arrived=12.5)
    assert beats.period == 2.0
    beats.heard(b"5001.0", arrived=13.5)
    assert beats.period == 1.0


def test_nonsense_and_clock_jumps_make_no_period() -> None:
    beats = HeardPeriod()
    for sent in (b"100.0", b"90.0", b"nan", b"nan", b"inf", b"100.0", b"100.0"):
        beats.heard(sent, arrived=0.0)
    assert beats.period is None  # backwards, not a number, or no time between
    beats.heard(repr(100.0 + LONGEST + 1).encode(), arrived=0.0)
    assert beats.period is None  # a peer stopped for longer than any period
    beats.heard(repr(100.0 + LONGEST + 3).encode(), arrived=0.0)
    assert beats.period == 2.0
    beats.forget()
    assert beats.period is None


@given(st.lists(st.tuples(st.binary(max_size=24), st.floats(allow_nan=False)), max_size=40))
def test_any_heartbeats_give_no_period_or_a_sane_one(
    heartbeats: list[tuple[bytes, float]],
) -> None:
    beats = HeardPeriod()
    for sent_at, arrived in heartbeats:
        beats.heard(sent_at, arrived)
        assert beats.period is None or 0 < beats.period <= LONGEST
