"""The catalog's state machine: decoded commands, UDP heartbeats and time in; replies,
heartbeats to send and activity out. No sockets; the clock is injected.

Heartbeats (the text describes them, the original never built them): every
``heartbeat_interval`` the catalog sends each active service a UDP ``<3``; a service sends its
own every ``heartbeat`` seconds (its registration says how often). When a service's UDP beats
go missing for two of its intervals, the catalog also beats it over its ZeroMQ connection (the
text's TCP fallback); a service that receives ZeroMQ beats, or misses the catalog's UDP ones,
beats over ZeroMQ too. Both go back to UDP alone once UDP beats arrive again. Any command a
service sends counts as a beat. A service silent on both paths for ``liveness`` of its
intervals expires (inactive); it is removed ``grace`` seconds later unless it beats again.
A tick that comes late (the catalog did not run: :mod:`bus.util.wakes`) beats but judges
nothing, nor does any in the half interval after it: what the services sent meanwhile is
read first.

A service registered in Hermes' form never beats and closes its connection after ``OwO``:
it is never beaten; with ``hermes_services="expire"`` it expires after ``liveness`` of its
assumed heartbeat like any silent service, with ``"keep"`` it stays until it unregisters
(``</3`` naming it) and its updates are accepted by name from any connection.

The registry holds at most ``max_services``: a registration of a new name past that takes
the place of the service that expired first, or is DENIED (counted ``registry-full``).
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from bus.dbp import codec
from bus.dbp.codec import DbpError, DbpMessage, Invalid
from bus.util.wakes import Wakes

#: kind ("registered", "updated", "expired", "active", "disconnected", "removed"), name, value
ActivityHandler = Callable[[str, str, dict[str, Any]], None]
#: reason, detail, peer: a ZeroMQ identity (bytes) or a UDP peer's address (text).
DropHandler = Callable[[str, str, bytes | str], None]


@dataclass(slots=True)
class CatalogSettings:
    """The catalog's rules: heartbeats and liveness, the grace of an expired service, who may
    register, and how Hermes' services are kept."""

    heartbeat_interval: float = 1.0
    liveness: int = 3
    grace: float = 60.0
    #: Allowed service names -> shared token (None: no token needed); None: all allowed.
    allow: Mapping[str, str | None] | None = None
    #: The UDP port services send heartbeats to (told them in OwO).
    udp_port: int = 0
    #: Names this run of the catalog in its heartbeats (and OwO), so that a service notices
    #: a restart and registers again.
    catalog_id: str = field(default_factory=lambda: uuid.uuid4().hex)
    #: Services registered in Hermes' form: "expire" (like any silent service) or "keep".
    hermes_services: str = "expire"
    #: Their assumed heartbeat (they never send one), seconds.
    hermes_heartbeat: float = codec.HERMES_HEARTBEAT
    #: Most services listed (active or inactive): what strangers can make is bounded.
    max_services: int = 10_000


@dataclass(slots=True)
class Entry:
    """A service in the catalog: its registration, where it is heard from, and whether it is
    active."""

    name: str
    info: dict[str, Any]
    registered_at: float
    identity: bytes | None = None
    time_size: int = codec.TIME_DOUBLE
    active: bool = True
    last_udp: float = 0.0
    last_zmq: float = 0.0
    expired_at: float | None = None
    #: "udp", or "zmq" while the service's UDP beats are missing.
    path: str = "udp"
    #: The registration's form: codec.SPEC, or codec.HERMES (never beaten).
    form: str = codec.SPEC
    #: In a shared catalog (:mod:`bus.dbp.shared`): when an instance last wrote that it
    #: heard the service, which instance holds it (hears it, beats it), and the key's
    #: revision in the bucket.
    heard_at: float = 0.0
    holder: str = ""
    revision: int = 0

    @property
    def last_heard(self) -> float:
        """When the service was last heard, by either path (in a shared catalog, by any
        instance, as the bucket last said)."""
        return max(self.last_udp, self.last_zmq, self.heard_at)

    @property
    def heartbeat_path(self) -> str:
        """How it is heard: "udp", "zmq", or "none" for a Hermes service (it never beats)."""
        return "none" if self.form == codec.HERMES else self.path

    def public(self) -> dict[str, Any]:
        """The service as an info reply tells it: its registration, activity and heartbeats."""
        return {
            **self.info,
            "active": self.active,
            "heartbeat_path": self.heartbeat_path,
            "last_heard": self.last_heard or None,
            "registered_at": self.registered_at,
        }


