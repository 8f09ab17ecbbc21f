"""An Event BUS front-end whose log is a JetStream stream (``--store jetstream``).

The same three ports, wire, CURVE and rights, status and metrics as the server with its
own log (:class:`bus.eventbus.server.EventBusService`, which this extends), and no state
of its own: PUBs go to the stream (:mod:`bus.eventbus.jetstream`), one acknowledged
batch at a time (:class:`bus.eventbus.stream_core.StreamCore`); what it broadcasts is what
the stream committed, read back in the stream's order, so any number of front-ends on
any hosts broadcast one sequence space; heartbeats carry the highest sequence this
front-end broadcast; snapshots are read from the stream under subject filters. While the
stream cannot store (no quorum, no leader, no answer), the collector is not read, as on a
full disk, and the refused batch is resent whole (the stream drops what it already took,
by uuid). Nothing is broadcast before the stream acknowledged it. What the servers cannot
take (a message over their ``max_payload``, a subject over their command line) is dropped
at the collector and counted, never sent.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from twisted.application.service import Service
from twisted.internet import defer
from twisted.internet.base import DelayedCall
from twisted.logger import Logger
from twisted.python.failure import Failure

from bus.eventbus.codec import EventFields
from bus.eventbus.config import EventBusConfig, JetStreamSettings
from bus.eventbus.eventlog import Row
from bus.eventbus.jetstream import JetStreamLog
from bus.eventbus.server import EventBusService
from bus.eventbus.snapshots import SnapshotScheduler
from bus.eventbus.stream_core import StreamCore, largest_data
from bus.extension import Metric, StartupError, counter, gauge
from bus.nats import codec as nats_codec
from bus.nats import jsapi
from bus.nats.publish import TooLarge
from bus.nats.seen import cluster_metrics, cluster_status

#: A refused batch is sent again soon and often: the stream stores a resent event once,
#: and a new leader (elected 4-9 s after one dies) should not wait on a long back-off.
RETRY_MIN = 0.25
RETRY_MAX = 1.0

log = Logger(namespace="bus.eventbus")


class EventBusFrontEnd(EventBusService):
    """The bus's ports in front of a JetStream stream (see the module's text)."""

    def __init__(
        self,
        config: EventBusConfig,
        stream: JetStreamSettings,
        reactor: Any = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        super().__init__(config, reactor, clock)
        if config.pair is not None:
            raise ValueError("a front-end of a JetStream stream has no pair: the cluster is")
        self.stream_settings = stream
        self.stream = JetStreamLog(self.reactor, stream, config.retention)
        self.core: StreamCore  # type: ignore[assignment]
        self._resend: DelayedCall | None = None
        self._appending = False

    @property
    def store(self) -> Any:
        """The stream (its id, last sequence and size, as the SQLite log gives them)."""
        return self.stream

    # -- starting ------------------------------------------------------------------------------

    def startService(self) -> defer.Deferred[None]:  # type: ignore[override]
        """Reach the stream first (a StartupError says why not), then serve."""
        # The log is the stream's; the data directory holds only status.json.
        try:
            Path(self.config.data_dir).mkdir(parents=True, exist_ok=True)
        except OSError as error:
            return defer.fail(
                StartupError("data-dir", f"cannot make {self.config.data_dir}: {error}")
            )
        opening = self.stream.open()
        opening.addCallback(lambda _: self._serve())
        opening.addErrback(self._not_opened)
        return opening

    def _not_opened(self, failure: Failure) -> Failure:
        self.stream.close()
        return failure

    def _serve(self) -> defer.Deferred[None]:
        config, stream = self.config, self.stream
        self._retry_delay = self._first_retry()
        self.core = StreamCore(
            released=stream.last_sequence,
            max_data_bytes=config.max_data_bytes,
            clock=self.clock,
            logger=log,
            local_limit=config.collector_hwm,
            hold_limit=config.collector_hwm,
            subject_prefix=self.stream_settings.subject_prefix,
            max_subject_bytes=max(0, stream.max_control_line - jsapi.PUBLISH_LINE_BEYOND_SUBJECT),
            max_message_bytes=min(stream.max_payload, stream.client.max_payload),
        )
        self._say_limits()
        self.snapshots = SnapshotScheduler(
            self.reactor, stream, config, lambda: self.snapshot_socket, lambda: self.core.released
        )
        self.ports.open(self._open_ports, undo=self._close_sockets)
        Service.startService(self)
        self.ports.announce(config.bind, self.endpoints.values())
        self._started_at = self.clock()
        every = self.ports.periodic.every
        if config.heartbeat_interval > 0:
            every(config.heartbeat_interval, self._heartbeat, now=True)
        if config.stats_interval > 0:
            every(config.stats_interval, self._refresh_and_report)
        self._lag_expected = self.reactor.seconds() + 0.01
        every(0.01, self._measure_lag)
        log.info(
            "event bus front-end serving snapshot {snapshot}, publisher {publisher}, "
            "collector {collector}; log: JetStream stream {stream} ({replicas} replicas, "
            "{appends}, NATS parsed {parsed}) on {servers} at sequence {sequence}",
            appends="atomic batches" if stream.atomic else "a message at a time",
            parsed="by the compiled scanner" if nats_codec.native is not None else "in Python",
            snapshot=self.endpoints["snapshot"],
            publisher=self.endpoints["publisher"],
            collector=self.endpoints["collector"],
            stream=self.stream_settings.stream,
            replicas=self.stream_settings.replicas,
            servers=", ".join(self.stream_settings.servers),
            sequence=stream.last_sequence,
        )
        return stream.follow(stream.last_sequence, self._committed)

    def _say_limits(self) -> None:
        """What the servers take, once at start; a warning where the options allow more."""
        core = self.core
        largest = largest_data(core.max_message_bytes)
        log.info(
            "NATS servers take messages of up to {max_payload} bytes (events of up to "
            "{largest} data bytes surely fit) and subjects of up to {subject} bytes",
            max_payload=core.max_message_bytes,
            largest=largest,
            subject=core.max_subject_bytes,
        )
        if self.config.max_data_bytes > largest:
            log.warn(
                "--max-event-size {size} is more than the NATS servers take: an event whose "
                "message exceeds their max_payload ({max_payload} bytes; data of up to "
                "{largest} bytes surely fits) is dropped at the collector and counted "
                "(too-large-for-stream). Lower --max-event-size, or raise max_payload in "
                "every server's configuration",
                size=self.config.max_data_bytes,
                max_payload=core.max_message_bytes,
                largest=largest,
            )

    # -- the stream's side ---------------------------------------------------------------------

    def _committed(self, rows: list[Row]) -> None:
        self.core.committed(rows)
        self._carry_out()

    def _carry_out(self) -> None:
        core = self.core
        if core.broadcasts:
            self._broadcast(core.take_broadcasts())
        batch = core.take_append()  # None while a batch is in flight or refused
        if batch is not None:
            self._append(batch)
        self._read_collector_as_core_says()

    def _append(self, batch: list[EventFields]) -> None:
        self._appending = True
        self.stream.append(batch).addCallbacks(self._appended, self._refused)

    def _appended(self, sequences: list[int]) -> None:
        self._appending = False
        core = self.core
        if self.stream.max_payload < core.max_message_bytes:
            core.max_message_bytes = self.stream.max_payload  # a server that takes less
        if core.refused:
            log.info(
                "JetStream stores again after {seconds:.1f}s; collector resumed",
                seconds=self.clock() - core.blocked_since,
            )
            self._faults.reset("append")
            self._retry_delay = self._first_retry()
        core.appended(sequences)
        self._carry_out()

    def _refused(self, failure: Failure) -> None:
        self._appending = False
        core = self.core
        if failure.check(TooLarge):
            # Nothing was sent: those events are dropped (counted), the rest goes now.
            error: TooLarge = failure.value  # type: ignore[assignment]
            core.too_large(error.indexes, error.limit)
            self._carry_out()
            return
        core.append_refused(str(failure.value))
        failures = self._faults.due("append")
        if failures is not None:
            log.error(
                "JetStream stream {stream} does not store ({error}): collector paused, "
                "{waiting} events waiting; retrying ({failures} failed attempts since the "
                "last report)",
                stream=self.stream_settings.stream,
                error=core.storage_error,
                waiting=len(core.waiting),
                failures=failures,
            )
        self._carry_out()
        if self.running:
            self._resend = self.reactor.callLater(self._retry_delay, self._send_again)
            self._retry_delay = min(self._retry_delay * 2, self.config.storage_retry_max, RETRY_MAX)

    def _first_retry(self) -> float:
        return min(self.config.storage_retry_min, RETRY_MIN)

    def _send_again(self) -> None:
        self._resend = None
        if self.core.refused and not self._appending:
            self._append(self.core.retry())

    # -- stopping ------------------------------------------------------------------------------

    def stopService(self) -> defer.Deferred[None]:
        if self._stopping is not None:
            return self._stopping
        if not self.running:
            self._stopping = self.stream.close()
            return self._stopping
        Service.stopService(self)
        self.ports.periodic.stop_all()
        self.snapshots.stop()
        self._drain_collector()
        self._flush_local()
        self._stopping = defer.Deferred()
        self._await_stored(self.reactor.seconds() + self.config.stop_timeout)
        return self._stopping

    def _drain_collector(self, limit: int = 1_000_000) -> None:
        sock = self.collector_socket
        if sock is not None and not sock.closed:
            sock.drain(limit, lambda: not self.core.collector_paused)

    def _await_stored(self, deadline: float) -> None:
        """What was collected is appended before the stop ends (or the stop timeout)."""
        core = self.core
        busy = core.pending or core.in_flight
        if busy and self.reactor.seconds() < deadline:
            if core.refused and not self._appending:
                self._append(core.retry())
            elif not self._appending:
                self._carry_out()
            self.reactor.callLater(0.01, self._await_stored, deadline)
            return
        if busy:
            log.error(
                "stopping with {count} received events not stored ({error}): they were "
                "never broadcast",
                count=len(core.pending) + len(core.in_flight),
                error=core.storage_error or "the stream did not answer in time",
            )
        if self._resend is not None and self._resend.active():
            self._resend.cancel()
        self._close_sockets()
        self.ports.close()
        last = self.core.released

        def closed(_: object) -> None:
            log.info("event bus front-end stopped at sequence {sequence}", sequence=last)
            assert self._stopping is not None
            self._stopping.callback(None)

        self.stream.close().addBoth(closed)

    # -- what it says --------------------------------------------------------------------------

    def _refresh_and_report(self) -> None:
        self.stream.refresh().addCallbacks(lambda _: self._report(), lambda _: self._report())

    def status(self) -> dict[str, Any]:
        status = super().status()
        stream, core = self.stream, self.core
        status["jetstream"] = {
            "stream": self.stream_settings.stream,
            # Given, then learnt from the cluster (no credentials: those are never shown),
            # each in the cluster now or not, in lame-duck mode or not, and our
            # connections to it.
            "servers": [server.status() for server in stream.servers_seen()],
            "authentication": self.stream_settings.credentials.kind,
            "replicas": self.stream_settings.replicas,
            "leader": stream.leader,
            # The stream's leader and followers, read every stats interval.
            "stream_cluster": cluster_status(stream.cluster),
            "consumers": [consumer.status() for consumer in stream.consumers()],
            "connected": stream.connected,
            "disconnects": stream.disconnects,
            "atomic_batches": stream.atomic,
            "messages": stream.messages,
            "bytes": stream.bytes,
            "first_sequence": stream.first_sequence,
            "lame_duck_moves": stream.lame_duck_moves,
            "max_payload": core.max_message_bytes,
            "max_subject_bytes": core.max_subject_bytes,
            "in_flight": len(core.in_flight),
            "pending": len(core.pending),
            "duplicates": core.duplicates,
            "feed_repeated": core.repeated,
            "feed_skipped": core.skipped,
            "reads_behind": stream.reads_behind,
            # What this front-end has broadcast (its feed's place) beside the stream's
            # last sequence: a feed that lags shows here.
            "broadcast": core.released,
            "last_sequence": stream.last_sequence,
        }
        status["sequence"] = max(stream.last_sequence, core.released)
        return status

    def metrics(self) -> list[Metric]:
        stream, core = self.stream, self.core
        return [
            *super().metrics(),
            *cluster_metrics(
                "eventbus", {self.stream_settings.stream: stream.cluster}, stream.servers_seen()
            ),
            gauge(
                "eventbus_jetstream_connected",
                "1 while the front-end's NATS data connections (appends, feed) are up",
                int(stream.connected),
            ),
            counter(
                "eventbus_jetstream_disconnects",
                "Times a NATS data connection was lost (each is made again, to the next server)",
                stream.disconnects,
            ),
            counter(
                "eventbus_jetstream_lame_duck_moves",
                "NATS data connections moved to another server before theirs, in lame-duck "
                "mode, closed them",
                stream.lame_duck_moves,
            ),
            counter(
                "eventbus_jetstream_duplicates",
                "Events the stream already held by their uuid (resent after a failover)",
                core.duplicates,
            ),
            counter(
                "eventbus_jetstream_reads_behind",
                "Snapshot reads that found their consumer's replica behind the stream's leader "
                "(read on, not ended short)",
                stream.reads_behind,
            ),
            counter(
                "eventbus_jetstream_feed_skipped",
                "Sequences removed by the stream's limits before this front-end read them",
                core.skipped,
            ),
        ]
