"""The eMQP broker service: worker ROUTER, client ROUTER and admin ROUTER around a
:class:`bus.emqp.core.Broker`.

Each socket's reads come in budgeted batches; the broker handles the batch, then
:meth:`EmqpService._flush` commits the job store and only then sends what the batch produced,
so a guaranteed request is on disk before a worker sees it (group commit per batch). Requests
to workers that the commit does not change (stored by an earlier one, or not guaranteed) go
before it: a worker's slot does not wait for a commit that forgets the job it answered.
A worker the broker cannot send to (gone: ROUTER_MANDATORY; or its pipe full) is forgotten
and its requests re-dispatched or failed; a client that cannot be sent to is counted.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import zmq
from twisted.application.service import Service
from twisted.internet import defer
from twisted.internet.base import DelayedCall
from twisted.internet.task import LoopingCall
from twisted.logger import Logger
from twisted.python.failure import Failure

from bus.emqp.config import EmqpConfig
from bus.emqp.core import EVERY_QUEUE, Broker, Queues
from bus.extension import NO_ACTIVITY, ActivitySink
from bus.util.droplog import RateLimit

if TYPE_CHECKING:
    from bus.emqp.jetstream import JetStreamJobs
from bus.application.contract import Action, ActionRefused
from bus.application.statusjson import config_json
from bus.emqp.store import BROKER_ID_FILE, JobStore, kept_broker_id
from bus.extension import (
    Metric,
    SocketFactory,
    SocketOptions,
    StartupError,
    StorageError,
    ZmqSocket,
    counter,
    counters_by,
    gauge,
    gauges_by,
    reactor_of,
)
from bus.nats.seen import cluster_metrics
from bus.transport.curve import role_policy
from bus.transport.outbox import PeerOutboxes
from bus.transport.security import ServerCurve
from bus.transport.serving import ServerPorts
from bus.transport.zmqsocket import bind_failure
from bus.util.files import status_json_text, write_status_text
from bus.util.memory import MemoryRelease
from bus.util.metrics import wal_metrics
from bus.util.workers import NewestWins, SerialWork

log = Logger(namespace="bus.emqp")

#: Clients with answers waiting for them at most.
_MAX_HELD_CLIENTS = 10_000
#: Retries of a refused commit: after this many seconds, doubling up to the maximum.
_STORAGE_RETRY_MIN = 0.25
_STORAGE_RETRY_MAX = 2.0
#: Clients that left free their ZeroMQ pipes: memory is handed back this much later.
_MEMORY_RELEASE_DELAY = 1.0


#: The ports a key may connect to, by the ``role`` of its certificate (comma-separated).
#: The HELP of each broker counter (:meth:`bus.emqp.core.Broker.counters`) in /metrics.
_COUNTER_HELP = {
    "requests": "Requests received from clients",
    "dispatched": "Requests sent to a worker (a retried request counts again)",
    "replied": "Requests a worker replied to",
    "forwarded_replies": "Replies sent on to the clients that asked for one",
    "retried": "Requests sent again after their worker was lost or timed out",
    "failed": "Requests given up on (retries exhausted), answered with an error",
    "rejected": "Requests and schedules refused at once (queue full, forbidden, no scheduler)",
    "timed_out": "Dispatched requests whose worker did not reply in time",
    "late_replies": "Replies that came after the broker had given up on their request",
    "late_heartbeats_held": "Heartbeat rounds that came late (the broker did not run) and forgot no one",
    "late_timeout_checks_held": "Looks at the requests' timeouts that came late (the broker did not run) and gave up on none",
    "workers_joined": "Workers that said READY",
    "workers_lost": "Workers forgotten without their own DISCONNECT (silent past their heartbeats)",
    "schedules_forwarded": "SCHEDULE and UNSCHEDULE commands forwarded to schedulers",
    "schedules_added": "Schedules added to the broker's own scheduler",
    "schedules_removed": "Schedules removed from the broker's own scheduler",
    "schedules_fired": "Requests the broker's own schedules fired",
    "schedule_runs_missed": "Schedule runs the stream delivered past their time (a later run fired, or the next due within half an interval), acknowledged without running",
    "restored": "Stored (guarantee) requests restored from the job store at start",
    "refused_unstored": "Guaranteed requests and schedule changes refused because the job store could not take them",
}

#: The ports a key may connect to, by the ``role`` of its certificate (comma-separated).
_role_policy = role_policy(
    {"emqp-worker": "worker", "emqp-client": "client", "emqp-admin": "admin"}
)


def _named(params: Mapping[str, Any], key: str) -> bytes:
    """The name an action's ``key`` gives (a queue, a schedule, a worker)."""
    value = params.get(key)
    if not isinstance(value, str) or not value or len(value) > 255:
        raise ActionRefused(400, f"{key}: a name of 1 to 255 characters")
    return value.encode("utf-8")


def _text(name: bytes) -> str:
    return name.decode("utf-8", "replace")


def _queues(metadata: Mapping[str, str]) -> Queues:
    names = metadata.get("queues")
    if names is None:
        return EVERY_QUEUE
    return frozenset(part.strip().encode("utf-8") for part in names.split(",") if part.strip())


