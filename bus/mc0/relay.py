"""mc0 brokers as one topic space over NATS core subjects, sans I/O: the subjects, the
relayed message's envelope, and the relay's state (:class:`Relay`).

- **Subjects.** A topic is one subject token after the prefix (``mc0.<token>``): mc0 topics
  match by exact string, so no structure is kept; the token escapes every byte that is not
  an ASCII letter, digit, ``-`` or ``_`` (:mod:`bus.nats.tokens`), one to one and back. A
  topic of 1024 bytes (the codec's limit) makes a token of 3072 characters at most.
- **Interest.** A broker subscribes to a topic's subject while it has a local subscriber of
  that topic, and only then: a PUT travels to the brokers that have a subscriber of it.
- **Envelope.** What a broker publishes for a PUT: its origin (the broker's id), when it
  was sent and its deadline (milliseconds of the origin's clock), the PUT's headers (``ID``
  taken out, as every MESSAGE has them) and its body frames. The receiving broker hands it
  as MESSAGE to its local subscribers of the topic, and never relays it on.
- **TTL as a deadline.** A relayed PUT lives for its sender's session TTL (mc0's one TTL,
  CONNECT's): its deadline is when the origin took it plus that TTL, by the origin's clock,
  and a broker drops one that comes past it. An absolute time rather than a remaining
  one: what delays a message in transit (a NATS server or a broker stopped, a TCP
  connection stalled) is then counted too, which a remaining time cannot see. It needs
  the hosts' clocks to agree to well within the TTL: MCollective, mc0's user, needs as
  much already (it refuses its own messages older than their TTL by the receiver's
  clock). A message that comes from more than a second in the future says that clocks
  disagree: it is counted and logged.
- **Acknowledged means the cluster has it.** A PUT with an ID is answered OK once the NATS
  server the broker is connected to read it (a flush: PING, then its PONG) within its
  deadline; its local subscribers have it at once. While the link is down a PUT is held,
  up to its deadline (and the hold's bounds), published when the link is back, and
  answered then; one whose deadline passes first is answered ERROR (``expired``), and one
  published on a connection lost before the server's word is answered ERROR
  (``unconfirmed``: it may or may not have been relayed; it is never published again, so
  that nothing is delivered twice). A SUB that makes a new interest is answered once the
  server read the subscription (at once while the link is down: the subscription is made
  when it is back), and so is one that joins an interest the server has not confirmed
  yet: answered at once, its client could have a PUT sent at another broker that reaches
  the server before this broker's subscription does.
"""

from __future__ import annotations

import math
import struct
from collections import Counter, deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Final, Protocol

from twisted.logger import Logger

from bus.mc0 import codec
from bus.mc0.codec import Framing, Mc0Error
from bus.nats.tokens import token
from bus.util.droplog import DropCounter, RateLimit

log = Logger(namespace="bus.mc0.relay")

#: The envelope's first bytes: its name and version.
MAGIC: Final = b"mc0\x01"
_HEAD: Final = struct.Struct(">4sqqB")  # magic, sent (ms), deadline (ms), origin's length
_COUNTS: Final = struct.Struct(">HH")  # header pairs, body frames
_LENGTH: Final = struct.Struct(">I")
#: The most bytes an envelope adds to its frames: the head, the longest origin, the counts
#: (and 4 bytes a frame).
ENVELOPE_OVERHEAD: Final = _HEAD.size + 255 + _COUNTS.size
#: The longest subject a PUB or SUB may name on a server of nats-server's default
#: ``max_control_line`` (4,096), less what else is on the command line.
DEFAULT_MAX_SUBJECT_BYTES: Final = 4096 - 96
#: Subjects kept by a relay, at most (then made again as they come).
_SUBJECTS_KEPT: Final = 65_536
#: A message sent this far (seconds) in the future, by the receiver's clock, says that
#: the hosts' clocks disagree.
CLOCK_AHEAD: Final = 1.0


def subject(prefix: str, topic: bytes) -> bytes:
    """The subject of ``topic`` under ``prefix`` (itself one or more valid tokens)."""
    return f"{prefix}.{token(topic)}".encode("ascii")


