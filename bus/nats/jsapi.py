"""JetStream's API as the ranged reads use it: the request subjects and bodies, the
replies' errors, and what a consumer's delivery says in its reply subject."""

from __future__ import annotations

import datetime
import json
from collections.abc import Sequence
from typing import Any, NamedTuple

from bus.nats import codec
from bus.nats.codec import hpub

API = "$JS.API"
#: JetStream's errors: a message get that found nothing, a stream name not found, a
#: stream whose subjects another stream holds.
NO_MESSAGE_FOUND = 10037
STREAM_NOT_FOUND = 10059
OVERLAPPING_SUBJECTS = 10065
#: Errors (``err_code``) that pass once a leader is elected or a stream or consumer
#: placed: incomplete results, no peers for placement yet, not assigned to this server,
#: temporarily unavailable, not the leader, consumer creation failed, a Raft error,
#: stream or consumer offline. A cluster still forming answers with them, in status 400
#: too (10005 while a stream's replicas are not all up).
PASSING_ERRORS = frozenset({10004, 10005, 10007, 10008, 10009, 10012, 10041, 10118, 10119})
#: Status 503 errors that do not pass: JetStream not enabled (for the account), not
#: clustered, not supported in clustered mode.
LASTING_503 = frozenset({10076, 10039, 10010, 10036})


class JetStreamError(Exception):
    """JetStream answered a request with an error."""

    def __init__(self, code: int, err_code: int, description: str) -> None:
        super().__init__(f"{description} (status {code}, error {err_code})")
        self.code = code
        self.err_code = err_code
        self.description = description

    @property
    def passes(self) -> bool:
        """Whether asking again may succeed: JetStream was between leaders or placing,
        not refusing what was asked."""
        if self.code == 503:
            return self.err_code not in LASTING_503
        return self.err_code in PASSING_ERRORS or "leader" in self.description.lower()


def answer(payload: bytes) -> dict[str, Any]:
    """A reply's JSON object, :class:`JetStreamError` when it is an error, or ValueError
    when it is no JSON object."""
    reply = json.loads(payload)
    if not isinstance(reply, dict):
        raise ValueError(f"a JetStream reply that is no JSON object: {payload[:200]!r}")
    error = reply.get("error")
    if error:
        raise JetStreamError(
            int(error.get("code", 0)), int(error.get("err_code", 0)), error.get("description", "")
        )
    return reply


def refused(payload: bytes) -> JetStreamError | None:
    """The error a reply carries, or None (also for no JSON object: the caller finds it
    is no acknowledgement). The JSON is read only when the bytes may hold an error: most
    acknowledgements carry none."""
    if b'"error"' not in payload:
        return None
    try:
        answer(payload)
    except JetStreamError as error:
        return error
    except ValueError:
        return None
    return None


#: Where an acknowledgement gives the stream sequence (of the last message, for a batch).
SEQ_KEY = b'"seq":'


def number_in(payload: bytes, key: bytes) -> int | None:
    """The digits after ``key`` (such as ``b'"seq":'``) in a reply, without a JSON parse
    (an acknowledgement is read for every message stored), or None."""
    at = payload.find(key)
    if at < 0:
        return None
    end = at + len(key)
    while payload[end : end + 1] == b" ":
        end += 1
    stop = end
    while stop < len(payload) and payload[stop] in b"0123456789":
        stop += 1
    return int(payload[end:stop]) if stop > end else None


def stored_sequence(payload: bytes) -> int:
    """The stream sequence a publish's acknowledgement gives, :class:`JetStreamError` when
    it is a refusal, or ValueError when it is no acknowledgement."""
    error = refused(payload)
    if error is not None:
        raise error
    sequence = number_in(payload, SEQ_KEY)
    if sequence is None:
        raise ValueError(f"not an acknowledgement: {payload[:200]!r}")
    return sequence


def disagreements(found: dict[str, Any], wanted: dict[str, Any]) -> list[str]:
    """What a stream found has that the options do not say, one phrase each (numbers in
    floats compared to a thousandth)."""
    said = []
    for key, value in wanted.items():
        have = found.get(key)
        if isinstance(value, float):
            same = have is not None and abs(float(have) - value) < 1e-3
        else:
            same = have == value
        if not same:
            said.append(f"{key} is {have!r}, the options say {value!r}")
    return said


#: The key of a stream's metadata that an import writing into it sets (to what it imports)
#: and removes once it is done: a service does not start on a stream half imported.
IMPORTING = "bus_importing"


def importing(config: dict[str, Any]) -> str | None:
    """What an import is writing into the stream whose ``config`` this is (None: none)."""
    metadata = config.get("metadata") or {}
    value = metadata.get(IMPORTING) if isinstance(metadata, dict) else None
    return str(value) if value else None


