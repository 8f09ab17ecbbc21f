"""The broker's state machine: decoded messages and time in, frames out.

No sockets and no reactor here: :class:`Broker` takes each message with the ROUTER identity
it came from, updates its queues, workers and jobs, and appends what to send to three
outboxes (one per socket). The service sends them after committing the job store, so a
guaranteed request is on disk before any worker sees it. The clock is injected
(``twisted.internet.task.Clock().seconds`` in unit tests).

Routing. A worker INFORMs with weighted queues and then sends one READY per free slot. A
REQUEST goes to a worker of its queue with a free slot: the highest weight that worker gave
the queue, then the least recently used. With no free slot it waits in the queue's bounded
buffer (full: an error reply to the client). A READY takes the oldest waiting request of
the worker's heaviest queue that has one.

Beyond the original broker: every request is forwarded with ``reply-requested`` so the
broker learns when it ends; the worker's REPLY reaches the client when the client asked for
it; ``guarantee`` requests are stored until replied; a request whose worker dies, leaves or
exceeds ``timeout:N`` is re-dispatched while it has retries left (``retry-count:N``, or
``guarantee_retries`` for a guaranteed one), else the client gets an error reply.
"""

from __future__ import annotations

import heapq
import json
from collections import OrderedDict, deque
from collections.abc import Callable, Sequence
from dataclasses import MISSING, dataclass, field, fields, replace
from typing import Any, Final

from twisted.logger import Logger

from bus.emqp import codec, jobstream
from bus.emqp.codec import PROTOCOL, EmqpError, Headers
from bus.emqp.schedule_gate import AppendRun, PutRow, RunFired, ScheduleGate
from bus.emqp.schedules import Schedule, ScheduleBook, ScheduleSpec, job_of, unschedule_id
from bus.emqp.store import JobStore, StoredJob
from bus.extension import NO_ACTIVITY, ActivitySink
from bus.transport.names import peer_name
from bus.util.compiled import compiled
from bus.util.droplog import DropCounter
from bus.util.wakes import Wakes

_HEARTBEAT = codec.HEARTBEAT
_REQUEST = codec.REQUEST
_REPLY = codec.REPLY
_KBYE = codec.KBYE
_new_msgid = codec.new_msgid
_is_ready = codec.is_ready
_parse_job = codec.parse_job
_parse_other = codec.parse_other
_parse_routed = codec.parse_routed
_Ready = codec.Ready
_Request = codec.Request
_Reply = codec.Reply

Message = list[bytes]
#: Dispatch counts of queues and workers that are gone, kept for STATUS (eventmq's
#: ``processed_messages_by_*``) up to this many names each, the least recent dropped.
RETIRED_COUNTS = 10_000
#: The queues a peer's CURVE key may use (the ``queues`` of its certificate), or None: all.
Queues = frozenset[bytes] | None
EVERY_QUEUE: Queues = None
#: The timeouts are looked at every few tens of milliseconds: a look later than this past its
#: time is a stall, not a busy reactor's jitter, and none judges for this long after it.
EXPIRY_SETTLE: Final = 0.25


@dataclass(frozen=True, slots=True)
class BrokerSettings:
    """The broker's rules: heartbeats, the bounds of queues and memory, retries, and who keeps the
    schedules."""

    heartbeat_interval: float = 3.0
    heartbeat_liveness: int = 3
    #: Requests waiting per queue for a free worker slot; past it: an error reply.
    queue_limit: int = 10_000
    #: Queues known at once (each REQUEST may name a new one).
    max_queues: int = 1_000
    #: Re-dispatches of a guaranteed request without ``retry-count``.
    guarantee_retries: int = 5
    #: Requests given up on (timeout, dead worker) remembered to tell a late REPLY.
    late_memory: int = 100_000
    #: ``builtin``: the broker keeps SCHEDULEs (in its store) and fires them; ``external``:
    #: it forwards them to a connected eventmq scheduler peer, as the original router does.
    scheduler: str = "builtin"
    max_schedules: int = 100_000
    #: A new cron schedule runs at once, as eventmq's scheduler runs it (False: at its
    #: first cron time; ``--no-haste``). Interval schedules run at once either way.
    cron_haste: bool = True

    @property
    def worker_expiry(self) -> float:
        """Seconds of silence after which a worker is forgotten."""
        return self.heartbeat_interval * self.heartbeat_liveness


@dataclass(frozen=True, slots=True)
class HeldAnswer:
    """An answer waiting for the commit of what it tells of (``stored``), or behind one
    that does (an admin's STATUS after its SCHEDULE), and the outbox it goes to."""

    outbox: list[Message]
    message: Message
    stored: bool = True


@dataclass(slots=True, eq=False)
class Job:
    """A request the broker has taken: where it came from, where it waits or runs, what retries it
    has left."""

    msgid: bytes
    client: bytes
    queue: bytes
    headers: Headers
    body: bytes
    received: float
    retries_left: int
    stored: bool
    position: int = 0
    attempts: int = 0
    worker: bytes | None = None
    dispatched_at: float = 0.0
    #: The broker its client is connected to, when not this one (``--store jetstream``).
    origin: bytes = b""
    #: The stream delivery this broker holds it by (its ack subject), b"" for none.
    handle: bytes = b""


_native_open_ages = getattr(compiled("bus.emqp._jobscan", "BUS_NATIVE_EMQP"), "open_ages", None)
#: The slots (member descriptors) it reads.
_JOB_QUEUE, _JOB_RECEIVED = vars(Job)["queue"], vars(Job)["received"]


def open_ages(jobs: dict[bytes, Job], now: float) -> dict[bytes, list[Any]]:
    """The open requests ``jobs`` by queue: ``[count, sum of their ages, the oldest's age]``
    at ``now``. Compiled where built (``_jobscan.open_ages``: a STATUS of 40,000 open
    requests took 10-11 ms of the reactor, 1.3-2.5 ms with it), else the same here."""
    if _native_open_ages is not None:
        found: dict[bytes, list[Any]] | None = _native_open_ages(
            jobs, _JOB_QUEUE, _JOB_RECEIVED, now
        )
        if found is not None:
            return found
    ages: dict[bytes, list[Any]] = {}
    for job in jobs.values():
        age = now - job.received
        entry = ages.get(job.queue)
        if entry is None:
            ages[job.queue] = [1, age, age]
        else:
            entry[0] += 1
            entry[1] += age
            if age > entry[2]:
                entry[2] = age
    return ages


def job_maker() -> Callable[[bytes, bytes, bytes, Headers, bytes, float, int, bool], Job]:
    """What makes a request's :class:`Job` from the fields it gives (``msgid`` to
    ``stored``), the others at their defaults: compiled where built (``_jobscan.Maker``: the
    slots set as the dataclass's ``__init__`` sets them, ~3,500 instructions a request less
    than calling the class), else the class."""
    maker = getattr(compiled("bus.emqp._jobscan", "BUS_NATIVE_EMQP"), "Maker", None)
    every = fields(Job)
    plain = not hasattr(Job, "__post_init__") and all(
        each.init and each.default_factory is MISSING for each in every
    )
    if maker is None or not plain:
        return Job
    defaults = tuple(each.default for each in every if each.default is not MISSING)
    made: Callable[[bytes, bytes, bytes, Headers, bytes, float, int, bool], Job] = maker(
        Job, tuple(each.name for each in every), defaults
    )
    return made


_new_job = job_maker()


@dataclass(slots=True, eq=False)
class WorkerState:
    """A worker the broker knows: its queues, free slots and the jobs it runs."""

    identity: bytes
    #: (weight, queue) heaviest first.
    queues: tuple[tuple[int, bytes], ...]
    last_seen: float
    joined: float
    #: Its queues as its INFORM listed them (those its key may serve), for eventmq's
    #: ROUTER_SHOW_WORKERS.
    informed: tuple[tuple[int, str], ...] = ()
    free_slots: int = 0
    inflight: dict[bytes, Job] = field(default_factory=dict)
    dispatched: int = 0


@dataclass(slots=True, eq=False)
class QueueState:
    """A queue: the requests waiting for a slot and the workers serving it."""

    name: bytes
    waiting: deque[Job] = field(default_factory=deque)
    #: identity -> the weight that worker gave this queue, least recently used first.
    workers: dict[bytes, int] = field(default_factory=dict)
    dispatched: int = 0
    rejected: int = 0
    #: At least the heaviest weight among ``workers`` (the largest any worker gave it): a
    #: free worker of that weight ends :meth:`Broker._pick`'s look, no heavier one can follow.
    heaviest: int = 0


def _headers_of(raw: bytes) -> codec.Headers:
    """A stored request's headers (checked when it was taken: none if they no longer parse)."""
    try:
        return codec.parse_headers(raw)
    except EmqpError:
        return codec.NO_HEADERS


def _schedule_queue(command: codec.Schedule) -> bytes | None:
    try:
        return ScheduleSpec.from_frames(command.fields).queue
    except EmqpError:
        return None  # malformed: refused as such where it is parsed again


