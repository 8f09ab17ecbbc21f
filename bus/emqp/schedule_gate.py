"""Which broker of a cluster fires a schedule's run, and when (``--store jetstream``),
sans-I/O: the key-value bucket's compare-and-set is the gate.

Every broker keeps the bucket's schedules in a :class:`ScheduleBook` that follows the
bucket (its watch, and this broker's own changes once the bucket took them: the book never
runs ahead of it). A schedule's row in the bucket is in one of two states:

- **stored** (``pending`` false): run ``runs`` is in the stream (or none ran yet); the next
  is due at ``next_due``.
- **pending**: run ``runs`` is fired and not yet known stored; ``next_due`` is its due time.

The steps, each a compare-and-set from the revision the broker knows:

1. *Fire*: a stored row whose time has come becomes "run N+1 pending". Every broker that
   sees it due asks; the bucket takes one change per revision, so exactly one broker wins.
   A refusal (another broker won, or the bucket cannot be reached) appends nothing: the
   watch brings the winner's row, or the broker asks again after a back-off.
2. *Append*: the winner appends run N+1 to the stream under :func:`run_msgid` (the
   schedule, its generation, the run number: alike at every broker, so the stream stores
   it once). Any other broker that still sees the row pending ``TAKEOVER`` seconds later
   appends it too (the winner may have died between its two steps). Each retries its
   append, one at a time, while the row stays pending.
3. *Stored*: the first broker whose append the stream acknowledges (stored, or a
   duplicate of one stored) at time ``s`` sets the row to "run N+1 stored, next due at the
   first time of its rhythm at least half an interval after ``s``" (cron: its next cron
   time after ``s``); after a schedule's last run (``run_count``) it deletes the key.

Why this holds whatever fails (brokers, links, the stream, the bucket, a stalled process):

- Run N is fired only from the row saying run N-1 is stored. So a schedule has at most one
  run fired and not stored, in the whole cluster: a stream that cannot store holds the
  schedule at that one run, and no backlog of runs exists to burst out when it is back.
  After any outage a schedule runs once, then in its rhythm.
- Each run number is one message id: appended by one broker or by all, it is stored once
  (within the stream's duplicate window: a run pending longer, or a broker stalled longer
  between its two steps, may be stored twice: at least once). A run the bucket says fired
  is appended until it is stored, by whichever broker is alive.
- Run N+1 is fired no sooner than its ``next_due``, which is at least half an interval
  after a broker heard the stream acknowledge run N, which is after the stream stored it:
  two runs of an interval schedule reach the stream at least half an interval apart
  (give or take the hosts' clock offsets), counted over every broker.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Final

from bus.emqp.schedules import Schedule, ScheduleBook, ScheduleError, ScheduleRow, schedule_id

#: Seconds a run may stay pending before the brokers that did not fire it append it too.
TAKEOVER: Final = 1.0
#: How many runs back a run the stream delivers is recognised as one of its schedule's.
RUNS_BACK: Final = 1000
#: A compare-and-set or an append refused or unanswered is asked again after this, doubled
#: each time up to ``RETRY_MOST``.
RETRY_FIRST: Final = 0.25
RETRY_MOST: Final = 2.0

# How a compare-and-set was answered.
TAKEN: Final = "taken"
#: The key was no longer at the revision given: another broker's change came first.
CONFLICT: Final = "conflict"
#: Refused otherwise, or unanswered: it may or may not have been taken.
FAILED: Final = "failed"

_RUNS = uuid.UUID("5c3b0e5e-7a0b-4d55-9a59-0e2b3c1f6e01")


def run_msgid(schedule_id: str, created: float, run: int) -> bytes:
    """The msgid of a schedule's run: the same at every broker. ``created`` tells a
    schedule scheduled anew apart from the one it replaced (its runs count from 1 again)."""
    return str(uuid.uuid5(_RUNS, f"{schedule_id}/{created!r}/{run}")).encode()


@dataclass(frozen=True, slots=True)
class PutRow:
    """Set a schedule's key to ``row`` (None: delete it) if it is still at ``expected``."""

    schedule_id: str
    row: ScheduleRow | None
    pending: bool
    expected: int
    #: Tells this put's answer from a later one's.
    token: int


