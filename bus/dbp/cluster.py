"""The shared catalog's bucket on the reactor (``twistd -n dbp --nats URLS``): the NATS
client, the bucket made or found, its watch, and the writes
:class:`bus.dbp.shared.SharedCatalogCore` asks for (see that module for the design)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from twisted.internet import defer
from twisted.logger import Logger
from twisted.python.failure import Failure

from bus.dbp.config import CatalogNatsSettings
from bus.dbp.shared import SharedCatalogCore, Write
from bus.extension import Metric, counter, gauge
from bus.nats import jsapi, kv
from bus.nats.client import client_for, connect_at_start
from bus.nats.seen import ServerSeen, StreamCluster, cluster_status, servers_seen

log = Logger(namespace="bus.dbp.cluster")

#: Seconds between the server's idle heartbeats on the watch: three missed, and the view
#: is no longer taken for current (and the watch is made again).
IDLE_HEARTBEAT = 1.0


class CatalogBucket:
    """The bucket, the watch that keeps ``core``'s view, and the writes it asks for;
    ``send`` takes the replies that waited for a write."""

    def __init__(
        self,
        reactor: Any,
        settings: CatalogNatsSettings,
        core: SharedCatalogCore,
        send: Callable[[list[bytes]], object],
    ) -> None:
        self.reactor = reactor
        self.settings = settings
        self.core = core
        self.send = send
        self.client = client_for(reactor, settings, f"dbp-{core.me}")
        self.client.listeners.append(self._connection_changed)
        self.watch = kv.Watch(
            self.client,
            settings.bucket,
            f"_DBPKV.{core.me}",
            lambda key, value, revision: core.apply(key.decode("utf-8"), value, revision),
            on_start=core.replay_started,
            on_caught_up=self._caught_up,
            on_bad=lambda error: core.drop("bad-record", error, "bucket"),
            idle_heartbeat=IDLE_HEARTBEAT,
        )
        core.fresh = self._fresh
        self.cluster = StreamCluster()
        #: Times the view stopped being current (a lost connection, a silent watch).
        self.stale_episodes = 0
        self._checker: Any = None
        self._opened = False

    @defer.inlineCallbacks
    def open(self) -> Any:
        """Connect, make the bucket when missing, watch it until caught up; a StartupError
        says what is wrong in one line."""
        settings = self.settings
        yield connect_at_start(self.client, settings.connect_timeout)
        yield kv.bucket_ready(
            self.client,
            settings.bucket,
            settings.replicas,
            settings.duplicate_window,
            "nats-bucket",
        )
        yield self.watch.start()
        self._opened = True
        from twisted.internet.task import LoopingCall

        self._checker = LoopingCall(self._check)
        self._checker.clock = self.reactor
        self._checker.start(IDLE_HEARTBEAT / 2, now=False)

    def close(self) -> None:
        """Stop watching and leave the servers."""
        if self._checker is not None and self._checker.running:
            self._checker.stop()
        self.watch.stop()
        self.client.stop()

    # -- the view ------------------------------------------------------------------------------

    def _caught_up(self) -> None:
        self.core.replay_done()
        self._check()
        log.info(
            "DBP catalog {me}: {count} services in bucket {bucket}",
            me=self.core.me,
            count=len(self.core.entries),
            bucket=self.settings.bucket,
        )

    def _fresh(self) -> bool:
        silent: float = self.reactor.seconds() - self.watch.heard_at
        if silent <= 3 * IDLE_HEARTBEAT:
            return True
        self._check()  # found before the periodic check: said and acted on now
        return False

    def _check(self) -> None:
        """Whether the view is current; a watch silent for three idle heartbeats while
        connected is made again."""
        silent = self.reactor.seconds() - self.watch.heard_at
        if self.client.connected and self.watch.caught_up and silent > 3 * IDLE_HEARTBEAT:
            log.warn(
                "DBP catalog: the bucket's watch was silent {silent:.1f}s: watching again",
                silent=silent,
            )
            self.watch.again()
        current = self.client.connected and self.watch.caught_up
        if self.core.current and not current:
            self.stale_episodes += 1
            log.warn("DBP catalog: not in touch with the shared catalog: info requests refused")
        elif current and not self.core.current:
            log.info("DBP catalog: in touch with the shared catalog again")
        self.core.current = current

    def _connection_changed(self, up: bool) -> None:
        if not self._opened:
            return
        if up:
            self.watch.again()  # changes made meanwhile: every key again
        self._check()

    # -- writes --------------------------------------------------------------------------------

    def flush(self) -> None:
        """Send the writes the core asked for."""
        for write in self.core.take_writes():
            stored = kv.put(
                self.client,
                self.settings.bucket,
                write.name.encode("utf-8"),
                write.value,
                write.expected,
                timeout=self.settings.ack_timeout,
            )
            stored.addCallbacks(
                self._stored, self._refused, callbackArgs=(write,), errbackArgs=(write,)
            )

    def _stored(self, revision: int, write: Write) -> None:
        reply = self.core.stored_ok(write, revision)
        if reply is not None:
            self.send(reply)

    def _refused(self, failure: Failure, write: Write) -> None:
        error = failure.value
        raced = isinstance(error, jsapi.JetStreamError) and error.err_code == kv.WRONG_LAST_SEQUENCE
        if not raced:
            log.warn(
                "DBP catalog: service {name}'s change not stored: {error}",
                name=write.name,
                error=failure.getErrorMessage(),
            )
        reply = self.core.store_failed(
            write, "another instance changed it first" if raced else failure.getErrorMessage()
        )
        if reply is not None:
            self.send(reply)

    # -- what it says --------------------------------------------------------------------------

    def read_cluster(self) -> None:
        """The bucket's stream leader and replicas, for /status (one read in flight)."""

        def took(info: dict[str, Any]) -> None:
            from bus.nats.seen import stream_cluster

            self.cluster = stream_cluster(info)

        def failed(failure: Failure) -> None:
            from bus.nats.seen import unread

            self.cluster = unread(failure.getErrorMessage())

        if self.client.connected:
            asked = self.client.jetstream(jsapi.stream_info(f"KV_{self.settings.bucket}"))
            asked.addCallbacks(took, failed)

    def servers_seen(self) -> list[ServerSeen]:
        """Each server known, and whether this instance's connection is on it."""
        url = self.client.server_url
        live = [("catalog", url, self.client.info, True)] if url is not None else []
        return servers_seen(self.client.servers, live)

    def status(self) -> dict[str, Any]:
        """The shared catalog as this instance sees it, for ``/status``."""
        core = self.core
        return {
            "instance": core.me,
            "bucket": f"KV_{self.settings.bucket}",
            "current": core.current,
            "connected": self.client.connected,
            "servers": [server.status() for server in self.servers_seen()],
            "stream_cluster": cluster_status(self.cluster),
            "authentication": self.settings.credentials.kind,
            "keys": len(core.stored),
            "writes_sent": core.writes_sent,
            "writes_refused": core.writes_refused,
            "writes_pending": sum(core.pending.values()),
            "not_current_answers": core.not_current_answers,
            "stale_episodes": self.stale_episodes,
            "watch_restarts": self.watch.restarts,
            "bad_records": core.bad_records,
            "refresh_s": self.settings.refresh,
        }

    def metrics(self) -> list[Metric]:
        """The shared catalog's figures, for ``/metrics``."""
        core = self.core
        return [
            gauge(
                "dbp_shared_current",
                "1 while this instance's view is the shared catalog's",
                int(core.current),
            ),
            counter(
                "dbp_shared_writes", "Writes of services' keys sent to the bucket", core.writes_sent
            ),
            counter(
                "dbp_shared_writes_refused",
                "Writes the bucket refused or did not answer (compare-and-sets lost included)",
                core.writes_refused,
            ),
            counter(
                "dbp_shared_not_current_answers",
                "Info requests answered 'not current' (the view may be stale)",
                core.not_current_answers,
            ),
            counter(
                "dbp_shared_stale_episodes",
                "Times the view stopped being current",
                self.stale_episodes,
            ),
        ]
