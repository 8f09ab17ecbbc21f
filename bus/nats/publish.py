"""A batch published to a JetStream stream on a blocking connection, in one of two ways:

- **atomic** (a stream made with ``allow_atomic``, nats-server 2.12+): up to
  :data:`bus.nats.jsapi.ATOMIC_LIMIT` messages as one of JetStream's atomic
  batches, stored together or not at all, one acknowledgement for all of them (the batch
  is one proposal to the stream's replicas, not one per message);
- **each**: every message with a reply subject of its own, the acknowledgements read as
  they come (the stream's sequence from each, without a JSON parse unless it is an
  error). JetStream refuses an atomic batch that holds an id it already stored (a resend
  after a failover): such a batch goes this way, where the stream drops each repeat.

Either every message of the batch was stored (each one's sequence, or the first
sequence of one the stream already held under its ``Nats-Msg-Id``) or
:class:`PublishError` says why: nothing of the batch may then be taken as stored, and a
resend of it is deduplicated by the ids.
"""

from __future__ import annotations

import itertools
import os
import time
from collections.abc import Callable, Iterator, Sequence

from bus.nats import codec, jsapi
from bus.nats.blocking import Connection
from bus.nats.codec import Msg

NO_RESPONDERS = 503
_COUNT = b'"count":'
#: An acknowledgement this late makes the publisher ask the stream, every as long again,
#: whether its leader changed since the batch was sent: a leader that steps down (asked
#: to, or for a higher term when a cut-off follower's link comes back) drops the batches
#: in flight unanswered, which would otherwise be waited for until the timeout (5 s) while
#: the new leader already stores.
LATE = 1.0


class PublishError(Exception):
    """The batch was not acknowledged whole."""


class TooLarge(ValueError):
    """Messages of the batch larger than the server takes (``max_payload``, headers
    included): nothing of the batch was sent, which a larger one would cost the
    connection."""

    def __init__(self, indexes: list[int], limit: int) -> None:
        super().__init__(f"{len(indexes)} messages larger than the {limit} bytes the server takes")
        #: Where those messages are in the batch.
        self.indexes = indexes
        self.limit = limit


class _Repeated(Exception):
    """JetStream refused an atomic batch for an id it holds already (or twice in it)."""


Messages = Sequence[tuple[bytes, bytes, bytes]]