class Broker:
    """The broker's rules over its queues, workers, jobs and schedules: it takes each message with
    the identity it came from and the time, and leaves what to send in its outboxes (see the
    module's text). The service owns the sockets and commits ``store`` before sending."""

    def __init__(
        self,
        settings: BrokerSettings,
        clock: Callable[[], float],
        log: Logger,
        store: JobStore | None = None,
        activity: ActivitySink = NO_ACTIVITY,
        broker_id: bytes = b"",
        streamed: bool = False,
    ) -> None:
        self.settings = settings
        #: Guaranteed requests go to a JetStream stream shared by several brokers (see
        #: :mod:`bus.emqp.jobstream`): what the stream must do is in :attr:`to_stream`,
        #: what other brokers' clients must hear in :attr:`to_brokers`.
        self.streamed = streamed
        self.broker_id = broker_id
        self.to_stream: list[tuple[str, Any]] = []
        self.to_brokers: list[tuple[bytes, Message]] = []
        #: Answers to SCHEDULE/UNSCHEDULE waiting for the bucket, by schedule id.
        self.schedule_answers: dict[str, list[HeldAnswer]] = {}
        #: Guaranteed requests handed to the stream and not yet acknowledged by it.
        self.appending: dict[bytes, Job] = {}
        #: Other requests offered to the brokers that serve their queue, not yet taken.
        self.forwarding: dict[bytes, Job] = {}
        self.clock = clock
        self.log = log
        self.store = store
        self.activity = activity
        self._publishing = activity is not NO_ACTIVITY
        self.drops = DropCounter(log, "eMQP message", clock)
        self.to_workers: list[Message] = []
        self.to_clients: list[Message] = []
        self.to_admin: list[Message] = []
        self.workers: dict[bytes, WorkerState] = {}
        self.queues: dict[bytes, QueueState] = {}
        self.schedulers: dict[bytes, float] = {}
        self.schedules = (
            ScheduleBook(settings.max_schedules, cron_haste=settings.cron_haste)
            if settings.scheduler == "builtin"
            else None
        )
        #: In a cluster, which broker fires each run and when (the bucket decides).
        self.schedule_gate = (
            ScheduleGate(self.schedules) if streamed and self.schedules is not None else None
        )
        self._scheduler_turn = 0
        self.jobs: dict[bytes, Job] = {}
        #: Queues whose dispatch an operator paused: their requests wait until resumed.
        self.paused: set[bytes] = set()
        #: Requests an operator purged, and workers an operator made the broker forget.
        self.purged = 0
        self.workers_forgotten = 0
        #: Guaranteed requests accepted but not yet committed: nobody hears of them (no
        #: dispatch, no acknowledgement) until :meth:`release_stored` after the commit.
        self.unstored: list[Job] = []
        #: Answers to SCHEDULE and UNSCHEDULE whose change is not yet committed: they go out
        #: at :meth:`release_stored`, never before (an answered schedule survives kill -9).
        self.unstored_answers: list[HeldAnswer] = []
        self._deadlines: list[tuple[float, bytes, int]] = []
        self._given_up: OrderedDict[bytes, None] = OrderedDict()
        #: Strangers on the worker port told KBYE once, oldest first.
        self._told_to_leave: OrderedDict[bytes, None] = OrderedDict()
        #: Dispatches of queues and workers no longer known (name -> count).
        self._retired_queues: dict[str, int] = {}
        self._retired_workers: dict[str, int] = {}
        # Counters, kept as work happens.
        self.requests = 0
        self.dispatched = 0
        self.replied = 0
        self.forwarded_replies = 0
        self.retried = 0
        self.failed = 0
        self.rejected = 0
        self.timed_out = 0
        self.late_replies = 0
        #: Whether a heartbeat round may forget the silent (not the first after a stall).
        self.wakes = Wakes(settings.heartbeat_interval, clock)
        #: Whether a look at the requests' timeouts may give up on one (not the first after
        #: a stall: a REPLY may wait unread). Its period is the server's timeout check's.
        self.expiry_wakes = Wakes(0.05, clock, slack=EXPIRY_SETTLE, settle=EXPIRY_SETTLE)
        self.workers_joined = 0
        self.workers_lost = 0
        self.schedules_forwarded = 0
        self.schedules_added = 0
        self.schedules_removed = 0
        self.schedules_fired = 0
        #: Runs the stream delivered past their time, acknowledged without running (in a
        #: cluster: :meth:`bus.emqp.schedule_gate.ScheduleGate.missed`).
        self.schedule_runs_missed = 0
        self.restored = 0
        self.refused_unstored = 0
        self.appended = 0
        self.stream_deliveries = 0
        self.released = 0
        self.answers_to_brokers = 0
        self.answers_from_brokers = 0
        self.forwarded_requests = 0
        self.offers_taken = 0

    # -- input -----------------------------------------------------------------------------------

    def on_worker_messages(self, batch: list[Message]) -> None:
        """A batch of workers' messages as read (each its ROUTER identity first), one clock
        reading for all: what :meth:`on_worker_message` does with each, a known worker's READY
        and REPLY (two a job) handled here without that call and a copy of its frames each."""
        workers, queues = self.workers, self.queues
        now = self.clock()
        feed, on_reply, dispatch = self._feed, self._on_reply, self._dispatch
        for message in batch:
            command = _parse_routed(message)
            kind = type(command)
            if kind is _Ready:
                worker = workers.get(message[0])
                if worker is not None:
                    worker.last_seen = now
                    worker.free_slots += 1
                    if len(worker.queues) != 1:
                        feed(worker, now)
                        continue
                    # _feed's usual worker (one queue), not a call to it: one call a job
                    # fewer (bench/emqp_instructions.py).
                    weight, name = worker.queues[0]
                    queue = queues.get(name)
                    if queue is None or not queue.waiting or name in self.paused:
                        continue
                    waiting, order, identity = queue.waiting, queue.workers, worker.identity
                    while worker.free_slots > 0 and waiting:
                        if order.pop(identity, None) is not None:
                            order[identity] = weight
                        dispatch(waiting.popleft(), worker, queue, now)
                    continue
            elif kind is _Reply:
                worker = workers.get(message[0])
                if worker is not None:
                    worker.last_seen = now
                    on_reply(worker, command, now)  # type: ignore[arg-type]
                    continue
            self.on_worker_message(message[0], message[1:])

    def on_client_messages(self, batch: list[Message]) -> None:
        """A batch of clients' messages as read (each its ROUTER identity first), one clock
        reading for all: what :meth:`on_client_message` does with each, a REQUEST handled
        here without that call and a copy of its frames each."""
        now = self.clock()
        on_request = self._on_request
        for message in batch:
            command = _parse_routed(message)
            if type(command) is _Request:
                on_request(message[0], command, now)
            else:
                self.on_client_message(message[0], message[1:])

    def on_worker_message(
        self, identity: bytes, frames: Message, queues: Queues = EVERY_QUEUE
    ) -> None:
        """A worker's message; ``queues``: the queues its CURVE key may serve (None: all)."""
        if _is_ready(frames):  # one a job: told apart without a command built
            worker = self.workers.get(identity)
            if worker is not None:
                now = self.clock()
                worker.last_seen = now
                worker.free_slots += 1
                self._feed(worker, now)
                return
        command = _parse_job(frames)  # codec.parse, one call fewer on a job's path
        if command is None:
            try:
                command = _parse_other(frames)
            except EmqpError as error:
                self.drops.drop(error.reason, str(error), identity)
                return
        worker = self.workers.get(identity)
        now = self.clock()
        if worker is None:
            if isinstance(command, codec.Inform):
                self._told_to_leave.pop(identity, None)
                self._inform_worker(identity, command, now, queues)
            else:
                self.drops.drop("not-informed", "a worker that never sent INFORM", identity)
                self._tell_stranger_to_leave(identity, command)
            return
        worker.last_seen = now
        if isinstance(command, codec.Ready):
            worker.free_slots += 1
            self._feed(worker, now)
        elif isinstance(command, codec.Reply):
            self._on_reply(worker, command, now)
        elif isinstance(command, codec.Heartbeat):
            pass
        elif isinstance(command, (codec.Kbye, codec.Disconnect)):
            self._forget_worker(identity, "worker-left")
        elif isinstance(command, codec.Inform):
            # A worker that reconnected: what it ran before is lost to us.
            self._forget_worker(identity, "worker-lost")
            self._inform_worker(identity, command, now, queues)
        else:
            self.drops.drop(
                "unexpected-command", f"{type(command).__name__} from a worker", identity
            )

    def on_client_message(
        self, identity: bytes, frames: Message, queues: Queues = EVERY_QUEUE
    ) -> None:
        """A client's message; ``queues``: the queues its CURVE key may use (None: all)."""
        command = _parse_job(frames)  # codec.parse, one call fewer on a job's path
        if command is None:
            try:
                command = _parse_other(frames)
            except EmqpError as error:
                self._refuse_malformed(identity, frames, error, self.to_clients)
                return
        if isinstance(command, codec.Request):
            if queues is not None and command.queue not in queues:
                self._forbidden(identity, command.msgid, command.queue)
                return
            self._on_request(identity, command, self.clock())
            return
        if identity in self.schedulers:
            self.schedulers[identity] = self.clock()
        if isinstance(command, codec.Schedule):
            self._on_schedule(identity, command, self.to_clients, queues)
        elif isinstance(command, codec.Inform):
            self._inform_scheduler(identity, command)
        elif identity in self.schedulers and isinstance(command, codec.Heartbeat):
            pass
        elif identity in self.schedulers and (isinstance(command, (codec.Kbye, codec.Disconnect))):
            del self.schedulers[identity]
            self._publish("/emqp/scheduler/left/", {"scheduler": peer_name(identity)})
        else:
            self.drops.drop(
                "unexpected-command", f"{type(command).__name__} from a client", identity
            )

    def on_admin_message(
        self, identity: bytes, frames: Message, queues: Queues = EVERY_QUEUE
    ) -> None:
        """An admin's message; ``queues``: the queues its CURVE key may schedule (None: all)."""
        try:
            command = codec.parse(frames)
        except EmqpError as error:
            self._refuse_malformed(identity, frames, error, self.to_admin)
            return
        if type(command) is codec.Status:
            self._answer(identity, command.msgid, self.status(), self.to_admin)
        elif type(command) is codec.Schedule:
            self._on_schedule(identity, command, self.to_admin, queues)
        elif type(command) is codec.Schedules:
            listing = self.schedules.listing(self.clock()) if self.schedules is not None else []
            self._answer(identity, command.msgid, {"value": listing}, self.to_admin)
        elif type(command) is codec.ShowWorkers:
            self._answer_as_eventmq(identity, self.workers_as_eventmq())
        elif type(command) is codec.ShowSchedulers:
            schedulers = {peer_name(s): {"hb": seen} for s, seen in self.schedulers.items()}
            self._answer_as_eventmq(identity, {"connected_schedulers": schedulers})
        elif type(command) is codec.Hello:
            pass  # emq-cli's greeting: eventmq's router is silent, and emq-cli reads no answer
        else:
            name = type(command).__name__
            self.drops.drop("unexpected-command", f"{name} on the admin port", identity)

    # -- workers ---------------------------------------------------------------------------------

    def _inform_worker(
        self, identity: bytes, inform: codec.Inform, now: float, allowed: Queues = EVERY_QUEUE
    ) -> None:
        if inform.peer_type != codec.WORKER:
            self.drops.drop("bad-peer", "a scheduler INFORM on the worker port", identity)
            return
        queues = tuple(
            sorted(((w, n.encode("utf-8")) for w, n in inform.queues), key=lambda q: -q[0])
        )
        if allowed is not None:
            # Served for the queues its key allows; the others are refused, counted.
            permitted = tuple(q for q in queues if q[1] in allowed)
            if len(permitted) < len(queues):
                names = b",".join(q[1] for q in queues if q[1] not in allowed)
                self.drops.drop("forbidden-queue", f"worker may not serve {names!r}", identity)
            if not permitted:
                return
            queues = permitted
        served = {name for _, name in queues}
        informed = tuple(q for q in inform.queues if q[1].encode("utf-8") in served)
        worker = WorkerState(identity, queues, last_seen=now, joined=now, informed=informed)
        self.workers[identity] = worker
        for weight, name in queues:
            queue = self._queue(name, force=True)
            assert queue is not None
            queue.workers[identity] = weight
            if weight > queue.heaviest:
                queue.heaviest = weight
        self.workers_joined += 1
        self.to_workers.append([identity, *codec.ack(inform.msgid)])
        # The original job manager starts its workers at the broker's first HEARTBEAT.
        self.to_workers.append([identity, *codec.heartbeat(now)])
        self._publish(
            "/emqp/worker/joined/",
            {"worker": peer_name(identity), "queues": [[w, n] for w, n in inform.queues]},
        )

    def _tell_stranger_to_leave(self, identity: bytes, command: codec.Command) -> None:
        """KBYE once to a worker the broker does not know (one it forgot, or one of a broker
        before a restart), then silence until it INFORMs. Our worker INFORMs again at the
        KBYE; eventmq's job manager ignores KBYE, counts any message as a heartbeat and
        INFORMs again only after about 15 s in which nothing arrived: an answer to each of
        its heartbeats would keep it away for ever."""
        if isinstance(command, (codec.Kbye, codec.Disconnect)):
            return
        told = self._told_to_leave
        if identity in told:
            return
        told[identity] = None
        if len(told) > self.settings.late_memory:
            told.popitem(last=False)
        self.to_workers.append([identity, b"", PROTOCOL, _KBYE, _new_msgid()])

    def _forget_worker(self, identity: bytes, reason: str) -> None:
        worker = self.workers.pop(identity, None)
        if worker is None:
            return
        _retire(self._retired_workers, peer_name(identity), worker.dispatched)
        for _, name in worker.queues:
            queue = self.queues.get(name)
            if queue is not None:
                queue.workers.pop(identity, None)
                self._drop_queue_if_idle(queue)
        if reason != "worker-left":
            self.workers_lost += 1
        self._publish(
            "/emqp/worker/left/",
            {"worker": peer_name(identity), "reason": reason, "in_flight": len(worker.inflight)},
        )
        for job in list(worker.inflight.values()):
            self._remember_given_up(job.msgid)
            self._retry_or_fail(job, reason)
        if self.streamed:
            for _, name in worker.queues:
                queue = self.queues.get(name)
                if queue is not None:
                    self._release_unserved(queue)

    def worker_unreachable(self, identity: bytes) -> None:
        """The service could not send to this worker (gone, or its pipe is full)."""
        self._forget_worker(identity, "worker-lost")

    def heartbeat(self) -> None:
        """Send HEARTBEAT to every worker and scheduler; forget those silent too long, but not
        in a round that comes late: the broker did not run, and what they sent meanwhile may
        wait unread (:mod:`bus.util.wakes`); the first round after its settling time judges."""
        now = self.clock()
        expiry = self.settings.worker_expiry
        judging = self.wakes.judging()
        beat = repr(now).encode()
        for identity, worker in list(self.workers.items()):
            if judging and now - worker.last_seen > expiry:
                self.log.warn(
                    "worker {worker} silent for {silent:.1f}s: forgotten, {jobs} in flight",
                    worker=peer_name(identity),
                    silent=now - worker.last_seen,
                    jobs=len(worker.inflight),
                )
                self._forget_worker(identity, "worker-lost")
            else:
                self.to_workers.append([identity, b"", PROTOCOL, _HEARTBEAT, _new_msgid(), beat])
        for identity, seen in list(self.schedulers.items()):
            if judging and now - seen > expiry:
                del self.schedulers[identity]
                self._publish("/emqp/scheduler/left/", {"scheduler": peer_name(identity)})
            else:
                self.to_clients.append([identity, b"", PROTOCOL, _HEARTBEAT, _new_msgid(), beat])
        if self.streamed:
            self._offer_waiting()

    def shutdown(self) -> None:
        """KBYE to every worker and scheduler (the broker is stopping)."""
        for identity in self.workers:
            self.to_workers.append([identity, *codec.kbye()])
        for identity in self.schedulers:
            self.to_clients.append([identity, *codec.kbye()])

    # -- schedulers ------------------------------------------------------------------------------

    def _inform_scheduler(self, identity: bytes, inform: codec.Inform) -> None:
        if inform.peer_type != codec.SCHEDULER:
            self.drops.drop("bad-peer", "a worker INFORM on the client port", identity)
            return
        new = identity not in self.schedulers
        self.schedulers[identity] = self.clock()
        self.to_clients.append([identity, *codec.ack(inform.msgid)])
        self.to_clients.append([identity, *codec.heartbeat(self.clock())])
        if new:
            self._publish("/emqp/scheduler/joined/", {"scheduler": peer_name(identity)})

    # -- schedules ---------------------------------------------------------------------------------

    def _answer(self, origin: bytes, msgid: bytes, value: Any, outbox: list[Message]) -> None:
        """A 6-frame REPLY carrying ``value`` as JSON, answering the request ``msgid``;
        behind the answers of that outbox that wait for a commit, in order."""
        result = json.dumps(value, sort_keys=True).encode()
        self._in_order([origin, b"", PROTOCOL, _REPLY, _new_msgid(), result, msgid], outbox)

    def _answer_as_eventmq(self, origin: bytes, value: Any) -> None:
        """eventmq's router's admin answer: a 5-frame REPLY whose last frame is the JSON
        (emq-cli reads frame 4); it names no request."""
        body = json.dumps(value).encode()
        self._in_order([origin, b"", PROTOCOL, _REPLY, _new_msgid(), body], self.to_admin)

    def workers_as_eventmq(self) -> dict[str, Any]:
        """ROUTER_SHOW_WORKERS as eventmq's router answers it: each worker's queues as it
        INFORMed them, when it was last heard (``hb``: this broker's clock, where eventmq
        gave its own monotonic clock) and its free slots; each queue's workers, heaviest
        first, then least recently used."""
        workers = {
            peer_name(identity): {
                "queues": [[w, n] for w, n in worker.informed],
                "hb": worker.last_seen,
                "available_slots": worker.free_slots,
            }
            for identity, worker in self.workers.items()
        }
        queues = {
            name.decode("utf-8", "replace"): [
                [weight, peer_name(identity)]
                for identity, weight in sorted(queue.workers.items(), key=lambda w: -w[1])
            ]
            for name, queue in self.queues.items()
            if queue.workers
        }
        return {"connected_workers": workers, "connected_queues": queues}

    def _in_order(self, message: Message, outbox: list[Message]) -> None:
        """Into ``outbox``, or behind its answers that wait for a commit."""
        if any(held.outbox is outbox for held in self.unstored_answers):
            self.unstored_answers.append(HeldAnswer(outbox, message, stored=False))
        else:
            outbox.append(message)

    def _refuse_malformed(
        self, origin: bytes, frames: Message, error: EmqpError, outbox: list[Message]
    ) -> None:
        """Dropped and counted under the codec's reason; a SCHEDULE or UNSCHEDULE whose id
        can be read is also answered ``bad-schedule``, as one the book refuses is: its
        client waits for an answer."""
        self.drops.drop(error.reason, str(error), origin)
        msgid = codec.refused_schedule_msgid(frames)
        if msgid is not None:
            self._refuse_schedule(origin, msgid, "bad-schedule", str(error), outbox)

    def _refuse_schedule(
        self, origin: bytes, msgid: bytes, reason: str, text: str, outbox: list[Message]
    ) -> None:
        result = codec.error_result(reason, text)
        self._in_order([origin, b"", PROTOCOL, _REPLY, _new_msgid(), result, msgid], outbox)

    def _on_schedule(
        self,
        origin: bytes,
        command: codec.Schedule,
        answer: list[Message],
        allowed: Queues = EVERY_QUEUE,
    ) -> None:
        if allowed is not None and command.command != codec.UNSCHEDULE:
            queue = _schedule_queue(command)
            if queue is not None and queue not in allowed:
                self._forbidden(origin, command.msgid, queue, answer)
                return
        book = self.schedules
        if book is None:
            self._forward_schedule(origin, command, answer)
            return
        now = self.clock()
        try:
            if command.command == codec.UNSCHEDULE:
                schedule_id = command.schedule_id or unschedule_id(command.fields)
                removed = book.remove(schedule_id)
                if removed:
                    self._schedule_gone(schedule_id, "unscheduled")
                value = {"schedule": schedule_id, "removed": removed}
                if self.streamed:
                    self.to_stream.append(("schedule-delete", schedule_id))
            else:
                spec = ScheduleSpec.from_frames(command.fields)
                schedule, replaced = book.add(spec, now)
                self.schedules_added += 1
                if self.streamed:
                    self.to_stream.append(("schedule-put", (schedule.to_row(), schedule.pending)))
                elif self.store is not None:
                    self.store.put_schedule(schedule.to_row())
                value = {
                    "schedule": schedule.id,
                    "replaced": replaced,
                    "next_run_in": round(schedule.next_due - now, 3),
                }
                self._publish("/emqp/schedule/added/", self._described(schedule, now))
        except EmqpError as error:
            self.drops.drop(error.reason, str(error), origin)
            self._refuse_schedule(origin, command.msgid, error.reason, str(error), answer)
            return
        if self.streamed:
            # Answered once the cluster's bucket holds the change (schedule_kept).
            result = json.dumps({"value": value}, sort_keys=True).encode()
            message = [origin, b"", PROTOCOL, _REPLY, _new_msgid(), result, command.msgid]
            self.schedule_answers.setdefault(str(value["schedule"]), []).append(
                HeldAnswer(answer, message)
            )
            return
        self._answer_once_stored(origin, command.msgid, {"value": value}, answer)

    def schedule_kept(self, schedule_id: str, revision: int, error: str | None = None) -> None:
        """The bucket took a schedule's change (its new ``revision``), or refused it:
        the answers that waited go out. The book learns the row from the watch (a row
        added here fires only once the bucket is known to hold it)."""
        for held in self.schedule_answers.pop(schedule_id, []):
            if error is None:
                held.outbox.append(held.message)
            else:
                origin, msgid = held.message[0], held.message[-1]
                result = codec.error_result("storage-error", error)
                held.outbox.append([origin, b"", PROTOCOL, _REPLY, _new_msgid(), result, msgid])

    def on_schedule_change(
        self, schedule_id: str, row: tuple[Any, ...] | None, pending: bool, revision: int
    ) -> None:
        """What the cluster's bucket says of a schedule now (a put, a run fired or
        stored anywhere, a removal): the book follows it."""
        gate = self.schedule_gate
        if gate is None:
            return
        try:
            changed = gate.on_row(schedule_id, row, pending, revision, self.clock())
        except EmqpError as error:
            self.log.error("a schedule in the bucket is not loaded: {error}", error=str(error))
            return
        if changed and row is None:
            self._publish("/emqp/schedule/removed/", {"schedule": schedule_id, "reason": "cluster"})

    def schedule_put_answered(
        self, schedule_id: str, token: int, outcome: str, revision: int
    ) -> None:
        """The bucket's answer to a compare-and-set the gate asked for."""
        if self.schedule_gate is not None:
            self.schedule_gate.on_put(schedule_id, token, outcome, revision, self.clock())
            self._carry_out_gate()

    def schedule_run_answered(self, schedule_id: str, msgid: bytes, stored: bool) -> None:
        """The stream's answer to a schedule run's append."""
        if self.schedule_gate is not None:
            self.schedule_gate.on_append(schedule_id, msgid, stored, self.clock())
            self._carry_out_gate()

    def _answer_once_stored(
        self, origin: bytes, msgid: bytes, value: Any, outbox: list[Message]
    ) -> None:
        """Answer now if the store has nothing pending, else after the commit that stores
        what this answer tells of."""
        if self.store is None or not self.store.dirty:
            self._answer(origin, msgid, value, outbox)
            return
        result = json.dumps(value, sort_keys=True).encode()
        message = [origin, b"", PROTOCOL, _REPLY, _new_msgid(), result, msgid]
        self.unstored_answers.append(HeldAnswer(outbox, message))

    @property
    def awaiting_commit(self) -> bool:
        """Something accepted is told to nobody until the store commits it."""
        return bool(self.unstored or self.unstored_answers)

    def _schedule_gone(self, schedule_id: str, reason: str) -> None:
        self.schedules_removed += 1
        if self.store is not None:
            self.store.remove_schedule(schedule_id)
        self._publish("/emqp/schedule/removed/", {"schedule": schedule_id, "reason": reason})

    @staticmethod
    def _described(schedule: Schedule, now: float) -> dict[str, Any]:
        spec = schedule.spec
        return {
            "schedule": schedule.id,
            "queue": spec.queue.decode("utf-8", "replace"),
            **job_of(spec.body),
            "interval": spec.interval,
            "cron": spec.cron,
            "next_run_in": round(schedule.next_due - now, 3),
            "runs": schedule.runs,
        }

    @property
    def next_schedule_due(self) -> float | None:
        """When the next schedule fires (None: none is kept here)."""
        return self.schedules.next_due if self.schedules is not None else None

    def fire_schedules(self) -> int:
        """Every schedule due now becomes a request on its queue (guaranteed when its
        headers say so), as if a client had sent it; its run is stored. In a cluster the
        gate decides (:mod:`bus.emqp.schedule_gate`): the runs this broker won."""
        book = self.schedules
        if book is None:
            return 0
        now = self.clock()
        if self.schedule_gate is not None:
            self.schedule_gate.tick(now)
            return self._carry_out_gate()
        due = book.due(now)
        store = self.store
        for schedule in due:
            spec = schedule.spec
            self.schedules_fired += 1
            headers = _headers_of(spec.headers)
            msgid = _new_msgid()
            if store is not None:
                if schedule.finished:
                    store.remove_schedule(schedule.id)
                else:
                    store.put_schedule(schedule.to_row())
            if self._publishing:
                self._publish(
                    "/emqp/schedule/fired/",
                    {"schedule": schedule.id, "msgid": peer_name(msgid), "run": schedule.runs},
                )
            if schedule.finished:
                self._schedule_gone(schedule.id, "run-count")
            self._on_request(b"", codec.Request(msgid, spec.queue, headers, spec.body), now)
        return len(due)

    def _carry_out_gate(self) -> int:
        """What the gate asked for goes to the stream; returns the runs this broker won."""
        assert self.schedule_gate is not None
        fired = 0
        for command in self.schedule_gate.drain():
            if isinstance(command, PutRow):
                self.to_stream.append(("schedule-cas", command))
            elif isinstance(command, AppendRun):
                self.to_stream.append(
                    ("schedule-run", (command.schedule.id, self._run_job(command)))
                )
            elif isinstance(command, RunFired):
                fired += 1
                self.schedules_fired += 1
                if self.schedules is not None:
                    self.schedules.lateness.append(command.late)
                if self._publishing:
                    self._publish(
                        "/emqp/schedule/fired/",
                        {
                            "schedule": command.schedule.id,
                            "msgid": peer_name(command.msgid),
                            "run": command.run,
                        },
                    )
            else:
                self._schedule_gone(command.schedule_id, "run-count")
        return fired

    def _run_job(self, command: AppendRun) -> Job:
        """A run as a request for the stream; every broker that appends it makes the same
        msgid (the stream keeps the first)."""
        spec = command.schedule.spec
        headers = _headers_of(spec.headers)
        retries = headers.retry_count
        if retries is None:
            retries = self.settings.guarantee_retries if headers.guarantee else 0
        return Job(command.msgid, b"", spec.queue, headers, spec.body, self.clock(), retries, False)

    def restore_schedules(self) -> int:
        """Load the stored schedules (after a restart): each that missed runs while the
        broker was down runs once at the next :meth:`fire_schedules`."""
        if self.schedules is None or self.store is None or self.streamed:
            return 0  # in a cluster, the bucket's watch brings them
        errors = self.schedules.restore(self.store.load_schedules(), self.clock())
        for error in errors:
            self.log.error("a stored schedule is not loaded: {error}", error=str(error))
        return len(self.schedules)

    def _forward_schedule(
        self, origin: bytes, command: codec.Schedule, answer: list[Message]
    ) -> None:
        """SCHEDULE goes to one scheduler (in turn), UNSCHEDULE to all, as the original does."""
        if not self.schedulers:
            self.rejected += 1
            result = codec.error_result("no-scheduler", "no scheduler is connected")
            answer.append([origin, b"", PROTOCOL, _REPLY, _new_msgid(), result, command.msgid])
            return
        frames = [b"", PROTOCOL, command.command, command.msgid, *command.fields]
        targets = list(self.schedulers)
        if command.command == codec.SCHEDULE:
            self._scheduler_turn = (self._scheduler_turn + 1) % len(targets)
            targets = [targets[self._scheduler_turn]]
        for target in targets:
            self.to_clients.append([target, *frames])
        self.schedules_forwarded += 1

    # -- requests --------------------------------------------------------------------------------

    def _queue(self, name: bytes, force: bool = False) -> QueueState | None:
        queue = self.queues.get(name)
        if queue is None:
            if not force and len(self.queues) >= self.settings.max_queues:
                return None
            queue = self.queues[name] = QueueState(name)
        return queue

    def _drop_queue_if_idle(self, queue: QueueState) -> None:
        if not queue.waiting and not queue.workers:
            self.queues.pop(queue.name, None)
            _retire(self._retired_queues, _text(queue.name), queue.dispatched)

    def _forbidden(
        self, client: bytes, msgid: bytes, queue: bytes, answer: list[Message] | None = None
    ) -> None:
        """A request or schedule for a queue the client's key may not use: refused, told."""
        self.rejected += 1
        self.drops.drop("forbidden-queue", f"key may not use queue {queue!r}", client)
        result = codec.error_result("forbidden-queue", "this key may not use that queue")
        target = self.to_clients if answer is None else answer
        target.append([client, b"", PROTOCOL, _REPLY, _new_msgid(), result, msgid])

    def _error(
        self, client: bytes, msgid: bytes, reason: str, text: str, origin: bytes = b""
    ) -> None:
        if not client:
            return  # a scheduled run: nobody to tell (its life is on the bus and counted)
        result = codec.error_result(reason, text)
        self._tell(origin, [client, b"", PROTOCOL, _REPLY, _new_msgid(), result, msgid])

    def _tell(self, origin: bytes, message: Message) -> None:
        """To a client of this broker, or through the broker its client is connected to."""
        if origin and origin != self.broker_id:
            self.answers_to_brokers += 1
            self.to_brokers.append((origin, message))
        else:
            self.to_clients.append(message)

    def on_forwarded(self, message: Message) -> None:
        """An answer another broker sends to a client of this one."""
        self.answers_from_brokers += 1
        self.to_clients.append(message)

    def _on_request(self, client: bytes, request: codec.Request, now: float) -> None:
        self.requests += 1
        # A named tuple's fields are read through a descriptor each time: once each here.
        msgid = request.msgid
        name = request.queue
        body = request.body
        if msgid in self.jobs:
            self.drops.drop("duplicate-msgid", "a request id already in progress", client)
            self._error(client, msgid, "duplicate-msgid", "this message id is already in progress")
            return
        queue = self.queues.get(name) or self._queue(name)
        if queue is None:
            self.rejected += 1
            self._error(client, msgid, "too-many-queues", "the broker knows too many queues")
            return
        if len(queue.waiting) >= self.settings.queue_limit:
            self.rejected += 1
            queue.rejected += 1
            self._error(client, msgid, "queue-full", "the queue's buffer is full")
            self._publish_job("rejected", msgid, name, reason="queue-full")
            return
        headers = request.headers
        guaranteed = headers.guarantee and (self.store is not None or self.streamed)
        if headers.retry_count is not None:
            retries = headers.retry_count
        else:
            retries = self.settings.guarantee_retries if headers.guarantee else 0
        job = _new_job(msgid, client, name, headers, body, now, retries, guaranteed)
        self.jobs[msgid] = job
        if self._publishing:
            self._publish_job("queued", msgid, name, guaranteed=guaranteed)
        if guaranteed and self.streamed:
            # Told to nobody until the stream has it; then any broker may run it.
            self.appending[msgid] = job
            self.to_stream.append(("append", job))
        elif guaranteed:
            assert self.store is not None
            job.position = self.store.put_new(msgid, client, name, headers.raw, body, now, retries)
            self.unstored.append(job)  # routed once the commit succeeded
        elif self.streamed and not self._serves(name):
            # Not kept anywhere (eventmq's meaning), but a broker with workers for it runs it.
            self.forwarding[msgid] = job
            self.to_stream.append(("forward", job))
        else:
            # _place's body, not a call to it: the call cost 960 instructions a job (2.1 %
            # of the broker's work, bench/emqp_instructions.py --stages service).
            worker = self._pick(queue) if not queue.waiting else None
            if worker is not None:
                self._dispatch(job, worker, queue, now)
            else:
                queue.waiting.append(job)

    def _serves(self, queue: bytes) -> bool:
        state = self.queues.get(queue)
        return state is not None and bool(state.workers)

    def served_queues(self) -> set[bytes]:
        """The queues this broker has workers for (others may hand it their requests)."""
        return {name for name, queue in self.queues.items() if queue.workers}

    def forward_taken(self, msgid: bytes) -> None:
        """Another broker runs it: its answers come through :meth:`on_forwarded`."""
        job = self.forwarding.pop(msgid, None)
        if job is not None and self.jobs.get(msgid) is job:
            del self.jobs[msgid]
            self.forwarded_requests += 1

    def forward_refused(self, msgid: bytes) -> None:
        """No broker took it now: it waits here, offered again at the next heartbeat."""
        job = self.forwarding.pop(msgid, None)
        if job is not None and self.jobs.get(msgid) is job:
            self._requeue(job, self.clock(), at_head=False)

    def on_offered(self, stored: jobstream.StreamedJob) -> bool:
        """A request another broker has no worker for; True when taken (its answers go
        back through that broker)."""
        queue = self.queues.get(stored.queue)
        if queue is None or not queue.workers or stored.msgid in self.jobs:
            return False
        if len(queue.waiting) >= self.settings.queue_limit:
            return False
        job = self._job_of(stored)
        self.jobs[job.msgid] = job
        self.offers_taken += 1
        self._requeue(job, self.clock(), at_head=False)
        return True

    def _offer_waiting(self) -> None:
        """Requests waiting here for a queue nobody here serves are offered again."""
        for queue in list(self.queues.values()):
            if queue.workers or not queue.waiting:
                continue
            kept: deque[Job] = deque()
            for job in queue.waiting:
                if job.stored or job.handle:
                    kept.append(job)
                else:
                    self.forwarding[job.msgid] = job
                    self.to_stream.append(("forward", job))
            queue.waiting = kept
            self._drop_queue_if_idle(queue)

    def release_stored(self) -> None:
        """The store committed: route the guaranteed requests and send the answers that
        waited for it."""
        answers, self.unstored_answers = self.unstored_answers, []
        for held in answers:
            held.outbox.append(held.message)
        unstored, self.unstored = self.unstored, []
        now = self.clock()
        jobs, queues, pick, dispatch = self.jobs, self.queues, self._pick, self._dispatch
        name = queue = None
        for job in unstored:
            if jobs.get(job.msgid) is not job:
                continue
            # _requeue's lookup (once for requests of the same queue in a row: a queue is
            # dropped only while idle) and _place's body (at the tail), not calls to them.
            if job.queue != name or queue is None:
                name = job.queue
                queue = queues.get(name) or self._queue(name, force=True)
                assert queue is not None
            waiting = queue.waiting
            if not waiting:  # else behind those waiting: no worker to look for
                worker = pick(queue)
                if worker is not None:
                    dispatch(job, worker, queue, now)
                    continue
            waiting.append(job)

    def refuse_unstored(self, reason: str, text: str) -> int:
        """The store cannot take them: guaranteed requests not yet committed are forgotten
        (their pending rows too) and their clients told why, as are those whose schedule
        changes wait. Returns how many."""
        answers, self.unstored_answers = self.unstored_answers, []
        refused = 0
        for held in answers:
            if not held.stored:  # an answer that only waited its turn goes as it was
                held.outbox.append(held.message)
                continue
            origin, msgid = held.message[0], held.message[-1]
            result = codec.error_result(reason, text)
            held.outbox.append([origin, b"", PROTOCOL, _REPLY, _new_msgid(), result, msgid])
            refused += 1
        self.refused_unstored += refused
        unstored, self.unstored = self.unstored, []
        for job in unstored:
            if self.jobs.get(job.msgid) is not job:
                continue
            del self.jobs[job.msgid]
            if self.store is not None:
                self.store.discard(job.msgid)
            self.refused_unstored += 1
            self._error(job.client, job.msgid, reason, text)
            self._publish_job("rejected", job.msgid, job.queue, reason=reason)
        return len(unstored) + refused

    # -- the stream (--store jetstream) -----------------------------------------------------------

    def streamed_job(self, job: Job) -> jobstream.StreamedJob:
        """``job`` as the JetStream stream keeps it."""
        retries = job.headers.retry_count
        if retries is None:
            retries = self.settings.guarantee_retries
        return jobstream.StreamedJob(
            job.origin or self.broker_id,
            job.client,
            job.msgid,
            job.queue,
            job.headers.raw,
            job.body,
            job.received,
            retries,
        )

    def stream_appended(self, msgid: bytes) -> None:
        """The stream stored it: it is the stream's now, for whichever broker pulls it."""
        job = self.appending.pop(msgid, None)
        if job is None:
            return
        self.appended += 1
        if self.jobs.get(msgid) is job:
            del self.jobs[msgid]
        self._publish_job("stored", msgid, job.queue)

    def stream_too_large(self, msgid: bytes, size: int, limit: int) -> None:
        """The stream's servers cannot take it (a ``size``-byte message, ``limit`` at most):
        refused to its client, never sent (it would cost the connection)."""
        job = self.appending.pop(msgid, None)
        if job is None:
            return
        if self.jobs.get(msgid) is job:
            del self.jobs[msgid]
        self.rejected += 1
        text = f"the request makes a {size}-byte NATS message; the servers take {limit}"
        self.drops.drop("too-large-for-stream", text, job.client)
        self._error(job.client, msgid, "too-large-for-stream", text, job.origin)
        self._publish_job("rejected", msgid, job.queue, reason="too-large-for-stream")

    def on_stream_job(
        self,
        stored: jobstream.StreamedJob,
        handle: bytes,
        delivered: int,
        stored_at: float | None = None,
    ) -> None:
        """A request the stream delivered to this broker (pulled for its READY workers);
        ``delivered``: how many times the stream has delivered it, this time included;
        ``stored_at``: when the stream stored it (the delivery says)."""
        self.stream_deliveries += 1
        msgid = stored.msgid
        held = self.jobs.get(msgid)
        if held is not None and self.appending.get(msgid) is held:
            # Its own append, delivered before the stream's acknowledgement came back (a
            # resent append answered late): stored, so taken as such.
            self.stream_appended(msgid)
            held = None
        if held is not None:
            if held.handle:
                held.handle = handle  # delivered again while this broker still holds it
            else:
                # A request of the same msgid not kept in the stream runs here now: this
                # one waits its turn (acknowledged, it would be lost).
                self.to_stream.append(("later", handle))
            return
        gate = self.schedule_gate
        if (
            not stored.client
            and gate is not None
            and gate.missed(stored.body, msgid, self.clock(), stored_at)
        ):
            # A schedule's run (no client) the stream gave out past its time: a missed run,
            # not made up (the latest one runs, then the rhythm). Logged each time: at most
            # one line per run of a schedule, and an operator asks why a run did not come.
            self.schedule_runs_missed += 1
            self.log.info(
                "schedule run {msgid} missed: the stream gave it out {late} after it stored "
                "it; acknowledged without running (the schedule goes on in its rhythm)",
                msgid=peer_name(msgid),
                late="unknown time" if stored_at is None else f"{self.clock() - stored_at:.3f}s",
            )
            self.to_stream.append(("ack", handle))
            return
        job = self._job_of(stored, delivered, handle)
        if delivered > stored.retries + 1:
            self.to_stream.append(("term", handle))
            self.failed += 1
            self._error(
                job.client, msgid, "retries-exhausted", _REASONS["retries-exhausted"], job.origin
            )
            self._publish_job("failed", msgid, job.queue, reason="retries-exhausted")
            return
        queue = self.queues.get(job.queue)
        if queue is None or not queue.workers:
            self.released += 1
            self.to_stream.append(("nak", handle))  # its workers left meanwhile: to others
            return
        self.jobs[msgid] = job
        self._requeue(job, self.clock(), at_head=False)

    def _job_of(
        self, stored: jobstream.StreamedJob, delivered: int = 1, handle: bytes = b""
    ) -> Job:
        """A request another broker took (the stream's ``delivered``-th delivery of it, by
        ``handle``; or offered to this one): the deliveries before count as attempts. It
        is kept by the stream (its handle) or nowhere, never by this broker's store."""
        earlier = max(delivered - 1, 0)
        return Job(
            stored.msgid,
            stored.client,
            stored.queue,
            _headers_of(stored.headers),
            stored.body,
            stored.received,
            max(stored.retries - earlier, 0),
            False,
            attempts=earlier,
            origin=b"" if stored.origin == self.broker_id else stored.origin,
            handle=handle,
        )

    def wanted(self) -> dict[bytes, int]:
        """Per queue, how many more requests this broker's workers could start now."""
        wants: dict[bytes, int] = {}
        workers = self.workers
        for name, queue in self.queues.items():
            if not queue.workers or name in self.paused:
                continue
            free = sum(workers[i].free_slots for i in queue.workers) - len(queue.waiting)
            if free > 0:
                wants[name] = free
        return wants

    def held_handles(self) -> list[bytes]:
        """The deliveries this broker holds (waiting or running): told in progress."""
        return [job.handle for job in self.jobs.values() if job.handle]

    def _release_unserved(self, queue: QueueState) -> None:
        """A queue left without workers here: what the stream gave it goes back to the
        stream at once, for the brokers that have workers."""
        if queue.workers or not self.streamed:
            return
        kept: deque[Job] = deque()
        for job in queue.waiting:
            if job.handle:
                self.jobs.pop(job.msgid, None)
                self.released += 1
                self.to_stream.append(("nak", job.handle))
            else:
                kept.append(job)
        queue.waiting = kept
        self._drop_queue_if_idle(queue)

    def _pick(self, queue: QueueState) -> WorkerState | None:
        """The worker of this queue with a free slot: heaviest, then least recently used."""
        if self.paused and queue.name in self.paused:
            return None
        workers = self.workers
        heaviest = queue.heaviest
        best: WorkerState | None = None
        best_weight = -1
        for identity, weight in queue.workers.items():
            if weight > best_weight:
                candidate = workers[identity]
                if candidate.free_slots > 0:
                    best, best_weight = candidate, weight
                    if weight == heaviest:  # none heavier: the rest need no look
                        break
        if best is not None:
            order = queue.workers
            del order[best.identity]
            order[best.identity] = best_weight
        return best

    def _feed(self, worker: WorkerState, now: float) -> None:
        """Give a worker with free slots the oldest request of its heaviest waiting queue (the
        one-queue branch is copied in :meth:`on_worker_messages`'s READY, for its speed: change
        them together)."""
        queues = self.queues
        paused = self.paused
        if len(worker.queues) == 1:  # the usual worker: no queue to choose (a third of the cost)
            weight, name = worker.queues[0]
            queue = queues.get(name)
            if queue is None or (paused and name in paused):
                return
            waiting, order, identity = queue.waiting, queue.workers, worker.identity
            while worker.free_slots > 0 and waiting:
                if order.pop(identity, None) is not None:
                    order[identity] = weight
                self._dispatch(waiting.popleft(), worker, queue, now)
            return
        while worker.free_slots > 0:
            chosen: QueueState | None = None
            chosen_weight = -1
            for weight, name in worker.queues:
                queue = queues.get(name)
                if queue is None or not queue.waiting or (paused and name in paused):
                    continue
                if (
                    chosen is None
                    or weight > chosen_weight
                    or (
                        weight == chosen_weight
                        and queue.waiting[0].received < chosen.waiting[0].received
                    )
                ):
                    chosen, chosen_weight = queue, weight
            if chosen is None:
                return
            job = chosen.waiting.popleft()
            order = chosen.workers
            if worker.identity in order:
                del order[worker.identity]
                order[worker.identity] = chosen_weight
            self._dispatch(job, worker, chosen, now)

    def _dispatch(self, job: Job, worker: WorkerState, queue: QueueState, now: float) -> None:
        worker.free_slots -= 1
        worker.dispatched += 1
        worker.inflight[job.msgid] = job
        queue.dispatched += 1
        self.dispatched += 1
        job.worker = worker.identity
        job.attempts += 1
        job.dispatched_at = now
        headers = job.headers
        self.to_workers.append(
            [
                worker.identity,
                b"",
                PROTOCOL,
                _REQUEST,
                job.msgid,
                job.queue,
                headers.raw if headers.reply_requested else codec.with_reply_requested(headers),
                job.body,
            ]
        )
        # The original broker's acknowledgement: the request went to a worker.
        if job.client:
            ack = [job.client, b"", PROTOCOL, _REPLY, _new_msgid(), job.msgid]
            if job.origin:
                self._tell(job.origin, ack)
            else:
                self.to_clients.append(ack)
        if headers.timeout is not None:
            heapq.heappush(self._deadlines, (now + headers.timeout, job.msgid, job.attempts))
        if self._publishing:
            self._publish_job(
                "dispatched",
                job.msgid,
                job.queue,
                worker=peer_name(worker.identity),
                attempt=job.attempts,
            )

    def _on_reply(self, worker: WorkerState, reply: codec.Reply, now: float) -> None:
        msgid = reply.request_msgid
        job = worker.inflight.pop(msgid, None)
        if job is None:
            if msgid in self._given_up:
                self.late_replies += 1
                self.drops.drop("late-reply", "a REPLY after the broker gave up", worker.identity)
            else:
                self.drops.drop("unknown-request", "a REPLY for no request", worker.identity)
            return
        del self.jobs[msgid]
        self.replied += 1
        if job.stored and self.store is not None:
            self.store.remove(msgid)
        if job.headers.reply_requested and job.client:
            self.forwarded_replies += 1
            answer = [job.client, b"", PROTOCOL, _REPLY, _new_msgid(), reply.result, msgid]
            if job.origin:
                self._tell(job.origin, answer)
            else:
                self.to_clients.append(answer)
        if job.handle:
            self.to_stream.append(("ack", job.handle))  # after the answer: at least once
        if self._publishing:
            self._publish_job(
                "replied",
                msgid,
                job.queue,
                worker=peer_name(worker.identity),
                seconds=round(now - job.dispatched_at, 6),
            )

    def _retry_or_fail(self, job: Job, reason: str) -> None:
        job.worker = None
        if job.retries_left <= 0:
            self._fail(job, reason)
            return
        job.retries_left -= 1
        self.retried += 1
        if job.stored and self.store is not None:
            self.store.put(self._stored(job))
        self._publish_job(
            "retried", job.msgid, job.queue, reason=reason, retries_left=job.retries_left
        )
        self._requeue(job, self.clock())

    def _requeue(self, job: Job, now: float, at_head: bool = True) -> None:
        """To a free worker, else back in its queue (at the head for a retry): it was
        accepted, so the buffer's bound does not apply."""
        queue = self.queues.get(job.queue) or self._queue(job.queue, force=True)
        assert queue is not None
        self._place(job, queue, now, at_head)

    def _place(self, job: Job, queue: QueueState, now: float, at_head: bool) -> None:
        """:meth:`_requeue` in ``queue``, the job's, already looked up (copies of this body
        place a new request in :meth:`_on_request` and a committed guaranteed one in
        :meth:`release_stored`, for their speed: change them together)."""
        worker = self._pick(queue) if not queue.waiting else None
        if worker is not None:
            self._dispatch(job, worker, queue, now)
        elif at_head:
            queue.waiting.appendleft(job)
        else:
            queue.waiting.append(job)

    def _fail(self, job: Job, reason: str) -> None:
        self.jobs.pop(job.msgid, None)
        self.failed += 1
        if job.stored and self.store is not None:
            self.store.remove(job.msgid)
        self._error(job.client, job.msgid, reason, _REASONS.get(reason, reason), job.origin)
        if job.handle:
            self.to_stream.append(("term", job.handle))
        self._publish_job("failed", job.msgid, job.queue, reason=reason, attempts=job.attempts)

    def _remember_given_up(self, msgid: bytes) -> None:
        given_up = self._given_up
        given_up[msgid] = None
        given_up.move_to_end(msgid)
        while len(given_up) > self.settings.late_memory:
            given_up.popitem(last=False)

    def check_timeouts(self) -> bool:
        """At each wake of the server's periodic look: give up on dispatched requests past
        their ``timeout`` (:meth:`expire`), but not at a wake that comes late, nor within its
        settling time: the broker did not run, and their REPLYs may wait unread
        (:mod:`bus.util.wakes`). True when it looked."""
        judging = self.expiry_wakes.judging()
        deadlines = self._deadlines
        if not judging or not deadlines or deadlines[0][0] > self.clock():
            return False
        self.expire()
        return True

    def expire(self) -> None:
        """Give up on dispatched requests past their ``timeout``."""
        deadlines = self._deadlines
        if not deadlines:
            return
        now = self.clock()
        while deadlines and deadlines[0][0] <= now:
            _, msgid, attempt = heapq.heappop(deadlines)
            job = self.jobs.get(msgid)
            if job is None or job.attempts != attempt or job.worker is None:
                continue  # answered, or already given up on and re-dispatched
            worker = self.workers.get(job.worker)
            if worker is not None:
                worker.inflight.pop(msgid, None)
            self.timed_out += 1
            self._remember_given_up(msgid)
            self._retry_or_fail(job, "timeout")

    @property
    def next_deadline(self) -> float | None:
        """When the earliest request in flight times out (None: none has a timeout)."""
        return self._deadlines[0][0] if self._deadlines else None

    # -- an operator's actions (the HTTP port's POST /api/v1/actions, see bus.web.actions) --------

    def tell_purged(self, purged: Sequence[jobstream.StreamedJob]) -> None:
        """Requests purged from the stream that no broker had been given: each client is
        told ``purged``, through the broker it is connected to."""
        for stored in purged:
            self._error(stored.client, stored.msgid, "purged", _REASONS["purged"], stored.origin)
        self.purged += len(purged)

    def pause(self, name: bytes) -> bool:
        """Hold the queue's requests: none is dispatched (nor, with ``--store jetstream``,
        pulled from the stream by this broker) until :meth:`resume`; requests in flight
        run on. False when it was paused already."""
        if name in self.paused:
            return False
        self.paused.add(name)
        if self.store is not None:
            self.store.set_paused(name, True)
        self._publish("/emqp/queue/paused/", {"queue": _text(name)})
        return True

    def resume(self, name: bytes) -> bool:
        """Dispatch the queue's requests again, at once to its workers' free slots. False
        when it was not paused."""
        if name not in self.paused:
            return False
        self.paused.discard(name)
        if self.store is not None:
            self.store.set_paused(name, False)
        self._publish("/emqp/queue/resumed/", {"queue": _text(name)})
        queue = self.queues.get(name)
        if queue is not None:
            now = self.clock()
            for identity in list(queue.workers):
                worker = self.workers.get(identity)
                if worker is not None:
                    self._feed(worker, now)
        return True

    def purge(self, name: bytes) -> int:
        """Forget every request of the queue that waits for a worker here (the stored ones
        removed from the store, those the stream delivered here terminated; the service
        purges the stream's others with ``--store jetstream``): none is ever dispatched, each client that
        waits for an answer is told ``purged``. Requests in flight run on. Returns how many
        were forgotten here."""
        queue = self.queues.get(name)
        waiting = list(queue.waiting) if queue is not None else []
        if queue is not None:
            queue.waiting.clear()
        # Guaranteed requests accepted and not yet committed: routed at the commit otherwise.
        waiting.extend(job for job in self.unstored if job.queue == name)
        count = 0
        for job in waiting:
            if self.jobs.get(job.msgid) is not job:
                continue
            del self.jobs[job.msgid]
            count += 1
            if job.stored and self.store is not None:
                self.store.remove(job.msgid)  # a put not yet committed is replaced too
            if job.handle:
                self.to_stream.append(("term", job.handle))
            self._error(job.client, job.msgid, "purged", _REASONS["purged"], job.origin)
        self.unstored = [job for job in self.unstored if job.msgid in self.jobs]
        self.purged += count
        if queue is not None:
            self._drop_queue_if_idle(queue)
        self._publish("/emqp/queue/purged/", {"queue": _text(name), "requests": count})
        return count

    def remove_schedule(self, schedule_id: str) -> bool:
        """Remove a schedule kept by this broker (as an UNSCHEDULE does; with ``--store
        jetstream`` the cluster's bucket is told, and every broker's book follows it).
        False when no such schedule is kept (or schedules are kept by an external
        scheduler)."""
        book = self.schedules
        if book is None or not book.remove(schedule_id):
            return False
        self._schedule_gone(schedule_id, "removed")
        if self.streamed:
            self.to_stream.append(("schedule-delete", schedule_id))
        return True

    def worker_named(self, name: str) -> bytes | None:
        """The identity of the worker shown as ``name`` (its ``id`` in :meth:`status`)."""
        for identity in self.workers:
            if peer_name(identity) == name:
                return identity
        return None

    def forget(self, identity: bytes) -> bool:
        """Forget a worker now, as if it had gone silent: its requests in flight are retried
        or failed, and it is told KBYE (a live one connects again and INFORMs anew). False
        for a worker not known."""
        if identity not in self.workers:
            return False
        self.to_workers.append([identity, *codec.kbye()])
        self.workers_forgotten += 1
        self._forget_worker(identity, "forgotten")
        return True

    # -- storage -----------------------------------------------------------------------------------

    @staticmethod
    def _stored(job: Job) -> StoredJob:
        return tuple.__new__(  # one per guaranteed job: without the named tuple's __new__ frame
            StoredJob,
            (
                job.msgid,
                job.position,
                job.client,
                job.queue,
                job.headers.raw,
                job.body,
                job.received,
                job.attempts,
                job.retries_left,
            ),
        )

    def reconfigure(self, settings: BrokerSettings) -> None:
        """Serve on with ``settings`` (a SIGHUP's): limits and retries count from the next
        message on, a worker's silence against the new expiry at the next heartbeat round, the schedules' limit
        and haste from the next SCHEDULE. ``scheduler`` is kept as it was (not changed
        while serving)."""
        self.settings = replace(settings, scheduler=self.settings.scheduler)
        self.wakes.period = settings.heartbeat_interval
        if self.schedules is not None:
            self.schedules.max_schedules = settings.max_schedules
            self.schedules.cron_haste = settings.cron_haste

    def restore_paused(self) -> list[bytes]:
        """Hold again the queues an operator paused before a restart (the store keeps them
        until resumed); returns them."""
        if self.store is None:
            return []
        paused = self.store.load_paused()
        self.paused.update(paused)
        return paused

    def restore(self) -> int:
        """Queue again every guaranteed request the store holds (after a restart or a crash):
        each is dispatched once a worker is free, in the order they were received."""
        if self.store is None:
            return 0
        count = 0
        for stored in self.store.load():
            if stored.msgid in self.jobs:
                continue
            headers = _headers_of(stored.headers)
            job = Job(
                stored.msgid,
                stored.client,
                stored.queue,
                headers,
                stored.body,
                stored.received,
                stored.retries_left,
                True,
                stored.position,
                stored.attempts,
            )
            self.jobs[job.msgid] = job
            queue = self._queue(job.queue, force=True)
            assert queue is not None
            queue.waiting.append(job)
            count += 1
        self.restored += count
        return count

    # -- activity and status ----------------------------------------------------------------------

    def _publish(self, topic: str, value: dict[str, Any]) -> None:
        if self._publishing:
            try:
                self.activity.publish(topic, value)
            except ValueError as error:
                self.log.warn("activity not published: {error}", error=str(error))

    def _publish_job(self, state: str, msgid: bytes, queue: bytes, **fields: Any) -> None:
        if self._publishing:
            value = {"msgid": peer_name(msgid), "queue": queue.decode("utf-8", "replace")}
            value.update(fields)
            self._publish(f"/emqp/job/{state}/", value)

    def status(self, in_flight_limit: int = 1000) -> dict[str, Any]:
        """Queues, workers, requests in flight (at most ``in_flight_limit``), schedules and
        counters, with eventmq's STATUS keys beside them: the STATUS answer and ``/status``."""
        now = self.clock()
        expiry = self.settings.worker_expiry
        queues = {
            name.decode("utf-8", "replace"): {
                "depth": len(queue.waiting),
                "workers": len(queue.workers),
                "free_slots": sum(self.workers[w].free_slots for w in queue.workers),
                "dispatched": queue.dispatched,
                "rejected": queue.rejected,
                "paused": name in self.paused,
            }
            for name, queue in self.queues.items()
        }
        workers = [
            {
                "id": peer_name(identity),
                "queues": [[w, n.decode("utf-8", "replace")] for w, n in worker.queues],
                "free_slots": worker.free_slots,
                "in_flight": len(worker.inflight),
                "dispatched": worker.dispatched,
                "last_seen_s": round(now - worker.last_seen, 3),
                "expires_in_s": round(expiry - (now - worker.last_seen), 3),
            }
            for identity, worker in self.workers.items()
        ]
        in_flight: list[dict[str, Any]] = []
        for worker in self.workers.values():
            for job in worker.inflight.values():
                if len(in_flight) >= in_flight_limit:
                    break
                in_flight.append(
                    {
                        "msgid": peer_name(job.msgid),
                        "queue": job.queue.decode("utf-8", "replace"),
                        "worker": peer_name(worker.identity),
                        "attempt": job.attempts,
                        "age_s": round(now - job.dispatched_at, 3),
                        "guaranteed": job.stored or bool(job.handle),
                    }
                )
        return {
            "queues": queues,
            "workers": workers,
            "schedulers": [peer_name(s) for s in self.schedulers],
            "scheduler": self.settings.scheduler,
            "schedule_lateness_ms": self._lateness_ms(),
            "schedules_count": len(self.schedules) if self.schedules is not None else 0,
            **self._gate_status(),
            "schedules": (
                self.schedules.listing(now, limit=in_flight_limit)
                if self.schedules is not None
                else []
            ),
            "in_flight": in_flight,
            "in_flight_count": sum(len(w.inflight) for w in self.workers.values()),
            "waiting": sum(len(q.waiting) for q in self.queues.values()),
            "paused_queues": sorted(_text(name) for name in self.paused),
            "counters": self.counters(),
            **self.eventmq_status(now),
        }

    def _gate_status(self) -> dict[str, int]:
        """In a cluster: runs fired and not yet stored that this broker knows of (at most
        one per schedule), and runs it appended for a broker that fired them."""
        gate = self.schedule_gate
        if gate is None:
            return {}
        return {
            "schedule_runs_unstored": gate.unstored,
            "schedule_runs_taken_over": gate.taken_over,
        }

    def eventmq_status(self, now: float) -> dict[str, dict[str, int]]:
        """The keys of eventmq's router's STATUS, which its users' monitoring reads.

        ``inflight_messages_by_queue``: requests accepted and not ended, waiting ones
        included (eventmq counts from a request's arrival to its REPLY); the latency keys:
        their mean and greatest age in ms; ``waiting_messages_by_queue``: those waiting for
        a worker; ``processed_messages_by_queue`` and ``_by_worker``: dispatches to workers
        since the start (eventmq left out those that had waited), gone queues and workers
        included. Queues without any are left out, as eventmq leaves them."""
        ages = open_ages(self.jobs, now)
        by_queue = dict(self._retired_queues)
        for name, queue in self.queues.items():
            if queue.dispatched:
                key = _text(name)
                by_queue[key] = by_queue.get(key, 0) + queue.dispatched
        by_worker = dict(self._retired_workers)
        for identity, worker in self.workers.items():
            if worker.dispatched:
                key = peer_name(identity)
                by_worker[key] = by_worker.get(key, 0) + worker.dispatched
        return {
            "inflight_messages_by_queue": {_text(n): c for n, (c, _, _) in ages.items()},
            "latency_messages_by_queue": {
                _text(n): int(total / c * 1000) for n, (c, total, _) in ages.items()
            },
            "max_latency_messages_by_queue": {
                _text(n): int(oldest * 1000) for n, (_, _, oldest) in ages.items()
            },
            "waiting_messages_by_queue": {
                _text(n): len(q.waiting) for n, q in self.queues.items() if q.waiting
            },
            "processed_messages_by_queue": by_queue,
            "processed_messages_by_worker": by_worker,
        }

    def _lateness_ms(self) -> dict[str, float]:
        """How late the most recent scheduled runs left (their due time to their firing)."""
        if self.schedules is None or not self.schedules.lateness:
            return {}
        late = sorted(self.schedules.lateness)
        return {
            "p50": round(late[len(late) // 2] * 1000, 3),
            "p99": round(late[min(len(late) - 1, len(late) * 99 // 100)] * 1000, 3),
            "max": round(late[-1] * 1000, 3),
        }

    def counters(self) -> dict[str, int]:
        """The broker's counters since it started, by name."""
        return {
            "requests": self.requests,
            "dispatched": self.dispatched,
            "replied": self.replied,
            "forwarded_replies": self.forwarded_replies,
            "retried": self.retried,
            "failed": self.failed,
            "rejected": self.rejected,
            "timed_out": self.timed_out,
            "late_replies": self.late_replies,
            "late_heartbeats_held": self.wakes.held,
            "late_timeout_checks_held": self.expiry_wakes.held,
            "workers_joined": self.workers_joined,
            "workers_lost": self.workers_lost,
            "schedules_forwarded": self.schedules_forwarded,
            "schedules_added": self.schedules_added,
            "schedules_removed": self.schedules_removed,
            "schedules_fired": self.schedules_fired,
            "schedule_runs_missed": self.schedule_runs_missed,
            "restored": self.restored,
            "refused_unstored": self.refused_unstored,
            "purged": self.purged,
            "workers_forgotten": self.workers_forgotten,
            "dropped": self.drops.total,
        }


def _text(name: bytes) -> str:
    return name.decode("utf-8", "replace")


def _retire(counts: dict[str, int], name: str, count: int) -> None:
    """Keep a gone queue's or worker's count (added to one of the same name gone before)."""
    if count:
        counts[name] = counts.pop(name, 0) + count  # the most recent last
        if len(counts) > RETIRED_COUNTS:
            del counts[next(iter(counts))]


_REASONS = {
    "timeout": "the request's timeout passed before its worker replied",
    "worker-lost": "its worker died or went silent",
    "worker-left": "its worker left (KBYE)",
    "retries-exhausted": "delivered more times than its retries allow (brokers holding it died)",
    "forgotten": "an operator made the broker forget its worker",
    "purged": "an operator purged its queue before a worker took it",
}
