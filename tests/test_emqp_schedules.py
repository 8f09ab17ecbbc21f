"""The broker's schedule book (sans-I/O): identity, validation, timing rules, restore."""

from __future__ import annotations

import itertools
import json
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any
from zoneinfo import ZoneInfo

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bus.emqp.codec import EmqpError
from bus.emqp.schedules import (
    ROW_FIELDS,
    Schedule,
    ScheduleBook,
    ScheduleError,
    ScheduleRow,
    ScheduleSpec,
    cron_next,
    schedule_id,
    unschedule_id,
)

T0 = 1_700_000_000.0  # 2023-11-14 22:13:20 UTC
BERLIN = ZoneInfo("Europe/Berlin")


def job(name: str = "tick", args: list[Any] | None = None, **kwargs: Any) -> bytes:
    """A body as eventmq's client ``schedule()`` builds it."""
    return json.dumps(
        [
            "run",
            {
                "callable": name,
                "path": "app.jobs",
                "args": args or [],
                "kwargs": kwargs,
                "class_args": [],
                "class_kwargs": {},
            },
        ]
    ).encode()


def every(seconds: float, body: bytes | None = None, headers: bytes = b"guarantee") -> ScheduleSpec:
    return ScheduleSpec(b"default", headers, seconds, None, body or job())


def cron(expression: str, body: bytes | None = None, headers: bytes = b"") -> ScheduleSpec:
    return ScheduleSpec(b"default", headers, None, expression, body or job("cron"))


def utc(
    year: int, month: int, day: int, hour: int = 0, minute: int = 0, second: int = 0, us: int = 0
) -> float:
    return datetime(year, month, day, hour, minute, second, us, tzinfo=UTC).timestamp()


def berlin(year: int, month: int, day: int, hour: int = 0, minute: int = 0, fold: int = 0) -> float:
    return datetime(year, month, day, hour, minute, tzinfo=BERLIN, fold=fold).timestamp()


def ids(schedules: list[Schedule]) -> list[str]:
    return [s.id for s in schedules]


# -- intervals ----------------------------------------------------------------------------------


def test_an_interval_runs_at_once_then_every_interval() -> None:
    book = ScheduleBook()
    schedule, replaced = book.add(every(60), T0)
    assert not replaced and len(book) == 1 and book.next_due == T0
    assert book.due(T0) == [schedule]
    assert book.due(T0) == []  # once per due time
    assert book.due(T0 + 59.9) == []
    assert book.due(T0 + 60) == [schedule]
    assert book.next_due == T0 + 120
    assert (schedule.runs, schedule.last_run, schedule.created) == (2, T0 + 60, T0)


def test_nohaste_waits_one_interval() -> None:
    book = ScheduleBook()
    book.add(every(60, headers=b"guarantee,nohaste"), T0)
    assert book.due(T0) == [] and book.next_due == T0 + 60


def test_a_late_run_keeps_the_phase() -> None:
    book = ScheduleBook()
    schedule, _ = book.add(every(60), T0)
    book.due(T0 + 2)  # the first run left 2 s late
    assert schedule.next_due == T0 + 60
    assert book.due(T0 + 65) == [schedule]
    assert schedule.next_due == T0 + 120


def test_late_by_several_intervals_runs_once_then_skips_to_the_phase() -> None:
    book = ScheduleBook()
    schedule, _ = book.add(every(60), T0)
    book.due(T0)
    assert book.due(T0 + 5 * 60 + 10) == [schedule]  # a stall of five intervals: one run
    assert schedule.next_due == T0 + 6 * 60
    assert book.due(T0 + 5 * 60 + 10) == []
    assert schedule.runs == 2


def test_a_run_late_by_over_half_an_interval_moves_the_next_one_on() -> None:
    book = ScheduleBook()
    schedule, _ = book.add(every(60), T0)
    book.due(T0)
    assert book.due(T0 + 60 + 29) == [schedule]  # 29 s late: the next point, 31 s on
    assert schedule.next_due == T0 + 120
    assert book.due(T0 + 120 + 40) == [schedule]  # 40 s late: not 20 s on, 80 s on
    assert schedule.next_due == T0 + 240
    assert book.due(T0 + 240 + 30) == [schedule]  # exactly half: the next point, 30 s on
    assert schedule.next_due == T0 + 300


