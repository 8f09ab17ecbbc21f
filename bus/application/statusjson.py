"""A service's settings as ``/status`` shows them: JSON values, never a Python repr.

A config is a dataclass whose fields may be dataclasses themselves (the Event BUS's
``retention``, every service's ``curve``, eMQP's and mc0's ``broker``), paths, enums, tuples
or keys (bytes); :func:`config_json` turns it into objects, lists, numbers, booleans, null
and strings, the way an operator's ``jq`` reads it.
"""

from __future__ import annotations

import base64
import dataclasses
import enum
import math
from collections.abc import Mapping
from pathlib import PurePath
from typing import Any


def config_json(config: Any) -> dict[str, Any]:
    """The fields of the dataclass ``config`` as a JSON object (see :func:`json_value`)."""
    value = json_value(config)
    if not isinstance(value, dict):
        raise TypeError(f"not a dataclass: {type(config).__name__}")
    return value


def json_value(value: Any) -> Any:
    """``value`` as a JSON value: a dataclass or mapping is an object, a sequence or set a
    list, a path its text, an enum its value, bytes their text (UTF-8) or
    ``{"$base64": ...}``, a number that JSON cannot write (infinity) its text; anything else,
    its ``str()`` when it has its own, else its type's name."""
    if value is None or isinstance(value, bool | int | str):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else str(value)
    if isinstance(value, enum.Enum):
        return json_value(value.value)
    if isinstance(value, PurePath):
        return str(value)
    if isinstance(value, bytes | bytearray | memoryview):
        raw = bytes(value)
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            return {"$base64": base64.b64encode(raw).decode("ascii")}
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {
            field.name: json_value(getattr(value, field.name))
            for field in dataclasses.fields(value)
        }
    if isinstance(value, Mapping):
        return {str(json_value(key)): json_value(item) for key, item in value.items()}
    if isinstance(value, set | frozenset):
        return sorted((json_value(item) for item in value), key=repr)
    if isinstance(value, list | tuple):
        return [json_value(item) for item in value]
    if getattr(type(value), "__str__", None) is not object.__str__:
        return str(value)
    return type(value).__name__
