"""One half of an Event BUS pair: the peer link's sockets, replication, and the service's
side of Binary Star (the rules themselves are in :mod:`bus.eventbus.pair_core`).

The peer link: a ROUTER bound on ``--ha-port`` hears the peer; a DEALER connected to
``--ha-peer`` speaks to it (ZMQ_IMMEDIATE: nothing waits in a pipe to a peer that is
not there). Wire format: :mod:`bus.eventbus.pair_codec`.

Replication, on the active: a passive that JOINs is told where their logs agree
(REWIND), then sent every event above that point from the store (catch-up, at most
:data:`MAX_IN_FLIGHT` unacknowledged), then each stored batch as it is stored (live).
Once it has acknowledged everything up to the point where the stream went live, the
pair is *paired*: with sync replication the active releases (broadcasts, serves in
snapshots, announces in heartbeats) only what the passive acknowledged; with async up
to ``async_window`` events more. A paired passive that acknowledges nothing for
``alone_timeout`` while events wait, or goes silent that long, is left behind: the
active goes on alone, says so (error log, ``/status``, ``/metrics``), and the pair is
paired again once the passive has caught up.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, Protocol

import zmq
from twisted.logger import Logger

from bus.eventbus import codec, pair_codec
from bus.eventbus.codec import EventBusError, EventFields
from bus.eventbus.config import EventBusConfig, PairConfig
from bus.eventbus.eventlog import PairLog
from bus.eventbus.pair_codec import Ack, Events, Forward, Join, PairError, PeerState, Rewind
from bus.eventbus.pair_core import Change, PairCore
from bus.extension import (
    Metric,
    SocketFactory,
    SocketOptions,
    StorageError,
    ZmqSocket,
    counter,
    counters_by,
    gauge,
    gauges_by,
)
from bus.transport.curve import make_curve_client
from bus.transport.security import ServerCurve
from bus.transport.zmqsocket import bind_failure
from bus.util.droplog import DropCounter, RateLimit
from bus.util.periodic import Periodic

log = Logger(namespace="bus.eventbus.pair")

#: Events sent to the passive and not yet acknowledged, at most.
MAX_IN_FLIGHT = 50_000
#: Events read from the store per EVENTS message while catching a passive up.
CATCHUP_CHUNK = 1000
#: Marks (sequence, UUID) a joining passive sends: its last sequence, then 1, 2, 4...
#: below it, so the active finds where the logs agree in one round trip.
JOIN_MARKS = 48
#: Events a rejoining server keeps from the tail it drops, to hand them to the active.
MAX_ORPHANS = 100_000
#: How often a server that goes on alone repeats it in the log.
ALONE_REMINDER = 10.0


class PairHost(Protocol):
    """What the pair asks of the Event BUS's core (:class:`bus.eventbus.core.EventBusCore`):
    the pair talks to the rules, never to the service's sockets."""

    log: PairLog

    @property
    def released(self) -> int:
        """The highest sequence clients may see."""
        ...

    def pair_changed(self, change: Change) -> None:
        """The pair turned this server active or passive."""
        ...

    def accept_forwarded(self, fields: list[EventFields]) -> None:
        """Events the passive collected, for this active to store and broadcast."""
        ...

    def replace_log(self, store_id: str) -> None:
        """Set the log aside (another bus's) and take a new, empty one under ``store_id``."""
        ...

    def pair_release(self) -> None:
        """The passive acknowledged more: release what the pair allows now."""
        ...

    def hold_collector(self, held: bool) -> None:
        """Stop reading the collector (True: the pair holds as many events as it may), or read it
        again (False)."""
        ...


def join_marks(last: int, count: int = JOIN_MARKS) -> list[int]:
    """``last``, then 1, 2, 4, ... below it, down to sequence 1."""
    marks: list[int] = []
    distance = 0
    while len(marks) < count and last - distance >= 1:
        marks.append(last - distance)
        distance = 1 if distance == 0 else distance * 2
    return marks


