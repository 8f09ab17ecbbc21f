"""Polling helpers: tests wait on conditions with a deadline, never on fixed sleeps."""

from __future__ import annotations

import json
from typing import Any

from tests.processes import wait_for

__all__ = ["end_seq", "wait_for"]


def end_seq(query: Any) -> int | None:
    """The source end offset of a streaming query's last progress."""
    progress = query.lastProgress
    if not progress or not progress["sources"]:
        return None
    end = progress["sources"][0]["endOffset"]
    return json.loads(end)["seq"] if end else None
