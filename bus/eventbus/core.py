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

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Generic, Protocol, TypeVar

from twisted.logger import Logger

from bus.eventbus import codec, rights
from bus.eventbus.codec import EventBusError, EventFields
from bus.eventbus.eventlog import EventLog, PairLog
from bus.eventbus.pair_core import Change
from bus.eventbus.rights import Subtrees
from bus.extension import StorageError
from bus.util.droplog import DropCounter

#: A key's publish subtrees (None: every topic) by its Z85 User-Id.
PublishRights = Callable[[str], Subtrees]

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


@dataclass(frozen=True, slots=True)
class Broadcast:
    """A batch clients may see now: ``fields`` under ``first``, ``first + 1``, ..."""

    first: int
    fields: list[EventFields]


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
        self.max_data_bytes = max_data_bytes
        self.clock = clock
        self.local_limit = local_limit
        self.drops = DropCounter(logger, "message", clock)
        #: With publish rights in force: each PUB's key's subtrees (None: no check).
        self.publish_rights: PublishRights | None = None
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

    def accept(self, fields: list[EventFields]) -> None:
        """Take a batch of valid events, to be stored and broadcast in order."""
        raise NotImplementedError

    def backlog(self) -> int:
        """Accepted events not yet in the log."""
        raise NotImplementedError

    def take_broadcasts(self) -> list[Broadcast]:
        """What to broadcast now, in order (and forget it)."""
        broadcasts, self.broadcasts = self.broadcasts, []
        return broadcasts

    # -- in --------------------------------------------------------------------------------

    def collect(self, batch: list[list[bytes]], user_ids: list[str] | None = None) -> None:
        """A batch read from the collector: ``[identity, *PUB frames]`` each, and with
        publish rights in force each message's User-Id (its CURVE key)."""
        if self.publish_rights is not None:
            batch = self._permitted(batch, user_ids or [])
        parse = codec.parse_pub_fields
        max_data = self.max_data_bytes
        accepted: list[EventFields] = []
        for frames in batch:
            body = frames[1:]
            if len(body) == 7 and not body[0]:
                body = body[1:]  # a REQ-style empty delimiter
            try:
                accepted.append(parse(body, max_data))
            except EventBusError as error:
                self.drops.drop(error.reason, str(error), frames[0])
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

    def flush_local(self) -> None:
        """Accept the events of this process queued by :meth:`publish_local`."""
        batch, self.local = self.local, []
        if batch:
            self.local_accepted += len(batch)
            self.accept(batch)


class EventBusCore(Intake, Generic[L]):
    """What the bus accepts, stores and broadcasts (see the module's text)."""

    def __init__(
        self,
        log: L,
        *,
        max_data_bytes: int,
        clock: Callable[[], float],
        logger: Logger,
        local_limit: int = 200_000,
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

    # -- store, then broadcast ---------------------------------------------------------------

    def backlog(self) -> int:
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

    def retry_waiting(self) -> bool:
        """Try the waiting events once more; True once they are stored (and broadcast)."""
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
