"""The Event BUS log in a NATS JetStream stream (``--store jetstream``).

The stream is the log: its sequence is the bus's sequence, an event's uuid is its
``Nats-Msg-Id`` (a publisher that resends after a failover is stored once within the
duplicate window), its topic is its subject (:mod:`bus.eventbus.subjects`), and the
retention options are the stream's limits. Every front-end appends to the stream and
broadcasts what the stream holds, in the stream's order, from a pull consumer over every
subject (:meth:`JetStreamLog.follow`): events published at one front-end are broadcast
by all, under one sequence space, and nothing is broadcast before the stream
acknowledged it.

Two ways to the servers, each where it is best: :class:`bus.nats.client.NatsClient`
(on the reactor, as eMQP's brokers use it) makes and checks the stream and reads its
state; the events go through :mod:`bus.nats` on threads of their own (a writer for
the appends, one for the feed, the reactor's pool for snapshots), about eight times
cheaper per event than nats-py was (docs/cluster.md). This class's methods are called in
the reactor's thread, answer with Deferreds, and hand committed events back in batches
(one thread hop each).

The message body and ranged reads are :mod:`bus.eventbus.stream_read`'s.
"""

from __future__ import annotations

import contextlib
import datetime
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any, TypeVar

from twisted.internet import defer, threads
from twisted.logger import Logger
from twisted.python.threadpool import ThreadPool

from bus.eventbus.codec import MAX_TOPIC_BYTES, EventFields, SequenceEncoding, SyncChunk
from bus.eventbus.config import JetStreamSettings
from bus.eventbus.eventlog import Row
from bus.eventbus.store import Retention
from bus.eventbus.stream_read import (
    Appends,
    RangeReader,
    Topics,
    decoded_rows,
    events_of,
    failover,
)
from bus.extension import StartupError, StorageError
from bus.nats import handshake, jsapi
from bus.nats.blocking import ConnectError, Connection, connection
from bus.nats.client import client_for, stream_ready
from bus.nats.codec import ProtocolError
from bus.nats.failover import Failover
from bus.nats.limits import longest_control_line
from bus.nats.publish import Publisher, PublishError, TooLarge
from bus.nats.ranged import RangeRead
from bus.nats.seen import (
    ConsumerSeen,
    ServerSeen,
    StreamCluster,
    servers_seen,
    stream_cluster,
    unread,
)
from bus.util.handoff import Handoff

#: The stream's settings JetStream keeps in nanoseconds (the options say seconds).
_NANOSECONDS = ("max_age", "duplicate_window")

log = Logger(namespace="bus.eventbus.jetstream")

#: What a snapshot's read gives: rows, or SYNC messages made on the reader's thread.
_Chunk = TypeVar("_Chunk")

#: Snapshot readers kept open between chunks, at most (the oldest is closed first).
OPEN_READERS = 64

#: New readers a snapshot's chunk tries before the snapshot ends unanswered.
READ_ATTEMPTS = 3

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


def stream_config(settings: JetStreamSettings, retention: Retention) -> dict[str, Any]:
    """The stream as a front-end makes it when missing (JetStream's units)."""
    made: dict[str, Any] = {
        "name": settings.stream,
        "retention": "limits",
        "storage": "file",
        "discard": "old",
        # A batch of appends is one proposal to the replicas (nats-server 2.12+; an
        # older server leaves it off and appends go message by message).
        "allow_atomic": True,
        **stream_limits(settings, retention),
    }
    for key in _NANOSECONDS:
        made[key] = int(float(made[key]) * 1e9)
    return made


#: The key of a stream's metadata that names the log it holds, when that is not the
#: stream itself: a log imported from a server's SQLite file keeps that log's store id
#: (``eventbus-cli import-log``), so that its clients' cursors go on.
STORE_ID = "bus_store_id"