def test_run_count_limits_the_runs_then_the_schedule_leaves() -> None:
    book = ScheduleBook()
    schedule, _ = book.add(every(10, headers=b"run_count:3"), T0)
    assert book.due(T0) == [schedule] and book.due(T0 + 10) == [schedule]
    assert book.due(T0 + 20) == [schedule] and schedule.finished
    assert len(book) == 0 and book.get(schedule.id) is None and book.next_due is None
    assert book.due(T0 + 100) == []


# -- identity, replace and remove ---------------------------------------------------------------


def test_identity_is_eventmqs() -> None:
    # Computed with eventmq 0.3.13's Scheduler.schedule_hash for the same job.
    body = job(args=[1, "x"], b=2, a="é")
    assert schedule_id(body) == "b6fcfd85f74500c39a99be33f0e59f3bb2ef30a3"
    assert schedule_id(job()) == "0211e4bed723e44971d8101d7393598a9ab8fe78"
    # The same job at another interval, queue or as cron: the same schedule.
    assert every(60).id == every(5).id == schedule_id(job())
    assert ScheduleSpec(b"other", b"", None, "* * * * *", job()).id == every(60).id
    # Different arguments: another schedule; kwargs' key order does not matter.
    assert schedule_id(job(args=[1])) != schedule_id(job(args=[2]))
    assert schedule_id(job(a=1, b=2)) == schedule_id(b'["run", {"kwargs": {"b": 2, "a": 1}, '
                                                     b'"path": "app.jobs", "callable": "tick", '
                                                     b'"args": [], "class_args": [], '
                                                     b'"class_kwargs": {}}]')  # fmt: skip
    # Missing arguments count as the empty ones eventmq's client sends; other keys are ignored.
    assert schedule_id(b'["run", {"path": "app.jobs", "callable": "tick", "x": 1}]') == schedule_id(
        job()
    )
    # Any other JSON body: the whole body, canonically.
    assert schedule_id(b'{"a": 1, "b": [2]}') == schedule_id(b'{"b":[2],"a":1}')
    assert schedule_id(b'{"a": 1}') != schedule_id(b'{"a": 2}')
    assert schedule_id(b'["run", {"x": 1}]') != schedule_id(b'["run", {"x": 2}]')
    # UNSCHEDULE as eventmq sends it (-1 and an empty cron) names the same schedule.
    assert unschedule_id([b"default", b"guarantee", b"-1", job(), b""]) == every(60).id
    with pytest.raises(ScheduleError):
        schedule_id(b"not json")


def test_scheduling_the_same_job_again_replaces_it() -> None:
    book = ScheduleBook()
    first, _ = book.add(every(60), T0)
    book.due(T0)
    second, replaced = book.add(ScheduleSpec(b"emails", b"", 30, None, job()), T0 + 10)
    assert replaced and second is not first and len(book) == 1
    assert book.get(first.id) is second and second.spec.queue == b"emails"
    assert second.next_due == T0 + 10  # a new schedule: at once, then every 30 s
    assert book.due(T0 + 10) == [second]
    assert book.due(T0 + 40) == [second]
    assert book.due(T0 + 60) == []  # the old entry (T0 + 60) is gone
    assert second.next_due == T0 + 70
    # A cron replacing an interval.
    third, replaced = book.add(ScheduleSpec(b"emails", b"", None, "0 * * * *", job()), T0 + 61)
    assert replaced and third.next_due == T0 + 61  # a new schedule: at once (haste)


def test_an_identical_schedule_changes_nothing() -> None:
    book = ScheduleBook()
    first, _ = book.add(every(60), T0)
    book.due(T0)
    again, replaced = book.add(every(60), T0 + 30)
    assert replaced and again is first
    assert first.next_due == T0 + 60 and book.due(T0 + 30) == []


