"""Messages stored at the stream sequences given, on a blocking connection: what an
import into a new stream needs to keep another log's sequence numbers.

Each message (or each atomic batch, by its first message) carries
``Nats-Expected-Last-Sequence``, the sequence before its own, so the stream stores it
only right after the one before: a message is stored at its place or not at all, never
shifted by what another writer appends meanwhile (the caller checks what the stream
holds after a refusal). The messages go pipelined, :attr:`SequencedPublisher.window`
unacknowledged at most, each acknowledgement naming in its reply subject the sequence it
was sent for: one connection carries tens of thousands a second without a round trip
per message.

Two ways, as the front-ends append (:mod:`bus.nats.publish`): a message at a time, or
(``atomic``, a stream with ``allow_atomic``) JetStream's atomic batches of up to
:data:`bus.nats.jsapi.ATOMIC_LIMIT`, one acknowledgement and one proposal to the replicas
each: measured here on an R3 stream, 0.6 x the servers' CPU per message of one at a time.

A message with a ``Nats-Msg-Id`` the stream holds already within its duplicate window
is not stored (the stream answers "duplicate"): :class:`Repeated` names its sequence (a
batch holding one is refused whole: :class:`Repeated` names the batch's first), and the
caller sends from there again, without that id.
"""

from __future__ import annotations

import itertools
import os
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from typing import NamedTuple

from bus.nats import codec, jsapi
from bus.nats.blocking import Connection
from bus.nats.codec import Msg
from bus.nats.publish import NO_RESPONDERS, PublishError, TooLarge

#: JetStream's refusal of a message whose expected last sequence is not the stream's.
WRONG_LAST_SEQUENCE = 10071
_DUPLICATE = b'"duplicate"'
_COUNT = b'"count":'
#: How an acknowledgement of a message stored at its sequence ends.
_STORED_AT = b'"seq":%d}'

_WITH_ID = b"NATS/1.0\r\nNats-Msg-Id: %s\r\nNats-Expected-Last-Sequence: %d\r\n\r\n"
_WITHOUT_ID = b"NATS/1.0\r\nNats-Expected-Last-Sequence: %d\r\n\r\n"
#: An ``HPUB`` whose reply subject is the inbox's prefix and a sequence.
_HPUB = b"HPUB %s %s%d %d %d\r\n%s%s\r\n"
_HPUB_NO_REPLY = b"HPUB %s %d %d\r\n%s%s\r\n"
# An atomic batch's message: its id (or none), the batch and its place, the expected last
# sequence on the first, the commit on the last.
_BATCH = b"NATS/1.0\r\n%sNats-Batch-Id: %s\r\nNats-Batch-Sequence: %d\r\n%s%s\r\n"


class Placed(NamedTuple):
    """A message and the stream sequence it must be stored at."""

    sequence: int
    subject: bytes
    #: Its ``Nats-Msg-Id`` (empty: none).
    msg_id: bytes
    body: bytes


class Repeated(PublishError):
    """The stream holds a message with the id of the one for :attr:`sequence` (within its
    duplicate window; in an atomic batch, one of the batch starting there) and stored
    nothing there; nothing sent after it was stored."""

    def __init__(self, sequence: int, batch: bool = False) -> None:
        where = "a message of the batch from" if batch else "the message for"
        super().__init__(f"the stream holds the id of {where} sequence {sequence}")
        self.sequence = sequence
        #: Whether it names an atomic batch's first message (which one repeats is not said).
        self.batch = batch


class Misplaced(PublishError):
    """The stream did not store the message for :attr:`sequence` there: its last sequence
    was another (another writer, or a stream not as the caller believed)."""

    def __init__(self, sequence: int, answer: str) -> None:
        super().__init__(f"sequence {sequence} was not stored there: {answer}")
        self.sequence = sequence


def headers(msg_id: bytes, previous: int) -> bytes:
    """The header block of a message to store right after ``previous`` (with its id, when
    it has one)."""
    return _WITH_ID % (msg_id, previous) if msg_id else _WITHOUT_ID % previous


#: The most bytes of a header block either way makes beyond the id.
HEADERS_BEYOND_ID = max(
    len(headers(b"", 2**64 - 1)),
    len(_BATCH % (b"Nats-Msg-Id: \r\n", b"f" * 12 + b"-" + b"9" * 20, 1000,
                  b"Nats-Expected-Last-Sequence: %d\r\n" % (2**64 - 1),
                  b"Nats-Batch-Commit: 1\r\n")),
)  # fmt: skip


