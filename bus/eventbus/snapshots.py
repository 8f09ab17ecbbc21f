"""The snapshot port's streams: SYNCSTART in, SYNC... SYNCEND out, at a bounded cost per client.

A stream never drops a frame: when its client's pipe is full (the ROUTER's send HWM)
it waits and resumes where it stopped. A ROUTER has no per-peer writability signal,
so waiting streams are retried by one shared scheduler:

* streams that can send take turns, at most :data:`MESSAGES_PER_TURN` messages per
  reactor turn in total;
* a stream whose client took a good number of messages (:data:`FAST_RETRY_MESSAGES`)
  before its pipe filled tries again on the next turn: a reading client must not wait
  on a timer (measured: a 1 ms retry made a 100k-event snapshot 50 % slower with a
  250-message pipe);
* libzmq signals the ROUTER's descriptor when a client's full pipe has drained to half
  (its low-water mark): on that signal, blocked streams whose client took something in
  the last :data:`HOT_WINDOW` try again at once;
* a blocked stream is otherwise retried after a delay proportional to how long its
  client has taken nothing (:data:`BACKOFF` of it, 1 ms to :data:`MAX_RETRY_DELAY`): a
  reading client that the machine's load kept from reading for a while is tried again
  soon, while one that stopped reading costs one failed send per second; a stream whose
  client took nothing for :data:`SHRINK_AFTER` gives back its prepared chunk (the store
  is read again when it moves). (The delay used to double per failed attempt: on a busy
  machine a healthy client not scheduled for a few milliseconds pushed its stream out of
  the signal's reach and onto 30-60 ms timers, and its snapshot took up to twice as long.)
* a stream whose client has not taken a message for ``snapshot_stall_timeout``
  seconds is abandoned (``stalled``); its client sees no SYNCEND and asks again;
* at most ``max_snapshots`` streams run at once, and ``max_snapshots_per_client`` per
  client identity; further SYNCSTARTs wait in a queue of ``snapshot_queue`` and past
  that are dropped (``refused``), never answered with a SYNCEND, which would make the
  client believe it holds everything.

Memory per stuck client is then its pipe (``snapshot_hwm`` messages of ~0.7 KiB in
libzmq), its kernel send buffer (``snapshot_send_buffer``, not in the process's RSS)
and :data:`KEEP_WHEN_BLOCKED` prepared messages; all streams together prepare at most
about :data:`PREPARED_MESSAGES` messages ahead.
"""

from __future__ import annotations

import heapq
import itertools
from collections import Counter, deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Literal

from twisted.internet import defer
from twisted.internet.base import DelayedCall
from twisted.logger import Logger

from bus.eventbus import codec
from bus.eventbus.codec import SnapshotRequest, SyncChunk
from bus.eventbus.config import EventBusConfig
from bus.eventbus.eventlog import SyncSource
from bus.extension import Metric, counter, gauge
from bus.transport.zmqsocket import PeerUnreachable
from bus.util.memory import MemoryRelease

if TYPE_CHECKING:
    from bus.eventbus.eventlog import Row, RowSource
    from bus.extension import ZmqSocket

log = Logger(namespace="bus.eventbus.snapshots")

#: The shortest and longest a blocked stream waits between two attempts.
RETRY_DELAY = 0.001
MAX_RETRY_DELAY = 1.0
#: A blocked stream waits this fraction of the time its client has taken nothing.
BACKOFF = 0.5
#: Messages all streams together send per reactor turn (a few milliseconds of work).
MESSAGES_PER_TURN = 2000
#: Blocked streams whose client took something this recently are woken by the signal.
HOT_WINDOW = 0.1
#: A stream that sent at least this many messages before its pipe filled tries again on
#: the next reactor turn rather than after a timer (a slow reader never gets there).
FAST_RETRY_MESSAGES = 32
#: Blocked streams retried per reactor turn at most (the rest on the next turn).
RETRIES_PER_TURN = 256
#: A stream whose client took nothing this long keeps only KEEP_WHEN_BLOCKED prepared
#: messages.
SHRINK_AFTER = 0.25
KEEP_WHEN_BLOCKED = 8
#: Messages read and encoded ahead, by all streams together (~0.7 KiB each): the
#: store is read in smaller chunks when many streams run at once.
PREPARED_MESSAGES = 16_384
#: Free memory is handed back to the system at most this often, after streams ended.
RELEASE_INTERVAL = 5.0

