"""mc0 wire format (spec 002, mc0 v0.3), sans-I/O: lists of frames <-> commands.

A message is ``[VERB, KEY1, VAL1, ..., "", POSITIONAL...]``: a verb, header pairs, then
optionally an empty frame and positional frames (SUB/UNSUB topics, PUT/MESSAGE body).

Two framings, told apart per message by its first frame:

* ``DELIMITED`` (the real Ruby connector and C++ mc0d): an empty frame leads,
  ``["", VERB, ...]``, as a REQ-style envelope;
* ``SPEC``: the arrays as the text writes them, ``[VERB, ...]``.

Verbs are never empty, so the two cannot be confused. Each peer is answered in the
framing of the message it sent.

Headers are read in pairs; at a key position an empty frame ends them. A key without a
value (an odd header count, which crashed mc0d) is an error, and so is a header named
twice. Every malformed input raises :class:`Mc0Error`, carrying the message's ``ID``
header when one could be read (an ERROR reply names it) and its framing.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final, NamedTuple

from bus.errors import ProtocolError

CONNECT: Final = b"CONNECT"
DISCONNECT: Final = b"DISCONNECT"
NOOP: Final = b"NOOP"
SUB: Final = b"SUB"
UNSUB: Final = b"UNSUB"
PUT: Final = b"PUT"
MESSAGE: Final = b"MESSAGE"
OK: Final = b"OK"
ERROR: Final = b"ERROR"

ID: Final = b"ID"
TTL: Final = b"TTL"
VERSION: Final = b"VERSION"
TOPIC: Final = b"TOPIC"

CLIENT_VERBS: Final = frozenset({CONNECT, DISCONNECT, NOOP, SUB, UNSUB, PUT})
BROKER_VERBS: Final = frozenset({MESSAGE, OK, ERROR, NOOP})

#: Version this implementation speaks; CONNECT may name any (the real connector says 0.2).
PROTOCOL_VERSION: Final = b"0.3"
MAX_TOPIC_BYTES: Final = 1024
MAX_TTL_MS: Final = 2**31 - 1
DEFAULT_MAX_MESSAGE_BYTES: Final = 1024 * 1024
DEFAULT_MAX_FRAMES: Final = 1024
_MAX_VERB_BYTES: Final = 32
_MAX_TTL_DIGITS: Final = 10

Headers = tuple[tuple[bytes, bytes], ...]


class Framing(enum.Enum):
    """How a peer frames its messages: an empty frame first (``delimited``: the Ruby connector,
    mc0d), or the text's arrays (``spec``). Each peer is answered in its own."""

    DELIMITED = "delimited"
    SPEC = "spec"


class Mc0Error(ProtocolError):
    """Malformed mc0 input. ``message_id`` is the message's ID header if it had a readable
    one; ``framing`` is how the message was framed (for the ERROR reply)."""

    def __init__(
        self,
        message: str,
        reason: str,
        message_id: bytes | None = None,
        framing: Framing = Framing.SPEC,
    ) -> None:
        super().__init__(message, reason)
        self.message_id = message_id
        self.framing = framing


# -- decoded messages -----------------------------------------------------------------------


class Parsed(NamedTuple):
    """Any well-formed message: the verb, its header pairs in order, its positionals.
    (A tuple: made for every message, it must be cheap.)"""

    verb: bytes
    headers: Headers
    positionals: tuple[bytes, ...]
    framing: Framing

    def header(self, name: bytes) -> bytes | None:
        """The value of header ``name`` (the first one), or None."""
        for key, value in self.headers:
            if key == name:
                return value
        return None

    @property
    def id(self) -> bytes | None:
        """The message's ID header, or None."""
        return self.header(ID)


@dataclass(frozen=True, slots=True)
class Connect:
    """CONNECT: a client starts a session with its TTL and protocol version."""

    ttl_ms: int | None
    version: bytes | None
    id: bytes | None = None
    framing: Framing = Framing.SPEC


@dataclass(frozen=True, slots=True)
class Disconnect:
    """DISCONNECT: a client ends its session; its subscriptions go with it."""

    id: bytes | None = None
    framing: Framing = Framing.SPEC


@dataclass(frozen=True, slots=True)
class Noop:
    """NOOP: a keepalive, either way."""

    id: bytes | None = None
    framing: Framing = Framing.SPEC


@dataclass(frozen=True, slots=True)
class Subscribe:
    """SUB: the client wants the MESSAGEs of ``topics`` (exact names)."""

    topics: tuple[bytes, ...]
    id: bytes | None = None
    framing: Framing = Framing.SPEC


@dataclass(frozen=True, slots=True)
class Unsubscribe:
    """UNSUB: the client no longer wants ``topics``."""

    topics: tuple[bytes, ...]
    id: bytes | None = None
    framing: Framing = Framing.SPEC


@dataclass(frozen=True, slots=True)
class Put:
    """PUT: a message for every subscriber of ``topic``, the sender included."""

    topic: bytes
    #: Every header of the PUT (TOPIC and any X-... included), ID excluded: what each
    #: MESSAGE carries.
    headers: Headers
    body: tuple[bytes, ...]
    id: bytes | None = None
    framing: Framing = Framing.SPEC


