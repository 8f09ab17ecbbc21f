"""eventmq's PUBLISH service (``emq-pubsub``) on the wire, sans-I/O.

A publisher (eventmq's ``send_publish_request`` on its DEALER ``Sender``) sends, after the
ROUTER's identity frame::

    ['', 'eMQP/1.0', 'PUBLISH', msgid, topic, message]

where ``message`` is the JSON text of the value published. Nothing is answered. The
service sends ``[topic, message]`` on its PUB port, so a SUB's prefix subscription picks
topics. eventmq's ``emq-pubsub`` looks at the command frame only, takes frames 5 and 6 as
they are and ignores the rest; it decodes every frame as UTF-8 and stops for good on one
that is not, or on a PUBLISH of fewer than 7 frames. This codec reads the envelope as the
broker's codec does (:mod:`bus.emqp.codec`) and refuses, with an :class:`EmqpError` whose
``reason`` names the defect, what eventmq would stop on or what no eventmq client sends.
HEARTBEAT is taken (no answer), as eventmq's service ignores it. Nothing else escapes.
"""

from __future__ import annotations

from typing import Final, NamedTuple

from bus.emqp.codec import HEARTBEAT, MAX_MSGID_BYTES, PROTOCOL, EmqpError

PUBLISH: Final = b"PUBLISH"

#: Frames of a PUBLISH after the ROUTER identity.
PUBLISH_FRAMES: Final = 6


class Publish(NamedTuple):
    """PUBLISH: ``message`` (JSON text) for the subscribers of ``topic``; nothing is answered."""

    msgid: bytes
    topic: bytes
    message: bytes


class Heartbeat(NamedTuple):
    """HEARTBEAT: a publisher is alive; taken without an answer."""

    msgid: bytes


Command = Publish | Heartbeat


def _utf8(frame: bytes, what: str) -> None:
    if not frame.isascii():
        try:
            frame.decode("utf-8")
        except UnicodeDecodeError:
            raise EmqpError(f"{what} is not UTF-8", "not-utf8") from None


def parse(frames: list[bytes]) -> Command:
    """One message as received (without the ROUTER identity) -> its command."""
    if len(frames) < 4:
        raise EmqpError(f"{len(frames)} frames, an eMQP message has at least 4", "truncated")
    if frames[0]:
        raise EmqpError("first frame is not the empty delimiter", "bad-delimiter")
    if frames[1] != PROTOCOL:
        raise EmqpError("protocol is not eMQP/1.0", "bad-protocol")
    command, msgid = frames[2], frames[3]
    if not 0 < len(msgid) <= MAX_MSGID_BYTES:
        raise EmqpError(f"message id empty or over {MAX_MSGID_BYTES} bytes", "bad-msgid")
    _utf8(msgid, "message id")
    if command == PUBLISH:
        if len(frames) != PUBLISH_FRAMES:
            raise EmqpError(
                f"PUBLISH has {len(frames) - 4} frames, wants 2 (topic, message)",
                "truncated" if len(frames) < PUBLISH_FRAMES else "extra-frames",
            )
        topic, message = frames[4], frames[5]
        _utf8(topic, "topic")
        _utf8(message, "message")
        return Publish(msgid, topic, message)
    if command == HEARTBEAT:
        if len(frames) > 5:
            raise EmqpError("HEARTBEAT has extra frames", "extra-frames")
        return Heartbeat(msgid)
    raise EmqpError(f"unknown command {command[:20]!r}", "unknown-command")


def publish(topic: bytes, message: bytes, msgid: bytes) -> list[bytes]:
    """A PUBLISH as a publisher sends it (without an identity)."""
    return [b"", PROTOCOL, PUBLISH, msgid, topic, message]


def subscriber_frames(command: Publish) -> list[bytes]:
    """What subscribers receive: ``[topic, message]``, as eventmq's service sends it."""
    return [command.topic, command.message]
