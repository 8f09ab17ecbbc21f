"""eMQP wire format, sans-I/O: lists of frames <-> commands.

Every message (after the ROUTER identity) is ``['', 'eMQP/1.0', COMMAND, msgid, ...]``.
Nothing here touches sockets or the reactor. Every malformed input raises an
:class:`EmqpError` (a :class:`bus.errors.ProtocolError`) whose ``reason`` names the
defect; nothing else escapes. This module is the fuzz target.

Dialects. The text (spec 001) describes INFORM's queues as comma-separated names and
HEARTBEAT without a payload; the real eventmq 0.3.13 sends queues as JSON
``[[weight, "name"], ...]`` plus a peer type, and a timestamp in HEARTBEAT. Both are told
apart per message and accepted. A REPLY of 5 frames is the original broker's dispatch
acknowledgement to a client; one of 6 frames carries a result (worker -> broker -> client).
"""

from __future__ import annotations

import itertools
import json
import os
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final, NamedTuple

from bus.errors import ProtocolError
from bus.util.compiled import compiled

PROTOCOL: Final = b"eMQP/1.0"

INFORM: Final = b"INFORM"
ACK: Final = b"ACK"
READY: Final = b"READY"
REQUEST: Final = b"REQUEST"
REPLY: Final = b"REPLY"
HEARTBEAT: Final = b"HEARTBEAT"
KBYE: Final = b"KBYE"
DISCONNECT: Final = b"DISCONNECT"
SCHEDULE: Final = b"SCHEDULE"
UNSCHEDULE: Final = b"UNSCHEDULE"
STATUS: Final = b"STATUS"
SCHEDULES: Final = b"SCHEDULES"
#: eventmq's admin commands: emq-cli greets with HELLO (its router never answers it) and
#: asks for the connected workers and schedulers.
HELLO: Final = b"HELLO"
ROUTER_SHOW_WORKERS: Final = b"ROUTER_SHOW_WORKERS"
ROUTER_SHOW_SCHEDULERS: Final = b"ROUTER_SHOW_SCHEDULERS"

WORKER: Final = "worker"
SCHEDULER: Final = "scheduler"
DEFAULT_QUEUE: Final = "default"
DEFAULT_WEIGHT: Final = 10
#: Queues a worker sends as an empty INFORM frame (the original's default).
DEFAULT_QUEUES: Final = ((DEFAULT_WEIGHT, DEFAULT_QUEUE),)

MAX_FRAMES: Final = 16
MAX_MSGID_BYTES: Final = 128
MAX_QUEUE_NAME_BYTES: Final = 256
MAX_QUEUES_PER_WORKER: Final = 64
MAX_HEADERS_BYTES: Final = 1024
MAX_WEIGHT: Final = 2**31 - 1
MAX_RETRIES: Final = 1_000_000
MAX_TIMEOUT: Final = 86_400 * 365


class EmqpError(ProtocolError):
    """Malformed eMQP input."""


# -- commands -----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Headers:
    """A REQUEST's comma-joined headers; names this broker does not know are kept in ``raw``."""

    raw: bytes = b""
    reply_requested: bool = False
    guarantee: bool = False
    retry_count: int | None = None
    timeout: float | None = None


NO_HEADERS: Final = Headers()


@dataclass(frozen=True, slots=True)
class Inform:
    """INFORM: a worker (or a scheduler, ``peer_type``) announces itself and the weighted queues it
    serves; answered ACK."""

    msgid: bytes
    queues: tuple[tuple[int, str], ...]
    peer_type: str


@dataclass(frozen=True, slots=True)
class Ack:
    """ACK: the broker took the INFORM ``acked``."""

    msgid: bytes
    acked: bytes


# The commands a broker handles for every job are named tuples: immutable like the frozen
# dataclasses of the others, and about three times cheaper to build (the parsers below
# build them with tuple.__new__, without the Python __new__ a named tuple adds: a third of
# the cost again).
class Ready(NamedTuple):
    """READY: a worker has one more free slot."""

    msgid: bytes


