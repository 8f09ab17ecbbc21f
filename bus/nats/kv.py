"""JetStream key-value buckets on the reactor: what eMQP's schedules and DBP's catalog keep
in one (a standard bucket: ``nats kv`` reads it).

A bucket ``B`` is stream ``KV_B`` with subjects ``$KV.B.<key>``, one value kept per key; a
key here is any bytes, made one subject token (:func:`bus.nats.tokens.token`). A put is a
publish to the key's subject, acknowledged once stored; with ``expected``, only if the key
is still at that revision (compare-and-set; JetStream refuses it otherwise,
:data:`WRONG_LAST_SEQUENCE`); a delete is a put with ``KV-Operation: DEL`` (a marker the
watches see).

:class:`Watch` sends the bucket's current keys, then each change, to its callback: a push
consumer delivering to an inbox of its own. A change lost on the way (the consumer's
sequence skips) makes a new watch, which sends every key again; so does a reconnection.
:attr:`Watch.caught_up` says when the keys there were at its start have all come.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from twisted.internet import defer
from twisted.logger import Logger
from twisted.python.failure import Failure

from bus.errors import StartupError
from bus.nats import codec, jsapi
from bus.nats.client import NatsClient, Subscription, stream_ready
from bus.nats.codec import Msg
from bus.nats.tokens import SubjectError, token, untoken

__all__ = [
    "DELETE",
    "WRONG_LAST_SEQUENCE",
    "Watch",
    "bucket_config",
    "bucket_ready",
    "key_of",
    "key_subject",
    "put",
    "watch_config",
]

log = Logger(namespace="bus.nats.kv")

#: JetStream's error for a compare-and-set whose key is no longer at the revision given.
WRONG_LAST_SEQUENCE = 10071
#: A delete's ``KV-Operation``.
DELETE = b"DEL"


def bucket_config(bucket: str, replicas: int, duplicate_window: float) -> dict[str, Any]:
    """The stream behind bucket ``bucket`` (one value per key, as ``nats kv`` makes it)."""
    return {
        "name": f"KV_{bucket}",
        "subjects": [f"$KV.{bucket}.>"],
        "retention": "limits",
        "storage": "file",
        "num_replicas": replicas,
        "max_msgs_per_subject": 1,
        "discard": "new",
        "allow_rollup_hdrs": True,
        "deny_delete": True,
        "deny_purge": False,
        "allow_direct": True,
        "duplicate_window": int(duplicate_window * 1e9),
    }


def bucket_ready(
    client: NatsClient, bucket: str, replicas: int, duplicate_window: float, option: str
) -> defer.Deferred[None]:
    """Bucket ``bucket`` made when missing (asked again while JetStream cannot answer yet,
    up to three connect timeouts); a refusal, or no answer, is a start-up error naming
    ``option`` (the client is stopped then)."""
    config = bucket_config(bucket, replicas, duplicate_window)
    made = defer.ensureDeferred(stream_ready(client, config, 3 * client.connect_timeout))

    def failed(failure: Failure) -> None:
        if not isinstance(failure.value, jsapi.JetStreamError | TimeoutError):
            failure.raiseException()
        client.stop()
        raise StartupError(option, f"KV_{bucket}: {failure.value}")

    return made.addCallbacks(lambda _: None, failed)


def key_subject(bucket: str, key: bytes) -> str:
    """The subject of ``key`` in ``bucket``."""
    return f"$KV.{bucket}.{token(key)}"


def key_of(bucket: str, subject: str) -> bytes:
    """The key of a subject of ``bucket``; :class:`SubjectError` for another subject."""
    head = f"$KV.{bucket}."
    if not subject.startswith(head):
        raise SubjectError(f"{subject[:80]!r} is not a key of {bucket}")
    return untoken(subject[len(head) :])


def watch_config(bucket: str, deliver: str, idle_heartbeat: float = 0.0) -> dict[str, Any]:
    """A push consumer that sends the bucket's current keys, then each change, to
    ``deliver``: no acks, in memory, gone soon after its client. With ``idle_heartbeat``,
    the server says it is there that often when nothing changes."""
    config: dict[str, Any] = {
        "deliver_subject": deliver,
        "deliver_policy": "last_per_subject",
        "filter_subject": f"$KV.{bucket}.>",
        "ack_policy": "none",
        "replay_policy": "instant",
        "mem_storage": True,
        "num_replicas": 1,
        "inactive_threshold": 10_000_000_000,
        "headers_only": False,
    }
    if idle_heartbeat > 0:
        config["idle_heartbeat"] = int(idle_heartbeat * 1e9)
    return {"stream_name": f"KV_{bucket}", "config": config}


def put(
    client: NatsClient,
    bucket: str,
    key: bytes,
    value: bytes | None,
    expected: int | None = None,
    timeout: float = 5.0,
) -> defer.Deferred[int]:
    """Put ``value`` at ``key`` (None: delete it); with ``expected``, only if the key is at
    that revision (0: if it has none). Fires with the new revision, or fails:
    :class:`bus.nats.jsapi.JetStreamError` (a refusal), the client's errors."""
    fields: dict[bytes, bytes] = {}
    if value is None:
        fields[b"KV-Operation"] = DELETE
    if expected is not None:
        fields[b"Nats-Expected-Last-Subject-Sequence"] = str(expected).encode()
    headers = codec.header_block(fields) if fields else b""
    asked = client.request(
        key_subject(bucket, key).encode(), value or b"", headers, timeout=timeout
    )
    return asked.addCallback(lambda msg: int(jsapi.answer(msg.payload).get("seq", 0)))


