"""Schedules across brokers (--store jetstream), sans-I/O: brokers' cores
(:class:`bus.emqp.core.Broker` and its :class:`bus.emqp.schedule_gate.ScheduleGate`) on one
simulated clock, with a simulated key-value bucket (compare-and-set by revision, a watch to
every broker) and a simulated stream (a message id stored once). Faults: the stream or the
bucket stops answering, a broker is cut from both (its requests fail, answers on their way
are lost, the watch starts over when it is back), stalls (what comes for it waits), or dies
(another starts later).

Whatever happens: each run is stored once; two runs of an interval schedule reach the stream
at least half an interval apart; run N is fired only once run N-1 is stored; a run the bucket
says fired is stored once the stream is back and a broker is alive; after an outage the
schedule runs once, then in its rhythm."""

from __future__ import annotations

import heapq
import itertools
import math
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from twisted.logger import Logger

from bus.emqp import codec, schedule_gate
from bus.emqp.core import Broker, BrokerSettings
from bus.emqp.schedule_gate import TAKEOVER, AppendRun, PutRow, ScheduleGate, run_msgid
from bus.emqp.schedules import ScheduleBook, ScheduleSpec, cron_next

log = Logger(namespace="test.emqp.schedule_gate")
T0 = 1_700_000_000.0
#: How long a request to a server that does not answer waits.
TIMEOUT = 2.0


def every(seconds: float, name: str = "tick", headers: bytes = b"") -> ScheduleSpec:
    return ScheduleSpec(b"default", headers, seconds, None, f'["{name}"]'.encode())


def crontab(line: str, name: str = "cron") -> ScheduleSpec:
    return ScheduleSpec(b"default", b"", None, line, f'["{name}"]'.encode())


@dataclass(eq=False)
class Node:
    broker: Broker
    #: Its link to NATS is cut: requests fail, answers and changes for it are lost.
    cut: bool = False
    #: Stalled: what comes for it waits (in its socket) until it goes on.
    stalled: bool = False
    dead: bool = False
    held: list[Callable[[], None]] = field(default_factory=list)
    appends: int = 0


@dataclass(frozen=True)
class Run:
    schedule_id: str
    number: int
    msgid: bytes
    #: The due time it was fired for (the pending row's next_due).
    due: float


