"""eventmq's PUBLISH service across brokers over core NATS, sans I/O: topics as subjects,
the subscribers' prefixes as the subjects a broker listens to, a publication's NATS
message, and the window that keeps a message from going out twice.

eventmq's pub/sub is fire-and-forget, and so is core NATS: a broker that takes a PUBLISH
sends it to its own subscribers and once to the cluster; the other brokers that have a
subscriber whose prefix may match hear it and send it to theirs. Nothing is stored.

**Topics as subjects.** A subscriber's SUB matches topics by byte prefix, which NATS
wildcards cannot say of one token. So a topic is cut into chunks that end at bytes 1, 2,
4, 8, 16, ... (each chunk as long as everything before it), each chunk a token
(:func:`bus.nats.tokens.token`), then a last token ``~`` that says where the topic ends:
``orders.created`` is ``<prefix>.o.r.de.rs~2Ec.reated.~``. A subscriber's prefix of
``n`` bytes is the subject filter of its whole chunks then ``>`` (``orders`` is
``<prefix>.o.r.de.>``): at least half its bytes are in the filter, whatever its length,
and its subject costs a few dots. What the coarser filter brings that the prefix does not
match, the broker's PUB drops (ZeroMQ matches every subscriber's prefix anyway).

**Interest.** The outgoing port is an XPUB: libzmq tells each prefix when its first
subscriber comes and when its last one goes. A broker listens to the filters of the
prefixes its subscribers hold, none covered by another (``o.>`` covers ``o.r.de.>``), so
a message comes once; past :data:`MAX_PREFIXES` prefixes it listens to everything.

**Once.** The broker's connection never hears its own messages (``echo: false``), and a
message with the broker's own id is dropped: sent on a connection it has since left, it can
come back on the new one (a server cut off with it routes it once healed). While
its filters change (a broader one subscribed before the narrower ones it covers are
ended, so that nothing is lost meanwhile) a message may come on two subscriptions: each
message carries its broker's id and a sequence number, and a message already sent out
is dropped (:class:`Seen`).
"""

from __future__ import annotations

import os
import struct
from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Final

from bus.errors import ProtocolError
from bus.nats.tokens import token

#: The subjects' first token unless ``--nats-subject-prefix`` says otherwise.
DEFAULT_SUBJECT_PREFIX: Final = "emqp-pubsub"
#: The token that ends a topic's subject (never a chunk's: a chunk is never empty).
END: Final = "~"
#: Prefixes listened to one by one at most; beyond, everything is listened to.
MAX_PREFIXES: Final = 10_000
#: Other brokers remembered (each its sequence window); the least recently heard goes.
MAX_ORIGINS: Final = 1_000
#: Sequence numbers remembered per broker: a message this far behind the latest is taken
#: as heard (its subscriptions deliver in order; only a change of filters repeats one).
WINDOW: Final = 4096

_HEAD = struct.Struct(">8sQI")
#: Bytes of a message beyond its topic and its message: the broker, the sequence, the
#: topic's length.
HEAD_BYTES: Final = _HEAD.size


class BadPublication(ProtocolError):
    """A NATS message under the publications' subjects that no broker made."""


def chunks(topic: bytes) -> list[bytes]:
    """``topic`` cut where each chunk is as long as everything before it (1, 1, 2, 4, ...
    bytes), the last one what remains."""
    out = []
    start, end = 0, 1
    while start < len(topic):
        out.append(topic[start:end])
        start, end = end, end * 2
    return out


def subject(prefix: str, topic: bytes) -> str:
    """The subject a publication of ``topic`` goes under."""
    return ".".join([prefix, *map(token, chunks(topic)), END])


def interest(prefix: str, subscription: bytes) -> str:
    """The subject filter of a subscriber's ``subscription`` prefix: its whole chunks, then
    ``>`` (the empty prefix, every topic: ``<prefix>.>``)."""
    whole = 1
    while whole * 2 <= len(subscription):
        whole *= 2
    head = chunks(subscription[:whole]) if subscription else []
    return ".".join([prefix, *map(token, head), ">"])


