"""ZRE wire format, sans I/O: beacons, the two message dialects, and ZRE/LOG records.

* Beacon (both versions): ``Z R E 0x01``, the 16-octet UUID, the mailbox port (network
  order). 36/ZRE reads port 0 as "leaving"; 20/ZRE calls such a beacon invalid.
* 36/ZRE (what zyre and pyre speak; version 2): frame 0 is ``AA A1 id 0x02 sequence(2)``
  then the body; further frames are the content of WHISPER and SHOUT (one or more).
  zyre adds ELECT (8), LEADER (9) and GOODBYE (10); any other command in a well-framed
  message parses as :class:`Unknown`, so that its sequence number still counts.
  Strings have a one-octet length, long strings a four-octet one; a list of strings is a
  four-octet count of long strings; headers are a four-octet count of (string key, long
  string value).
* 20/ZRE (the specification's grammar; version 1): frame 0 is ``AA A1 sequence(2) id``
  then the body; HELLO carries the IP address and the mailbox port apart, lists have a
  one-octet count and headers are ``name=value`` strings; content is exactly one frame.
* ZRE/LOG: ``AA A2 0x01 level event node(2) peer(2) time(8, ms) data(string)``.

Every malformed input raises :class:`ZreError` (a ``ProtocolError``) with a ``reason``.
"""

from __future__ import annotations

import struct
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Final

from bus.errors import ProtocolError

BEACON_SIZE: Final = 22
BEACON_HEADER: Final = b"ZRE\x01"
#: zyre's beacon of a node with a CURVE certificate (zyre_set_zcert): version 3, the node's
#: 32-octet public key after the port.
CURVE_BEACON_SIZE: Final = 54
CURVE_BEACON_HEADER: Final = b"ZRE\x03"
#: HELLO header with the node's Z85 public key (zyre); a CURVE node ignores a HELLO without.
PUBLIC_KEY_HEADER: Final = "X-PUBLICKEY"
SIGNATURE: Final = b"\xaa\xa1"
LOG_SIGNATURE: Final = b"\xaa\xa2"
VERSION_36: Final = 2
VERSION_20: Final = 1

HELLO: Final = 1
WHISPER: Final = 2
SHOUT: Final = 3
JOIN: Final = 4
LEAVE: Final = 5
PING: Final = 6
PING_OK: Final = 7
#: zyre's extensions (its git master): leader election and gossip mode's farewell.
ELECT: Final = 8
LEADER: Final = 9
GOODBYE: Final = 10
COMMAND_NAMES: Final = {
    HELLO: "HELLO",
    WHISPER: "WHISPER",
    SHOUT: "SHOUT",
    JOIN: "JOIN",
    LEAVE: "LEAVE",
    PING: "PING",
    PING_OK: "PING-OK",
    ELECT: "ELECT",
    LEADER: "LEADER",
    GOODBYE: "GOODBYE",
}

#: A ZeroMQ identity may not start with a zero octet: the DEALER identity is 0x01 + UUID.
IDENTITY_PREFIX: Final = b"\x01"

LOG_LEVELS: Final = {1: "ERROR", 2: "WARNING", 3: "INFO"}
LOG_EVENTS: Final = {1: "JOIN", 2: "LEAVE", 3: "ENTER", 4: "EXIT"}

_BEACON = struct.Struct(">4s16sH")
_U16 = struct.Struct(">H")
_U32 = struct.Struct(">I")
_LOG_HEAD = struct.Struct(">2sBBBHHQ")
_SHOUT36 = SIGNATURE + bytes((SHOUT, VERSION_36))
_WHISPER36 = SIGNATURE + bytes((WHISPER, VERSION_36))


class ZreError(ProtocolError):
    """A beacon, message or log record that ZRE does not allow."""


# -- beacons ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Beacon:
    """A UDP beacon: the node's UUID and mailbox port (0: leaving), and its CURVE public key in
    zyre's version 3."""

    uuid: bytes
    port: int
    #: The node's CURVE public key (32 octets) in a version 3 beacon; None in version 1.
    public_key: bytes | None = None

    @property
    def leaving(self) -> bool:
        """The node says it leaves (port 0, 36/ZRE)."""
        return self.port == 0