class Cluster:
    """Brokers, a bucket and a stream; time moves in :meth:`run_until`."""

    def __init__(
        self, brokers: int = 2, latency: tuple[float, float] = (0.001, 0.01), seed: int = 0
    ) -> None:
        self.now = T0
        self.rng = random.Random(seed)
        self.latency = latency
        self._events: list[tuple[float, int, Callable[[], None]]] = []
        self._order = itertools.count()
        #: The bucket: key -> (revision, row or None, pending).
        self.rows: dict[str, tuple[int, tuple[Any, ...] | None, bool]] = {}
        self.revision = 0
        self.bucket_up = True
        #: The stream: msgid -> when it was stored.
        self.stream: dict[bytes, float] = {}
        self.stream_up = True
        #: Every run the bucket took as fired, in order.
        self.fired: list[Run] = []
        self.nodes: list[Node] = []
        for _ in range(brokers):
            self.start()

    # -- the brokers ---------------------------------------------------------------------------

    def start(self) -> Node:
        name = b"b%d" % len(self.nodes)
        broker = Broker(BrokerSettings(), lambda: self.now, log, broker_id=name, streamed=True)
        assert broker.schedules is not None
        broker.schedules.tz = UTC
        node = Node(broker)
        self.nodes.append(node)
        self._watch(node)
        return node

    def _watch(self, node: Node) -> None:
        """The bucket's every key (the last of each), then its changes."""
        for key, (revision, row, pending) in list(self.rows.items()):
            self._tell(node, self._change(node, key, row, pending, revision))

    def _change(
        self, node: Node, key: str, row: tuple[Any, ...] | None, pending: bool, revision: int
    ) -> Callable[[], None]:
        return lambda: node.broker.on_schedule_change(key, row, pending, revision)

    def _later(self, delay: float, action: Callable[[], None]) -> None:
        heapq.heappush(self._events, (self.now + delay, next(self._order), action))

    def _lag(self) -> float:
        return self.rng.uniform(*self.latency)

    def _tell(
        self, node: Node, action: Callable[[], None], lost: Callable[[], None] | None = None
    ) -> None:
        """``action`` reaches ``node`` a moment later (``lost`` instead if its link is cut by
        then; nothing if it died)."""

        def arrive() -> None:
            if node.dead:
                return
            if node.cut:
                if lost is not None:
                    self._later(TIMEOUT, lambda: self._deliver(node, lost))
                return
            self._deliver(node, action)

        self._later(self._lag(), arrive)

    def _deliver(self, node: Node, action: Callable[[], None]) -> None:
        if node.dead:
            return
        if node.stalled:
            node.held.append(action)
            return
        action()
        self._pump(node)

    def _pump(self, node: Node) -> None:
        """What the broker asked of the stream and the bucket."""
        broker = node.broker
        while broker.to_stream:
            commands, broker.to_stream = broker.to_stream, []
            for what, value in commands:
                if what == "schedule-cas":
                    self._ask_bucket(node, value)
                elif what == "schedule-run":
                    self._ask_stream(node, *value)
                else:
                    raise AssertionError(f"unexpected {what}")

    def _ask_bucket(self, node: Node, put: PutRow) -> None:
        def answer(outcome: str, revision: int) -> Callable[[], None]:
            return lambda: node.broker.schedule_put_answered(
                put.schedule_id, put.token, outcome, revision
            )

        failed = answer(schedule_gate.FAILED, 0)
        if node.cut or not self.bucket_up:
            self._later(TIMEOUT, lambda: self._deliver(node, failed))
            return

        def apply() -> None:
            if not self.bucket_up:
                self._later(TIMEOUT, lambda: self._deliver(node, failed))
                return
            current = self.rows.get(put.schedule_id, (0, None, False))[0]
            if current != put.expected:
                self._tell(node, answer(schedule_gate.CONFLICT, 0), failed)
                return
            if put.pending:
                assert put.row is not None
                self._check_fire(put)
            revision = self._store_row(put.schedule_id, put.row, put.pending)
            self._tell(node, answer(schedule_gate.TAKEN, revision), failed)

        self._later(self._lag(), apply)

    def _check_fire(self, put: PutRow) -> None:
        """Run N is fired only from a row saying run N-1 is stored."""
        assert put.row is not None
        number, created = put.row.runs, put.row.created
        previous = run_msgid(put.schedule_id, created, number - 1)
        assert number == 1 or previous in self.stream, f"run {number} fired, {number - 1} unstored"
        self.fired.append(
            Run(
                put.schedule_id,
                number,
                run_msgid(put.schedule_id, created, number),
                put.row.next_due,
            )
        )

    def _store_row(self, key: str, row: tuple[Any, ...] | None, pending: bool) -> int:
        self.revision += 1
        self.rows[key] = (self.revision, row, pending)
        for node in self.nodes:
            if not node.dead and not node.cut:
                self._tell(node, self._change(node, key, row, pending, self.revision))
        return self.revision

    def _ask_stream(self, node: Node, schedule_id: str, job: Any) -> None:
        node.appends += 1

        def answer(stored: bool) -> Callable[[], None]:
            return lambda: node.broker.schedule_run_answered(schedule_id, job.msgid, stored)

        failed = answer(False)
        if node.cut or not self.stream_up:
            self._later(TIMEOUT, lambda: self._deliver(node, failed))
            return

        def apply() -> None:
            if not self.stream_up:
                self._later(TIMEOUT, lambda: self._deliver(node, failed))
                return
            self.stream.setdefault(job.msgid, self.now)  # a duplicate is stored no more
            self._tell(node, answer(True), failed)

        self._later(self._lag(), apply)

    # -- the world -----------------------------------------------------------------------------

    def schedule(self, spec: ScheduleSpec) -> str:
        """A SCHEDULE taken by some broker: its row put in the bucket."""
        book = ScheduleBook(tz=UTC)
        schedule, _ = book.add(spec, self.now)
        self._store_row(schedule.id, schedule.to_row(), False)
        return schedule.id

    def at(self, when: float, action: Callable[[], None]) -> None:
        heapq.heappush(self._events, (when, next(self._order), action))

    def cut(self, node: Node, cut: bool) -> None:
        node.cut = cut
        if not cut:
            self._watch(node)  # a watch made again: the bucket's keys as they are now

    def stall(self, node: Node, stalled: bool) -> None:
        node.stalled = stalled
        if not stalled:
            held, node.held = node.held, []
            for action in held:
                self._deliver(node, action)

    def kill(self, node: Node) -> None:
        node.dead = True

    def live(self) -> list[Node]:
        return [n for n in self.nodes if not n.dead and not n.stalled]

    def run_until(self, end: float) -> None:
        for _ in range(1_000_000):  # a broker that asks without end is a failure too
            times = [self._events[0][0]] if self._events else []
            for node in self.live():
                due = node.broker.next_schedule_due
                if due is not None:
                    times.append(max(due, self.now))
            if not times or min(times) > end:
                self.now = max(self.now, end)
                return
            self.now = max(self.now, min(times))
            while self._events and self._events[0][0] <= self.now:
                _, _, action = heapq.heappop(self._events)
                action()
            for node in self.live():
                due = node.broker.next_schedule_due
                if due is not None and due <= self.now:
                    node.broker.fire_schedules()
                    self._pump(node)
        raise AssertionError(f"runaway at {self.now - T0:.3f} s")

    # -- what happened -------------------------------------------------------------------------

    def runs(self, schedule_id: str) -> list[tuple[float, Run]]:
        """The runs the stream stored, by the time it stored them."""
        return sorted(
            (self.stream[run.msgid], run)
            for run in self.fired
            if run.schedule_id == schedule_id and run.msgid in self.stream
        )


