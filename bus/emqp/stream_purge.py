"""A queue purged in the brokers' JetStream stream, with the clients of its requests told.

The stream holds a queue's guaranteed requests under one subject; a broker holds only those
the stream delivered to it. A purge of the subject alone removed the others untold: their
clients, at any broker, waited for an answer that never came. So a purge:

1. pauses the queue's consumer (every broker shares it; made first if no broker has yet):
   from then on the stream delivers none of the queue's requests to any broker, and what it
   delivered before is fixed (``delivered.stream_seq``). The pause has an end of its own
   (:data:`PAUSE_FOR`, renewed while the read goes on), so a broker that dies half way
   leaves the queue paused for seconds, not for good;
2. reads the requests stored after the last one delivered: delivered to none, so run by
   none, so each one's client is to be told;
3. purges the subject up to the last one read (requests stored meanwhile are kept: nobody
   would tell their clients). Requests delivered before the pause go too, as they did: the
   broker that holds each runs it on, and its client gets the answer;
4. lifts the pause; and the broker tells each client read ``purged``, through the broker it
   is connected to, as answers go.

Requests read and left unpurged (the purge failed) are not told.

What this cannot tell: a request the stream delivered and a broker gave back (``nak``: its
workers left) or that a dead broker held (until ``ack_wait``) sits at or below
``delivered.stream_seq`` with those in flight, while no broker has it. The consumer says how
many such there are, not which: it is purged, and its client is not told.
"""

from __future__ import annotations

import base64
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from twisted.internet import defer

from bus.emqp import jobstream
from bus.nats import jsapi

#: Seconds a purge's pause of a consumer lasts unless renewed (it is lifted at the end).
PAUSE_FOR = 30.0
#: Seconds of reading after which the pause is renewed.
RENEW_AFTER = 10.0


@dataclass
class Purged:
    """What a purge removed from the stream: how many requests, and those of them the
    stream had delivered to no broker (their clients are to be told)."""

    removed: int = 0
    untold: list[jobstream.StreamedJob] = field(default_factory=list)
    #: Messages under the queue's subject that were no request (counted, not told).
    unreadable: int = 0


def _pause_body(clock: float) -> dict[str, Any]:
    until = datetime.fromtimestamp(clock, UTC) + timedelta(seconds=PAUSE_FOR)
    return {"pause_until": until.isoformat().replace("+00:00", "Z")}


@defer.inlineCallbacks
def purge(
    client: Any,
    reactor: Any,
    stream: str,
    prefix: str,
    queue: bytes,
    ack_wait: float,
    timeout: float,
) -> Any:
    """Purge ``queue``'s requests from ``stream`` (see the module's text); fires with
    :class:`Purged`. ``client``: a :class:`bus.nats.client.NatsClient`."""
    name = jobstream.consumer_name(queue)
    subject = jobstream.job_subject(prefix, queue)
    api = f"{jsapi.API}.CONSUMER"
    # Made as the brokers make it (the same config again is a no-op), so that none can make
    # it and pull between the read and the purge.
    yield client.request(
        jsapi.consumer_create(stream, name).encode(),
        jobstream.consumer_config(stream, prefix, queue, ack_wait),
        timeout=timeout,
    ).addCallback(lambda msg: jsapi.answer(msg.payload))
    pause = f"{api}.PAUSE.{stream}.{name}"
    yield client.jetstream(pause, _pause_body(reactor.seconds()), timeout=timeout)
    try:
        info = yield client.jetstream(f"{api}.INFO.{stream}.{name}", timeout=timeout)
        delivered = int(info.get("delivered", {}).get("stream_seq", 0))
        result = Purged()
        last = delivered  # the last sequence read (the read goes on after it)
        renewed = reactor.seconds()
        while True:
            if reactor.seconds() - renewed > RENEW_AFTER:
                yield client.jetstream(pause, _pause_body(reactor.seconds()), timeout=timeout)
                renewed = reactor.seconds()
            try:
                answer = yield client.jetstream(
                    jsapi.message_get(stream),
                    {"seq": last + 1, "next_by_subj": subject},
                    timeout=timeout,
                )
            except jsapi.JetStreamError as error:
                if error.code == 404:
                    break  # none stored after it
                raise
            message = answer["message"]
            last = int(message["seq"])
            try:
                result.untold.append(jobstream.decode(base64.b64decode(message.get("data", ""))))
            except (jobstream.JobBodyError, ValueError):
                result.unreadable += 1
        # Below the sequence after the last one read: what was stored after the read stays.
        body = {"filter": subject, "seq": last + 1}
        purged = yield client.jetstream(f"{jsapi.API}.STREAM.PURGE.{stream}", body, timeout=timeout)
        result.removed = int(purged.get("purged", 0))
    finally:
        # Lifted at once; if this is not answered, the pause ends by itself.
        lifted = client.jetstream(pause, None, timeout=timeout)
        lifted.addErrback(lambda _: None)
    return result


def described(result: Purged) -> dict[str, Any]:
    """What the operator's answer says of a stream's purge."""
    return {
        "purged_from_stream": result.removed,
        "clients_told": len([job for job in result.untold if job.client]),
        **({"unreadable": result.unreadable} if result.unreadable else {}),
    }