def encode_beacon(node: bytes, port: int, public_key: bytes | None = None) -> bytes:
    """Version 1 (22 octets), or version 3 with the 32-octet ``public_key`` (54)."""
    if public_key is None:
        return _BEACON.pack(BEACON_HEADER, node, port)
    if len(public_key) != 32:
        raise ValueError("a beacon's public key is 32 octets")
    return _BEACON.pack(CURVE_BEACON_HEADER, node, port) + public_key


def parse_beacon(data: bytes, version: int = VERSION_36) -> Beacon:
    """A beacon datagram (22 octets, or zyre's 54 with a public key) in ``version``'s rules;
    :class:`ZreError` for anything else."""
    if len(data) == CURVE_BEACON_SIZE and data[:4] == CURVE_BEACON_HEADER:
        # zyre drops a key whose first octet is zero (it reads that as "no key"): 1 key in
        # 256 is a real key, so it is taken here.
        _header, node, port = _BEACON.unpack_from(data)
        if version == VERSION_20:
            raise ZreError("20/ZRE has no CURVE beacon", "beacon-header")
        return Beacon(node, port, data[BEACON_SIZE:])
    if len(data) != BEACON_SIZE:
        raise ZreError(f"beacon of {len(data)} octets (not 22 or 54)", "beacon-size")
    header, node, port = _BEACON.unpack(data)
    if header != BEACON_HEADER:
        raise ZreError("beacon header is not ZRE 0x01 (nor 0x03)", "beacon-header")
    if port == 0 and version == VERSION_20:
        raise ZreError("20/ZRE beacon with port 0", "beacon-port")
    return Beacon(node, port)


def identity_of(node: bytes) -> bytes:
    """The ROUTER identity a node's DEALER presents: 0x01 then its UUID."""
    return IDENTITY_PREFIX + node


def uuid_of_identity(identity: bytes) -> bytes:
    """The peer's UUID from a ROUTER identity: 0x01 + UUID (17 octets), or a bare UUID."""
    if len(identity) == 17 and identity[:1] == IDENTITY_PREFIX:
        return identity[1:]
    if len(identity) == 16:
        return identity
    raise ZreError(f"identity of {len(identity)} octets is not a ZRE node", "bad-identity")


# -- messages --------------------------------------------------------------------------------

#: Messages are slotted dataclasses, not frozen ones: a frozen one costs four times as much to
#: build, and a SHOUT builds one per delivery. Treat them as values all the same.


@dataclass(slots=True)
class Hello:
    """HELLO: the first message to a peer: the sender's mailbox, groups, group status, name and
    headers."""

    sequence: int
    endpoint: str
    groups: tuple[str, ...]
    status: int
    name: str
    headers: Mapping[str, str] = field(default_factory=dict)


@dataclass(slots=True)
class Whisper:
    """WHISPER: a message to this peer alone."""

    sequence: int
    content: tuple[bytes, ...]


@dataclass(slots=True)
class Shout:
    """SHOUT: a message to every member of ``group``."""

    sequence: int
    group: str
    content: tuple[bytes, ...]


@dataclass(slots=True)
class Join:
    """JOIN: the sender joined ``group``; ``status`` counts its joins and leaves."""

    sequence: int
    group: str
    status: int


@dataclass(slots=True)
class Leave:
    """LEAVE: the sender left ``group``; ``status`` counts its joins and leaves."""

    sequence: int
    group: str
    status: int


@dataclass(slots=True)
class Ping:
    """PING: are you there? (answered PING-OK)."""

    sequence: int


@dataclass(slots=True)
class PingOk:
    """PING-OK: the answer to a PING."""

    sequence: int


@dataclass(slots=True)
class Elect:
    """zyre: ``challenger`` (its UUID as text) contests the leadership of ``group``."""

    sequence: int
    group: str
    challenger: str