def check(cluster: Cluster, schedule_id: str, interval: float | None) -> list[float]:
    """The rules for every schedule; returns when its runs were stored."""
    fired = [run for run in cluster.fired if run.schedule_id == schedule_id]
    numbers = [run.number for run in fired]
    assert numbers == sorted(set(numbers)), numbers  # each run number fired once
    stored = cluster.runs(schedule_id)
    times = [when for when, _ in stored]
    assert [run.number for _, run in stored] == numbers[: len(stored)]  # in order
    if interval is not None:
        gaps = [b - a for a, b in itertools.pairwise(times)]
        assert all(gap >= interval / 2 - 1e-6 for gap in gaps), gaps
    else:
        dues = [run.due for run in fired]
        assert len(set(dues)) == len(dues)  # one run per cron time
    return times


# -- the gate, case by case -----------------------------------------------------------------------


def test_two_brokers_fire_each_run_once_and_append_it_once() -> None:
    cluster = Cluster(brokers=2, seed=1)
    schedule = cluster.schedule(every(1))
    cluster.run_until(T0 + 30.5)
    times = check(cluster, schedule, 1.0)
    assert len(times) == 31  # at once, then every second
    assert all(abs(t - (T0 + n)) < 0.05 for n, t in enumerate(times))
    # Each run appended by its winner alone (the other broker had nothing to take over).
    assert sum(node.appends for node in cluster.nodes) == 31
    wins = [node.broker.schedules_fired for node in cluster.nodes]
    assert sum(wins) == 31
    books = [node.broker.schedules for node in cluster.nodes]
    assert all(book is not None and book.get(schedule).runs == 31 for book in books)  # type: ignore[union-attr]


def test_a_compare_and_set_lost_to_another_broker_appends_nothing() -> None:
    cluster = Cluster(brokers=2, latency=(0.01, 0.01))
    schedule = cluster.schedule(every(10, headers=b"nohaste"))
    first, second = cluster.nodes
    cluster.run_until(T0 + 10.5)
    # Both asked at 10 s; the bucket took the first broker's, refused the second's.
    assert [n.broker.schedules_fired for n in cluster.nodes] == [1, 0]
    assert second.broker.schedule_gate is not None
    assert second.broker.schedule_gate.fires_lost == 1
    assert (first.appends, second.appends) == (1, 0)
    assert len(cluster.stream) == 1
    check(cluster, schedule, 10.0)


