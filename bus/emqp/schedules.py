"""The broker's schedule book, sans-I/O: interval and cron schedules, when each runs next.

No sockets, no reactor, no storage: the caller passes the time (``time.time()`` seconds),
sends a REQUEST for every schedule that :meth:`ScheduleBook.due` returns and stores the
rows that :meth:`Schedule.to_row` gives. Schedules arrive as eventmq's SCHEDULE frames
(``queue, headers, interval, body, cron``; :meth:`ScheduleSpec.from_frames`).

When a schedule runs (the rules an operator can rely on)

- Interval schedules run as soon as they are scheduled, then every interval after that
  first run (eventmq's "haste"). The header ``nohaste`` moves the first run one interval
  later. Intervals are 1 second to 1 year; eventmq's client cannot send 0, and its
  scheduler would run a 0 interval in a busy loop, so 0 is refused.
- Cron schedules also run as soon as they are scheduled, as eventmq's scheduler runs them
  (its haste: a yearly cron ran 0.08 s after its SCHEDULE), then at their cron times; the
  header ``nohaste``, or a book made with ``cron_haste=False`` (the broker's
  ``--no-haste``), makes the first run the next cron time instead.
  Cron times are read in the broker's local time zone (or the zone the book is given), with
  the five standard fields (minute hour day month weekday), an alias such as ``@daily``, or
  six fields whose sixth is seconds, as eventmq's croniter (0.3.10) reads them
  (``* * * * * */10``: every ten seconds; Quartz would put seconds first). Seven fields
  (years) are refused, as croniter 0.3.10 refuses them. Random (``R``) and hashed (``H``)
  fields are refused: their times would not survive a restart.
- A schedule keeps its rhythm: a run fired a little late does not push the later ones back
  (an hourly schedule started at 10:00:00 runs at 11:00:00 even if the 10:00 run left at
  10:00:02).
- Never a burst: when a schedule is overdue by more than one period (the process stalled,
  the clock jumped ahead, the broker was down), it runs once, and its next run is the next
  time of its rhythm after now. The missed runs are not made up.
- Never two runs of an interval schedule closer than half its interval: after a run that
  left more than half an interval late, the next is the first point of its rhythm at least
  half an interval after it (a 60 s schedule run 40 s late skips the point 20 s later).
- After a restart: :meth:`ScheduleBook.restore` loads the stored schedules, and the next
  :meth:`ScheduleBook.due` runs each one that missed runs while the broker was down exactly
  once (like systemd's ``Persistent=true`` or anacron); then each continues in its rhythm
  (interval: the next point of its original phase at least half an interval after that
  run; cron: the next cron time).
- In a cluster (``--store jetstream``) the same rules hold across the brokers, the time of
  a run being when the stream stored it: see :mod:`bus.emqp.schedule_gate`.
- The same job is the same schedule: a schedule's id is a hash of its job (eventmq's: the
  body's path, callable, args, kwargs, class_args and class_kwargs), so UNSCHEDULE with the
  same body removes it. A SCHEDULE identical to the one in place changes nothing (an
  application may register its schedules at every start without causing extra runs); one
  that differs in interval, cron, queue or headers replaces it and starts over as new.
- The header ``run_count:N`` limits a schedule to N runs (counting the first), after which
  it is removed (eventmq's, applied here to cron schedules too); ``run_count:-1`` is no
  limit.
- Clock set back (wall-clock time): an interval schedule never waits more than one interval
  from the new time; a cron schedule waits for its cron time to come round again, as cron
  does (what ran does not run again).
- Daylight saving time: when clocks go forward, a cron time inside the skipped hour runs one
  hour later (02:30 runs at 03:30); when clocks go back, a job at a fixed hour runs once
  (02:30 is not run twice) while a job for every hour (hour field ``*``) runs in both hours.
"""

from __future__ import annotations

import functools
import hashlib
import heapq
import itertools
import json
import math
import re
from collections import deque
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta, timezone, tzinfo
from typing import Any, Final, NamedTuple

from croniter import croniter

from bus.emqp.codec import EmqpError, parse_headers, queue_name

