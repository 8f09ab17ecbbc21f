"""The Event BUS's rules for what comes in and what goes out, sans I/O.

:class:`EventBusCore` takes PUB batches (each message with its key's publish rights, when
rights apply), events made in this process, the pair's verdicts and the time, and decides:
what is dropped (counted by reason), what is stored in the log (an :class:`EventLog`),
what waits while the log refuses, and what is broadcast, in order, once clients may see
it (:attr:`EventBusCore.broadcasts`, taken by the service). No socket, no timer, no
reactor: the service (:mod:`bus.eventbus.server`) reads sockets into it, sends what it
produced, pauses the collector while :attr:`EventBusCore.collector_paused` says so, and
retries on its own timer.

Store, then broadcast: nothing is broadcast before the commit that makes it durable, so a
subscriber never sees an event a crash could take back. In a pair, the passive gets each
batch first and it is released when the pair says clients may see it.

The pair (:class:`bus.eventbus.pair.Pair`) talks to the core, never to the service: it
hands over forwarded events, releases, holds the collector, turns this server active or
passive and replaces the log (:class:`bus.eventbus.pair.PairHost`). What that changes
for the service (a turn to act on, broadcasts) waits in :attr:`EventBusCore.turns` and
:attr:`EventBusCore.broadcasts`, and :attr:`EventBusCore.woken` tells the service to
take it.
"""

from __future__ import annotations

import uuid
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from functools import partial
from typing import Any, Generic, Protocol, TypeVar

import msgpack
from twisted.logger import Logger

from bus.eventbus import codec, rights
from bus.eventbus.codec import EventBusError, EventFields, SnapshotRequest
from bus.eventbus.config import EventBusConfig
from bus.eventbus.eventlog import EventLog, PairLog
from bus.eventbus.pair_core import Change
from bus.eventbus.rights import Subtrees
from bus.extension import Metric, StorageError, counter, counters_by, gauge
from bus.util.droplog import DropCounter, RateLimit

#: A key's subtrees for one right (None: every topic) by its Z85 User-Id.
PublishRights = Callable[[str], Subtrees]


class RightsOf(Protocol):
    """The allow-list's lookup (:meth:`bus.transport.security.ServerCurve.rights`)."""

    def __call__(self, user_id: str, read: Callable[[Mapping[str, str]], Subtrees]) -> Subtrees:
        """``read(metadata)`` of the certificate of the key behind ``user_id``."""
        ...


#: SYNCSTARTs a server that does not serve holds, at most (the oldest go first).
HELD_REQUESTS = 1024

#: The log a core stores into: any :class:`EventLog`; a paired core's is a :class:`PairLog`.
L = TypeVar("L", bound=EventLog)


class PairRelease(Protocol):
    """What the core asks of the pair (:class:`bus.eventbus.pair.Pair`), when there is one."""

    def stores(self) -> bool:
        """Whether this server stores what it collects (the active)."""
        ...

    def forward(self, fields: list[EventFields]) -> None:
        """Hand what a passive collected to the active (or hold it for whoever becomes it)."""
        ...

    def appended(self, first: int, fields: list[EventFields]) -> None:
        """The active stored a batch: the passive gets it."""
        ...

    def release_limit(self) -> int:
        """The highest sequence clients may see now."""
        ...

    def take_held(self) -> list[EventFields]:
        """What publishers handed this server while it was not active (and forget it)."""
        ...

    def serves(self) -> bool:
        """Whether this server serves clients now (the active)."""
        ...

    def vote(self) -> None:
        """A client turned to this server."""
        ...


@dataclass(frozen=True, slots=True)
class Broadcast:
    """A batch clients may see now: ``fields`` under ``first``, ``first + 1``, ..."""

    first: int
    fields: list[EventFields]


#: Told each batch of events as it is broadcast: its first sequence and the events' fields.
Watcher = Callable[[int, list[EventFields]], None]


