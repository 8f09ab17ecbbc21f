"""The mc0 broker's state, sans sockets: decoded commands and time in, frames out.

:class:`Broker` keeps the clients (one per ROUTER identity: its TTL, its framing, when it was
last heard and last sent to, its topics) and the topic table. Messages come in through
:meth:`Broker.receive_batch`; everything it sends goes out through the injected
``transmit(frames) -> SendResult`` (frames start with the ROUTER identity); time comes from
the injected clock (``IReactorTime``: the reactor, or ``task.Clock`` in tests).

Rules (spec 002 and the real broker, see the README of the specs):

* every verb carrying an ID is answered OK with that ID, or ERROR with a MESSAGE and the ID;
  bad input is answered ERROR (with the ID when one could be read) and counted by reason;
* a peer is a client from its first well-formed message on (the real broker needs no
  CONNECT either); CONNECT sets its TTL (default ``default_ttl_ms``) and version;
* PUT goes as MESSAGE (the PUT's headers but ID, then its body) to every subscriber of that
  exact topic, the sender too, each in the framing that subscriber last used;
* TTL: a client sent nothing for ``noop_factor`` x TTL gets a NOOP; a client not heard for
  ``expiry_factor`` x TTL is forgotten with its subscriptions. One lazy timer per client:
  it fires at the earlier deadline and re-arms itself, so traffic never touches timers.
  A timer that fires later than the margin between the two (a stall: SIGSTOP, a VM's
  pause, a starved machine) says the broker did not run meanwhile, and what the client
  sent may wait unread in its socket: its expiry is then put off once, by
  ``expiry_factor`` x TTL from that wake (its NOOP sent if due), as a stalled broker must
  not forget the clients it did not read.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from twisted.logger import Logger

from bus.mc0 import codec
from bus.mc0.codec import Framing, Mc0Error
from bus.util.droplog import DropCounter

if TYPE_CHECKING:
    from bus.mc0.relay import Relay

log = Logger(namespace="bus.mc0")

_NOOP = codec.NOOP
_ID = codec.ID
_OK = codec.OK
_DELIMITED = Framing.DELIMITED


class SendResult(enum.Enum):
    """What became of one message handed to the ROUTER."""

    SENT = "sent"
    #: The peer's queue is full (HWM): this message is dropped for it.
    FULL = "full"
    #: The peer is not connected any more.
    GONE = "gone"


Transmit = Callable[[list[bytes]], SendResult]
#: Sends messages in order until one is not sent: how many were, and what happened to the
#: next one (SENT when all went).
TransmitMany = Callable[[list[list[bytes]]], tuple[int, SendResult]]


@dataclass(frozen=True, slots=True)
class BrokerSettings:
    """The broker's rules: TTL bounds, message and client limits, when to NOOP and when to forget a
    silent client."""

    default_ttl_ms: int = 30_000
    min_ttl_ms: int = 100
    max_ttl_ms: int = 86_400_000
    max_message_bytes: int = codec.DEFAULT_MAX_MESSAGE_BYTES
    max_frames: int = codec.DEFAULT_MAX_FRAMES
    max_clients: int = 100_000
    max_topics_per_client: int = 10_000
    noop_factor: float = 0.95
    expiry_factor: float = 1.05


@dataclass(eq=False, slots=True)
class Client:
    """A client the broker knows: its session's TTL, framing and topics, and when it was last heard
    and sent to."""

    identity: bytes
    ttl: float  # seconds
    framing: Framing
    last_heard: float
    last_sent: float
    connected_at: float
    version: bytes | None = None
    topics: set[bytes] = field(default_factory=set)
    timer: Any = None
    #: When its timer is due (its wake's lateness says whether the broker ran meanwhile).
    due: float = 0.0
    #: Its silence was let run on once past its expiry, the broker having woken late: the
    #: ``last_heard`` then, and until when.
    graced_heard: float = -1.0
    graced_until: float = 0.0


PutObserver = Callable[[Client, codec.Put], None]


class Broker:
    """The mc0 broker's clients and topic table: messages in through :meth:`receive_batch`, out
    through ``transmit``, time from ``clock`` (see the module's text)."""

    def __init__(
        self,
        settings: BrokerSettings,
        clock: Any,
        transmit: Transmit,
        on_put: PutObserver | None = None,
        transmit_many: TransmitMany | None = None,
    ) -> None:
        self.settings = settings
        self.clock = clock
        self.transmit = transmit
        #: Many messages a call (a batch's acknowledgements, a PUT's MESSAGEs); without
        #: it, one ``transmit`` each.
        self.transmit_many = transmit_many or self._transmit_each
        self.on_put = on_put
        #: Brokers of other hosts, over NATS (:mod:`bus.mc0.relay`); None: this broker alone.
        self.relay: Relay | None = None
        self.clients: dict[bytes, Client] = {}
        #: topic -> its subscribers, by identity
        self.topics: dict[bytes, dict[bytes, Client]] = {}
        self.errors = DropCounter(log, "mc0 command (answered ERROR)", clock.seconds)
        self.commands: dict[str, int] = {}
        self.delivered = 0
        self.undelivered: dict[str, int] = {"full": 0, "gone": 0}
        self.acknowledged = 0
        self.noops_sent = 0
        #: Expiries put off once as the broker's wake came late (it had not run).
        self.expiries_put_off = 0
        self.expired = 0
        self.disconnected = 0
        self.puts = 0

    # -- input ------------------------------------------------------------------------------

    def receive_batch(self, batch: Iterable[Sequence[bytes]]) -> None:
        """Messages read from the ROUTER: frame 0 is the peer's identity."""
        now = self.clock.seconds()
        clients = self.clients
        settings = self.settings
        # The commonest message, a known client's ``["", NOOP, ID, id]`` (the connectors'
        # keep-alive, mc0d's torture tool), is answered without decoding it into a command:
        # the same checks and the same effects as receive(), at a third of the cost.
        noop_fits = settings.max_frames >= 4
        max_bytes = settings.max_message_bytes - 6
        # Their OKs go out together, before anything else is handled (order kept).
        oks: list[list[bytes]] = []
        acked: list[Client] = []
        for frames in batch:
            if (
                len(frames) == 5
                and frames[2] == _NOOP
                and frames[3] == _ID
                and not frames[1]
                and noop_fits
                and len(frames[4]) <= max_bytes
                and (client := clients.get(frames[0])) is not None
            ):
                client.last_heard = now
                client.framing = _DELIMITED
                oks.append([frames[0], b"", _OK, _ID, frames[4]])
                acked.append(client)
            elif frames:
                if oks:
                    self._acknowledge_noops(oks, acked)
                    oks, acked = [], []
                self.receive(frames[0], frames[1:], now)
        if oks:
            self._acknowledge_noops(oks, acked)

    def _acknowledge_noops(self, oks: list[list[bytes]], clients: list[Client]) -> None:
        count = len(oks)
        self.commands["Noop"] = self.commands.get("Noop", 0) + count
        self.acknowledged += count
        failed = self._send_all(oks)
        now = self.clock.seconds()
        for index, client in enumerate(clients):
            if index not in failed:
                client.last_sent = now
            elif failed[index] is SendResult.GONE and self.clients.get(client.identity) is client:
                self._forget(client)

    def receive(self, identity: bytes, frames: Sequence[bytes], now: float | None = None) -> None:
        """One message from ``identity``: decoded, answered, and acted on (``now``: the clock's time
        unless given)."""
        if now is None:
            now = self.clock.seconds()
        settings = self.settings
        client = self.clients.get(identity)
        if client is not None:
            client.last_heard = now
        try:
            command = codec.decode_client(frames, settings.max_message_bytes, settings.max_frames)
        except Mc0Error as error:
            self._refuse(identity, error)
            return
        name = type(command).__name__
        self.commands[name] = self.commands.get(name, 0) + 1
        if client is None:
            if isinstance(command, codec.Disconnect):
                self._acknowledge(identity, command.id, command.framing)
                return
            if len(self.clients) >= settings.max_clients:
                self._refuse(
                    identity,
                    Mc0Error("too many clients", "too-many-clients", command.id, command.framing),
                )
                return
            ttl_ms = settings.default_ttl_ms
            if isinstance(command, codec.Connect) and command.ttl_ms is not None:
                ttl_ms = command.ttl_ms
            if not self._ttl_allowed(identity, ttl_ms, command):
                return
            client = Client(identity, ttl_ms / 1000, command.framing, now, now, now)
            self.clients[identity] = client
            self._arm(client)
        client.framing = command.framing
        match command:
            case codec.Put():
                if self._put(client, command):
                    return  # refused, or answered once the cluster has it
            case codec.Noop():
                pass
            case codec.Subscribe(topics):
                if len(client.topics.union(topics)) > settings.max_topics_per_client:
                    self._refuse(
                        identity,
                        Mc0Error(
                            f"more than {settings.max_topics_per_client} topics for one client",
                            "too-many-topics",
                            command.id,
                            command.framing,
                        ),
                    )
                    return
                if self._subscribe(client, topics, command):
                    return
            case codec.Unsubscribe(topics):
                for topic in topics:
                    self._unsubscribe(client, topic)
            case codec.Connect(asked, version):
                ttl_ms = settings.default_ttl_ms if asked is None else asked
                if not self._ttl_allowed(identity, ttl_ms, command):
                    return
                client.version = version
                if client.ttl != ttl_ms / 1000:
                    client.ttl = ttl_ms / 1000
                    self._arm(client)
            case codec.Disconnect():
                self._forget(client)
                self.disconnected += 1
        if command.id is not None:
            self._acknowledge(identity, command.id, command.framing)

    def _ttl_allowed(self, identity: bytes, ttl_ms: int, command: codec.ClientCommand) -> bool:
        low, high = self.settings.min_ttl_ms, self.settings.max_ttl_ms
        if low <= ttl_ms <= high:
            return True
        self._refuse(
            identity,
            Mc0Error(
                f"TTL {ttl_ms} ms out of this broker's range {low}..{high} ms",
                "bad-ttl",
                command.id,
                command.framing,
            ),
        )
        return False

    # -- verbs ------------------------------------------------------------------------------

    def _put(self, sender: Client, put: codec.Put) -> bool:
        """Deliver ``put`` here (and to the cluster); True when it is answered already
        (refused) or later (by the relay, once the cluster has it)."""
        later = False
        relay = self.relay
        if relay is not None:
            taken = relay.take(put, sender.identity, sender.ttl)
            if isinstance(taken, Mc0Error):
                self._refuse(sender.identity, taken)
                return True
            later = taken
        self.puts += 1
        self._fan_out(put)
        if self.on_put is not None:
            self.on_put(sender, put)
        return later

    def deliver(self, put: codec.Put) -> None:
        """A PUT relayed from a broker of another host: to this broker's subscribers of its
        topic (never relayed on, never mirrored: its own broker did that)."""
        self._fan_out(put)

    def _fan_out(self, put: codec.Put) -> None:
        subscribers = self.topics.get(put.topic)
        if subscribers:
            payloads: dict[Framing, list[bytes]] = {}
            messages: list[list[bytes]] = []
            targets = list(subscribers.values())
            for identity, client in subscribers.items():
                payload = payloads.get(client.framing)
                if payload is None:
                    payload = payloads[client.framing] = codec.message_frames(put, client.framing)
                messages.append([identity, *payload])
            failed = self._send_all(messages)
            now = self.clock.seconds()
            self.delivered += len(messages) - len(failed)
            gone: list[Client] = []
            for index, client in enumerate(targets):
                result = failed.get(index)
                if result is None:
                    client.last_sent = now
                else:
                    self.undelivered[result.value] += 1
                    if result is SendResult.GONE:
                        gone.append(client)
            for client in gone:
                self._forget(client)

    def _subscribe(self, client: Client, topics: Sequence[bytes], command: codec.Subscribe) -> bool:
        """SUB: True when it is answered already (refused) or later (its new interest
        confirmed by the cluster)."""
        relay = self.relay
        if relay is not None:
            refusal = relay.topic_refusal(topics, command)
            if refusal is not None:
                self._refuse(client.identity, refusal)
                return True
        # Answered once the server has every topic's subscription: made now, or made for an
        # earlier subscriber and not confirmed yet.
        unconfirmed = False
        for topic in topics:
            subscribers = self.topics.get(topic)
            if subscribers is None:
                subscribers = self.topics[topic] = {}
                if relay is not None:
                    relay.interest(topic, True)
                    unconfirmed = True
            elif relay is not None and not unconfirmed:
                unconfirmed = relay.interest_unconfirmed(topic)
            subscribers[client.identity] = client
            client.topics.add(topic)
        if unconfirmed and command.id is not None:
            assert relay is not None
            relay.acknowledge_after_flush(client.identity, command.id, command.framing)
            return True
        return False

    def answer(
        self, identity: bytes, message_id: bytes, framing: Framing, error: Mc0Error | None
    ) -> None:
        """The relay's word on a command it answers later: OK, or ERROR."""
        if error is None:
            self._acknowledge(identity, message_id, framing)
        else:
            self._refuse(identity, error)

    def _unsubscribe(self, client: Client, topic: bytes) -> None:
        client.topics.discard(topic)
        subscribers = self.topics.get(topic)
        if subscribers is not None:
            subscribers.pop(client.identity, None)
            if not subscribers:
                del self.topics[topic]
                if self.relay is not None:
                    self.relay.interest(topic, False)

    def _forget(self, client: Client) -> None:
        for topic in list(client.topics):
            self._unsubscribe(client, topic)
        if client.timer is not None and client.timer.active():
            client.timer.cancel()
        client.timer = None
        self.clients.pop(client.identity, None)

    # -- output -----------------------------------------------------------------------------

    def _send_all(self, messages: list[list[bytes]]) -> dict[int, SendResult]:
        """Send each message (frame 0: the identity) in order; those not sent, by index."""
        failed: dict[int, SendResult] = {}
        start, total = 0, len(messages)
        while start < total:
            sent, result = self.transmit_many(messages if start == 0 else messages[start:])
            start += sent
            if start < total:
                failed[start] = result
                start += 1
        return failed

    def _transmit_each(self, messages: list[list[bytes]]) -> tuple[int, SendResult]:
        for sent, frames in enumerate(messages):
            result = self.transmit(frames)
            if result is not SendResult.SENT:
                return sent, result
        return len(messages), SendResult.SENT

    def _send(self, identity: bytes, frames: list[bytes]) -> SendResult:
        result = self.transmit([identity, *frames])
        client = self.clients.get(identity)
        if result is SendResult.SENT:
            if client is not None:
                client.last_sent = self.clock.seconds()
        elif result is SendResult.GONE and client is not None:
            self._forget(client)
        return result

    def _acknowledge(self, identity: bytes, message_id: bytes | None, framing: Framing) -> None:
        if message_id is not None:
            self.acknowledged += 1
            self._send(identity, codec.ok_frames(message_id, framing))

    def _refuse(self, identity: bytes, error: Mc0Error) -> None:
        self.errors.drop(error.reason, str(error), identity)
        text = str(error).encode("utf-8", "replace")
        self._send(identity, codec.error_frames(text, error.message_id, error.framing))

    # -- time -------------------------------------------------------------------------------

    def _expiry(self, client: Client) -> float:
        """When silence ends ``client``'s session: ``expiry_factor`` x TTL after it was last
        heard, or later where a late wake put it off (see the module's text)."""
        expiry = client.last_heard + self.settings.expiry_factor * client.ttl
        if client.graced_heard == client.last_heard:
            return max(expiry, client.graced_until)
        return expiry

    def _deadline(self, client: Client) -> float:
        return min(client.last_sent + self.settings.noop_factor * client.ttl, self._expiry(client))

    def _arm(self, client: Client) -> None:
        if client.timer is not None and client.timer.active():
            client.timer.cancel()
        now = self.clock.seconds()
        client.due = self._deadline(client)
        client.timer = self.clock.callLater(max(client.due - now, 0.0), self._wake, client)

    def _wake(self, client: Client) -> None:
        client.timer = None
        if self.clients.get(client.identity) is not client:
            return
        now = self.clock.seconds()
        settings = self.settings
        margin = (settings.expiry_factor - settings.noop_factor) * client.ttl
        if (
            now >= self._expiry(client)
            and now - client.due > margin
            and client.graced_heard != client.last_heard
        ):
            # Woken late: not run meanwhile, the client's messages may wait unread.
            client.graced_heard = client.last_heard
            client.graced_until = now + settings.expiry_factor * client.ttl
            self.expiries_put_off += 1
        if now >= self._expiry(client):
            log.debug(
                "forgetting mc0 client {peer}: silent for {seconds:.3f}s (TTL {ttl}s)",
                peer=client.identity.hex()[:40],
                seconds=now - client.last_heard,
                ttl=client.ttl,
            )
            self.expired += 1
            self._forget(client)
            return
        if now >= client.last_sent + settings.noop_factor * client.ttl:
            if self._send(client.identity, codec.noop_frames(client.framing)) is SendResult.SENT:
                self.noops_sent += 1
            else:
                client.last_sent = now  # full: try again a TTL later rather than spin
            if self.clients.get(client.identity) is not client:
                return
        self._arm(client)

    def close(self) -> None:
        """Cancel every timer (the service is stopping)."""
        if self.relay is not None:
            self.relay.close()
        for client in self.clients.values():
            if client.timer is not None and client.timer.active():
                client.timer.cancel()
            client.timer = None

    # -- what it is doing -------------------------------------------------------------------

    @property
    def subscriptions(self) -> int:
        """Subscriptions over every topic."""
        return sum(len(subscribers) for subscribers in self.topics.values())

    def status(self) -> dict[str, Any]:
        """Clients, topics, commands, errors and deliveries, for ``/status``."""
        return {
            "clients": len(self.clients),
            "topics": len(self.topics),
            "subscriptions": self.subscriptions,
            "commands": dict(self.commands),
            "errors": dict(self.errors.counts),
            "acknowledged": self.acknowledged,
            "puts": self.puts,
            "delivered": self.delivered,
            "undelivered": dict(self.undelivered),
            "noops_sent": self.noops_sent,
            "expiries_put_off": self.expiries_put_off,
            "expired": self.expired,
            "disconnected": self.disconnected,
        }
