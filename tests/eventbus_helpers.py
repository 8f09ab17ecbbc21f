"""Frames for tests: valid PUBs in both dialects."""

from __future__ import annotations

import uuid
from typing import Any

import msgpack

TIMESTAMP = b"2026-11-21T10:00:00.123Z"


def pub(
    topic: str, value: Any = None, sequence: bytes = b"\x00" * 8, producer: bytes = b"tester"
) -> list[bytes]:
    return [
        topic.encode(),
        sequence,
        producer,
        TIMESTAMP,
        str(uuid.uuid4()).encode(),
        msgpack.packb(value if value is not None else {"topic": topic}),
    ]
