"""The Event BUS log in a NATS JetStream stream (``--store jetstream``).

The stream is the log: its sequence is the bus's sequence, an event's uuid is its
``Nats-Msg-Id`` (a publisher that resends after a failover is stored once within the
duplicate window), its topic is its subject (:mod:`bus.eventbus.subjects`), and the
retention options are the stream's limits. Every front-end appends to the stream and
broadcasts what the stream holds, in the stream's order, from an ordered consumer
(:meth:`JetStreamLog.follow`): events published at one front-end are broadcast by all,
under one sequence space, and nothing is broadcast before the stream acknowledged it.

nats-py is asyncio; it runs on a loop of its own (:class:`bus.asyncloop.AsyncioThread`)
and this class's methods, called in the reactor's thread, answer with Deferreds and hand
committed events back in batches (one thread hop per batch).

The message body and ranged reads are :mod:`bus.eventbus.stream_read`'s.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

from twisted.internet import defer, threads
from twisted.logger import Logger

from bus.asyncloop import AsyncioThread
from bus.errors import StartupError, StorageError
from bus.eventbus import subjects
from bus.eventbus.codec import EventFields
from bus.eventbus.config import JetStreamSettings
from bus.eventbus.eventlog import Row
from bus.eventbus.store import Retention
from bus.eventbus.stream_read import RangeReader, connect_options, decode, encode

#: JetStream's error code for a stream whose subjects another stream holds.
OVERLAPPING_SUBJECTS = 10065

log = Logger(namespace="bus.eventbus.jetstream")

#: Snapshot readers kept open between chunks, at most (the oldest is closed first).
OPEN_READERS = 64

#: Committed events handed to the reactor at once, at most.
FEED_BATCH = 2000


def stream_limits(settings: JetStreamSettings, retention: Retention) -> dict[str, Any]:
    """The stream's settings the options decide (what is checked on a stream found)."""
    return {
        "subjects": [settings.subject_prefix + ".>"],
        "num_replicas": settings.replicas,
        "max_age": float(retention.max_age or 0),
        "max_msgs": retention.max_count or -1,
        "max_msgs_per_subject": 1 if retention.latest_per_topic else -1,
        "duplicate_window": float(settings.duplicate_window),
    }


def disagreements(found: dict[str, Any], wanted: dict[str, Any]) -> list[str]:
    """What a stream found has that the options do not say, one phrase each."""
    said = []
    for key, value in wanted.items():
        have = found.get(key)
        if isinstance(value, float):
            same = have is not None and abs(float(have) - value) < 1e-3
        else:
            same = have == value
        if not same:
            said.append(f"{key} is {have!r}, the options say {value!r}")
    return said


