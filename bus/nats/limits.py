"""What a NATS server takes, for a client that must never send what costs the connection.

- ``max_payload`` (the most bytes of headers and payload in one message) is in the
  server's INFO: :attr:`bus.nats.blocking.Connection.max_payload`.
- ``max_control_line`` (the most bytes of a command's line, after its name: for a publish,
  the subject, the reply subject and the sizes) is not: nats-server takes 4,096 unless
  configured, and closes a connection that sends more. :func:`longest_control_line` asks
  the server itself, with SUB lines of chosen lengths, each followed by a PING: a PONG says
  the line fits, the server's ``-ERR`` (and its closing the connection) says it does not.
  A line that does not fit costs its connection (a fresh one is made for the next); one
  that fits is unsubscribed at once, so the probe leaves nothing behind.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable

from bus.nats import codec
from bus.nats.blocking import Connection
from bus.nats.codec import ProtocolError

__all__ = ["DEFAULT_CONTROL_LINE", "longest_control_line"]

#: nats-server's ``max_control_line`` unless configured.
DEFAULT_CONTROL_LINE = 4096
#: How close to the server's limit the probe comes (each step halves the distance).
PRECISION = 16


def _fits(connection: Connection, length: int) -> bool:
    """Whether the server reads a SUB whose line (after ``SUB ``) is ``length`` bytes; the
    connection is not to be used again after False."""
    sid = 1_000_000 + length  # 7 digits: never one of a subscription of the connection's own
    padding = length - len(f" {sid}") - len("_PROBE.") - 16
    subject = f"_PROBE.{os.urandom(8).hex()}{'x' * max(0, padding)}"
    try:
        connection.send(codec.sub(subject, sid))
        connection.flush()
    except ProtocolError as error:
        said = str(error).lower()
        if "control line" in said:
            return False
        if "permission" in said:
            return True  # the line was read: only the subject is not this user's
        raise
    except ConnectionError:
        return False  # closed before its -ERR was read
    connection.send(codec.unsub(sid))
    return True


def longest_control_line(connect: Callable[[], Connection], most: int) -> int:
    """The longest control line the server ``connect`` reaches takes, up to ``most``, to
    within :data:`PRECISION` bytes below its limit (0: not even the shortest probed)."""
    fits, fails = 0, most + 1
    length = most
    connection: Connection | None = None
    try:
        while fails - fits > PRECISION:
            if connection is None:
                connection = connect()
            if _fits(connection, length):
                fits = length
            else:
                fails = length
                connection.close()
                connection = None
            if fits == 0 and fails > DEFAULT_CONTROL_LINE:
                length = DEFAULT_CONTROL_LINE  # most servers: one probe more, not a search
            else:
                length = (fits + fails) // 2
    finally:
        if connection is not None:
            with contextlib.suppress(OSError):
                connection.close()
    return fits
