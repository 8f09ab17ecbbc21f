"""Guaranteed requests in a JetStream work-queue stream (``--store jetstream``), sans I/O:
the subjects, the stream's and consumers' settings, and a stored request's body.

Every broker of a cluster serves the same stream. A guaranteed request taken by broker A
is appended to ``<prefix>.jobs.<queue>`` with its msgid as the message id (a client that
resends after a failover stores it once); A answers nobody of it until the stream
acknowledged it. Each queue has one durable pull consumer that every broker shares; a
broker pulls from it only as many requests as its READY workers of that queue can take,
so brokers share the load with no coordinator. The broker holding a request keeps telling
the stream it is in progress; its worker's REPLY acknowledges it (the stream forgets it),
a request given up on is terminated. A broker that dies stops telling: after the
consumer's ``ack_wait`` the stream delivers the request to another broker, with its
delivery count (eventmq's retries: at least once, the count kept).

Replies, acknowledgements and errors for a client go back through the broker it is
connected to: core NATS subject ``<prefix>.broker.<id>``, each broker listening on its own.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import msgpack

from bus.emqp.schedules import ROW_FIELDS
from bus.nats.tokens import SubjectError, token, untoken

#: The version of :class:`StreamedJob`'s body; a broker refuses bodies it cannot read.
BODY_VERSION = 1


class JobBodyError(ValueError):
    """A stream message that is not a request a broker appended."""


@dataclass(frozen=True, slots=True)
class StreamedJob:
    """A guaranteed request as the stream keeps it."""

    #: The broker its client is connected to (its replies go there).
    origin: bytes
    client: bytes
    msgid: bytes
    queue: bytes
    headers: bytes
    body: bytes
    received: float
    #: Re-dispatches allowed when it was taken (``retry-count``, else the broker's default).
    retries: int


def encode(job: StreamedJob) -> bytes:
    """A request as the stream's message body (msgpack, versioned)."""
    packed: bytes = msgpack.packb(
        [
            BODY_VERSION,
            job.origin,
            job.client,
            job.msgid,
            job.queue,
            job.headers,
            job.body,
            job.received,
            job.retries,
        ],
        use_bin_type=True,
    )
    return packed


def decode(data: bytes) -> StreamedJob:
    """A stream message's body as a request; :class:`JobBodyError` for anything a broker did not
    append."""
    try:
        fields = msgpack.unpackb(data, raw=True)
    except Exception as error:  # msgpack raises several kinds for broken bytes
        raise JobBodyError(f"not msgpack: {error}") from None
    if not isinstance(fields, list) or len(fields) != 9 or fields[0] != BODY_VERSION:
        raise JobBodyError("not a stored request of this version")
    _, origin, client, msgid, queue, headers, body, received, retries = fields
    if not all(isinstance(v, bytes) for v in (origin, client, msgid, queue, headers, body)):
        raise JobBodyError("a stored request's fields are not bytes")
    if not isinstance(received, (int, float)) or not isinstance(retries, int) or retries < 0:
        raise JobBodyError("a stored request's time or retries are not numbers")
    return StreamedJob(origin, client, msgid, queue, headers, body, float(received), retries)


def job_subject(prefix: str, queue: bytes) -> str:
    """Where the stream keeps the requests of ``queue``."""
    return f"{prefix}.jobs.{token(queue)}"


def queue_of(prefix: str, subject: str) -> bytes:
    """The queue of a request's subject; :class:`SubjectError` for another subject."""
    head = prefix + ".jobs."
    if not subject.startswith(head) or "." in subject[len(head) :]:
        raise SubjectError(f"{subject[:80]!r} is not a queue's subject under {prefix!r}")
    return untoken(subject[len(head) :])


def direct_subject(prefix: str, queue: bytes) -> str:
    """Where requests not kept in the stream are offered to the brokers serving ``queue``
    (a queue group: one of them answers)."""
    return f"{prefix}.direct.{token(queue)}"