def test_remove() -> None:
    book = ScheduleBook()
    schedule, _ = book.add(every(60), T0)
    other, _ = book.add(every(60, job("other")), T0)
    assert book.remove(schedule.id) and not book.remove(schedule.id)
    assert schedule.id not in book and other.id in book and len(book) == 1
    assert book.due(T0 + 1000) == [other]
    assert book.remove(other.id) and book.next_due is None and book.due(T0 + 5000) == []


def test_stale_entries_do_not_pile_up() -> None:
    book = ScheduleBook()
    for round_ in range(5):
        for n in range(1000):
            book.add(every(60 + round_, job(args=[n])), T0)  # each round replaces all
    assert len(book) == 1000 and len(book._heap) <= 2 * 1000 + 1100
    for n in range(1000):
        book.remove(schedule_id(job(args=[n])))
    assert len(book._heap) <= 1100 and book.next_due is None


def test_too_many_schedules() -> None:
    book = ScheduleBook(max_schedules=2)
    book.add(every(60, job("a")), T0)
    book.add(every(60, job("b")), T0)
    with pytest.raises(ScheduleError) as raised:
        book.add(every(60, job("c")), T0)
    assert raised.value.reason == "too-many-schedules"
    book.add(every(30, job("a")), T0)  # replacing stays possible when full
    assert len(book) == 2


# -- cron ---------------------------------------------------------------------------------------


def test_cron_runs_at_once_then_at_its_times() -> None:
    """eventmq's haste: a yearly cron ran 0.08 s after its SCHEDULE."""
    book = ScheduleBook(tz=UTC)
    start = utc(2024, 1, 1, 12, 3, 10)
    schedule, _ = book.add(cron("0 0 1 1 *"), start)
    assert schedule.next_due == start and book.due(start) == [schedule]
    assert schedule.next_due == utc(2025, 1, 1) and book.due(start + 3600) == []
    # The header nohaste, as eventmq reads it, waits for the first cron time.
    late, _ = book.add(cron("*/5 * * * *", job("late"), headers=b"nohaste"), start)
    assert late.next_due == utc(2024, 1, 1, 12, 5)


def test_without_haste_cron_runs_at_its_times_not_at_once() -> None:
    book = ScheduleBook(tz=UTC, cron_haste=False)
    schedule, _ = book.add(cron("*/5 * * * *"), utc(2024, 1, 1, 12, 3, 10))
    assert book.due(utc(2024, 1, 1, 12, 3, 10)) == []
    assert schedule.next_due == utc(2024, 1, 1, 12, 5)
    assert book.due(utc(2024, 1, 1, 12, 4, 59, 999999)) == []
    assert book.due(utc(2024, 1, 1, 12, 5)) == [schedule]
    assert schedule.next_due == utc(2024, 1, 1, 12, 10)
    assert book.due(utc(2024, 1, 1, 12, 17)) == [schedule]  # late: once, then the next time
    assert schedule.next_due == utc(2024, 1, 1, 12, 20)
    assert book.due(utc(2024, 1, 1, 12, 17)) == []


def test_cron_aliases_and_spacing() -> None:
    assert cron("  0   3 * * *  ").cron == "0 3 * * *"
    assert cron("@Daily").cron == "@daily"
    assert cron_next("@hourly", utc(2024, 1, 1, 12, 0, 1), UTC) == utc(2024, 1, 1, 13)
    assert cron_next("0 9 * * MON-FRI", utc(2024, 1, 5, 10), UTC) == utc(2024, 1, 8, 9)


