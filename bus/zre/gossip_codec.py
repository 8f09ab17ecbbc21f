"""ZGOSSIP wire format (czmq's ``zgossip_msg``), sans I/O: how zyre finds peers without UDP.

One frame per message (a ROUTER adds the client's identity in front):
``AA A0 id version(1)=0x01`` then the body. HELLO (1), PING (3), PONG (4) and INVALID (5)
have no body; PUBLISH (2) is ``key(string: one-octet length)``, ``value(long string:
four-octet length)``, ``ttl(4, ms)``, all numbers in network order. zyre publishes its UUID
(32 upper-case hex digits) as the key and its mailbox (``tcp://HOST:PORT``, with ``|KEY``, its
Z85 public key, when it has a certificate) as the value, ttl 0.

Every malformed input raises :class:`GossipError` (a ``ProtocolError``) with a ``reason``.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Final

from bus.errors import ProtocolError

SIGNATURE: Final = b"\xaa\xa0"
VERSION: Final = 1

HELLO: Final = 1
PUBLISH: Final = 2
PING: Final = 3
PONG: Final = 4
INVALID: Final = 5

_U32 = struct.Struct(">I")
_PUBLISH_TAIL = struct.Struct(">I")


class GossipError(ProtocolError):
    """A malformed ZGOSSIP message; ``reason`` names what was wrong (a drop counter)."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(detail)
        self.reason = reason


@dataclass(frozen=True, slots=True)
class GossipHello:
    """A client greets a server; the server answers with every tuple it holds."""


@dataclass(frozen=True, slots=True)
class Publish:
    """A tuple, announced by a client or a server."""

    key: str
    value: str
    ttl_ms: int = 0


@dataclass(frozen=True, slots=True)
class GossipPing:
    """A client says it is alive (the server forgets a client silent for a second)."""


@dataclass(frozen=True, slots=True)
class Pong:
    """The server's answer to PING."""


@dataclass(frozen=True, slots=True)
class Invalid:
    """The server refuses a command (a client it forgot): the client says HELLO again."""


GossipMessage = GossipHello | Publish | GossipPing | Pong | Invalid

_IDS: Final[dict[type, int]] = {
    GossipHello: HELLO,
    Publish: PUBLISH,
    GossipPing: PING,
    Pong: PONG,
    Invalid: INVALID,
}
_EMPTY: Final[dict[int, GossipMessage]] = {
    HELLO: GossipHello(),
    PING: GossipPing(),
    PONG: Pong(),
    INVALID: Invalid(),
}


def encode(message: GossipMessage) -> bytes:
    """``message`` as one ZGOSSIP frame; ValueError for a key or ttl it cannot carry."""
    head = SIGNATURE + bytes((_IDS[type(message)], VERSION))
    if not isinstance(message, Publish):
        return head
    key = message.key.encode("utf-8")
    value = message.value.encode("utf-8")
    if len(key) > 255:
        raise ValueError("a ZGOSSIP key is at most 255 octets")
    if not 0 <= message.ttl_ms <= 0xFFFFFFFF:
        raise ValueError("a ZGOSSIP ttl is four octets")
    return b"".join(
        (head, bytes((len(key),)), key, _U32.pack(len(value)), value, _U32.pack(message.ttl_ms))
    )


def parse(frames: list[bytes]) -> GossipMessage:
    """The message in ``frames`` (exactly one frame, the ROUTER's identity already taken)."""
    if len(frames) != 1:
        raise GossipError("frames", f"a ZGOSSIP message is one frame, not {len(frames)}")
    data = frames[0]
    if len(data) < 4:
        raise GossipError("truncated", f"{len(data)} octets: shorter than the header")
    if data[:2] != SIGNATURE:
        raise GossipError("signature", f"signature {data[:2].hex()}, not aaa0")
    command, version = data[2], data[3]
    if version != VERSION:
        raise GossipError("version", f"version {version}, not {VERSION}")
    empty = _EMPTY.get(command)
    if empty is not None:
        if len(data) != 4:
            raise GossipError("trailing", f"{len(data) - 4} octets after a bodiless command")
        return empty
    if command != PUBLISH:
        raise GossipError("command", f"unknown command {command}")
    at = 4
    if len(data) < at + 1:
        raise GossipError("truncated", "PUBLISH without its key")
    key_end = at + 1 + data[at]
    if len(data) < key_end + 4:
        raise GossipError("truncated", "PUBLISH key or value length cut short")
    (value_size,) = _U32.unpack_from(data, key_end)
    value_end = key_end + 4 + value_size
    if len(data) < value_end + 4:
        raise GossipError("truncated", "PUBLISH value or ttl cut short")
    if len(data) != value_end + 4:
        raise GossipError("trailing", f"{len(data) - value_end - 4} octets after PUBLISH")
    try:
        key = data[at + 1 : key_end].decode("utf-8")
        value = data[key_end + 4 : value_end].decode("utf-8")
    except UnicodeDecodeError as error:
        raise GossipError("bad-string", f"PUBLISH text is not UTF-8: {error}") from None
    (ttl,) = _PUBLISH_TAIL.unpack_from(data, value_end)
    return Publish(key, value, ttl)


__all__ = [
    "GossipError",
    "GossipHello",
    "GossipMessage",
    "GossipPing",
    "Invalid",
    "Pong",
    "Publish",
    "encode",
    "parse",
]
