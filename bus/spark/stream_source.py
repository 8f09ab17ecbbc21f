"""The ``eventbus`` source over a JetStream-backed bus (option ``nats``): offsets are the
stream's sequences, as the bus's are, and every executor reads its own range straight
from the cluster with its own connection, never through the driver.

The driver side (the long-lived runner that plans offsets) keeps one connection for
the stream's state; an executor opens one per partition and reads it through
:class:`bus.eventbus.stream_read.RangeReader`, whose subject filters keep what
``subscribe`` leaves out on the server. Both are blocking connections of
:mod:`bus.nats` (no event loop, no nats-py: a tenth of its cost per event), made and
made again through one :class:`bus.nats.failover.Failover` each: a server lost or
silent is left for the next, and what JetStream cannot answer while it elects a leader
is asked again, for up to ``natsRetryTimeout``. Nothing is kept across pickling but the
options.

A range ``(start, end]`` at or below the stream's last sequence always reads the same
events while retention keeps them, which is what makes a replayed micro-batch identical.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql.datasource import InputPartition

from bus.spark.journal import UTC_MICROS, DataLossError, events_table
from bus.spark.options import SourceOptions, StreamOptions, split_sequences

if TYPE_CHECKING:
    from bus.eventbus.stream_read import Events

log = logging.getLogger(__name__)


#: Rows per Arrow batch an executor yields.
BATCH_ROWS = 20_000


class StreamPartition(InputPartition):
    """One task's share of a batch: the stream's sequences ``(start, end]``."""

    def __init__(self, start: int, end: int) -> None:
        super().__init__(None)
        self.start = start
        self.end = end


def _settings(options: StreamOptions) -> Any:
    from bus.eventbus.config import JetStreamSettings

    def path(text: str | None) -> Path | None:
        return Path(text) if text else None

    return JetStreamSettings(
        options.servers,
        stream=options.stream,
        subject_prefix=options.subject_prefix,
        credentials=options.credentials,
        tls_ca=path(options.tls_ca),
        tls_cert=path(options.tls_cert),
        tls_key=path(options.tls_key),
    )


def _retry(options: StreamOptions) -> Any:
    from bus.nats.failover import Retry

    return Retry(within=options.retry_timeout)


def _failover(options: StreamOptions) -> Any:
    """Blocking connections (:mod:`bus.nats`) to the servers in turn."""
    from bus.eventbus.stream_read import failover

    return failover(_settings(options), name="spark-eventbus", retry=_retry(options))


def _lost(first: int, last: int, stream: str) -> str:
    return (
        f"sequences {first}..{last} are no longer in stream {stream} (its retention removed them)"
    )


class StreamAccess:
    """Planning and reading for a JetStream-backed bus; the same methods as the
    journal's access, so the readers serve both."""

    def __init__(self, options: SourceOptions) -> None:
        assert options.stream is not None
        self.options = options
        self.stream = options.stream
        self.name = f"stream {options.stream.stream}"
        self._failover: Any = None

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_failover"] = None  # sockets stay where they were made
        return state

    # -- the driver's side -----------------------------------------------------------------

    def _state(self) -> dict[str, Any]:
        from bus.eventbus.stream_read import stream_state

        if self._failover is None:
            self._failover = _failover(self.stream)
        name = self.stream.stream
        state: dict[str, Any] = self._failover.call(
            f"asking for stream {name}'s state", lambda c: stream_state(c, name)
        )
        return state

    def start_offset(self) -> int:
        """Just below the first event the stream still holds."""
        state = self._state()
        return int(state["first_seq"]) - 1 if state["messages"] else int(state["last_seq"])

    def latest_sequence(self) -> int:
        """The stream's last sequence."""
        return int(self._state()["last_seq"])

    def plan(self, start: int, end: int) -> list[StreamPartition]:
        """Partitions for ``(start, end]``; a range retention removed fails here, before
        any task runs (or is skipped with ``failOnDataLoss=false``)."""
        if end <= start:
            return []
        first = self.start_offset() + 1
        if start + 1 < first:
            message = _lost(start + 1, min(first - 1, end), self.stream.stream)
            if self.options.fail_on_data_loss:
                raise DataLossError(
                    f"{message}. Set failOnDataLoss=false to skip lost ranges and continue."
                )
            log.warning("eventbus: %s; skipped because failOnDataLoss=false", message)
            start = min(first - 1, end)
        return [
            StreamPartition(lo, hi)
            for lo, hi in split_sequences(start, end, self.options.min_partitions)
        ]

    def close(self) -> None:
        """Leave the driver side's connection."""
        if self._failover is not None:
            failover, self._failover = self._failover, None
            failover.close()

    # -- an executor's side ----------------------------------------------------------------

    def read_partition(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        """The rows of ``partition``'s range, read from the stream with a connection of this
        executor's own."""
        if not isinstance(partition, StreamPartition):
            return iter(())  # Spark's placeholder when a batch plan is empty
        return self._read(partition)

    def _read(self, partition: StreamPartition) -> Iterator[pa.RecordBatch]:
        from bus.eventbus.stream_read import RangeReader

        options = self.stream
        prefixes = [p.encode("utf-8") for p in self.options.prefixes]
        reader = RangeReader(
            _settings(options),
            partition.start,
            partition.end,
            name="spark-eventbus",
            retry=_retry(options),
        )
        try:
            reader.open(prefixes, check_retention=True)
            self._removed(reader)
            while True:
                events = reader.next_events(BATCH_ROWS)
                self._removed(reader)
                if not events:
                    break
                yield from _table(events).to_batches()
        finally:
            reader.close()

    def _removed(self, reader: Any) -> None:
        """What retention removed before the reader got to it (at its start, or while a
        read was made again): data loss, or a warning with ``failOnDataLoss=false``."""
        for first, last in reader.take_removed():
            message = _lost(first, last, self.stream.stream)
            if self.options.fail_on_data_loss:
                raise DataLossError(
                    f"{message}. Set failOnDataLoss=false to skip lost ranges and continue."
                )
            log.warning("eventbus: %s; skipped because failOnDataLoss=false", message)


def _table(events: Events) -> pa.Table:
    producer, timestamp, event_id, payload = zip(*events.bodies, strict=True)
    return events_table(
        events.topics,
        events.sequences,
        producer,
        timestamp,
        event_id,
        payload,
        # received_at: when the stream stored it (the journal's is when it was journaled).
        pc.divide(pa.array(events.stamps, pa.int64()), 1000).cast(UTC_MICROS),
    )
