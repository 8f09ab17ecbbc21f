"""The NATS client protocol's wire, sans-I/O.

:class:`Parser` takes whatever bytes the socket gave and returns what the server said,
whole: :class:`Msg` for ``MSG`` and ``HMSG``, and the control lines as
:class:`Control`. Bytes of a message not yet complete stay in the parser. The functions
below make the client's commands.

Speed is why this exists: headers stay bytes until someone asks (:func:`header`,
:func:`status`), and where the compiled scanner (bus/nats/_scan.c) was built it parses
the common messages in C; in Python a message costs one ``find``, one ``split`` and a few
slices.
"""

from __future__ import annotations

import json
from typing import Any, NamedTuple

from bus.util.compiled import compiled

CRLF = b"\r\n"
PING = b"PING\r\n"
PONG = b"PONG\r\n"
#: Control lines longer than this without a CRLF are a broken peer, not a slow one.
MAX_CONTROL_LINE = 1 << 20


class ProtocolError(Exception):
    """The server sent something that is not the NATS protocol (or an ``-ERR``)."""


class Msg(NamedTuple):
    """A message delivered to one of our subscriptions."""

    subject: bytes
    sid: int
    reply: bytes
    #: The header block (``NATS/1.0 ...`` to the blank line), empty for ``MSG``.
    headers: bytes
    payload: bytes


class Run(NamedTuple):
    """JetStream deliveries (reply subject ``$JS.ACK...``) one after another on the
    subscription a :class:`Parser` was told of, as columns: no message is made for each
    (a reader of a stream gets thousands a read)."""

    sequences: list[int]
    subjects: list[bytes]
    payloads: list[bytes]
    #: When the stream stored each, nanoseconds since the epoch.
    stamps: list[int]
    #: Messages the consumer said it still held past each.
    pending: list[int]
    #: Bytes of their headers and payloads (what pending limits count).
    bytes: int

    def part(self, start: int, stop: int | None, size: int = 0) -> Run:
        """The deliveries ``[start:stop]``, said to hold ``size`` bytes."""
        return Run(
            self.sequences[start:stop], self.subjects[start:stop], self.payloads[start:stop],
            self.stamps[start:stop], self.pending[start:stop], size,
        )  # fmt: skip


class Control(NamedTuple):
    """A control line: ``INFO`` (with its JSON), ``PING``, ``PONG``, ``+OK`` or ``-ERR``."""

    op: bytes
    argument: bytes


#: The compiled scanner (bus/nats/_scan.c), or None (not built, or ``BUS_NATIVE_NATS=0``);
#: the Python code below gives the same results without it.
native: Any = compiled("bus.nats._scan", "BUS_NATIVE_NATS")
#: The places of the scanner's table of subjects (bus/nats/_scan.c SUBJECT_SLOTS).
SUBJECT_SLOTS = 64


class Parser:
    """Bytes in, whole messages and control lines out, in the order sent; with
    :attr:`run_sid`, JetStream deliveries on that subscription as :class:`Run` items."""

    def __init__(self) -> None:
        self._buffer = b""
        #: Deliveries on this subscription come as :class:`Run` items (None: as messages).
        self.run_sid: int | None = None
        #: Runs hold the times stored (else 0 for each: a reader that does not want them
        #: spares an int a delivery).
        self.run_stamps = True
        #: The compiled scanner's subjects, kept from one read to the next: a topic's
        #: subject is the same object in every run, so that a dict keyed by it finds it
        #: by identity (:data:`SUBJECT_SLOTS` places).
        self._subjects: list[bytes | None] = [None] * SUBJECT_SLOTS

    @property
    def waiting(self) -> int:
        """Bytes of an item not yet whole, kept for the next :meth:`feed`."""
        return len(self._buffer)

    def feed(self, data: bytes) -> list[Msg | Control]:
        """Take the bytes ``data`` and return every whole item they complete, in order."""
        out: list[Msg | Control] = []
        self._take(data, out, None)
        return out

    def feed_apart(self, data: bytes) -> tuple[list[Msg], list[Control]]:
        """:meth:`feed`, the messages and the control lines apart (each in the order sent):
        a reader of a stream, thousands of messages a read, looks at its few control lines
        alone."""
        messages: list[Msg] = []
        controls: list[Control] = []
        self._take(data, messages, controls)  # type: ignore[arg-type]
        return messages, controls

    def _take(self, data: bytes, out: list[Msg | Control], controls: list[Control] | None) -> None:
        """Every whole item into ``out``, the control lines into ``controls`` when given."""
        buffer = self._buffer + data if self._buffer else data
        one: list[Msg | Control] = []
        run_sid, apart, stamps = self.run_sid, controls is not None, self.run_stamps

        def taken(items: list[Msg | Control]) -> list[Any]:
            return items if run_sid is None else _runs(items, run_sid, apart, stamps)

        if native is None:
            position = _parse(buffer, 0, one, False)
            _into(taken(one), out, controls)
        else:
            # The scanner takes the common items; the Python loop takes one it left (an
            # INFO, an -ERR, anything odd or incomplete), then the scanner goes on.
            position, size, scan = 0, len(buffer), native.scan
            extra: tuple[Any, ...] = () if controls is None else (controls,)
            if run_sid is not None:
                extra = (controls, run_sid, Run, stamps, self._subjects)
            while True:
                items, position = scan(buffer, position, Msg, Control, *extra)
                out.extend(items)
                if position >= size:
                    break
                after = _parse(buffer, position, one, True)
                if after == position:
                    break  # incomplete: the rest waits for more bytes
                position = after
                _into(taken(one), out, controls)
                one.clear()
        self._buffer = buffer[position:]