@pytest.mark.parametrize("intervals", [3, 10])
@pytest.mark.parametrize("down", ["stream", "bucket", "both", "stall"])
def test_an_outage_of_n_intervals_gives_one_run_after_it(down: str, intervals: int) -> None:
    cluster = Cluster(brokers=1 if down == "stall" else 2, seed=intervals)
    schedule = cluster.schedule(every(1))
    start, end = T0 + 5.3, T0 + 5.3 + intervals

    def outage(on: bool) -> Callable[[], None]:
        def flip() -> None:
            if down in ("stream", "both"):
                cluster.stream_up = not on
            if down in ("bucket", "both"):
                cluster.bucket_up = not on
            if down == "stall":
                cluster.stall(cluster.nodes[0], on)

        return flip

    cluster.at(start, outage(True))
    cluster.at(end, outage(False))
    cluster.run_until(end + 10)
    times = check(cluster, schedule, 1.0)
    during = [t for t in times if start + 0.1 < t < end]
    assert during == []  # nothing stored while it could not be (the stall: none fired)
    after = [t for t in times if t >= end]
    # One run in the outage's wake (it waited for the stream at most the longest back-off),
    # then the rhythm: the points of T0's phase, the first at least half a second after it.
    assert after[0] < end + schedule_gate.RETRY_MOST + TIMEOUT + 0.1
    rhythm = after[1:]
    assert rhythm and all(abs(t - round(t - T0) - T0) < 0.05 for t in rhythm), rhythm
    assert [round(b - a) for a, b in itertools.pairwise(rhythm)] == [1] * (len(rhythm) - 1)
    assert all(run.msgid in cluster.stream for run in cluster.fired)  # none lost


def test_the_winner_dying_between_its_compare_and_set_and_its_append_loses_no_run() -> None:
    cluster = Cluster(brokers=2, latency=(0.01, 0.01))
    schedule = cluster.schedule(every(10, headers=b"nohaste"))
    first, second = cluster.nodes
    # The bucket takes the first broker's run at 10.01 s; it dies before hearing so.
    cluster.at(T0 + 10.015, lambda: cluster.kill(first))
    cluster.run_until(T0 + 10 + TAKEOVER / 2)
    assert len(cluster.fired) == 1 and cluster.stream == {}
    cluster.run_until(T0 + 35)
    times = check(cluster, schedule, 10.0)
    assert len(times) == 3  # 10 s (taken over), 20 s, 30 s
    assert T0 + 10 + TAKEOVER <= times[0] < T0 + 10 + TAKEOVER + 0.1
    assert second.broker.schedule_gate is not None
    assert second.broker.schedule_gate.taken_over == 1
    assert second.broker.schedules_fired == 2


def test_a_broker_cut_off_fires_nothing_and_runs_are_not_doubled_when_it_is_back() -> None:
    cluster = Cluster(brokers=3, seed=3)
    schedule = cluster.schedule(every(1))
    cut = cluster.nodes[2]
    cluster.at(T0 + 3.5, lambda: cluster.cut(cut, True))
    cluster.at(T0 + 15.5, lambda: cluster.cut(cut, False))
    cluster.run_until(T0 + 20.5)
    times = check(cluster, schedule, 1.0)
    assert len(times) == 21  # the two others went on as if nothing happened
    fired_while_cut = cut.broker.schedules_fired
    assert cut.broker.schedules is not None
    assert cut.broker.schedules.get(schedule).runs == 21  # type: ignore[union-attr]
    assert all(abs(t - T0 - n) < 0.1 for n, t in enumerate(times))
    assert fired_while_cut <= 4  # only before the cut and after it