#: "reading": the rows come from a log read asynchronously (a replicated stream); the
#: stream is ready again once they are in.
Outcome = Literal["more", "blocked", "finished", "gone", "reading"]


class SnapshotStream:
    """One SYNCSTART's answer: reads the store chunk by chunk and sends what fits."""

    __slots__ = (
        "_ahead",
        "_bounded",
        "_finished",
        "_pending",
        "_sequences",
        "chunk",
        "delay",
        "done",
        "due",
        "encoding",
        "highest_sent",
        "identity",
        "last_progress",
        "position",
        "reading",
        "request",
        "sent",
        "started_at",
        "upto",
    )

    def __init__(
        self,
        identity: bytes,
        request: SnapshotRequest,
        upto: int,
        encoding: codec.SequenceEncoding,
        now: float,
    ) -> None:
        self.identity = identity
        self.request = request
        self.upto = upto
        self.encoding = encoding
        #: The highest sequence read from the store so far.
        self.position = request.since
        self.highest_sent = 0
        self.sent = 0
        self.started_at = now
        #: When the client last took a message (or the stream started).
        self.last_progress = now
        self.delay = RETRY_DELAY
        #: Events read from the store at a time: small for a client that stopped reading,
        #: doubled while it takes them, up to ``snapshot_chunk``.
        self.chunk = 0
        #: The last read stopped at its bound of events looked at (a subtree few events
        #: match): the stream gives the reactor back before it reads on.
        self._bounded = False
        self.done = False
        #: When a blocked stream tries again (0: it is not blocked).
        self.due = 0.0
        self._pending: list[list[bytes]] = []
        self._sequences: list[int] = []
        self._finished = False
        #: The rows asked of a log that answers later (None: none asked).
        self.reading: defer.Deferred[Any] | None = None
        #: Such a log's next chunk, asked as soon as this one came (its reading overlaps
        #: the sending of this one: the log's thread and servers work meanwhile).
        self._ahead: defer.Deferred[Any] | None = None

    @property
    def prepared(self) -> int:
        """Messages read and encoded but not yet handed to ZeroMQ."""
        return len(self._pending)

    def _refill(self, store: RowSource, chunk: int, syncend_current: bool) -> None:
        self.chunk = chunk = min(self.chunk * 2, chunk) if self.chunk else chunk
        ahead, self._ahead = self._ahead, None
        rows = ahead if ahead is not None else self._read(store, chunk)
        if isinstance(rows, defer.Deferred):
            self.reading = rows  # _took clears it, at once if the rows are in already
            rows.addCallback(self._took, syncend_current, store, chunk)
            return
        self._took(rows, syncend_current)

    def _read(self, store: RowSource, chunk: int) -> Any:
        """The next chunk from ``store``: its SYNC messages where the log makes them
        (:class:`bus.eventbus.eventlog.SyncSource`), else its rows."""
        if self.position >= self.upto:
            # Nothing after it: a SYNCSTART may name any sequence up to 2**64 - 1, past
            # what a log can hold, so such a one is answered without asking the log.
            return []
        if isinstance(store, SyncSource):
            return store.read_syncs(
                self.position, self.upto, self.request.subtrees, chunk, self.identity,
                self.encoding,
            )  # fmt: skip
        return store.read_rows(self.position, self.upto, self.request.subtrees, chunk)

    def _took(
        self,
        rows: list[Row] | SyncChunk,
        syncend_current: bool,
        store: RowSource | None = None,
        chunk: int = 0,
    ) -> None:
        """Prepare the messages of ``rows`` (or take those the log made); with ``store``
        (a log that answers later), ask for the next chunk at once."""
        self.reading = None
        identity, encoding = self.identity, self.encoding
        if isinstance(rows, SyncChunk):
            sequences, messages = rows
            scanned = None
        else:
            scanned = getattr(rows, "scanned", None)
            sequences = [row[0] for row in rows]
            messages = codec.sync_messages(identity, rows, encoding)
        self._bounded = scanned is not None
        if sequences:
            self.position = self.highest_sent = sequences[-1]
            if scanned is not None:  # the events up to there were looked at
                self.position = scanned
            self._pending, self._sequences = messages, sequences
            if store is not None and not self.done:
                ahead = self._read(store, chunk)
                if isinstance(ahead, defer.Deferred):
                    self._ahead = ahead
            return
        if scanned is not None:  # looked at its bound, found none: read on from there
            self.position = scanned
            return
        end = self.upto if syncend_current or self.highest_sent == 0 else self.highest_sent
        self._pending = [[identity, *codec.sync_end_frames(self.request.spec, end, encoding)]]
        self._sequences = [end]
        self._finished = True

    def pump(
        self,
        sock: ZmqSocket,
        store: RowSource,
        budget: int,
        chunk: int,
        syncend_current: bool,
    ) -> tuple[Outcome, int]:
        """Send up to ``budget`` messages; return what happened and how many were sent."""
        total = 0
        while total < budget:
            pending = self._pending
            if not pending:
                if self._finished:
                    return "finished", total
                if self._bounded:  # the last read looked at its bound of the log: next turn
                    self._bounded = False
                    self.sent += total
                    return "more", total
                if self.reading is None:
                    self._refill(store, chunk, syncend_current)
                if self.reading is not None:
                    self.sent += total
                    return "reading", total
                pending = self._pending
            try:
                sent = sock.send_many(pending[: budget - total])
            except PeerUnreachable:
                self.sent += total
                return "gone", total
            if sent:
                del pending[:sent]
                del self._sequences[:sent]
                total += sent
            elif pending:
                self.sent += total
                return "blocked", total
        self.sent += total
        if not self._pending and self._finished:
            return "finished", total
        return "more", total

    def drop_ahead(self) -> None:
        """Forget the chunk read ahead (the stream ended, or moved back)."""
        ahead, self._ahead = self._ahead, None
        if ahead is not None:
            ahead.addErrback(lambda _failure: None)  # nobody waits for it

    def shrink(self, keep: int) -> None:
        """Give back prepared messages beyond the first ``keep``; they are read again,
        ``keep`` at first."""
        if keep < 1:
            raise ValueError("keep at least one prepared message")
        self.chunk = keep
        if len(self._pending) <= keep or self._finished:
            return
        self.drop_ahead()  # read from where the kept messages end instead
        del self._pending[keep:]
        del self._sequences[keep:]
        self.position = self.highest_sent = self._sequences[-1]


