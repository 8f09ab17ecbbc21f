"""The peer link of an Event BUS pair, sans-I/O: frames <-> messages.

Every message is three frames: ``[b"EBPAIR1", kind, body]`` where ``body`` is one msgpack
value. Each server sends on its own DEALER (connected to the peer's ``--ha-port``) and
hears on its ROUTER (bound on its own), so there is no reply routing:

* ``STATE`` (both ways, every beat): role, state, term, store id, last stored sequence,
  the sequence released to clients, and, from an active, whether its passive is paired.
* ``JOIN`` (passive -> active): "copy your log to me": my store id, term, last sequence,
  and the UUIDs at a few sequences below it (``marks``), so that the active finds the
  highest point where both logs agree.
* ``REWIND`` (active -> passive): keep your log up to ``common``, take this store id and
  term; the events above ``common`` follow.
* ``EVENTS`` (active -> passive): events with their sequences, following ``after``
  (the sequence of the event sent before them), for catch-up and then live.
* ``ACK`` (passive -> active): every event up to this sequence is stored.
* ``FORWARD`` (passive -> active): events publishers handed to the passive's collector.

Malformed input raises :class:`PairError` (a :class:`bus.errors.ProtocolError`) with a
``reason``; nothing else escapes. No Twisted, no zmq.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final

import msgpack

from bus.errors import ProtocolError
from bus.eventbus.codec import EventFields

MAGIC: Final = b"EBPAIR1"
STATE: Final = b"STATE"
JOIN: Final = b"JOIN"
REWIND: Final = b"REWIND"
EVENTS: Final = b"EVENTS"
ACK: Final = b"ACK"
FORWARD: Final = b"FORWARD"

ROLES: Final = ("primary", "backup")
STATES: Final = ("waiting", "active", "passive", "doubt")
MODES: Final = ("sync", "async")
MAX_MARKS: Final = 128
MAX_STORE_ID: Final = 64


class PairError(ProtocolError):
    """Malformed peer-link input."""


@dataclass(frozen=True, slots=True)
class PeerState:
    """A ``STATE``: where the sender stands (role, state, term, store, sequences, pairing), sent
    every beat."""

    role: str
    state: str
    term: int
    store_id: str
    sequence: int
    released: int
    paired: bool
    #: This server's beat counter, and the last beat it heard from the peer: a server
    #: that was not running trusts only states that echo a beat it sent since.
    beat: int = 0
    echo: int = 0


@dataclass(frozen=True, slots=True)
class Join:
    """A ``JOIN``: a passive asks the active to copy its log, from the highest of ``marks``
    (sequence, UUID) both logs agree on."""

    store_id: str
    term: int
    last: int
    marks: tuple[tuple[int, bytes], ...]


@dataclass(frozen=True, slots=True)
class Rewind:
    """A ``REWIND``: the passive keeps its log up to ``common`` and takes the active's store id and
    term."""

    store_id: str
    term: int
    common: int


@dataclass(frozen=True, slots=True)
class Events:
    """Events following ``after``; the passive's log then ends at ``last`` (at least the
    last event's sequence: a sequence the active stepped over has no event)."""

    after: int
    last: int
    events: tuple[tuple[int, EventFields], ...]


@dataclass(frozen=True, slots=True)
class Ack:
    """An ``ACK``: the passive has stored every event up to ``sequence``."""

    sequence: int


@dataclass(frozen=True, slots=True)
class Forward:
    """A ``FORWARD``: events publishers handed to the passive's collector, for the active to
    sequence."""

    events: tuple[EventFields, ...]


PairMessage = PeerState | Join | Rewind | Events | Ack | Forward

_MAX_SEQUENCE = 2**63 - 1


def _pack(kind: bytes, body: Any) -> list[bytes]:
    return [MAGIC, kind, msgpack.packb(body, use_bin_type=True)]


def state_frames(state: PeerState) -> list[bytes]:
    """The frames of a ``STATE``."""
    return _pack(
        STATE,
        [
            state.role,
            state.state,
            state.term,
            state.store_id,
            state.sequence,
            state.released,
            state.paired,
            state.beat,
            state.echo,
        ],
    )


def join_frames(join: Join) -> list[bytes]:
    """The frames of a ``JOIN``."""
    return _pack(JOIN, [join.store_id, join.term, join.last, [list(m) for m in join.marks]])


def rewind_frames(rewind: Rewind) -> list[bytes]:
    """The frames of a ``REWIND``."""
    return _pack(REWIND, [rewind.store_id, rewind.term, rewind.common])


def events_frames(after: int, last: int, events: list[tuple[int, EventFields]]) -> list[bytes]:
    """The frames of an ``EVENTS``: ``events`` (sequence, fields) following ``after``, the log
    ending at ``last``."""
    return _pack(EVENTS, [after, last, [(seq, *fields) for seq, fields in events]])