def created_text(created: str | None) -> str:
    """The stream's creation time as the store id has always said it (nats-py's reading:
    UTC, microseconds), so that an upgraded front-end serves the same store id."""
    if not created:
        return "unknown"
    text = created.replace("Z", "+00:00")
    if "." in text:
        date, fraction_zone = text.split(".", 1)
        cut = next((i for i, c in enumerate(fraction_zone) if c in "+-"), len(fraction_zone))
        fraction, zone = fraction_zone[:cut], fraction_zone[cut:]
        text = f"{date}.{fraction[:6].ljust(6, '0')}{zone}"
    return datetime.datetime.fromisoformat(text).astimezone(datetime.UTC).isoformat()


class JetStreamLog:
    """The stream, from the reactor's thread. Open it (:meth:`open`), then :meth:`append`
    batches one at a time and :meth:`follow` what the stream commits."""

    def __init__(self, reactor: Any, settings: JetStreamSettings, retention: Retention) -> None:
        self.reactor = reactor
        self.settings = settings
        self.retention = retention
        self.path = Path(f"jetstream:{settings.stream}")
        #: The stream's management (make, check, state) on the reactor.
        self.client = client_for(reactor, settings, f"eventbus-{settings.stream}", echo=False)
        self.store_id = ""
        #: The stream's last sequence when opened, then as the feed moves.
        self.last_sequence = 0
        self.first_sequence = 0
        self.messages = 0
        self.bytes = 0
        self.leader: str | None = None
        #: The stream's leader and replicas with their lag, as last read.
        self.cluster = StreamCluster()
        #: Whether appends go as atomic batches: the stream takes them (made so by a
        #: front-end on nats-server 2.12+) and has replicas. Each append is then one
        #: batch, stored whole or not at all.
        self.atomic = False
        #: Whether the data path's connections (the writer's and the feed's) are up now,
        #: and how often one was lost (each is made again, to the next server).
        self.connected = False
        self.disconnects = 0
        #: What the servers take: the most bytes of one message (the least ``max_payload``
        #: of the servers' INFOs seen), and the longest command line (asked of the server
        #: at open: INFO does not say it).
        self.max_payload = handshake.DEFAULT_MAX_PAYLOAD
        self.max_control_line = 0
        #: Snapshot reads whose consumer's replica said "nothing more" while the stream's
        #: leader held more (a replica catching up): each read on instead of ending short.
        self.reads_behind = 0
        #: Snapshot readers left open between chunks, by where the next chunk starts
        #: (after, upto, subtrees): a snapshot reads on without a consumer per chunk.
        self._readers: OrderedDict[tuple[int, int, tuple[bytes, ...]], RangeReader] = OrderedDict()
        self._closed = False
        #: The data path (bus.nats): one writer thread and its connection for the
        #: appends, one thread for the feed.
        self._writer = ThreadPool(1, 1, name=f"nats-append-{settings.stream}")
        self._publisher: Publisher | None = None
        #: Events as messages, made in the reactor's thread (:meth:`append`).
        self._items = Appends(settings.subject_prefix)
        #: The data path's connections, each role's own: its servers in turn (those the
        #: cluster names too), a server in lame-duck mode left before it closes.
        self._failovers: dict[str, Failover] = {
            role: failover(
                settings,
                name=f"eventbus-{role}-{settings.stream}",
                # The feed's reads wait a pull's expiry plus this: a silent server is left
                # after two ping intervals, as the management connection leaves it.
                timeout=settings.ping_interval * 2 if role == "feed" else None,
            )
            for role in ("append", "feed")
        }
        self._feed_thread: threading.Thread | None = None
        #: The feed's reader now (its consumer's name and what it still holds).
        self._feed_reader: RangeRead | None = None

    # -- opening -------------------------------------------------------------------------------

    def open(self) -> defer.Deferred[None]:
        """Connect, make the stream when missing and check it when found; a StartupError
        says what is wrong in one line."""
        self._writer.start()
        opening: defer.Deferred[None] = defer.ensureDeferred(self._open())
        # The writer's connection too, so that /status says connected from the start.
        longest = len(self.settings.subject_prefix) + 1 + 3 * MAX_TOPIC_BYTES
        return opening.addCallback(
            lambda _: threads.deferToThreadPool(
                self.reactor, self._writer, self._connect_publisher, longest
            )
        )

    def _connect_publisher(self, longest_subject: int) -> None:
        """In the writer's thread, at open: its connection, or a start-up error; and the
        longest command line the servers take, asked up to what ``longest_subject``
        needs."""
        try:
            self._writer_publisher()
            self.max_control_line = longest_control_line(
                lambda: connection(self.settings, name=f"eventbus-probe-{self.settings.stream}"),
                longest_subject + jsapi.PUBLISH_LINE_BEYOND_SUBJECT,
            )
        except (ConnectError, OSError, ProtocolError) as error:
            raise StartupError("nats", f"{', '.join(self.settings.servers)}: {error}") from None

    def _writer_publisher(self) -> Publisher:
        """In the writer's thread: its publisher, on the append role's connection (made
        again to the next server when there is none, or its server is in lame-duck
        mode)."""
        made = self._data_connection("append")
        if self._publisher is None or self._publisher.connection is not made:
            self._publisher = Publisher(made, self.atomic, self.settings.stream)
        return self._publisher

    async def _open(self) -> None:
        settings = self.settings
        self.client.start()
        try:
            # An unreachable cluster at start is a start-up error, not an endless wait.
            await self.client.when_connected(timeout=settings.connect_timeout)
        except ConnectError as error:
            self.client.stop()
            raise StartupError(
                "nats", f"cannot reach {', '.join(settings.servers)}: {error}"
            ) from None
        wanted = stream_limits(settings, self.retention)
        made = stream_config(settings, self.retention)
        try:
            info, _ = await stream_ready(self.client, made, 3 * settings.connect_timeout)
        except jsapi.JetStreamError as error:
            await self._refuse_overlap(error, wanted["subjects"][0])
            raise  # _refuse_overlap always raises
        except TimeoutError as error:
            self.client.stop()
            raise StartupError("nats-stream", str(error)) from None
        config = info["config"]
        unfinished = jsapi.unfinished_import(settings.stream, config)
        if unfinished is not None:
            self.client.stop()
            raise StartupError("nats-stream", unfinished)
        found = {key: config.get(key) for key in wanted}
        for key in _NANOSECONDS:
            if isinstance(found.get(key), int):
                found[key] = found[key] / 1e9
        wrong = jsapi.disagreements(found, wanted)
        if wrong:
            self.client.stop()
            raise StartupError(
                "nats-stream",
                f"stream {settings.stream} exists with other settings ({'; '.join(wrong)}): "
                "change the options or the stream (it is never changed silently)",
            )
        self._took_state(info)
        # Atomic batches pay where there are replicas to propose to: measured (bench/ab.py,
        # eventbus_cluster) R3 1.32 x the events/s and 0.74 x the CPU per event of a
        # message at a time, R1 0.87 x (the leader stages each batch before storing it).
        self.atomic = bool(config.get("allow_atomic")) and int(config.get("num_replicas") or 1) > 1

    async def _refuse_overlap(self, error: jsapi.JetStreamError, subjects: str) -> None:
        """A stream of another name holds our subjects: JetStream refuses a second one, and
        each front-end must name the same stream. Say which, in one line."""
        settings = self.settings
        holder = None
        if error.err_code == jsapi.OVERLAPPING_SUBJECTS:
            try:
                names = await self.client.jetstream(
                    f"{jsapi.API}.STREAM.NAMES", {"subject": subjects}
                )
                holder = (names.get("streams") or [None])[0]
            except Exception:  # the error itself still says what is wrong
                holder = None
        self.client.stop()
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

    def _took_state(self, info: dict[str, Any]) -> None:
        # A stream made again is another log: clients and the Spark bridge start over.
        metadata = (info.get("config") or {}).get("metadata") or {}
        kept = metadata.get(STORE_ID) if isinstance(metadata, dict) else None
        self.store_id = (
            str(kept) if kept else f"{self.settings.stream}@{created_text(info.get('created'))}"
        )
        # The node that leads the stream's replicas now (None: one node, or none elected).
        self.leader = (info.get("cluster") or {}).get("leader")
        self.cluster = stream_cluster(info)
        state = info["state"]
        self.last_sequence = int(state["last_seq"])
        self.first_sequence = int(state["first_seq"])
        self.messages = int(state["messages"])
        self.bytes = int(state["bytes"])

    # -- appending -----------------------------------------------------------------------------

    def append(self, fields: Sequence[EventFields]) -> defer.Deferred[list[int]]:
        """Publish a batch, in order; the Deferred fires with each event's sequence (an
        event the stream already held, by its uuid, gives its first sequence) or fails
        with :class:`StorageError` (nothing of the batch may be taken as stored: resend
        it whole, duplicates are dropped by uuid). One batch at a time, on the writer's
        thread and its connection of its own."""
        items = self._items(fields)
        return threads.deferToThreadPool(self.reactor, self._writer, self._publish, items)

    def _publish(self, items: list[tuple[bytes, bytes, bytes]]) -> list[int]:
        """In the writer's thread: the batch through its connection, made (to the next
        server) when there is none; a failure drops it, so the next batch may find a
        server that stores."""
        try:
            publisher = self._writer_publisher()
            self._took_limit(publisher.connection)
            return publisher.publish(items, self.settings.ack_timeout)
        except TooLarge:
            raise  # nothing was sent: the front-end drops those events and sends the rest
        except (PublishError, ConnectError, ProtocolError, OSError) as error:
            self._publisher = None
            self._lost("append")
            raise StorageError(error) from None

    def _data_connection(self, role: str) -> Connection:
        """``role``'s blocking connection: the one there is, or one made to the servers in
        turn (after a failure the next one first: a minority's server answers but cannot
        store; a server in lame-duck mode, the others first)."""
        made = self._failovers[role].connection()
        self._update_connected()
        return made

    def _took_limit(self, made: Connection) -> None:
        """A server's INFO read: the least ``max_payload`` seen is what the collector
        keeps events to (a cluster's servers normally agree)."""
        if made.max_payload < self.max_payload:
            self.max_payload = made.max_payload

    def _lost(self, role: str) -> None:
        roles = self._failovers[role]
        if roles.current is not None:
            self.disconnects += 1
        roles.drop()
        self._update_connected()

    def _update_connected(self) -> None:
        self.connected = all(each.current is not None for each in self._failovers.values())

    @property
    def lame_duck_moves(self) -> int:
        """Data connections left for another server because theirs went into lame-duck
        mode (before it closed them)."""
        return sum(each.left_lame_duck for each in self._failovers.values())

    def servers_seen(self) -> list[ServerSeen]:
        """Each server known (given or learnt): in the cluster now, in lame-duck mode, and
        which of this log's connections (management, append, feed) are open to it."""
        open_now: list[tuple[str, str, dict[str, Any], bool]] = []
        url = self.client.server_url
        if url is not None:  # the reactor's client pings: what it hears is live
            open_now.append(("management", url, self.client.info, True))
        for role, roles in self._failovers.items():
            made = roles.current
            if made is not None and made.server:
                open_now.append((role, made.server, made.info, False))
        return servers_seen(self.client.servers, open_now)

    def consumers(self) -> list[ConsumerSeen]:
        """This front-end's consumers of the stream now: the feed's (its name, the last
        sequence it delivered, what it said it still held) and each open snapshot's."""
        stream = self.settings.stream
        found = []
        feed = self._feed_reader
        if feed is not None and feed.consumer:
            found.append(
                ConsumerSeen("feed", feed.consumer, stream, delivered=feed.after,
                             pending=feed.pending)
            )  # fmt: skip
        for reader in self._readers.values():
            name = reader.consumer
            if name:
                found.append(ConsumerSeen("snapshot", name, stream))
        return found

    # -- following -----------------------------------------------------------------------------

    def follow(self, after: int, deliver: Callable[[list[Row]], None]) -> defer.Deferred[None]:
        """Hand ``deliver`` (in the reactor's thread) every event above ``after``, in the
        stream's order, in batches, as the stream commits them: a pull consumer read on
        a thread of its own, made again from the last sequence after any failure. The
        Deferred fires once the first consumer is made (or fails as it does)."""
        started: defer.Deferred[None] = defer.Deferred()
        self._feed_thread = threading.Thread(
            target=self._feed, args=(after, deliver, started), daemon=True,
            name=f"nats-feed-{self.settings.stream}",
        )  # fmt: skip
        self._feed_thread.start()
        return started

    def _feed(
        self, after: int, deliver: Callable[[list[Row]], None], started: defer.Deferred[None]
    ) -> None:
        """The feed's thread."""
        topics = Topics(self.settings.subject_prefix)
        call = self.reactor.callFromThread
        handoff: Handoff[Row] = Handoff(self.reactor, deliver)
        everything = [self.settings.subject_prefix + ".>"]
        # Kept here, not read from ``started.called``: the reactor runs the callback
        # later, and a failure before it does must not answer ``started`` twice (nor
        # end the feed as a first failure would).
        answered = False
        pause = 0.0
        while not self._closed:
            made: Connection | None = None
            try:
                made = self._data_connection("feed")
                self._took_limit(made)
                reader = RangeRead(made, self.settings.stream, after, 0, everything, follow=True)
                reader.open()
                self._feed_reader = reader
                if not answered:
                    answered = True
                    call(started.callback, None)
                pause = 0.0
                # A server found draining already is read from (all may be, one after
                # another): one that starts draining meanwhile is left.
                draining = made.lame_duck
                while not self._closed and (draining or not made.lame_duck):
                    stored = reader.next_batch(FEED_BATCH)
                    if stored.sequences:
                        after = stored.sequences[-1]
                        stored, names, skipped = events_of(stored, topics)
                        if skipped:
                            call(log.warn, "JetStream feed: left out {count} messages up to "
                                 "{after} that name no topic (an import's placeholders, or "
                                 "another writer's)", count=skipped, after=after)  # fmt: skip
                        if names:
                            handoff.put(decoded_rows(stored, names))
                # Its server is draining: the read is made again above ``after`` on
                # another before this one closes (the next _data_connection leaves it).
                with contextlib.suppress(Exception):
                    reader.close()
            except Exception as error:
                self._feed_reader = None
                if made is not None:
                    self._lost("feed")
                if self._closed:
                    break
                if not answered:
                    call(started.errback, StorageError(error))
                    return
                message = str(error) or type(error).__name__
                call(log.info, "JetStream feed: {error}; following again above {after}",
                     error=message, after=after)  # fmt: skip
                pause = min(1.0, pause * 2 or 0.1)
                time.sleep(pause)
        self._failovers["feed"].close()

    # -- reading (snapshots) -----------------------------------------------------------------

    def read_rows(
        self, after: int, upto: int, prefixes: Iterable[bytes] = (), limit: int = 1000
    ) -> defer.Deferred[list[Row]]:
        """Events with ``after < sequence <= upto`` under ``prefixes`` (all when empty), in
        order, at most ``limit``, read from the stream on a thread of the reactor's pool
        (a blocking reader of its own per snapshot, kept between chunks)."""
        return self._read(
            after, upto, prefixes, lambda reader: reader.next_rows(limit),
            lambda rows: rows[-1][0] if rows else None,
        )  # fmt: skip

    def read_syncs(
        self,
        after: int,
        upto: int,
        prefixes: Iterable[bytes],
        limit: int,
        identity: bytes,
        encoding: SequenceEncoding,
    ) -> defer.Deferred[SyncChunk]:
        """:meth:`read_rows` as a snapshot's SYNC messages to ``identity``, made on the
        reader's thread (the reactor only sends them)."""
        return self._read(
            after, upto, prefixes, lambda reader: reader.next_syncs(limit, identity, encoding),
            lambda chunk: chunk.sequences[-1] if chunk.sequences else None,
        )  # fmt: skip

    def _read(
        self,
        after: int,
        upto: int,
        prefixes: Iterable[bytes],
        take: Callable[[RangeReader], _Chunk],
        last: Callable[[_Chunk], int | None],
    ) -> defer.Deferred[_Chunk]:
        """``take`` of the reader of ``(after, upto]`` under ``prefixes`` (the one kept from
        the chunk before, or a new one), in a pool thread; the reader is kept for the next
        chunk, from the ``last`` sequence it gave, unless it is done."""
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
            take,
        )

        def read(result: tuple[RangeReader, _Chunk]) -> _Chunk:
            reader, chunk = result
            self.reads_behind += reader.take_behind()
            position = last(chunk)
            if position is not None and not reader.done and not self._closed:
                self._readers[(position, upto, subtrees)] = reader
                while len(self._readers) > OPEN_READERS:  # snapshots abandoned mid-way
                    _key, oldest = self._readers.popitem(last=False)
                    self.reactor.callInThread(oldest.close)
            else:
                self.reactor.callInThread(reader.close)
            return chunk

        return reading.addCallback(read)

    def _read_chunk(
        self,
        reader: RangeReader | None,
        after: int,
        upto: int,
        subtrees: tuple[bytes, ...],
        take: Callable[[RangeReader], _Chunk],
    ) -> tuple[RangeReader, _Chunk]:
        """In a pool thread: the next chunk, from the reader kept or a new one (tried
        :data:`READ_ATTEMPTS` times: a leader change or a lost connection is no reason
        to end a snapshot unanswered)."""
        say = self.reactor.callFromThread
        if reader is not None:
            try:
                return reader, take(reader)
            except Exception as error:  # e.g. its consumer expired while the client was slow
                reader.close()
                say(log.info, "JetStream: a snapshot's reader failed ({error}); reading on "
                    "with a new one", error=str(error) or type(error).__name__)  # fmt: skip
        for attempt in range(READ_ATTEMPTS):
            # Rows and SYNC messages hold no time stored: the reader reads none.
            reader = RangeReader(
                self.settings, after, upto, name=f"eventbus-{self.settings.stream}", stamps=False
            )
            try:
                return reader, take(reader.open(subtrees))
            except Exception as error:
                reader.close()
                if attempt == READ_ATTEMPTS - 1 or self._closed:
                    raise
                say(log.info, "JetStream: a snapshot's read failed ({error}); trying again",
                    error=str(error) or type(error).__name__)  # fmt: skip
                time.sleep(0.2 * 2**attempt)
        raise AssertionError("unreachable")

    # -- state ---------------------------------------------------------------------------------

    def refresh(self) -> defer.Deferred[None]:
        """Read the stream's state again (for /status and the periodic report)."""

        asked = self.client.jetstream(jsapi.stream_info(self.settings.stream))
        return asked.addCallbacks(self._took_state, self._state_unread)

    def _state_unread(self, failure: Any) -> Any:
        """No answer: no leader to give one, as far as this front-end can tell."""
        self.cluster = unread(str(failure.value))
        return failure

    def size(self) -> int:
        """Bytes the stream holds (as of the last state read)."""
        return self.bytes

    def count(self) -> int:
        """Events the stream holds (as of the last state read)."""
        return self.messages

    def close(self) -> defer.Deferred[None]:
        """Stop reading and writing; fires once the writer's thread has finished its batch."""
        self._closed = True
        readers, self._readers = list(self._readers.values()), OrderedDict()
        for reader in readers:
            reader.close()  # a request sent and a socket closed: nothing waited for
        feed = self._failovers["feed"].current
        if feed is not None:
            feed.shutdown()  # its thread wakes, sees the log closed and ends

        def writer_done() -> None:
            # The pool's thread ends after the batch in hand (at most ack_timeout).
            if self._writer.started:
                self._writer.callInThread(self._close_publisher)
                self._writer.stop()

        writer = threads.deferToThread(writer_done)
        self.client.stop()
        return writer

    def _close_publisher(self) -> None:
        self._publisher = None
        self._failovers["append"].close()
