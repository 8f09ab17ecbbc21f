"""An ordered read of a stream's sequences ``(after, upto]`` under subject filters,
through an ephemeral pull consumer on a :class:`bus.nats.blocking.Connection`.

The consumer is JetStream's (made on the stream's leader, so the read sees everything
the stream acknowledged); what this adds is the speed: pull requests kept in flight one
ahead of the reader, and each delivery read from its reply subject (stream sequence,
time stored, how many are left) without a message object or a header parse.
"""

from __future__ import annotations

import bisect
import contextlib
import json
import secrets
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple

from bus.nats import codec, jsapi
from bus.nats.blocking import Connection
from bus.nats.codec import Msg, Run

#: Messages asked for by one pull request; two are kept in flight.
FETCH = 1000
IN_FLIGHT = 2
#: A pull request's life on the server; one that ends empty while events are pending
#: is a slow server, not the end.
EXPIRES = 1.0
#: Seconds without a message, while the consumer says events are pending, before the
#: read fails (its caller reads again).
STALL = 10.0
#: Following, each waiting pull request has the server say every this many seconds that it
#: still waits (a heartbeat): a consumer whose server stopped its JetStream (lame-duck
#: mode) or died sends nothing more, and pulls to it are never answered.
HEARTBEAT = 0.25
#: Following, seconds with nothing at all from the consumer (no delivery, no heartbeat, no
#: expiry) before it is taken for gone and the read fails (the feed makes it again).
SILENT = 4 * HEARTBEAT

#: Seconds a consumer's making may take: after a node is lost JetStream places consumers
#: once its meta leader knows (seen taking over 4 s).
API_TIMEOUT = 15.0
#: Seconds one request to make it (or for the stream's state) waits before it is asked
#: again: a request that reached no leader (one being elected) is never answered, and
#: the consumer is named, so asking again makes no second one.
CREATE_ATTEMPT = 2.0

#: Seconds a read's pulls may find no responder before its consumer is taken for gone
#: (its server lost): one just made is known to the server it lives on before its
#: subscription reaches the others (5 first pulls of 300 reads on an R3 stream found
#: none, with no fault), and each pull so answered is sent again after :data:`REPULL`.
NO_RESPONDERS_GRACE = 2.0
REPULL = 0.02

NO_MESSAGES, REQUEST_TIMEOUT, CONFLICT, NO_RESPONDERS = 404, 408, 409, 503
IDLE_HEARTBEAT = 100


class Stored(NamedTuple):
    """One message of the stream as a ranged read gives it."""

    sequence: int
    subject: bytes
    payload: bytes
    #: When the stream stored it, nanoseconds since the epoch.
    timestamp_ns: int


@dataclass
class Batch:
    """Stored messages as columns, in the stream's order."""

    sequences: list[int]
    subjects: list[bytes]
    payloads: list[bytes]
    #: When the stream stored each, nanoseconds since the epoch.
    stamps: list[int]

    def only(self, keep: list[int]) -> Batch:
        """The messages at the indexes ``keep`` (in order)."""
        return Batch(
            [self.sequences[i] for i in keep],
            [self.subjects[i] for i in keep],
            [self.payloads[i] for i in keep],
            [self.stamps[i] for i in keep],
        )


Columns = tuple[int, list[int], list[bytes], list[bytes], list[int], list[int]]


def _deliveries(messages: list[Msg | Run], start: int, sid: int, limit: int) -> Columns:
    """JetStream deliveries (reply ``$JS.ACK...``) on ``sid`` from ``messages[start]`` on,
    as columns (sequence, subject, payload, time stored, pending), at most ``limit``;
    other subscriptions' messages are skipped. Also the index it stopped at: the first
    other message of ``sid``, one whose reply subject is not plain, or after the last
    taken. What bus/nats/_scan.c does, for where it is not built."""
    sequences: list[int] = []
    subjects: list[bytes] = []
    payloads: list[bytes] = []
    stamps: list[int] = []
    pending: list[int] = []
    start = len(messages) if start < 0 else start
    index = start
    for index in range(start, len(messages)):
        if len(sequences) >= limit:
            break
        message = messages[index]
        if type(message) is not Msg:
            break  # a run of deliveries, read by the parser
        if message.sid != sid:
            continue
        read = codec.delivered(message.reply)
        if read is None:
            break
        sequence, stamp, left = read
        sequences.append(sequence)
        subjects.append(message.subject)
        payloads.append(message.payload)
        stamps.append(stamp)
        pending.append(left)
    else:
        index = max(start, len(messages))
    return index, sequences, subjects, payloads, stamps, pending


