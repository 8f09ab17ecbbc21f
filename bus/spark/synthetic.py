"""Synthetic events for tests, benchmarks and demos of the journal and the source.

Deterministic: the same arguments give the same events, so a test can compute the
counts it expects without reading anything back.
"""

from __future__ import annotations

import uuid
from collections import Counter
from collections.abc import Iterator, Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Final

import msgpack

from bus.eventbus.codec import Event
from bus.spark.journal import JournalWriter

TOPICS: Final = (
    "/orders/eu/created",
    "/orders/us/created",
    "/orders/eu/paid",
    "/users/signup",
    "/users/login",
    "/metrics/cpu",
    "/metrics/disk",
)
#: Event time of sequence 1; later events are ``spacing`` apart.
EPOCH: Final = datetime(2024, 5, 1, 12, 0, 0, tzinfo=UTC)


def topic_of(sequence: int, topics: Sequence[str] = TOPICS) -> str:
    """The topic of event ``sequence``: spread over ``topics``, always the same."""
    return topics[(sequence * 7919) % len(topics)]  # a prime stride spreads topics


def make_event(
    sequence: int, topics: Sequence[str] = TOPICS, spacing: timedelta = timedelta(milliseconds=10)
) -> Event:
    """Event ``sequence``, the same every time."""
    moment = EPOCH + spacing * (sequence - 1)
    return Event(
        topic=topic_of(sequence, topics).encode(),
        sequence=sequence,
        producer=b"producer-%d" % (sequence % 3),
        timestamp=moment.isoformat().encode("ascii"),
        uuid=str(uuid.UUID(int=sequence)).encode("ascii"),
        data=msgpack.packb({"n": sequence, "amount": sequence % 100 / 4, "tags": ["a", "b"]}),
    )


def events(
    first: int,
    count: int,
    topics: Sequence[str] = TOPICS,
    spacing: timedelta = timedelta(milliseconds=10),
) -> Iterator[Event]:
    """``count`` events from sequence ``first``."""
    for sequence in range(first, first + count):
        yield make_event(sequence, topics, spacing)


def expected_counts(first: int, count: int, topics: Sequence[str] = TOPICS) -> Counter[str]:
    """Events per topic among the ``count`` from ``first``: what a count of them must find."""
    return Counter(topic_of(s, topics) for s in range(first, first + count))


def write_journal(
    directory: Path | str,
    count: int,
    *,
    first: int = 1,
    per_segment: int = 20000,
    per_append: int = 500,
    received_at: float | None = None,
    topics: Sequence[str] = TOPICS,
) -> None:
    """Append ``count`` events starting at ``first`` and flush; ``received_at`` defaults
    to each event's own time so windows over it are predictable."""
    writer = JournalWriter(directory, roll_events=per_segment)
    try:
        batch: list[Event] = []
        for event in events(first, count, topics):
            batch.append(event)
            if len(batch) == per_append:
                _append(writer, batch, received_at)
                batch = []
        if batch:
            _append(writer, batch, received_at)
    finally:
        writer.close()


def _append(writer: JournalWriter, batch: list[Event], received_at: float | None) -> None:
    when = received_at
    if when is None:
        when = datetime.fromisoformat(batch[-1].timestamp.decode()).timestamp()
    writer.append(batch, received_at=when)