class Request(NamedTuple):
    """REQUEST: a job for ``queue``, from a client to the broker and from the broker to a worker."""

    msgid: bytes
    queue: bytes
    headers: Headers
    body: bytes

    @property
    def queue_name(self) -> str:
        """The queue's name as text."""
        return self.queue.decode("utf-8")

    def value(self) -> Any:
        """The body's JSON."""
        return json.loads(self.body)


class Reply(NamedTuple):
    """A result: from a worker to the broker, or forwarded by the broker to the client."""

    msgid: bytes
    result: bytes
    request_msgid: bytes

    def value(self) -> Any:
        """The result's JSON."""
        return json.loads(self.result)


class DispatchAck(NamedTuple):
    """The broker tells a client its request went to a worker (a 5-frame REPLY)."""

    msgid: bytes
    request_msgid: bytes


class Heartbeat(NamedTuple):
    """HEARTBEAT: the sender is alive (any message counts as one)."""

    msgid: bytes
    #: The sender's ``time.time()`` as text (the original's), or empty (the text's).
    sent_at: bytes


@dataclass(frozen=True, slots=True)
class Kbye:
    """KBYE: the sender leaves (a worker: forget it; the broker: INFORM again)."""

    msgid: bytes


@dataclass(frozen=True, slots=True)
class Disconnect:
    """DISCONNECT: a worker leaves, as KBYE (the original's admin command to stop the router is
    refused)."""

    msgid: bytes


@dataclass(frozen=True, slots=True)
class Schedule:
    """SCHEDULE or UNSCHEDULE: queue, headers, interval, body, cron (eventmq's frames);
    or, beyond it, UNSCHEDULE with one field: the id of the schedule to remove."""

    command: bytes
    msgid: bytes
    fields: tuple[bytes, ...]

    @property
    def schedule_id(self) -> str | None:
        """The id an UNSCHEDULE names directly (None: it gives eventmq's frames)."""
        return self.fields[0].decode("ascii") if len(self.fields) == 1 else None


@dataclass(frozen=True, slots=True)
class Status:
    """STATUS: the admin asks for the broker's state, answered in a REPLY as JSON."""

    msgid: bytes


@dataclass(frozen=True, slots=True)
class Schedules:
    """The admin asks for every schedule the broker keeps."""

    msgid: bytes


@dataclass(frozen=True, slots=True)
class Hello:
    """emq-cli's greeting as it connects; eventmq's router does not answer it."""

    msgid: bytes


@dataclass(frozen=True, slots=True)
class ShowWorkers:
    """eventmq's ROUTER_SHOW_WORKERS: the connected workers and the queues they serve."""

    msgid: bytes


@dataclass(frozen=True, slots=True)
class ShowSchedulers:
    """eventmq's ROUTER_SHOW_SCHEDULERS: the connected scheduler peers."""

    msgid: bytes


Command = (
    Inform
    | Ack
    | Ready
    | Request
    | Reply
    | DispatchAck
    | Heartbeat
    | Kbye
    | Disconnect
    | Schedule
    | Status
    | Schedules
    | Hello
    | ShowWorkers
    | ShowSchedulers
)


# -- parsing ------------------------------------------------------------------------------------


def _text(frame: bytes, what: str) -> str:
    try:
        return frame.decode("utf-8")
    except UnicodeDecodeError:
        raise EmqpError(f"{what} is not UTF-8", "not-utf8") from None


def _check_text(frame: bytes, what: str) -> None:
    if not frame.isascii():
        _text(frame, what)


def _msgid(frame: bytes) -> bytes:
    if not frame:
        raise EmqpError("empty message id", "bad-msgid")
    if len(frame) > MAX_MSGID_BYTES:
        raise EmqpError(f"message id over {MAX_MSGID_BYTES} bytes", "bad-msgid")
    _check_text(frame, "message id")
    return frame