class Publisher:
    """Publishes batches through one connection (one caller at a time); ``atomic`` when
    the stream allows atomic batches."""

    def __init__(self, connection: Connection, atomic: bool = False, stream: str = "") -> None:
        self.connection = connection
        self.atomic = atomic
        #: The stream's name: with it, a late acknowledgement has the stream asked whether
        #: its leader changed since the batch was sent (:data:`LATE`).
        self.stream = stream
        self._prefix = connection.new_inbox().encode() + b"."
        self._numbers = itertools.count(1)
        self._batch_tag = os.urandom(6).hex().encode()
        #: Batches that went message by message because JetStream refused them atomic.
        self.resent_each = 0

    def publish(self, messages: Messages, timeout: float) -> list[int]:
        """``messages``: (subject, message id, body) each; the stream's sequences, in order.
        :class:`TooLarge` (nothing sent) when some cannot fit in one message."""
        limit = self.connection.max_payload
        room = limit - jsapi.headers_most(b"")  # for the body and the id, either way
        if any(len(body) + len(msg_id) > room for _, msg_id, body in messages):
            over = [
                index
                for index, (_, msg_id, body) in enumerate(messages)
                if len(body) + len(msg_id) > room
            ]
            raise TooLarge(over, limit)
        if not self.atomic:
            return self._each(messages, timeout)
        deadline = time.monotonic() + timeout
        sequences: list[int] = []
        for start in range(0, len(messages), jsapi.ATOMIC_LIMIT):
            chunk = messages[start : start + jsapi.ATOMIC_LIMIT]
            try:
                sequences.extend(self._atomic(chunk, max(0.001, deadline - time.monotonic())))
            except _Repeated:
                self.resent_each += 1
                sequences.extend(self._each(chunk, max(0.001, deadline - time.monotonic())))
        return sequences

    def _atomic(self, messages: Messages, timeout: float) -> list[int]:
        if not messages:
            return []
        number = next(self._numbers)
        reply = self._prefix + b"%d" % number
        batch = self._batch_tag + b"-%d" % number
        last = len(messages)
        self.connection.send(jsapi.batch_publishes(messages, batch, reply))
        for message in self._replies(timeout, lambda: "an atomic batch"):
            if message.subject != reply:
                continue
            payload = message.payload
            error = jsapi.refused(payload)
            if error is not None:
                if error.err_code == jsapi.DUPLICATE_IN_BATCH:
                    raise _Repeated()
                raise PublishError(str(error))
            top, count = jsapi.number_in(payload, jsapi.SEQ_KEY), jsapi.number_in(payload, _COUNT)
            if top is None or count != last:
                raise PublishError(f"not an acknowledgement of the batch: {payload[:200]!r}")
            # An atomic batch is stored in one piece: its sequences run up to the top.
            return list(range(top - last + 1, top + 1))
        raise AssertionError("unreachable: _replies ends only by raising")

    def _replies(self, timeout: float, owed: Callable[[], str]) -> Iterator[Msg]:
        """Answers on our reply subjects as they come, for as long as the caller reads
        them; :class:`PublishError` once ``timeout`` has passed (``owed`` says what was
        still missing), when nobody serves the stream, or when the stream's leader changed
        since (a late answer has it asked: :data:`LATE`)."""
        connection = self.connection
        sent = time.monotonic()
        deadline = sent + timeout
        check = sent + LATE if self.stream else deadline
        while True:
            now = time.monotonic()
            remaining = deadline - now
            if remaining <= 0:
                raise PublishError(f"no acknowledgement in {timeout:g}s ({owed()})")
            if now >= check:
                check = now + LATE
                if self._leader_newer_than(now - sent, min(LATE, remaining)):
                    raise PublishError(
                        f"the stream's leader changed while {owed()} was unanswered "
                        f"after {now - sent:.1f}s: sent again"
                    )
                continue
            try:
                arrived = connection.read(min(remaining, check - now))
            except TimeoutError:
                continue
            for message in arrived:
                if not isinstance(message, Msg) or message.sid != connection.reply_sid:
                    continue  # a run of deliveries to a reader on the same connection
                if message.headers and codec.status(message.headers) == NO_RESPONDERS:
                    raise PublishError("no response from stream (no leader, or none elected yet)")
                yield message

    def _leader_newer_than(self, seconds: float, wait: float) -> bool:
        """Whether the stream's leader took over less than ``seconds`` ago (its answer
        waited for ``wait`` seconds: none, with an election under way, is no)."""
        try:
            answer = self.connection.request(jsapi.stream_info(self.stream), b"", wait)
            led = jsapi.leader_for(jsapi.answer(answer.payload))
        except (TimeoutError, ConnectionRefusedError, jsapi.JetStreamError, ValueError):
            return False
        return led is not None and led < seconds

    def _each(self, messages: Messages, timeout: float) -> list[int]:
        if not messages:
            return []
        prefix = self._prefix
        first = next(self._numbers)
        self._numbers = itertools.count(first + len(messages))
        frames = []
        for offset, (subject, msg_id, body) in enumerate(messages):
            headers = jsapi.msg_id_headers(msg_id)
            frames.append(codec.hpub(subject, headers, body, prefix + b"%d" % (first + offset)))
        sequences = [0] * len(messages)
        left = len(messages)
        self.connection.send(b"".join(frames))
        skip = len(prefix)

        def owed() -> str:
            return f"{left} still owed"

        for message in self._replies(timeout, owed):
            if not message.subject.startswith(prefix):
                continue
            index = int(message.subject[skip:]) - first
            if not 0 <= index < len(messages) or sequences[index]:
                continue  # an answer to an earlier batch, after its deadline
            try:
                sequences[index] = jsapi.stored_sequence(message.payload)
            except (jsapi.JetStreamError, ValueError) as error:
                raise PublishError(str(error)) from None
            left -= 1
            if not left:
                return sequences
        raise AssertionError("unreachable: _replies ends only by raising")