#: The queue group of the brokers' offers.
OFFER_GROUP = "emqp-brokers"
TAKEN = b"1"


def broker_subject(prefix: str, broker_id: bytes) -> str:
    """Where answers for the clients of broker ``broker_id`` go (core NATS)."""
    return f"{prefix}.broker.{token(broker_id)}"


def consumer_name(queue: bytes) -> str:
    """A durable consumer's name for the queue (no ``.``, ``*``, ``>``, slashes)."""
    return "q_" + token(queue).replace("~", "-x")


def msg_id(msgid: bytes) -> bytes:
    """The ``Nats-Msg-Id`` of a request: header-safe, one per eventmq msgid."""
    return msgid.hex().encode()


def stream_config(name: str, prefix: str, replicas: int, duplicate_window: float) -> dict[str, Any]:
    """The work-queue stream of guaranteed requests (a new message refused when it is full)."""
    return {
        "name": name,
        "subjects": [f"{prefix}.jobs.>"],
        "retention": "workqueue",
        "storage": "file",
        "num_replicas": replicas,
        "duplicate_window": int(duplicate_window * 1e9),
        "discard": "new",
        # A batch of appends is one proposal to the replicas (nats-server 2.12+).
        "allow_atomic": True,
    }


#: The settings a made stream must have, as the checks compare them.
CHECKED = ("subjects", "retention", "num_replicas")


def consumer_config(stream: str, prefix: str, queue: bytes, ack_wait: float) -> bytes:
    """The request making the durable pull consumer every broker shares for ``queue`` (explicit
    acks; unacknowledged for ``ack_wait``: delivered again, without limit)."""
    name = consumer_name(queue)
    return json.dumps(
        {
            "stream_name": stream,
            "config": {
                "name": name,
                "durable_name": name,
                "filter_subject": job_subject(prefix, queue),
                "ack_policy": "explicit",
                "ack_wait": int(ack_wait * 1e9),
                "deliver_policy": "all",
                "replay_policy": "instant",
                "max_deliver": -1,
                "max_ack_pending": -1,
                "max_waiting": 4096,
            },
        }
    ).encode()


# -- schedules: a JetStream key-value bucket ------------------------------------------------------
#
# Every broker keeps the same schedules: SCHEDULE and UNSCHEDULE at any broker put or delete the
# schedule's key, and every broker watches the bucket. Which broker fires a run, and when, is
# decided by compare-and-set on the key (:mod:`bus.emqp.schedule_gate`). The bucket is a
# standard one (``nats kv`` reads it): stream ``KV_<bucket>``, subjects ``$KV.<bucket>.<key>``.


def bucket_name(stream: str) -> str:
    """The schedules' key-value bucket of ``stream``."""
    return f"{stream}_SCHEDULES"


def encode_row(row: tuple[Any, ...], pending: bool = False) -> bytes:
    """A schedule's key: its row (:class:`bus.emqp.schedules.ScheduleRow`), then whether
    its last run is fired and not yet stored (see :mod:`bus.emqp.schedule_gate`)."""
    packed: bytes = msgpack.packb([BODY_VERSION, *row, pending], use_bin_type=True)
    return packed


def decode_row(data: bytes) -> tuple[tuple[Any, ...], bool]:
    """:func:`encode_row`'s row and pending flag (a row written before the flag: not
    pending)."""
    try:
        fields = msgpack.unpackb(data, raw=False)
    except Exception as error:  # msgpack raises several kinds for broken bytes
        raise JobBodyError(f"not msgpack: {error}") from None
    if not isinstance(fields, list) or not fields or fields[0] != BODY_VERSION:
        raise JobBodyError("not a schedule of this version")
    row = fields[1:]
    if len(row) == len(ROW_FIELDS) + 1:
        return tuple(row[:-1]), row[-1] is True
    return tuple(row), False