@dataclass(slots=True)
class Leader:
    """zyre: ``leader`` (a UUID as text) won the election in ``group``."""

    sequence: int
    group: str
    leader: str


@dataclass(slots=True)
class Goodbye:
    """zyre (gossip mode): the sender is leaving now."""

    sequence: int


@dataclass(slots=True)
class Unknown:
    """A well-framed 36/ZRE message of a command this codec does not know: kept whole (body
    after the header, content frames) so that it re-encodes exactly; its sequence counts."""

    sequence: int
    command: int
    body: bytes = b""
    content: tuple[bytes, ...] = ()


Message = (
    Hello | Whisper | Shout | Join | Leave | Ping | PingOk | Elect | Leader | Goodbye | Unknown
)

_NAMES: Final[dict[type, str]] = {
    Hello: "HELLO",
    Whisper: "WHISPER",
    Shout: "SHOUT",
    Join: "JOIN",
    Leave: "LEAVE",
    Ping: "PING",
    PingOk: "PING-OK",
    Elect: "ELECT",
    Leader: "LEADER",
    Goodbye: "GOODBYE",
}


def command_name(message: Message) -> str:
    """The message's command as a log line names it."""
    if isinstance(message, Unknown):
        return f"command {message.command}"
    return _NAMES[type(message)]


class _Reader:
    """Reads fields from one frame; running past its end is a ZreError."""

    __slots__ = ("data", "offset")

    def __init__(self, data: bytes, offset: int) -> None:
        self.data = data
        self.offset = offset

    def take(self, size: int) -> bytes:
        end = self.offset + size
        if end > len(self.data):
            raise ZreError("message ends inside a field", "truncated")
        chunk = self.data[self.offset : end]
        self.offset = end
        return chunk

    def u8(self) -> int:
        return self.take(1)[0]

    def u16(self) -> int:
        value: int = _U16.unpack(self.take(2))[0]
        return value

    def u32(self) -> int:
        value: int = _U32.unpack(self.take(4))[0]
        return value

    def text(self, size: int) -> str:
        try:
            return self.take(size).decode("utf-8")
        except UnicodeDecodeError:
            raise ZreError("string is not UTF-8", "bad-string") from None

    def string(self) -> str:
        return self.text(self.u8())

    def long_string(self) -> str:
        return self.text(self.u32())

    def end(self) -> None:
        if self.offset != len(self.data):
            raise ZreError("octets after the last field", "trailing")


def _string(value: str) -> bytes:
    data = value.encode("utf-8")
    if len(data) > 255:
        raise ValueError(f"string longer than 255 octets: {value[:20]!r}...")
    return bytes((len(data),)) + data


def _long_string(value: str) -> bytes:
    data = value.encode("utf-8")
    return _U32.pack(len(data)) + data


def _check_content(content: Sequence[bytes], version: int) -> tuple[bytes, ...]:
    if not content:
        raise ZreError("WHISPER or SHOUT without content", "no-content")
    if version == VERSION_20 and len(content) != 1:
        raise ZreError("20/ZRE content is exactly one frame", "content-frames")
    return tuple(content)


def _split_endpoint(endpoint: str) -> tuple[str, int]:
    host, _, port = endpoint.removeprefix("tcp://").rpartition(":")
    return host, int(port)


# 36/ZRE ---------------------------------------------------------------------------------


