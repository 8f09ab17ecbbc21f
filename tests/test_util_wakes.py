"""bus.util.wakes: a late wake does not judge silence, nor any within its settling time;
the first wake after that does."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st
from twisted.internet.task import Clock

from bus.util.wakes import Wakes


def test_on_time_wakes_judge_and_a_late_one_waits_for_the_settled_next() -> None:
    clock = Clock()
    wakes = Wakes(1.0, clock.seconds)
    assert wakes.judging()  # the first
    for _ in range(5):
        clock.advance(1.0)
        assert wakes.judging()
    clock.advance(1.4)  # within half a period: on time
    assert wakes.judging()
    clock.advance(7.0)  # stalled for six periods
    assert not wakes.judging() and wakes.held == 1
    clock.advance(0.1)  # LoopingCall's next point of its grid, soon after: still settling
    assert not wakes.judging() and wakes.held == 1
    clock.advance(0.9)
    assert wakes.judging()
    clock.advance(1.0)
    assert wakes.judging() and wakes.held == 1


def test_a_process_late_at_every_wake_judges_at_every_other() -> None:
    clock = Clock()
    wakes = Wakes(0.1, clock.seconds, slack=0.02)
    wakes.judging()
    seen = []
    for _ in range(6):
        clock.advance(0.5)
        seen.append(wakes.judging())
    assert seen == [False, True, False, True, False, True]
    assert wakes.held == 3


def test_a_deadline_s_wake_is_late_past_its_slack() -> None:
    clock = Clock()
    wakes = Wakes(1.0, clock.seconds, slack=0.1, settle=0.1)
    clock.advance(5.05)
    assert wakes.judging(due=5.0)
    clock.advance(2.0)
    assert not wakes.judging(due=6.0) and wakes.held == 1  # 1.05 s late
    assert wakes.late_at == clock.seconds()
    clock.advance(0.1)
    assert wakes.judging(due=6.0)  # the wake after its settling time: judges, late or not


@given(st.lists(st.floats(min_value=0.0, max_value=100.0), min_size=1, max_size=200))
def test_only_late_wakes_and_those_settling_after_them_hold(gaps: list[float]) -> None:
    clock = Clock()
    wakes = Wakes(1.0, clock.seconds)
    assert wakes.judging()
    hold_started = None
    for gap in gaps:
        clock.advance(gap)
        now = clock.seconds()
        judged = wakes.judging()
        if hold_started is None:
            assert judged == (gap <= 1.5)  # a wake judges unless it comes late
            hold_started = None if judged else now
        else:
            assert judged == (now >= hold_started + 0.5)  # held while settling, then judges
            hold_started = None if judged else hold_started
