"""One catalog shared by several instances (``twistd -n dbp --nats URLS``), sans I/O: the
catalog's state machine (:class:`bus.dbp.core.CatalogCore`) whose registry is a JetStream
key-value bucket that every instance watches.

**Stored, then answered.** A registration, an update, an unregistration, an expiry or a
removal changes this instance's view and becomes a write of the service's key; ``OwO``
and ``u.u`` go once the bucket stored it, ``DENIED`` (and the view as the bucket last said)
when it did not. The bucket's changes, from any instance, come back through the watch and
set each instance's view: every instance answers every request from the shared catalog.

**Heartbeats without a write each.** The instance a service registered with holds it: it
hears its beats (UDP, or its ZeroMQ connection), beats it, and writes ``heard_at`` (when it
last heard it) into the key only when the stored one is ``refresh`` seconds old: a service
costs one write per ``refresh`` (5 s by default), not one per beat, and none from the other
instances. An instance that holds the service expires it when it has been silent for
``liveness`` of its heartbeats, as alone; one that does not, when ``heard_at`` is older than
that plus :attr:`SharedCatalogCore.not_held_grace` (two refreshes and ``2 x liveness + 1``
of the catalog's intervals). Whichever instance sees it first writes the expiry, and later
the removal, by compare-and-set on the revision it read: the others' writes are refused,
nothing is written twice. A service whose holder died is expired by the others from
``heard_at``; one that moves as :class:`bus.dbp.client.ServiceRegistration` given several
catalogs does (to the next after ``2 x liveness`` of the catalog's intervals of silence) is
never seen expired, even when the holder's last write was a refresh old and the new
registration takes up to a refresh to be stored.

**No stale answers.** The I/O side says whether this instance's view is current
(:attr:`SharedCatalogCore.current`: connected, its watch caught up and heard within three of
its idle heartbeats); while it is not, an info request is answered with an ``Error`` that
says so, never from the view. A new watch (after a reconnection, a silence) sends every key
again: keys it did not send are gone from the view when it has caught up.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from bus.dbp import codec
from bus.dbp.codec import DbpMessage
from bus.dbp.config import DEFAULT_REFRESH
from bus.dbp.core import CatalogCore, Entry

#: What an info request is answered while the view may be stale.
NOT_CURRENT = "this catalog instance is not in touch with the shared catalog now: ask another"


@dataclass(slots=True)
class Write:
    """A service's key to store: its record (None: delete it), only if the key is at
    ``expected`` (None: whatever it is), and the reply that waits for it."""

    name: str
    value: bytes | None
    expected: int | None
    reply: list[bytes] | None = None
    identity: bytes = b""
    time_size: int = codec.TIME_DOUBLE


def encode(entry: Entry) -> bytes:
    """A service's key in the bucket (JSON)."""
    record = {
        "info": entry.info,
        "registered_at": entry.registered_at,
        "form": entry.form,
        "heard_at": entry.heard_at,
        "holder": entry.holder,
        "expired_at": None if entry.active else entry.expired_at,
    }
    return json.dumps(record, sort_keys=True, separators=(",", ":")).encode()


def decode(name: str, value: bytes) -> Entry:
    """An entry from its key; ValueError for a value no instance wrote."""
    try:
        record = json.loads(value)
        info = codec.registration(record["info"])
        expired_at = record.get("expired_at")
        entry = Entry(
            name,
            info,
            float(record["registered_at"]),
            form=codec.HERMES if record.get("form") == codec.HERMES else codec.SPEC,
            heard_at=float(record.get("heard_at") or 0.0),
            holder=str(record.get("holder") or ""),
        )
    except (KeyError, TypeError, ValueError, AttributeError, codec.Invalid) as error:
        raise ValueError(f"service {name!r}: not a catalog entry ({error})") from None
    if info["name"] != name:
        raise ValueError(f"key {name!r} holds service {info['name']!r}")
    if expired_at is not None:
        entry.active = False
        entry.expired_at = float(expired_at)
    return entry