class JetStreamLog:
    """The stream, from the reactor's thread. Open it (:meth:`open`), then :meth:`append`
    batches one at a time and :meth:`follow` what the stream commits."""

    def __init__(self, reactor: Any, settings: JetStreamSettings, retention: Retention) -> None:
        self.reactor = reactor
        self.settings = settings
        self.retention = retention
        self.path = Path(f"jetstream:{settings.stream}")
        self.loop = AsyncioThread(reactor, f"nats-{settings.stream}")
        self.store_id = ""
        #: The stream's last sequence when opened, then as the feed moves.
        self.last_sequence = 0
        self.first_sequence = 0
        self.messages = 0
        self.bytes = 0
        self.leader: str | None = None
        #: Whether the client is connected now (nats-py reconnects on its own).
        self.connected = False
        self.disconnects = 0
        self._nc: Any = None
        self._js: Any = None
        self._feed: Any = None
        #: Snapshot readers left open between chunks, by where the next chunk starts
        #: (after, upto, subtrees): a snapshot reads on without a consumer per chunk.
        self._readers: OrderedDict[tuple[int, int, tuple[bytes, ...]], RangeReader] = OrderedDict()
        self._closed = False

    # -- opening -------------------------------------------------------------------------------

    def open(self) -> defer.Deferred[None]:
        """Connect, make the stream when missing and check it when found; a StartupError
        says what is wrong in one line."""
        self.loop.start()
        return self.loop.call(self._open())

    async def _open(self) -> None:
        import nats
        from nats.errors import NoServersError
        from nats.js.errors import BadRequestError, NotFoundError

        settings = self.settings
        options: dict[str, Any] = {
            **connect_options(settings),
            "max_reconnect_attempts": -1,
            "allow_reconnect": True,
            "reconnect_time_wait": 0.5,
            # A server cut off by the network answers nothing: two unanswered pings and
            # the client moves to another one (nats-py's default waits minutes).
            "ping_interval": settings.ping_interval,
            "max_outstanding_pings": 2,
            "disconnected_cb": self._disconnected,
            "reconnected_cb": self._reconnected,
            "error_cb": self._error,
        }
        try:
            # The first connection is tried once per server: an unreachable cluster at
            # start is a start-up error, not an endless wait.
            self._nc = await nats.connect(
                **{**options, "allow_reconnect": False, "max_reconnect_attempts": 1}
            )
        except (TimeoutError, NoServersError, OSError) as error:
            raise StartupError(
                "nats",
                f"cannot reach {', '.join(settings.servers)}: {error or type(error).__name__}",
            ) from None
        except Exception as error:  # credentials refused, TLS: nats-py's own errors
            raise StartupError("nats", f"{', '.join(settings.servers)}: {error}") from None
        await self._nc.close()
        self._nc = await nats.connect(**options)
        self.connected = True
        self._js = self._nc.jetstream(timeout=settings.ack_timeout)
        wanted = stream_limits(settings, self.retention)
        deadline = self.reactor.seconds() + 3 * settings.connect_timeout
        while True:
            try:
                info = await self._stream_info_or_made(wanted, NotFoundError)
                break
            except BadRequestError as error:
                await self._refuse_overlap(error, wanted["subjects"][0])
                raise
            except Exception as error:  # no meta leader, replicas not all up: a new cluster
                if self.reactor.seconds() > deadline:
                    await self._nc.close()
                    raise StartupError(
                        "nats-stream", f"JetStream did not answer for {settings.stream}: {error}"
                    ) from None
                await asyncio.sleep(0.25)
        found = {key: getattr(info.config, key, None) for key in wanted}
        wrong = disagreements(found, wanted)
        if wrong:
            await self._nc.close()
            raise StartupError(
                "nats-stream",
                f"stream {settings.stream} exists with other settings ({'; '.join(wrong)}): "
                "change the options or the stream (it is never changed silently)",
            )
        self._took_state(info)

    async def _refuse_overlap(self, error: Any, subjects: str) -> None:
        """A stream of another name holds our subjects: JetStream refuses a second one, and
        each front-end must name the same stream. Say which, in one line."""
        settings = self.settings
        holder = None
        if getattr(error, "err_code", None) == OVERLAPPING_SUBJECTS:
            try:
                holder = await self._js.find_stream_name_by_subject(subjects)
            except Exception:  # the error itself still says what is wrong
                holder = None
        await self._nc.close()
        if holder is not None:
            raise StartupError(
                "nats-stream",
                f"stream {holder} already holds the subjects {subjects}: "
                f"--nats-stream {holder} serves that log, or give another "
                "--nats-subject-prefix for a log of its own",
            ) from None
        raise StartupError(
            "nats-stream", f"JetStream refused stream {settings.stream}: {error}"
        ) from None

    async def _stream_info_or_made(
        self, wanted: dict[str, Any], missing: type[BaseException]
    ) -> Any:
        try:
            return await self._js.stream_info(self.settings.stream)
        except missing:
            return await self._create(wanted)

    async def _create(self, wanted: dict[str, Any]) -> Any:
        from nats.js.api import DiscardPolicy, RetentionPolicy, StorageType, StreamConfig

        config = StreamConfig(
            name=self.settings.stream,
            retention=RetentionPolicy.LIMITS,
            storage=StorageType.FILE,
            discard=DiscardPolicy.OLD,
            **wanted,
        )
        info = await self._js.add_stream(config)
        log.info(
            "JetStream: made stream {stream} ({replicas} replicas, subjects {subjects})",
            stream=self.settings.stream,
            replicas=self.settings.replicas,
            subjects=wanted["subjects"][0],
        )
        return info

    def _took_state(self, info: Any) -> None:
        created = info.created.isoformat() if info.created is not None else "unknown"
        # A stream made again is another log: clients and the Spark bridge start over.
        self.store_id = f"{self.settings.stream}@{created}"
        # The node that leads the stream's replicas now (None: one node, or none elected).
        self.leader = info.cluster.leader if info.cluster is not None else None
        state = info.state
        self.last_sequence = int(state.last_seq)
        self.first_sequence = int(state.first_seq)
        self.messages = int(state.messages)
        self.bytes = int(state.bytes)

    async def _disconnected(self) -> None:
        self.connected = False
        self.disconnects += 1

    async def _reconnected(self) -> None:
        self.connected = True

    async def _error(self, error: Exception) -> None:
        self.loop.to_reactor(
            lambda: log.warn("NATS: {error}", error=str(error) or type(error).__name__)
        )

    # -- appending -----------------------------------------------------------------------------

    def append(self, fields: Sequence[EventFields]) -> defer.Deferred[list[int]]:
        """Publish a batch, in order; the Deferred fires with each event's sequence (an
        event the stream already held, by its uuid, gives its first sequence... or 0 when
        the stream does not say) or fails with :class:`StorageError` (nothing of the
        batch may be taken as stored: resend it whole, duplicates are dropped by uuid)."""
        prefix = self.settings.subject_prefix
        items = [
            (subjects.subject(prefix, event[0]), encode(event), event[3].decode("ascii"))
            for event in fields
        ]
        return self.loop.call(self._append(items))

    async def _append(self, items: list[tuple[str, bytes, str]]) -> list[int]:
        js = self._js
        futures = []
        try:
            for subject, body, msg_id in items:
                futures.append(
                    await js.publish_async(subject, body, headers={"Nats-Msg-Id": msg_id})
                )
            acks = await asyncio.wait_for(
                asyncio.gather(*futures), timeout=self.settings.ack_timeout
            )
        except Exception as error:
            for future in futures:
                future.cancel()  # frees nats-py's pending slot
            if isinstance(error, asyncio.TimeoutError):
                error = TimeoutError(f"no acknowledgement in {self.settings.ack_timeout:g}s")
            raise StorageError(error) from None
        return [int(ack.seq) for ack in acks]

    # -- following -----------------------------------------------------------------------------

    def follow(self, after: int, deliver: Callable[[list[Row]], None]) -> defer.Deferred[None]:
        """Hand ``deliver`` (in the reactor's thread) every event above ``after``, in the
        stream's order, in batches, as the stream commits them."""
        return self.loop.call(self._follow(after, deliver))

    async def _follow(self, after: int, deliver: Callable[[list[Row]], None]) -> None:
        from nats.js.api import ConsumerConfig, DeliverPolicy

        prefix = self.settings.subject_prefix
        pending: list[Row] = []
        loop = asyncio.get_running_loop()
        flush_due = False

        def flush() -> None:
            nonlocal pending, flush_due
            flush_due = False
            if pending:
                batch, pending = pending, []
                self.loop.to_reactor(deliver, batch)

        async def got(message: Any) -> None:
            nonlocal flush_due
            sequence = int(message.metadata.sequence.stream)
            topic_, producer, timestamp, uuid, data = decode(prefix, message.subject, message.data)
            pending.append((sequence, topic_, producer, timestamp, uuid, data))
            if len(pending) >= FEED_BATCH:
                flush()
            elif not flush_due:
                flush_due = True
                loop.call_soon(flush)  # once the messages read together are in

        config = ConsumerConfig(
            deliver_policy=DeliverPolicy.BY_START_SEQUENCE, opt_start_seq=after + 1
        )
        self._feed = await self._js.subscribe(
            prefix + ".>",
            cb=got,
            ordered_consumer=True,
            config=config,
            stream=self.settings.stream,
            idle_heartbeat=2.0,
            pending_msgs_limit=-1,
        )

    # -- reading (snapshots) -----------------------------------------------------------------

    def read_rows(
        self, after: int, upto: int, prefixes: Iterable[bytes] = (), limit: int = 1000
    ) -> defer.Deferred[list[Row]]:
        """Events with ``after < sequence <= upto`` under ``prefixes`` (all when empty), in
        order, at most ``limit``, read from the stream on a thread of the reactor's pool
        (a blocking reader of its own per snapshot, kept between chunks)."""
        subtrees = tuple(prefixes)
        reader = self._readers.pop((after, upto, subtrees), None)
        reading = threads.deferToThreadPool(
            self.reactor,
            self.reactor.getThreadPool(),
            self._read_chunk,
            reader,
            after,
            upto,
            subtrees,
            limit,
        )

        def read(result: tuple[RangeReader, list[Row]]) -> list[Row]:
            reader, rows = result
            if rows and not reader.done and not self._closed:
                self._readers[(rows[-1][0], upto, subtrees)] = reader
                while len(self._readers) > OPEN_READERS:  # snapshots abandoned mid-way
                    _key, oldest = self._readers.popitem(last=False)
                    self.reactor.callInThread(oldest.close)
            else:
                self.reactor.callInThread(reader.close)
            return rows

        return reading.addCallback(read)

    def _read_chunk(
        self,
        reader: RangeReader | None,
        after: int,
        upto: int,
        subtrees: tuple[bytes, ...],
        limit: int,
    ) -> tuple[RangeReader, list[Row]]:
        """In a pool thread: the next chunk, from the reader kept or a new one."""
        if reader is not None:
            try:
                return reader, [row for row, _stored in reader.next(limit)]
            except Exception:  # e.g. its consumer expired while the client was slow
                reader.close()
                log.info("JetStream: a snapshot's reader failed; reading on with a new one")
        reader = RangeReader(self.settings, after, upto, name=f"eventbus-{self.settings.stream}")
        try:
            return reader, [row for row, _stored in reader.open(subtrees).next(limit)]
        except BaseException:
            reader.close()
            raise

    # -- state ---------------------------------------------------------------------------------

    def refresh(self) -> defer.Deferred[None]:
        """Read the stream's state again (for /status and the periodic report)."""

        async def info() -> None:
            self._took_state(await self._js.stream_info(self.settings.stream))

        return self.loop.call(info())

    def size(self) -> int:
        """Bytes the stream holds (as of the last state read)."""
        return self.bytes

    def count(self) -> int:
        return self.messages

    def close(self) -> defer.Deferred[None]:
        self._closed = True
        readers, self._readers = list(self._readers.values()), OrderedDict()
        for reader in readers:
            reader.close()  # a request sent and a socket closed: nothing waited for

        async def drain() -> None:
            if self._nc is not None and not self._nc.is_closed:
                await self._nc.drain()

        closing = self.loop.call(drain()) if self.loop.running else defer.succeed(None)

        def stopped(result: object) -> None:
            self.loop.stop()

        return closing.addBoth(stopped)
