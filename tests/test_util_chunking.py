"""ChunkSizer: chunks of work sized by their measured time, and Budget: the time a step may
take (bus.util.chunking), on made-up durations (no clock is read here)."""

from __future__ import annotations

import pytest

from bus.util.chunking import Budget, ChunkSizer


def test_the_first_chunk_is_the_given_one_then_each_kind_follows_its_own_rate() -> None:
    sizer = ChunkSizer(0.002, first=100, smallest=10, largest=100_000)
    assert sizer.chunk("delete") == 100
    sizer.took("delete", 100, 0.0001)  # 1M items/s: 2000 items fill 2 ms
    assert sizer.chunk("delete") == 200  # at most twice the last chunk
    assert sizer.chunk("delete") == 400
    assert sizer.chunk("delete") == 800
    assert sizer.chunk("delete") == 1600
    assert sizer.chunk("delete") == 2000
    assert sizer.chunk("count") == 100  # another kind: its own rate, from the first chunk
    sizer.took("count", 100, 0.004)  # 25k items/s: 50 items fill 2 ms
    assert sizer.chunk("count") == 50
    assert sizer.chunk("delete") == 2000


def test_one_slow_step_among_several_does_not_shrink_the_next_chunk() -> None:
    sizer = ChunkSizer(0.002, first=1000, largest=100_000)
    for _ in range(4):
        sizer.took("delete", 1000, 0.001)  # 1M items/s
    sizer.took("delete", 1000, 0.050)  # the thread was off the CPU for 49 ms
    assert sizer.chunk("delete") == 2000
    for _ in range(4):  # but a slowdown that lasts does
        sizer.took("delete", 1000, 0.010)
    assert sizer.chunk("delete") == 200


def test_chunks_stay_within_their_bounds() -> None:
    sizer = ChunkSizer(0.002, first=64, smallest=16, largest=1000, window=1)
    sizer.took("fast", 64, 1e-9)
    sizes = [sizer.chunk("fast") for _ in range(6)]
    assert sizes == [128, 256, 512, 1000, 1000, 1000]
    sizer.took("slow", 64, 10.0)
    assert sizer.chunk("slow") == 16


@pytest.mark.parametrize(
    "arguments",
    [
        {"target": 0.0},
        {"target": 0.002, "smallest": 0},
        {"target": 0.002, "first": 8, "smallest": 16},
        {"target": 0.002, "first": 2000, "largest": 1000},
        {"target": 0.002, "window": 0},
    ],
)
def test_impossible_settings_are_refused(arguments: dict[str, float]) -> None:
    with pytest.raises(ValueError, match="need target"):
        ChunkSizer(**arguments)  # type: ignore[arg-type]


def test_a_budget_is_spent_once_its_clock_passed_the_end_and_stays_spent() -> None:
    readings = iter([10.0, 10.0005, 10.001, 10.002, 10.0025, 10.0])
    budget = Budget(0.002, clock=lambda: next(readings))  # from 10.0 to 10.002
    assert not budget.spent() and not budget.over
    assert not budget.spent()  # 10.001, and a stretch of 0.5 ms would end at 10.0015
    assert budget.spent() and budget.over  # 10.002: the end
    assert budget.spent()  # stays spent without reading the clock again ...
    assert next(readings) == 10.0025  # ... which was read four times in all


def test_a_budget_is_spent_before_a_stretch_that_would_pass_its_end() -> None:
    """The machine ran a stretch of work eight times slower (1.6 ms where 0.2 ms was its
    pace): the budget says it is spent at 1.8 ms of 2.5, since one more stretch as long would
    end past it; the step stops there instead of going on into that stretch."""
    readings = iter([10.0, 10.0002, 10.0018, 10.0])
    budget = Budget(0.0025, clock=lambda: next(readings))
    assert not budget.spent()
    assert budget.spent() and budget.over
    assert next(readings) == 10.0