_DECODER = json.JSONDecoder()
_decode_json = _DECODER.decode
_scan_json = _DECODER.scan_once  # type: ignore[attr-defined]  # set in __init__, untyped


def _json(frame: bytes, what: str) -> Any:
    # Decoded here: json.loads(bytes) would first guess the encoding, at every message.
    try:
        text = frame.decode("utf-8")
    except UnicodeDecodeError:
        raise EmqpError(f"{what} is not UTF-8", "not-utf8") from None
    # The scanner alone takes a value with no white space around it (what peers send) at a
    # third of decode()'s cost, which a broker pays twice per job; decode() judges the rest.
    try:
        value, end = _scan_json(text, 0)
    except (ValueError, RecursionError, StopIteration):
        end = -1
    if end == len(text):
        return value
    try:
        return _decode_json(text)
    except (ValueError, RecursionError):
        raise EmqpError(f"{what} is not JSON", "bad-json") from None


def _count(frames: list[bytes], count: int, command: bytes) -> None:
    """The command's own frames (after the message id) must be ``count``."""
    have = len(frames) - 4
    if have != count:
        raise EmqpError(
            f"{command.decode()} has {have} frames, wants {count}",
            "truncated" if have < count else "extra-frames",
        )


def queue_name(frame: bytes) -> str:
    """A queue name frame as text; :class:`EmqpError` when it is empty, too long or not UTF-8."""
    if not frame:
        raise EmqpError("empty queue name", "bad-queue")
    if len(frame) > MAX_QUEUE_NAME_BYTES:
        raise EmqpError(f"queue name over {MAX_QUEUE_NAME_BYTES} bytes", "bad-queue")
    return _text(frame, "queue name")


def parse_queues(frame: bytes) -> tuple[tuple[int, str], ...]:
    """INFORM's queues: the original's JSON ``[[weight, name], ...]``, the text's
    comma-separated names (weight 10), or nothing (``default``)."""
    if not frame.strip():
        return DEFAULT_QUEUES
    if frame.lstrip().startswith(b"["):
        value = _json(frame, "queues")
        if not isinstance(value, list) or not value:
            raise EmqpError("queues must be a non-empty list", "bad-queues")
        queues = []
        for item in value:
            if (
                not isinstance(item, list)
                or len(item) != 2
                or type(item[0]) is not int
                or not isinstance(item[1], str)
            ):
                raise EmqpError("each queue must be [weight, name]", "bad-queues")
            weight, name = item
            if not 0 <= weight <= MAX_WEIGHT:
                raise EmqpError(f"queue weight {weight} out of range", "bad-queues")
            queues.append((weight, queue_name(name.encode("utf-8"))))
    else:
        names = [part.strip() for part in _text(frame, "queues").split(",")]
        queues = [(DEFAULT_WEIGHT, queue_name(name.encode())) for name in names if name]
        if not queues:
            raise EmqpError("no queue names", "bad-queues")
    if len(queues) > MAX_QUEUES_PER_WORKER:
        raise EmqpError(f"more than {MAX_QUEUES_PER_WORKER} queues", "bad-queues")
    seen: dict[str, int] = {}
    for weight, name in queues:  # the same name twice: its highest weight
        seen[name] = max(weight, seen.get(name, weight))
    return tuple((weight, name) for name, weight in seen.items())


def _header_number(name: str, text: str, largest: int) -> int:
    try:
        number = int(text)
    except ValueError:
        raise EmqpError(f"header {name}:{text!r} is not a number", "bad-header") from None
    if not 0 <= number <= largest:
        raise EmqpError(f"header {name}:{number} out of range", "bad-header")
    return number


_HEADERS_SEEN: dict[bytes, Headers] = {}