class Pair:
    """The pair's work in one server. Counters are plain attributes (see :meth:`status`)."""

    def __init__(
        self,
        host: PairHost,
        config: PairConfig,
        *,
        bind: str,
        base_port: int,
        reactor: Any,
        factory: SocketFactory,
        max_data_bytes: int,
        hold_limit: int,
        clock: Callable[[], float] = time.time,
        curve: ServerCurve | None = None,
    ) -> None:
        self.host = host
        self.curve = curve
        self.config = config
        self.bind_host = bind
        self.base_port = base_port
        self.reactor = reactor
        self.factory = factory
        self.max_data_bytes = max_data_bytes
        self.hold_limit = hold_limit
        self.clock = clock
        self.router: ZmqSocket | None = None
        self.dealer: ZmqSocket | None = None
        self.endpoint = ""
        self.core: PairCore
        self._periodic = Periodic(reactor, log)
        self.drops = DropCounter(log, "peer-link message", clock)
        self._alerts = RateLimit(clock, interval=ALONE_REMINDER)
        # -- the active's side of replication --
        #: A passive joined and is being sent the log.
        self.joined = False
        #: The highest sequence sent to the passive, and the highest it acknowledged.
        self.position = 0
        self.acked = 0
        #: Where the stream went live (None: still catching up).
        self.live_from: int | None = None
        #: The passive acknowledged everything up to ``live_from``: releases wait for it.
        self.paired = False
        self.alone_since: float | None = None
        self._ack_progress_at = 0.0
        self._active_since = 0.0
        # -- the passive's side --
        self.rewound = False
        self._join_sent_at = -1e9
        self._events_at = 0.0
        #: Events publishers handed to this (non-active) server, waiting to be forwarded.
        self.held: list[EventFields] = []
        #: The tail dropped when rejoining (events this server stored, never released),
        #: handed to the active once caught up, unless the active had them: (above, events).
        self._orphans: tuple[int, list[EventFields]] | None = None
        # -- counters --
        self.events_sent = 0
        self.events_replicated = 0
        self.acks = 0
        self.joins = 0
        self.rewinds = 0
        self.truncated = 0
        self.forwarded = 0
        self.republished = 0
        self.forwards_received = 0
        self.went_alone = 0
        self.healed = 0
        self.gaps = 0
        self.storage_errors = 0

    def peer_key(self) -> bytes:
        """The other half's public key (Z85): ``--ha-peer-key``, or this server's own when
        both halves share one key pair."""
        if self.config.peer_key is not None:
            return self.config.peer_key
        assert self.curve is not None and self.curve.keys is not None
        return self.curve.keys.public

    # -- lifecycle ---------------------------------------------------------------------------

    @classmethod
    def of_bus(
        cls,
        host: PairHost,
        settings: EventBusConfig,
        *,
        base_port: int,
        reactor: Any,
        factory: SocketFactory,
        clock: Callable[[], float],
        curve: ServerCurve | None,
    ) -> Pair:
        """The half ``settings.pair`` describes, of the bus whose ports start at
        ``base_port`` (not started: see :meth:`start`)."""
        assert settings.pair is not None
        return cls(
            host,
            settings.pair,
            bind=settings.bind,
            base_port=base_port,
            reactor=reactor,
            factory=factory,
            max_data_bytes=settings.max_data_bytes,
            hold_limit=settings.collector_hwm,
            clock=clock,
            curve=curve,
        )

    def start(self) -> None:
        """Bind the link (a :class:`bus.errors.StartupError` names ``ha-port``, or ``bind``),
        connect to the peer, start beating."""
        try:
            self._start()
        except zmq.ZMQError as error:
            port = self.config.port or self.base_port + 3
            what = f"the pair link on {self.bind_host}:{port}"
            raise bind_failure(error, "ha-port", what) from None

    def _start(self) -> None:
        config = self.config
        store = self.host.log
        now = self.reactor.seconds()
        self.core = PairCore(
            config.role,
            term=int(store.meta("ha_term") or 0),
            failover_timeout=config.failover_timeout,
            alone_timeout=config.alone_timeout,
            now=now,
            sequence=lambda: self.host.log.last_sequence,
            window=config.window,
            say=self._say,
        )
        self.router = self.factory.socket(
            zmq.ROUTER,
            self._on_messages,
            SocketOptions(receive_hwm=10_000, linger_ms=0, tcp_keepalive_idle=30),
            read_budget=64,
            name="pair-link",
        )
        port = config.port or self.base_port + 3
        curve = self.curve
        if curve is not None:
            curve.secure(self.router, "eventbus-pair")
        self.endpoint = self.router.bind(f"tcp://{self.bind_host}:{port}")
        self.dealer = self.factory.socket(
            zmq.DEALER,
            None,
            SocketOptions(
                send_hwm=10_000,
                linger_ms=0,
                immediate=True,
                tcp_keepalive_idle=30,
                reconnect_ms=100,
                reconnect_max_ms=500,
            ),
            name="pair-peer",
        )
        if curve is not None and curve.keys is not None:
            make_curve_client(self.dealer, self.peer_key(), curve.keys)
        self.dealer.connect(f"tcp://{config.peer}")
        self._periodic.every(config.beat_interval, self._beat, now=True)
        log.info(
            "pair: {role} on {endpoint}, peer {peer}, {mode} replication, term {term}; waiting "
            "for the peer",
            role=config.role,
            endpoint=self.endpoint,
            peer=config.peer,
            mode=config.replication,
            term=self.core.term,
        )

    def stop(self) -> None:
        """Stop beating and close the link's sockets."""
        self._periodic.stop_all()
        for sock in (self.router, self.dealer):
            if sock is not None:
                sock.shutdown()
        self.router = self.dealer = None

    # -- state -------------------------------------------------------------------------------

    @property
    def state(self) -> str:
        """This server's pair state: ``waiting``, ``active``, ``passive`` or ``doubt``."""
        return self.core.state

    # After a pause (SIGSTOP, starvation) the reactor hands over I/O before it runs timers:
    # whoever asks these judges the pause first, so a replaced active never acts as one.

    def stores(self) -> bool:
        """This server stores what publishers send (active, or active in doubt)."""
        self.tick()
        return self.core.state in ("active", "doubt")

    def serves(self) -> bool:
        """This server serves clients: broadcasts, heartbeats, snapshots."""
        self.tick()
        return self.core.state == "active"

    def tick(self) -> None:
        """Let the rules judge the time now (a peer silent too long), and act on a change."""
        change = self.core.tick(self.reactor.seconds())
        if change is not None:
            self._changed(change)

    def vote(self) -> None:
        """A client turned to this server."""
        if self.core.state == "active":
            return
        change = self.core.vote(self.reactor.seconds())
        if change is not None:
            self._changed(change)

    def _changed(self, change: Change) -> None:
        core = self.core
        emit = log.warn if change.new in ("doubt", "passive") else log.info
        emit(
            "pair: {old} -> {new}: {reason}",
            old=change.old,
            new=change.new,
            reason=change.reason,
        )
        store = self.host.log
        if change.new == "active":
            try:
                store.set_meta("ha_term", str(core.term))
            except StorageError as error:
                self._storage_fault("saving the term", error)
            if change.old != "doubt":
                self._active_since = change.at
                self._reset_active_side()
                if self.config.replication == "async" and change.old == "passive":
                    # The old active may have broadcast up to a window beyond what we
                    # hold: never give those sequences to other events.
                    try:
                        store.skip_to(store.last_sequence + self.config.window)
                    except StorageError as error:
                        self._storage_fault("stepping over the async window", error)
        elif change.new == "passive":
            self._reset_active_side()
            self.rewound = False
            self._send_join()
        self.host.pair_changed(change)
        self._send_state()
        if change.new == "active":
            self.host.pair_release()

    # -- the beat ----------------------------------------------------------------------------

    def _beat(self) -> None:
        self.tick()
        now = self.reactor.seconds()
        state = self.core.state
        if state in ("active", "doubt"):
            self._check_passive(now)
            self._pump()
        elif state == "passive":
            self._passive_beat(now)
        self._send_state()
        if self.held and state != "active":
            self._forward_held()

    def _send_state(self) -> None:
        dealer = self.dealer
        if dealer is None:
            return
        store = self.host.log
        core = self.core
        dealer.send_frames(
            pair_codec.state_frames(
                PeerState(
                    self.config.role,
                    core.state,
                    core.term,
                    store.store_id,
                    store.last_sequence,
                    self.host.released,
                    self.paired,
                    core.next_beat(),
                    core.echo,
                )
            )
        )

    def _send(self, frames: list[bytes]) -> bool:
        return self.dealer is not None and self.dealer.send_frames(frames)

    # -- incoming ----------------------------------------------------------------------------

    def _on_messages(self, batch: list[list[bytes]]) -> None:
        parse = pair_codec.parse
        for frames in batch:
            try:
                message = parse(frames[1:])
            except PairError as error:
                self.drops.drop(error.reason, str(error), frames[0])
                continue
            if isinstance(message, Events):
                self._on_events(message)
            elif isinstance(message, Ack):
                self._on_ack(message.sequence)
            elif isinstance(message, PeerState):
                self._on_state(message)
            elif isinstance(message, Join):
                self._on_join(message)
            elif isinstance(message, Rewind):
                self._on_rewind(message)
            else:
                self._on_forward(message)

    def _on_state(self, state: PeerState) -> None:
        if state.role == self.config.role:
            self.drops.drop("same-role", f"the peer is also {state.role}: check --ha-role")
            return
        change = self.core.heard(state, self.reactor.seconds())
        if change is not None:
            self._changed(change)
        if self._orphans is not None and self.core.state == "passive" and self.core.in_sync:
            self._republish()
        if self.core.state in ("active", "doubt") and state.state == "waiting" and self.joined:
            # The passive restarted: it will JOIN again.
            if self.paired:
                self._go_alone("the passive restarted")
            self.joined = False
            self.live_from = None

    # -- the active: replication out ---------------------------------------------------------

    def _reset_active_side(self) -> None:
        self.joined = self.paired = False
        self.live_from = None
        self.position = self.acked = 0
        self.alone_since = None

    def _on_join(self, join: Join) -> None:
        if self.core.state not in ("active", "doubt"):
            self.drops.drop("join-not-active", "JOIN while not active")
            return
        store = self.host.log
        common = 0
        if join.store_id == store.store_id and join.marks:
            mine = store.event_ids(sequence for sequence, _ in join.marks)
            for sequence, event_id in sorted(join.marks, reverse=True):
                if sequence <= store.last_sequence and mine.get(sequence) == event_id:
                    common = sequence
                    break
        if self.paired:
            self._go_alone("the passive joined again")
        self.joins += 1
        self._send(pair_codec.rewind_frames(Rewind(store.store_id, self.core.term, common)))
        self.joined = True
        self.position = self.acked = common
        self.live_from = None
        self._ack_progress_at = self.reactor.seconds()
        log.info(
            "pair: the passive joined at sequence {last}; the logs agree up to {common}: "
            "sending it {behind} events, then live",
            last=join.last,
            common=common,
            behind=store.last_sequence - common,
        )
        self._pump()

    def _pump(self) -> None:
        """Send the passive what it lacks from the store (catch-up), within the window."""
        if not self.joined or self.core.state not in ("active", "doubt"):
            return
        store = self.host.log
        last = store.last_sequence
        while self.position < last and self.position - self.acked < MAX_IN_FLIGHT:
            events = store.read_rows(self.position, last, limit=CATCHUP_CHUNK)
            if events:
                upto = events[-1][0] if len(events) == CATCHUP_CHUNK else last
                rows = [(seq, (topic, producer, timestamp, uuid, data))
                        for seq, topic, producer, timestamp, uuid, data in events]  # fmt: skip
            else:
                upto, rows = last, []  # only sequences stepped over remain
            if not self._send(pair_codec.events_frames(self.position, upto, rows)):
                return
            self.events_sent += len(rows)
            self.position = upto
        if self.live_from is None and self.position >= last:
            self.live_from = self.position

    def appended(self, first: int, fields: list[EventFields]) -> None:
        """A batch was stored under ``first``...: send it at once when the passive is live."""
        if not self.joined:
            return
        if (
            self.position == first - 1
            and self.position - self.acked < MAX_IN_FLIGHT
            and self._send(pair_codec.consecutive_events_frames(self.position, first, fields))
        ):
            self.position = first + len(fields) - 1
            self.events_sent += len(fields)
            if self.live_from is None:
                self.live_from = self.position
            return
        self._pump()

    def _on_ack(self, sequence: int) -> None:
        if not self.joined or self.core.state not in ("active", "doubt"):
            return
        self.acks += 1
        sequence = min(sequence, self.position)
        if sequence > self.acked:
            self.acked = sequence
            self._ack_progress_at = self.reactor.seconds()
        if not self.paired and self.live_from is not None and self.acked >= self.live_from:
            self.paired = True
            if self.alone_since is not None:
                self.healed += 1
                log.info(
                    "pair: healed after {seconds:.1f}s alone: the passive holds every event up "
                    "to {sequence}; releases wait for it again",
                    seconds=self.reactor.seconds() - self.alone_since,
                    sequence=self.acked,
                )
            else:
                log.info(
                    "pair: paired: the passive holds every event up to {sequence}",
                    sequence=self.acked,
                )
            self.alone_since = None
        self.host.pair_release()
        self._pump()

    def _check_passive(self, now: float) -> None:
        """A paired passive that takes nothing (or says nothing) for ``alone_timeout`` is
        left behind; one that is not paired is reminded of, loudly, every few seconds."""
        timeout = self.config.alone_timeout
        if self.paired:
            waiting = self.position > self.acked or self.host.log.last_sequence > self.acked
            silent = now - self.core.peer_heard
            # Nor is the passive slow when this server did not run: acks wait unread.
            stuck = now - max(self._ack_progress_at, self.core.resumed_at)
            if (waiting and stuck >= timeout) or silent >= timeout:
                self._go_alone(
                    f"the passive acknowledged nothing for {stuck:.1f}s"
                    if waiting and stuck >= timeout
                    else f"the passive was silent for {silent:.1f}s"
                )
            return
        settled = now - self._active_since >= timeout  # a passive gets time to join
        if self.core.state == "active" and settled and self._alerts.due("alone") is not None:
            log.error(
                "pair: ALONE: the active serves without a passive copy of its log "
                "({why}); a failover now would lose what was broadcast since",
                why="the passive catches up" if self.joined else "no passive joined",
            )

    def _go_alone(self, why: str) -> None:
        self.paired = False
        self.went_alone += 1
        now = self.reactor.seconds()
        self.alone_since = now
        # Paired again once the passive acknowledges everything sent so far.
        self.live_from = self.position if self.joined else None
        self._alerts.reset("alone")
        log.error(
            "pair: going on ALONE ({why}): events are broadcast without a copy on the "
            "passive until it catches up",
            why=why,
        )
        # The passive hears it before anything unreplicated is released: it no longer
        # counts itself in sync, so it will not take over without those events.
        self._send_state()
        self.host.pair_release()

    def release_limit(self) -> int:
        """The highest sequence that may be released to clients now."""
        last = self.host.log.last_sequence
        state = self.core.state
        if state == "doubt":
            return self.host.released
        if state != "active" or not self.paired:
            return last
        return min(last, self.acked + self.config.window)

    # -- the passive: replication in ---------------------------------------------------------

    def _send_join(self) -> None:
        store = self.host.log
        last = store.last_sequence
        ids = store.event_ids(join_marks(last))
        marks = tuple((sequence, ids[sequence]) for sequence in join_marks(last) if sequence in ids)
        self._send(pair_codec.join_frames(Join(store.store_id, self.core.term, last, marks)))
        self._join_sent_at = self.reactor.seconds()

    def _passive_beat(self, now: float) -> None:
        if not self.rewound:
            if now - self._join_sent_at >= self.config.failover_timeout:
                self._send_join()
            return
        peer = self.core.peer
        if (
            peer is not None
            and peer.state == "active"
            and peer.sequence > self.host.log.last_sequence
            and now - self._events_at >= self.config.failover_timeout
        ):
            # The active holds more and sent nothing for a while: an EVENTS was lost.
            self.gaps += 1
            self.rewound = False
            self._send_join()

    def _on_rewind(self, rewind: Rewind) -> None:
        if self.core.state != "passive":
            self.drops.drop("rewind-not-passive", "REWIND while not passive")
            return
        store = self.host.log
        try:
            if rewind.store_id != store.store_id:
                if store.count():
                    self.host.replace_log(rewind.store_id)
                else:
                    store.adopt_store_id(rewind.store_id)
                store = self.host.log
            tail = store.read_rows(rewind.common, limit=MAX_ORPHANS)
            dropped = store.truncate_after(rewind.common)
            store.set_meta("ha_term", str(rewind.term))
        except StorageError as error:
            self._storage_fault("rejoining", error)
            return
        self.core.term = rewind.term
        self.rewinds += 1
        self.truncated += dropped
        if dropped:
            log.warn(
                "pair: rejoining: took out the {count} events above {common}; those the "
                "active lacks are handed to it once this server has caught up",
                count=dropped,
                common=rewind.common,
            )
            orphans = [row[1:] for row in tail]
            if self._orphans is not None and self._orphans[0] >= rewind.common:
                orphans = self._orphans[1] + orphans  # an earlier rejoin's, not yet handed
            self._orphans = (rewind.common, orphans[:MAX_ORPHANS])
        self.rewound = True
        self._events_at = self.reactor.seconds()
        self._send(pair_codec.ack_frames(store.last_sequence))

    def _on_events(self, message: Events) -> None:
        if self.core.state != "passive" or not self.rewound:
            return  # a stream for an earlier join, or we are active now
        store = self.host.log
        if message.after != store.last_sequence:
            self.gaps += 1
            self.rewound = False
            self._send_join()
            return
        try:
            store.append_at(message.events, self.clock())
            if message.last > store.last_sequence:
                store.skip_to(message.last)
        except StorageError as error:
            # Nothing acknowledged: the active waits, then goes on alone; we join again.
            self._storage_fault("storing replicated events", error)
            self.rewound = False
            self._join_sent_at = self.reactor.seconds()
            return
        self.events_replicated += len(message.events)
        self._events_at = self.reactor.seconds()
        self._send(pair_codec.ack_frames(store.last_sequence))

    # -- publishers that reach a server that is not active -----------------------------------

    def forward(self, fields: list[EventFields]) -> None:
        """Hand events a publisher sent here to the active (or hold them for whoever
        becomes active); the collector pauses while too many are held."""
        if not self.held and self._active_peer():
            sent = 0
            while sent < len(fields):
                chunk = fields[sent : sent + 512]
                if not self._send(pair_codec.forward_frames(chunk)):
                    break
                sent += len(chunk)
            self.forwarded += sent
            fields = fields[sent:]
            if not fields:
                return
        room = 4 * self.hold_limit - len(self.held)
        if room < len(fields):
            # The collector is paused; only in-process activity still comes: bounded.
            for _ in range(len(fields) - max(room, 0)):
                self.drops.drop("held-overflow", "no active to hand events to; queue full")
            fields = fields[: max(room, 0)]
        self.held.extend(fields)
        if len(self.held) >= self.hold_limit:
            self.host.hold_collector(True)

    def _active_peer(self) -> bool:
        peer = self.core.peer
        return (
            peer is not None
            and peer.state == "active"
            and self.reactor.seconds() - self.core.peer_heard < self.config.failover_timeout
        )

    def _forward_held(self) -> None:
        if not self._active_peer():
            return
        while self.held:
            chunk = self.held[:512]
            if not self._send(pair_codec.forward_frames(chunk)):
                return
            del self.held[:512]
            self.forwarded += len(chunk)
        self.host.hold_collector(False)

    def _republish(self) -> None:
        """Caught up after a rejoin: hand the active the dropped events it does not hold
        (publishers' events this server took in but never released, e.g. while stopped)."""
        assert self._orphans is not None
        above, orphans = self._orphans
        self._orphans = None
        present = self.host.log.ids_present(above, (fields[3] for fields in orphans))
        missing = [fields for fields in orphans if fields[3] not in present]
        if missing:
            self.republished += len(missing)
            log.warn(
                "pair: handing the active {count} events this server stored but never "
                "released ({had} it already holds)",
                count=len(missing),
                had=len(orphans) - len(missing),
            )
            self.forward(missing)

    def take_held(self) -> list[EventFields]:
        """The events held for the active (collected while passive), handed over and forgotten."""
        held, self.held = self.held, []
        return held

    def _on_forward(self, message: Forward) -> None:
        if self.core.state not in ("active", "doubt"):
            self.drops.drop("forward-not-active", "FORWARD while not active")
            return
        valid: list[EventFields] = []
        for topic, producer, timestamp, uuid, data in message.events:
            try:
                valid.append(
                    codec.parse_pub_fields(
                        [topic, b"", producer, timestamp, uuid, data], self.max_data_bytes
                    )
                )
            except EventBusError as error:
                self.drops.drop(error.reason, str(error))
        self.forwards_received += len(valid)
        if valid:
            self.host.accept_forwarded(valid)

    # -- reporting ---------------------------------------------------------------------------

    def _say(self, text: str) -> None:
        log.warn("pair: {text}", text=text)

    def _storage_fault(self, what: str, error: StorageError) -> None:
        self.storage_errors += 1
        failures = self._alerts.due(f"storage {what}")
        if failures is not None:
            log.error(
                "pair: {what} failed: {error} ({failures} failures since the last report); "
                "the passive joins again later",
                what=what,
                error=str(error),
                failures=failures,
            )

    def behind(self) -> int | None:
        """Events the passive lacks: seen from the active, or from the passive."""
        core = self.core
        last = self.host.log.last_sequence
        if core.state in ("active", "doubt"):
            return last - self.acked if self.joined else None
        peer = core.peer
        if core.state == "passive" and peer is not None and peer.state == "active":
            return max(peer.sequence - last, 0)
        return None

    def status(self) -> dict[str, Any]:
        """Role, state, term, the peer as last heard and the replication's progress, for
        ``/status``."""
        core = self.core
        now = self.reactor.seconds()
        peer = core.peer
        return {
            "role": self.config.role,
            "state": core.state,
            "term": core.term,
            "replication": self.config.replication,
            "link": self.endpoint,
            "peer_address": self.config.peer,
            "peer": None
            if peer is None
            else {
                "role": peer.role,
                "state": peer.state,
                "term": peer.term,
                "sequence": peer.sequence,
                "released": peer.released,
                "heard_s_ago": round(now - core.peer_heard, 3),
            },
            "paired": self.paired,
            "alone": core.state == "active" and not self.paired,
            "in_sync": core.in_sync,
            "behind": self.behind(),
            "acked": self.acked,
            "sent": self.position,
            "events_sent": self.events_sent,
            "events_replicated": self.events_replicated,
            "joins": self.joins,
            "rewinds": self.rewinds,
            "truncated": self.truncated,
            "forwarded": self.forwarded,
            "republished": self.republished,
            "forwards_received": self.forwards_received,
            "held": len(self.held),
            "orphans": 0 if self._orphans is None else len(self._orphans[1]),
            "went_alone": self.went_alone,
            "healed": self.healed,
            "gaps": self.gaps,
            "stalls": core.stalls,
            "refused_takeovers": core.refused_takeovers,
            "dropped": dict(self.drops.counts),
            "transitions": dict(core.transitions),
            "changes": [
                {"at_s": round(c.at, 3), "from": c.old, "to": c.new, "reason": c.reason}
                for c in core.changes
            ],
        }

    def metrics(self) -> list[Metric]:
        """The pair's state, transitions, term and replication, for ``/metrics``."""
        core = self.core
        behind = self.behind()
        return [
            gauges_by(
                "eventbus_ha_state",
                "1 for the pair state this server is in",
                "state",
                {s: float(core.state == s) for s in ("waiting", "active", "passive", "doubt")},
            ),
            counters_by(
                "eventbus_ha_transitions",
                "Pair state changes, by the state entered",
                "state",
                dict(core.transitions),
            ),
            gauge("eventbus_ha_term", "The pair's term (raised at every takeover)", core.term),
            gauge("eventbus_ha_paired", "1 while the passive holds what is released", self.paired),
            gauge(
                "eventbus_ha_alone",
                "1 while this active serves without a passive copy",
                float(core.state == "active" and not self.paired),
            ),
            gauge(
                "eventbus_ha_behind_events",
                "Events the passive lacks (-1: unknown)",
                -1 if behind is None else behind,
            ),
            counter("eventbus_ha_events_sent", "Events sent to the passive", self.events_sent),
            counter(
                "eventbus_ha_events_replicated",
                "Events stored from the active's stream",
                self.events_replicated,
            ),
            counter("eventbus_ha_went_alone", "Times the active went on alone", self.went_alone),
            counter("eventbus_ha_healed", "Times the pair was paired again", self.healed),
            counter(
                "eventbus_ha_truncated_events",
                "Events dropped when rejoining (the new active never had them)",
                self.truncated,
            ),
            counter(
                "eventbus_ha_forwarded_events",
                "Events publishers sent here, forwarded to the active",
                self.forwarded,
            ),
            counter(
                "eventbus_ha_refused_takeovers",
                "Takeovers refused because this passive was not in sync",
                core.refused_takeovers,
            ),
            counters_by(
                "eventbus_ha_messages_dropped",
                "Peer-link messages dropped, by reason",
                "reason",
                self.drops.counts,
            ),
        ]
