"""Event BUS wire format, sans-I/O: lists of frames <-> commands.

Nothing here touches sockets or the reactor. Every malformed input raises a
:class:`EventBusError` (a :class:`bus.errors.ProtocolError`) whose ``reason`` names
the defect; nothing else escapes. This module is the fuzz target.

Dialects. The text (spec 000) encodes sequences as 8 bytes in network order and
separates subtrees with ``;``. The original Node.js implementation encodes them as
ASCII decimal, sends ``null`` as the sequence of a new event and separates subtrees
with ``,``. Everything that can be told apart per message is accepted always:

* a sequence frame of ASCII digits is decimal text; otherwise 8 bytes are binary.
  (8 ASCII digits read as binary would be >= 0x3030303030303030, about 3.5e18, a
  sequence no bus reaches, so the decimal reading is the right one);
* ``null`` and an empty frame mean "no sequence";
* both ``;`` and ``,`` separate subtrees.

What cannot be told apart (how BROADCAST encodes its sequence) is a server option,
:class:`SequenceEncoding`.
"""

from __future__ import annotations

import enum
import re
import struct
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Final, NamedTuple

import msgpack

from bus.errors import ProtocolError
from bus.util.compiled import compiled

SEQUENCE: Final = struct.Struct(">Q")
MAX_SEQUENCE: Final = 2**64 - 1

SYNCSTART: Final = b"SYNCSTART"
SYNC: Final = b"SYNC"
SYNCEND: Final = b"SYNCEND"
#: Topic of the server heartbeat on the PUB socket. Topics starting with ``$``
#: are reserved for the server: a PUB to one is refused.
HEARTBEAT_TOPIC: Final = b"$heartbeat"
#: A subtree no topic is in: a SYNCSTART for it is answered by a lone SYNCEND (a liveness
#: probe for servers without heartbeats).
PROBE_SUBTREE: Final = b"$probe/"
RESERVED_PREFIX: Final = b"$"

MAX_TOPIC_BYTES: Final = 4096
MAX_PRODUCER_BYTES: Final = 1024
MAX_TIMESTAMP_BYTES: Final = 64
#: A uuid's text (8-4-4-4-12 hex digits), the only form a PUB's uuid may take.
UUID_BYTES: Final = 36
MAX_SUBTREE_SPEC_BYTES: Final = 65536
DEFAULT_MAX_DATA_BYTES: Final = 1024 * 1024

_UUID = re.compile(rb"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}")
_DIGITS = re.compile(rb"[0-9]{1,20}")
# fromisoformat stops at a NUL after "Z", so the characters are checked first.
_TIMESTAMP_CHARS = re.compile(rb"[0-9A-Za-z:.,+\- ]{1,64}")
_SUBTREE_SEPARATOR = re.compile(rb"[;,]")


class EventBusError(ProtocolError):
    """Malformed Event BUS input."""


class SequenceEncoding(enum.Enum):
    """How a sequence number travels: the text's 8 bytes, or the original's decimal text."""

    BINARY = "binary"
    TEXT = "text"


class Event(NamedTuple):
    """One event as it travels: every field as the producer sent it, plus the bus sequence.

    A named tuple: immutable, and three times cheaper to build than a frozen dataclass,
    which matters at a hundred thousand per second."""

    topic: bytes
    sequence: int
    producer: bytes
    timestamp: bytes
    uuid: bytes
    data: bytes

    @property
    def topic_name(self) -> str:
        """The topic as text."""
        return self.topic.decode("utf-8")

    @property
    def producer_id(self) -> str:
        """The producer's id as text."""
        return self.producer.decode("utf-8")

    @property
    def event_id(self) -> str:
        """The event's UUID as text."""
        return self.uuid.decode("ascii")

    @property
    def time(self) -> datetime:
        """The producer's timestamp, parsed (naive if the producer gave no offset)."""
        return datetime.fromisoformat(self.timestamp.decode("ascii"))

    def value(self) -> Any:
        """The event data, unpacked from msgpack."""
        return msgpack.unpackb(self.data, raw=False, strict_map_key=False)