def parse_headers(frame: bytes) -> Headers:
    """``reply-requested,guarantee,retry-count:N,timeout:N`` (any order; unknown names kept)."""
    if not frame:
        return NO_HEADERS
    # Clients send a handful of distinct header strings: each is parsed once.
    seen = _HEADERS_SEEN.get(frame)
    if seen is not None:
        return seen
    headers = _parse_headers(frame)
    if len(_HEADERS_SEEN) >= 1024:
        _HEADERS_SEEN.clear()
    _HEADERS_SEEN[frame] = headers
    return headers


def _parse_headers(frame: bytes) -> Headers:
    if len(frame) > MAX_HEADERS_BYTES:
        raise EmqpError(f"headers over {MAX_HEADERS_BYTES} bytes", "bad-header")
    reply = guarantee = False
    retries: int | None = None
    timeout: float | None = None
    for part in _text(frame, "headers").split(","):
        name, _, argument = part.strip().partition(":")
        if name == "reply-requested":
            reply = True
        elif name == "guarantee":
            guarantee = True
        elif name == "retry-count":
            retries = _header_number(name, argument, MAX_RETRIES)
        elif name == "timeout":
            seconds = _header_number(name, argument, MAX_TIMEOUT)
            timeout = float(seconds) if seconds > 0 else None  # 0: no timeout (original)
    return Headers(frame, reply, guarantee, retries, timeout)


# Each parser takes the whole message (``['', PROTOCOL, COMMAND, msgid, ...]``): its own
# frames start at index 4, read in place rather than from a copied slice.


def _inform(msgid: bytes, frames: list[bytes]) -> Inform:
    if len(frames) > 6:
        raise EmqpError("INFORM has extra frames", "extra-frames")
    queues = parse_queues(frames[4]) if len(frames) > 4 else DEFAULT_QUEUES
    peer_type = _text(frames[5], "peer type") if len(frames) > 5 else WORKER
    if peer_type not in (WORKER, SCHEDULER):
        raise EmqpError(f"peer type {peer_type[:40]!r} is not worker or scheduler", "bad-peer")
    return Inform(msgid, queues, peer_type)


def _ack(msgid: bytes, frames: list[bytes]) -> Ack:
    _count(frames, 1, ACK)
    return Ack(msgid, _msgid(frames[4]))


_new = tuple.__new__


def _ready(msgid: bytes, frames: list[bytes]) -> Ready:
    if len(frames) != 4:
        _count(frames, 0, READY)
    return _new(Ready, (msgid,))


def python_is_ready(frames: list[bytes]) -> bool:
    """Whether ``frames`` is a READY :func:`parse` takes, told without building it (a
    worker sends one per job); False: :func:`parse` says what it is. :data:`is_ready` is
    this, compiled where it was built."""
    if len(frames) != 4 or frames[2] != READY or frames[1] != PROTOCOL or frames[0]:
        return False
    msgid = frames[3]
    return 0 < len(msgid) <= MAX_MSGID_BYTES and msgid.isascii()


def _request(msgid: bytes, frames: list[bytes]) -> Request:
    if len(frames) != 7:
        _count(frames, 3, REQUEST)
    queue = frames[4]
    if not 0 < len(queue) <= MAX_QUEUE_NAME_BYTES or not queue.isascii():
        queue_name(queue)  # raises, unless it is non-ASCII UTF-8
    body = frames[6]
    _json(body, "request body")
    headers = _HEADERS_SEEN.get(frames[5]) or parse_headers(frames[5])
    return _new(Request, (msgid, queue, headers, body))


def _reply(msgid: bytes, frames: list[bytes]) -> Reply | DispatchAck:
    if len(frames) == 5:
        return _new(DispatchAck, (msgid, _msgid(frames[4])))
    if len(frames) != 6:
        _count(frames, 2, REPLY)
    result = frames[4]
    _json(result, "reply")
    request_msgid = frames[5]
    if not 0 < len(request_msgid) <= MAX_MSGID_BYTES or not request_msgid.isascii():
        _msgid(request_msgid)  # raises, unless it is non-ASCII UTF-8
    return _new(Reply, (msgid, result, request_msgid))