def _nothing() -> None:
    pass


def _ignored(_: str) -> None:
    pass


#: What a watch hands over for each key: the key, its value (None: deleted), its revision.
Entry = Callable[[bytes, "bytes | None", int], None]


@dataclass(eq=False)
class Watch:
    """The keys of a bucket, then their changes, to ``on_entry`` (see the module's text).

    ``inbox``: this watch's own subject prefix (each generation adds a token).
    ``on_start``: called as each new watch begins (before its keys come), so that the
    caller knows every key will come again; ``on_caught_up`` once they all have.
    """

    client: NatsClient
    bucket: str
    inbox: str
    on_entry: Entry
    #: Called as each new watch begins: every key will come again.
    on_start: Callable[[], None] = field(default_factory=lambda: _nothing)
    #: Called once every key there was at the watch's start has come.
    on_caught_up: Callable[[], None] = field(default_factory=lambda: _nothing)
    #: Called with what was wrong with a message that is no key of the bucket.
    on_bad: Callable[[str], None] = field(default_factory=lambda: _ignored)
    #: With it, the server says it is there that often when nothing changes.
    idle_heartbeat: float = 0.0
    #: The consumer now ("" before JetStream made one) and what it said it still held at
    #: its last delivery.
    consumer: str = field(default="", init=False)
    pending: int | None = field(default=None, init=False)
    #: Whether every key there was at the watch's start has come.
    caught_up: bool = field(default=False, init=False)
    #: When the watch last heard anything (a change or the server's idle heartbeat), in the
    #: reactor's seconds.
    heard_at: float = field(default=0.0, init=False)
    #: Watches made again (a lost change, a reconnection, a silence).
    restarts: int = field(default=0, init=False)
    _generation: int = field(default=0, init=False)
    _subscription: Subscription | None = field(default=None, init=False)
    _retry: Any = field(default=None, init=False)
    _sequence: int = field(default=0, init=False)
    _stopped: bool = field(default=False, init=False)

    def start(self) -> defer.Deferred[Any]:
        """(Again) the bucket's keys, then its changes. The watch before is no longer listened
        to (its consumer, without interest, is dropped after its inactive threshold): two
        watches' deliveries never meet, and one retry waits at a time."""
        self._sequence = 0
        self._generation += 1
        generation = self._generation
        self.caught_up = False
        self.heard_at = self.client.reactor.seconds()
        inbox = f"{self.inbox}.{generation}"
        if self._subscription is not None:
            self.client.unsubscribe(self._subscription)
        self._subscription = self.client.subscribe(inbox, self._changed)
        self.on_start()
        config = watch_config(self.bucket, inbox, self.idle_heartbeat)
        watching = self.client.jetstream(f"{jsapi.API}.CONSUMER.CREATE.KV_{self.bucket}", config)

        def made(info: dict[str, Any]) -> None:
            if generation != self._generation:
                return
            self.consumer = str(info.get("name", ""))
            self.pending = None
            if int(info.get("num_pending", 0)) == 0 and self._sequence == 0:
                self._caught_up()

        def failed(failure: Failure) -> None:
            if generation != self._generation:
                return  # a later watch was asked for meanwhile
            log.warn(
                "JetStream: bucket {bucket} not watched yet ({error}); again soon",
                bucket=self.bucket,
                error=failure.getErrorMessage(),
            )
            if self._retry is None or not self._retry.active():
                self._retry = self.client.reactor.callLater(1.0, self.again)

        return watching.addCallbacks(made, failed)

    def again(self) -> None:
        """A new watch, when connected (after a reconnection, a silence)."""
        if self.client.connected and not self._stopped:
            self.restarts += 1
            self.start()

    def stop(self) -> None:
        """No more keys or changes."""
        self._stopped = True
        if self._retry is not None and self._retry.active():
            self._retry.cancel()
        if self._subscription is not None:
            self.client.unsubscribe(self._subscription)
            self._subscription = None

    def _caught_up(self) -> None:
        if not self.caught_up:
            self.caught_up = True
            self.on_caught_up()

    def _changed(self, msg: Msg) -> None:
        self.heard_at = self.client.reactor.seconds()
        if codec.status(msg.headers):
            return  # an idle heartbeat or flow control: nothing changed
        try:
            delivery = jsapi.delivery(msg.reply)
            consumer_sequence = jsapi.consumer_sequence(msg.reply)
            key = key_of(self.bucket, msg.subject.decode())
        except (ValueError, UnicodeDecodeError) as error:
            self.on_bad(str(error))
            return
        if consumer_sequence != self._sequence + 1:
            # A change lost on its way (a push consumer's messages are not resent): the
            # whole bucket again.
            self.again()
            return
        self._sequence = consumer_sequence
        self.pending = delivery.pending
        operation = codec.header(msg.headers, b"KV-Operation") if msg.headers else None
        self.on_entry(key, None if operation else msg.payload, delivery.stream_sequence)
        if delivery.pending == 0:
            self._caught_up()