def delivered(reply: bytes) -> tuple[int, int, int] | None:
    """A JetStream delivery's reply subject ``$JS.ACK.<stream>.<consumer>.<delivered>.
    <sseq>.<dseq>.<ts>.<pending>`` (or 11 to 32 tokens, with a domain and an account
    hash): its stream sequence, time stored and messages pending, as plain digits below
    2**64 (as bus/nats/_scan.c reads them); None when it is not one."""
    if not reply.startswith(b"$JS.ACK."):
        return None
    tokens = reply.split(b".")
    if len(tokens) == 9:
        read = tokens[5], tokens[7], tokens[8]
    elif 11 <= len(tokens) <= 32:
        read = tokens[7], tokens[9], tokens[10]
    else:
        return None
    if not all(token.isdigit() and len(token) <= 20 for token in read):
        return None
    sequence, stamp, pending = map(int, read)
    if max(sequence, stamp, pending) >= 1 << 64:
        return None
    return sequence, stamp, pending


def _runs(items: list[Msg | Control], sid: int, apart: bool, stamps: bool = True) -> list[Any]:
    """``items`` with the deliveries on ``sid`` one after another as :class:`Run` items,
    as the scanner makes them: a run ends at another message, and at a control line
    unless those go apart; the times stored 0 without ``stamps``."""
    out: list[Any] = []
    run: list[list[Any]] = []
    size = 0
    for item in items:
        read = delivered(item.reply) if type(item) is Msg and item.sid == sid else None
        if read is None:
            if run and (type(item) is Msg or not apart):
                out.append(Run(run[0], run[1], run[2], run[3], run[4], size))
                run, size = [], 0
            out.append(item)
            continue
        assert isinstance(item, Msg)
        if not run:
            run = [[], [], [], [], []]
        values = (read[0], item.subject, item.payload, read[1] if stamps else 0, read[2])
        for column, value in zip(run, values, strict=True):
            column.append(value)
        size += len(item.headers) + len(item.payload)
    if run:
        out.append(Run(run[0], run[1], run[2], run[3], run[4], size))
    return out


def _into(items: list[Any], out: list[Msg | Control], controls: list[Control] | None) -> None:
    if controls is None:
        out.extend(items)
        return
    for item in items:
        if type(item) is Control:
            controls.append(item)
        else:
            out.append(item)


