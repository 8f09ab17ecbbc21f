"""Options of the ``eventbus`` source and range planning: plain Python, no Spark.

Kept apart from :mod:`bus.spark.source` so the rules can be tested and reused without
a SparkSession.
"""

from __future__ import annotations

import bisect
import itertools
import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final, Literal, Protocol

from bus.nats.credentials import Credentials, CredentialsError, split
from bus.spark.journal import Coverage, Segment

log = logging.getLogger(__name__)

#: A seq range that one partition reads when nothing else asks for more partitions.
DEFAULT_PARTITION_ROWS: Final = 50_000

OffsetSpec = Literal["earliest", "latest"] | int

KNOWN_OPTIONS: Final = frozenset(
    {
        "path",
        "subscribe",
        "startingoffsets",
        "endingoffsets",
        "maxoffsetspertrigger",
        "maxeventspertrigger",
        "mineventspertrigger",
        "maxtriggerdelay",
        "failondataloss",
        "minpartitions",
        # The bus's log in a JetStream stream (docs/cluster.md) instead of a journal.
        "nats",
        "stream",
        "subjectprefix",
        "natscreds",
        "natsuser",
        "natspasswordfile",
        "natstokenfile",
        "natsnkey",
        "natstlsca",
        "natstlscert",
        "natstlskey",
        "natsretrytimeout",
    }
)

#: Seconds the stream source keeps trying what fails for passing reasons (a NATS server
#: lost, JetStream electing a leader): option ``natsRetryTimeout``.
DEFAULT_NATS_RETRY_TIMEOUT: Final = 60.0


class OptionError(ValueError):
    """An option of the ``eventbus`` source has a value it cannot use."""


def offset(seq: int) -> dict[str, int]:
    """The offset ``{"seq": N}`` of sequence ``seq``."""
    return {"seq": seq}


def offset_seq(value: Mapping[str, Any]) -> int:
    """The sequence of a ``{"seq": N}`` offset, checked."""
    seq = value.get("seq") if isinstance(value, Mapping) else None
    if not isinstance(seq, int) or isinstance(seq, bool) or seq < 0:
        raise OptionError(f'offset {value!r} is not {{"seq": N}} with N >= 0')
    return seq


def parse_offset(name: str, text: str) -> OffsetSpec:
    """Option ``name``'s text: ``earliest``, ``latest`` or the JSON ``{"seq": N}``;
    :class:`OptionError` for anything else."""
    text = text.strip()
    if text.lower() in ("earliest", "latest"):
        return "earliest" if text.lower() == "earliest" else "latest"
    try:
        return offset_seq(json.loads(text))
    except (ValueError, OptionError):
        raise OptionError(
            f'{name} must be "earliest", "latest" or {{"seq": N}}, not {text!r}'
        ) from None