def test_after_a_late_run_the_next_is_half_an_interval_later_at_least() -> None:
    cluster = Cluster(brokers=2, latency=(0.001, 0.001))
    schedule = cluster.schedule(every(10, headers=b"nohaste"))
    # The stream takes nothing from 9 s to 19.5 s: run 1 (due at 10 s) is stored at about
    # 19.5 s, and the point at 20 s would follow it 0.5 s later: it moves to 30 s.
    cluster.at(T0 + 9, lambda: setattr(cluster, "stream_up", False))
    cluster.at(T0 + 19.5, lambda: setattr(cluster, "stream_up", True))
    cluster.run_until(T0 + 41)
    times = check(cluster, schedule, 10.0)
    assert times[0] >= T0 + 19.5 and len(times) == 3
    assert [round(t - T0) for t in times[1:]] == [30, 40]


def test_cron_after_an_outage_runs_once_then_at_its_times() -> None:
    cluster = Cluster(brokers=2, seed=4)
    schedule = cluster.schedule(crontab("* * * * * */10"))
    cluster.at(T0 + 22, lambda: setattr(cluster, "stream_up", False))
    cluster.at(T0 + 57, lambda: setattr(cluster, "stream_up", True))
    cluster.run_until(T0 + 100)
    times = check(cluster, schedule, None)
    assert [t for t in times if T0 + 22.1 < t < T0 + 57] == []
    after = [t for t in times if t >= T0 + 57]
    assert after[0] < T0 + 60  # the one run for what the outage missed
    times_of_cron = [cron_next("* * * * * */10", T0 + 57, UTC) + 10 * n for n in range(5)]
    assert [round(t, 1) for t in after[1:]] == [
        round(t, 1) for t in times_of_cron[: len(after) - 1]
    ]
    assert len(after) == 5


def test_run_count_ends_the_schedule_everywhere() -> None:
    cluster = Cluster(brokers=2, seed=5)
    schedule = cluster.schedule(every(1, headers=b"run_count:3"))
    cluster.run_until(T0 + 10)
    assert len(check(cluster, schedule, 1.0)) == 3
    assert cluster.rows[schedule][1] is None  # the key deleted
    assert all(len(n.broker.schedules or []) == 0 for n in cluster.nodes)
    assert sum(n.broker.schedules_removed for n in cluster.nodes) == 1


def test_a_schedule_replaced_while_its_run_waits_for_the_stream_starts_over() -> None:
    cluster = Cluster(brokers=2, seed=6)
    schedule = cluster.schedule(every(1))
    cluster.at(T0 + 2.5, lambda: setattr(cluster, "stream_up", False))
    cluster.run_until(T0 + 5)
    assert cluster.rows[schedule][2] is True  # run 4 pending
    cluster.schedule(every(2))  # the same job, another interval: scheduled anew
    cluster.stream_up = True
    cluster.run_until(T0 + 12)
    runs = cluster.runs(schedule)
    old = [r for _, r in runs if r.number > 3 and r.due < T0 + 5]
    assert old == []  # the old schedule's waiting run was dropped with it
    created = [r for r in cluster.fired if r.due >= T0 + 5]
    assert [r.number for r in created][:3] == [1, 2, 3]


# -- the gate under any faults --------------------------------------------------------------------

fault = st.tuples(
    st.sampled_from(["stream", "bucket", "cut", "stall", "kill"]),
    st.integers(0, 2),  # which broker (cut, stall, kill)
    st.floats(2, 40),  # when it starts
    st.floats(0.1, 12),  # how long it lasts
)