@dataclass(frozen=True, slots=True)
class Relayed:
    """A relayed PUT as a receiving broker reads it: where and when it was sent (seconds,
    by the origin's clock), when it expires, and the PUT itself (no ID)."""

    origin: bytes
    sent: float
    deadline: float
    put: codec.Put


def envelope(put: codec.Put, origin: bytes, sent: float, deadline: float) -> bytes:
    """What a broker publishes for ``put``: see the module's text."""
    if len(origin) > 255:
        raise ValueError("a broker id is at most 255 bytes")
    pack = _LENGTH.pack
    parts = [
        _HEAD.pack(MAGIC, round(sent * 1000), round(deadline * 1000), len(origin)),
        origin,
        _COUNTS.pack(len(put.headers), len(put.body)),
    ]
    for key, value in put.headers:
        parts += (pack(len(key)), key, pack(len(value)), value)
    for frame in put.body:
        parts += (pack(len(frame)), frame)
    return b"".join(parts)


def _bad(text: str) -> Mc0Error:
    return Mc0Error(f"not a relayed mc0 message: {text}", "bad-envelope")


def open_envelope(payload: bytes, max_frames: int = codec.DEFAULT_MAX_FRAMES) -> Relayed:
    """The relayed PUT in ``payload``; :class:`bus.mc0.codec.Mc0Error` (reason
    ``bad-envelope``) for anything :func:`envelope` could not have made, or a PUT the codec
    would refuse (no or an empty TOPIC, a header twice or empty, too many frames)."""
    view = memoryview(payload)
    if len(view) < _HEAD.size:
        raise _bad("too short")
    magic, sent, deadline, origin_length = _HEAD.unpack_from(view)
    if magic != MAGIC:
        raise _bad("unknown magic or version")
    at = _HEAD.size
    origin = bytes(view[at : at + origin_length])
    at += origin_length
    if len(origin) != origin_length or len(view) < at + _COUNTS.size:
        raise _bad("cut short in its head")
    pairs, bodies = _COUNTS.unpack_from(view, at)
    at += _COUNTS.size
    if 2 * pairs + bodies + 2 > max_frames:
        raise _bad(f"more than {max_frames} frames")
    frames: list[bytes] = []
    end = len(view)
    for _ in range(2 * pairs + bodies):
        if at + _LENGTH.size > end:
            raise _bad("cut short in its frames")
        (length,) = _LENGTH.unpack_from(view, at)
        at += _LENGTH.size
        if at + length > end:
            raise _bad("a frame longer than what is left")
        frames.append(bytes(view[at : at + length]))
        at += length
    if at != end:
        raise _bad("bytes after its last frame")
    headers = tuple(zip(frames[0 : 2 * pairs : 2], frames[1 : 2 * pairs : 2], strict=True))
    keys = [key for key, _ in headers]
    if not all(keys) or len(set(keys)) != len(keys) or codec.ID in keys:
        raise _bad("an empty, repeated or ID header")
    topic = next((value for key, value in headers if key == codec.TOPIC), None)
    if not topic or len(topic) > codec.MAX_TOPIC_BYTES:
        raise _bad("no topic, or one the codec refuses")
    put = codec.Put(topic, headers, tuple(frames[2 * pairs :]))
    return Relayed(origin, sent / 1000, deadline / 1000, put)


# -- the relay ----------------------------------------------------------------------------------


class Uplink(Protocol):
    """The NATS side of a :class:`Relay` (:class:`bus.mc0.link.NatsLink`; a fake in tests)."""

    @property
    def connected(self) -> bool:
        """A connection is up: what is published now reaches a server."""

    @property
    def max_payload(self) -> int:
        """The most bytes one message may hold (the server's INFO)."""

    def publish(self, subject: bytes, payload: bytes) -> bool:
        """Send now; False when there is no connection."""

    def flush(self, token: int) -> None:
        """Ask the server to confirm what was sent before: later
        :meth:`Relay.flushed` ``(token)``, or :meth:`Relay.flush_failed` ``(token)`` when
        the connection is lost first."""

    def subscribe(self, topic: bytes, subject: bytes) -> None:
        """Receive ``subject``'s messages (for ``topic``) from now on, and after every
        reconnection, until :meth:`unsubscribe`."""

    def unsubscribe(self, topic: bytes) -> None:
        """No more of ``topic``'s messages."""