@dataclass(frozen=True, slots=True)
class SnapshotRequest:
    """A SYNCSTART: the subtrees wanted (empty means all) and the sequence to start above."""

    subtrees: tuple[bytes, ...]
    since: int
    spec: bytes
    #: The encoding the request's sequence used, or None when it carried none.
    encoding: SequenceEncoding | None

    def matches(self, topic: bytes) -> bool:
        """Whether ``topic`` is in one of the subtrees asked for."""
        return not self.subtrees or topic.startswith(self.subtrees)


@dataclass(frozen=True, slots=True)
class SnapshotEnd:
    """A SYNCEND: the snapshot is complete up to ``sequence``."""

    spec: bytes
    sequence: int


@dataclass(frozen=True, slots=True)
class Heartbeat:
    """The server's periodic beat on the PUB socket, carrying its current sequence."""

    sequence: int
    store_id: str


# -- sequences -----------------------------------------------------------------------


def encode_sequence(sequence: int, encoding: SequenceEncoding = SequenceEncoding.BINARY) -> bytes:
    """``sequence`` as a sequence frame: 8 bytes in network order, or decimal text."""
    if encoding is SequenceEncoding.TEXT:
        return b"%d" % sequence
    return SEQUENCE.pack(sequence)


def decode_sequence(frame: bytes) -> tuple[int | None, SequenceEncoding | None]:
    """Read a sequence frame in either dialect; ``(None, None)`` for empty or ``null``."""
    if not frame or frame == b"null":
        return None, (SequenceEncoding.TEXT if frame else None)
    if _DIGITS.fullmatch(frame):
        value = int(frame)
        if value > MAX_SEQUENCE:
            raise EventBusError("sequence out of range", "bad-sequence")
        return value, SequenceEncoding.TEXT
    if len(frame) == 8:
        return SEQUENCE.unpack(frame)[0], SequenceEncoding.BINARY
    raise EventBusError(f"sequence frame of {len(frame)} bytes", "bad-sequence")


def _required_sequence(frame: bytes) -> int:
    value, _ = decode_sequence(frame)
    if value is None:
        raise EventBusError("missing sequence", "bad-sequence")
    return value


# -- field validation ------------------------------------------------------------------


def _check_text(value: bytes, what: str, limit: int, reason: str) -> None:
    if len(value) > limit:
        raise EventBusError(f"{what} longer than {limit} bytes", "oversized")
    try:
        value.decode("utf-8")
    except UnicodeDecodeError:
        raise EventBusError(f"{what} is not UTF-8", reason) from None


def iso_timestamp(moment: datetime | None = None) -> bytes:
    """``moment`` (default: now) in UTC ISO-8601 with milliseconds, as the original
    implementation writes event timestamps."""
    moment = moment or datetime.now(UTC)
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z").encode()


def check_topic(topic: bytes) -> None:
    """Raise :class:`EventBusError` unless ``topic`` is non-empty UTF-8 within
    :data:`MAX_TOPIC_BYTES`."""
    if not topic:
        raise EventBusError("empty topic", "bad-topic")
    _check_text(topic, "topic", MAX_TOPIC_BYTES, "bad-topic")


def check_published_topic(topic: bytes) -> None:
    """A topic a PUB may carry (what :func:`parse_pub` checks of it): not empty, UTF-8, at
    most MAX_TOPIC_BYTES, not reserved (``$``)."""
    check_topic(topic)
    if topic.startswith(RESERVED_PREFIX):
        raise EventBusError("topics starting with $ are reserved", "reserved-topic")


def check_producer(producer: bytes) -> None:
    """A producer id a PUB may carry: UTF-8, at most MAX_PRODUCER_BYTES."""
    _check_text(producer, "producer id", MAX_PRODUCER_BYTES, "bad-producer")


def check_timestamp(timestamp: bytes) -> None:
    """Raise :class:`EventBusError` unless ``timestamp`` is a short ISO-8601 time."""
    if len(timestamp) > MAX_TIMESTAMP_BYTES:
        raise EventBusError("timestamp too long", "bad-timestamp")
    if not _TIMESTAMP_CHARS.fullmatch(timestamp):
        raise EventBusError("timestamp has characters ISO-8601 does not use", "bad-timestamp")
    try:
        datetime.fromisoformat(timestamp.decode("ascii"))
    except (UnicodeDecodeError, ValueError):
        raise EventBusError("timestamp is not ISO-8601", "bad-timestamp") from None