def unfinished_import(stream: str, config: dict[str, Any]) -> str | None:
    """The sentence a service starting on this stream says when an import is writing into
    it (None: none is): it must not serve a stream half imported."""
    what = importing(config)
    if what is None:
        return None
    return (
        f"stream {stream} is being imported into ({what}), or an import of it was "
        "interrupted: start once the import has ended (run the same import again with "
        "--resume to finish it)"
    )


def stream_info(stream: str) -> str:
    """The request subject of a stream's configuration and state."""
    return f"{API}.STREAM.INFO.{stream}"


def _instant(text: str) -> float:
    """Seconds since the epoch of one of JetStream's times (RFC 3339, nanoseconds, UTC)."""
    whole, _, rest = text.partition(".")
    fraction = rest.rstrip("Z").split("+")[0].split("-")[0] if rest else ""
    stamp = datetime.datetime.fromisoformat(whole.rstrip("Z")).replace(tzinfo=datetime.UTC)
    return stamp.timestamp() + (float("0." + fraction) if fraction.isdigit() else 0.0)


def leader_for(info: dict[str, Any]) -> float | None:
    """How long the stream's leader had led when it answered this ``STREAM.INFO`` (the
    answer's ``ts`` less its ``cluster.leader_since``, both the leader's clock), or None
    when it does not say (no leader, one server, an older nats-server)."""
    since = (info.get("cluster") or {}).get("leader_since")
    now = info.get("ts")
    if not since or not now:
        return None
    try:
        return _instant(str(now)) - _instant(str(since))
    except ValueError:
        return None


def message_get(stream: str) -> str:
    """A stored message, answered by the stream's leader (``{"seq": N}``, with
    ``"next_by_subj"`` the first at or after N under a subject filter)."""
    return f"{API}.STREAM.MSG.GET.{stream}"


def consumer_create(stream: str, name: str = "") -> str:
    """Making a consumer; one of ours named (``name``) is made once however often asked."""
    return f"{API}.CONSUMER.CREATE.{stream}.{name}" if name else f"{API}.CONSUMER.CREATE.{stream}"


def consumer_delete(stream: str, consumer: str) -> str:
    """The request subject deleting a consumer."""
    return f"{API}.CONSUMER.DELETE.{stream}.{consumer}"


def consumer_next(stream: str, consumer: str) -> str:
    """The request subject of a pull consumer's next messages (the body is :func:`pull`)."""
    return f"{API}.CONSUMER.MSG.NEXT.{stream}.{consumer}"


def ranged_consumer(
    stream: str, start: int, filters: list[str], idle: float = 30.0, name: str = ""
) -> bytes:
    """An ephemeral pull consumer from ``start`` with no acks, on one replica, in memory:
    a read, not a subscription (gone ``idle`` seconds after its reader). Named, asking
    again for it is safe (:func:`consumer_create`)."""
    config: dict[str, Any] = {
        "deliver_policy": "by_start_sequence",
        "opt_start_seq": start,
        "ack_policy": "none",
        "replay_policy": "instant",
        "inactive_threshold": int(idle * 1e9),
        "num_replicas": 1,
        "mem_storage": True,
    }
    if name:
        config["name"] = name
    if len(filters) == 1:
        config["filter_subject"] = filters[0]
    elif filters:
        config["filter_subjects"] = filters
    return json.dumps({"stream_name": stream, "config": config}).encode()


def pull(batch: int, expires: float, max_bytes: int = 0, heartbeat: float = 0.0) -> bytes:
    """A pull request's body: up to ``batch`` messages (and ``max_bytes``, when given), the request
    expiring after ``expires`` seconds; with ``heartbeat``, the server says every that many
    seconds that the request still waits (a status 100), so that silence means the consumer
    or its server is gone (at most half ``expires``)."""
    request: dict[str, Any] = {"batch": batch, "expires": int(expires * 1e9)}
    if max_bytes:
        request["max_bytes"] = max_bytes
    if heartbeat:
        request["idle_heartbeat"] = int(heartbeat * 1e9)
    return json.dumps(request).encode()


class Delivery(NamedTuple):
    """What a consumer's message says of itself in its reply subject."""

    stream_sequence: int
    #: When the stream stored it, in nanoseconds since the epoch.
    timestamp_ns: int
    #: Messages left for the consumer after this one.
    pending: int


