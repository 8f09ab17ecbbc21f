"""Any bytes as one NATS subject token, and back (sans I/O).

A subject is dot-separated tokens that may not hold ``.``, ``*``, ``>``, whitespace, or be
empty. In a token, ASCII letters, digits, ``-`` and ``_`` stand for themselves; every other
byte is ``~`` and two upper-case hex digits (``.`` is ``~2E``, ``é`` is ``~C3~A9``); empty
bytes are a lone ``~`` (never the start of an escape, so it is unambiguous). The Event BUS
makes its topics' segments tokens with it, eMQP its queue names.
"""

from __future__ import annotations

_SAFE = frozenset(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_")
_ESCAPES = {byte: f"~{byte:02X}" for byte in range(256)}
_EMPTY = "~"


class SubjectError(ValueError):
    """Not a token (or a subject) this encoding makes."""


def token(segment: bytes) -> str:
    """``segment`` as one subject token (escaped as the module says)."""
    if not segment:
        return _EMPTY
    safe = _SAFE
    if all(byte in safe for byte in segment):
        return segment.decode("ascii")
    return "".join(chr(byte) if byte in safe else _ESCAPES[byte] for byte in segment)


def untoken(token: str) -> bytes:
    """The bytes of a token made by :func:`token`; :class:`SubjectError` for a token it could not
    have made."""
    if token == _EMPTY:
        return b""
    out = bytearray()
    index, length = 0, len(token)
    while index < length:
        char = token[index]
        if char == "~":
            digits = token[index + 1 : index + 3]
            if len(digits) != 2 or not all(c in "0123456789ABCDEF" for c in digits):
                raise SubjectError(f"bad escape in token {token!r}")
            out.append(int(digits, 16))
            index += 3
        else:
            code = ord(char)
            if code not in _SAFE:
                raise SubjectError(f"unexpected {char!r} in token {token!r}")
            out.append(code)
            index += 1
    return bytes(out)