def check_uuid(value: bytes) -> None:
    """Raise :class:`EventBusError` unless ``value`` is a UUID in its text form."""
    if not _UUID.fullmatch(value):
        raise EventBusError("event id is not a UUID", "bad-uuid")


def check_payload(data: bytes, max_bytes: int = DEFAULT_MAX_DATA_BYTES) -> None:
    """Raise :class:`EventBusError` unless ``data`` is one msgpack object of at most
    ``max_bytes``."""
    if len(data) > max_bytes:
        raise EventBusError(f"event data over {max_bytes} bytes", "oversized")
    try:
        msgpack.unpackb(data, raw=True, strict_map_key=False)
    except Exception:  # msgpack raises several unrelated types for bad input
        raise EventBusError("event data is not one msgpack object", "bad-payload") from None


# -- collector side (PUB in, BROADCAST/SYNC out) ---------------------------------------


def parse_pub(frames: list[bytes], max_data_bytes: int = DEFAULT_MAX_DATA_BYTES) -> Event:
    """Validate a PUB (without the ROUTER identity). The sequence it carries is ignored:
    the server assigns its own, so the result has sequence 0."""
    if len(frames) != 6:
        raise EventBusError(f"PUB has {len(frames)} frames, expected 6", "frame-count")
    topic, sequence, producer, timestamp, uuid, data = frames
    check_published_topic(topic)
    decode_sequence(sequence)
    check_producer(producer)
    check_timestamp(timestamp)
    check_uuid(uuid)
    check_payload(data, max_data_bytes)
    return Event(topic, 0, producer, timestamp, uuid, data)


EventFields = tuple[bytes, bytes, bytes, bytes, bytes]


def parse_pub_fields(
    frames: list[bytes], max_data_bytes: int = DEFAULT_MAX_DATA_BYTES
) -> EventFields:
    """The collector's hot path: the same checks as :func:`parse_pub`, returning
    ``(topic, producer, timestamp, uuid, data)`` without building an :class:`Event`.

    Valid input takes one inlined pass; anything else goes through :func:`parse_pub`,
    the reference, which raises the precise error."""
    if len(frames) == 6:
        topic, sequence, producer, timestamp, uuid, data = frames
        if (
            0 < len(topic) <= MAX_TOPIC_BYTES
            and topic[0] != 36  # "$": reserved
            and (len(sequence) == 8 or not sequence or sequence == b"null")
            and len(producer) <= MAX_PRODUCER_BYTES
            and len(data) <= max_data_bytes
            and _UUID.fullmatch(uuid)
            and _TIMESTAMP_CHARS.fullmatch(timestamp)
        ):
            try:
                topic.decode("utf-8")
                producer.decode("utf-8")
                datetime.fromisoformat(timestamp.decode("ascii"))
                msgpack.unpackb(data, raw=True, strict_map_key=False)
            except Exception:  # the reference below names the defect
                pass
            else:
                return topic, producer, timestamp, uuid, data
    event = parse_pub(frames, max_data_bytes)
    return event.topic, event.producer, event.timestamp, event.uuid, event.data


#: What a uuid's text holds besides its four dashes.
_HEX_DIGITS: Final = b"0123456789abcdefABCDEF"
#: Topics remembered as valid are at most this long (bounds the memory they take).
_REMEMBERED_TOPIC_BYTES: Final = 256


#: The compiled PUB check (bus/eventbus/_pubscan.c), or None (not built, or
#: ``BUS_NATIVE_PUBS=0``); :class:`PubParser`'s Python loop gives the same results.
native: Any = compiled("bus.eventbus._pubscan", "BUS_NATIVE_PUBS")
if native is not None:
    # What the compiled pass checks of a topic, producer id or timestamp it has not seen: the
    # reference's limits, and fromisoformat itself for timestamps.
    native.checks(
        MAX_TOPIC_BYTES,
        MAX_PRODUCER_BYTES,
        MAX_TIMESTAMP_BYTES,
        _REMEMBERED_TOPIC_BYTES,
        datetime.fromisoformat,
    )