def encode(message: Message, version: int = VERSION_36) -> list[bytes]:
    """Frames of ``message`` in the given dialect (content frames after frame 0)."""
    if version == VERSION_20:
        return _encode_20(message)
    match message:
        case Hello():
            headers = b"".join(
                _string(key) + _long_string(value) for key, value in message.headers.items()
            )
            body = (
                _string(message.endpoint)
                + _U32.pack(len(message.groups))
                + b"".join(_long_string(group) for group in message.groups)
                + bytes((message.status & 0xFF,))
                + _string(message.name)
                + _U32.pack(len(message.headers))
                + headers
            )
            return [_head36(HELLO, message.sequence) + body]
        case Whisper():
            return [_head36(WHISPER, message.sequence), *_check_content(message.content, 2)]
        case Shout():
            frame = _head36(SHOUT, message.sequence) + _string(message.group)
            return [frame, *_check_content(message.content, 2)]
        case Join():
            frame = _head36(JOIN, message.sequence) + _string(message.group)
            return [frame + bytes((message.status & 0xFF,))]
        case Leave():
            frame = _head36(LEAVE, message.sequence) + _string(message.group)
            return [frame + bytes((message.status & 0xFF,))]
        case Ping():
            return [_head36(PING, message.sequence)]
        case PingOk():
            return [_head36(PING_OK, message.sequence)]
        case Elect():
            frame = _head36(ELECT, message.sequence) + _string(message.group)
            return [frame + _string(message.challenger)]
        case Leader():
            frame = _head36(LEADER, message.sequence) + _string(message.group)
            return [frame + _string(message.leader)]
        case Goodbye():
            return [_head36(GOODBYE, message.sequence)]
        case Unknown():
            if message.command in COMMAND_NAMES:
                raise ValueError(f"command {message.command} is known: not an Unknown")
            return [_head36(message.command, message.sequence) + message.body, *message.content]
    raise TypeError(f"not a ZRE message: {message!r}")


def around_sequence(frame: bytes, version: int = VERSION_36) -> tuple[bytes, bytes]:
    """Frame 0 of an encoded message cut around its sequence number: a message for many
    peers (SHOUT) is encoded once, and each peer's copy of frame 0 is ``before +
    sequence_octets(n) + after``."""
    at = 4 if version == VERSION_36 else 2
    return frame[:at], frame[at + 2 :]


#: The two octets of a sequence number (0-65535).
sequence_octets: Final[Callable[[int], bytes]] = _U16.pack


def with_sequence(frame: bytes, sequence: int, version: int = VERSION_36) -> bytes:
    """Frame 0 of an encoded message with another sequence number."""
    before, after = around_sequence(frame, version)
    return before + sequence_octets(sequence & 0xFFFF) + after


def _head36(command: int, sequence: int) -> bytes:
    return SIGNATURE + bytes((command, VERSION_36)) + _U16.pack(sequence & 0xFFFF)


def _head20(command: int, sequence: int) -> bytes:
    return SIGNATURE + _U16.pack(sequence & 0xFFFF) + bytes((command,))


def parse(frames: Sequence[bytes], version: int = VERSION_36) -> Message:
    """The message in ``frames`` (without the ROUTER identity), in the given dialect."""
    # A shortcut for the data path: a well-formed 36/ZRE SHOUT or WHISPER. Anything else,
    # including every malformed one, takes the long way, which says what is wrong.
    count = len(frames)
    if version == VERSION_36 and count > 1:
        frame = frames[0]
        head = frame[:4]
        if head == _SHOUT36:
            if len(frame) > 6 and 7 + frame[6] == len(frame):
                try:
                    group = frame[7:].decode("utf-8")
                except UnicodeDecodeError:
                    pass
                else:
                    content = (frames[1],) if count == 2 else tuple(frames[1:])
                    return Shout((frame[4] << 8) | frame[5], group, content)
        elif head == _WHISPER36 and len(frame) == 6:
            content = (frames[1],) if count == 2 else tuple(frames[1:])
            return Whisper((frame[4] << 8) | frame[5], content)
    return _parse(frames, version)