def _heartbeat(msgid: bytes, frames: list[bytes]) -> Heartbeat:
    if len(frames) > 5:
        raise EmqpError("HEARTBEAT has extra frames", "extra-frames")
    sent_at = frames[4] if len(frames) > 4 else b""
    _check_text(sent_at, "heartbeat time")
    return _new(Heartbeat, (msgid, sent_at))


def _kbye(msgid: bytes, frames: list[bytes]) -> Kbye:
    _count(frames, 0, KBYE)
    return Kbye(msgid)


def _disconnect(msgid: bytes, frames: list[bytes]) -> Disconnect:
    _count(frames, 0, DISCONNECT)
    return Disconnect(msgid)


def _schedule(command: bytes) -> Any:
    def parse(msgid: bytes, frames: list[bytes]) -> Schedule:
        if command == UNSCHEDULE and len(frames) == 5:
            schedule_id = frames[4]
            if not 0 < len(schedule_id) <= MAX_MSGID_BYTES or not schedule_id.isascii():
                raise EmqpError("a schedule id is short ASCII text", "bad-schedule")
            return Schedule(command, msgid, (schedule_id,))
        _count(frames, 5, command)
        queue, headers, interval, body, cron = frames[4:]
        queue_name(queue)
        parse_headers(headers)
        _check_text(interval, "interval")
        _json(body, "schedule body")
        _check_text(cron, "cron")
        return Schedule(command, msgid, (queue, headers, interval, body, cron))

    return parse


def _status(msgid: bytes, frames: list[bytes]) -> Status:
    _count(frames, 0, STATUS)
    return Status(msgid)


def _schedules(msgid: bytes, frames: list[bytes]) -> Schedules:
    _count(frames, 0, SCHEDULES)
    return Schedules(msgid)


def _admin(command: bytes, kind: Any) -> Any:
    def parse(msgid: bytes, frames: list[bytes]) -> Any:
        _count(frames, 0, command)
        return kind(msgid)

    return parse


_PARSERS: Final[dict[bytes, Any]] = {
    REQUEST: _request,
    REPLY: _reply,
    READY: _ready,
    HEARTBEAT: _heartbeat,
    INFORM: _inform,
    ACK: _ack,
    KBYE: _kbye,
    DISCONNECT: _disconnect,
    SCHEDULE: _schedule(SCHEDULE),
    UNSCHEDULE: _schedule(UNSCHEDULE),
    STATUS: _status,
    SCHEDULES: _schedules,
    HELLO: _admin(HELLO, Hello),
    ROUTER_SHOW_WORKERS: _admin(ROUTER_SHOW_WORKERS, ShowWorkers),
    ROUTER_SHOW_SCHEDULERS: _admin(ROUTER_SHOW_SCHEDULERS, ShowSchedulers),
}


#: The compiled parser of a job's commands (bus/emqp/_jobscan.c), or None (not built, or
#: ``BUS_NATIVE_EMQP=0``): it takes only what :func:`parse` takes, and builds the same.
native: Any = compiled("bus.emqp._jobscan", "BUS_NATIVE_EMQP")
if native is not None:
    native.setup(Ready, Request, Reply, _HEADERS_SEEN, NO_HEADERS)
#: :func:`python_is_ready`, compiled where it was built.
is_ready: Callable[[list[bytes]], bool] = native.is_ready if native is not None else python_is_ready


def _no_job(frames: list[bytes]) -> Command | None:
    return None


