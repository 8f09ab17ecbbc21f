"""Values as people write them on a command line, in a config file or in the environment:
durations (``250ms``, ``10m``), sizes (``512k``, ``16MiB``) and yes/no. A value that does
not parse is a usage error saying what would."""

from __future__ import annotations

import re
from typing import Any

from twisted.python import usage

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)?\s*$")
_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, None: 1.0}
_TRUE = frozenset({"1", "true", "yes", "on"})
_FALSE = frozenset({"0", "false", "no", "off", ""})


def parse_duration(text: str | float) -> float:
    """Seconds from ``90``, ``1.5s``, ``250ms``, ``10m``, ``12h`` or ``7d``."""
    match = _DURATION.match(str(text))
    if not match:
        raise usage.UsageError(f"not a duration: {text!r} (try 30s, 10m, 12h, 7d)")
    return float(match.group(1)) * _UNITS[match.group(2)]


_SIZE = re.compile(r"^\s*(\d+)\s*(|b|k|kb|kib|m|mb|mib|g|gb|gib)\s*$", re.IGNORECASE)
_SIZE_UNITS = {"": 1, "b": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30}


def parse_size(text: str | int) -> int:
    """Bytes from ``1048576``, ``512k``, ``16MiB`` or ``1g`` (powers of 1024)."""
    match = _SIZE.match(str(text))
    if not match:
        raise usage.UsageError(f"not a size: {text!r} (try 65536, 512k, 16MiB)")
    return int(match.group(1)) * _SIZE_UNITS[match.group(2)[:1].lower()]


def optional_duration(value: Any) -> float | None:
    """A duration (:func:`parse_duration`), or None for an empty value."""
    return None if value in (None, "") else parse_duration(value)


def parse_bool(text: str | bool) -> bool:
    """``true/yes/on/1`` or ``false/no/off/0/''`` (any case) as a bool; ValueError otherwise."""
    if isinstance(text, bool):
        return text
    lowered = text.strip().lower()
    if lowered in _TRUE:
        return True
    if lowered in _FALSE:
        return False
    raise usage.UsageError(f"not a yes/no value: {text!r} (try true or false)")
