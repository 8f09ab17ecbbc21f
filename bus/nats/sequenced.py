"""Messages stored at the stream sequences given, on a blocking connection: what an
import into a new stream needs to keep another log's sequence numbers.

Each message carries ``Nats-Expected-Last-Sequence`` (the sequence before its own), so
the stream stores it only right after the one before: a message is stored at its place
or not at all, and nothing another writer appends meanwhile can shift the rest (their
appends, or ours, are refused as "wrong last sequence"). The messages go pipelined:
:attr:`SequencedPublisher.window` unacknowledged at most, each acknowledgement naming the
sequence it was sent for in its reply subject, so that one connection carries tens of
thousands a second without a round trip per message.

A message with a ``Nats-Msg-Id`` the stream holds already within its duplicate window
is not stored (the stream answers "duplicate"): :class:`Repeated` names its sequence,
and the caller sends it again without the id, from there (everything sent after it was
refused, being out of place).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable, Iterator
from typing import NamedTuple

from bus.nats import codec, jsapi
from bus.nats.blocking import Connection
from bus.nats.publish import NO_RESPONDERS, PublishError, TooLarge

#: JetStream's refusal of a message whose expected last sequence is not the stream's.
WRONG_LAST_SEQUENCE = 10071
_DUPLICATE = b'"duplicate"'


class Placed(NamedTuple):
    """A message and the stream sequence it must be stored at."""

    sequence: int
    subject: bytes
    #: Its ``Nats-Msg-Id`` (empty: none).
    msg_id: bytes
    body: bytes


class Repeated(PublishError):
    """The stream holds a message with the id of the one for :attr:`sequence` (within its
    duplicate window) and stored nothing there; nothing sent after it was stored."""

    def __init__(self, sequence: int) -> None:
        super().__init__(f"the stream holds the id of the message for sequence {sequence}")
        self.sequence = sequence


class Misplaced(PublishError):
    """The stream did not store the message for :attr:`sequence` there: its last sequence
    was another (another writer, or a stream not as the caller believed)."""

    def __init__(self, sequence: int, answer: str) -> None:
        super().__init__(f"sequence {sequence} was not stored there: {answer}")
        self.sequence = sequence


def headers(msg_id: bytes, previous: int) -> bytes:
    """The header block of a message to store right after ``previous`` (with its id, when
    it has one)."""
    expected = b"Nats-Expected-Last-Sequence: %d\r\n\r\n" % previous
    if msg_id:
        return b"NATS/1.0\r\nNats-Msg-Id: " + msg_id + b"\r\n" + expected
    return b"NATS/1.0\r\n" + expected


#: The most bytes of a header block :func:`headers` makes beyond the id.
HEADERS_BEYOND_ID = len(headers(b"x", 2**64 - 1)) - 1


class SequencedPublisher:
    """Publishes :class:`Placed` messages in order through one connection (one caller at
    a time)."""

    def __init__(self, connection: Connection, window: int = 4000, chunk: int = 500) -> None:
        self.connection = connection
        #: Messages sent and not yet acknowledged, at most.
        self.window = max(window, chunk)
        #: Messages framed into one write.
        self.chunk = chunk
        self._prefix = connection.new_inbox().encode() + b"."

    def publish(
        self,
        messages: Iterable[Placed],
        timeout: float,
        stored: Callable[[int], None] = lambda _: None,
        stop: Callable[[], bool] = lambda: False,
    ) -> int:
        """Send ``messages`` (their sequences consecutive) and wait for each one's
        acknowledgement; ``stored(sequence)`` is told of each batch of acknowledgements as
        they come (the last sequence stored). When ``stop()`` says so, nothing more is sent
        and what was sent is waited for. Returns the last sequence stored (0 when none).

        Raises :class:`Repeated` or :class:`Misplaced` as their texts say, :class:`TooLarge`
        for a message larger than the server takes (nothing of its chunk, nor after it, was
        sent), and :class:`PublishError` for any other refusal, or no acknowledgement within
        ``timeout`` seconds of the last one. After any of them, what the stream stored is
        what its state says: the caller reads it there."""
        connection = self.connection
        prefix = self._prefix
        room = connection.max_payload
        outstanding = 0
        last_stored = 0
        expected_next: int | None = None  # the next acknowledgement's sequence
        source: Iterator[Placed] = iter(messages)
        exhausted = False
        while True:
            while not exhausted and outstanding + self.chunk <= self.window and not stop():
                chunk = list(itertools.islice(source, self.chunk))
                if not chunk:
                    exhausted = True
                    break
                frames = []
                for index, (sequence, subject, msg_id, body) in enumerate(chunk):
                    block = headers(msg_id, sequence - 1)
                    if len(block) + len(body) > room:
                        # Sent, it would cost the connection: nothing of this chunk goes.
                        raise TooLarge([index], room)
                    frames.append(codec.hpub(subject, block, body, prefix + b"%d" % sequence))
                if expected_next is None:
                    expected_next = chunk[0].sequence
                connection.send(b"".join(frames))
                outstanding += len(chunk)
            if outstanding == 0:
                return last_stored
            acknowledged = self._acknowledgements(expected_next, timeout)
            assert expected_next is not None
            expected_next += acknowledged
            outstanding -= acknowledged
            if acknowledged:
                last_stored = expected_next - 1
                stored(last_stored)

    def _acknowledgements(self, expected: int | None, timeout: float) -> int:
        """Read what one read of the socket brings (waiting up to ``timeout``): how many
        acknowledgements in a row from ``expected`` on, each storing its message at its
        own sequence; a refusal raises."""
        assert expected is not None
        connection = self.connection
        prefix = self._prefix
        skip = len(prefix)
        try:
            arrived = connection.read(timeout)
        except TimeoutError:
            raise PublishError(
                f"no acknowledgement in {timeout:g}s (waiting for sequence {expected})"
            ) from None
        count = 0
        for message in arrived:
            if message.sid != connection.reply_sid or not message.subject.startswith(prefix):
                continue
            if message.headers and codec.status(message.headers) == NO_RESPONDERS:
                raise PublishError("no response from stream (no leader, or none elected yet)")
            sent_for = int(message.subject[skip:])
            if sent_for < expected + count:
                continue  # an answer to an earlier call, after its failure
            payload = message.payload
            error = jsapi.refused(payload)
            if error is not None:
                if error.err_code == WRONG_LAST_SEQUENCE:
                    raise Misplaced(sent_for, str(error))
                raise PublishError(f"sequence {sent_for}: {error}")
            if _DUPLICATE in payload:
                raise Repeated(sent_for)
            at = jsapi.number_in(payload, jsapi.SEQ_KEY)
            if at != sent_for or sent_for != expected + count:
                raise Misplaced(sent_for, f"stored at {at}: {payload[:200]!r}")
            count += 1
        return count