class _Notice:
    """A log line about snapshot clients, at most once per ``interval`` per kind."""

    def __init__(self, interval: float = 10.0) -> None:
        self.interval = interval
        self._last: dict[str, float] = {}
        self._unreported: Counter[str] = Counter()

    def __call__(self, kind: str, now: float, text: str, **fields: Any) -> None:
        self._unreported[kind] += 1
        last = self._last.get(kind)
        if last is not None and now - last < self.interval:
            return
        self._last[kind] = now
        log.info(text, count=self._unreported.pop(kind), **fields)


class SnapshotScheduler:
    """Every snapshot stream of one server, their limits and their counters.

    The counters are plain attributes, updated as streams start and end; ``status()``
    reports them."""

    def __init__(
        self,
        reactor: Any,
        store: RowSource,
        config: EventBusConfig,
        socket: Callable[[], ZmqSocket | None],
        released: Callable[[], int] | None = None,
    ) -> None:
        self.reactor = reactor
        self.store = store
        #: The highest sequence a snapshot may include (in a pair: what the passive holds).
        self._released = released or (lambda: self.store.last_sequence)
        self.config = config
        self._socket = socket
        self.streams: set[SnapshotStream] = set()
        self.per_client: Counter[bytes] = Counter()
        #: Answered completely, with a SYNCEND.
        self.served = 0
        #: The client went away before its SYNCEND.
        self.aborted = 0
        #: Abandoned: the client took nothing for ``snapshot_stall_timeout`` seconds.
        self.stalled = 0
        #: Requests that had to wait for a free slot (each counted once).
        self.queued = 0
        #: Requests dropped because the waiting queue was full (never answered).
        self.refused = 0
        #: Streams that ended on an error of the server's (logged), unanswered.
        self.failed = 0
        #: Streams and waiting requests an operator dropped (:meth:`drop_client`).
        self.dropped = 0
        #: SYNC and SYNCEND messages handed to ZeroMQ, by all streams.
        self.messages_sent = 0
        #: Attempts of blocked streams to send again.
        self.retries = 0
        self.waiting: deque[tuple[bytes, SnapshotRequest]] = deque()
        self._ready: deque[SnapshotStream] = deque()
        #: Blocked streams that were moving a moment ago: a signal wakes them.
        self._hot: set[SnapshotStream] = set()
        self._blocked: list[tuple[float, int, SnapshotStream]] = []
        self._order = itertools.count()
        self._run_call: DelayedCall | None = None
        self._retry_call: DelayedCall | None = None
        self._retry_at = 0.0
        self._memory = MemoryRelease(reactor, RELEASE_INTERVAL)
        self._notice = _Notice()
        self._stopped = False

    # -- requests ----------------------------------------------------------------------------

    def request(self, identity: bytes, request: SnapshotRequest) -> None:
        """A SYNCSTART arrived: start it, queue it, or refuse it."""
        if self._stopped:
            return
        if not self.waiting and self._admissible(identity):
            self._start(identity, request)
            return
        now = self.reactor.seconds()
        if len(self.waiting) < self.config.snapshot_queue:
            entry = (identity, request)
            self.waiting.append(entry)
            # Those ahead may wait for their own identity's streams, not for a free slot.
            self._admit_waiting()
            if not any(waiting is entry for waiting in self.waiting):
                return
            self.queued += 1
            self._notice(
                "queued",
                now,
                "{count} snapshot requests wait for a free stream ({active} running, "
                "limit {limit}, {per_client} per client)",
                active=len(self.streams),
                limit=self.config.max_snapshots,
                per_client=self.config.max_snapshots_per_client,
            )
            return
        self.refused += 1
        self._notice(
            "refused",
            now,
            "refused {count} snapshot requests: {waiting} already wait (client {peer})",
            waiting=len(self.waiting),
            peer=identity.hex()[:40],
        )

    def _admissible(self, identity: bytes) -> bool:
        config = self.config
        return (
            len(self.streams) < config.max_snapshots
            and self.per_client[identity] < config.max_snapshots_per_client
        )

    def _admit_waiting(self) -> None:
        waiting = self.waiting
        if not waiting:
            return
        skipped: list[tuple[bytes, SnapshotRequest]] = []
        while waiting and len(self.streams) < self.config.max_snapshots:
            entry = waiting.popleft()
            if self._admissible(entry[0]):
                self._start(*entry)
            else:
                skipped.append(entry)
        waiting.extendleft(reversed(skipped))

    def _start(self, identity: bytes, request: SnapshotRequest) -> None:
        stream = SnapshotStream(
            identity,
            request,
            self._released(),
            request.encoding or self.config.sequence_encoding,
            self.reactor.seconds(),
        )
        self.streams.add(stream)
        self.per_client[identity] += 1
        self._ready.append(stream)
        self._schedule_run()

    def _end(
        self,
        stream: SnapshotStream,
        outcome: Literal["served", "aborted", "stalled", "dropped", "failed"],
    ) -> None:
        stream.done = True
        stream.drop_ahead()
        self.streams.discard(stream)
        self._hot.discard(stream)
        left = self.per_client[stream.identity] - 1
        if left > 0:
            self.per_client[stream.identity] = left
        else:
            del self.per_client[stream.identity]
        now = self.reactor.seconds()
        if outcome == "served":
            self.served += 1
        elif outcome == "dropped":
            self.dropped += 1
        elif outcome == "failed":
            self.failed += 1
        elif outcome == "aborted":
            self.aborted += 1
            self._notice(
                "aborted",
                now,
                "{count} snapshot clients went away before the end (last {peer})",
                peer=stream.identity.hex()[:40],
            )
        else:
            self.stalled += 1
            self._notice(
                "stalled",
                now,
                "abandoned {count} snapshot streams whose clients took nothing for "
                "{timeout}s (last {peer}, after {sent} messages)",
                timeout=self.config.snapshot_stall_timeout,
                peer=stream.identity.hex()[:40],
                sent=stream.sent,
            )
        self._admit_waiting()
        if outcome != "served" or not self.streams:
            self._release_memory_soon()

    # -- the shared pump ---------------------------------------------------------------------

    def _schedule_run(self) -> None:
        if self._run_call is None and not self._stopped:
            self._run_call = self.reactor.callLater(0, self._run)

    def _run(self) -> None:
        """One turn: the streams that can send take turns within one chunk's budget."""
        self._run_call = None
        sock = self._socket()
        if sock is None or sock.closed:
            return
        config = self.config
        budget = MESSAGES_PER_TURN
        share_of_prepared = PREPARED_MESSAGES // max(len(self.streams), 1)
        chunk = max(KEEP_WHEN_BLOCKED, min(config.snapshot_chunk, share_of_prepared))
        syncend_current = config.syncend == "current"
        ready = self._ready
        visits = len(ready)
        while ready and visits > 0 and budget > 0:
            visits -= 1
            stream = ready.popleft()
            if stream.done:
                continue
            share = max(budget // max(len(ready) + 1, 1), 64)
            try:
                outcome, sent = stream.pump(sock, self.store, share, chunk, syncend_current)
            except Exception:
                # One stream's fault must not stop the others' turn (nor leave this one
                # running forever): it ends unanswered, and its client asks again.
                log.failure("a snapshot stream failed: its client asks again")
                self._end(stream, "failed")
                continue
            budget -= sent
            self.messages_sent += sent
            if sent:
                stream.last_progress = self.reactor.seconds()
            if outcome == "more":
                ready.append(stream)
            elif outcome == "blocked":
                if sent >= FAST_RETRY_MESSAGES:
                    # A client draining its pipe this fast may have room again by the
                    # next reactor turn.
                    ready.append(stream)
                else:
                    self._block(stream)
            elif outcome == "finished":
                self._end(stream, "served")
            elif outcome == "reading":
                self._await_rows(stream)
            else:
                self._end(stream, "aborted")
        if ready:
            self._schedule_run()

    def _await_rows(self, stream: SnapshotStream) -> None:
        """Ready again once its rows are in; a read that fails ends it unanswered (its
        client asks again)."""
        assert stream.reading is not None

        def ready(_: object) -> None:
            if not stream.done:
                self._ready.append(stream)
                self._schedule_run()

        def failed(failure: Any) -> None:
            if not stream.done:
                log.warn(
                    "a snapshot's read failed ({error}): its client asks again",
                    error=str(failure.value),
                )
                self._end(stream, "aborted")

        stream.reading.addCallbacks(ready, failed)

    def _block(self, stream: SnapshotStream) -> None:
        now = self.reactor.seconds()
        idle = now - stream.last_progress
        stream.delay = min(max(idle * BACKOFF, RETRY_DELAY), MAX_RETRY_DELAY)
        if idle >= SHRINK_AFTER:
            stream.shrink(KEEP_WHEN_BLOCKED)
        stream.due = due = now + stream.delay
        heapq.heappush(self._blocked, (due, next(self._order), stream))
        if idle <= HOT_WINDOW:
            self._hot.add(stream)
        self._schedule_retry(due)

    def writable(self) -> None:
        """The ROUTER's descriptor signalled, as it does when a client's full pipe
        drained to half: streams whose client took something in the last HOT_WINDOW try
        again now, without waiting for their timer (those stuck for longer keep it)."""
        hot = self._hot
        if not hot:
            return
        for stream in hot:
            if not stream.done and stream.due:
                stream.due = 0.0
                self._ready.append(stream)
        hot.clear()
        self._schedule_run()

    def _schedule_retry(self, due: float) -> None:
        call = self._retry_call
        if call is not None and call.active():
            if self._retry_at <= due:
                return
            call.cancel()
        self._retry_at = due
        self._retry_call = self.reactor.callLater(max(due - self.reactor.seconds(), 0), self._retry)

    def _retry(self) -> None:
        """Blocked streams whose delay is over try again (a bounded number per turn)."""
        self._retry_call = None
        now = self.reactor.seconds()
        timeout = self.config.snapshot_stall_timeout
        blocked = self._blocked
        moved = 0
        while blocked and blocked[0][0] <= now and moved < RETRIES_PER_TURN:
            due, _, stream = heapq.heappop(blocked)
            if stream.done or stream.due != due:
                continue  # ended, or already woken by a signal
            stream.due = 0.0
            self._hot.discard(stream)
            moved += 1
            self.retries += 1
            if timeout > 0 and now - stream.last_progress >= timeout:
                self._end(stream, "stalled")
                continue
            self._ready.append(stream)
        if moved:
            self._run()
        if blocked:
            self._schedule_retry(max(blocked[0][0], now))

    # -- memory ------------------------------------------------------------------------------

    def _release_memory_soon(self) -> None:
        """Streams that ended early leave freed pipes and chunks behind: hand the free
        memory back to the system (glibc keeps it otherwise), at most every few seconds."""
        self._memory.soon()

    def drop_client(self, identity: bytes) -> int:
        """End every snapshot stream of the client ``identity`` now and forget its waiting
        requests (an operator's action): it gets no SYNCEND, and its place goes to the
        next. Returns how many streams and requests were dropped."""
        streams = [stream for stream in self.streams if stream.identity == identity]
        kept = deque(entry for entry in self.waiting if entry[0] != identity)
        waiting = len(self.waiting) - len(kept)
        self.waiting = kept
        self.dropped += waiting
        for stream in streams:
            self._end(stream, "dropped")
        return len(streams) + waiting

    def clients(self, limit: int = 100) -> list[dict[str, Any]]:
        """The clients with a snapshot running or waiting (at most ``limit``, the longest
        running first): what an operator drops a stuck one by."""
        now = self.reactor.seconds()
        found: dict[bytes, dict[str, Any]] = {}
        for stream in sorted(self.streams, key=lambda s: s.started_at):
            entry = found.setdefault(
                stream.identity,
                {
                    "client": stream.identity.hex(),
                    "streams": 0,
                    "sent": 0,
                    "running_s": round(now - stream.started_at, 3),
                    "idle_s": 0.0,
                    "waiting": 0,
                },
            )
            entry["streams"] += 1
            entry["sent"] += stream.sent
            entry["idle_s"] = max(entry["idle_s"], round(now - stream.last_progress, 3))
        for identity, _ in self.waiting:
            entry = found.setdefault(
                identity,
                {
                    "client": identity.hex(),
                    "streams": 0,
                    "sent": 0,
                    "running_s": 0.0,
                    "idle_s": 0.0,
                    "waiting": 0,
                },
            )
            entry["waiting"] += 1
        return list(found.values())[:limit]

    def client_left(self) -> None:
        """A snapshot client disconnected: its pipe's memory is free now."""
        self._release_memory_soon()

    # -- what it says ------------------------------------------------------------------------

    def status(self) -> dict[str, int]:
        """The counters in ``/status`` (and status.json), as kept."""
        return {
            "snapshots_served": self.served,
            "snapshots_aborted": self.aborted,
            "snapshots_stalled": self.stalled,
            "snapshots_queued": self.queued,
            "snapshots_refused": self.refused,
            "snapshots_active": len(self.streams),
            "snapshots_waiting": len(self.waiting),
            "snapshots_dropped": self.dropped,
            "snapshots_failed": self.failed,
            "snapshot_messages_sent": self.messages_sent,
        }

    def metrics(self) -> list[Metric]:
        """The counters above as Prometheus families (see :mod:`bus.web.server`)."""
        return [
            counter("eventbus_snapshots_served", "Snapshots streamed whole", self.served),
            counter("eventbus_snapshots_aborted", "Snapshots whose client went away", self.aborted),
            gauge("eventbus_snapshots_active", "Snapshots being streamed", len(self.streams)),
            gauge(
                "eventbus_snapshots_waiting",
                "SYNCSTARTs queued for a free stream",
                len(self.waiting),
            ),
            counter(
                "eventbus_snapshots_stalled",
                "Snapshots abandoned because their client stopped reading",
                self.stalled,
            ),
            counter(
                "eventbus_snapshots_refused",
                "SYNCSTARTs dropped unanswered with the queue full",
                self.refused,
            ),
            counter(
                "eventbus_snapshots_dropped",
                "Snapshot streams and waiting requests an operator dropped",
                self.dropped,
            ),
            counter(
                "eventbus_snapshots_failed",
                "Snapshot streams ended unanswered by an error of the server's (logged)",
                self.failed,
            ),
            counter(
                "eventbus_snapshot_messages_sent",
                "SYNC and SYNCEND messages sent",
                self.messages_sent,
            ),
        ]

    # -- lifecycle ---------------------------------------------------------------------------

    def abandon_all(self) -> None:
        """End every stream and forget queued requests (a server that stopped being the
        active of its pair): their clients see no SYNCEND and ask again elsewhere."""
        self.aborted += len(self.streams)
        self._forget_all()

    def _forget_all(self) -> None:
        for stream in self.streams:
            stream.done = True
            stream.drop_ahead()
        self.streams.clear()
        self.per_client.clear()
        self.waiting.clear()
        self._ready.clear()
        self._blocked.clear()
        self._hot.clear()

    def stop(self) -> None:
        """Cancel the turns and retries, and forget every stream."""
        self._stopped = True
        for call in (self._run_call, self._retry_call):
            if call is not None and call.active():
                call.cancel()
        self._run_call = self._retry_call = None
        self._memory.stop()
        self._forget_all()