def _positive_int(name: str, text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise OptionError(f"{name} must be a positive integer, not {text!r}")
    return value


def _bool(name: str, text: str) -> bool:
    lowered = text.strip().lower()
    if lowered not in ("true", "false"):
        raise OptionError(f"{name} must be true or false, not {text!r}")
    return lowered == "true"


def _seconds(name: str, text: str, zero: bool = False) -> float:
    """A duration (``30s``, ``2m``, ``1.5``), positive (or zero, with ``zero``)."""
    from bus.extension import parse_duration

    try:
        value = parse_duration(text)
    except Exception:  # twisted's UsageError
        value = -1.0
    if value < 0 or (value == 0 and not zero):
        raise OptionError(f"{name} must be a duration such as 30s or 2m, not {text!r}")
    return value


@dataclass(frozen=True, slots=True)
class StreamOptions:
    """Where the stream is: ``nats`` URLs (without credentials: what they carried is in
    ``credentials``), the stream's name and subject prefix (as the front-ends were given
    them), credentials and TLS."""

    servers: tuple[str, ...]
    stream: str = "EVENTBUS"
    subject_prefix: str = "eventbus"
    #: Who the reader is: ``natsUser`` with ``natsPasswordFile`` (or BUS_NATS_PASSWORD in
    #: the driver's environment), ``natsTokenFile`` (or BUS_NATS_TOKEN), ``natsNkey``,
    #: ``natsCreds``. Files are read where a connection is made: on the executors too.
    credentials: Credentials = field(default_factory=Credentials)
    tls_ca: str | None = None
    tls_cert: str | None = None
    tls_key: str | None = None
    #: Seconds a read or a request that fails for passing reasons is tried again (on
    #: the next server) before it fails the task or the query (``natsRetryTimeout``).
    retry_timeout: float = DEFAULT_NATS_RETRY_TIMEOUT


@dataclass(frozen=True, slots=True)
class SourceOptions:
    """The source's options, named like Spark's Kafka source. ``path`` is a journal's
    directory; ``stream`` (option ``nats``) reads a JetStream stream instead."""

    path: str
    prefixes: tuple[str, ...] = ()
    starting: OffsetSpec = "latest"
    ending: OffsetSpec = "latest"
    max_offsets_per_trigger: int | None = None
    fail_on_data_loss: bool = True
    min_partitions: int = 1
    #: Wait for this many events before a micro-batch, but no longer than
    #: ``max_trigger_delay`` seconds after the last one (Kafka's ``minOffsetsPerTrigger``).
    min_events_per_trigger: int | None = None
    max_trigger_delay: float | None = None
    stream: StreamOptions | None = None

    @classmethod
    def parse(cls, options: Mapping[str, str], *, streaming: bool) -> SourceOptions:
        """The source's options as Spark gives them (names in any case), checked: an
        :class:`OptionError` names the option at fault. ``streaming``: for a streaming query
        (starting at ``latest`` by default, no ``endingOffsets``), else for a batch read."""
        given = {key.lower(): str(value) for key, value in options.items()}
        unknown = sorted(set(given) - KNOWN_OPTIONS)
        if unknown:
            log.warning("eventbus source ignores unknown options %s", ", ".join(unknown))
        path = given.get("path", "").strip()
        servers = tuple(u.strip() for u in given.get("nats", "").split(",") if u.strip())
        if not path and not servers:
            raise OptionError(
                'the eventbus source needs option "path" (a journal directory) or "nats" '
                "(the servers of a JetStream-backed bus)"
            )
        if path and servers:
            raise OptionError('give "path" (a journal) or "nats" (a stream), not both')
        try:
            servers, credentials = split(
                servers,
                Credentials.from_options(
                    user=given.get("natsuser") or None,
                    password_file=given.get("natspasswordfile") or None,
                    token_file=given.get("natstokenfile") or None,
                    nkey=given.get("natsnkey") or None,
                    creds=given.get("natscreds") or None,
                ),
            )
            credentials.check()  # the driver connects too: its files are read now
        except CredentialsError as error:
            raise OptionError(str(error)) from None
        stream = (
            StreamOptions(
                servers,
                stream=given.get("stream", "EVENTBUS").strip() or "EVENTBUS",
                subject_prefix=given.get("subjectprefix", "eventbus").strip() or "eventbus",
                credentials=credentials,
                tls_ca=given.get("natstlsca") or None,
                tls_cert=given.get("natstlscert") or None,
                tls_key=given.get("natstlskey") or None,
                retry_timeout=_seconds(
                    "natsRetryTimeout",
                    given.get("natsretrytimeout", f"{DEFAULT_NATS_RETRY_TIMEOUT:g}s"),
                    zero=True,
                ),
            )
            if servers
            else None
        )
        prefixes = tuple(p.strip() for p in given.get("subscribe", "").split(",") if p.strip())
        # Like Kafka: streams start at the end by default, batch reads at the beginning.
        starting = parse_offset(
            "startingOffsets", given.get("startingoffsets", "latest" if streaming else "earliest")
        )
        ending: OffsetSpec = "latest"
        if "endingoffsets" in given:
            if streaming:
                raise OptionError("endingOffsets is for batch queries only")
            ending = parse_offset("endingOffsets", given["endingoffsets"])
        if not streaming and starting == "latest":
            raise OptionError('startingOffsets "latest" is for streaming queries only')
        if ending == "earliest":
            raise OptionError('endingOffsets "earliest" is not allowed')
        if "maxoffsetspertrigger" in given and "maxeventspertrigger" in given:
            raise OptionError("give maxEventsPerTrigger or maxOffsetsPerTrigger, not both")
        max_offsets = given.get("maxeventspertrigger") or given.get("maxoffsetspertrigger")
        min_partitions = given.get("minpartitions")
        min_events = given.get("mineventspertrigger")
        delay = given.get("maxtriggerdelay")
        if delay and not min_events:
            raise OptionError("maxTriggerDelay goes with minEventsPerTrigger")
        return cls(
            path=path,
            prefixes=prefixes,
            starting=starting,
            ending=ending,
            max_offsets_per_trigger=(
                _positive_int("maxOffsetsPerTrigger", max_offsets) if max_offsets else None
            ),
            fail_on_data_loss=_bool("failOnDataLoss", given.get("failondataloss", "true")),
            min_partitions=_positive_int("minPartitions", min_partitions) if min_partitions else 1,
            min_events_per_trigger=(
                _positive_int("minEventsPerTrigger", min_events) if min_events else None
            ),
            max_trigger_delay=_seconds("maxTriggerDelay", delay) if delay else None,
            stream=stream,
        )


class LogView(Protocol):
    """What planning asks of a log: a journal or a stream."""

    def start_offset(self) -> int:
        """Just below the first sequence the log still holds."""
        ...

    def latest_sequence(self) -> int:
        """The log's last sequence."""
        ...


def resolve(spec: OffsetSpec, journal: LogView) -> int:
    """The sequence an offset spec stands for now (exclusive start or inclusive end)."""
    if spec == "earliest":
        return journal.start_offset()
    if spec == "latest":
        return journal.latest_sequence()
    return spec


@dataclass(frozen=True, slots=True)
class PlannedRange:
    """``(start, end]`` and the segments that hold it."""

    start: int
    end: int
    segments: tuple[Segment, ...]


def split_range(
    coverage: Coverage,
    start: int,
    end: int,
    min_partitions: int = 1,
    partition_rows: int = DEFAULT_PARTITION_ROWS,
) -> list[PlannedRange]:
    """Split ``(start, end]`` into at least ``min_partitions`` ranges (when it is long
    enough), cutting at segment boundaries where one is close, so few segments are
    opened twice."""
    segments = coverage.segments
    if not segments:
        return []
    low = max(start, segments[0].first - 1)
    high = min(end, segments[-1].last)
    span = high - low
    count = min(max(min_partitions, -(-span // partition_rows)), span)
    step = span / count
    boundaries = [s.last for s in segments]
    cuts = [low]
    for i in range(1, count):
        ideal = low + round(step * i)
        # Nearest segment boundary, if it is within a quarter of a partition.
        j = bisect.bisect_left(boundaries, ideal)
        near = [b for b in boundaries[max(j - 1, 0) : j + 1] if low < b < high]
        best = min(near, key=lambda b: abs(b - ideal), default=ideal)
        cut = best if abs(best - ideal) <= step / 4 else ideal
        if cut > cuts[-1]:
            cuts.append(cut)
    cuts.append(high)
    firsts = [s.first for s in segments]
    planned = []
    for lo, hi in itertools.pairwise(cuts):
        first = max(bisect.bisect_right(firsts, lo) - 1, 0)
        last = bisect.bisect_right(firsts, hi)
        held = tuple(s for s in segments[first:last] if s.last > lo and s.first <= hi)
        planned.append(PlannedRange(lo, hi, held))
    return planned


def split_sequences(
    start: int, end: int, min_partitions: int = 1, partition_rows: int = DEFAULT_PARTITION_ROWS
) -> list[tuple[int, int]]:
    """``(start, end]`` as consecutive ranges ``(lo, hi]``: at least ``min_partitions``
    when it is long enough, none longer than ``partition_rows``."""
    span = end - start
    if span <= 0:
        return []
    count = min(max(min_partitions, -(-span // partition_rows)), span)
    cuts = [start + (span * i) // count for i in range(count + 1)]
    return list(itertools.pairwise(cuts))
