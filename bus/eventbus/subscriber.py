"""The subscriber's state machine, sans-I/O: what to deliver and when to ask for a snapshot.

The Clone pattern: subscribe first, ask for a snapshot (SYNCSTART) above the last
sequence held, apply SYNCs, then apply live BROADCASTs above the SYNCEND, discarding
stale ones. On top of the text:

* full-feed subscribers (no subtree filter) see every sequence, so a jump in the
  sequence, or a heartbeat announcing a sequence not received (tail loss), is a gap,
  healed at once with a SYNCSTART from the last sequence held;
* a heartbeat names the store (its log's identity): a different store, after a
  failover to a server with a log of its own, means a new sequence space, so the
  subscriber starts over from that log's beginning (at-least-once across stores);
* subtree subscribers cannot tell a gap from other topics' events, so they reconcile:
  at most every ``reconcile_interval`` seconds, when a heartbeat shows the bus has
  moved on, they ask for a snapshot above the last *verified* sequence and deliver
  only what they had not seen (a healed event may then arrive after later ones; its
  ``sequence`` tells its place).

Time is injected (``now`` arguments); the I/O side lives in ``bus.eventbus.client``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from bus.eventbus.codec import Event, Heartbeat, SnapshotEnd

Deliver = Callable[[Event], object]
RequestSnapshot = Callable[[int], object]

#: Broadcasts kept while a snapshot is in flight; beyond this the snapshot is re-asked.
MAX_BUFFERED = 200_000
#: Sequences a subtree subscriber remembers above its verified point before it reconciles.
MAX_UNVERIFIED = 500_000
#: The longest a subscriber waits for an answer to a snapshot request before asking again.
MAX_SNAPSHOT_PATIENCE = 60.0


def snapshot_patience(base: float, retries: int, cap: float = MAX_SNAPSHOT_PATIENCE) -> float:
    """How long to wait for a snapshot's first (or next) message after ``retries``
    requests in a row went unanswered: ``base`` doubled each time, up to ``cap``. A busy
    server may queue or refuse a request without an answer; backing off keeps many
    clients from asking it again all at once."""
    return min(base * (1 << min(retries, 32)), max(cap, base))


@dataclass
class SubscriberStats:
    """What a subscriber counted: delivered, stale and healed events, gaps, snapshots, store
    changes."""

    delivered: int = 0
    stale: int = 0
    gaps: int = 0
    healed_events: int = 0
    snapshots: int = 0
    reconciles: int = 0
    store_changes: int = 0


@dataclass
class SubscriberCore:
    """Feed it decoded messages; it calls ``deliver`` and ``request_snapshot``."""

    deliver: Deliver
    request_snapshot: RequestSnapshot
    full_feed: bool
    last: int = 0
    reconcile_interval: float = 5.0
    stats: SubscriberStats = field(default_factory=SubscriberStats)
    syncing: bool = False
    awaiting_heartbeat: bool = False
    store_id: str | None = None
    #: The highest sequence the server has announced (heartbeats and broadcasts).
    server_sequence: int = 0
    _verified: int = 0
    _seen_above_verified: set[int] = field(default_factory=set)
    _buffer: list[Event] = field(default_factory=list)
    _overflow: bool = False
    _healing: bool = False
    _last_reconcile: float = 0.0
    _check_next_beat: bool = False
    _snapshot_since: int = 0
    #: Requests asked again in a row without an answer (reset by any SYNC or SYNCEND).
    snapshot_retries: int = 0
    #: Take nothing stored before the first heartbeat: start at the sequence it announces
    #: (a confirming publisher wants what is stored from now on, not the history).
    from_head: bool = False

    def __post_init__(self) -> None:
        self._verified = self.last

    @property
    def verified(self) -> int:
        """Every event of the subscription up to this sequence has been delivered."""
        return self.last if self.full_feed else self._verified

    def start(self, now: float, wait_for_heartbeat: bool = True) -> None:
        """(Re)start: ask for everything above what is held, e.g. after a failover.

        With ``wait_for_heartbeat`` the request waits for the server's first heartbeat,
        which proves the subscription is live and names the store. Without it the
        request goes at once, and the first heartbeat after the snapshot is checked
        instead: whatever it shows beyond what is held is asked for then. The caller must make sure answers to an
        earlier request cannot arrive after this one (the client opens a fresh
        snapshot socket for every request)."""
        self._buffer.clear()
        self._overflow = False
        self._last_reconcile = now
        self._check_next_beat = True
        if wait_for_heartbeat:
            self.syncing = True
            self.awaiting_heartbeat = True
            return
        self._ask(self.verified)

    def proceed_without_heartbeat(self) -> None:
        """The server sent no heartbeat in time (heartbeats off?): ask anyway."""
        if self.awaiting_heartbeat:
            self.awaiting_heartbeat = False
            self._ask(self.verified)

    def retry_snapshot(self) -> None:
        """Ask again for the snapshot in flight (its request or answer was lost, or the
        server refused or abandoned it)."""
        self.snapshot_retries += 1
        self._ask(self._snapshot_since)

    def _ask(self, since: int) -> None:
        self.syncing = True
        self._snapshot_since = since
        self.stats.snapshots += 1
        self.request_snapshot(since)

    # -- messages ------------------------------------------------------------------------

    def on_broadcast(self, event: Event) -> None:
        """A live event: delivered now, buffered while a snapshot runs, or a gap that asks for
        one."""
        if event.sequence > self.server_sequence:
            self.server_sequence = event.sequence
        if self.syncing:
            if len(self._buffer) < MAX_BUFFERED:
                self._buffer.append(event)
            else:
                self._overflow = True
            return
        self._apply_live(event)

    def _apply_live(self, event: Event) -> None:
        sequence = event.sequence
        if sequence <= self.last:
            self.stats.stale += 1
            return
        if self.full_feed and sequence != self.last + 1:
            self.stats.gaps += 1
            self._healing = True
            self._buffer.append(event)
            self._ask(self.last)
            return
        self._deliver(event)

    def _deliver(self, event: Event) -> None:
        self.last = max(self.last, event.sequence)
        self.stats.delivered += 1
        self.deliver(event)
        if not self.full_feed:
            seen = self._seen_above_verified
            seen.add(event.sequence)
            if len(seen) > MAX_UNVERIFIED and not self.syncing:
                # No heartbeat moved the verified point on (heartbeats off?): reconcile
                # now, which also bounds this set.
                self.stats.reconciles += 1
                self._ask(self._verified)

    def on_sync(self, event: Event) -> None:
        """An event of the snapshot asked for: delivered unless already seen."""
        self.snapshot_retries = 0
        sequence = event.sequence
        if sequence <= self._snapshot_since:
            self.stats.stale += 1
            return
        if self.full_feed:
            if sequence <= self.last:
                self.stats.stale += 1
                return
        elif sequence in self._seen_above_verified or sequence <= self._verified:
            self.stats.stale += 1
            return
        if self._healing:
            self.stats.healed_events += 1
        self._deliver(event)

    def on_sync_end(self, end: SnapshotEnd) -> None:
        """The snapshot is complete: apply the live events buffered meanwhile, in order."""
        self.snapshot_retries = 0
        if not self.syncing:
            return
        self.syncing = False
        self._healing = False
        self.last = max(self.last, end.sequence)
        if end.sequence > self._verified:
            self._verified = end.sequence
            self._seen_above_verified = {s for s in self._seen_above_verified if s > end.sequence}
        buffered, self._buffer = sorted(self._buffer, key=lambda e: e.sequence), []
        if self._overflow:
            self._overflow = False
            self._ask(self.verified)
            return
        for index, event in enumerate(buffered):
            self._apply_live(event)
            if self.syncing:  # a new gap: keep the rest for after that snapshot
                self._buffer.extend(buffered[index + 1 :])
                return

    def on_heartbeat(self, beat: Heartbeat, now: float) -> None:
        """The server's beat: its sequence (a tail loss asks for a snapshot) and its store (another
        store starts over)."""
        if self.store_id != beat.store_id:
            changed = self.store_id is not None
            self.store_id = beat.store_id
            if changed:
                # Another log (e.g. a backup server with its own store): its sequences
                # say nothing about ours, so start over from its beginning.
                self.stats.store_changes += 1
                self.last = self._verified = self.server_sequence = 0
                self._seen_above_verified.clear()
                if not self.awaiting_heartbeat:
                    self.start(now, wait_for_heartbeat=False)
                    return
        self.server_sequence = max(self.server_sequence, beat.sequence)
        if self.awaiting_heartbeat:
            self.awaiting_heartbeat = False
            if self.from_head:
                self.from_head = False
                self.last = self._verified = max(self.last, beat.sequence)
            self._ask(self.verified)
            return
        if self.syncing:
            return
        # The first beat after a (re)start closes the race between the snapshot and the
        # subscription becoming live: anything it announces beyond what we hold is asked
        # for now, by subtree subscribers too.
        first, self._check_next_beat = self._check_next_beat, False
        if beat.sequence <= self.verified:
            return
        if self.full_feed:
            # Broadcasts precede the heartbeat on the same socket: these were lost.
            self.stats.gaps += 1
            self._healing = True
            self._ask(self.last)
        elif first or now - self._last_reconcile >= self.reconcile_interval:
            self._last_reconcile = now
            self.stats.reconciles += 1
            self._ask(self._verified)
