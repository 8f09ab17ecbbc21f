"""Polling helpers: tests wait on conditions with a deadline, never on fixed sleeps."""

from __future__ import annotations

import json
from typing import Any

from tests.processes import wait_for

__all__ = ["SPARKS_OWN_GUESS", "end_seq", "wait_for"]

#: Spark gives the Python process behind a streaming source (PythonStreamingSourceRunner)
#: a fixed 10 s to start and connect back, hard-coded in PythonWorkerFactory: on a machine
#: whose cores other work keeps busy, Python's start can take longer and the query fails
#: before any of our code runs. What it says then:
SPARKS_OWN_GUESS = r"Python worker failed to connect back|waiting for the Python worker to connect"


def end_seq(query: Any) -> int | None:
    """The source end offset of a streaming query's last progress."""
    progress = query.lastProgress
    if not progress or not progress["sources"]:
        return None
    end = progress["sources"][0]["endOffset"]
    return json.loads(end)["seq"] if end else None