#: A client's REQUEST or a worker's REPLY or READY -> its command, compiled; None for
#: anything else (then :func:`parse_other`), and always None where it was not built. For
#: the broker's path, which calls it without :func:`parse`'s own call around it.
parse_job: Callable[[list[bytes]], Command | None] = native.parse if native is not None else _no_job
#: :data:`parse_job` of a message as a ROUTER reads it (its peer's identity first), without
#: the copy that leaving the identity out makes: ``parse_job(message[1:])``.
parse_routed: Callable[[list[bytes]], Command | None] = (
    native.parse_routed if native is not None else _no_job
)


def parse(frames: list[bytes]) -> Command:
    """One message as received (without the ROUTER identity) -> its command."""
    command = parse_job(frames)  # a REQUEST, REPLY or READY in C; None: anything else
    return command if command is not None else _parse(frames)


def _parse(frames: list[bytes]) -> Command:
    """:func:`parse` in Python: every command, every error (:func:`parse_other`)."""
    if len(frames) < 4:
        raise EmqpError(f"{len(frames)} frames, an eMQP message has at least 4", "truncated")
    if len(frames) > MAX_FRAMES:
        raise EmqpError(f"{len(frames)} frames, at most {MAX_FRAMES}", "extra-frames")
    if frames[0]:
        raise EmqpError("first frame is not the empty delimiter", "bad-delimiter")
    if frames[1] != PROTOCOL:
        raise EmqpError("protocol is not eMQP/1.0", "bad-protocol")
    parser = _PARSERS.get(frames[2])
    if parser is None:
        raise EmqpError(f"unknown command {frames[2][:20]!r}", "unknown-command")
    msgid = frames[3]
    if not 0 < len(msgid) <= MAX_MSGID_BYTES or not msgid.isascii():
        _msgid(msgid)  # raises, unless it is non-ASCII UTF-8
    parsed: Command = parser(msgid, frames)
    return parsed


#: :func:`parse` for what :func:`parse_job` gave None: every command, every error.
parse_other = _parse


def refused_schedule_msgid(frames: list[bytes]) -> bytes | None:
    """The message id of a SCHEDULE or UNSCHEDULE that :func:`parse` refused, when its
    envelope and id are sound enough to answer it (a client waits for that answer); else
    None."""
    if len(frames) < 4 or frames[0] or frames[1] != PROTOCOL:
        return None
    if frames[2] not in (SCHEDULE, UNSCHEDULE):
        return None
    try:
        return _msgid(frames[3])
    except EmqpError:
        return None


# -- building -----------------------------------------------------------------------------------


# A random UUID4 per process whose last 48 bits count up: still UUID4-shaped and unique
# (2^48 ids per process), at a tenth of uuid4()'s cost, which a broker pays twice per job.
_MSGID_PREFIX = str(uuid.uuid4())[:24].encode("ascii")
_MSGID_START = int.from_bytes(os.urandom(4), "big")
_msgid_counter = itertools.count(_MSGID_START)


def python_new_msgid() -> bytes:
    """A new message id: UUID4-shaped, unique per process."""
    return b"%s%012x" % (_MSGID_PREFIX, next(_msgid_counter) & 0xFFFFFFFFFFFF)


if native is not None:  # the same ids from the same counter, in C: a tenth of the cost
    native.msgids(_MSGID_PREFIX, _MSGID_START)
#: A new message id (:func:`python_new_msgid`; compiled where it was built).
new_msgid: Callable[[], bytes] = native.new_msgid if native is not None else python_new_msgid


def message(command: bytes, *fields: bytes, msgid: bytes | None = None) -> list[bytes]:
    """An eMQP message of ``command`` with ``fields`` (a new msgid unless given), without an
    identity."""
    return [b"", PROTOCOL, command, msgid or new_msgid(), *fields]


def inform(
    queues: tuple[tuple[int, str], ...] | list[tuple[int, str]], peer_type: str
) -> list[bytes]:
    """INFORM in the original's form (JSON queues and a peer type)."""
    if peer_type == SCHEDULER:
        return message(INFORM, b"", SCHEDULER.encode())
    encoded = json.dumps([[weight, name] for weight, name in queues]).encode()
    return message(INFORM, encoded, peer_type.encode())