@dataclass(frozen=True, slots=True)
class AppendRun:
    """Append run ``run`` of ``schedule`` to the stream under ``msgid``."""

    schedule: Schedule
    run: int
    msgid: bytes


@dataclass(frozen=True, slots=True)
class RunFired:
    """This broker won run ``run`` (``late``: seconds after its due time)."""

    schedule: Schedule
    run: int
    msgid: bytes
    late: float


@dataclass(frozen=True, slots=True)
class ScheduleFinished:
    """This broker deleted the key of a schedule that ran its ``run_count``."""

    schedule_id: str


Command = PutRow | AppendRun | RunFired | ScheduleFinished


@dataclass(slots=True)
class _Run:
    """What this broker does for one schedule now; kept only while it does something."""

    #: The schedule's generation (its ``created``): a schedule scheduled anew starts over.
    created: float
    #: The pending run this broker appends (0: none).
    number: int = 0
    msgid: bytes = b""
    #: This broker won ``number`` (else it takes it over after the grace).
    fired_here: bool = False
    #: An append is unanswered.
    appending: bool = False
    #: When the stream acknowledged this broker's append of ``number``.
    stored_at: float | None = None
    #: A compare-and-set unanswered.
    put: PutRow | None = None
    #: Nothing is asked before this (a back-off, the grace before a takeover, or the wait
    #: for the row that beat this broker's: until the book changes).
    retry_at: float = 0.0
    delay: float = RETRY_FIRST
    beaten: bool = False

    def back_off(self, now: float) -> None:
        self.retry_at = now + self.delay
        self.delay = min(self.delay * 2, RETRY_MOST)


