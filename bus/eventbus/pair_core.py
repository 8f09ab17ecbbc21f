"""Binary Star for an Event BUS pair, sans-I/O: who is active, and why.

States: ``waiting`` (just started, the peer not known yet), ``active`` (serves clients,
assigns sequences), ``passive`` (mirrors the active's log, serves nobody) and ``doubt``
(an active that was not running for a while: the peer may have taken over, so it
releases nothing until the peer answers).

The rules, which keep at most one active:

* a waiting server hearing an active peer becomes passive; two servers of which neither
  is active (waiting or passive) let the newer log lead: higher term, then higher
  sequence, then the primary;
* a passive takes over only when the active has been silent for ``failover_timeout``
  AND a client turned to it (within that time), AND it was in sync (the active said it
  was paired, and this server has not stalled since); a waiting primary may take over on
  the same silence and vote (Binary Star's start), a waiting backup never;
* an active that hears another active yields when the other's log is newer (the one
  that took over has the higher term);
* a server whose own timers ran late by more than half the shorter timeout (SIGSTOP, a
  long pause) cannot judge the peer's silence: an active goes into ``doubt`` and a
  passive stops counting itself in sync, until a state from the peer that answers a
  beat sent since (its ``echo``) says where things stand; an active in doubt resumes
  alone once the peer stays silent for ``alone_timeout``.

Time comes in as arguments; the service turns changes into socket work.
"""

from __future__ import annotations

from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from bus.eventbus.pair_codec import PeerState

Role = Literal["primary", "backup"]
State = Literal["waiting", "active", "passive", "doubt"]


@dataclass(frozen=True, slots=True)
class Change:
    """A state change and why, as the log and ``/status`` show it."""

    at: float
    old: State
    new: State
    reason: str