def _covers(broad: str, narrow: str) -> bool:
    """Whether filter ``broad`` (ending ``>``) takes every subject ``narrow`` takes."""
    return broad != narrow and narrow.startswith(broad[:-1])


@dataclass(slots=True)
class Interest:
    """The prefixes the subscribers hold, and the filters listened to for them (none
    covered by another)."""

    prefix: str
    limit: int = MAX_PREFIXES
    prefixes: set[bytes] = field(default_factory=set)
    #: The filters listened to now.
    filters: set[str] = field(default_factory=set)
    #: Subscription messages from the port that were neither a subscribe nor an
    #: unsubscribe (counted, ignored).
    unknown: int = 0

    def changed(self, messages: Iterable[list[bytes]]) -> tuple[list[str], list[str]]:
        """XPUB subscription messages (``\\x01`` or ``\\x00`` then the prefix) in; the filters
        to listen to and those to end, in that order (so that nothing is missed between)."""
        for frames in messages:
            message = frames[0] if frames else b""
            if message[:1] == b"\x01":
                self.prefixes.add(message[1:])
            elif message[:1] == b"\x00":
                self.prefixes.discard(message[1:])
            else:
                self.unknown += 1
        wanted = self.wanted()
        added = sorted(wanted - self.filters)
        ended = sorted(self.filters - wanted)
        self.filters = wanted
        return added, ended

    def wanted(self) -> set[str]:
        """The filters for the prefixes held now, none covered by another."""
        if not self.prefixes:
            return set()
        if len(self.prefixes) > self.limit:
            return {f"{self.prefix}.>"}
        filters = {interest(self.prefix, p) for p in self.prefixes}
        # Shortest first: a filter is kept unless a shorter one kept covers it.
        kept: list[str] = []
        for candidate in sorted(filters, key=len):
            if not any(_covers(broad, candidate) for broad in kept):
                kept.append(candidate)
        return set(kept)


def new_origin() -> bytes:
    """A broker's id in its messages: 8 random bytes, new at each start."""
    return os.urandom(8)


def encode(origin: bytes, sequence: int, topic: bytes, message: bytes) -> bytes:
    """A publication as its NATS message's payload."""
    return _HEAD.pack(origin, sequence, len(topic)) + topic + message


def decode(payload: bytes) -> tuple[bytes, int, bytes, bytes]:
    """:func:`encode`'s broker, sequence, topic and message; :class:`BadPublication` for a
    payload no broker made."""
    if len(payload) < HEAD_BYTES:
        raise BadPublication("a publication shorter than its head", "short")
    origin, sequence, length = _HEAD.unpack_from(payload)
    end = HEAD_BYTES + length
    if end > len(payload):
        raise BadPublication("a publication's topic runs past its end", "topic-length")
    return origin, sequence, payload[HEAD_BYTES:end], payload[end:]


class Seen:
    """The sequence numbers heard of each other broker lately: :meth:`first` says
    whether a message is heard for the first time."""

    def __init__(self, window: int = WINDOW, origins: int = MAX_ORIGINS) -> None:
        self.window = window
        self.max_origins = origins
        #: origin -> (the highest sequence heard, the sequences heard within the window).
        self._heard: OrderedDict[bytes, tuple[int, set[int]]] = OrderedDict()
        self.repeats = 0

    def first(self, origin: bytes, sequence: int) -> bool:
        """Whether this broker's message ``sequence`` is new (it is then remembered)."""
        heard = self._heard.get(origin)
        if heard is None:
            if len(self._heard) >= self.max_origins:
                self._heard.popitem(last=False)
            self._heard[origin] = (sequence, {sequence})
            return True
        self._heard.move_to_end(origin)
        highest, recent = heard
        if sequence in recent or sequence <= highest - self.window:
            self.repeats += 1
            return False
        recent.add(sequence)
        if sequence > highest:
            highest = sequence
            if len(recent) > 2 * self.window:  # forget what fell out of the window
                recent = {s for s in recent if s > highest - self.window}
            self._heard[origin] = (highest, recent)
        return True
