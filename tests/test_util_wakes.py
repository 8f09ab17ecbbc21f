"""bus.util.wakes: a late wake does not judge silence, the next one does."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st
from twisted.internet.task import Clock

from bus.util.wakes import Wakes


def test_on_time_wakes_judge_and_a_late_one_waits_for_the_next() -> None:
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
    clock.advance(0.1)  # LoopingCall's next point of its grid, soon after
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


@given(st.lists(st.floats(min_value=0.0, max_value=100.0), min_size=1, max_size=200))
def test_never_two_wakes_in_a_row_without_judging(gaps: list[float]) -> None:
    clock = Clock()
    wakes = Wakes(1.0, clock.seconds)
    previous = wakes.judging()
    for gap in gaps:
        clock.advance(gap)
        judged = wakes.judging()
        assert judged or previous
        assert judged or gap > 1.5  # only a late wake holds back
        previous = judged