class SequencedPublisher:
    """Publishes :class:`Placed` messages in order through one connection (one caller at
    a time); ``atomic``: as atomic batches (the stream must allow them)."""

    def __init__(self, connection: Connection, window: int = 16_000, atomic: bool = False) -> None:
        self.connection = connection
        self.atomic = atomic
        #: Messages framed into one write (in atomic mode, one batch).
        self.chunk = jsapi.ATOMIC_LIMIT if atomic else 500
        #: Messages sent and not yet acknowledged, at most.
        self.window = max(window, self.chunk)
        self._prefix = connection.new_inbox().encode() + b"."
        self._batch_tag = os.urandom(6).hex().encode()
        self._batches = itertools.count(1)
        #: The last sequence sent.
        self._top = 0

    def publish(
        self,
        messages: Iterable[Placed],
        timeout: float,
        stored: Callable[[int], None] = lambda _: None,
        stop: Callable[[], bool] = lambda: False,
    ) -> int:
        """Send ``messages`` (their sequences consecutive) and wait for each one's
        acknowledgement; ``stored(sequence)`` is told the last sequence stored as
        acknowledgements come. When ``stop()`` says so, nothing more is sent and what was
        sent is waited for. Returns the last sequence stored (0 when none).

        Raises :class:`Repeated` or :class:`Misplaced` as their texts say, :class:`TooLarge`
        for a message larger than the server takes (nothing of its chunk, nor after it, was
        sent), and :class:`PublishError` for any other refusal, or no acknowledgement within
        ``timeout`` seconds of the last one. After any of them, what the stream stored is
        what its state says: the caller reads it there."""
        connection = self.connection
        room = connection.max_payload
        frame = self._batch if self.atomic else self._each
        # What was sent and not yet acknowledged: (the sequence its answer names, how many
        # messages it answers for), oldest first.
        waiting: deque[tuple[int, int]] = deque()
        outstanding = 0
        last_stored = 0
        source: Iterator[Placed] = iter(messages)
        exhausted = False
        while True:
            while not exhausted and outstanding + self.chunk <= self.window and not stop():
                chunk = list(itertools.islice(source, self.chunk))
                if not chunk:
                    exhausted = True
                    break
                connection.send(frame(chunk, room, waiting))
                outstanding += len(chunk)
            if outstanding == 0:
                return last_stored
            acknowledged = self._acknowledgements(waiting, timeout)
            if acknowledged:
                outstanding -= acknowledged
                last_stored = waiting[0][0] - waiting[0][1] if waiting else self._top
                stored(last_stored)

    def _each(self, chunk: list[Placed], room: int, waiting: deque[tuple[int, int]]) -> bytes:
        """A message at a time, each answered on its own sequence."""
        prefix = self._prefix
        frames = []
        for index, (sequence, subject, msg_id, body) in enumerate(chunk):
            # codec.hpub and headers(), inline: this loop runs for every message.
            block = _WITH_ID % (msg_id, sequence - 1) if msg_id else _WITHOUT_ID % (sequence - 1)
            size = len(block) + len(body)
            if size > room:
                # Sent, it would cost the connection: nothing of this chunk goes.
                raise TooLarge([index], room)
            frames.append(_HPUB % (subject, prefix, sequence, len(block), size, block, body))
        waiting.extend((sequence, 1) for sequence, *_ in chunk)
        self._top = chunk[-1].sequence
        return b"".join(frames)

    def _batch(self, chunk: list[Placed], room: int, waiting: deque[tuple[int, int]]) -> bytes:
        """One atomic batch, answered once, on its last message's sequence."""
        batch = self._batch_tag + b"-%d" % next(self._batches)
        last = len(chunk)
        frames = []
        for index, (sequence, subject, msg_id, body) in enumerate(chunk, 1):
            block = _BATCH % (
                b"Nats-Msg-Id: %s\r\n" % msg_id if msg_id else b"",
                batch,
                index,
                b"Nats-Expected-Last-Sequence: %d\r\n" % (sequence - 1) if index == 1 else b"",
                b"Nats-Batch-Commit: 1\r\n" if index == last else b"",
            )
            size = len(block) + len(body)
            if size > room:
                raise TooLarge([index - 1], room)
            if index == last:
                frames.append(
                    _HPUB % (subject, self._prefix, sequence, len(block), size, block, body)
                )
            else:
                frames.append(_HPUB_NO_REPLY % (subject, len(block), size, block, body))
        waiting.append((chunk[-1].sequence, last))
        self._top = chunk[-1].sequence
        return b"".join(frames)

    def _acknowledgements(self, waiting: deque[tuple[int, int]], timeout: float) -> int:
        """Read what one read of the socket brings (waiting up to ``timeout``): how many
        messages it acknowledged, in order, each stored at its own sequence; a refusal
        raises."""
        connection = self.connection
        prefix = self._prefix
        skip = len(prefix)
        try:
            arrived = connection.read(timeout)
        except TimeoutError:
            owed = waiting[0][0] if waiting else "?"
            raise PublishError(
                f"no acknowledgement in {timeout:g}s (waiting for sequence {owed})"
            ) from None
        count = 0
        for message in arrived:
            if not isinstance(message, Msg):
                continue  # a run of deliveries to a reader on the same connection
            if message.sid != connection.reply_sid or not message.subject.startswith(prefix):
                continue
            if message.headers and codec.status(message.headers) == NO_RESPONDERS:
                raise PublishError("no response from stream (no leader, or none elected yet)")
            if not waiting:
                continue
            sent_for = int(message.subject[skip:])
            top, size = waiting[0]
            if sent_for < top:
                continue  # an answer to an earlier call, after its failure
            payload = message.payload
            if sent_for == top and size == 1 and payload.endswith(_STORED_AT % top):
                waiting.popleft()  # stored where it was sent for: the common case, at once
                count += 1
                continue
            first = top - size + 1
            if sent_for != top:
                raise Misplaced(top, f"answered for sequence {sent_for} first")
            error = jsapi.refused(payload)
            if error is not None:
                if error.err_code == WRONG_LAST_SEQUENCE:
                    raise Misplaced(first, str(error))
                if error.err_code == jsapi.DUPLICATE_IN_BATCH:
                    raise Repeated(first, batch=True)
                raise PublishError(f"sequence {first}: {error}")
            if _DUPLICATE in payload:
                raise Repeated(sent_for)
            at = jsapi.number_in(payload, jsapi.SEQ_KEY)
            stored = jsapi.number_in(payload, _COUNT) if size > 1 else 1
            if at != top or stored != size:
                raise Misplaced(first, f"stored at {at}: {payload[:200]!r}")
            waiting.popleft()
            count += size
        return count