def _parse(frames: Sequence[bytes], version: int) -> Message:
    """:func:`parse` without its shortcut: every check, in order."""
    if not frames:
        raise ZreError("no frames", "empty")
    frame = frames[0]
    if frame[:2] != SIGNATURE:
        raise ZreError("no ZRE signature AA A1", "signature")
    if version == VERSION_20:
        return _parse_20(frames)
    if len(frame) < 6:
        raise ZreError("frame 0 shorter than the header", "truncated")
    command, frame_version = frame[2], frame[3]
    if frame_version != VERSION_36:
        raise ZreError(f"36/ZRE version octet is {frame_version}", "version")
    reader = _Reader(frame, 4)
    sequence = reader.u16()
    content = tuple(frames[1:])
    if command == HELLO:
        endpoint = reader.string()
        groups = tuple(reader.long_string() for _ in range(_count(reader)))
        status = reader.u8()
        name = reader.string()
        headers = {}
        for _ in range(_count(reader)):
            key = reader.string()
            headers[key] = reader.long_string()
        reader.end()
        _no_content(content)
        return Hello(sequence, endpoint, groups, status, name, headers)
    if command in (ELECT, LEADER):
        group = reader.string()
        who = reader.string()
        reader.end()
        _no_content(content)
        return (Elect if command == ELECT else Leader)(sequence, group, who)
    if command == GOODBYE:
        reader.end()
        _no_content(content)
        return Goodbye(sequence)
    if command not in COMMAND_NAMES:
        # Framed as 36/ZRE says, but a command we do not serve: the sender counted it in
        # its sequence, so must we (zyre's next message would otherwise look like a gap).
        return Unknown(sequence, command, frame[reader.offset :], content)
    return _parse_common(command, sequence, reader, content, VERSION_36)


def _count(reader: _Reader) -> int:
    count = reader.u32()
    # Each item takes at least one octet: a count beyond the frame is a lie.
    if count > len(reader.data) - reader.offset:
        raise ZreError(f"count {count} exceeds the frame", "truncated")
    return count


def _no_content(content: tuple[bytes, ...]) -> None:
    if content:
        raise ZreError("content frames on a command without content", "extra-frames")


# 20/ZRE ---------------------------------------------------------------------------------


def _encode_20(message: Message) -> list[bytes]:
    match message:
        case Hello():
            host, port = _split_endpoint(message.endpoint)
            headers = [f"{key}={value}" for key, value in message.headers.items()]
            if len(message.groups) > 255 or len(headers) > 255:
                raise ValueError("20/ZRE lists hold at most 255 items")
            body = (
                _string(host)
                + _U16.pack(port)
                + bytes((len(message.groups),))
                + b"".join(_string(group) for group in message.groups)
                + bytes((message.status & 0xFF,))
                + bytes((len(headers),))
                + b"".join(_string(header) for header in headers)
            )
            return [_head20(HELLO, message.sequence) + body]
        case Whisper():
            return [_head20(WHISPER, message.sequence), *_check_content(message.content, 1)]
        case Shout():
            frame = _head20(SHOUT, message.sequence) + _string(message.group)
            return [frame, *_check_content(message.content, 1)]
        case Join():
            frame = _head20(JOIN, message.sequence) + _string(message.group)
            return [frame + bytes((message.status & 0xFF,))]
        case Leave():
            frame = _head20(LEAVE, message.sequence) + _string(message.group)
            return [frame + bytes((message.status & 0xFF,))]
        case Ping():
            return [_head20(PING, message.sequence)]
        case PingOk():
            return [_head20(PING_OK, message.sequence)]
        case Elect() | Leader() | Goodbye() | Unknown():
            raise ValueError(f"20/ZRE has no {command_name(message)}")
    raise TypeError(f"not a ZRE message: {message!r}")


def _parse_20(frames: Sequence[bytes]) -> Message:
    frame = frames[0]
    if len(frame) < 5:
        raise ZreError("frame 0 shorter than the header", "truncated")
    reader = _Reader(frame, 2)
    sequence = reader.u16()
    command = reader.u8()
    content = tuple(frames[1:])
    if command == HELLO:
        host = reader.string()
        port = reader.u16()
        groups = tuple(reader.string() for _ in range(reader.u8()))
        status = reader.u8()
        headers: dict[str, str] = {}
        for _ in range(reader.u8()):
            key, sep, value = reader.string().partition("=")
            if not sep:
                raise ZreError("20/ZRE header without '='", "bad-header")
            headers[key] = value
        reader.end()
        _no_content(content)
        if not host or port == 0:
            raise ZreError("20/ZRE HELLO without address or mailbox", "bad-hello")
        # 20/ZRE has no name field: the peer is named by its address.
        return Hello(sequence, f"tcp://{host}:{port}", groups, status, "", headers)
    return _parse_common(command, sequence, reader, content, VERSION_20)


