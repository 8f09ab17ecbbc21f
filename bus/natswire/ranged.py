"""An ordered read of a stream's sequences ``(after, upto]`` under subject filters,
through an ephemeral pull consumer on a :class:`bus.natswire.blocking.Connection`.

The consumer is JetStream's (made on the stream's leader, so the read sees everything
the stream acknowledged); what this adds is the speed: pull requests kept in flight one
ahead of the reader, and each delivery read from its reply subject (stream sequence,
time stored, how many are left) without a message object or a header parse.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections import deque
from typing import Any, NamedTuple

from bus.natswire import codec, jsapi
from bus.natswire.blocking import Connection
from bus.natswire.codec import Msg

#: Messages asked for by one pull request; two are kept in flight.
FETCH = 1000
IN_FLIGHT = 2
#: A pull request's life on the server; one that ends empty while events are pending
#: is a slow server, not the end.
EXPIRES = 1.0
#: Seconds without a message, while the consumer says events are pending, before the
#: read fails (its caller reads again).
STALL = 10.0

#: Seconds a consumer's making may take: after a node is lost JetStream places consumers
#: once its meta leader knows (seen taking over 4 s); a shorter wait would only give up
#: and ask again, leaving a consumer behind each time.
API_TIMEOUT = 15.0

NO_MESSAGES, REQUEST_TIMEOUT, CONFLICT, IDLE_HEARTBEAT = 404, 408, 409, 100


class Stored(NamedTuple):
    """One message of the stream as a ranged read gives it."""

    sequence: int
    subject: bytes
    payload: bytes
    #: When the stream stored it, nanoseconds since the epoch.
    timestamp_ns: int


class RangeRead:
    """Open it (:meth:`open`), then :meth:`next` until it gives nothing; :meth:`close`
    deletes the consumer (it would go by itself after its idle threshold)."""

    def __init__(
        self,
        connection: Connection,
        stream: str,
        after: int,
        upto: int,
        filters: list[str],
        follow: bool = False,
    ) -> None:
        self.connection = connection
        #: Following: no end (``upto`` is ignored), and :meth:`next` gives what each read
        #: of the socket brought, nothing when a pull request expired with nothing new.
        self.follow = follow
        self.stream = stream
        self.after, self.upto = after, upto
        self.filters = filters
        self.first_stored = 0
        self.consumer = ""
        #: Times the consumer's replica said "nothing more" while the leader held more.
        self.behind = 0
        if follow:
            self.upto = upto = 1 << 63
        self._done = after >= upto
        #: Pull requests in flight, oldest first: [inbox, messages still owed].
        self._requests: deque[list[Any]] = deque()
        self._early: deque[Msg] = deque()  # read past the last next()'s count

    @property
    def done(self) -> bool:
        return self._done

    def open(self, check_retention: bool = False) -> RangeRead:
        """Make the consumer; with ``check_retention``, :attr:`first_stored` is the
        stream's first sequence (above ``after + 1`` when retention removed the start)."""
        if self._done:
            return self
        connection = self.connection
        if check_retention:
            state = jsapi.answer(connection.request(jsapi.stream_info(self.stream), b"").payload)
            self.first_stored = int(state["state"]["first_seq"])
        made = jsapi.answer(
            connection.request(
                jsapi.consumer_create(self.stream),
                jsapi.ranged_consumer(self.stream, self.after + 1, self.filters),
                timeout=max(connection.timeout, API_TIMEOUT),
            ).payload
        )
        self.consumer = made["name"]
        if int(made.get("num_pending", 0)) == 0 and not self.follow:
            # Nothing under the filters above ``after``, as the consumer's replica sees it.
            self._done = self._nothing_after(self.after)
        return self

    def _pull(self) -> None:
        subject = jsapi.consumer_next(self.stream, self.consumer)
        body = jsapi.pull(FETCH, EXPIRES)
        while len(self._requests) < IN_FLIGHT:
            inbox = self.connection.new_inbox()
            self._requests.append([inbox.encode(), FETCH])
            self.connection.publish(subject, body, inbox)

    def _nothing_after(self, position: int) -> bool:
        """Whether the stream holds nothing under the filters in ``(position, upto]``,
        asked of the stream's leader. A consumer is placed on any replica of the stream
        and counts what is pending in that replica's copy, which may lag behind what the
        stream acknowledged (a node that was down catching up): its "nothing pending"
        alone would end a read short. When the leader knows more, the read goes on (the
        consumer delivers it once its replica has it)."""
        for subject in self.filters:
            request = json.dumps({"seq": position + 1, "next_by_subj": subject}).encode()
            try:
                found = jsapi.answer(
                    self.connection.request(jsapi.message_get(self.stream), request).payload
                )
            except jsapi.JetStreamError as error:
                if error.err_code == jsapi.NO_MESSAGE_FOUND:
                    continue
                raise
            if int(found["message"]["seq"]) <= self.upto:
                self.behind += 1
                return False
        return True

    def _ended(self, inbox: bytes) -> None:
        """A pull request ended short (expired, or nothing more): forget it."""
        self._requests = deque(r for r in self._requests if r[0] != inbox)

    def next(self, count: int = FETCH) -> list[Stored]:
        """The next stored messages of the range, in order, at most ``count``; an empty
        list once the range is read."""
        out: list[Stored] = []
        append = out.append
        upto = self.upto
        reply_sid = self.connection.reply_sid
        quiet_since = time.monotonic()
        while not self._done and len(out) < count:
            if self._early:
                messages = list(self._early)
                self._early.clear()
            else:
                self._pull()
                messages = self.connection.read(EXPIRES + self.connection.timeout)
            for index, message in enumerate(messages):
                if message.sid != reply_sid:
                    continue
                reply = message.reply
                if not reply.startswith(b"$JS.ACK."):
                    # A status on a pull request's inbox: it ended, or a heartbeat.
                    code = codec.status(message.headers)
                    if code in (NO_MESSAGES, REQUEST_TIMEOUT):
                        self._ended(message.subject)
                        if not self.follow and time.monotonic() - quiet_since > STALL:
                            raise TimeoutError(
                                f"stream {self.stream} sent nothing for {STALL:g}s though "
                                f"events above {self.after} are pending"
                            )
                    elif code and code != IDLE_HEARTBEAT:
                        raise jsapi.JetStreamError(code, 0, codec.description(message.headers))
                    continue
                # Requests are served in the order they were made: this fills the first.
                head = self._requests[0] if self._requests else None
                if head is not None:
                    head[1] -= 1
                    if not head[1]:
                        self._requests.popleft()
                tokens = reply.split(b".")
                if len(tokens) == 9:
                    sequence, stamp, pending = tokens[5], tokens[7], tokens[8]
                else:
                    sequence, stamp, pending = tokens[7], tokens[9], tokens[10]
                seq = int(sequence)
                if seq > upto:
                    self._done = True
                    break
                append(Stored(seq, message.subject, message.payload, int(stamp)))
                self.after = seq
                if seq == upto or (
                    pending == b"0" and not self.follow and self._nothing_after(seq)
                ):
                    self._done = True
                    break
                if len(out) >= count:
                    self._early.extend(messages[index + 1 :])
                    break
            if out:
                quiet_since = time.monotonic()
            if self.follow:
                break
        return out

    def close(self) -> None:
        """Delete the consumer (best effort: it goes by itself when idle)."""
        if self.consumer:
            consumer, self.consumer = self.consumer, ""
            with contextlib.suppress(OSError):
                self.connection.publish(jsapi.consumer_delete(self.stream, consumer), b"")
