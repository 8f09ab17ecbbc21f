"""ZGOSSIP (czmq's ``zgossip``) as zyre uses it for discovery without UDP, sans I/O: tuples
and time in, frames out. The Twisted side (:mod:`bus.zre.node`) owns the sockets.

A node may be a *hub* (``zyre_gossip_bind``: a ROUTER clients connect to) and a *client* of
hubs (``zyre_gossip_connect``: one DEALER per hub, a *remote*), both at once, as zgossip.
What czmq 4.2.1 and zyre's git master were seen doing on the wire, and what this does:

* a client says HELLO, then PUBLISHes every tuple it holds (zyre: its own, key its UUID in
  upper-case hex, value its mailbox ``tcp://HOST:PORT``, ``|KEY`` with a certificate, ttl 0);
* a hub answers HELLO with a PUBLISH of every tuple it holds, answers PING with PONG, and
  stores a PUBLISHed tuple when it is new (a key not held, or a new value), then forwards it
  to its other clients and its remotes; a hub forwards to the clients it has heard from
  lately only (zgossip forgets a client silent for a second; ours, one silent for
  ``client_expired``) and answers anything but HELLO and PING from a client it does not hold
  with INVALID; a client answers INVALID with HELLO (and, here, its tuples again);
* zyre's clients never PING, so a zgossip hub soon forgets them and tells them only what it
  holds when they say HELLO; the ZRE HELLO a newcomer sends to every peer it was told about
  does the rest. Our client PINGs every ``ping_interval`` to hear of later peers as well;
* a node that hears a new tuple that is not its own connects to the mailbox in it (the ZRE
  side); when a ZRE peer leaves, its tuple is forgotten (zyre's UNPUBLISH).

Everything a peer can make us hold is bounded: tuples (``max_tuples``, a value of at most
``MAX_VALUE`` octets) and the hub's clients (``max_clients``, the longest silent forgotten).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from bus.zre import gossip_codec as wire
from bus.zre.gossip_codec import (
    GossipError,
    GossipHello,
    GossipMessage,
    GossipPing,
    Invalid,
    Pong,
    Publish,
)

#: The longest tuple value held (a mailbox endpoint and a Z85 key need about 90 octets).
MAX_VALUE = 1024


class GossipLinks(Protocol):
    """Where frames go: to a client of our hub (by ROUTER identity), or to a hub we are a
    client of (by its endpoint)."""

    def to_client(self, identity: bytes, frame: bytes) -> None:
        """Send ``frame`` to the client of our hub whose ROUTER identity is ``identity``."""
        ...

    def to_remote(self, endpoint: str, frame: bytes) -> None:
        """Send ``frame`` to the hub at ``endpoint``."""
        ...


@dataclass(slots=True)
class _Tuple:
    value: str
    #: When it expires (a ttl was given), or None (kept until unpublished, as zyre's).
    expires_at: float | None


class GossipCore:
    """One node's gossip service: the hub's clients, the remotes, the tuples."""

    def __init__(
        self,
        clock: Callable[[], float],
        links: GossipLinks,
        deliver: Callable[[str, str], None],
        drop: Callable[[str, str, bytes], None],
        max_tuples: int = 10_000,
        max_clients: int = 1024,
        client_expired: float = 30.0,
    ) -> None:
        self.clock = clock
        self.links = links
        self.deliver = deliver
        self.drop = drop
        self.max_tuples = max_tuples
        self.max_clients = max_clients
        self.client_expired = client_expired
        self.tuples: dict[str, _Tuple] = {}
        #: The hub's clients that said HELLO, by identity: when each was last heard (oldest
        #: first).
        self.clients: dict[bytes, float] = {}
        self.remotes: list[str] = []
        #: Our own tuples, sent again to a hub that forgot us.
        self.own: dict[str, str] = {}
        self.received = 0
        self.sent = 0

    # -- our application's side ------------------------------------------------------------

    def publish(self, key: str, value: str) -> None:
        """Announce our own tuple (zyre: our UUID and mailbox)."""
        self.own[key] = value
        self._accept(Publish(key, value), source=None)

    def unpublish(self, key: str) -> None:
        """Forget a tuple (zyre's UNPUBLISH when a peer leaves); nothing is sent."""
        self.tuples.pop(key, None)

    def add_remote(self, endpoint: str) -> None:
        """A hub we are a client of, just connected: greet it and tell it what we hold."""
        if endpoint not in self.remotes:
            self.remotes.append(endpoint)
        self._greet(endpoint)

    # -- input -----------------------------------------------------------------------------

    def on_client(self, identity: bytes, frames: Sequence[bytes]) -> None:
        """A message to our hub from a client."""
        message = self._parse(frames, identity)
        if message is None:
            return
        now = self.clock()
        known = identity in self.clients
        if isinstance(message, GossipHello):
            self._hold_client(identity, now)
            for key, held in list(self.tuples.items()):
                self._send_client(identity, Publish(key, held.value))
        elif isinstance(message, GossipPing):
            if known:
                self._hold_client(identity, now)
            self._send_client(identity, Pong())
        elif not known:
            # zgossip: a command from a client it does not hold is refused; the client
            # then says HELLO again.
            self.drop("gossip-not-greeted", f"{_name(message)} before HELLO", identity)
            self._send_client(identity, Invalid())
        elif isinstance(message, Publish):
            self._hold_client(identity, now)
            self._accept(message, source=identity)
        else:
            self.drop("gossip-command", f"{_name(message)} from a client", identity)
            self._send_client(identity, Invalid())
            self.clients.pop(identity, None)

    def on_remote(self, endpoint: str, frames: Sequence[bytes]) -> None:
        """A message from a hub we are a client of."""
        message = self._parse(frames, endpoint.encode())
        if message is None:
            return
        if isinstance(message, Publish):
            self._accept(message, source=endpoint)
        elif isinstance(message, Invalid):
            self._greet(endpoint)  # it forgot us: greet it again
        elif not isinstance(message, Pong):
            self.drop("gossip-command", f"{_name(message)} from a hub", endpoint.encode())

    # -- time ------------------------------------------------------------------------------

    def ping(self) -> None:
        """Keep our hubs hearing from us (a zgossip hub forgets a client silent for 1 s)."""
        frame = wire.encode(GossipPing())
        for endpoint in self.remotes:
            self.sent += 1
            self.links.to_remote(endpoint, frame)

    def tick(self) -> None:
        """Forget silent clients and expired tuples."""
        now = self.clock()
        for identity, seen in list(self.clients.items()):
            if now - seen < self.client_expired:
                break
            del self.clients[identity]
        for key, held in list(self.tuples.items()):
            if held.expires_at is not None and held.expires_at <= now:
                del self.tuples[key]

    # -- the tuples --------------------------------------------------------------------------

    def _accept(self, message: Publish, source: bytes | str | None) -> None:
        held = self.tuples.get(message.key)
        if held is not None and held.value == message.value:
            return  # a duplicate: forwarded already
        origin = source if isinstance(source, bytes) else (source or "").encode()
        if len(message.value.encode()) > MAX_VALUE:
            self.drop("gossip-value", f"a tuple value of {len(message.value)} chars", origin)
            return
        if held is None and len(self.tuples) >= self.max_tuples:
            self.drop("gossip-full", f"{len(self.tuples)} tuples held", origin)
            return
        expires = self.clock() + message.ttl_ms / 1000 if message.ttl_ms else None
        self.tuples[message.key] = _Tuple(message.value, expires)
        if source is not None:
            self.deliver(message.key, message.value)
        forward = Publish(message.key, message.value, message.ttl_ms)
        for identity in list(self.clients):
            if identity != source:
                self._send_client(identity, forward)
        for endpoint in self.remotes:
            if endpoint != source:
                self._send_remote(endpoint, forward)

    def _greet(self, endpoint: str) -> None:
        self._send_remote(endpoint, GossipHello())
        for key, held in list(self.tuples.items()):
            self._send_remote(endpoint, Publish(key, held.value))
        for key, value in self.own.items():
            if key not in self.tuples:
                self._send_remote(endpoint, Publish(key, value))

    def _hold_client(self, identity: bytes, now: float) -> None:
        self.clients.pop(identity, None)
        if len(self.clients) >= self.max_clients:
            oldest = next(iter(self.clients))
            del self.clients[oldest]
            self.drop("gossip-clients-full", f"{self.max_clients} clients held", oldest)
        self.clients[identity] = now

    def _parse(self, frames: Sequence[bytes], origin: bytes) -> GossipMessage | None:
        self.received += 1
        try:
            return wire.parse(list(frames))
        except GossipError as error:
            self.drop(f"gossip-{error.reason}", str(error), origin)
            return None

    def _send_client(self, identity: bytes, message: GossipMessage) -> None:
        self.sent += 1
        self.links.to_client(identity, wire.encode(message))

    def _send_remote(self, endpoint: str, message: GossipMessage) -> None:
        self.sent += 1
        self.links.to_remote(endpoint, wire.encode(message))


def _name(message: GossipMessage) -> str:
    return type(message).__name__.removeprefix("Gossip").upper()


def parse_tuple_value(value: str) -> tuple[str, bytes | None] | None:
    """A zyre tuple value ``tcp://HOST:PORT`` or ``tcp://HOST:PORT|KEY``: the endpoint and
    the Z85 key (None: none); None when it is neither."""
    endpoint, bar, key = value.partition("|")
    host, _, port = endpoint.removeprefix("tcp://").rpartition(":")
    if not endpoint.startswith("tcp://") or not host or not port.isdigit():
        return None
    if bar and len(key) != 40:
        return None
    return endpoint, key.encode("ascii", "replace") if bar else None