class Watchers:
    """Who in this process is told every batch broadcast, with no socket (the console's
    topic tail). A watcher must be quick: it runs on the broadcast path."""

    def __init__(self, logger: Logger) -> None:
        self.logger = logger
        self.watchers: list[Watcher] = []

    def watch(self, watcher: Watcher) -> Callable[[], None]:
        """Call ``watcher(first_sequence, fields)`` with every batch as it is broadcast;
        returns the function that stops it."""
        self.watchers.append(watcher)

        def unwatch() -> None:
            if watcher in self.watchers:
                self.watchers.remove(watcher)

        return unwatch

    def tell(self, batch: Broadcast) -> None:
        """Tell every watcher of ``batch`` (a watcher's bug does not stop the broadcast)."""
        for watcher in list(self.watchers):
            try:
                watcher(batch.first, batch.fields)
            except Exception:
                self.logger.failure("a watcher of the broadcast failed")


@dataclass(frozen=True, slots=True)
class Turn:
    """The pair turned this server ``active`` or ``passive``; ``released``: the highest
    sequence clients could see at the turn (what its first heartbeat says, before the
    events it held are stored and broadcast)."""

    state: str
    released: int


class Intake:
    """What comes in, whatever keeps the log: PUB batches parsed and checked against their
    keys' rights (drops counted by reason), events made in this process queued as one
    batch. Each accepted batch goes to :meth:`accept`, which a subclass defines."""

    def __init__(
        self,
        *,
        max_data_bytes: int,
        clock: Callable[[], float],
        logger: Logger,
        local_limit: int = 200_000,
    ) -> None:
        self.logger = logger
        #: PUBs parsed a batch at a time, with what it found valid remembered.
        self.pubs = codec.PubParser(max_data_bytes)
        self.clock = clock
        self.local_limit = local_limit
        self.drops = DropCounter(logger, "message", clock)
        #: With publish rights in force: each PUB's key's subtrees (None: no check).
        self.publish_rights: PublishRights | None = None
        #: What each key may receive, live and in snapshots (with an allow-list: the
        #: service sets it); wider subscriptions and SYNCSTARTs are narrowed to it.
        self.subscribe_rights: PublishRights = lambda user_id: rights.EVERYTHING
        #: What clients may see now, in order; the service takes it (:meth:`take_broadcasts`).
        self.broadcasts: list[Broadcast] = []
        #: Events made in this process (composed services' activity), stored as one batch.
        self.local: list[EventFields] = []
        #: When the log began refusing (for the line that says it writes again).
        self.blocked_since = 0.0
        #: Why the log last refused, until a write succeeds again.
        self.storage_error: str | None = None
        # Counters, kept as work happens.
        self.accepted = 0
        self.bytes_accepted = 0
        self.local_accepted = 0
        #: Events refused by the log, each counted once however many retries it took.
        self.refused_storage = 0
        #: Failed appends (each attempt).
        self.append_failures = 0
        #: Subscriptions and SYNCSTARTs wider than their key's rights, narrowed to them.
        self.narrowed_subscriptions = 0
        self.narrowed_snapshots = 0

    @property
    def max_data_bytes(self) -> int:
        """The most bytes of an event's data."""
        return self.pubs.max_data_bytes

    @max_data_bytes.setter
    def max_data_bytes(self, limit: int) -> None:
        self.pubs.max_data_bytes = limit

    def accept(self, fields: list[EventFields]) -> None:
        """Take a batch of valid events, to be stored and broadcast in order."""
        raise NotImplementedError

    def backlog(self) -> int:
        """Accepted events not yet in the log."""
        raise NotImplementedError

    @property
    def collector_paused(self) -> bool:
        """True while the collector must not be read (a subclass says when)."""
        raise NotImplementedError

    def take_broadcasts(self) -> list[Broadcast]:
        """What to broadcast now, in order (and forget it)."""
        broadcasts, self.broadcasts = self.broadcasts, []
        return broadcasts

    # -- in --------------------------------------------------------------------------------

    def use_rights(self, rights_of: RightsOf, *, check_publish: bool) -> None:
        """Take each key's rights from ``rights_of`` (the allow-list, read again): what it
        may receive always, what it may publish only when ``check_publish`` (some
        certificate names ``publish``: checking costs a lookup per PUB)."""
        publish = partial(rights_of, read=rights.publish_subtrees)
        self.publish_rights = publish if check_publish else None
        self.subscribe_rights = partial(rights_of, read=rights.subscribe_subtrees)

    def collect(self, batch: list[list[bytes]], user_ids: list[str] | None = None) -> None:
        """A batch read from the collector: ``[identity, *PUB frames]`` each, and with
        publish rights in force each message's User-Id (its CURVE key)."""
        if self.publish_rights is not None:
            batch = self._permitted(batch, user_ids or [])
        accepted, refused = self.pubs.parse_batch(batch)
        for identity, error in refused:
            self.drops.drop(error.reason, str(error), identity)
        if accepted:
            self.accept(accepted)

    def _permitted(self, batch: list[list[bytes]], user_ids: list[str]) -> list[list[bytes]]:
        """The PUBs whose keys may publish their topics; the others dropped and counted
        (the spec gives the collector no answer). A PUB without a key is not let through."""
        assert self.publish_rights is not None
        permitted = []
        for index, frames in enumerate(batch):
            user_id = user_ids[index] if index < len(user_ids) else ""
            if not user_id:
                self.drops.drop("forbidden-topic", "a PUB without a key", frames[0])
                continue
            allowed = self.publish_rights(user_id)
            if allowed is not None:
                body = frames[1:]
                topic = body[1] if len(body) == 7 and not body[0] else body[0] if body else b""
                if not rights.may_publish(topic, allowed):
                    self.drops.drop(
                        "forbidden-topic",
                        f"key {user_id} may not publish {topic[:80]!r}",
                        frames[0],
                    )
                    continue
            permitted.append(frames)
        return permitted

    def publish_local(self, fields: EventFields) -> bool:
        """Queue an event made in this process; True when it is the first of a new batch
        (the service flushes it on the next reactor turn, :meth:`flush_local`)."""
        if len(self.local) + self.backlog() >= self.local_limit:
            # The log is refusing (or far behind): never hold more than the collector would.
            self.drops.drop("local-overflow", "in-process activity queue full", b"local")
            return False
        self.local.append(fields)
        return len(self.local) == 1

    def publish_activity(self, producer: bytes, topic: str, value: object) -> bool:
        """Queue ``value`` (anything msgpack encodes) under ``topic`` as an event made in
        this process by ``producer``, checked as a PUB would be (ValueError if it cannot
        be one); True as :meth:`publish_local` says it."""
        topic_bytes = topic.encode("utf-8")
        try:
            data = msgpack.packb(value, use_bin_type=True)
            codec.check_topic(topic_bytes)
            codec.check_payload(data, self.max_data_bytes)
        except (EventBusError, TypeError) as error:
            raise ValueError(f"cannot publish to {topic!r}: {error}") from None
        event_id = str(uuid.uuid4()).encode("ascii")
        return self.publish_local((topic_bytes, producer, codec.iso_timestamp(), event_id, data))

    def flush_local(self) -> None:
        """Accept the events of this process queued by :meth:`publish_local`."""
        batch, self.local = self.local, []
        if batch:
            self.local_accepted += len(batch)
            self.accept(batch)

    # -- the publisher and snapshot ports: what a key may receive --------------------------------

    def subscription(self, message: bytes, user_id: str) -> tuple[bool, list[bytes]] | None:
        """An XPUB subscription message from ``user_id``'s key: whether it subscribes
        (else unsubscribes), and the prefixes it comes to within the key's rights; None
        for a message that is neither."""
        if not message or message[0] not in (0, 1):
            return None
        wanted = message[1:]
        prefixes = rights.narrow(wanted, self.subscribe_rights(user_id))
        if prefixes != [wanted]:
            self.narrowed_subscriptions += 1
        return message[0] == 1, prefixes

    def snapshot_request(self, frames: list[bytes], user_id: str | None) -> SnapshotRequest | None:
        """A SYNCSTART read from the snapshot port (``[identity, *frames]``), narrowed to
        what its key may receive when rights apply (``user_id``), to answer now; None for
        a malformed one (dropped, counted)."""
        try:
            request = codec.parse_sync_start(frames[1:])
        except EventBusError as error:
            self.drops.drop(error.reason, str(error), frames[0])
            return None
        if user_id is None:
            return request
        subtrees = rights.narrow_snapshot(request.subtrees, self.subscribe_rights(user_id))
        if subtrees == request.subtrees:
            return request
        self.narrowed_snapshots += 1
        return replace(request, subtrees=subtrees)

    # -- what it says --------------------------------------------------------------------------

    def status(self) -> dict[str, Any]:
        """The counters in ``/status`` (and status.json), as kept."""
        return {
            "accepted": self.accepted,
            "accepted_bytes": self.bytes_accepted,
            "accepted_local": self.local_accepted,
            "dropped": dict(self.drops.counts),
            "refused_storage": self.refused_storage,
            "storage_error": self.storage_error,
            "collector_paused": self.collector_paused,
        }

    def metrics(self) -> list[Metric]:
        """The counters above as Prometheus families (see :mod:`bus.web.server`)."""
        return [
            counter("eventbus_events_accepted", "Events stored and broadcast", self.accepted),
            counter(
                "eventbus_event_bytes_accepted",
                "Event data bytes stored and broadcast",
                self.bytes_accepted,
            ),
            counter(
                "eventbus_events_local",
                "Events published in-process by composed services",
                self.local_accepted,
            ),
            counters_by(
                "eventbus_messages_dropped",
                "Bad messages dropped, by reason",
                "reason",
                self.drops.counts,
            ),
            counter(
                "eventbus_events_refused_storage",
                "Events the store refused (full disk, I/O error); each waits and is stored later",
                self.refused_storage,
            ),
            gauge(
                "eventbus_collector_paused",
                "1 while refused events wait for the store and the collector is not read",
                float(self.collector_paused),
            ),
        ]