def consecutive_events_frames(after: int, first: int, fields: list[EventFields]) -> list[bytes]:
    """EVENTS for a batch stored under consecutive sequences from ``first`` (the hot
    path of live replication: one message per stored batch)."""
    last = first + len(fields) - 1
    return _pack(EVENTS, [after, last, [(seq, *f) for seq, f in enumerate(fields, first)]])


def ack_frames(sequence: int) -> list[bytes]:
    """The frames of an ``ACK``."""
    return _pack(ACK, sequence)


def forward_frames(events: list[EventFields]) -> list[bytes]:
    """The frames of a ``FORWARD``."""
    return _pack(FORWARD, events)


# -- decoding ---------------------------------------------------------------------------


def _sequence(value: Any, what: str) -> int:
    if type(value) is not int or not 0 <= value <= _MAX_SEQUENCE:
        raise PairError(f"{what} is not a sequence", "bad-sequence")
    return value


def _text(value: Any, what: str, allowed: tuple[str, ...] | None = None) -> str:
    if not isinstance(value, str) or len(value) > MAX_STORE_ID:
        raise PairError(f"{what} is not a short string", "bad-field")
    if allowed is not None and value not in allowed:
        raise PairError(f"{what} {value!r} is not one of {allowed}", "bad-field")
    return value


def _list(value: Any, what: str, length: int | None = None) -> list[Any]:
    if not isinstance(value, list) or (length is not None and len(value) != length):
        raise PairError(f"{what} has the wrong shape", "bad-shape")
    return value


def _fields(value: Any) -> EventFields:
    items = _list(value, "event", 5)
    if not all(isinstance(item, bytes) for item in items):
        raise PairError("event fields are not bytes", "bad-event")
    topic, producer, timestamp, uuid, data = items
    return topic, producer, timestamp, uuid, data


def parse(frames: list[bytes]) -> PairMessage:
    """Decode one peer-link message (without a ROUTER identity)."""
    if len(frames) != 3:
        raise PairError(f"{len(frames)} frames, expected 3", "frame-count")
    magic, kind, raw = frames
    if magic != MAGIC:
        raise PairError("not a peer-link message", "bad-magic")
    try:
        body = msgpack.unpackb(raw, raw=False, strict_map_key=False, use_list=True)
    except Exception:  # msgpack raises several unrelated types for bad input
        raise PairError("body is not one msgpack value", "bad-body") from None
    if kind == STATE:
        role, state, term, store_id, sequence, released, paired, beat, echo = _list(
            body, "STATE", 9
        )
        if not isinstance(paired, bool):
            raise PairError("paired is not a boolean", "bad-field")
        return PeerState(
            _text(role, "role", ROLES),
            _text(state, "state", STATES),
            _sequence(term, "term"),
            _text(store_id, "store id"),
            _sequence(sequence, "sequence"),
            _sequence(released, "released"),
            paired,
            _sequence(beat, "beat"),
            _sequence(echo, "echo"),
        )
    if kind == JOIN:
        store_id, term, last, marks = _list(body, "JOIN", 4)
        pairs = _list(marks, "marks")
        if len(pairs) > MAX_MARKS:
            raise PairError("too many marks", "oversized")
        parsed: list[tuple[int, bytes]] = []
        for mark in pairs:
            sequence, uuid = _list(mark, "mark", 2)
            if not isinstance(uuid, bytes):
                raise PairError("mark uuid is not bytes", "bad-field")
            parsed.append((_sequence(sequence, "mark"), uuid))
        return Join(_text(store_id, "store id"), _sequence(term, "term"), _sequence(last, "last"),
                    tuple(parsed))  # fmt: skip
    if kind == REWIND:
        store_id, term, common = _list(body, "REWIND", 3)
        return Rewind(_text(store_id, "store id"), _sequence(term, "term"),
                      _sequence(common, "common"))  # fmt: skip
    if kind == EVENTS:
        after, last, rows = _list(body, "EVENTS", 3)
        previous = _sequence(after, "after")
        events: list[tuple[int, EventFields]] = []
        for row in _list(rows, "events"):
            items = _list(row, "event", 6)
            sequence = _sequence(items[0], "event sequence")
            if sequence <= previous:
                raise PairError("event sequences do not increase", "bad-sequence")
            previous = sequence
            events.append((sequence, _fields(items[1:])))
        if _sequence(last, "last") < previous:
            raise PairError("EVENTS ends below its last event", "bad-sequence")
        return Events(_sequence(after, "after"), last, tuple(events))
    if kind == ACK:
        return Ack(_sequence(body, "ACK"))
    if kind == FORWARD:
        return Forward(tuple(_fields(item) for item in _list(body, "FORWARD")))
    raise PairError("unknown peer-link message", "unknown-command")
