"""Decoding the msgpack ``payload`` column into Spark values.

The payload goes msgpack -> JSON text (in a Python UDF) -> ``from_json`` with the
caller's schema. Going through JSON costs a little, but ``from_json`` is lenient the
way event data needs: a field of the wrong type becomes null instead of failing the
query, and a payload that is not msgpack at all decodes to null.

msgpack values without a JSON form: binary becomes base64 text, a msgpack timestamp an
ISO-8601 string (so it reads as a Spark TIMESTAMP), other extension types null, map
keys text.
"""

from __future__ import annotations

import base64
import json
import math
from datetime import datetime
from typing import Any

import msgpack
from pyspark.sql import Column
from pyspark.sql import functions as F
from pyspark.sql.types import ArrayType, MapType, StringType, StructType

_UNPACK_OPTIONS: dict[str, Any] = {
    "raw": False,
    "strict_map_key": False,
    "timestamp": 3,  # msgpack timestamps as aware datetimes
    "unicode_errors": "replace",
}


def _jsonable(value: Any) -> Any:
    if isinstance(value, dict):
        return {_key(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, bytes):
        return base64.b64encode(value).decode("ascii")
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, msgpack.ExtType):
        return None
    return value


def _key(key: Any) -> str:
    if isinstance(key, str):
        return key
    if isinstance(key, bytes):
        return key.decode("utf-8", "replace")
    return json.dumps(_jsonable(key))


def msgpack_to_json(data: bytes | None) -> str | None:
    """One msgpack object as JSON text; ``None`` for missing or malformed input."""
    if data is None:
        return None
    try:
        value = msgpack.unpackb(data, **_UNPACK_OPTIONS)
    except Exception:  # msgpack raises several unrelated types for bad input
        return None
    return json.dumps(_jsonable(value), ensure_ascii=False)


def payload_json(payload: Column | str = "payload") -> Column:
    """The payload as JSON text (a STRING column)."""
    column = F.col(payload) if isinstance(payload, str) else payload
    to_json = F.udf(msgpack_to_json, StringType(), useArrow=True)
    return to_json(column)


def decode_payload(payload: Column | str, schema: StructType | ArrayType | MapType | str) -> Column:
    """The payload decoded with ``schema`` (a StructType, ArrayType, MapType or DDL text),
    e.g. ``decode_payload("payload", "id BIGINT, amount DOUBLE")``."""
    return F.from_json(payload_json(payload), schema)