def _parse(buffer: bytes, position: int, out: list[Msg | Control], once: bool) -> int:
    """Parse from ``position`` (one item when ``once``) into ``out``; the position after
    what was whole."""
    append = out.append
    size = len(buffer)
    while position < size:
        end = buffer.find(CRLF, position)
        if end < 0:
            if size - position > MAX_CONTROL_LINE:
                raise ProtocolError("a control line longer than 1 MiB")
            break
        line = buffer[position:end]
        op = line[:4]
        if op == b"HMSG" or op == b"MSG ":
            parts = line.split(b" ")
            if op == b"MSG ":
                if len(parts) == 4:
                    subject, sid, reply, total_ = parts[1], parts[2], b"", parts[3]
                elif len(parts) == 5:
                    subject, sid, reply, total_ = parts[1], parts[2], parts[3], parts[4]
                else:
                    raise ProtocolError(f"bad MSG line {line[:200]!r}")
                header_size = 0
            else:
                if len(parts) == 5:
                    subject, sid, reply = parts[1], parts[2], b""
                elif len(parts) == 6:
                    subject, sid, reply = parts[1], parts[2], parts[3]
                else:
                    raise ProtocolError(f"bad HMSG line {line[:200]!r}")
                header_size, total_ = int(parts[-2]), parts[-1]
            total = int(total_)
            start = end + 2
            stop = start + total
            if stop + 2 > size:
                break  # the rest of this message is still on its way
            if total < header_size or buffer[stop : stop + 2] != CRLF:
                raise ProtocolError(f"message of {total} bytes not ended by CRLF")
            append(
                Msg(
                    subject,
                    int(sid),
                    reply,
                    buffer[start : start + header_size],
                    buffer[start + header_size : stop],
                )
            )
            position = stop + 2
        else:
            word, _, argument = line.partition(b" ")
            word = word.upper()
            if word == b"-ERR":
                append(Control(b"-ERR", argument.strip(b"'")))
            elif word in (b"PING", b"PONG", b"+OK", b"INFO"):
                append(Control(word, argument))
            else:
                raise ProtocolError(f"unknown operation {line[:200]!r}")
            position = end + 2
        if once:
            break
    return position


def info(control: Control) -> dict[str, Any]:
    """The JSON of an ``INFO`` line."""
    parsed: dict[str, Any] = json.loads(control.argument)
    return parsed


def connect(options: dict[str, Any]) -> bytes:
    """A ``CONNECT`` with ``options`` as its JSON."""
    return b"CONNECT " + json.dumps(options, separators=(",", ":")).encode() + CRLF


def sub(subject: str, sid: int, queue: str = "") -> bytes:
    """A ``SUB`` of ``subject`` as ``sid``, in ``queue``'s group when one is given."""
    if queue:
        return f"SUB {subject} {queue} {sid}\r\n".encode()
    return f"SUB {subject} {sid}\r\n".encode()


def unsub(sid: int, after: int = 0) -> bytes:
    """An ``UNSUB`` of ``sid``: at once, or after ``after`` more messages."""
    return f"UNSUB {sid} {after}\r\n".encode() if after else f"UNSUB {sid}\r\n".encode()


def pub(subject: bytes, payload: bytes, reply: bytes = b"") -> bytes:
    """A ``PUB`` of ``payload`` to ``subject``, its answers to ``reply`` when given."""
    head = b"PUB " + subject + (b" " + reply if reply else b"") + b" %d\r\n" % len(payload)
    return head + payload + CRLF


def hpub(subject: bytes, headers: bytes, payload: bytes, reply: bytes = b"") -> bytes:
    """``headers``: the whole block, as :func:`header_block` makes it."""
    head = b"HPUB " + subject + (b" " + reply if reply else b"")
    head += b" %d %d\r\n" % (len(headers), len(headers) + len(payload))
    return head + headers + payload + CRLF


def header_block(headers: dict[bytes, bytes]) -> bytes:
    """A ``NATS/1.0`` header block of ``headers`` for :func:`hpub`."""
    lines = [b"NATS/1.0"]
    lines.extend(key + b": " + value for key, value in headers.items())
    return CRLF.join(lines) + CRLF + CRLF


def status(headers: bytes) -> int:
    """The status code of a header block (``NATS/1.0 404 No Messages``), 0 for none."""
    if len(headers) > 12 and headers[8:9] == b" ":
        try:
            return int(headers[9:12])
        except ValueError:
            return 0
    return 0


def description(headers: bytes) -> str:
    """The words after a status code (``No Messages``)."""
    first = headers.split(CRLF, 1)[0]
    return first[13:].decode("utf-8", "replace")


def header(headers: bytes, name: bytes) -> bytes | None:
    """One header's value (the first, if several), matched without regard to case."""
    wanted = name.lower() + b":"
    for line in headers.split(CRLF)[1:]:
        if line[: len(wanted)].lower() == wanted:
            return line[len(wanted) :].strip()
    return None