def _parse_common(
    command: int, sequence: int, reader: _Reader, content: tuple[bytes, ...], version: int
) -> Message:
    """The commands both versions lay out alike (all but HELLO)."""
    if command == WHISPER:
        reader.end()
        return Whisper(sequence, _check_content(content, version))
    if command == SHOUT:
        group = reader.string()
        reader.end()
        return Shout(sequence, group, _check_content(content, version))
    if command in (JOIN, LEAVE):
        group = reader.string()
        status = reader.u8()
        reader.end()
        _no_content(content)
        return (Join if command == JOIN else Leave)(sequence, group, status)
    if command in (PING, PING_OK):
        reader.end()
        _no_content(content)
        return (Ping if command == PING else PingOk)(sequence)
    raise ZreError(f"unknown command {command}", "command")


def sniff_version(frame: bytes) -> int | None:
    """Which dialect frame 0 looks like: 36/ZRE has a command (1-10) then the version
    octet 2 at offsets 2-3. Used by a 20/ZRE node to recognise a 36/ZRE peer (which it must
    never send 20/ZRE frames to), not to decode."""
    if len(frame) < 5 or frame[:2] != SIGNATURE:
        return None
    if frame[2] in COMMAND_NAMES and frame[3] == VERSION_36:
        return VERSION_36
    return VERSION_20


# -- ZRE/LOG ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class LogRecord:
    """A ZRE/LOG record: a node's event, its level, the nodes concerned, when, and text."""

    level: int
    event: int
    node: int
    peer: int
    time_ms: int
    data: str

    @property
    def level_name(self) -> str:
        """The level's name (its number when unknown)."""
        return LOG_LEVELS.get(self.level, str(self.level))

    @property
    def event_name(self) -> str:
        """The event's name (its number when unknown)."""
        return LOG_EVENTS.get(self.event, str(self.event))


def node_hash(node: bytes) -> int:
    """The two-octet "hash of node UUID" of ZRE/LOG: the UUID's 16-bit words XOR-ed."""
    value = 0
    for index in range(0, len(node), 2):
        value ^= int.from_bytes(node[index : index + 2], "big")
    return value


def encode_log(record: LogRecord) -> bytes:
    """``record`` as a ZRE/LOG frame."""
    head = _LOG_HEAD.pack(
        LOG_SIGNATURE,
        1,
        record.level,
        record.event,
        record.node,
        record.peer,
        record.time_ms,
    )
    return head + _string(record.data)


def parse_log(frames: Sequence[bytes]) -> LogRecord:
    """A ZRE/LOG message (one frame); :class:`ZreError` for anything else."""
    if len(frames) != 1:
        raise ZreError("a ZRE/LOG record is one frame", "log-frames")
    frame = frames[0]
    if frame[:2] != LOG_SIGNATURE:
        raise ZreError("no ZRE/LOG signature AA A2", "signature")
    if len(frame) < _LOG_HEAD.size + 1:
        raise ZreError("log record shorter than its header", "truncated")
    _, command, level, event, node, peer, time_ms = _LOG_HEAD.unpack_from(frame)
    if command != 1:
        raise ZreError(f"unknown ZRE/LOG command {command}", "command")
    if level not in LOG_LEVELS:
        raise ZreError(f"unknown log level {level}", "log-level")
    if event not in LOG_EVENTS:
        raise ZreError(f"unknown log event {event}", "log-event")
    reader = _Reader(frame, _LOG_HEAD.size)
    data = reader.string()
    reader.end()
    return LogRecord(level, event, node, peer, time_ms, data)


def uuid_hex(node: bytes) -> str:
    """A node's UUID as 32 hex digits."""
    return uuid.UUID(bytes=node).hex
