"""A publisher that is told what the bus stored: each ``publish`` returns a Deferred that
fires with the event's sequence once the event is in the log, and failover between
servers (JetStream front-ends, a pair) resends what was not confirmed.

The PUB is fire-and-forget on the wire, so the confirmation comes from the log itself:
beside its :class:`bus.eventbus.client.EventBusPublisher` it runs an
:class:`bus.eventbus.client.EventBusSubscriber` from the log's head, which heals gaps
from snapshots; an event is confirmed when the feed delivers its uuid. An event stored by
a front-end that died before broadcasting it is still confirmed, by the next front-end's
snapshot.

Resending needs a log that stores an event's uuid once: the JetStream front-ends do
within the stream's duplicate window (two minutes by default). A single SQLite server
stores every copy it receives, so give it ``resend=False``: events are then confirmed,
never sent twice.

    publisher = ConfirmedPublisher(["h1:5556", "h2:5556"], "billing")
    publisher.startService()
    sequence = yield publisher.publish("/orders/42/", {"total": 12.5})
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from twisted.application.service import Service
from twisted.internet import defer
from twisted.logger import Logger

from bus.eventbus.client import EventBusPublisher, EventBusSubscriber, ServerAddress
from bus.eventbus.codec import Event
from bus.extension import SocketFactory
from bus.transport.curve import ClientCurve
from bus.util.periodic import Periodic

log = Logger(namespace="bus.eventbus.confirmed")


class NotConfirmed(Exception):
    """The publisher stopped before the bus confirmed the event (it may still be stored)."""


@dataclass(slots=True)
class _Unconfirmed:
    frames: list[bytes]
    deferred: defer.Deferred[int]
    #: When it was last handed to a server, and through which of the publisher's
    #: connections (its failover count then); None while held until the feed is ready.
    sent_at: float | None = None
    via: int = -1


class ConfirmedPublisher(Service):
    """Publishes events and fires each one's Deferred with its sequence once stored.

    ``subtrees``: the subtrees the events go to (default: the whole feed), which is all the
    confirming feed subscribes to. ``resend_after``: seconds without a confirmation before
    an event is sent again (None: only after a failover). ``resend``: whether to resend at
    all (see the module's note on duplicates).
    """

    def __init__(
        self,
        servers: str | ServerAddress | Sequence[str | ServerAddress],
        producer_id: str,
        *,
        subtrees: Iterable[str | bytes] = (),
        resend: bool = True,
        resend_after: float | None = 5.0,
        failover_after: float = 1.0,
        heartbeat_timeout: float = 3.5,
        reactor: Any = None,
        factory: SocketFactory | None = None,
        curve: ClientCurve | None = None,
    ) -> None:
        listed = [servers] if isinstance(servers, str | ServerAddress) else list(servers)
        self.publisher = EventBusPublisher(
            listed,
            producer_id,
            reactor=reactor,
            factory=factory,
            failover_after=failover_after,
            curve=curve,
        )
        self.reactor: Any = self.publisher.reactor
        self.feed = EventBusSubscriber(
            listed,
            subtrees,
            self._on_event,
            since="head",
            heartbeat_timeout=heartbeat_timeout,
            failover_after=failover_after,
            reactor=self.reactor,
            factory=factory,
            curve=curve,
        )
        self.producer = producer_id.encode("utf-8")
        self.resend = resend
        self.resend_after = resend_after
        self._unconfirmed: dict[bytes, _Unconfirmed] = {}
        self._ready = False
        self._waiting_ready: list[defer.Deferred[None]] = []
        self._periodic = Periodic(self.reactor, log)
        #: When a resend became due, and the sequence the feed must reach before it.
        self._barrier: float | None = None
        self._target: int | None = None
        #: Events confirmed, and copies sent again.
        self.confirmed = 0
        self.resent = 0

    # -- lifecycle -----------------------------------------------------------------------

    def startService(self) -> None:
        Service.startService(self)
        self.feed.startService()
        self._periodic.every(0.05, self._tick)

    def stopService(self) -> defer.Deferred[None]:
        Service.stopService(self)
        self._periodic.stop_all()
        self.publisher.close()
        stopped = self.feed.stopService()
        left, self._unconfirmed = self._unconfirmed, {}
        for event_id, record in left.items():
            record.deferred.errback(
                NotConfirmed(f"stopped before the bus confirmed event {event_id.decode()}")
            )
        return stopped

    @property
    def ready(self) -> bool:
        """The feed follows the log from a known point: events sent now are confirmable."""
        return self._ready

    def when_ready(self) -> defer.Deferred[None]:
        """A Deferred that fires once the publisher is :attr:`ready`."""
        d: defer.Deferred[None] = defer.Deferred()
        if self._ready:
            d.callback(None)
        else:
            self._waiting_ready.append(d)
        return d

    @property
    def unconfirmed(self) -> int:
        """Events published and not yet confirmed."""
        return len(self._unconfirmed)

    # -- publishing ----------------------------------------------------------------------

    def publish(
        self,
        topic: str,
        value: Any,
        *,
        timestamp: str | None = None,
        event_id: str | None = None,
    ) -> defer.Deferred[int]:
        """Send one event; the Deferred fires with its sequence once the log holds it
        (add a timeout with ``addTimeout`` if the caller needs one: a cancelled event is no
        longer resent)."""
        text, frames = self.publisher.event_frames(
            topic, value, timestamp=timestamp, event_id=event_id
        )
        identifier = text.encode("ascii")
        if identifier in self._unconfirmed:
            raise ValueError(f"event {text} is already waiting to be confirmed")
        # Cancelled (e.g. by addTimeout): no longer waited for, nor resent.
        record = _Unconfirmed(frames, defer.Deferred(lambda _: self._forget(identifier)))
        self._unconfirmed[identifier] = record
        if self._ready:
            self._send(record)
        return record.deferred

    def _forget(self, identifier: bytes) -> None:
        self._unconfirmed.pop(identifier, None)

    def _send(self, record: _Unconfirmed) -> None:
        record.sent_at = self.reactor.seconds()
        record.via = self.publisher.failovers
        self.publisher.publish_frames(record.frames)

    def _on_event(self, event: Event) -> None:
        record = self._unconfirmed.pop(event.uuid, None)
        if record is not None:
            self.confirmed += 1
            record.deferred.callback(event.sequence)

    def _tick(self) -> None:
        if not self._ready:
            core = self.feed.core
            if core.store_id is None or core.syncing:
                return
            self._ready = True
            for record in self._unconfirmed.values():
                self._send(record)
            waiting, self._waiting_ready = self._waiting_ready, []
            for d in waiting:
                d.callback(None)
            return
        if not self.resend or not self._unconfirmed:
            return
        now = self.reactor.seconds()
        if self._barrier is None:
            failovers = self.publisher.failovers
            if not any(
                record.via != failovers
                or (self.resend_after is not None and now - record.sent_at >= self.resend_after)
                for record in self._unconfirmed.values()
                if record.sent_at is not None
            ):
                return
            # Something is due again. First the feed must show what the log holds now: a
            # heartbeat after this moment, and every event up to the sequence it names.
            self._barrier, self._target = now, None
            return
        feed = self.feed
        if self._target is None:
            if feed.heartbeat_at <= self._barrier:
                return
            self._target = feed.core.server_sequence
        if feed.core.syncing or feed.core.verified < self._target:
            return
        # An event sent before the barrier and stored by then would be confirmed now: the
        # log lacks it (or a front-end that stopped holds it, and the stream's duplicate
        # window keeps that copy out).
        barrier, self._barrier = self._barrier, None
        failovers = self.publisher.failovers
        again = [
            record
            for record in self._unconfirmed.values()
            if record.sent_at is not None
            and record.sent_at <= barrier
            and (
                record.via != failovers
                or (self.resend_after is not None and barrier - record.sent_at >= self.resend_after)
            )
        ]
        for record in again:
            self.resent += 1
            self._send(record)
        if again:
            log.info(
                "resent {count} unconfirmed events to {server}",
                count=len(again),
                server=self.publisher.server,
            )