@dataclass(slots=True)
class Outgoing:
    """What one tick sends: UDP datagrams and ROUTER messages."""

    datagrams: list[tuple[bytes, tuple[str, int]]] = field(default_factory=list)
    messages: list[list[bytes]] = field(default_factory=list)


class CatalogCore:
    """The catalog's registry and rules: messages, UDP heartbeats and time in; replies, heartbeats
    to send and activity out (see the module's text)."""

    def __init__(
        self,
        settings: CatalogSettings,
        clock: Callable[[], float],
        activity: ActivityHandler,
        drop: DropHandler,
    ) -> None:
        self.settings = settings
        self.clock = clock
        self.activity = activity
        self.drop = drop
        self.entries: dict[str, Entry] = {}
        self.by_identity: dict[bytes, str] = {}
        #: Peers that sent an invalid message (bounded): dropped from then on.
        self.invalid: dict[bytes, float] = {}
        self.counts: dict[str, int] = {}
        #: Names of inactive services, the first expired first (who makes room when full).
        self.expired: dict[str, None] = {}
        self.ticks = 0
        #: Whether a tick may judge silence (not the first after a stall of the catalog).
        self.wakes = Wakes(settings.heartbeat_interval, clock)
        #: Set whenever the registry changes (not on beats): the service then saves it.
        self.dirty = False

    def _count(self, what: str) -> None:
        self.counts[what] = self.counts.get(what, 0) + 1

    # -- the ROUTER --------------------------------------------------------------------------

    def on_message(
        self,
        identity: bytes,
        frames: list[bytes],
        peer_address: str | None = None,
        names: frozenset[str] | None = None,
    ) -> list[list[bytes]]:
        """Replies (each starting with the identity) to one message from a peer;
        ``peer_address`` is the connection's IP address, when the transport knows it;
        ``names`` the service names its CURVE key may register (None: any)."""
        if identity in self.invalid:
            self.drop("invalid-peer", "a peer that sent an invalid message", identity)
            return []
        try:
            message = codec.parse(frames)
        except DbpError as error:
            self._mark_invalid(identity)
            self.drop(error.reason, str(error), identity)
            return []
        command = message.command
        self._count(command.decode())
        name = self.by_identity.get(identity)
        if name is not None and name in self.entries and command != codec.DISCONNECT:
            self._heard(self.entries[name], "zmq")
        try:
            if command == codec.INFO_REQUEST:
                return [self._reply(identity, message, codec.INFO_REPLY, self._info(message))]
            if command == codec.REGISTER:
                return _listed(self._register(identity, message, peer_address, names))
            if command == codec.UPDATE:
                return _listed(self._update(identity, message, names))
            if command == codec.HEARTBEAT:
                return self._heartbeat(identity, message)
            if command == codec.DISCONNECT:
                self._disconnect(identity, message)
                return []
        except DbpError as error:
            self._mark_invalid(identity)
            self.drop(error.reason, str(error), identity)
            return []
        # Valid DBP, but a command only the catalog sends.
        self.drop("unexpected", f"{command.decode()} sent to the catalog", identity)
        return [self._disconnect_peer(identity, message)]

    def _mark_invalid(self, identity: bytes) -> None:
        if len(self.invalid) >= 10_000:
            self.invalid.pop(next(iter(self.invalid)))
        self.invalid[identity] = self.clock()

    def _reply(
        self, identity: bytes, message: DbpMessage, command: bytes, body: Any = None
    ) -> list[bytes]:
        # Every DBP message has a body frame, empty when it says nothing more (u.u, </3):
        # Hermes drops a reply without one as an invalid envelope, and so would our codec.
        frames = [
            b"" if body is None else body if isinstance(body, bytes) else codec.json_frame(body)
        ]
        return [identity, *codec.encode(command, self.clock(), frames, message.time_size)]

    def _denied(self, identity: bytes, message: DbpMessage, reasons: list[str]) -> list[bytes]:
        self._count("denied")
        # The original's clients (4-octet time) know DENIED as OmO; the text says (O_O).
        command = codec.DENIED_ORIGINAL if message.time_size == 4 else codec.DENIED
        return self._reply(identity, message, command, {"denied": reasons})

    def _disconnect_peer(self, identity: bytes, message: DbpMessage) -> list[bytes]:
        self._count("disconnect_sent")
        return self._reply(identity, message, codec.DISCONNECT)

    def _info(self, message: DbpMessage) -> dict[str, Any]:
        name = message.text
        if not name:
            return {n: e.public() for n, e in sorted(self.entries.items()) if e.active}
        entry = self.entries.get(name)
        if entry is None or not entry.active:
            state = "expired" if entry is not None else "unknown"
            return {"Error": f"No active service named {name}", "inactive": name, "state": state}
        return {name: entry.public()}

    def _register(
        self,
        identity: bytes,
        message: DbpMessage,
        peer_address: str | None,
        names: frozenset[str] | None = None,
    ) -> list[bytes] | None:
        if not message.body:
            return self._denied(identity, message, ["no service information"])
        try:
            value = codec.json_object(message.body[0])
            info = codec.registration(value, peer_address, self.settings.hermes_heartbeat)
        except DbpError as error:
            return self._denied(identity, message, [str(error)])
        except Invalid as error:
            return self._denied(identity, message, error.reasons)
        refusal = self._refused(info["name"], value.get("token"), names)
        if refusal:
            return self._denied(identity, message, [refusal])
        if info["name"] not in self.entries and not self._make_room():
            self.drop("registry-full", f"{info['name']!r} past --max-services", identity)
            limit = self.settings.max_services
            return self._denied(identity, message, [f"the catalog is full ({limit} services)"])
        now = self.clock()
        old = self.entries.get(info["name"])
        if old is not None and old.identity is not None and old.identity != identity:
            self.by_identity.pop(old.identity, None)
        previous = self.by_identity.get(identity)
        if previous is not None and previous != info["name"]:
            self._remove(previous, "disconnected")
        # Both windows start now: UDP beats are missing only after two intervals without.
        entry = Entry(
            info["name"], info, now, identity, message.time_size, last_udp=now, last_zmq=now
        )
        entry.form = codec.registration_form(value)
        self.entries[entry.name] = entry
        self.expired.pop(entry.name, None)
        self.by_identity[identity] = entry.name
        self.dirty = True
        self.activity("registered", entry.name, entry.public())
        configuration = {
            "heartbeat_interval": self.settings.heartbeat_interval,
            "liveness": self.settings.liveness,
            "udp_port": self.settings.udp_port,
            "catalog_id": self.settings.catalog_id,
        }
        entry.holder = self.settings.catalog_id
        return self._answer(
            entry.name, self._reply(identity, message, codec.APPROVED, configuration), identity
        )

    def _answer(self, name: str, reply: list[bytes], identity: bytes) -> list[bytes] | None:
        """The reply to a change of service ``name`` that ``identity`` asked for: sent now
        (a shared catalog sends it once stored, :mod:`bus.dbp.shared`)."""
        return reply

    def _make_room(self) -> bool:
        """Whether a new name fits, after removing the service that expired first if full."""
        if len(self.entries) < self.settings.max_services:
            return True
        if not self.expired:
            return False
        self._count("evicted")
        self._remove(next(iter(self.expired)), "removed")
        return True

    def _not_yours(self, entry: Entry) -> str:
        """Why an update of ``entry`` from a connection that did not register it is denied."""
        said = (
            f"service {entry.name!r} is registered from another connection: only that"
            " connection may update it"
        )
        if entry.form == codec.HERMES:
            # Hermes sends every request from a new connection.
            said += " (a catalog run with --hermes-services keep takes Hermes' updates by name)"
        return said

    def _keeps_hermes(self, entry: Entry) -> bool:
        return entry.form == codec.HERMES and self.settings.hermes_services == "keep"

    def _refused(self, name: str, token: Any, names: frozenset[str] | None = None) -> str:
        if names is not None and name not in names:
            self._count("forbidden-name")
            return f"this key may not register {name!r}"
        allow = self.settings.allow
        if allow is None:
            return ""
        if name not in allow:
            return f"service {name!r} is not allowed here"
        wanted = allow[name]
        if wanted is not None and token != wanted:
            return f"service {name!r} needs its token"
        return ""

    def _update(
        self, identity: bytes, message: DbpMessage, names: frozenset[str] | None = None
    ) -> list[bytes] | None:
        if not message.body:
            return self._denied(identity, message, ["no values to update"])
        try:
            value = codec.json_object(message.body[0])
        except DbpError as error:
            return self._denied(identity, message, [str(error)])
        name = self.by_identity.get(identity) or value.get("name")
        entry = self.entries.get(name) if isinstance(name, str) else None
        if entry is None:
            return self._denied(identity, message, ["not registered: register (UwU) first"])
        if entry.identity != identity:
            # Hermes sends each request from a new connection: with "keep", a Hermes
            # service's update is taken by its name (and its token, if --allow has one).
            if not self._keeps_hermes(entry):
                return self._denied(identity, message, [self._not_yours(entry)])
            refusal = self._refused(entry.name, value.get("token"), names)
            if refusal:
                return self._denied(identity, message, [refusal])
            value = {k: v for k, v in value.items() if k != "token"}
        if value.get("name", entry.name) != entry.name:
            return self._denied(identity, message, ["a service cannot change its name"])
        try:
            entry.info = codec.merged(entry.info, value)
        except Invalid as error:
            return self._denied(identity, message, error.reasons)
        self.dirty = True
        self.activity("updated", entry.name, entry.public())
        return self._answer(
            entry.name, self._reply(identity, message, codec.ACKNOWLEDGED), identity
        )

    def _heartbeat(self, identity: bytes, message: DbpMessage) -> list[list[bytes]]:
        name = self.by_identity.get(identity)
        if name is None or name not in self.entries:
            # A beat from a peer we do not know (we restarted, or it never registered):
            # DISCONNECT tells it to register again.
            self.drop("unexpected", "heartbeat from an unregistered peer", identity)
            return [self._disconnect_peer(identity, message)]
        return []

    def _disconnect(self, identity: bytes, message: DbpMessage) -> None:
        name = self.by_identity.pop(identity, None)
        if name is not None and name in self.entries:
            self._remove(name, "disconnected")
            return
        # A kept Hermes service unregisters from a new connection: </3 naming it.
        if self.settings.hermes_services != "keep" or not message.body:
            return
        entry = self.entries.get(message.text)
        if entry is not None and self._keeps_hermes(entry):
            self._remove(entry.name, "disconnected")

    def _remove(self, name: str, why: str) -> None:
        entry = self.entries.pop(name, None)
        if entry is None:
            return
        if entry.identity is not None and self.by_identity.get(entry.identity) == name:
            del self.by_identity[entry.identity]
        self.expired.pop(name, None)
        self.dirty = True
        self.activity(why, name, entry.public())
        self._changed(name, entry)

    def _changed(self, name: str, before: Entry) -> None:
        """Service ``name`` (``before`` the change) was removed, expired or heard again (a
        shared catalog stores it, :mod:`bus.dbp.shared`)."""

    # -- UDP ---------------------------------------------------------------------------------

    def on_udp_heartbeat(self, data: bytes, host: str) -> None:
        """A UDP heartbeat from ``host``: the service is heard, unless the datagram is bad, names an
        unknown service or comes from another address (dropped and counted)."""
        try:
            _, name = codec.parse_udp_heartbeat(data)
        except DbpError as error:
            self.drop(error.reason, str(error), host)
            return
        entry = self.entries.get(name)
        if entry is None:
            self.drop("udp-unknown", f"UDP heartbeat for unknown service {name!r}", host)
            return
        if entry.info.get("address") not in (host, "0.0.0.0", "*") and not _local(host, entry):
            self.drop("udp-address", f"heartbeat for {name!r} from {host}", host)
            return
        self._heard(entry, "udp")

    def _heard(self, entry: Entry, path: str) -> None:
        now = self.clock()
        if path == "udp":
            entry.last_udp = now
            entry.path = "udp"
        else:
            entry.last_zmq = now
        if not entry.active:
            entry.active = True
            entry.expired_at = None
            self.expired.pop(entry.name, None)
            self.activity("active", entry.name, entry.public())
            self._changed(entry.name, entry)
        else:
            self._refresh(entry, now)

    def _refresh(self, entry: Entry, now: float) -> None:
        """A service heard (a shared catalog writes so now and then)."""

    def _silent_for(self, entry: Entry, now: float) -> float:
        """Seconds since the service was last heard, as far as this catalog knows."""
        return now - entry.last_heard

    def _beats(self, entry: Entry) -> bool:
        """Whether this catalog beats the service (in a shared catalog, its holder only)."""
        return True

    # -- time --------------------------------------------------------------------------------

    def tick(self) -> Outgoing:
        """Every heartbeat interval: beat every active service, expire and remove (not at a
        late tick: see the module's text)."""
        now = self.clock()
        judging = self.wakes.judging()
        out = Outgoing()
        settings = self.settings
        self.ticks += 1
        beat = codec.encode_udp_heartbeat(settings.catalog_id, now)
        for entry in list(self.entries.values()):
            interval = float(entry.info["heartbeat"])
            if not entry.active:
                expired_at = entry.expired_at
                if judging and expired_at is not None and now - expired_at >= settings.grace:
                    self._remove(entry.name, "removed")
                continue
            if self._keeps_hermes(entry):
                continue
            if judging and self._silent_for(entry, now) >= settings.liveness * interval:
                entry.active = False
                entry.expired_at = now
                self.expired[entry.name] = None
                self.dirty = True
                self.activity("expired", entry.name, entry.public())
                self._changed(entry.name, entry)
                continue
            if entry.form == codec.HERMES or not self._beats(entry):
                continue  # its service neither listens for beats nor keeps its connection
            port = int(entry.info.get("heartbeat_port") or entry.info["port"])
            if port:
                out.datagrams.append((beat, (str(entry.info["address"]), port)))
            if judging and now - entry.last_udp >= 2 * interval and entry.path != "zmq":
                entry.path = "zmq"
                self._count("fallbacks")
            if entry.path == "zmq" and entry.identity is not None:
                body = [settings.catalog_id.encode()]
                out.messages.append(
                    [entry.identity, *codec.encode(codec.HEARTBEAT, now, body, entry.time_size)]
                )
        return out

    # -- the registry on disk ----------------------------------------------------------------

    def snapshot(self) -> dict[str, Any]:
        """The registry as saved in the data directory."""
        return {
            name: {"info": entry.info, "registered_at": entry.registered_at, "form": entry.form}
            for name, entry in self.entries.items()
        }

    def restore(self, saved: Mapping[str, Any]) -> int:
        """Services saved before a restart: inactive until they beat (or register) again."""
        now = self.clock()
        restored = 0
        for name, record in saved.items():
            if len(self.entries) >= self.settings.max_services:
                break
            try:
                info = codec.registration(record["info"])
                registered_at = float(record.get("registered_at", now))
                form = codec.HERMES if record.get("form") == codec.HERMES else codec.SPEC
            except (Invalid, KeyError, TypeError, ValueError, AttributeError):
                continue
            entry = Entry(name, info, registered_at, active=False, expired_at=now, form=form)
            self.entries[name] = entry
            if self._keeps_hermes(entry):
                entry.active, entry.expired_at = True, None  # kept until it unregisters
            else:
                self.expired[name] = None
            restored += 1
        return restored


def _listed(reply: list[bytes] | None) -> list[list[bytes]]:
    return [] if reply is None else [reply]


def _local(host: str, entry: Entry) -> bool:
    """A service registered as 127.0.0.1 or localhost beats from some loopback address."""
    return host.startswith("127.") and str(entry.info.get("address")) in ("localhost", "127.0.0.1")