class PubParser:
    """The collector's hot path: :func:`parse_pub_fields` over a batch read from a ROUTER,
    remembering the topics, producer ids and timestamps it found valid (publishers repeat
    them: a timestamp has a millisecond's events), so that a PUB whose three are known costs
    only the checks of its own uuid and data (in C where bus/eventbus/_pubscan.c was built).
    The same PUBs are accepted and refused, for the same reasons, as :func:`parse_pub` says
    (tests/test_eventbus_codec_fastpath.py). Each memory holds at most ``remember`` entries,
    all forgotten at once when full."""

    def __init__(self, max_data_bytes: int = DEFAULT_MAX_DATA_BYTES, remember: int = 4096) -> None:
        self.max_data_bytes = max_data_bytes
        self.remember = remember
        self._topics: set[bytes] = set()
        self._producers: set[bytes] = set()
        self._timestamps: set[bytes] = set()

    def parse_batch(
        self, batch: list[list[bytes]]
    ) -> tuple[list[EventFields], list[tuple[bytes, EventBusError]]]:
        """Messages ``[identity, *PUB frames]`` (a REQ-style empty delimiter allowed after the
        identity): the valid ones' fields, in order, and each refused one's identity and error."""
        if native is None:
            return self._parse_batch(batch)
        refused: list[tuple[bytes, EventBusError]] = []
        known, topics, producers = native.known, self._topics, self._producers
        timestamps, max_data, unpack = self._timestamps, self.max_data_bytes, msgpack.unpackb
        remember = self.remember
        accepted, index = known(batch, 0, topics, producers, timestamps, max_data, unpack, remember)
        while index < len(batch):
            # What the compiled pass did not take: a PUB refused, or one with a delimiter.
            self._parse_one(batch[index], accepted, refused)
            taken, index = known(
                batch, index + 1, topics, producers, timestamps, max_data, unpack, remember
            )
            accepted += taken
        return accepted, refused

    def _parse_batch(
        self, batch: list[list[bytes]]
    ) -> tuple[list[EventFields], list[tuple[bytes, EventBusError]]]:
        """:meth:`parse_batch` in Python alone."""
        accepted: list[EventFields] = []
        refused: list[tuple[bytes, EventBusError]] = []
        keep = accepted.append
        topics, producers, timestamps = self._topics, self._producers, self._timestamps
        max_data = self.max_data_bytes
        unpack = msgpack.unpackb
        for frames in batch:
            # One pass for a PUB whose topic, producer id and timestamp were seen valid: the
            # rest (sequence, uuid, data) is checked here as parse_pub_fields checks it.
            if len(frames) == 7:
                _, topic, sequence, producer, timestamp, uuid, data = frames
                if (
                    topic in topics
                    and producer in producers
                    and timestamp in timestamps
                    and (len(sequence) == 8 or not sequence or sequence == b"null")
                    and len(data) <= max_data
                    and len(uuid) == 36
                    and uuid[8:24:5] == b"----"
                    and uuid.translate(None, _HEX_DIGITS) == b"----"
                ):
                    try:
                        unpack(data, raw=True, strict_map_key=False)
                    except Exception:  # the reference below names the defect
                        pass
                    else:
                        keep((topic, producer, timestamp, uuid, data))
                        continue
            self._parse_one(frames, accepted, refused)
        return accepted, refused

    def _parse_one(
        self,
        frames: list[bytes],
        accepted: list[EventFields],
        refused: list[tuple[bytes, EventBusError]],
    ) -> None:
        """One message through the reference checks: accepted (and what it shows valid
        remembered) or refused."""
        body = frames[1:]
        if len(body) == 7 and not body[0]:
            body = body[1:]  # a REQ-style empty delimiter
        try:
            fields = parse_pub_fields(body, self.max_data_bytes)
        except EventBusError as error:
            refused.append((frames[0], error))
            return
        accepted.append(fields)
        self._learn(fields)

    def _learn(self, fields: EventFields) -> None:
        """Remember the topic, producer id and timestamp of a valid PUB."""
        topic, producer, timestamp = fields[0], fields[1], fields[2]
        for known, value in (
            (self._topics, topic if len(topic) <= _REMEMBERED_TOPIC_BYTES else None),
            (self._producers, producer if len(producer) <= _REMEMBERED_TOPIC_BYTES else None),
            (self._timestamps, timestamp),
        ):
            if value is not None and value not in known:
                if len(known) >= self.remember:
                    known.clear()
                known.add(value)


