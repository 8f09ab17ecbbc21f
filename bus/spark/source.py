"""The ``eventbus`` PySpark data source: batch and streaming reads of a journal.

Spark creates stream readers in two processes (a long-lived driver-side runner that
plans offsets, and a planner whose instance is pickled to executors for ``read``), so
readers keep nothing but options: partitions carry everything ``read`` needs, and the
journal listing is opened lazily and dropped on pickling.

Offsets are ``{"seq": N}``: everything up to bus sequence N. A range ``(start, end]``
with ``end`` at or below the journal's latest sequence always reads the same rows,
because segments are immutable; that is what makes a replayed batch identical.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Protocol

import pyarrow as pa
from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    InputPartition,
)
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    ReadMinRows,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import (
    BinaryType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from bus.spark.journal import DataLossError, JournalError, JournalReader, Segment
from bus.spark.options import (
    OptionError,
    PlannedRange,
    SourceOptions,
    offset,
    offset_seq,
    resolve,
    split_range,
)

log = logging.getLogger(__name__)


class Access(Protocol):
    """What the readers ask of a log (:class:`JournalAccess`, or
    :class:`bus.spark.stream_source.StreamAccess`)."""

    #: What it reads, for messages ("the journal", "stream EVENTBUS").
    name: str

    def start_offset(self) -> int:
        """Just below the first sequence the log still holds."""
        ...

    def latest_sequence(self) -> int:
        """The log's last sequence."""
        ...

    def plan(self, start: int, end: int) -> Sequence[InputPartition]:
        """The partitions that read ``(start, end]``."""
        ...

    def read_partition(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        """The rows of one partition, as Arrow batches (on an executor)."""
        ...

    def close(self) -> None:
        """Release what reading held (connections, listings)."""
        ...


FORMAT = "eventbus"

#: Must match :data:`bus.spark.journal.ARROW_SCHEMA` (Spark checks batches exactly).
SCHEMA = StructType(
    [
        StructField("topic", StringType()),
        StructField("seq", LongType()),
        StructField("producer", StringType()),
        StructField("timestamp", TimestampType()),
        StructField("event_id", StringType()),
        StructField("payload", BinaryType()),
        StructField("received_at", TimestampType()),
    ]
)


class JournalPartition(InputPartition):
    """One task's share of a batch: ``(start, end]`` and the segment files holding it."""

    def __init__(self, start: int, end: int, segments: tuple[Segment, ...]) -> None:
        super().__init__(None)
        self.start = start
        self.end = end
        self.segments = segments


class JournalAccess:
    """Planning and reading for a journal (option ``path``): lazy journal access."""

    name = "the journal"

    def __init__(self, options: SourceOptions) -> None:
        self.options = options
        self._journal: JournalReader | None = None

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_journal"] = None  # a listing cache is not worth shipping
        return state

    @property
    def journal(self) -> JournalReader:
        """The journal, opened when first asked for (not shipped to executors)."""
        if self._journal is None:
            self._journal = JournalReader(self.options.path)
        return self._journal

    def start_offset(self) -> int:
        """Just below the first sequence the journal still holds."""
        return self.journal.start_offset()

    def latest_sequence(self) -> int:
        """The journal's last sequence."""
        return self.journal.latest_sequence()

    def close(self) -> None:
        """Drop the journal's listing."""
        self._journal = None

    def plan(self, start: int, end: int) -> list[JournalPartition]:
        """Partitions for ``(start, end]``; lost data fails here, before any task runs."""
        coverage = self.journal.coverage(start, end)
        if coverage.unjournaled is not None:
            lo, hi = coverage.unjournaled
            log.info("eventbus: sequences %d..%d predate the journal; nothing to read", lo, hi)
        if coverage.lost:
            message = coverage.describe_loss(self.journal.directory)
            if self.options.fail_on_data_loss:
                raise DataLossError(
                    f"{message}. Set failOnDataLoss=false to skip lost ranges and continue."
                )
            log.warning("eventbus: %s; skipped because failOnDataLoss=false", message)
        ranges: list[PlannedRange] = split_range(coverage, start, end, self.options.min_partitions)
        return [JournalPartition(r.start, r.end, r.segments) for r in ranges]

    def read_partition(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        """The rows of ``partition``'s segments within its range, under the subscribed prefixes."""
        if not isinstance(partition, JournalPartition):
            return iter(())  # Spark's placeholder when a batch plan is empty
        tables = self.journal.iter_tables(
            partition.start,
            partition.end,
            self.options.prefixes,
            fail_on_data_loss=self.options.fail_on_data_loss,
            segments=partition.segments,
        )
        return (batch for table in tables for batch in table.to_batches())


def access_for(options: SourceOptions) -> Access:
    """The journal's access, or the stream's when the source names NATS servers."""
    if options.stream is not None:
        from bus.spark.stream_source import StreamAccess

        return StreamAccess(options)
    return JournalAccess(options)


class EventBusBatchReader(DataSourceReader):
    """``spark.read.format("eventbus")``: from ``startingOffsets`` to ``endingOffsets``."""

    def __init__(self, options: SourceOptions) -> None:
        self.options = options
        self.access = access_for(options)

    def partitions(self) -> list[InputPartition]:
        log_ = self.access
        try:
            start = resolve(self.options.starting, log_)
            end = resolve(self.options.ending, log_)
            latest = log_.latest_sequence()
            if end > latest:
                raise OptionError(
                    f"endingOffsets seq {end} is beyond {log_.name}'s latest sequence {latest}"
                )
            if end < start:
                raise OptionError(f"endingOffsets seq {end} is before startingOffsets seq {start}")
            return list(self.access.plan(start, end))
        finally:
            log_.close()

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return self.access.read_partition(partition)


class EventBusStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """``spark.readStream.format("eventbus")``."""

    def __init__(self, options: SourceOptions, clock: Callable[[], float] = time.monotonic) -> None:
        self.options = options
        self.access = access_for(options)
        self._initial: dict[str, int] | None = None
        self._available_now_target: int | None = None
        self._clock = clock
        #: When the last micro-batch was planned (minEventsPerTrigger / maxTriggerDelay).
        self._last_batch_at: float | None = None

    def initialOffset(self) -> dict[str, int]:
        # Spark may ask more than once at first start: answer the same each time.
        if self._initial is None:
            self._initial = offset(resolve(self.options.starting, self.access))
        return self._initial

    def getDefaultReadLimit(self) -> ReadLimit:
        limit = self.options.max_offsets_per_trigger
        return ReadAllAvailable() if limit is None else ReadMaxRows(limit)

    def latestOffset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, int]:
        log_ = self.access
        begin = offset_seq(start)
        latest = log_.latest_sequence()
        if self._available_now_target is not None:
            latest = min(latest, self._available_now_target)
        # Count the limit from what still exists: lost or pre-journal sequences have no
        # rows, and they are reported by planning, not by trickling through them.
        base = max(begin, log_.start_offset())
        if self._waits_for_more(latest - base):
            return offset(begin)
        if isinstance(limit, ReadMaxRows):
            end = min(latest, base + limit.max_rows)
        elif isinstance(limit, ReadMinRows) and self._available_now_target is None:
            end = latest if latest - base >= limit.min_rows else begin
        else:
            if not isinstance(limit, (ReadAllAvailable, ReadMinRows)):
                log.info("eventbus: read limit %r is not supported; reading all", limit)
            end = latest
        if end > begin:
            self._last_batch_at = self._clock()
        return offset(max(end, begin))

    def _waits_for_more(self, available: int) -> bool:
        """minEventsPerTrigger: fewer are there, and maxTriggerDelay (if any) has not
        passed since the last micro-batch (or the query's start)."""
        wanted = self.options.min_events_per_trigger
        if wanted is None or available >= wanted or self._available_now_target is not None:
            return False
        now = self._clock()
        if self._last_batch_at is None:
            self._last_batch_at = now
        delay = self.options.max_trigger_delay
        return delay is None or now - self._last_batch_at < delay or available <= 0

    def reportLatestOffset(self) -> dict[str, int]:
        return offset(self.access.latest_sequence())

    def prepareForTriggerAvailableNow(self) -> None:
        self._available_now_target = self.access.latest_sequence()

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> list[InputPartition]:
        return list(self.access.plan(offset_seq(start), offset_seq(end)))

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return self.access.read_partition(partition)

    def commit(self, end: dict[str, Any]) -> None:
        """Nothing to release: retention is the log's business (journal or stream)."""

    def stop(self) -> None:
        self.access.close()


class EventBusDataSource(DataSource):
    """Registered as format ``eventbus``; see ``docs/spark.md`` for the options."""

    @classmethod
    def name(cls) -> str:
        """The format's name: ``eventbus``."""
        return FORMAT

    def schema(self) -> StructType:
        return SCHEMA

    def _check_schema(self, schema: StructType) -> None:
        if schema != SCHEMA:
            raise OptionError(f"the eventbus source has a fixed schema: {SCHEMA.simpleString()}")

    def reader(self, schema: StructType) -> EventBusBatchReader:
        self._check_schema(schema)
        return EventBusBatchReader(SourceOptions.parse(self.options, streaming=False))

    def streamReader(self, schema: StructType) -> EventBusStreamReader:
        self._check_schema(schema)
        return EventBusStreamReader(SourceOptions.parse(self.options, streaming=True))


__all__ = [
    "FORMAT",
    "SCHEMA",
    "EventBusBatchReader",
    "EventBusDataSource",
    "EventBusStreamReader",
    "JournalError",
]