def _ack_tokens(reply: bytes) -> list[bytes]:
    """The tokens from ``<delivered>`` on of ``$JS.ACK.<stream>.<consumer>.<delivered>.
    <sseq>.<cseq>.<ts>.<pending>`` (and of the form with a domain and an account hash in
    front and a token after)."""
    tokens = reply.split(b".")
    if len(tokens) == 9:
        return tokens[4:9]
    if len(tokens) >= 11:
        return tokens[6:11]
    raise ValueError(f"not a JetStream delivery: {reply[:200]!r}")


def delivery(reply: bytes) -> Delivery:
    """What a delivery's reply subject says (see :func:`_ack_tokens`)."""
    tokens = _ack_tokens(reply)
    return Delivery(int(tokens[1]), int(tokens[3]), int(tokens[4]))


def delivered_pending_stored(reply: bytes) -> tuple[int, int, float]:
    """How many times the stream delivered this message (this time included), how many
    messages are left for the consumer after it, and when the stream stored it (seconds
    since the epoch): one reading of the reply subject."""
    tokens = _ack_tokens(reply)
    return int(tokens[0]), int(tokens[4]), int(tokens[3]) / 1e9


def consumer_sequence(reply: bytes) -> int:
    """The consumer's own sequence of a delivery (gapless while nothing was lost)."""
    return int(_ack_tokens(reply)[2])


# -- publishing ------------------------------------------------------------------------------

#: Messages in one atomic batch (nats-server's default ``jetstream.limits.batch.max_msgs``).
ATOMIC_LIMIT = 1000
#: JetStream's error for an atomic batch holding an id it already stored (or twice).
DUPLICATE_IN_BATCH = 10201


def headers_most(msg_id: bytes) -> int:
    """The most bytes the header block of a message published with this id takes, either
    way (:func:`msg_id_headers`, or :func:`batch_headers` with our batch ids)."""
    return len(msg_id) + _HEADERS_BEYOND_ID


def msg_id_headers(msg_id: bytes) -> bytes:
    """The header block of a message the stream stores once per ``Nats-Msg-Id``."""
    return b"NATS/1.0\r\nNats-Msg-Id: " + msg_id + b"\r\n\r\n"


def batch_headers(msg_id: bytes, batch: bytes, index: int, commit: bool) -> bytes:
    """The header block of message ``index`` (from 1) of atomic batch ``batch``; the last
    one commits it (and alone gets the batch's acknowledgement)."""
    headers = (
        b"NATS/1.0\r\nNats-Msg-Id: " + msg_id + b"\r\nNats-Batch-Id: " + batch
        + b"\r\nNats-Batch-Sequence: %d\r\n" % index
    )  # fmt: skip
    if commit:
        headers += b"Nats-Batch-Commit: 1\r\n"
    return headers + b"\r\n"


def batch_publishes(
    messages: Sequence[tuple[bytes, bytes, bytes]], batch: bytes, reply: bytes
) -> bytes:
    """The ``HPUB`` commands of atomic batch ``batch``: each of ``messages`` (subject, message
    id, body) with :func:`batch_headers`, the last one committing it, answered on ``reply``.
    The same bytes as :func:`bus.nats.codec.hpub` of each, in two formats a message instead
    of a dozen concatenations: a front-end's writer makes one per event (compiled where
    bus/nats/_scan.c was built)."""
    if codec.native is not None:
        made: bytes | None = codec.native.batch_publishes(messages, batch, reply)
        if made is not None:
            return made
    return _batch_publishes(messages, batch, reply)


def _batch_publishes(
    messages: Sequence[tuple[bytes, bytes, bytes]], batch: bytes, reply: bytes
) -> bytes:
    """:func:`batch_publishes` in Python."""
    last = len(messages)
    out = []
    for index, (subject, msg_id, body) in enumerate(messages, 1):
        if index == last:
            out.append(hpub(subject, batch_headers(msg_id, batch, index, True), body, reply))
            break
        headers = _BATCH_HEADERS % (msg_id, batch, index)
        out.append(
            b"HPUB %b %d %d\r\n%b%b\r\n"
            % (subject, len(headers), len(headers) + len(body), headers, body)
        )
    return b"".join(out)


_BATCH_HEADERS = (
    b"NATS/1.0\r\nNats-Msg-Id: %b\r\nNats-Batch-Id: %b\r\nNats-Batch-Sequence: %d\r\n\r\n"
)


#: :func:`headers_most` less the id: a batch id (12 hex digits, ``-``, a count up to 20
#: digits) at the batch's last place, committing.
_HEADERS_BEYOND_ID = len(batch_headers(b"", b"f" * 12 + b"-" + b"9" * 20, ATOMIC_LIMIT, True))

#: The most bytes of a publish's command line (``HPUB`` omitted) beyond its subject: the
#: reply subject (an inbox and a count) and the header and total sizes, with the spaces.
PUBLISH_LINE_BEYOND_SUBJECT = 96
