"""A batch published to a JetStream stream and every message's acknowledgement awaited,
on a blocking connection: the whole batch goes out in one write, each message with a
reply subject of its own, and the acknowledgements are read as they come (the stream's
sequence from each, without a JSON parse unless it is an error).

Either every message of the batch was stored (each one's sequence, or the first
sequence of one the stream already held under its ``Nats-Msg-Id``) or
:class:`PublishError` says why: nothing of the batch may then be taken as stored, and a
resend of it is deduplicated by the ids.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Sequence

from bus.natswire import codec, jsapi
from bus.natswire.blocking import Connection

NO_RESPONDERS = 503
_SEQ = b'"seq":'


class PublishError(Exception):
    """The batch was not acknowledged whole."""


class Publisher:
    """Publishes batches through one connection (one caller at a time)."""

    def __init__(self, connection: Connection) -> None:
        self.connection = connection
        self._prefix = connection.new_inbox().encode() + b"."
        self._numbers = itertools.count(1)

    def publish(self, messages: Sequence[tuple[bytes, bytes, bytes]], timeout: float) -> list[int]:
        """``messages``: (subject, message id, body) each; the stream's sequences, in order."""
        if not messages:
            return []
        prefix = self._prefix
        first = next(self._numbers)
        self._numbers = itertools.count(first + len(messages))
        frames = []
        for offset, (subject, msg_id, body) in enumerate(messages):
            headers = b"NATS/1.0\r\nNats-Msg-Id: " + msg_id + b"\r\n\r\n"
            frames.append(codec.hpub(subject, headers, body, prefix + b"%d" % (first + offset)))
        connection = self.connection
        reply_sid = connection.reply_sid
        sequences = [0] * len(messages)
        left = len(messages)
        connection.send(b"".join(frames))
        deadline = time.monotonic() + timeout
        skip = len(prefix)
        while left:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise PublishError(f"no acknowledgement in {timeout:g}s ({left} still owed)")
            try:
                arrived = connection.read(remaining)
            except TimeoutError:
                continue
            for message in arrived:
                if message.sid != reply_sid or not message.subject.startswith(prefix):
                    continue
                index = int(message.subject[skip:]) - first
                if not 0 <= index < len(messages) or sequences[index]:
                    continue  # an answer to an earlier batch, after its deadline
                if message.headers and codec.status(message.headers) == NO_RESPONDERS:
                    raise PublishError("no response from stream (no leader, or none elected yet)")
                payload = message.payload
                at = payload.find(_SEQ)
                if at < 0 or b'"error"' in payload:
                    try:
                        jsapi.answer(payload)
                    except jsapi.JetStreamError as error:
                        raise PublishError(str(error)) from None
                    raise PublishError(f"not an acknowledgement: {payload[:200]!r}")
                end = at + len(_SEQ)
                while payload[end : end + 1] == b" ":
                    end += 1
                stop = end
                while stop < len(payload) and payload[stop] in b"0123456789":
                    stop += 1
                sequences[index] = int(payload[end:stop])
                left -= 1
        return sequences