class SharedCatalogCore(CatalogCore):
    """The catalog whose registry is shared through a bucket (see the module's text)."""

    def __init__(self, *core: Any, refresh: float = DEFAULT_REFRESH) -> None:
        """``core``: :class:`bus.dbp.core.CatalogCore`'s arguments; ``refresh``: how often a
        service this instance hears is written to be heard."""
        super().__init__(*core)
        self.refresh = refresh
        #: Whether this instance's view is the shared catalog's (set by the I/O side).
        self.current = False
        #: Asked at each info request too: whether the watch was heard lately (a process
        #: resumed after a stop reads its requests before its timers run).
        self.fresh: Callable[[], bool] = lambda: True
        #: Writes to send (the I/O side takes them: :meth:`take_writes`).
        self.writes: list[Write] = []
        #: Writes sent and not answered yet, by service.
        self.pending: dict[str, int] = {}
        #: Each key as the bucket last said: its record and revision.
        self.stored: dict[str, tuple[bytes, int]] = {}
        #: The keys a new watch has sent so far (None: no watch starting).
        self._replayed: set[str] | None = None
        self.writes_sent = 0
        self.writes_refused = 0
        self.bad_records = 0
        #: Info requests answered "not current".
        self.not_current_answers = 0

    @property
    def me(self) -> str:
        """This instance's id (its catalog id)."""
        return self.settings.catalog_id

    # -- changes become writes -----------------------------------------------------------------

    def _write(self, name: str, entry: Entry | None, expected: int | None, **reply: Any) -> None:
        value = encode(entry) if entry is not None else None
        self.writes.append(Write(name, value, expected, **reply))
        self.pending[name] = self.pending.get(name, 0) + 1

    def _answer(self, name: str, reply: list[bytes], identity: bytes) -> list[bytes] | None:
        entry = self.entries[name]
        entry.heard_at = max(entry.heard_at, self.clock())  # any command counts as a beat
        entry.holder = self.me
        time_size = len(reply[3]) if len(reply) > 3 else codec.TIME_DOUBLE
        self._write(name, entry, None, reply=reply, identity=identity, time_size=time_size)
        return None

    def _changed(self, name: str, before: Entry) -> None:
        entry = self.entries.get(name)
        self._write(name, entry, before.revision)

    def _refresh(self, entry: Entry, now: float) -> None:
        if now - entry.heard_at < self.refresh or self.pending.get(entry.name):
            return
        entry.heard_at = now
        entry.holder = self.me
        self._write(entry.name, entry, entry.revision)

    @property
    def not_held_grace(self) -> float:
        """What an instance that does not hold a service adds to its silence before it judges
        it: the holder's last write may be a refresh old; a service whose holder died moves to
        another instance after ``2 x liveness`` of the catalog's intervals (judged at its own
        ticks, an interval more); and its registration there takes a write, allowed a refresh."""
        settings = self.settings
        return 2 * self.refresh + (2 * settings.liveness + 1) * settings.heartbeat_interval

    def _silent_for(self, entry: Entry, now: float) -> float:
        silent = now - entry.last_heard
        return silent if entry.holder == self.me else silent - self.not_held_grace

    def _beats(self, entry: Entry) -> bool:
        return entry.holder == self.me

    def _info(self, message: DbpMessage) -> dict[str, Any]:
        if not (self.current and self.fresh()):
            self.not_current_answers += 1
            return {"Error": NOT_CURRENT, "unavailable": True}
        return super()._info(message)

    def take_writes(self) -> list[Write]:
        """The writes to send now."""
        writes, self.writes = self.writes, []
        self.writes_sent += len(writes)
        return writes

    # -- the bucket's answers ------------------------------------------------------------------

    def stored_ok(self, write: Write, revision: int) -> list[bytes] | None:
        """``write`` is stored at ``revision``: the reply that waited for it (if any)."""
        self._settled(write.name)
        if write.value is None:
            self.stored.pop(write.name, None)
        else:
            self.stored[write.name] = (write.value, revision)
        entry = self.entries.get(write.name)
        if entry is not None and entry.revision < revision:
            entry.revision = revision
        return write.reply

    def store_failed(self, write: Write, reason: str) -> list[bytes] | None:
        """``write`` was refused (or not answered): the view as the bucket last said, and
        a DENIED for the peer whose change it was (if any)."""
        self._settled(write.name)
        self.writes_refused += 1
        if not self.pending.get(write.name):
            stored = self.stored.get(write.name)
            self._set(write.name, stored[0] if stored else None, stored[1] if stored else 0)
        if write.reply is None:
            return None
        self._count("denied")
        command = codec.DENIED_ORIGINAL if write.time_size == 4 else codec.DENIED
        body = codec.json_frame({"denied": [f"the shared catalog did not store it ({reason})"]})
        return [write.identity, *codec.encode(command, self.clock(), [body], write.time_size)]

    def _settled(self, name: str) -> None:
        left = self.pending.get(name, 0) - 1
        if left > 0:
            self.pending[name] = left
        else:
            self.pending.pop(name, None)

    # -- the watch -----------------------------------------------------------------------------

    def replay_started(self) -> None:
        """A new watch: every key comes again."""
        self._replayed = set()

    def replay_done(self) -> None:
        """The new watch sent every key: those it did not are gone."""
        replayed, self._replayed = self._replayed, None
        if replayed is None:
            return
        for name in [n for n in self.entries if n not in replayed and not self.pending.get(n)]:
            self._set(name, None, 0)
        for name in [n for n in self.stored if n not in replayed]:
            del self.stored[name]

    def apply(self, name: str, value: bytes | None, revision: int) -> None:
        """A key as the bucket holds it now (None: deleted), from the watch."""
        if self._replayed is not None:
            self._replayed.add(name)
        if value is None:
            self.stored.pop(name, None)
        else:
            self.stored[name] = (value, revision)
        if self.pending.get(name):
            return  # this instance's own write decides (its answer, then its echo)
        entry = self.entries.get(name)
        if entry is not None and revision <= entry.revision:
            return  # older than what this instance wrote and heard back
        self._set(name, value, revision)

    def _set(self, name: str, value: bytes | None, revision: int) -> None:
        """This instance's view of ``name`` made what the bucket holds (no activity: the
        instance that changed it told its own bus)."""
        old = self.entries.pop(name, None)
        self.expired.pop(name, None)
        if (
            old is not None
            and old.identity is not None
            and self.by_identity.get(old.identity) == name
        ):
            del self.by_identity[old.identity]
        if value is None:
            return
        try:
            entry = decode(name, value)
        except ValueError as error:
            self.bad_records += 1
            self.drop("bad-record", str(error), "bucket")
            return
        entry.revision = revision
        if old is not None and entry.holder == self.me:
            # Still held here: what this instance heard and its connection stay.
            entry.identity, entry.time_size, entry.path = old.identity, old.time_size, old.path
            entry.last_udp, entry.last_zmq = old.last_udp, old.last_zmq
            if entry.identity is not None:
                self.by_identity[entry.identity] = name
        if not entry.active:
            self.expired[name] = None
        self.entries[name] = entry