class ScheduleGate:
    """The steps above for every schedule of ``book``: feed it the bucket's rows
    (:meth:`on_row`), the time (:meth:`tick`, at :attr:`next_due`) and the answers
    (:meth:`on_put`, :meth:`on_append`); carry out what :meth:`drain` gives."""

    def __init__(self, book: ScheduleBook, takeover: float = TAKEOVER) -> None:
        self.book = book
        self.takeover = takeover
        self._runs: dict[str, _Run] = {}
        self._out: list[Command] = []
        self._tokens = 0
        #: Fire steps this broker lost to another broker's.
        self.fires_lost = 0
        #: Runs this broker appended though another broker fired them (still pending after
        #: the grace: that broker died, or the stream was slow to take it).
        self.taken_over = 0
        #: The last run of each interval schedule this broker let run (its generation,
        #: number and when): see :meth:`missed`.
        self._let: dict[str, tuple[float, int, float]] = {}

    @property
    def next_due(self) -> float | None:
        """When the book's next schedule is due (None: none is kept)."""
        return self.book.next_due

    @property
    def unstored(self) -> int:
        """Pending runs this broker knows of and has not heard stored (at most one per
        schedule)."""
        return sum(1 for run in self._runs.values() if run.number and run.stored_at is None)

    def drain(self) -> list[Command]:
        """The commands for the bucket and the stream made since the last call, in order."""
        out, self._out = self._out, []
        return out

    # -- what comes in -----------------------------------------------------------------------

    def on_row(
        self,
        schedule_id: str,
        row: tuple[object, ...] | None,
        pending: bool,
        revision: int,
        now: float,
    ) -> bool:
        """The bucket holds ``row`` (None: no key) at ``revision``; True when the book
        changed. Raises :class:`bus.emqp.schedules.ScheduleError` for a row that holds no
        valid schedule."""
        schedule = self.book.get(schedule_id)
        if schedule is not None and schedule.revision >= revision:
            return False
        if row is None:
            self._runs.pop(schedule_id, None)
            self._let.pop(schedule_id, None)
            return self.book.remove(schedule_id)
        # In the heap at its next_due (a pending row's is past: woken at once).
        if self.book.put(row, revision, now, pending) is None:
            return False
        run = self._runs.get(schedule_id)
        if run is not None and run.beaten:
            run.beaten, run.retry_at = False, 0.0  # the change that beat it is here
        return True

    def tick(self, now: float) -> None:
        """Take the step each schedule due at ``now`` is at (fire, retry, take over)."""
        for schedule in self.book.wake(now):
            self._step(schedule, now)

    def on_put(self, schedule_id: str, token: int, outcome: str, revision: int, now: float) -> None:
        """A :class:`PutRow`'s answer: ``outcome`` :data:`TAKEN` (at ``revision``),
        :data:`CONFLICT` or :data:`FAILED`."""
        run = self._runs.get(schedule_id)
        if run is None or run.put is None or run.put.token != token:
            return
        put, run.put = run.put, None
        schedule = self.book.get(schedule_id)
        if schedule is None or schedule.created != run.created:
            del self._runs[schedule_id]  # removed or scheduled anew meanwhile: moot
            return
        if outcome == TAKEN:
            run.delay = RETRY_FIRST
            if put.row is None:
                del self._runs[schedule_id]
                self.book.remove(schedule_id)
                self._out.append(ScheduleFinished(schedule_id))
                return
            if put.pending:
                run.number, run.fired_here, run.stored_at = put.row.runs, True, None
                run.msgid = run_msgid(schedule_id, run.created, run.number)
                run.retry_at = now
                self._out.append(RunFired(schedule, run.number, run.msgid, now - put.row.next_due))
            else:
                del self._runs[schedule_id]  # stored: nothing left to do for it here
            if schedule.revision == put.expected:
                # The bucket went from the revision known here to this row: follow it now,
                # not when the watch brings it.
                self.book.put(put.row, revision, now, put.pending)
        elif outcome == CONFLICT:
            if put.pending:
                self.fires_lost += 1
            # The change that came first is on its way through the watch (asked again
            # after the grace only if it never comes).
            run.beaten, run.retry_at = True, now + self.takeover
        else:
            run.back_off(now)
        self._again(schedule_id, now)

    def on_append(self, schedule_id: str, msgid: bytes, stored: bool, now: float) -> None:
        """An :class:`AppendRun`'s answer: ``stored`` (or a duplicate of one stored), or
        not (refused, unanswered, or another broker's append of it in process)."""
        run = self._runs.get(schedule_id)
        if run is None or run.msgid != msgid or not run.appending:
            return
        run.appending = False
        if stored:
            run.stored_at = now
            run.delay = RETRY_FIRST
        else:
            run.back_off(now)
        self._again(schedule_id, now)

    def missed(self, body: bytes, msgid: bytes, now: float, stored_at: float | None = None) -> bool:
        """Whether a run the stream delivers now (its ``body`` and ``msgid``; ``stored_at``:
        when the stream stored it, from the delivery, if known) is a missed run, to be
        acknowledged without running: a later run of its schedule is fired already, or (an
        interval schedule) the next one is due within half an interval.
        The stream holds a stored run back while its queue's consumer has no leader (an
        election: seconds), and a run a dead broker held until ``ack_wait``; given out then,
        with the runs stored meanwhile, they would run in a burst, or the run moments before
        the next one. So after such an outage too, the schedule runs once (the latest run),
        then in its rhythm, and no two runs leave closer than half an interval.

        A run the book has not seen stored (its row pending here, or not here yet: the
        bucket's watch behind, its server just lost) is judged by ``stored_at`` as the row
        the storing broker wrote would judge it: its next run due at the first point of
        its rhythm half an interval after it was stored (the brokers' and servers' clocks
        taken as agreeing to well under half an interval). Without it, such a run runs.

        What the book cannot tell for a missed run is run: a client's request, a run of a
        schedule it does not know (removed, or after its ``run_count``), of one scheduled
        anew, or more than :data:`RUNS_BACK` runs old; the run under way while its row says
        it is pending, with no ``stored_at``; a run the bucket's watch has not brought here
        yet, likewise. Of those, a run
        of an interval schedule given out here less than half an interval after another
        run of it that this broker let run, or after a later one, is missed too: a book
        behind the bucket (its watch on a server just lost) let a held-back run and the
        next one run 5 ms apart (the nemesis test)."""
        try:
            schedule = self.book.get(schedule_id(body))
        except ScheduleError:
            return False
        if schedule is None:
            return False
        sid, created, latest = schedule.id, schedule.created, schedule.runs
        interval = schedule.spec.interval
        unseen = False  # a run the book has not seen stored: due at next_due
        if msgid == run_msgid(sid, created, latest + 1):
            number = latest + 1  # fired by another broker, its row not here yet
            unseen = not schedule.pending
        elif msgid == run_msgid(sid, created, latest):
            if not schedule.pending:
                if interval is not None and now > schedule.next_due - interval / 2:
                    return True
            else:
                unseen = True
            number = latest
        else:
            oldest = max(latest - RUNS_BACK, 1)
            return any(
                msgid == run_msgid(sid, created, run) for run in range(latest - 1, oldest - 1, -1)
            )
        if interval is None:
            return False
        if unseen and stored_at is not None:
            following = self.book.following(schedule.spec, schedule.next_due, stored_at)
            if following is not None and now > following - interval / 2:
                return True
        let = self._let.get(sid)
        if (
            let is not None
            and let[0] == created
            and (number < let[1] or (number > let[1] and now - let[2] < interval / 2))
        ):
            return True
        self._let[sid] = (created, number, now)
        return False

    # -- the steps ---------------------------------------------------------------------------

    def _again(self, schedule_id: str, now: float) -> None:
        schedule = self.book.get(schedule_id)
        if schedule is not None:
            self._step(schedule, now)
            return
        run = self._runs.get(schedule_id)
        if run is not None and run.put is None and not run.appending:
            del self._runs[schedule_id]  # unscheduled meanwhile

    def _step(self, schedule: Schedule, now: float) -> None:
        if schedule.revision == 0:
            return  # added here, not in the bucket yet: the watch brings its row
        run = self._runs.get(schedule.id)
        if run is not None and run.created != schedule.created:
            del self._runs[schedule.id]  # scheduled anew: what was under way is moot
            run = None
        if run is not None and (run.put is not None or run.appending):
            return  # its answer steps it again
        if schedule.pending:
            self._store(schedule, run, now)
        else:
            self._fire(schedule, run, now)

    def _fire(self, schedule: Schedule, run: _Run | None, now: float) -> None:
        """Run ``runs`` is stored: fire the next at its time."""
        if run is not None and run.retry_at <= now and run.delay == RETRY_FIRST:
            del self._runs[schedule.id]  # nothing under way, nothing failing
            run = None
        limit = schedule.spec.run_limit
        if limit is not None and schedule.runs >= limit:
            return  # ran its count; its key is being deleted
        at = schedule.next_due if run is None else max(schedule.next_due, run.retry_at)
        if now < at:
            self.book.wake_at(schedule, at)
            return
        if run is None:
            run = self._runs[schedule.id] = _Run(schedule.created)
        run.number, run.msgid, run.fired_here, run.stored_at = 0, b"", False, None
        row = schedule.to_row()._replace(runs=schedule.runs + 1, last_run=now)
        self._put(run, schedule, row, pending=True)

    def _store(self, schedule: Schedule, run: _Run | None, now: float) -> None:
        """Run ``runs`` is pending: append it until the stream has it, then say so."""
        number = schedule.runs
        if run is None or run.number != number:
            # Fired elsewhere (or here, its answer lost): appended here too if it is still
            # pending after the grace, in case its broker died before appending it.
            msgid = run_msgid(schedule.id, schedule.created, number)
            run = _Run(schedule.created, number, msgid, retry_at=now + self.takeover)
            self._runs[schedule.id] = run
        if run.stored_at is not None:
            limit = schedule.spec.run_limit
            following = self.book.following(schedule.spec, schedule.next_due, run.stored_at)
            if following is None or (limit is not None and number >= limit):
                self._put(run, schedule, None, pending=False)  # its last run: the key goes
                return
            row = schedule.to_row()._replace(next_due=following, last_run=run.stored_at)
            self._put(run, schedule, row, pending=False)
            return
        if now < run.retry_at:
            self.book.wake_at(schedule, run.retry_at)
            return
        if not run.fired_here and run.delay == RETRY_FIRST:
            self.taken_over += 1
        run.appending = True
        self._out.append(AppendRun(schedule, number, run.msgid))

    def _put(self, run: _Run, schedule: Schedule, row: ScheduleRow | None, pending: bool) -> None:
        self._tokens += 1
        run.put = PutRow(schedule.id, row, pending, schedule.revision, self._tokens)
        self._out.append(run.put)