class PairCore:
    """One half of the pair. Feed it ``tick``, ``heard`` and ``vote``; each returns the
    :class:`Change` it made, if any. ``sequence`` tells the last sequence of the local log."""

    def __init__(
        self,
        role: Role,
        *,
        term: int,
        failover_timeout: float,
        alone_timeout: float,
        now: float,
        sequence: Callable[[], int],
        window: int = 0,
        say: Callable[[str], None] = lambda text: None,
    ) -> None:
        self.role: Role = role
        self.state: State = "waiting"
        self.term = term
        self.failover_timeout = failover_timeout
        self.alone_timeout = alone_timeout
        #: Timers later than this mean this server was not running (SIGSTOP, a pause).
        self.stall_limit = min(failover_timeout, alone_timeout) / 2
        self.window = window
        self._sequence = sequence
        self._say = say
        self.peer: PeerState | None = None
        self.peer_heard = now
        self.vote_at: float | None = None
        #: A passive that may take over: its active said it was paired.
        self.in_sync = False
        #: Our beat counter (sent in STATE) and the last beat the peer sent us.
        self.beat = 0
        self.echo = 0
        #: States from the peer count only once they echo a beat at least this high.
        self._trust_from = 0
        self.stalls = 0
        #: When this server last found it had not run (its silences are counted from there).
        self.resumed_at = now
        self.refused_takeovers = 0
        self.changes: deque[Change] = deque(maxlen=20)
        self.transitions: Counter[str] = Counter()
        self._last_tick = now
        self._refusal_said = False

    # -- inputs ---------------------------------------------------------------------------

    def next_beat(self) -> int:
        """Number the state about to be sent."""
        self.beat += 1
        return self.beat

    def tick(self, now: float) -> Change | None:
        """Called often (every few milliseconds) and before any other input."""
        return self._check_stall(now) or self._timers(now)

    def vote(self, now: float) -> Change | None:
        """A client turned to this server (asked for a snapshot, subscribed)."""
        change = self._check_stall(now)
        self.vote_at = now
        return change or self._timers(now)

    def heard(self, state: PeerState, now: float) -> Change | None:
        """A STATE from the peer."""
        change = self._check_stall(now)
        self.echo = max(self.echo, state.beat)
        if state.echo < self._trust_from:
            return change  # sent before it heard from us after our pause: stale
        self.peer = state
        self.peer_heard = now
        self._refusal_said = False
        return self._on_peer(state, now) or change

    def _check_stall(self, now: float) -> Change | None:
        gap = now - self._last_tick
        self._last_tick = max(self._last_tick, now)
        return self._stalled(now, gap) if gap > self.stall_limit else None

    # -- rules -----------------------------------------------------------------------------

    def leads(self, peer: PeerState) -> bool:
        """True when this log is the newer one (higher term, sequence, then primary)."""
        mine = (self.term, self._sequence(), self.role == "primary")
        return mine > (peer.term, peer.sequence, peer.role == "primary")

    def _on_peer(self, peer: PeerState, now: float) -> Change | None:
        state = self.state
        idle_peer = peer.state in ("waiting", "passive")
        if state == "waiting":
            if peer.state == "active":
                return self._become("passive", now, f"the peer ({peer.role}) is active")
            if idle_peer and self.leads(peer):
                return self._activate(now, f"the peer is {peer.state} and this log is newer "
                                      f"({self._describe(peer)})")  # fmt: skip
        elif state == "passive":
            if peer.state == "active":
                was = self.in_sync
                self.in_sync = peer.paired and self._sequence() + self.window >= peer.released
                if self.in_sync != was:
                    self._say(
                        "in sync with the active: may take over"
                        if self.in_sync
                        else "not in sync with the active: will not take over"
                    )
            elif idle_peer and self.leads(peer):
                return self._activate(now, f"the peer is {peer.state} and this log is newer "
                                      f"({self._describe(peer)})")  # fmt: skip
        elif state == "active":
            if peer.state == "active" and not self.leads(peer):
                return self._become(
                    "passive", now, f"both active: the peer's log is newer ({self._describe(peer)})"
                )
        elif state == "doubt":
            if peer.state == "active":
                return self._become("passive", now, "the peer took over while this server was "
                                    "not running")  # fmt: skip
            if idle_peer:
                return self._become("active", now, f"after the pause the peer is {peer.state}: "
                                    "still the active")  # fmt: skip
            if peer.state == "doubt" and self.leads(peer):
                # Both paused: one of them must go on, the newer log.
                return self._become("active", now, "both in doubt after a pause and this log "
                                    f"is newer ({self._describe(peer)})")  # fmt: skip
        return None

    def _timers(self, now: float) -> Change | None:
        silent = now - self.peer_heard
        voted = self.vote_at is not None and now - self.vote_at <= self.failover_timeout
        state = self.state
        if state == "doubt":
            if silent >= self.alone_timeout:
                return self._become(
                    "active", now, f"no word from the peer for {silent:.1f}s after the pause: "
                    "going on as the active"
                )  # fmt: skip
            return None
        if not voted or silent < self.failover_timeout:
            return None
        if state == "passive":
            if self.in_sync:
                return self._activate(
                    now, f"the active was silent for {silent:.1f}s and a client turned here"
                )
            self.refused_takeovers += 1
            if not self._refusal_said:
                self._refusal_said = True
                self._say(
                    f"the active was silent for {silent:.1f}s and a client turned here, but "
                    "this server is not in sync with it: staying passive"
                )
        elif state == "waiting" and self.role == "primary":
            return self._activate(
                now, f"no peer heard for {silent:.1f}s since the start and a client turned here"
            )
        return None

    def _stalled(self, now: float, gap: float) -> Change | None:
        self.stalls += 1
        self.peer_heard = self.resumed_at = now  # we were not looking: the silence starts now
        self._trust_from = self.beat + 1
        if self.state == "active":
            return self._become(
                "doubt", now, f"this server did not run for {gap:.2f}s: the peer may have "
                "taken over; releasing nothing until it answers"
            )  # fmt: skip
        if self.state == "passive" and self.in_sync:
            self.in_sync = False
            self._say(
                f"this server did not run for {gap:.2f}s: not in sync until the active says so"
            )
        return None

    def _describe(self, peer: PeerState) -> str:
        return (
            f"term {self.term}, sequence {self._sequence()} here; term {peer.term}, "
            f"sequence {peer.sequence} there"
        )

    def _activate(self, now: float, reason: str) -> Change:
        self.term = max(self.term, self.peer.term if self.peer else 0) + 1
        return self._become("active", now, f"{reason}; term {self.term}")

    def _become(self, new: State, now: float, reason: str) -> Change:
        change = Change(now, self.state, new, reason)
        self.state = new
        if new != "passive":
            self.in_sync = False
        self.vote_at = None
        self.peer_heard = now
        self.changes.append(change)
        self.transitions[new] += 1
        return change