def test_cron_in_a_zone_across_daylight_saving_time() -> None:
    def runs(expression: str, start: float, count: int) -> list[float]:
        book = ScheduleBook(tz=BERLIN, cron_haste=False)
        schedule, _ = book.add(cron(expression), start)
        times = []
        for _ in range(count):
            times.append(schedule.next_due)
            assert book.due(schedule.next_due) == [schedule]
        return times

    # Autumn: a fixed time of day runs once, an every-hour job in both 02:30s.
    assert runs("30 2 * * *", berlin(2024, 10, 26, 12), 2) == [
        berlin(2024, 10, 27, 2, 30),
        berlin(2024, 10, 28, 2, 30),
    ]
    assert runs("30 * * * *", berlin(2024, 10, 27, 1, 45), 3) == [
        berlin(2024, 10, 27, 2, 30),
        berlin(2024, 10, 27, 2, 30, fold=1),
        berlin(2024, 10, 27, 3, 30),
    ]
    # Spring: 02:30 does not exist that day and runs at 03:30; hourly jobs go on.
    assert runs("30 2 * * *", berlin(2024, 3, 30, 12), 2) == [
        berlin(2024, 3, 31, 3, 30),
        berlin(2024, 4, 1, 2, 30),
    ]
    assert runs("*/20 * * * *", berlin(2024, 3, 31, 1, 30), 3) == [
        berlin(2024, 3, 31, 1, 40),
        berlin(2024, 3, 31, 3, 0),
        berlin(2024, 3, 31, 3, 20),
    ]
    # Months ahead, across a change: the wall-clock time of that day.
    assert cron_next("0 0 1 7 *", berlin(2024, 1, 15), BERLIN) == berlin(2024, 7, 1)