@settings(max_examples=40, deadline=None)
@given(st.lists(fault, max_size=6), st.integers(0, 2**32 - 1))
def test_any_faults_store_each_run_once_half_an_interval_apart_and_lose_none(
    faults: list[tuple[str, int, float, float]], seed: int
) -> None:
    cluster = Cluster(brokers=3, latency=(0.001, 0.05), seed=seed)
    fast = cluster.schedule(every(1, "fast"))
    slow = cluster.schedule(every(2.5, "slow"))
    cron = cluster.schedule(crontab("* * * * * */3"))
    for kind, which, start, length in faults:
        node = cluster.nodes[which]
        if kind in ("stream", "bucket"):
            name = f"{kind}_up"
            cluster.at(T0 + start, lambda n=name: setattr(cluster, n, False))
            cluster.at(T0 + start + length, lambda n=name: setattr(cluster, n, True))
        elif kind == "cut":
            cluster.at(T0 + start, lambda n=node: cluster.cut(n, True))
            cluster.at(T0 + start + length, lambda n=node: cluster.cut(n, False))
        elif kind == "stall":
            cluster.at(T0 + start, lambda n=node: cluster.stall(n, True))
            cluster.at(T0 + start + length, lambda n=node: cluster.stall(n, False))
        else:
            cluster.at(T0 + start, lambda n=node: cluster.kill(n))
            cluster.at(T0 + start + length, cluster.start)
    quiet = T0 + 55  # every fault is over (the longest ends at 52 s)
    cluster.run_until(quiet + 15)
    for schedule, interval in ((fast, 1.0), (slow, 2.5)):
        times = check(cluster, schedule, interval)
        tail = [t for t in times if t > quiet + 5]
        assert len(tail) >= math.floor(10 / interval) - 1  # on in its rhythm again
    check(cluster, cron, None)
    # A run the bucket says fired is stored (at least once): the stream and brokers are back.
    assert all(run.msgid in cluster.stream for run in cluster.fired)


# -- one broker's gate, step by step ------------------------------------------------------------


def test_a_newer_pending_run_replaces_the_one_this_broker_appends() -> None:
    """At most one append per schedule: a run the bucket says fired after the one this
    broker appends (a schedule put again elsewhere, say) takes its place; the older one's
    answer changes nothing."""
    book = ScheduleBook(tz=UTC)
    gate = ScheduleGate(book)
    made, _ = ScheduleBook().add(every(1), T0)
    row = made.to_row()
    gate.on_row(made.id, row._replace(runs=1, last_run=T0), True, 5, T0)  # run 1, elsewhere
    gate.tick(T0)
    assert gate.drain() == []  # its broker appends it; this one waits the grace
    gate.tick(T0 + TAKEOVER)
    (first,) = gate.drain()
    assert isinstance(first, AppendRun) and first.run == 1
    newer = row._replace(runs=2, next_due=T0 + 1, last_run=T0 + 1.2)
    gate.on_row(made.id, newer, True, 7, T0 + 1.2)
    gate.on_append(made.id, first.msgid, False, T0 + 1.3)  # the old one's refusal: moot
    gate.tick(T0 + 1.3)
    assert gate.drain() == [] and gate.unstored == 1
    gate.tick(T0 + 1.3 + TAKEOVER)  # the grace from when this broker saw it
    (second,) = gate.drain()
    assert isinstance(second, AppendRun) and second.run == 2
    gate.on_append(made.id, second.msgid, True, T0 + 2.4)
    (stored,) = gate.drain()
    assert isinstance(stored, PutRow) and stored.expected == 7 and not stored.pending
    assert stored.row is not None and stored.row.runs == 2
    assert stored.row.next_due == T0 + 3  # the first point 0.5 s after 2.4 s


# -- the core's side ---------------------------------------------------------------------------


def test_a_schedule_taken_here_fires_once_the_bucket_is_known_to_hold_it() -> None:
    now = [T0]
    broker = Broker(BrokerSettings(), lambda: now[0], log, broker_id=b"A", streamed=True)
    broker.on_admin_message(b"admin", codec.schedule("default", b'["tick"]', b"", 5, None))
    ((what, (row, pending)),) = broker.to_stream
    assert what == "schedule-put" and pending is False and row.runs == 0
    broker.to_stream.clear()
    assert broker.fire_schedules() == 0 and broker.to_stream == []  # not known held yet
    broker.on_schedule_change(row.id, tuple(row), False, 7)
    broker.fire_schedules()
    ((what, put),) = broker.to_stream
    assert what == "schedule-cas" and put.expected == 7 and put.pending and put.row.runs == 1