#: Deliveries as columns: compiled where it was built.
deliveries: Callable[[list[Msg | Run], int, int, int], Columns] = (
    codec.native.deliveries if codec.native is not None else _deliveries
)


class RangeRead:
    """Open it (:meth:`open`), then :meth:`next` until it gives nothing; :meth:`close`
    deletes the consumer (it would go by itself after its idle threshold). Without
    ``stamps``, the times stored it gives are 0."""

    def __init__(
        self,
        connection: Connection,
        stream: str,
        after: int,
        upto: int,
        filters: list[str],
        follow: bool = False,
        stamps: bool = True,
    ) -> None:
        self.connection = connection
        # Its deliveries as columns, no message each; without stamps, the times stored 0.
        connection.runs_of_deliveries(stamps)
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
        #: Messages the consumer said it still held past the last delivered (None: none
        #: delivered yet).
        self.pending: int | None = None
        if follow:
            self.upto = upto = 1 << 63
        self._done = after >= upto
        #: Pull requests in flight, oldest first: [inbox, messages still owed].
        self._requests: deque[list[Any]] = deque()
        self._early: deque[Msg | Run] = deque()  # read past the last next()'s count
        #: Since when pulls find no responder (None: the consumer answers).
        self._unanswered_since: float | None = None

    @property
    def done(self) -> bool:
        """Everything up to ``upto`` was read."""
        return self._done

    def open(self, check_retention: bool = False) -> RangeRead:
        """Make the consumer; with ``check_retention``, :attr:`first_stored` is the
        stream's first sequence (above ``after + 1`` when retention removed the start)."""
        if self._done:
            return self
        connection = self.connection
        if check_retention:
            # Not waited for long: a stream with no leader does not answer, and the
            # caller's failover asks again (bus.nats.failover).
            asked = connection.request(jsapi.stream_info(self.stream), b"", CREATE_ATTEMPT)
            state = jsapi.answer(asked.payload)
            self.first_stored = int(state["state"]["first_seq"])
        made = self._create(f"read-{secrets.token_hex(8)}")
        self.consumer = made["name"]
        if int(made.get("num_pending", 0)) == 0 and not self.follow:
            # Nothing under the filters above ``after``, as the consumer's replica sees it.
            self._done = self._nothing_after(self.after)
        return self

    def _create(self, name: str) -> dict[str, Any]:
        """Make the consumer, asking again every :data:`CREATE_ATTEMPT` seconds for up to
        :data:`API_TIMEOUT` (or the connection's timeout, if longer)."""
        subject = jsapi.consumer_create(self.stream, name)
        config = jsapi.ranged_consumer(self.stream, self.after + 1, self.filters, name=name)
        deadline = time.monotonic() + max(self.connection.timeout, API_TIMEOUT)
        while True:
            left = deadline - time.monotonic()
            try:
                answer = self.connection.request(subject, config, timeout=min(CREATE_ATTEMPT, left))
            except TimeoutError:
                if left <= CREATE_ATTEMPT:
                    raise
                continue
            made: dict[str, Any] = jsapi.answer(answer.payload)
            return made

    def _pull(self) -> None:
        subject = jsapi.consumer_next(self.stream, self.consumer)
        body = jsapi.pull(FETCH, EXPIRES, heartbeat=HEARTBEAT if self.follow else 0.0)
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
        batch = self.next_batch(count)
        return list(map(Stored, batch.sequences, batch.subjects, batch.payloads, batch.stamps))

    def next_batch(self, count: int = FETCH) -> Batch:
        """:meth:`next` as columns (no object per message)."""
        out = Batch([], [], [], [])
        reply_sid = self.connection.reply_sid
        quiet_since = time.monotonic()
        while not self._done and len(out.sequences) < count:
            if self._early:
                messages = list(self._early)
                self._early.clear()
            else:
                self._pull()
                messages = self._read()
            index, size = 0, len(messages)
            while index < size and not self._done:
                wanted = count - len(out.sequences)
                item = messages[index]
                if type(item) is Run:
                    # The connection's parser read these deliveries (runs_of_deliveries).
                    index += 1
                    if len(item.sequences) > wanted:  # the rest read next
                        messages.insert(index, item.part(wanted, None))
                        size += 1
                        item = item.part(0, wanted)
                    sequences, subjects, payloads, stamps, pending, _ = item
                else:
                    index, sequences, subjects, payloads, stamps, pending = deliveries(
                        messages, index, reply_sid, wanted
                    )
                if sequences:
                    self._served(len(sequences))
                    taken = self._taken(sequences, pending)
                    if taken == len(sequences) and not out.sequences:
                        out = Batch(sequences, subjects, payloads, stamps)  # no copy made
                    else:
                        out.sequences += sequences[:taken]
                        out.subjects += subjects[:taken]
                        out.payloads += payloads[:taken]
                        out.stamps += stamps[:taken]
                    if self._done:
                        break
                    if len(out.sequences) >= count:
                        self._early.extend(messages[index:])
                        break
                if index < size:
                    other = messages[index]
                    if isinstance(other, Msg):
                        self._other(other, quiet_since)
                        index += 1
            if out.sequences:
                quiet_since = time.monotonic()
                self._unanswered_since = None
            if self.follow:
                break
        return out

    def _read(self) -> list[Msg | Run]:
        """What the socket brings next: none when the server goes into lame-duck mode.
        Following, a consumer silent for :data:`SILENT` seconds fails the read."""
        if not self.follow:
            return self.connection.read(EXPIRES + self.connection.timeout)
        try:
            return self.connection.read(SILENT)
        except TimeoutError:
            # This thread may have been kept from running: what waits in the socket counts.
            self.connection.poll()
            try:
                return self.connection.read(0)
            except TimeoutError:
                raise TimeoutError(
                    f"consumer {self.consumer} of stream {self.stream} silent for {SILENT:g}s "
                    "(no delivery, no heartbeat): taken for gone"
                ) from None

    def _taken(self, sequences: list[int], pending: list[int]) -> int:
        """How many of these deliveries belong to the range (all but those above
        ``upto``); marks the read done when it ends among them."""
        taken = len(sequences)
        if sequences[-1] > self.upto:
            taken = bisect.bisect_right(sequences, self.upto)
            self._done = True
        if not self.follow:
            # The first that is the last wanted, or that the consumer says ends what
            # the stream holds (and the leader agrees), ends the read. Found with list
            # searches, not a look at each delivery: a chunk holds a thousand.
            last = bisect.bisect_left(sequences, self.upto, 0, taken)
            upto_here = last < taken and sequences[last] == self.upto
            end = last if upto_here else taken  # no need to ask about the last wanted
            index = 0
            while True:
                try:
                    index = pending.index(0, index, end)  # no copy of the column
                except ValueError:
                    if upto_here:
                        taken = last + 1
                        self._done = True
                    break
                if self._nothing_after(sequences[index]):
                    taken = index + 1
                    self._done = True
                    break
                index += 1
        if taken:
            self.after = sequences[taken - 1]
            self.pending = pending[taken - 1]
        return taken

    def _served(self, delivered: int) -> None:
        """Requests are served in the order they were made: deliveries fill the first."""
        requests = self._requests
        while delivered and requests:
            head = requests[0]
            share = min(delivered, head[1])
            head[1] -= share
            delivered -= share
            if not head[1]:
                requests.popleft()

    def _other(self, message: Msg, quiet_since: float) -> None:
        """A message of the reply subscription that is not a delivery (:func:`deliveries`
        stops only at those): a pull request's status (ended, or a heartbeat)."""
        if message.reply.startswith(b"$JS.ACK."):
            raise codec.ProtocolError(f"a delivery's reply subject unread: {message.reply[:200]!r}")
        code = codec.status(message.headers)
        if code in (NO_MESSAGES, REQUEST_TIMEOUT):
            self._ended(message.subject)
            self._unanswered_since = None
            if not self.follow and time.monotonic() - quiet_since > STALL:
                raise TimeoutError(
                    f"stream {self.stream} sent nothing for {STALL:g}s though "
                    f"events above {self.after} are pending"
                )
        elif code == NO_RESPONDERS:
            self._ended(message.subject)
            now = time.monotonic()
            if self._unanswered_since is None:
                self._unanswered_since = now
            elif now - self._unanswered_since > NO_RESPONDERS_GRACE:
                raise jsapi.JetStreamError(
                    code, 0, f"no responders for consumer {self.consumer} of stream {self.stream}"
                )
            time.sleep(REPULL)
        elif code and code != IDLE_HEARTBEAT:
            raise jsapi.JetStreamError(code, 0, codec.description(message.headers))

    def close(self) -> None:
        """Delete the consumer (best effort: it goes by itself when idle)."""
        if self.consumer:
            consumer, self.consumer = self.consumer, ""
            with contextlib.suppress(OSError):
                self.connection.publish(jsapi.consumer_delete(self.stream, consumer), b"")