@pytest.fixture
def berlin_local(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setenv("TZ", "Europe/Berlin")
    time.tzset()
    yield
    monkeypatch.undo()
    time.tzset()


@pytest.mark.usefixtures("berlin_local")
def test_the_local_zone_is_the_default() -> None:
    assert cron_next("0 3 * * *", T0) == cron_next("0 2 * * *", T0, UTC)  # TZ is in force
    for expression in ("30 2 * * *", "30 * * * *", "*/20 * * * *", "0 0 1 * *"):
        for start in (berlin(2024, 3, 30, 23), berlin(2024, 10, 27, 1), berlin(2024, 10, 27, 2)):
            assert cron_next(expression, start) == cron_next(expression, start, BERLIN)


# -- validation ---------------------------------------------------------------------------------


def test_eventmqs_frames() -> None:
    interval = ScheduleSpec.from_frames([b"default", b"guarantee", b"60", job(), b""])
    assert (interval.interval, interval.cron, interval.queue_name) == (60.0, None, "default")
    crontab = ScheduleSpec.from_frames([b"q", b"guarantee", b"-1", job(), b"*/5 * * * *"])
    assert (crontab.interval, crontab.cron) == (None, "*/5 * * * *")
    assert ScheduleSpec.from_frames([b"q", b"", b"1.5", job(), b""]).interval == 1.5
    assert interval == every(60)


@pytest.mark.parametrize(
    "fields",
    [
        [b"q", b"", b"0", job(), b""],  # eventmq's client cannot send 0; its scheduler would spin
        [b"q", b"", b"0.5", job(), b""],
        [b"q", b"", b"31536001", job(), b""],  # over a year
        [b"q", b"", b"abc", job(), b""],
        [b"q", b"", b"inf", job(), b""],
        [b"q", b"", b"nan", job(), b""],
        [b"q", b"", b"-1", job(), b""],  # neither
        [b"q", b"", b"", job(), b""],
        [b"q", b"", b"60", job(), b"* * * * *"],  # both
        [b"q", b"", b"-1", job(), b"* * * * * * *"],  # seven fields: croniter 0.3.10 refuses
        [b"q", b"", b"-1", job(), b"0 0 1 1 * 2030"],  # the sixth field is seconds
        [b"q", b"", b"-1", job(), b"* * * * * 60"],
        [b"q", b"", b"-1", job(), b"* * * *"],
        [b"q", b"", b"-1", job(), b"every minute"],
        [b"q", b"", b"-1", job(), b"61 * * * *"],
        [b"q", b"", b"-1", job(), b"*/0 * * * *"],
        [b"q", b"", b"-1", job(), b"0 0 30 2 *"],  # never
        [b"q", b"", b"-1", job(), b"R * * * *"],
        [b"q", b"", b"-1", job(), b"H * * * *"],
        [b"q", b"", b"-1", job(), b"@reboot"],
        [b"q", b"", b"-1", job(), b"\xff"],
        [b"q", b"", b"-1", job(), b"* " * 300],
        [b"q", b"", b"60", b"not json", b""],
        [b"q", b"", b"60", b"\xff", b""],
        [b"q", b"", b"60", b"[" * 100_000, b""],
        [b"q", b"", b"60", b'"' + b"x" * 70_000 + b'"', b""],
        [b"", b"", b"60", job(), b""],  # no queue
        [b"q", b"retry-count:x", b"60", job(), b""],
        [b"q", b"run_count:0", b"60", job(), b""],
        [b"q", b"run_count:x", b"60", job(), b""],
        [b"q", b"", b"60", job()],  # four fields
    ],
)
def test_bad_schedules_are_refused(fields: list[bytes]) -> None:
    with pytest.raises(ScheduleError) as raised:
        ScheduleSpec.from_frames(fields)
    assert isinstance(raised.value, EmqpError) and raised.value.reason == "bad-schedule"
    assert str(raised.value)


def test_a_spec_built_directly_is_checked_too() -> None:
    with pytest.raises(ScheduleError):
        ScheduleSpec(b"q", b"", 60, "* * * * *", job())
    with pytest.raises(ScheduleError):
        ScheduleSpec(b"q", b"", None, None, job())
    with pytest.raises(ScheduleError):
        ScheduleSpec(b"q", b"", float("nan"), None, job())


# -- rows and restore ---------------------------------------------------------------------------


def test_rows_round_trip() -> None:
    book = ScheduleBook(tz=UTC)
    interval, _ = book.add(every(60, headers=b"guarantee,run_count:5"), T0)
    crontab, _ = book.add(cron("*/5 * * * *"), T0)
    book.due(T0)
    for schedule in (interval, crontab):
        row = schedule.to_row()
        assert isinstance(row, tuple) and row._fields == ROW_FIELDS
        assert all(isinstance(v, bytes | str | float | int | type(None)) for v in row)
        back = Schedule.from_row(tuple(row))
        assert back.to_row() == row and back.spec == schedule.spec
    assert Schedule.from_row(interval.to_row()).spec.run_limit == 5


def test_bad_rows_are_reported_not_loaded() -> None:
    good = ScheduleBook().add(every(60), T0)[0].to_row()

    def changed(**values: object) -> tuple[object, ...]:
        return tuple({**good._asdict(), **values}.values())

    bad = [
        changed(id="0" * 40),  # not its body's id
        changed(interval="60"),
        changed(next_due=None),
        changed(runs=-1),
        changed(body=b"nope"),
        changed(cron="* * * * *"),  # both
        (good.id, b"q"),
    ]
    book = ScheduleBook()
    errors = book.restore([*bad, good], T0)
    assert len(errors) == len(bad) and {e.reason for e in errors} == {"bad-schedule-row"}
    assert len(book) == 1


def test_restore_after_a_downtime_runs_each_once_then_keeps_the_phase() -> None:
    before = ScheduleBook(tz=UTC)
    interval, _ = before.add(every(60), T0)
    start = utc(2024, 1, 1, 12, 1)
    crontab, _ = before.add(cron("*/5 * * * *"), start)
    before.due(T0)
    rows = [s.to_row() for s in before]
    # Down for hours: one run of each at restart, then their usual times.
    now = start + 3 * 3600 + 7
    book = ScheduleBook(tz=UTC)
    assert book.restore(rows, now) == []
    assert book.next_due == min(T0 + 60, utc(2024, 1, 1, 12, 5))
    fired = book.due(now)
    assert sorted(ids(fired)) == sorted([interval.id, crontab.id])
    assert book.due(now) == []
    restored = book.get(interval.id)
    assert restored is not None and restored.runs == 2
    assert (restored.next_due - T0) % 60 == 0
    assert 30 <= restored.next_due - now <= 90  # at least half an interval after its run
    assert book.get(crontab.id).next_due == utc(2024, 1, 1, 15, 5)  # type: ignore[union-attr]


def test_restore_without_a_missed_run_runs_nothing() -> None:
    before = ScheduleBook()
    schedule, _ = before.add(every(3600), T0)
    before.due(T0)
    book = ScheduleBook()
    book.restore([schedule.to_row()], T0 + 120)
    assert book.due(T0 + 120) == [] and book.next_due == T0 + 3600


def test_a_clock_set_back_waits_at_most_one_interval() -> None:
    book = ScheduleBook(tz=UTC)
    schedule, _ = book.add(every(60), T0)
    crontab, _ = book.add(cron("0 * * * *"), T0)
    book.due(T0 + 30)
    cron_due = crontab.next_due
    assert book.due(T0 - 3600) == []  # the clock went back an hour
    assert schedule.next_due == T0 - 3600 + 60
    assert crontab.next_due == cron_due  # cron waits for its time to come round again
    assert book.due(T0 - 3600 + 60) == [schedule]
    # Restored from a clock ahead of this one: the same rule.
    again = ScheduleBook()
    again.restore([schedule.to_row()], T0 - 7200)
    assert again.next_due == T0 - 7200 + 60


# -- scale and status ---------------------------------------------------------------------------


def test_ten_thousand_due_at_once_each_once() -> None:
    book = ScheduleBook()
    for n in range(10_000):
        book.add(every(1, job(args=[n])), T0)
    fired = book.due(T0)
    assert len(fired) == 10_000 and len(set(ids(fired))) == 10_000
    assert book.due(T0) == []
    assert len(set(ids(book.due(T0 + 1)))) == 10_000
    assert book.next_due == T0 + 2


def test_listing() -> None:
    book = ScheduleBook(tz=UTC)
    book.add(every(600, job("later"), headers=b"nohaste"), T0)
    book.add(every(60, job("soon"), headers=b"nohaste"), T0)
    book.add(cron("0 0 1 1 *", headers=b"nohaste"), T0)
    rows = book.listing(T0 + 10)
    assert [r["interval"] for r in rows] == [60.0, 600.0, None]
    assert rows[0]["next_run_in"] == 50.0 and rows[0]["runs"] == 0 and rows[0]["last_run"] is None
    assert rows[2]["cron"] == "0 0 1 1 *" and rows[2]["queue"] == "default"
    assert json.loads(json.dumps(rows)) == rows
    assert book.listing(T0, limit=1) == book.listing(T0)[:1]


# -- properties ---------------------------------------------------------------------------------

intervals = st.lists(st.integers(1, 600), min_size=1, max_size=8)
steps = st.lists(st.floats(0, 2000, allow_nan=False), min_size=1, max_size=40)


@settings(max_examples=150, deadline=None)
@given(intervals, steps, st.lists(st.integers(0, 600), min_size=8, max_size=8))
def test_never_early_never_twice_per_call(
    periods: list[int], gaps: list[float], offsets: list[int]
) -> None:
    book = ScheduleBook()
    for n, period in enumerate(periods):
        book.add(every(period, job(args=[n])), T0 + offsets[n])
    now = T0 + max(offsets)
    for gap in gaps:
        now += gap
        before = {s.id: s.next_due for s in book}
        fired = book.due(now)
        assert len(set(ids(fired))) == len(fired)
        assert all(before[s.id] <= now for s in fired)
        assert all(s.next_due > now for s in book)
        assert book.next_due == min(s.next_due for s in book)


@settings(max_examples=150, deadline=None)
@given(st.integers(1, 300), st.lists(st.floats(0.01, 1.0), min_size=1, max_size=300))
def test_runs_over_a_span_follow_the_interval(period: int, fractions: list[float]) -> None:
    book = ScheduleBook()
    schedule, _ = book.add(every(period), T0)
    now = T0
    runs = len(book.due(now))
    for fraction in fractions:  # polled more often than twice an interval: never skips
        now += fraction * period * 0.49
        runs += len(book.due(now))
    span = now - T0
    assert span / period - 1 <= runs <= span / period + 1
    assert runs == schedule.runs


@settings(max_examples=150, deadline=None)
@given(st.integers(1, 300), steps)
def test_never_two_runs_closer_than_half_an_interval(period: int, gaps: list[float]) -> None:
    book = ScheduleBook()
    book.add(every(period), T0)
    now, ran = T0, []
    for gap in [0.0, *gaps]:  # polled at any times: a stalled process, a late timer
        now += gap
        if book.due(now):
            ran.append(now)
    assert all(later - earlier >= period / 2 for earlier, later in itertools.pairwise(ran))
    assert all((s.next_due - T0) % period == 0 for s in book)  # in its phase


@settings(max_examples=100, deadline=None)
@given(
    intervals,
    st.lists(st.floats(0, 5000, allow_nan=False), max_size=10),
    st.floats(0, 10 * 86_400, allow_nan=False),
)
def test_restore_never_runs_a_schedule_twice(
    periods: list[int], gaps: list[float], downtime: float
) -> None:
    book = ScheduleBook(tz=UTC)
    for n, period in enumerate(periods):
        book.add(every(period, job(args=[n])), T0)
    book.add(cron("*/7 * * * *"), T0)
    now = T0
    for gap in gaps:
        now += gap
        book.due(now)
    rows: list[ScheduleRow] = [s.to_row() for s in book]
    now += downtime
    restored = ScheduleBook(tz=UTC)
    assert restored.restore(rows, now) == []
    fired = restored.due(now)
    assert len(set(ids(fired))) == len(fired) <= len(rows)
    assert restored.due(now) == []
    assert all(s.next_due > now for s in restored)


def test_six_fields_end_with_seconds_as_croniter_reads_them() -> None:
    assert cron("* * * * *   */10").cron == "* * * * * */10"
    assert cron_next("* * * * * */10", utc(2024, 1, 1, 12, 0, 3), UTC) == utc(2024, 1, 1, 12, 0, 10)
    assert cron_next("*/5 * * * * 30", utc(2024, 1, 1, 12, 0, 31), UTC) == utc(
        2024, 1, 1, 12, 5, 30
    )
    book = ScheduleBook(tz=UTC)
    schedule, _ = book.add(cron("* * * * * */10", headers=b"nohaste"), utc(2024, 1, 1, 12, 0, 3))
    assert schedule.next_due == utc(2024, 1, 1, 12, 0, 10)
    assert book.due(utc(2024, 1, 1, 12, 0, 10)) == [schedule]
    assert schedule.next_due == utc(2024, 1, 1, 12, 0, 20)


cron_items = st.sampled_from(["*", "*/7", "0", "59", "60", "1-3", "5,6", "*/0", "a", "H", "MON"])


@settings(max_examples=300, deadline=None)
@given(st.lists(cron_items, min_size=1, max_size=8))
def test_any_cron_line_is_refused_or_has_a_next_time(items: list[str]) -> None:
    line = " ".join(items)
    try:
        spec = ScheduleSpec.from_frames([b"q", b"", b"-1", job(), line.encode()])
    except ScheduleError as error:
        assert error.reason == "bad-schedule" and str(error)
        return
    assert len(items) in (5, 6)
    assert spec.cron is not None and cron_next(spec.cron, T0, UTC) > T0


def test_a_listing_says_what_a_schedule_runs() -> None:
    from bus.emqp.schedules import BODY_PREVIEW, job_of

    run = b'["run", {"path": "pkg.mod:Class", "callable": "method", "args": []}]'
    assert job_of(run) == {"path": "pkg.mod:Class", "callable": "method", "body": None}
    assert job_of(b'["tick", 7]') == {"path": None, "callable": None, "body": '["tick", 7]'}
    long = json.dumps(["report", {"to": "x" * 200}]).encode()
    shown = job_of(long)["body"]
    assert shown == long[:BODY_PREVIEW].decode() + "..."
    # Cut inside a character: the half character is left out, not shown as garbage.
    accented = json.dumps(["é" * 100], ensure_ascii=False).encode()
    assert "\ufffd" not in job_of(accented)["body"]