def split_subtrees(spec: bytes) -> tuple[bytes, ...]:
    """The subtrees of a SYNCSTART's specification, split on ``;`` or ``,`` (empty ones dropped)."""
    return tuple(part for part in _SUBTREE_SEPARATOR.split(spec) if part)


def parse_sync_start(frames: list[bytes]) -> SnapshotRequest:
    """Validate a SYNCSTART (without the ROUTER identity). The text shows three frames but
    says "two": a missing sequence frame means 0."""
    if not frames or frames[0] != SYNCSTART:
        raise EventBusError("unknown command", "unknown-command")
    if len(frames) not in (2, 3):
        raise EventBusError(f"SYNCSTART has {len(frames)} frames", "frame-count")
    spec = frames[1]
    if len(spec) > MAX_SUBTREE_SPEC_BYTES:
        raise EventBusError("subtree specification too long", "oversized")
    since, encoding = decode_sequence(frames[2]) if len(frames) == 3 else (None, None)
    return SnapshotRequest(split_subtrees(spec), since or 0, spec, encoding)


def broadcast_messages(
    first_sequence: int, fields: list[EventFields], encoding: SequenceEncoding
) -> list[list[bytes]]:
    """BROADCASTs for consecutive events starting at ``first_sequence`` (the hot path;
    compiled where bus/eventbus/_pubscan.c was built)."""
    if native is not None:
        made: list[list[bytes]] | None = native.broadcasts(
            first_sequence, fields, encoding is SequenceEncoding.BINARY
        )
        if made is not None:
            return made
    pack = SEQUENCE.pack if encoding is SequenceEncoding.BINARY else b"%d".__mod__
    return [
        [topic, pack(sequence), producer, timestamp, uuid, data]
        for sequence, (topic, producer, timestamp, uuid, data) in enumerate(fields, first_sequence)
    ]


def broadcast_frames(event: Event, encoding: SequenceEncoding) -> list[bytes]:
    """The BROADCAST of ``event`` on the PUB socket."""
    return [
        event.topic,
        encode_sequence(event.sequence, encoding),
        event.producer,
        event.timestamp,
        event.uuid,
        event.data,
    ]


def sync_frames(event: Event, encoding: SequenceEncoding) -> list[bytes]:
    """One event of a snapshot (a SYNC), to the client that asked."""
    return [SYNC, *broadcast_frames(event, encoding)]


def sync_messages(
    identity: bytes,
    rows: list[tuple[int, bytes, bytes, bytes, bytes, bytes]],
    encoding: SequenceEncoding,
) -> list[list[bytes]]:
    """SYNC messages for a ROUTER (``identity`` first) straight from the store's rows
    ``(seq, topic, producer, timestamp, uuid, data)``: the snapshot's hot path."""
    if encoding is SequenceEncoding.TEXT:
        return [[identity, SYNC, t, b"%d" % s, p, ts, u, d] for s, t, p, ts, u, d in rows]
    pack = SEQUENCE.pack
    return [[identity, SYNC, t, pack(s), p, ts, u, d] for s, t, p, ts, u, d in rows]


class SyncChunk(NamedTuple):
    """A chunk of a snapshot's messages made where the log read them (a replicated
    stream's reader thread), as :func:`sync_messages` makes them, with each one's
    sequence."""

    sequences: list[int]
    messages: list[list[bytes]]


def sync_end_frames(spec: bytes, sequence: int, encoding: SequenceEncoding) -> list[bytes]:
    """The SYNCEND closing the snapshot asked for by ``spec``: complete up to ``sequence``."""
    return [SYNCEND, spec, encode_sequence(sequence, encoding)]


def heartbeat_frames(sequence: int, store_id: str, encoding: SequenceEncoding) -> list[bytes]:
    """The server's heartbeat on the PUB socket: its sequence now and its store's id."""
    return [HEARTBEAT_TOPIC, encode_sequence(sequence, encoding), store_id.encode("ascii")]


# -- client side (PUB/SYNCSTART out, BROADCAST/SYNC in) --------------------------------


def pub_frames(
    topic: bytes, producer: bytes, timestamp: bytes, uuid: bytes, data: bytes
) -> list[bytes]:
    """A PUB as the text has it; the sequence frame is 0 because the server assigns it."""
    return [topic, SEQUENCE.pack(0), producer, timestamp, uuid, data]