MIN_INTERVAL: Final = 1.0
MAX_INTERVAL: Final = 365 * 86_400.0
MAX_SCHEDULES: Final = 100_000
#: A scheduled job's body is a callable's path and its arguments; it is kept in memory.
MAX_BODY_BYTES: Final = 64 * 1024
MAX_CRON_CHARS: Final = 512
#: A step of the clock back by more than this brings interval schedules within one interval.
CLOCK_STEP_BACK: Final = 1.0

NO_HASTE: Final = "nohaste"
RUN_COUNT: Final = "run_count"

_CRON_ALIASES: Final = frozenset(
    {"@yearly", "@annually", "@monthly", "@weekly", "@daily", "@midnight", "@hourly"}
)
_INTERVAL_TEXT: Final = re.compile(r"-?[0-9]+(?:\.[0-9]+)?")
# Any instant works: a five-field expression that ever matches does within a few years.
_CRON_CHECK_FROM: Final = datetime(2000, 1, 1, tzinfo=UTC)
_RUN_KEYS: Final = ("args", "kwargs", "class_args", "class_kwargs")
_RUN_DEFAULTS: Final[dict[str, Any]] = {
    "args": [],
    "kwargs": {},
    "class_args": [],
    "class_kwargs": {},
}


class ScheduleError(EmqpError):
    """A SCHEDULE the broker refuses (``reason`` ``bad-schedule``), a full book
    (``too-many-schedules``) or a stored row that cannot be read (``bad-schedule-row``)."""

    reason = "bad-schedule"


# -- identity -----------------------------------------------------------------------------------