class EmqpService(Service):
    """The eMQP broker: its three ROUTERs, the :class:`bus.emqp.core.Broker` between them, and the
    store of guaranteed requests (SQLite, or a JetStream stream), committed before anything a batch
    produced is sent."""

    name = "emqp"

    def __init__(
        self,
        config: EmqpConfig,
        activity: ActivitySink = NO_ACTIVITY,
        reactor: Any = None,
    ) -> None:
        self.config = config
        self.reactor: Any = reactor_of(reactor)
        self.activity = activity
        self.store: JobStore | None = None
        self.broker: Broker | None = None
        #: Guaranteed requests in JetStream (``--store jetstream``), else None.
        self.stream: JetStreamJobs | None = None
        self._flush_call: DelayedCall | None = None
        self.endpoints: dict[str, str] = {}
        self.worker_socket: ZmqSocket | None = None
        self.client_socket: ZmqSocket | None = None
        self.admin_socket: ZmqSocket | None = None
        self._faults = RateLimit(self.reactor.seconds)
        self._stopping: defer.Deferred[None] | None = None
        self._started_at = 0.0
        self._heartbeat_due = 0.0
        self._memory = MemoryRelease(self.reactor, _MEMORY_RELEASE_DELAY)
        #: Answers to clients (and admins) that ZeroMQ would not take yet, bounded per client.
        self.answers = PeerOutboxes(
            self.reactor,
            log,
            linger=config.reply_linger,
            max_bytes=config.client_queue_bytes,
            max_messages=config.client_queue_messages,
            max_peers=_MAX_HELD_CLIENTS,
            memory=self._memory,
        )
        self._checkpoints = SerialWork(self.reactor, "emqp-checkpoint", self._checkpoint_failed)
        #: status.json's rewrites, off the reactor (the rename over the old file may wait on
        #: the disk for milliseconds).
        self._status_file = NewestWins(self.reactor, "emqp-status", self._status_failed)
        #: The settings as status shows them, and the config they were made of (made again
        #: only when a reload changes it).
        self._config_json: tuple[EmqpConfig, dict[str, Any]] | None = None
        #: How late the latest heartbeat rounds went out, at most (timer lag under load).
        self.max_heartbeat_lag = 0.0
        self.worker_send_failures = 0
        self.storage_errors = 0
        self.storage_error: str | None = None
        #: Since when guaranteed requests wait for a store that refuses them (None: not).
        self._storage_blocked_since: float | None = None
        #: The sockets not read while the store refuses (see :meth:`_storage_blocked`).
        self._paused: list[ZmqSocket] = []
        self._storage_retry: DelayedCall | None = None
        self._schedule_timer: DelayedCall | None = None
        self._heartbeat_loop: LoopingCall | None = None
        self._stats_loop: LoopingCall | None = None
        self._storage_delay = _STORAGE_RETRY_MIN
        #: CURVE on the three ports; with an allow-list, a key's ``role`` says which ports
        #: it may connect to and its ``queues`` which queues it may serve or use.
        self.curve = ServerCurve("emqp", config.curve, self.reactor.seconds, policy=_role_policy)
        self.ports = ServerPorts(self.reactor, self.curve, log)
        #: Whether messages are checked against their key's queues: only while some
        #: certificate of the allow-list names ``queues`` (reading each message's User-Id
        #: and looking its rights up costs about a tenth of the broker's rate over CURVE).
        self._rights = False
        self.curve.on_reload.append(self._rights_changed)

    # -- lifecycle -------------------------------------------------------------------------------

    def startService(self) -> defer.Deferred[None] | None:
        config = self.config
        try:
            self.store = JobStore(config.data_dir, config.durability)
        except StorageError as error:
            raise StartupError("data-dir", f"cannot open the job store: {error}") from None
        streamed = config.jetstream is not None
        broker_id = self._broker_id() if streamed else b""
        broker = Broker(
            config.broker,
            self.reactor.seconds,
            log,
            self.store,
            self.activity,
            broker_id=broker_id,
            streamed=streamed,
        )
        self.broker = broker
        if config.jetstream is not None:
            from bus.emqp.jetstream import JetStreamJobs

            self.stream = JetStreamJobs(
                self.reactor,
                config.jetstream,
                broker_id,
                on_job=self._soon(broker.on_stream_job),
                on_answer=self._soon(broker.on_forwarded),
                on_appended=self._soon(broker.stream_appended),
                on_change=self._stream_changed,
                held=broker.held_handles,
                on_schedule=self._schedules_told(broker.on_schedule_change),
                on_schedule_kept=self._soon(broker.schedule_kept),
                on_schedule_put=self._schedules_told(broker.schedule_put_answered),
                on_schedule_run=self._schedules_told(broker.schedule_run_answered),
                on_offered=self._offered,
                on_forwarded=self._forwarded,
                on_too_large=self._soon(broker.stream_too_large),
            )
        self.ports.open(self._bind_all, undo=self._undo_start)
        Service.startService(self)
        self.ports.announce(config.bind, self.endpoints.values())
        self._started_at = self.reactor.seconds()
        paused = broker.restore_paused()  # before anything is dispatched
        restored = broker.restore()
        schedules = broker.restore_schedules()
        interval = config.broker.heartbeat_interval
        self._heartbeat_due = self.reactor.seconds() + interval
        every = self.ports.periodic.every
        self._heartbeat_loop = every(interval, self._heartbeat)
        broker.expiry_wakes.period = config.timeout_check
        every(config.timeout_check, self._expire)
        self._checkpoints.start()
        every(config.checkpoint_interval, self._checkpoint)
        if config.stats_interval > 0:
            self._stats_loop = every(config.stats_interval, self._report)
        self._status_file.start()
        self._write_status(now=True)  # there once the service has started
        if paused:
            log.warn(
                "queues paused by an operator before the restart stay paused until resumed: "
                "{queues}",
                queues=", ".join(_text(name) for name in sorted(paused)),
            )
        log.info(
            "eMQP broker serving workers {worker}, clients {client}, admin {admin}; job store "
            "{path} ({restored} guaranteed requests restored); scheduler {scheduler} "
            "({schedules} schedules)",
            worker=self.endpoints["worker"],
            client=self.endpoints["client"],
            admin=self.endpoints["admin"],
            path=str(self.store.path),
            restored=restored,
            scheduler=config.broker.scheduler,
            schedules=schedules,
        )
        self._arm_schedules()
        if self.stream is not None:
            return self._open_stream(self.stream)
        return None

    def _broker_id(self) -> bytes:
        """This broker's name among the brokers of a stream: given, or made once and kept
        in the data directory (a broker that restarts gets its clients' answers still)."""
        assert self.config.jetstream is not None
        if self.config.jetstream.broker_id:
            return self.config.jetstream.broker_id.encode()
        try:
            return kept_broker_id(self.config.data_dir)
        except OSError as error:
            path = Path(self.config.data_dir) / BROKER_ID_FILE
            raise StartupError("data-dir", f"cannot keep {path}: {error}") from None

    def _open_stream(self, stream: JetStreamJobs) -> defer.Deferred[None]:
        def opened(_: object) -> None:
            assert self.config.jetstream is not None
            log.info(
                "eMQP broker {broker} keeps guaranteed requests in JetStream stream {stream} "
                "({servers})",
                broker=stream.broker_id.decode(),
                stream=self.config.jetstream.stream,
                servers=", ".join(self.config.jetstream.servers),
            )
            if self.config.max_message_size >= stream.client.max_payload:
                log.warn(
                    "--max-message-size {size} is more than the NATS servers take "
                    "({max_payload} bytes a message): a guaranteed request whose message "
                    "exceeds it is refused to its client (too-large-for-stream). Lower "
                    "--max-message-size, or raise max_payload in every server's configuration",
                    size=self.config.max_message_size,
                    max_payload=stream.client.max_payload,
                )
            self._flush_soon()

        opening: defer.Deferred[None] = stream.open()
        return opening.addCallback(opened)

    # -- the stream (--store jetstream) --------------------------------------------------------

    def _soon(self, handle: Callable[..., None]) -> Callable[..., None]:
        """``handle``, then what it produced sent at the end of this reactor turn (one
        flush for all the stream's messages that one read brought)."""

        def handled(*args: Any) -> None:
            handle(*args)
            self._flush_soon()

        return handled

    def _flush_soon(self) -> None:
        if self._flush_call is None and self.running:
            self._flush_call = self.reactor.callLater(0, self._flush_now)

    def _flush_now(self) -> None:
        self._flush_call = None
        self._flush()

    def _schedules_told(self, handle: Callable[..., None]) -> Callable[..., None]:
        """``handle`` (the bucket or the stream told of a schedule), then its timer armed
        again and what it produced sent at the end of this reactor turn."""

        def handled(*args: Any) -> None:
            handle(*args)
            self._arm_schedules()
            self._flush_soon()

        return handled

    def _offered(self, stored: Any) -> bool:
        assert self.broker is not None
        taken = self.broker.on_offered(stored)
        if taken:
            self._flush_soon()
        return taken

    def _forwarded(self, msgid: bytes, taken: bool) -> None:
        assert self.broker is not None
        if taken:
            self.broker.forward_taken(msgid)
        else:
            self.broker.forward_refused(msgid)
        self._flush_soon()

    def _stream_changed(self) -> None:
        """The stream took requests, delivered some, refused or took appends again, or its
        connection changed: pause or resume the client port, and go on soon."""
        stream = self.stream
        if stream is None or not self.running:
            return
        if stream.refusing:
            self.storage_error = stream.refusal
            self._storage_blocked()
        elif (
            not stream.refusing
            and self._storage_blocked_since is not None
            and not (self.store is not None and self.store.dirty)
        ):
            self.storage_error = None
            self._storage_unblocked()
        self._flush_soon()

    def reconfigure(self, config: EmqpConfig) -> None:
        """Serve on with ``config`` (a SIGHUP's): the broker's limits, retries, heartbeats
        and schedules, the answers' bounds, the stats period and the CURVE allow-list take
        their new values now. The caller keeps the rest (ports, store, sockets' options)
        as they were: those change at the next start."""
        old, self.config = self.config, config
        if self.broker is not None:
            self.broker.reconfigure(config.broker)
        answers = self.answers
        answers.linger = config.reply_linger
        answers.max_bytes = config.client_queue_bytes
        answers.max_messages = config.client_queue_messages
        if not self.running:
            return
        every = self.ports.periodic.every
        interval = config.broker.heartbeat_interval
        if interval != old.broker.heartbeat_interval and self._heartbeat_loop is not None:
            self._heartbeat_loop.stop()
            self._heartbeat_due = self.reactor.seconds() + interval
            self._heartbeat_loop = every(interval, self._heartbeat)
        if config.stats_interval != old.stats_interval:
            if self._stats_loop is not None and self._stats_loop.running:
                self._stats_loop.stop()
            self._stats_loop = None
            if config.stats_interval > 0:
                self._stats_loop = every(config.stats_interval, self._report)
        if config.curve.client_certs != old.curve.client_certs:
            self.curve.change_client_certs(config.curve.client_certs, self.ports.periodic)
        self._write_status()

    def reread_client_certs(self) -> None:
        """Read the CURVE allow-list again now if it changed (it is also every 2 s)."""
        self.curve.reread()

    def _undo_start(self) -> None:
        if self.stream is not None:
            self.stream.close()
        self._close_sockets()
        assert self.store is not None
        self.store.close()

    def _bind_all(self, factory: SocketFactory) -> None:
        self._rights = self.curve.uses("queues")
        config = self.config
        options = SocketOptions(
            send_hwm=config.hwm,
            receive_hwm=config.hwm,
            router_mandatory=True,
            tcp_keepalive_idle=config.tcp_keepalive_idle,
            max_message_size=config.max_message_size,
            linger_ms=200,  # time for the KBYEs of a stop to leave
            peer_user_ids=self._rights,
        )
        # What libzmq queues per client is bounded by count only: kept small, so that the
        # byte bound of the answers' outboxes is what a client that does not read costs.
        answering = replace(options, send_hwm=config.client_hwm)
        budget = config.read_budget
        self.worker_socket = factory.socket(
            zmq.ROUTER, self._on_workers, options, read_budget=budget, name="emqp-workers"
        )
        self.client_socket = factory.socket(
            zmq.ROUTER, self._on_clients, answering, read_budget=budget, name="emqp-clients"
        )
        self.admin_socket = factory.socket(
            zmq.ROUTER, self._on_admin, answering, read_budget=budget, name="emqp-admin"
        )
        for sock in (self.client_socket, self.admin_socket):
            sock.on_signal = lambda sock=sock: self.answers.signalled(sock)
        for name, sock, port in (
            ("worker", self.worker_socket, config.worker_port),
            ("client", self.client_socket, config.client_port),
            ("admin", self.admin_socket, config.admin_port),
        ):
            address = f"tcp://{config.bind}:{port or '*'}"
            self.curve.secure(sock, f"emqp-{name}")
            try:
                self.endpoints[name] = sock.bind(address)
            except zmq.ZMQError as error:
                raise bind_failure(error, f"{name}-port", address) from None
            sock.watch_connections(on_event=self._connection_event)

    def _connection_event(self, event: int) -> None:
        # A peer that left frees its pipe (in libzmq's I/O thread): hand the memory back.
        if event & zmq.EVENT_DISCONNECTED:
            self._memory.soon()

    def _close_sockets(self) -> None:
        for sock in (self.worker_socket, self.client_socket, self.admin_socket):
            if sock is not None:
                sock.shutdown()
        self.worker_socket = self.client_socket = self.admin_socket = None

    def stopService(self) -> defer.Deferred[None]:
        if self._stopping is not None:
            return self._stopping
        self._stopping = defer.succeed(None)
        if not self.running:
            return self._stopping
        Service.stopService(self)
        self.ports.periodic.stop_all()
        for timer in (self._storage_retry, self._schedule_timer, self._flush_call):
            if timer is not None and timer.active():
                timer.cancel()
        if self.broker is not None:
            for sock in (self.worker_socket, self.client_socket, self.admin_socket):
                if sock is not None:  # what has arrived is handled (and stored) first
                    sock.doRead()
            self.broker.shutdown()
            self._flush()
            if self.broker.awaiting_commit:
                # The store still refuses them: their clients hear so, rather than nothing.
                self.broker.refuse_unstored(
                    "storage-error", "the broker stopped while its job store could not write"
                )
                self._flush()
        self.answers.stop()
        self._memory.stop()
        self._close_sockets()
        self.ports.close()
        if self.stream is not None:
            self.stream.close()
        # The store closes once a checkpoint running in its thread is done, and the last
        # status.json is written once the one being written is.
        self._stopping = defer.Deferred()
        self._checkpoints.idle().addBoth(lambda _: self._status_file.idle()).addBoth(
            lambda _: self._close_store()
        )
        return self._stopping

    def _close_store(self) -> None:
        assert self._stopping is not None
        self._checkpoints.stop()
        self._status_file.stop()
        if self.store is not None:
            try:
                self.store.close()
            except StorageError as error:
                log.error("job store closed with unsaved changes: {error}", error=str(error))
        self._write_status(now=True)
        log.info("eMQP broker stopped")
        self._stopping.callback(None)

    # -- reading -----------------------------------------------------------------------------------

    def _on_workers(self, batch: list[list[bytes]]) -> None:
        broker = self.broker
        assert broker is not None
        if self._rights:
            self._handle_with_rights(broker.on_worker_message, batch, self.worker_socket)
        else:
            broker.on_worker_messages(batch)
        self._flush()

    def _on_clients(self, batch: list[list[bytes]]) -> None:
        broker = self.broker
        assert broker is not None
        if self._rights:
            self._handle_with_rights(broker.on_client_message, batch, self.client_socket)
        else:
            broker.on_client_messages(batch)
        self._flush()
        if broker.schedules is not None:  # a SCHEDULE may have come
            self._arm_schedules()

    def _on_admin(self, batch: list[list[bytes]]) -> None:
        assert self.broker is not None
        self._handle_with_rights(self.broker.on_admin_message, batch, self.admin_socket)
        self._flush()
        self._arm_schedules()

    def _rights_changed(self) -> None:
        """The allow-list was re-read: check messages against queues if a certificate
        names some now. Between two reactor turns: no batch is half handled."""
        self._rights = self.curve.uses("queues")
        for sock in (self.worker_socket, self.client_socket, self.admin_socket):
            if sock is not None:
                sock.keep_user_ids = self._rights

    def _handle_with_rights(
        self,
        handle: Callable[[bytes, list[bytes], Queues], None],
        batch: list[list[bytes]],
        sock: ZmqSocket | None,
    ) -> None:
        """Each message with the queues its sender's key may use (all without rights)."""
        user_ids = sock.peer_user_ids if sock is not None else []
        for index, frames in enumerate(batch):
            user_id = user_ids[index] if index < len(user_ids) else ""
            handle(frames[0], frames[1:], self.curve.rights(user_id, _queues))

    # -- schedules ---------------------------------------------------------------------------------

    def _arm_schedules(self) -> None:
        """One timer, at the earliest schedule's time."""
        broker = self.broker
        due = broker.next_schedule_due if broker is not None and self.running else None
        timer = self._schedule_timer
        if timer is not None and timer.active():
            if due is not None and timer.getTime() <= due:
                return
            timer.cancel()
        self._schedule_timer = None
        if due is not None:
            delay = max(0.0, due - self.reactor.seconds())
            self._schedule_timer = self.reactor.callLater(delay, self._fire_schedules)

    def _fire_schedules(self) -> None:
        self._schedule_timer = None
        assert self.broker is not None
        self.broker.fire_schedules()
        self._flush()
        self._arm_schedules()

    # -- writing -----------------------------------------------------------------------------------

    def _commit(self) -> bool:
        """Commit what the batch changed. False while the store refuses: the changes stay
        pending and are written by the next commit that succeeds."""
        store = self.store
        if store is None or not store.dirty:
            return True
        try:
            store.commit()
        except StorageError as error:
            self.storage_errors += 1
            self.storage_error = str(error)
            failures = self._faults.due("commit")
            if failures is not None:
                broker = self.broker
                held = len(broker.unstored) if broker is not None else 0
                answers = len(broker.unstored_answers) if broker is not None else 0
                log.error(
                    "job store refused a commit ({error}; {failures} since the last report): "
                    "{held} guaranteed requests and {answers} schedule changes held "
                    "unanswered, {ports} not read until it writes; retrying",
                    error=str(error),
                    failures=failures,
                    held=held,
                    answers=answers,
                    ports=" and ".join(f"{p} port" for p in self._ports_to_pause()) or "no port",
                )
            return False
        if self.storage_error is not None:
            self._faults.reset("commit")
            self.storage_error = None
        return True

    def _flush(self) -> None:
        """Commit the store, route the guaranteed requests it took, then send everything
        the broker produced (requests to workers that the commit does not change go before
        it: :meth:`_send_ahead_of_commit`). A guaranteed request is acknowledged or
        dispatched only once its commit succeeded; while the store refuses, they wait
        (:meth:`_storage_blocked`)."""
        broker = self.broker
        if broker is None:
            return
        store = self.store
        if broker.to_workers and store is not None and store.changing_requests_only:
            self._send_ahead_of_commit(store)
        while True:
            stored = self._commit()
            if stored:
                if broker.awaiting_commit:
                    broker.release_stored()
                if self._storage_blocked_since is not None and not (
                    self.stream is not None and self.stream.refusing
                ):
                    self._storage_unblocked()
            elif broker.awaiting_commit:
                self._storage_blocked()
            if broker.to_stream or broker.to_brokers:
                commands, broker.to_stream = broker.to_stream, []
                answers, broker.to_brokers = broker.to_brokers, []
                if self.stream is not None:
                    self.stream.carry_out(commands, answers, broker.streamed_job)
            if not (broker.to_workers or broker.to_clients or broker.to_admin):
                break
            if broker.to_workers:
                messages, broker.to_workers = broker.to_workers, []
                self._send_to_workers(messages)
            # Answers to a client not connected (yet: its socket reconnects after a broker
            # restart) or not reading wait in its outbox, in order and bounded.
            if broker.to_clients:
                messages, broker.to_clients = broker.to_clients, []
                self.answers.send(self.client_socket, messages)
            if broker.to_admin:
                messages, broker.to_admin = broker.to_admin, []
                self.answers.send(self.admin_socket, messages)
        if self.stream is not None and self.running:
            self.stream.pull(broker.wanted())
            self.stream.serve(broker.served_queues())

    def _send_ahead_of_commit(self, store: JobStore) -> None:
        """Send, before the commit, the messages to workers that depend on nothing it
        writes: in a worker's batch of REPLY and READY, the next requests (stored by earlier
        commits) would otherwise wait for the commit that forgets the replied ones, and a
        worker's slot with them (guaranteed jobs/s follow that round trip: bench/README.md).
        They go in order up to the first request whose row the commit changes (a retry's
        count): it and all after it wait, as everything did before. Called only while the
        commit changes requests alone: a schedule's run waits for its schedule's new row (a
        run sent before it, then a crash, would fire again), a queue resumed for its row."""
        broker = self.broker
        assert broker is not None
        messages = broker.to_workers
        changed = store.changing
        free = 0
        for frames in messages:
            # A REQUEST's msgid is its fifth frame; another command's is a new one.
            if len(frames) > 4 and frames[4] in changed:
                break
            free += 1
        if free:
            broker.to_workers = messages[free:]
            self._send_to_workers(messages[:free])

    def _send_to_workers(self, messages: list[list[bytes]]) -> None:
        """Send to workers; a worker that cannot be sent to is forgotten (its jobs retried)."""
        lost = {frames[0] for frames in self._send_each(self.worker_socket, messages)}
        if lost:
            broker = self.broker
            assert broker is not None
            self.worker_send_failures += len(lost)
            for identity in lost:
                broker.worker_unreachable(identity)

    def _ports_to_pause(self) -> list[str]:
        """While the store refuses: the client port, and the admin port once an admin's
        schedule change waits (it goes on answering STATUS until then)."""
        broker = self.broker
        ports = ["client"]
        if broker is not None and any(h.outbox is broker.to_admin for h in broker.unstored_answers):
            ports.append("admin")
        return ports

    def _paused_sockets(self) -> list[ZmqSocket]:
        named = {"client": self.client_socket, "admin": self.admin_socket}
        return [s for p in self._ports_to_pause() if (s := named[p]) is not None]

    def _storage_blocked(self) -> None:
        """The store refused guaranteed requests or schedule changes: they wait, unanswered,
        and the ports they came from are not read (peers feel ZeroMQ's backpressure) until a
        retry stores them."""
        if self._storage_blocked_since is None:
            self._storage_blocked_since = self.reactor.seconds()
        for sock in self._paused_sockets():
            if sock not in self._paused:
                sock.pause_reading()
                self._paused.append(sock)
        if self.running and (self._storage_retry is None or not self._storage_retry.active()):
            self._storage_retry = self.reactor.callLater(self._storage_delay, self._flush)
            self._storage_delay = min(self._storage_delay * 2, _STORAGE_RETRY_MAX)

    def _storage_unblocked(self) -> None:
        assert self._storage_blocked_since is not None
        log.info(
            "job store writes again after {seconds:.1f}s: held guaranteed requests routed, "
            "schedule changes answered, ports read again",
            seconds=self.reactor.seconds() - self._storage_blocked_since,
        )
        self._storage_blocked_since = None
        self._storage_delay = _STORAGE_RETRY_MIN
        paused, self._paused = self._paused, []
        for sock in paused:
            sock.resume_reading()

    @staticmethod
    def _send_each(sock: ZmqSocket | None, messages: list[list[bytes]]) -> list[list[bytes]]:
        """Send each message to a worker; those that could not be sent (the peer is gone,
        or its pipe is full: a ROUTER refuses at the identity frame, so nothing went out)."""
        if sock is None or sock.closed:
            return messages
        unsent = []
        # The whole batch in one call (the transport's compiled helper, where a frame costs
        # a call through pyzmq); past a refused message, the rest in another.
        rest = messages
        while rest:
            sent, error = sock.send_each(rest)
            if not error:
                break
            unsent.append(rest[sent])
            rest = rest[sent + 1 :]
        return unsent

    # -- timers ------------------------------------------------------------------------------------

    def _heartbeat(self) -> None:
        assert self.broker is not None
        now = self.reactor.seconds()
        self.max_heartbeat_lag = max(self.max_heartbeat_lag, now - self._heartbeat_due)
        self._heartbeat_due = now + self.config.broker.heartbeat_interval
        self.broker.heartbeat()
        self._flush()

    def _checkpoint(self) -> None:
        """Move the WAL into the database on a worker thread (SQLite releases the GIL)."""
        if self.store is not None:
            self._checkpoints.run(self.store.checkpoint)

    def _checkpoint_failed(self, failure: Failure) -> None:
        self.storage_errors += 1
        if self._faults.due("checkpoint") is not None:
            log.error("job store checkpoint failed: {error}", error=str(failure.value))

    def _expire(self) -> None:
        broker = self.broker
        assert broker is not None
        if broker.check_timeouts():
            self._flush()

    # -- status ------------------------------------------------------------------------------------

    def connections(self) -> dict[str, int]:
        """Peers connected to each port, by port."""
        sockets = (
            ("worker", self.worker_socket),
            ("client", self.client_socket),
            ("admin", self.admin_socket),
        )
        return {name: sock.connections for name, sock in sockets if sock is not None}

    #: The console's charts (see :mod:`bus.web.console.view`).
    console_rates = {"jobs": "counters.replied", "requests": "counters.requests"}

    # -- an operator's actions (see bus.web.actions) -----------------------------------------------

    def actions(self) -> Mapping[str, Action]:
        """Purge, pause and resume a queue, remove a schedule, forget a worker."""
        return {
            "purge": self._purge,
            "pause": self._pause,
            "resume": self._resume,
            "remove-schedule": self._remove_schedule,
            "forget-worker": self._forget_worker,
        }

    def _acting(self) -> Broker:
        if self.broker is None or not self.running:
            raise ActionRefused(409, "the eMQP broker is not running")
        return self.broker

    def _purge(self, params: Mapping[str, Any]) -> Any:
        broker, queue = self._acting(), _named(params, "queue")
        here = broker.purge(queue)
        self._flush()  # removed from the store before the answer says so
        answer = {"queue": _text(queue), "purged": here}
        if self.stream is None:
            return answer

        from bus.emqp import stream_purge

        def streamed(result: stream_purge.Purged) -> dict[str, Any]:
            if self.broker is not None:
                self.broker.tell_purged(result.untold)
                self._flush()
            return {**answer, **stream_purge.described(result)}

        return self.stream.purge(queue).addCallback(streamed)

    def _pause(self, params: Mapping[str, Any]) -> dict[str, Any]:
        broker, queue = self._acting(), _named(params, "queue")
        changed = broker.pause(queue)
        self._flush()
        return {"queue": _text(queue), "paused": True, "changed": changed}

    def _resume(self, params: Mapping[str, Any]) -> dict[str, Any]:
        broker, queue = self._acting(), _named(params, "queue")
        changed = broker.resume(queue)
        self._flush()
        return {"queue": _text(queue), "paused": False, "changed": changed}

    def _remove_schedule(self, params: Mapping[str, Any]) -> dict[str, Any]:
        broker = self._acting()
        schedule = _named(params, "schedule").decode("utf-8")
        if broker.schedules is None:
            raise ActionRefused(409, "schedules are kept by an external scheduler here")
        if not broker.remove_schedule(schedule):
            raise ActionRefused(404, f"no schedule {schedule!r}")
        self._flush()
        self._arm_schedules()
        return {"schedule": schedule, "removed": True}

    def _forget_worker(self, params: Mapping[str, Any]) -> dict[str, Any]:
        broker = self._acting()
        name = _named(params, "worker").decode("utf-8")
        identity = broker.worker_named(name)
        if identity is None:
            raise ActionRefused(404, f"no worker {name!r}")
        in_flight = len(broker.workers[identity].inflight)
        broker.forget(identity)
        self._flush()
        return {"worker": name, "forgotten": True, "in_flight": in_flight}

    def status(self) -> dict[str, Any]:
        """The broker's state and the service's (ports, store, paused ports, held answers), for
        ``/status`` and ``status.json``."""
        broker = self.broker
        described: dict[str, Any] = {
            "endpoints": self.endpoints,
            "uptime_s": round(self.reactor.seconds() - self._started_at, 3),
            "connections": self.connections(),
            "stored": self.store.count() if self.store is not None and self.running else None,
            "storage_errors": self.storage_errors,
            "storage_error": self.storage_error,
            "client_port_paused": self._storage_blocked_since is not None,
            "held_unstored": len(broker.unstored) if broker is not None else 0,
            "held_schedule_answers": len(broker.unstored_answers) if broker is not None else 0,
            "admin_port_paused": self.admin_socket is not None
            and self.admin_socket in self._paused,
            "client_send_failures": sum(self.answers.dropped.values()),
            "answers_held": self.answers.held_messages,
            "answers_held_bytes": self.answers.held_bytes,
            "answers_dropped": dict(self.answers.dropped),
            # Free memory handed back to the system (malloc_trim) and whether one is due.
            "memory_releases": self._memory.releases,
            "memory_release_pending": self._memory.pending,
            "worker_send_failures": self.worker_send_failures,
            "max_heartbeat_lag_ms": round(self.max_heartbeat_lag * 1000, 3),
            "curve": self.curve.status(),
            "jetstream": self.stream.status() if self.stream is not None else None,
            "config": self._settings_json(),
        }
        if self.store is not None:
            described.update(self.store.wal_status().as_status())
        if broker is not None:
            summary = broker.status(in_flight_limit=100)
            described.update(summary)
            described["dropped"] = dict(broker.drops.counts)
        return described

    def metrics(self) -> list[Metric]:
        """The broker's counters and gauges, the store's and CURVE's, for ``/metrics``."""
        broker = self.broker
        if broker is None:
            return []
        counters = broker.counters()
        families = self.curve.metrics()
        if self.store is not None:
            families += wal_metrics("emqp", self.store.wal_status())
        families += [
            counter(f"emqp_{name}", _COUNTER_HELP.get(name, f"eMQP broker: {name}"), value)
            for name, value in counters.items()
            if name != "dropped"
        ]
        families += [
            counters_by(
                "emqp_messages_dropped",
                "Bad messages dropped, by reason",
                "reason",
                broker.drops.counts,
            ),
            gauges_by(
                "emqp_queue_depth",
                "Requests waiting for a worker, by queue",
                "queue",
                {n.decode("utf-8", "replace"): len(q.waiting) for n, q in broker.queues.items()},
            ),
            gauges_by(
                "emqp_queue_workers",
                "Workers serving each queue (a queue with requests waiting and none is stuck)",
                "queue",
                {n.decode("utf-8", "replace"): len(q.workers) for n, q in broker.queues.items()},
            ),
            gauge("emqp_workers", "Workers connected", len(broker.workers)),
            gauge(
                "emqp_schedules",
                "Schedules the broker keeps and fires",
                len(broker.schedules) if broker.schedules is not None else 0,
            ),
            gauge(
                "emqp_requests_open",
                "Requests accepted and not yet answered (waiting or dispatched)",
                len(broker.jobs),
            ),
            gauge(
                "emqp_in_flight",
                "Requests dispatched and not yet replied",
                sum(len(w.inflight) for w in broker.workers.values()),
            ),
            counter("emqp_storage_errors", "Job store commits refused", self.storage_errors),
            *self._stream_metrics(),
            gauge(
                "emqp_client_port_paused",
                "1 while guaranteed requests or schedule changes wait for the job store (client port not read)",
                float(self._storage_blocked_since is not None),
            ),
            counter(
                "emqp_client_send_failures",
                "Replies a client could not be sent",
                sum(self.answers.dropped.values()),
            ),
            counters_by(
                "emqp_answers_dropped",
                "Answers to clients dropped, by reason",
                "reason",
                self.answers.dropped,
            ),
            gauge(
                "emqp_answers_held_bytes",
                "Bytes of answers waiting for their clients",
                self.answers.held_bytes,
            ),
        ]
        return families

    def _stream_metrics(self) -> list[Metric]:
        """The JetStream store's (``--store jetstream``), none with SQLite."""
        stream = self.stream
        if stream is None:
            return []
        gate = self.broker.schedule_gate if self.broker is not None else None
        return [
            gauge(
                "emqp_jetstream_connected",
                "1 while the broker is connected to a NATS server of its cluster",
                float(stream.connected),
            ),
            gauge(
                "emqp_jetstream_refusing",
                "1 while JetStream does not store guaranteed requests (client port paused)",
                float(stream.refusing),
            ),
            counter(
                "emqp_jetstream_disconnects",
                "Connections to NATS servers lost",
                stream.client.disconnects,
            ),
            counter("emqp_jetstream_pulled", "Requests the stream delivered here", stream.pulled),
            counter(
                "emqp_jetstream_redelivered",
                "Requests given back to the stream (their queue's workers left)",
                stream.naks,
            ),
            gauge(
                "emqp_jetstream_appending",
                "Guaranteed requests sent to the stream and not yet acknowledged",
                len(stream.appending),
            ),
            counter(
                "emqp_jetstream_pulls_lapsed",
                "Pulls past their expiry that the server never ended (a consumer leader "
                "changed), asked again",
                stream.pulls_lapsed,
            ),
            counter(
                "emqp_jetstream_consumers_lost",
                "Queue consumers found gone (deleted, or none answering), made again",
                stream.consumers_lost,
            ),
            counter(
                "emqp_jetstream_schedule_runs_raced",
                "Schedule runs another broker stored at the same moment (stored once)",
                stream.schedule_runs_raced,
            ),
            counter(
                "emqp_jetstream_schedule_runs_refused",
                "Appends of schedule runs the stream refused or did not answer (tried again)",
                stream.schedule_runs_refused,
            ),
            gauge(
                "emqp_jetstream_schedule_runs_unstored",
                "Schedule runs fired and not yet stored in the stream (at most one a schedule)",
                gate.unstored if gate is not None else 0,
            ),
            *self._queue_stream_metrics(stream),
            *cluster_metrics("emqp", stream.clusters, stream.servers_seen()),
        ]

    @staticmethod
    def _queue_stream_metrics(stream: JetStreamJobs) -> list[Metric]:
        seen = {q.decode("utf-8", "replace"): s for q, s in stream.queues.items()}
        opened = stream.pulls_open()
        consumers = {c.serves: c for c in stream.consumers() if c.role == "queue" and c.serves}
        led = {q: c.cluster for q, c in consumers.items() if c.cluster is not None}
        return [
            gauges_by(
                "emqp_jetstream_queue_ack_pending",
                "Requests of a queue its JetStream consumer delivered and has not had "
                "acknowledged (as its info was last read)",
                "queue",
                {q: c.ack_pending for q, c in consumers.items() if c.ack_pending is not None},
            ),
            gauges_by(
                "emqp_jetstream_queue_consumer_leader",
                "1 while a queue's JetStream consumer has a leader (as last read), 0 while none",
                "queue",
                {q: int(cluster.leader is not None) for q, cluster in led.items()},
            ),
            gauges_by(
                "emqp_jetstream_queue_pending",
                "Requests of a queue its JetStream consumer has not delivered yet",
                "queue",
                {name: s.pending for name, s in seen.items()},
            ),
            gauges_by(
                "emqp_jetstream_queue_ready_slots",
                "Requests of a queue this broker's ready workers could start now",
                "queue",
                {q.decode("utf-8", "replace"): n for q, n in stream.wanted.items()},
            ),
            gauges_by(
                "emqp_jetstream_queue_pulls_open",
                "Pulls this broker has open for a queue",
                "queue",
                {q.decode("utf-8", "replace"): n for q, n in opened.items()},
            ),
            gauges_by(
                "emqp_jetstream_queue_last_delivery_timestamp_seconds",
                "When a request of a queue was last delivered to this broker (0: never)",
                "queue",
                {name: s.last_delivery for name, s in seen.items()},
            ),
        ]

    def _report(self) -> None:
        broker = self.broker
        assert broker is not None
        if self.stream is not None:
            self.stream.read_clusters()  # for the next status (the answers come later)
        counters = broker.counters()
        log.info(
            "requests {requests}; dispatched {dispatched}; replied {replied}; retried "
            "{retried}; failed {failed}; rejected {rejected}; dropped {dropped}; workers "
            "{workers}; waiting {waiting}; heartbeat lag {lag} ms",
            workers=len(broker.workers),
            waiting=sum(len(q.waiting) for q in broker.queues.values()),
            lag=round(self.max_heartbeat_lag * 1000, 1),
            **counters,
        )
        self._write_status()

    def _settings_json(self) -> dict[str, Any]:
        made = self._config_json
        if made is None or made[0] is not self.config:
            made = self._config_json = (self.config, config_json(self.config))
        return made[1]

    def _write_status(self, now: bool = False) -> None:
        """status.json, on the status thread (``now``: before returning, when no write of
        the thread runs: at the start and at the end)."""
        path = Path(self.config.data_dir) / "status.json"
        text = status_json_text(self.status())
        if not now:
            self._status_file.run(lambda: write_status_text(path, text))
            return
        try:
            write_status_text(path, text)
        except OSError as error:
            self._status_failed(Failure(error))

    def _status_failed(self, failure: Failure) -> None:
        if not failure.check(OSError):
            log.failure("cannot write status.json", failure)
        elif self._faults.due("status") is not None:
            log.warn("cannot write status.json: {error}", error=str(failure.value))