@dataclass(frozen=True, slots=True)
class Ok:
    """OK: the broker did what the message ``id`` asked (every verb with an ID is answered
    OK or ERROR)."""

    id: bytes | None


@dataclass(frozen=True, slots=True)
class Error:
    """ERROR: the broker refused the message ``id``, saying why in ``message``."""

    message: bytes
    id: bytes | None


@dataclass(frozen=True, slots=True)
class Message:
    """A MESSAGE from the broker: the PUT's headers (TOPIC among them) and body."""

    headers: Headers
    body: tuple[bytes, ...]

    @property
    def topic(self) -> bytes | None:
        """The TOPIC header, or None."""
        for key, value in self.headers:
            if key == TOPIC:
                return value
        return None


ClientCommand = Connect | Disconnect | Noop | Subscribe | Unsubscribe | Put
BrokerMessage = Ok | Error | Message | Noop


# -- parsing --------------------------------------------------------------------------------


def framing_of(frames: Sequence[bytes]) -> Framing:
    """How a message is framed: an empty first frame is ``DELIMITED``."""
    return Framing.DELIMITED if frames and not frames[0] else Framing.SPEC


def _id_in(frames: Sequence[bytes], start: int) -> bytes | None:
    """The first ID header readable from ``start`` on, for the ERROR of a broken message."""
    for index in range(start, len(frames) - 1, 2):
        if not frames[index]:
            return None
        if frames[index] == ID:
            return frames[index + 1]
    return None


def parse(
    frames: Sequence[bytes],
    max_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
    max_frames: int = DEFAULT_MAX_FRAMES,
) -> Parsed:
    """Split one message (without a ROUTER identity) into verb, headers and positionals."""
    framing = framing_of(frames)
    start = 1 if framing is Framing.DELIMITED else 0
    if len(frames) > max_frames:
        raise Mc0Error(
            f"too many frames ({len(frames)} > {max_frames})",
            "too-many-frames",
            _id_in(frames[: max_frames + 2], start + 1),
            framing,
        )
    if sum(map(len, frames)) > max_bytes:
        raise Mc0Error(
            f"message over {max_bytes} bytes", "oversized", _id_in(frames, start + 1), framing
        )
    if len(frames) <= start or not frames[start]:
        raise Mc0Error("no verb", "no-verb", None, framing)
    verb = frames[start]
    index = start + 1
    headers: list[tuple[bytes, bytes]] = []
    seen: set[bytes] = set()
    count = len(frames)
    while index < count:
        key = frames[index]
        if not key:
            index += 1
            break
        if index + 1 >= count:
            raise Mc0Error(
                f"header {_shown(key)} has no value (odd number of header frames)",
                "odd-headers",
                _id_in(frames, start + 1),
                framing,
            )
        if key in seen:
            raise Mc0Error(
                f"header {_shown(key)} given twice",
                "duplicate-header",
                _id_in(frames, start + 1),
                framing,
            )
        seen.add(key)
        headers.append((key, frames[index + 1]))
        index += 2
    return Parsed(verb, tuple(headers), tuple(frames[index:]), framing)


def _shown(value: bytes, limit: int = 40) -> str:
    text = value[:limit].decode("utf-8", "replace")
    return repr(text + ("..." if len(value) > limit else ""))


def _check_topic(topic: bytes, parsed: Parsed) -> None:
    if not topic:
        raise Mc0Error("empty topic", "empty-topic", parsed.id, parsed.framing)
    if len(topic) > MAX_TOPIC_BYTES:
        raise Mc0Error(
            f"topic over {MAX_TOPIC_BYTES} bytes", "long-topic", parsed.id, parsed.framing
        )


def _ttl(value: bytes, parsed: Parsed) -> int:
    if not value.isdigit() or len(value) > _MAX_TTL_DIGITS or not value.isascii():
        raise Mc0Error(
            f"TTL {_shown(value)} is not a whole number of milliseconds",
            "bad-ttl",
            parsed.id,
            parsed.framing,
        )
    ttl = int(value)
    if not 0 < ttl <= MAX_TTL_MS:
        raise Mc0Error(
            f"TTL {ttl} out of range 1..{MAX_TTL_MS} ms", "bad-ttl", parsed.id, parsed.framing
        )
    return ttl