def _load_body(body: bytes) -> Any:
    if len(body) > MAX_BODY_BYTES:
        raise ScheduleError(f"schedule body over {MAX_BODY_BYTES} bytes")
    try:
        return json.loads(body.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        raise ScheduleError("schedule body is not JSON") from None


def _identity_of(value: Any) -> str:
    job = value[1] if isinstance(value, list) and len(value) == 2 and value[0] == "run" else None
    if isinstance(job, dict) and "path" in job and "callable" in job:
        # eventmq's identity. Missing arguments count as the empty ones its client sends,
        # and json.dumps' default separators give the very hash eventmq's scheduler logs.
        value = {"path": job["path"], "callable": job["callable"]}
        for key in _RUN_KEYS:
            value[key] = job.get(key, _RUN_DEFAULTS[key])
    try:
        canonical = json.dumps(value, sort_keys=True)
    except (ValueError, RecursionError):
        raise ScheduleError("schedule body cannot be hashed") from None
    return hashlib.sha1(canonical.encode("ascii"), usedforsecurity=False).hexdigest()


#: How much of a body that is not eventmq's ``["run", {...}]`` a listing shows.
BODY_PREVIEW: Final = 60


def job_of(body: bytes) -> dict[str, Any]:
    """What a schedule runs, for people: ``path`` and ``callable`` of eventmq's
    ``["run", {"path": ..., "callable": ...}]``, else ``body``, the body's first
    :data:`BODY_PREVIEW` bytes as text (``...`` after them when there is more); the other
    keys are None."""
    try:
        value = json.loads(body.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        value = None
    job = value[1] if isinstance(value, list) and len(value) == 2 and value[0] == "run" else None
    if isinstance(job, dict) and isinstance(job.get("path"), str):
        named = job.get("callable")
        callable_ = named if isinstance(named, str) else None
        return {"path": job["path"], "callable": callable_, "body": None}
    preview = body[:BODY_PREVIEW].decode("utf-8", "replace").rstrip("\ufffd")
    more = "..." if len(body) > BODY_PREVIEW else ""
    return {"path": None, "callable": None, "body": preview + more}


def schedule_id(body: bytes) -> str:
    """A schedule's identity: the SHA-1 hex of its job, as eventmq's scheduler computes it.

    For ``["run", {...}]``: path, callable, args, kwargs, class_args and class_kwargs (other
    keys ignored, key order irrelevant); for any other JSON body, the whole body.
    """
    return _identity_of(_load_body(body))


def unschedule_id(fields: Sequence[bytes]) -> str:
    """The id an UNSCHEDULE names: only its body counts (eventmq sends ``-1`` and an empty
    cron with it, which :meth:`ScheduleSpec.from_frames` would refuse)."""
    if len(fields) != 5:
        raise ScheduleError(f"UNSCHEDULE has {len(fields)} fields, wants 5")
    return schedule_id(fields[3])


# -- cron ---------------------------------------------------------------------------------------


def _check_cron(text: str) -> str:
    """The expression, its spacing normalised, or :class:`ScheduleError`."""
    if len(text) > MAX_CRON_CHARS:  # before the cache, which keeps what it is given
        raise ScheduleError(f"cron expression over {MAX_CRON_CHARS} characters")
    return _checked_cron(text)


@functools.lru_cache(maxsize=1024)  # applications schedule many jobs with few cron lines
def _checked_cron(text: str) -> str:
    expression = " ".join(text.split())
    if not expression:
        raise ScheduleError("empty cron expression")
    if expression.startswith("@"):
        expression = expression.lower()
        if expression not in _CRON_ALIASES:
            raise ScheduleError(f"unknown cron alias {expression[:40]!r}")
    else:
        fields = expression.split(" ")
        if len(fields) not in (5, 6):
            raise ScheduleError(
                f"cron {expression[:80]!r} has {len(fields)} fields; five (minute hour day "
                "month weekday) or six (then seconds, last, as croniter reads them)"
            )
        for item in re.split(r"[ ,/-]", expression):
            if item[:1] in ("H", "h", "R", "r") and item:
                raise ScheduleError(f"cron {expression[:80]!r}: H and R fields are not supported")
    try:
        croniter(expression, _CRON_CHECK_FROM).get_next(float)
    except Exception as error:  # untrusted text into a third-party parser: anything it raises
        raise ScheduleError(f"bad cron {expression[:80]!r}: {error}") from None
    return expression


def _utc_offset(when: float, tz: tzinfo | None) -> timedelta:
    if tz is None:  # astimezone() on a naive time: the process's zone, at that instant
        offset = datetime.fromtimestamp(when).astimezone().utcoffset()
    else:
        offset = datetime.fromtimestamp(when, tz).utcoffset()
    return offset if offset is not None else timedelta(0)


def _next_at_offset(expression: str, after: float, offset: timedelta) -> float:
    start = datetime.fromtimestamp(after, timezone(offset))
    return float(croniter(expression, start).get_next(float))


def cron_next(expression: str, after: float, tz: tzinfo | None = None) -> float:
    """The first time strictly after ``after`` that matches ``expression``, read in ``tz``
    (the process's local zone when None), as epoch seconds.

    Computed at the fixed UTC offset in force at ``after`` (the local zone is known only as
    offsets) and again at the offset of the answer when the two differ, so a change of
    daylight saving time in between is taken into account.
    """
    offset = _utc_offset(after, tz)
    first = _next_at_offset(expression, after, offset)
    offset_then = _utc_offset(first, tz)
    if offset_then == offset:
        return first
    second = _next_at_offset(expression, after, offset_then)
    if _utc_offset(second, tz) == offset_then:
        return second
    # Neither offset fits: the time is in the hour skipped in spring, so it runs an hour later.
    return max(first, second)


def _wall_clock(when: float, tz: tzinfo | None) -> datetime:
    return datetime.fromtimestamp(when, timezone(_utc_offset(when, tz))).replace(tzinfo=None)


def _every_hour(expression: str) -> bool:
    if expression.startswith("@"):
        return expression == "@hourly"
    return expression.split(" ")[1] in ("*", "*/1")


# -- a schedule's definition --------------------------------------------------------------------


def _header_options(headers: bytes) -> tuple[bool, int | None]:
    """eventmq's scheduler headers: ``nohaste`` and ``run_count:N``."""
    haste = True
    limit: int | None = None
    for part in headers.decode("utf-8").split(","):
        name, _, argument = part.strip().partition(":")
        if name == NO_HASTE:
            haste = False
        elif name == RUN_COUNT:
            try:
                count = int(argument)
            except ValueError:
                raise ScheduleError(f"header run_count:{argument[:20]!r} is not a number") from None
            if count == -1:
                limit = None
            elif count >= 1:
                limit = count
            else:
                raise ScheduleError(f"header run_count:{count}: -1 (no limit) or at least 1")
    return haste, limit


@dataclass(frozen=True, slots=True)
class ScheduleSpec:
    """What a SCHEDULE asks for; validated when built. Exactly one of ``interval`` (seconds)
    and ``cron`` is set. ``id``, ``haste`` and ``run_limit`` are derived."""

    queue: bytes
    headers: bytes
    interval: float | None
    cron: str | None
    body: bytes
    id: str = field(init=False, repr=False, compare=False)
    haste: bool = field(init=False, repr=False, compare=False)
    run_limit: int | None = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        try:
            queue_name(self.queue)
            parse_headers(self.headers)
        except EmqpError as error:
            raise ScheduleError(str(error)) from None
        haste, limit = _header_options(self.headers)
        object.__setattr__(self, "haste", haste)
        object.__setattr__(self, "run_limit", limit)
        if (self.interval is None) == (self.cron is None):
            raise ScheduleError("a schedule needs either an interval or a cron expression")
        if self.interval is not None:
            interval = float(self.interval)
            if not (math.isfinite(interval) and MIN_INTERVAL <= interval <= MAX_INTERVAL):
                raise ScheduleError(
                    f"interval {self.interval!r} is not {MIN_INTERVAL:g} to {MAX_INTERVAL:g} s"
                )
            object.__setattr__(self, "interval", interval)
        if self.cron is not None:
            object.__setattr__(self, "cron", _check_cron(self.cron))
        object.__setattr__(self, "id", schedule_id(self.body))

    @classmethod
    def from_frames(cls, fields: Sequence[bytes]) -> ScheduleSpec:
        """The five SCHEDULE fields as eventmq sends them: ``queue, headers, interval, body,
        cron``; interval ``-1`` (any negative number, or empty) with a cron expression, or
        an interval in seconds with an empty cron."""
        if len(fields) != 5:
            raise ScheduleError(f"SCHEDULE has {len(fields)} fields, wants 5")
        queue, headers, interval_frame, body, cron_frame = fields
        try:
            interval_text = interval_frame.decode("ascii").strip()
            cron_text = cron_frame.decode("utf-8").strip()
        except UnicodeDecodeError:
            raise ScheduleError("interval or cron is not text") from None
        interval: float | None = None
        if interval_text:
            if not _INTERVAL_TEXT.fullmatch(interval_text):
                raise ScheduleError(f"interval {interval_text[:20]!r} is not a number")
            interval = float(interval_text)
            if interval < 0:
                interval = None  # eventmq's "no interval": a cron schedule
            elif interval == 0:
                raise ScheduleError("interval 0: a schedule needs at least 1 s")
        return cls(queue, headers, interval, cron_text or None, body)

    @property
    def queue_name(self) -> str:
        """The queue's name as text."""
        return self.queue.decode("utf-8")


# -- a schedule's state -------------------------------------------------------------------------


class ScheduleRow(NamedTuple):
    """A schedule as plain values, for the store (bytes, str, float, int or None)."""

    id: str
    queue: bytes
    headers: bytes
    interval: float | None
    cron: str | None
    body: bytes
    created: float
    next_due: float
    runs: int
    last_run: float | None


ROW_FIELDS: Final = ScheduleRow._fields


def _number(value: object, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ScheduleError(f"stored {what} {value!r} is not a number", "bad-schedule-row")
    return float(value)


def _number_or_none(value: object, what: str) -> float | None:
    return None if value is None else _number(value, what)


@dataclass(slots=True, eq=False)
class Schedule:
    """One schedule in the book: its definition and when it runs."""

    id: str
    spec: ScheduleSpec
    created: float
    next_due: float
    runs: int = 0
    last_run: float | None = None
    #: Set when the schedule ran its ``run_count`` and left the book: delete its row.
    finished: bool = False
    #: Its revision in the cluster's key-value bucket (``--store jetstream``; 0: none).
    revision: int = 0
    #: In the bucket: run ``runs`` is fired and not yet stored in the stream (``next_due``
    #: is then its due time). See :mod:`bus.emqp.schedule_gate`.
    pending: bool = False
    # The heap entry that is current for this schedule (0: none): older ones are stale.
    _token: int = field(default=0, repr=False)

    def to_row(self) -> ScheduleRow:
        """The schedule as the store keeps it."""
        spec = self.spec
        return ScheduleRow(
            self.id,
            spec.queue,
            spec.headers,
            spec.interval,
            spec.cron,
            spec.body,
            self.created,
            self.next_due,
            self.runs,
            self.last_run,
        )

    @classmethod
    def from_row(cls, row: Sequence[object]) -> Schedule:
        """Back from :meth:`to_row`'s values; a row that does not hold a valid schedule
        raises :class:`ScheduleError` (reason ``bad-schedule-row``)."""
        if len(row) != len(ROW_FIELDS):
            raise ScheduleError(f"stored row has {len(row)} values", "bad-schedule-row")
        id_, queue, headers, interval, cron, body, created, next_due, runs, last_run = row
        if not (
            isinstance(id_, str)
            and isinstance(queue, bytes)
            and isinstance(headers, bytes)
            and isinstance(body, bytes)
            and (cron is None or isinstance(cron, str))
            and isinstance(runs, int)
            and runs >= 0
        ):
            raise ScheduleError(f"stored row {str(id_)[:40]!r} is malformed", "bad-schedule-row")
        try:
            spec = ScheduleSpec(queue, headers, _number_or_none(interval, "interval"), cron, body)
        except ScheduleError as error:
            raise ScheduleError(
                f"stored schedule {id_[:40]!r}: {error}", "bad-schedule-row"
            ) from None
        if spec.id != id_:
            raise ScheduleError(
                f"stored schedule {id_[:40]!r} is not its body's", "bad-schedule-row"
            )
        return cls(
            id_,
            spec,
            _number(created, "created"),
            _number(next_due, "next_due"),
            runs,
            _number_or_none(last_run, "last_run"),
        )


# -- the book -----------------------------------------------------------------------------------


_Entry = tuple[float, int, Schedule]


class ScheduleBook:
    """Every schedule, and a heap of when each runs next.

    The heap is never searched: a removed or rescheduled schedule's old entry stays in it
    and is skipped when it comes out (its token is no longer the schedule's), and the heap
    is rebuilt once the stale entries outnumber the live ones. :meth:`due` costs
    O(k log n) for k schedules due out of n.
    """

    def __init__(
        self, max_schedules: int = MAX_SCHEDULES, tz: tzinfo | None = None, cron_haste: bool = True
    ) -> None:
        self.max_schedules = max_schedules
        #: Whether a new cron schedule runs at once (eventmq's haste) or at its next time.
        self.cron_haste = cron_haste
        #: The zone cron times are read in; None: the process's local zone.
        self.tz = tz
        self._by_id: dict[str, Schedule] = {}
        self._heap: list[_Entry] = []
        self._stale = 0
        self._tokens = itertools.count(1)
        self._last_now = -math.inf
        #: How late the most recent runs were (seconds after their due time), for status.
        self.lateness: deque[float] = deque(maxlen=10_000)

    def __len__(self) -> int:
        return len(self._by_id)

    def __contains__(self, schedule_id: object) -> bool:
        return schedule_id in self._by_id

    def __iter__(self) -> Iterator[Schedule]:
        return iter(list(self._by_id.values()))

    def get(self, schedule_id: str) -> Schedule | None:
        """The schedule ``schedule_id``, or None."""
        return self._by_id.get(schedule_id)

    # -- changes ---------------------------------------------------------------------------------

    def add(self, spec: ScheduleSpec, now: float) -> tuple[Schedule, bool]:
        """Schedule ``spec``; ``replaced`` tells that its id was already in the book. An
        identical spec keeps the schedule as it is (same object, same next run)."""
        old = self._by_id.get(spec.id)
        if old is not None and old.spec == spec:
            return old, True
        if old is None and len(self._by_id) >= self.max_schedules:
            raise ScheduleError(
                f"{len(self._by_id)} schedules, at most {self.max_schedules}",
                "too-many-schedules",
            )
        if spec.interval is not None:
            first = now if spec.haste else now + spec.interval
        elif spec.haste and self.cron_haste:
            first = now
        else:
            assert spec.cron is not None
            try:
                first = self._cron_next(spec.cron, now)
            except Exception:  # cannot happen for a checked line; the old schedule stays
                raise ScheduleError(f"cron {spec.cron!r} has no next time") from None
        if old is not None:
            self._forget(old)
        schedule = Schedule(spec.id, spec, now, first)
        self._by_id[spec.id] = schedule
        self._push(schedule)
        return schedule, old is not None

    def remove(self, schedule_id: str) -> bool:
        """Forget schedule ``schedule_id``; False when the book did not hold it."""
        schedule = self._by_id.get(schedule_id)
        if schedule is None:
            return False
        self._forget(schedule)
        return True

    def restore(self, rows: Iterable[Sequence[object]], now: float) -> list[ScheduleError]:
        """Load stored rows after a restart; returns the errors of rows that were skipped.

        Rows are loaded even past ``max_schedules`` (stored schedules are never dropped). The
        next :meth:`due` runs each schedule that missed runs while the broker was down, once.
        """
        errors = []
        for row in rows:
            try:
                schedule = Schedule.from_row(row)
            except ScheduleError as error:
                errors.append(error)
                continue
            old = self._by_id.get(schedule.id)
            if old is not None:
                self._forget(old)
            interval = schedule.spec.interval
            # A run waits at most 1.5 intervals for the next (half an interval after a late
            # one, then the next point of its rhythm): longer, it was stored under a clock
            # ahead of this one.
            if interval is not None and schedule.next_due > now + 1.5 * interval:
                schedule.next_due = now + interval
            self._by_id[schedule.id] = schedule
            self._push(schedule)
        self._last_now = max(self._last_now, now)
        return errors

    def put(
        self, row: Sequence[object], revision: int, now: float, pending: bool = False
    ) -> Schedule | None:
        """A schedule as the cluster's bucket holds it at ``revision``: replaces this
        book's; None when the book knows a later one (the book never runs ahead of the
        bucket). Raises :class:`ScheduleError` for a row that holds no valid schedule."""
        schedule_id = row[0] if row else None
        old = self._by_id.get(schedule_id) if isinstance(schedule_id, str) else None
        if old is not None and old.revision > revision:
            return None
        errors = self.restore([row], now)
        if errors:
            raise errors[0]
        assert isinstance(schedule_id, str)
        schedule = self._by_id[schedule_id]
        schedule.revision = revision
        schedule.pending = pending
        return schedule

    # -- time ------------------------------------------------------------------------------------

    @property
    def next_due(self) -> float | None:
        """When the earliest schedule is due (to arm one timer), or None for an empty book."""
        heap = self._heap
        while heap and heap[0][2]._token != heap[0][1]:
            heapq.heappop(heap)
            self._stale -= 1
        return heap[0][0] if heap else None

    def due(self, now: float) -> list[Schedule]:
        """Every schedule due at or before ``now``, each once, already advanced to its next
        run (or ``finished`` and out of the book): send one REQUEST for each, store each."""
        if now < self._last_now - CLOCK_STEP_BACK:
            self._clock_set_back(now)
        self._last_now = now
        heap = self._heap
        fired: list[Schedule] = []
        cron_times: dict[str, float] = {}  # schedules sharing a cron line share its next time
        while heap and heap[0][0] <= now:
            due_at, token, schedule = heapq.heappop(heap)
            if schedule._token != token:
                self._stale -= 1
                continue
            schedule._token = 0
            schedule.runs += 1
            schedule.last_run = now
            self.lateness.append(now - due_at)
            fired.append(schedule)
            limit = schedule.spec.run_limit
            following = None
            if limit is None or schedule.runs < limit:
                following = self._after_run(schedule.spec, due_at, now, cron_times)
            if following is None:
                del self._by_id[schedule.id]
                schedule.finished = True
            else:
                schedule.next_due = following
                self._push(schedule)
        return fired

    def wake(self, now: float) -> list[Schedule]:
        """The cluster's :meth:`due`: every schedule whose time has come (its due time, or
        one given to :meth:`wake_at`), out of the heap and not advanced: the caller
        (:class:`bus.emqp.schedule_gate.ScheduleGate`) decides what each does, and puts it
        back with :meth:`wake_at` or :meth:`put`."""
        if now < self._last_now - CLOCK_STEP_BACK:
            self._clock_set_back(now)
        self._last_now = now
        heap = self._heap
        woken: list[Schedule] = []
        while heap and heap[0][0] <= now:
            _, token, schedule = heapq.heappop(heap)
            if schedule._token != token:
                self._stale -= 1
                continue
            schedule._token = 0
            woken.append(schedule)
        return woken

    def wake_at(self, schedule: Schedule, when: float) -> None:
        """:meth:`wake` gives ``schedule`` at ``when`` (instead of any time set before)."""
        if self._by_id.get(schedule.id) is schedule:
            self._push(schedule, when)

    def following(self, spec: ScheduleSpec, due_at: float, ran: float) -> float | None:
        """When a schedule runs next after its run due at ``due_at`` that ran at ``ran``
        (None: its cron line has no next time)."""
        return self._after_run(spec, due_at, ran, {})

    def _after_run(
        self, spec: ScheduleSpec, due_at: float, now: float, cron_times: dict[str, float]
    ) -> float | None:
        interval = spec.interval
        if interval is not None:
            following = due_at + interval
            earliest = now + interval / 2
            if following < earliest:  # late by over half an interval: the first point after it
                following = due_at + math.ceil((earliest - due_at) / interval) * interval
                while following < earliest:
                    following += interval
            return following
        cron = spec.cron
        assert cron is not None
        try:
            at = cron_times.get(cron)
            if at is None:
                at = cron_times[cron] = self._cron_next(cron, now)
            if not _every_hour(cron) and _wall_clock(at, self.tz) == _wall_clock(due_at, self.tz):
                # The hour repeated when clocks went back: this time of day already ran.
                at = self._cron_next(cron, at)
        except Exception:  # croniter found no next time (cannot happen for a checked line)
            return None
        return at

    def _cron_next(self, cron: str, after: float) -> float:
        return cron_next(cron, after, self.tz)

    def _clock_set_back(self, now: float) -> None:
        """Interval schedules wait at most one interval from the clock's new time."""
        for schedule in self._by_id.values():
            interval = schedule.spec.interval
            if interval is not None and schedule.next_due > now + interval:
                schedule.next_due = now + interval
        self._rebuild()

    # -- the heap --------------------------------------------------------------------------------

    def _push(self, schedule: Schedule, when: float | None = None) -> None:
        if schedule._token:
            self._stale += 1  # its previous entry is still in the heap
        schedule._token = next(self._tokens)
        at = schedule.next_due if when is None else when
        heapq.heappush(self._heap, (at, schedule._token, schedule))

    def _forget(self, schedule: Schedule) -> None:
        del self._by_id[schedule.id]
        if schedule._token:
            schedule._token = 0
            self._stale += 1
            if self._stale > 1024 and self._stale > len(self._by_id):
                self._rebuild()

    def _rebuild(self) -> None:
        # Those out of the heap (token 0: the cluster's, waiting for an answer) stay out.
        self._heap = [(s.next_due, s._token, s) for s in self._by_id.values() if s._token]
        heapq.heapify(self._heap)
        self._stale = 0

    # -- status ----------------------------------------------------------------------------------

    def listing(self, now: float, limit: int | None = None) -> list[dict[str, Any]]:
        """The schedules, soonest first (at most ``limit``), as JSON-ready dicts."""
        schedules = self._by_id.values()
        if limit is None:
            chosen = sorted(schedules, key=_next_due)
        else:
            chosen = heapq.nsmallest(limit, schedules, key=_next_due)
        return [
            {
                "id": s.id,
                "queue": s.spec.queue.decode("utf-8", "replace"),
                **job_of(s.spec.body),
                "headers": s.spec.headers.decode("utf-8", "replace"),
                "interval": s.spec.interval,
                "cron": s.spec.cron,
                "next_run_in": round(max(0.0, s.next_due - now), 3),
                "runs": s.runs,
                "last_run": s.last_run,
                "created": s.created,
            }
            for s in chosen
        ]


def _next_due(schedule: Schedule) -> float:
    return schedule.next_due