#: What the relay tells the broker: answer the command ``message_id`` of the client
#: ``identity`` in ``framing``: OK (None) or ERROR (the error).
Answer = Callable[[bytes, bytes, Framing, Mc0Error | None], None]
#: A relayed PUT for the broker's local subscribers.
Deliver = Callable[[codec.Put], None]


@dataclass(frozen=True, slots=True)
class RelaySettings:
    """The subjects' prefix and how much may be held while the link is down."""

    subject_prefix: str = "mc0"
    #: PUTs held while the link to NATS is down, at most (beyond: refused).
    hold_messages: int = 10_000
    #: Their bytes (envelopes), at most.
    hold_bytes: int = 64 * 1024 * 1024


@dataclass(slots=True)
class _Ack:
    """A command answered once the server confirmed what it did."""

    identity: bytes
    message_id: bytes
    framing: Framing
    #: Past it (the relay's clock), the command is answered ERROR (``expired``).
    deadline: float
    #: A PUT (a SUB is answered OK whatever becomes of its flush).
    put: bool = True


@dataclass(slots=True)
class _Held:
    """A PUT held while the link is down: its subject and envelope."""

    subject: bytes
    payload: bytes
    sent: float
    deadline: float
    ack: _Ack | None


class Relay:
    """The broker's side of the cluster: PUTs out (published, confirmed, held), relayed PUTs
    in, interest by topic (see the module's text). Time from ``clock`` (``IReactorTime``,
    whose ``seconds()`` is the wall clock under a real reactor)."""

    def __init__(
        self,
        settings: RelaySettings,
        origin: bytes,
        clock: Any,
        uplink: Uplink,
        answer: Answer,
        deliver: Deliver,
        max_frames: int = codec.DEFAULT_MAX_FRAMES,
    ) -> None:
        self.settings = settings
        self.origin = origin
        self.clock = clock
        self.uplink = uplink
        self.answer = answer
        self.deliver = deliver
        self.max_frames = max_frames
        self.prefix = settings.subject_prefix
        #: Topics' subjects, as made (a PUT's topic is usually one of a few).
        self._subjects: dict[bytes, bytes] = {}
        #: The longest subject the servers take (learnt at start).
        self.max_subject_bytes = DEFAULT_MAX_SUBJECT_BYTES
        #: Published, waiting for the next flush to be asked.
        self._unflushed: list[_Ack] = []
        #: Flushes asked, by token: what each one's PONG confirms.
        self._flushing: dict[int, list[_Ack]] = {}
        self._tokens = 0
        #: The latest flush the server confirmed (flushes are confirmed in order).
        self._confirmed_token = 0
        #: Topics whose subscription the server has not confirmed: the flushes asked when
        #: it was written (a flush asked later confirms it).
        self._interest_asked: dict[bytes, int] = {}
        self._flush_call: Any = None
        self._held: deque[_Held] = deque()
        self.held_bytes = 0
        self._expiry_call: Any = None
        self._expiry_at = math.inf
        #: Commands refused for the cluster, by reason (the broker logs them as ERRORs).
        self.refusals: Counter[str] = Counter()
        self.drops = DropCounter(log, "relayed mc0 message", clock.seconds)
        self._clock_warning = RateLimit(clock.seconds, 60.0)
        #: PUTs published to NATS, and relayed PUTs received (and handed to subscribers).
        self.published = 0
        self.relayed_in = 0
        #: PUTs answered OK once the server confirmed them; those whose connection was
        #: lost before (answered ERROR: fate unknown).
        self.confirmed = 0
        self.unconfirmed = 0
        #: PUTs whose deadline passed while held (never published), or before the
        #: server's word came (published); relayed PUTs that came past theirs.
        self.expired_held = 0
        self.expired_unconfirmed = 0
        self.expired_received = 0
        #: PUTs held while the link was down, and published once it was back.
        self.held_total = 0
        self.held_published = 0
        #: Relayed PUTs sent, by their own clock, after the receiver's now (clocks apart).
        self.from_the_future = 0
        self.latest_ahead = 0.0

    # -- PUTs and SUBs of local clients ----------------------------------------------------------

    def subject(self, topic: bytes) -> bytes:
        """``topic``'s subject (kept for the next PUTs of the topic)."""
        made = self._subjects.get(topic)
        if made is None:
            if len(self._subjects) >= _SUBJECTS_KEPT:
                self._subjects.clear()
            made = self._subjects[topic] = subject(self.prefix, topic)
        return made

    def take(self, put: codec.Put, identity: bytes, ttl: float) -> Mc0Error | bool:
        """``put`` (from the client ``identity`` whose TTL is ``ttl`` seconds) for the
        cluster: published now or held, and then True when the relay answers it later (it
        has an ID); or why the cluster cannot take it (it then goes nowhere, here neither)."""
        subject_ = self.subject(put.topic)
        if len(subject_) > self.max_subject_bytes:
            return self._refuse(
                put,
                "topic-too-long-for-cluster",
                f"the topic's NATS subject is {len(subject_)} bytes, the NATS servers take "
                f"{self.max_subject_bytes}",
            )
        now = self.clock.seconds()
        deadline = now + ttl
        payload = envelope(put, self.origin, now, deadline)
        uplink = self.uplink
        if len(payload) > uplink.max_payload:
            return self._refuse(
                put,
                "too-large-for-cluster",
                f"the message would be {len(payload)} bytes on NATS, the servers take "
                f"{uplink.max_payload}",
            )
        ack = _Ack(identity, put.id, put.framing, deadline) if put.id is not None else None
        if not self._held and uplink.publish(subject_, payload):
            self.published += 1
            if ack is not None:
                self._unflushed.append(ack)
                self._want_flush()
            return ack is not None
        if (
            len(self._held) >= self.settings.hold_messages
            or self.held_bytes + len(payload) > self.settings.hold_bytes
        ):
            return self._refuse(
                put,
                "cluster-unreachable",
                f"the link to NATS is down and {len(self._held)} messages "
                f"({self.held_bytes} bytes) already wait for it",
            )
        self._hold(_Held(subject_, payload, now, deadline, ack))
        return ack is not None

    def _refuse(self, put: codec.Put, reason: str, text: str) -> Mc0Error:
        """Counted, and the ERROR to answer."""
        self.refusals[reason] += 1
        return Mc0Error(text, reason, put.id, put.framing)

    def topic_refusal(self, topics: Sequence[bytes], command: codec.Subscribe) -> Mc0Error | None:
        """Why a SUB of ``topics`` cannot be made in the cluster, or None."""
        for topic in topics:
            length = len(self.subject(topic))
            if length > self.max_subject_bytes:
                self.refusals["topic-too-long-for-cluster"] += 1
                return Mc0Error(
                    f"the NATS subject of topic {topic[:40]!r} is {length} bytes, the NATS "
                    f"servers take {self.max_subject_bytes}",
                    "topic-too-long-for-cluster",
                    command.id,
                    command.framing,
                )
        return None

    def acknowledge_after_flush(self, identity: bytes, message_id: bytes, framing: Framing) -> None:
        """A SUB that made a new interest: answered once the server read it (at once while
        the link is down)."""
        if not self.uplink.connected:
            self.answer(identity, message_id, framing, None)
            return
        self._unflushed.append(_Ack(identity, message_id, framing, math.inf, put=False))
        self._want_flush()

    def interest(self, topic: bytes, wanted: bool) -> None:
        """The first local subscriber of ``topic`` came (True), or its last one left."""
        if wanted:
            self.uplink.subscribe(topic, self.subject(topic))
            self._interest_asked[topic] = self._tokens
        else:
            self.uplink.unsubscribe(topic)
            self._interest_asked.pop(topic, None)

    def interest_unconfirmed(self, topic: bytes) -> bool:
        """Whether ``topic``'s subscription (made for an earlier subscriber) waits for the
        server's word: a SUB that joins it waits too."""
        asked = self._interest_asked.get(topic)
        if asked is None:
            return False
        if self._confirmed_token > asked:
            del self._interest_asked[topic]
            return False
        return True

    # -- flushes ---------------------------------------------------------------------------------

    def _want_flush(self) -> None:
        """One flush in flight at a time: what is published meanwhile waits for the next,
        asked once this turn's work is done (a PING per batch, not per PUT)."""
        if self._flushing or self._flush_call is not None:
            return
        self._flush_call = self.clock.callLater(0, self._flush)

    def _flush(self) -> None:
        self._flush_call = None
        if not self._unflushed or self._flushing:
            return
        self._tokens += 1
        self._flushing[self._tokens] = self._unflushed
        self._unflushed = []
        self.uplink.flush(self._tokens)

    def flushed(self, token_: int) -> None:
        """The server confirmed flush ``token_``: its PUTs are answered OK (ERROR for one
        whose deadline passed meanwhile), its SUBs OK."""
        acks = self._flushing.pop(token_, [])
        self._confirmed_token = max(self._confirmed_token, token_)
        now = self.clock.seconds()
        for ack in acks:
            if not ack.put:
                self.answer(ack.identity, ack.message_id, ack.framing, None)
            elif now <= ack.deadline:
                self.confirmed += 1
                self.answer(ack.identity, ack.message_id, ack.framing, None)
            else:
                self.expired_unconfirmed += 1
                self.answer(
                    ack.identity,
                    ack.message_id,
                    ack.framing,
                    Mc0Error(
                        f"expired: the NATS server confirmed it {now - ack.deadline:.3f}s past "
                        "its sender's TTL",
                        "expired",
                        ack.message_id,
                        ack.framing,
                    ),
                )
        if self._unflushed:
            self._want_flush()

    def flush_failed(self, token_: int) -> None:
        """The connection of flush ``token_`` was lost before its PONG."""
        self._unconfirmed(self._flushing.pop(token_, []))

    def _unconfirmed(self, acks: list[_Ack]) -> None:
        for ack in acks:
            if not ack.put:
                self.answer(ack.identity, ack.message_id, ack.framing, None)
                continue
            self.unconfirmed += 1
            self.answer(
                ack.identity,
                ack.message_id,
                ack.framing,
                Mc0Error(
                    "unconfirmed: the link to NATS was lost before the server confirmed the "
                    "message (it may have been relayed or not; delivered here)",
                    "unconfirmed",
                    ack.message_id,
                    ack.framing,
                ),
            )

    # -- the link --------------------------------------------------------------------------------

    def link_lost(self) -> None:
        """The connection is lost: what was published on it and not yet in a flush is
        answered ERROR (``unconfirmed``); flushes under way fail on their own."""
        unflushed, self._unflushed = self._unflushed, []
        self._unconfirmed(unflushed)

    def link_up(self) -> None:
        """A connection is up (the subscriptions are made again before): what was held is
        published in order, then confirmed by a flush."""
        now = self.clock.seconds()
        while self._held and self.uplink.connected:
            held = self._held[0]
            if now > held.deadline:
                self._held.popleft()
                self.held_bytes -= len(held.payload)
                self._expire(held, now)
                continue
            if not self.uplink.publish(held.subject, held.payload):
                break
            self._held.popleft()
            self.held_bytes -= len(held.payload)
            self.published += 1
            self.held_published += 1
            if held.ack is not None:
                self._unflushed.append(held.ack)
        if self._unflushed:
            self._want_flush()

    def _hold(self, held: _Held) -> None:
        self._held.append(held)
        self.held_bytes += len(held.payload)
        self.held_total += 1
        if held.deadline < self._expiry_at:
            self._arm_expiry(held.deadline)

    def _arm_expiry(self, at: float) -> None:
        if self._expiry_call is not None and self._expiry_call.active():
            self._expiry_call.cancel()
        self._expiry_call = None
        self._expiry_at = at
        if at < math.inf:
            delay = max(0.0, at - self.clock.seconds())
            self._expiry_call = self.clock.callLater(delay, self._expire_held)

    def _expire_held(self) -> None:
        """Held PUTs past their deadline are answered ERROR now, not when the link is back."""
        self._expiry_call = None
        now = self.clock.seconds()
        kept: deque[_Held] = deque()
        for held in self._held:
            if now >= held.deadline:
                self.held_bytes -= len(held.payload)
                self._expire(held, now)
            else:
                kept.append(held)
        self._held = kept
        self._arm_expiry(min((held.deadline for held in kept), default=math.inf))

    def _expire(self, held: _Held, now: float) -> None:
        self.expired_held += 1
        if held.ack is not None:
            ack = held.ack
            self.answer(
                ack.identity,
                ack.message_id,
                ack.framing,
                Mc0Error(
                    f"expired: the link to NATS was down for the sender's TTL "
                    f"({held.deadline - held.sent:.3f}s); delivered here only",
                    "expired",
                    ack.message_id,
                    ack.framing,
                ),
            )

    @property
    def held(self) -> int:
        """PUTs waiting for the link."""
        return len(self._held)

    # -- relayed PUTs in -------------------------------------------------------------------------

    def received(self, topic: bytes, payload: bytes) -> None:
        """A relayed PUT on ``topic``'s subject: to the local subscribers, unless it is not
        one, is this broker's own, is for another topic, or came past its deadline."""
        try:
            relayed = open_envelope(payload, self.max_frames)
        except Mc0Error as error:
            self.drops.drop(error.reason, str(error))
            return
        if relayed.origin == self.origin:
            self.drops.drop("own", "a message this broker relayed came back to it")
            return
        if relayed.put.topic != topic:
            self.drops.drop("wrong-topic", "a message whose TOPIC is not its subject's")
            return
        now = self.clock.seconds()
        if relayed.sent > now + CLOCK_AHEAD:
            self.from_the_future += 1
            self.latest_ahead = round(relayed.sent - now, 3)
            count = self._clock_warning.due("ahead")
            if count is not None:
                log.warn(
                    "{count} mc0 message(s) relayed from broker {origin} were sent {ahead}s "
                    "in this host's future: the hosts' clocks disagree, and relayed messages "
                    "live by them (their sender's TTL from when it was sent)",
                    count=count,
                    origin=relayed.origin.decode("utf-8", "replace"),
                    ahead=self.latest_ahead,
                )
        if now > relayed.deadline:
            self.expired_received += 1
            self.drops.drop(
                "expired",
                f"a message from broker {relayed.origin.decode('utf-8', 'replace')} came "
                f"{now - relayed.deadline:.3f}s past its deadline",
            )
            return
        self.relayed_in += 1
        self.deliver(relayed.put)

    def close(self) -> None:
        """Cancel the relay's timers (the service is stopping)."""
        for call in (self._flush_call, self._expiry_call):
            if call is not None and call.active():
                call.cancel()
        self._flush_call = self._expiry_call = None

    def status(self) -> dict[str, Any]:
        """The relay's counts, for ``/status``."""
        return {
            "published": self.published,
            "confirmed": self.confirmed,
            "unconfirmed": self.unconfirmed,
            "received": self.relayed_in,
            "held": len(self._held),
            "held_bytes": self.held_bytes,
            "held_total": self.held_total,
            "held_published": self.held_published,
            "expired": {
                "held": self.expired_held,
                "unconfirmed": self.expired_unconfirmed,
                "received": self.expired_received,
            },
            "awaiting_confirmation": len(self._unflushed)
            + sum(len(acks) for acks in self._flushing.values()),
            "refused": dict(self.refusals),
            "dropped": dict(self.drops.counts),
            "from_the_future": self.from_the_future,
            "latest_ahead_s": self.latest_ahead,
            "max_subject_bytes": self.max_subject_bytes,
        }