def decode_client(
    frames: Sequence[bytes],
    max_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
    max_frames: int = DEFAULT_MAX_FRAMES,
) -> ClientCommand:
    """A message a connector sent to the broker (ROUTER identity removed)."""
    parsed = parse(frames, max_bytes, max_frames)
    verb, framing, message_id = parsed.verb, parsed.framing, parsed.id
    if verb == PUT:
        topic = parsed.header(TOPIC)
        if topic is None:
            raise Mc0Error("PUT without TOPIC", "no-topic", message_id, framing)
        _check_topic(topic, parsed)
        headers = tuple(pair for pair in parsed.headers if pair[0] != ID)
        return Put(topic, headers, parsed.positionals, message_id, framing)
    if verb == NOOP:
        return Noop(message_id, framing)
    if verb in (SUB, UNSUB):
        for topic in parsed.positionals:
            _check_topic(topic, parsed)
        kind = Subscribe if verb == SUB else Unsubscribe
        return kind(parsed.positionals, message_id, framing)
    if verb == CONNECT:
        ttl = parsed.header(TTL)
        return Connect(
            None if ttl is None else _ttl(ttl, parsed), parsed.header(VERSION), message_id, framing
        )
    if verb == DISCONNECT:
        return Disconnect(message_id, framing)
    raise Mc0Error(
        f"Unknown command verb {_shown(verb[:_MAX_VERB_BYTES])}",
        "unknown-verb",
        message_id,
        framing,
    )


def decode_broker(
    frames: Sequence[bytes],
    max_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
    max_frames: int = DEFAULT_MAX_FRAMES,
) -> BrokerMessage:
    """A message the broker sent to a connector (a DEALER sees no identity)."""
    parsed = parse(frames, max_bytes, max_frames)
    verb = parsed.verb
    if verb == MESSAGE:
        return Message(parsed.headers, parsed.positionals)
    if verb == OK:
        return Ok(parsed.id)
    if verb == ERROR:
        return Error(parsed.header(MESSAGE) or b"", parsed.id)
    if verb == NOOP:
        return Noop(parsed.id, parsed.framing)
    raise Mc0Error(
        f"Unknown broker verb {_shown(verb[:_MAX_VERB_BYTES])}",
        "unknown-verb",
        parsed.id,
        parsed.framing,
    )


# -- encoding -------------------------------------------------------------------------------


def frames_of(
    verb: bytes,
    headers: Sequence[tuple[bytes, bytes]] = (),
    positionals: Sequence[bytes] | None = None,
    framing: Framing = Framing.SPEC,
) -> list[bytes]:
    """``[("" ,) VERB, k, v, ..., ("", positional...)]``; the delimiter before positionals
    is written whenever ``positionals`` is not None (an empty PUT body keeps it)."""
    out = [b"", verb] if framing is Framing.DELIMITED else [verb]
    for key, value in headers:
        if not key:
            raise ValueError("a header key cannot be empty")
        out.append(key)
        out.append(value)
    if positionals is not None:
        out.append(b"")
        out.extend(positionals)
    return out


def _with_id(headers: Sequence[tuple[bytes, bytes]], message_id: bytes | None) -> Headers:
    return (*headers, (ID, message_id)) if message_id is not None else tuple(headers)


def encode(command: ClientCommand | BrokerMessage, framing: Framing | None = None) -> list[bytes]:
    """The frames of any message; ``framing`` defaults to the command's own (SPEC for
    broker messages)."""
    own = getattr(command, "framing", Framing.SPEC)
    style = framing or own
    match command:
        case Connect(ttl_ms, version, message_id):
            headers: list[tuple[bytes, bytes]] = []
            if message_id is not None:
                headers.append((ID, message_id))
            if ttl_ms is not None:
                headers.append((TTL, b"%d" % ttl_ms))
            if version is not None:
                headers.append((VERSION, version))
            return frames_of(CONNECT, headers, None, style)
        case Disconnect(message_id):
            return frames_of(DISCONNECT, _with_id((), message_id), None, style)
        case Noop(message_id):
            return frames_of(NOOP, _with_id((), message_id), None, style)
        case Subscribe(topics, message_id):
            return frames_of(SUB, _with_id((), message_id), topics, style)
        case Unsubscribe(topics, message_id):
            return frames_of(UNSUB, _with_id((), message_id), topics, style)
        case Put(topic, headers_, body, message_id):
            pairs = (
                headers_ if any(k == TOPIC for k, _ in headers_) else ((TOPIC, topic), *headers_)
            )
            return frames_of(PUT, _with_id(pairs, message_id), body, style)
        case Ok(message_id):
            return ok_frames(message_id, style)
        case Error(text, message_id):
            return error_frames(text, message_id, style)
        case Message(headers_, body):
            return frames_of(MESSAGE, headers_, body, style)
    raise TypeError(f"not an mc0 message: {command!r}")


def ok_frames(message_id: bytes | None, framing: Framing) -> list[bytes]:
    """An OK of message ``message_id``."""
    return frames_of(OK, _with_id((), message_id), None, framing)


def error_frames(text: bytes, message_id: bytes | None, framing: Framing) -> list[bytes]:
    """``[ERROR, MESSAGE, text, ID, id]``: the real broker's order."""
    return frames_of(ERROR, _with_id(((MESSAGE, text),), message_id), None, framing)


def noop_frames(framing: Framing) -> list[bytes]:
    """A NOOP from the broker."""
    return [b"", NOOP] if framing is Framing.DELIMITED else [NOOP]


def message_frames(put: Put, framing: Framing) -> list[bytes]:
    """What each subscriber of ``put.topic`` receives."""
    return frames_of(MESSAGE, put.headers, put.body, framing)