def ack(acked: bytes) -> list[bytes]:
    """An ACK of the INFORM ``acked``."""
    return message(ACK, acked)


def ready() -> list[bytes]:
    """A READY."""
    return message(READY)


def heartbeat(now: float) -> list[bytes]:
    """A HEARTBEAT carrying ``now`` (the original's form)."""
    return message(HEARTBEAT, repr(now).encode())


def kbye() -> list[bytes]:
    """A KBYE."""
    return message(KBYE)


def encode_headers(
    reply_requested: bool = False,
    guarantee: bool = False,
    retry_count: int = 0,
    timeout: float = 0,
) -> bytes:
    """A REQUEST's headers frame, as the original client joins them."""
    parts = []
    if reply_requested:
        parts.append("reply-requested")
    if guarantee:
        parts.append("guarantee")
    if retry_count > 0:
        parts.append(f"retry-count:{int(retry_count)}")
    if timeout > 0:
        parts.append(f"timeout:{int(timeout)}")
    return ",".join(parts).encode()


def with_reply_requested(headers: Headers) -> bytes:
    """The headers a worker gets: ``reply-requested`` always, so that the broker learns
    when every job ends (the original job manager replies only when asked)."""
    if headers.reply_requested:
        return headers.raw
    return b"reply-requested," + headers.raw if headers.raw else b"reply-requested"


def request(queue: str, body: bytes, headers: bytes, msgid: bytes | None = None) -> list[bytes]:
    """A REQUEST for ``queue`` (``msgid``: the client's, when the broker passes it on)."""
    return message(REQUEST, queue.encode("utf-8"), headers, body, msgid=msgid)


def reply(result: bytes, request_msgid: bytes) -> list[bytes]:
    """A 6-frame REPLY: ``result`` of the request ``request_msgid``."""
    return message(REPLY, result, request_msgid)


def schedule(
    queue: str, body: bytes, headers: bytes, interval: float | None, cron: str | None
) -> list[bytes]:
    """SCHEDULE in eventmq's frames: interval in seconds as text (-1 with a cron line)."""
    every = b"-1" if interval is None else repr(interval).removesuffix(".0").encode()
    return message(SCHEDULE, queue.encode("utf-8"), headers, every, body, (cron or "").encode())


def unschedule(schedule_id: str) -> list[bytes]:
    """UNSCHEDULE naming the schedule by its id (eventmq's form repeats the SCHEDULE)."""
    return message(UNSCHEDULE, schedule_id.encode("ascii"))


def dispatch_ack(request_msgid: bytes) -> list[bytes]:
    """The 5-frame REPLY telling a client its request ``request_msgid`` went to a worker."""
    return message(REPLY, request_msgid)


def result_value(value: Any) -> bytes:
    """A worker's result as the original job manager sends it: ``{"value": ...}``."""
    try:
        return json.dumps({"value": value}).encode()
    except (TypeError, ValueError) as error:
        return json.dumps({"value": str(error)}).encode()


#: What eventmq's job manager puts in ``value`` where we answer an error ``reason``: code
#: written against eventmq reads ``value`` (a job past its timeout: ``"TimeoutError"``).
EVENTMQ_VALUE_OF: Final = {"timeout": "TimeoutError"}


def error_result(reason: str, text: str, value: Any = None) -> bytes:
    """What a client receives, in a 6-frame REPLY, when its request failed (the broker gave
    up on it, or its job failed): ``{"error": reason, "message": text}``, with eventmq's
    ``"value"`` beside them when there is one (``value``, else :data:`EVENTMQ_VALUE_OF`)."""
    result: dict[str, Any] = {"error": reason, "message": text}
    if value is None:
        value = EVENTMQ_VALUE_OF.get(reason)
    if value is not None:
        result["value"] = value
    return json.dumps(result).encode()
