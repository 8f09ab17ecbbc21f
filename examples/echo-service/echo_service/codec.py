"""The echo protocol's wire format, sans I/O.

A client (a DEALER) sends ``[b"ECHO", payload]``; the service answers ``[b"ECHO-OK", payload]``,
or ``[b"ERROR", reason]`` for anything else (the ROUTER identity is the transport's business).
"""

from __future__ import annotations

from typing import Final

from bus.extension import ProtocolError

ECHO: Final = b"ECHO"
ECHO_OK: Final = b"ECHO-OK"
ERROR: Final = b"ERROR"


class EchoError(ProtocolError):
    """A message the echo protocol does not allow; ``reason`` names what is wrong."""


def parse_request(frames: list[bytes], max_bytes: int) -> bytes:
    """The payload of an ECHO request."""
    if not frames or frames[0] != ECHO:
        raise EchoError("not an ECHO request", "unknown-command")
    if len(frames) != 2:
        raise EchoError(f"ECHO has {len(frames)} frames, not 2", "frame-count")
    if len(frames[1]) > max_bytes:
        raise EchoError(f"payload over {max_bytes} bytes", "oversized")
    return frames[1]


def reply(payload: bytes) -> list[bytes]:
    return [ECHO_OK, payload]


def error(reason: str) -> list[bytes]:
    return [ERROR, reason.encode()]