class Dialect(enum.Enum):
    """How a client speaks to a server.

    ``spec``: the text (8-byte sequences, ``;`` between subtrees, heartbeats on PUB).
    ``original``: the Node.js implementation (event-bus-zeromq 3.x): it reads SYNCSTART's
    sequence as decimal text and splits subtrees on ``,``; its publisher sends ``null`` as a
    new event's sequence; it sends no heartbeat; and it routes snapshot answers back only to
    a client whose socket identity is valid UTF-8 (it turns the identity into a string)."""

    SPEC = "spec"
    ORIGINAL = "original"

    @property
    def encoding(self) -> SequenceEncoding:
        """How this dialect's SYNCSTART carries its sequence."""
        return SequenceEncoding.BINARY if self is Dialect.SPEC else SequenceEncoding.TEXT

    @property
    def separator(self) -> bytes:
        """What separates the subtrees of a SYNCSTART in this dialect."""
        return b";" if self is Dialect.SPEC else b","

    @property
    def has_heartbeats(self) -> bool:
        """Whether a server of this dialect sends heartbeats."""
        return self is Dialect.SPEC

    def sync_start(self, subtrees: tuple[bytes, ...] | list[bytes], since: int) -> list[bytes]:
        """A SYNCSTART for ``subtrees`` above ``since``, as a server of this dialect reads it."""
        return sync_start_frames(subtrees, since, self.encoding, self.separator)

    def pub(
        self, topic: bytes, producer: bytes, timestamp: bytes, uuid: bytes, data: bytes
    ) -> list[bytes]:
        """A PUB as a server of this dialect expects it."""
        if self is Dialect.SPEC:
            return pub_frames(topic, producer, timestamp, uuid, data)
        return [topic, b"null", producer, timestamp, uuid, data]


def sync_start_frames(
    subtrees: tuple[bytes, ...] | list[bytes],
    since: int,
    encoding: SequenceEncoding = SequenceEncoding.BINARY,
    separator: bytes = b";",
) -> list[bytes]:
    """A SYNCSTART (as a DEALER sends it): the subtrees joined by ``separator``, and the sequence to
    start above."""
    return [SYNCSTART, separator.join(subtrees), encode_sequence(since, encoding)]


def _event(frames: list[bytes]) -> Event:
    topic, sequence, producer, timestamp, uuid, data = frames
    return Event(topic, _required_sequence(sequence), producer, timestamp, uuid, data)


def parse_published(frames: list[bytes]) -> Event | Heartbeat:
    """Decode what a SUB socket receives: a BROADCAST or a server heartbeat."""
    if frames and frames[0] == HEARTBEAT_TOPIC:
        if len(frames) != 3:
            raise EventBusError("heartbeat has wrong frame count", "frame-count")
        try:
            store_id = frames[2].decode("ascii")
        except UnicodeDecodeError:
            raise EventBusError("heartbeat store id is not ASCII", "bad-heartbeat") from None
        return Heartbeat(_required_sequence(frames[1]), store_id)
    if len(frames) != 6:
        raise EventBusError(f"BROADCAST has {len(frames)} frames, expected 6", "frame-count")
    topic, sequence, producer, timestamp, uuid, data = frames
    if len(sequence) == 8 and not sequence.isdigit():  # the common case, inline
        return Event(topic, SEQUENCE.unpack(sequence)[0], producer, timestamp, uuid, data)
    return _event(frames)


def parse_snapshot_reply(frames: list[bytes]) -> Event | SnapshotEnd:
    """Decode what a snapshot DEALER receives: SYNC or SYNCEND."""
    if frames and frames[0] == SYNC:
        if len(frames) != 7:
            raise EventBusError(f"SYNC has {len(frames)} frames, expected 7", "frame-count")
        sequence = frames[2]
        if len(sequence) == 8 and not sequence.isdigit():  # the common case, inline
            _, topic, _, producer, timestamp, uuid, data = frames
            return Event(topic, SEQUENCE.unpack(sequence)[0], producer, timestamp, uuid, data)
        return _event(frames[1:])
    if frames and frames[0] == SYNCEND:
        if len(frames) != 3:
            raise EventBusError(f"SYNCEND has {len(frames)} frames", "frame-count")
        return SnapshotEnd(frames[1], _required_sequence(frames[2]))
    raise EventBusError("unknown snapshot reply", "unknown-command")