class EventBusCore(Intake, Generic[L]):
    """What the bus accepts, stores and broadcasts (see the module's text)."""

    @classmethod
    def of_bus(
        cls, log: L, settings: EventBusConfig, *, clock: Callable[[], float], logger: Logger
    ) -> EventBusCore[L]:
        """The core of a bus that ``settings`` describe, storing into ``log``."""
        return cls(
            log,
            max_data_bytes=settings.max_data_bytes,
            clock=clock,
            logger=logger,
            local_limit=settings.collector_hwm,
            retry_min=settings.storage_retry_min,
            retry_max=settings.storage_retry_max,
        )

    def __init__(
        self,
        log: L,
        *,
        max_data_bytes: int,
        clock: Callable[[], float],
        logger: Logger,
        local_limit: int = 200_000,
        retry_min: float = 0.5,
        retry_max: float = 5.0,
    ) -> None:
        super().__init__(
            max_data_bytes=max_data_bytes, clock=clock, logger=logger, local_limit=local_limit
        )
        self.log: L = log
        #: Half of a primary/backup pair (None: a server alone).
        self.pair: PairRelease | None = None
        #: The pair's turns the service has not acted on yet, in order (:meth:`take_turns`).
        self.turns: list[Turn] = []
        #: The pair holds the collector: it has more events to forward than it may hold.
        self.pair_holds_collector = False
        #: Called after the pair changed something the service acts on (set by the service).
        self.woken: Callable[[], None] = lambda: None
        #: The highest sequence clients may see (broadcast, in snapshots, in heartbeats):
        #: in a pair with sync replication, only what the passive has stored.
        self.released = log.last_sequence
        #: Stored in a pair, not yet released: (first sequence, fields), in order.
        self.unreleased: deque[tuple[int, list[EventFields]]] = deque()
        #: Events that arrived while the log could not write them, in order.
        self.waiting: list[EventFields] = []
        #: How long the service waits before it retries them: ``retry_min``, doubling up
        #: to ``retry_max`` while the log refuses (:meth:`next_retry`).
        self.retry_min, self.retry_max = retry_min, retry_max
        self.retry_delay = retry_min
        self._reports = RateLimit(clock)
        #: SYNCSTARTs that reached this server while it did not serve: (when, identity,
        #: request), answered if it takes over soon enough (:meth:`take_held_requests`).
        self.held_requests: deque[tuple[float, bytes, SnapshotRequest]] = deque(
            maxlen=HELD_REQUESTS
        )

    # -- store, then broadcast ---------------------------------------------------------------

    def backlog(self) -> int:
        """Accepted events not yet in the log: those waiting while it refuses."""
        return len(self.waiting)

    @property
    def collector_paused(self) -> bool:
        """True while refused events wait for the log, or while the pair has more events
        to forward than it may hold: the collector is not read."""
        return bool(self.waiting) or self.pair_holds_collector

    def accept(self, fields: list[EventFields]) -> None:
        """Store then broadcast; when the log refuses, the events wait (in order) and
        :attr:`collector_paused` says the collector must not be read until they are stored."""
        pair = self.pair
        if pair is not None and not pair.stores():
            pair.forward(fields)  # to the active, or held for whoever becomes it
            return
        if self.waiting:
            # Read before the pause took effect: behind the refused ones, in order.
            self.waiting.extend(fields)
            self.refused_storage += len(fields)
            return
        try:
            self._store_and_broadcast(fields)
        except StorageError as error:
            self.waiting = fields
            self.refused_storage += len(fields)
            self.blocked_since = self.clock()
            self._refused(error)

    def next_retry(self) -> float:
        """The log refused the waiting events (again): say so, in one error line at most
        every ten seconds, and return how long to wait before :meth:`retry_waiting`."""
        failures = self._reports.due("append")
        if failures is not None:
            self.logger.error(
                "event log {path} cannot write ({error}): collector paused, {waiting} events "
                "waiting; retrying ({failures} failed attempts since the last report)",
                path=str(self.log.path),
                error=self.storage_error,
                waiting=len(self.waiting),
                failures=failures,
            )
        delay = self.retry_delay
        self.retry_delay = min(delay * 2, self.retry_max)
        return delay

    def retry_waiting(self) -> bool:
        """Try the waiting events once more; True once they are stored (and broadcast),
        which one line says, and the next refusal is retried soon and reported at once."""
        waiting = self.waiting
        if not waiting:
            return True
        try:
            self._store_and_broadcast(waiting)
        except StorageError as error:
            self._refused(error)
            return False
        self.waiting = []
        self.storage_error = None
        self.retry_delay = self.retry_min
        self._reports.reset("append")
        self.logger.info(
            "event log {path} writes again after {seconds:.1f}s: stored {count} waiting "
            "events; collector resumed",
            path=str(self.log.path),
            seconds=self.clock() - self.blocked_since,
            count=len(waiting),
        )
        return True

    def _refused(self, error: StorageError) -> None:
        self.append_failures += 1
        self.storage_error = str(error)

    def _store_and_broadcast(self, fields: list[EventFields]) -> None:
        # Committed before anything is broadcast. A StorageError leaves the log unchanged.
        first = self.log.append_fields(fields, self.clock())
        self.accepted += len(fields)
        self.bytes_accepted += sum(len(event[4]) for event in fields)
        pair = self.pair
        if pair is None:
            self.released = first + len(fields) - 1
            self.broadcasts.append(Broadcast(first, fields))
            return
        # In a pair the passive gets the batch first; it is released once it may be.
        pair.appended(first, fields)
        self.unreleased.append((first, fields))
        self.release()

    def release(self) -> None:
        """Release what the pair allows now (everything unpaired; with sync replication,
        what the passive acknowledged)."""
        pair = self.pair
        unreleased = self.unreleased
        if pair is None or not unreleased:
            return
        limit = pair.release_limit()
        while unreleased:
            first, fields = unreleased[0]
            count = min(len(fields), limit - first + 1)
            if count <= 0:
                break
            if count < len(fields):
                unreleased[0] = (first + count, fields[count:])
                fields = fields[:count]
            else:
                unreleased.popleft()
            self.broadcasts.append(Broadcast(first, fields))
            self.released = first + count - 1

    # -- SYNCSTARTs while the pair does not serve -------------------------------------------------

    def snapshot_request(self, frames: list[bytes], user_id: str | None) -> SnapshotRequest | None:
        """As :meth:`Intake.snapshot_request`; in a pair that does not serve now, the
        request is held instead and counts as a client's vote (it turned here)."""
        request = super().snapshot_request(frames, user_id)
        pair = self.pair
        if request is None or pair is None or pair.serves():
            return request
        # Held before the vote: a vote that makes this server active answers it at once.
        self.held_requests.append((self.clock(), frames[0], request))
        pair.vote()
        return None

    def take_held_requests(self, max_age: float) -> list[tuple[bytes, SnapshotRequest]]:
        """The held SYNCSTARTs at most ``max_age`` seconds old (their clients still wait),
        to answer now that this server serves; the others are forgotten too."""
        now = self.clock()
        held, self.held_requests = self.held_requests, deque(maxlen=HELD_REQUESTS)
        return [(identity, request) for at, identity, request in held if now - at <= max_age]

    def take_turns(self) -> list[Turn]:
        """The pair's turns to act on, in order (and forget them); act on them before
        broadcasting what :meth:`take_broadcasts` gives."""
        turns, self.turns = self.turns, []
        return turns

    # -- what the pair asks (bus.eventbus.pair.PairHost) ----------------------------------------

    def pair_changed(self, change: Change) -> None:
        """The pair turned this server active (it serves) or passive (it does not)."""
        if change.new == "active":
            if change.old != "doubt":
                # What it stored unreleased as a passive is its own to release.
                self.unreleased.clear()
                self.released = self.log.last_sequence
            self.turns.append(Turn("active", self.released))
            assert self.pair is not None
            held = self.pair.take_held()
            self.pair_holds_collector = False
            if held:
                self.accept(held)
        elif change.new == "passive":
            # What was stored but not released may be dropped when rejoining.
            self.unreleased.clear()
            self.turns.append(Turn("passive", self.released))
        self.woken()

    def accept_forwarded(self, fields: list[EventFields]) -> None:
        """Events the passive collected, for this active to store and broadcast."""
        self.accept(fields)
        self.woken()

    def pair_release(self) -> None:
        """The passive acknowledged more: release what the pair allows now."""
        self.release()
        self.woken()

    def hold_collector(self, held: bool) -> None:
        """The pair holds as many events as it may (True), or handed them over (False)."""
        self.pair_holds_collector = held
        self.woken()

    def replace_log(self: EventBusCore[PairLog], store_id: str) -> None:
        """A passive whose log is another bus's: keep it aside, take a new empty one
        under the active's store id (raises StorageError)."""
        old = self.log
        self.log = old.set_aside(store_id)
        self.logger.warn(
            "pair: this log ({old}) is not the active's ({new}): kept aside as {aside}; "
            "copying the active's log into a new one",
            old=old.store_id,
            new=store_id,
            aside=str(old.path),
        )
        self.woken()
