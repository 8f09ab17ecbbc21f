"""A service's share of the process's file descriptors.

Services share one process and so one ``RLIMIT_NOFILE``. A service that opens sockets on
behalf of others (a ZRE node opens a DEALER per peer found by beacon, a datagram anyone can
forge) takes them from its :class:`DescriptorBudget` and is refused, cleanly and countably,
past its share, so its load never takes the descriptors another service needs to answer.

No zmq import: the budget counts, its owner opens and closes.
"""

from __future__ import annotations

import resource
from typing import Final

#: Used when the soft limit is unlimited (a count must still be finite).
UNLIMITED_AS: Final = 65536


def descriptor_limit() -> int:
    """The process's soft ``RLIMIT_NOFILE``, as a number."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    return UNLIMITED_AS if soft == resource.RLIM_INFINITY or soft < 0 else soft


class DescriptorBudget:
    """At most ``share`` of the descriptor limit for the sockets counted through it.

    Each socket is counted as ``per_socket`` descriptors (a ZeroMQ socket holds its own
    signalling descriptor and, once connected, a TCP connection). :meth:`acquire` says
    whether one more fits and counts it; :meth:`release` gives one back.
    """

    def __init__(self, share: float = 0.25, per_socket: int = 2, limit: int | None = None) -> None:
        if not 0 < share <= 1:
            raise ValueError("share must be above 0 and at most 1")
        if per_socket < 1:
            raise ValueError("per_socket must be at least 1")
        self.limit = descriptor_limit() if limit is None else limit
        self.share = share
        self.per_socket = per_socket
        self.capacity = max(1, int(self.limit * share) // per_socket)
        self.in_use = 0
        self.refused = 0

    def acquire(self) -> bool:
        """Take one descriptor from the share; False when none is left."""
        if self.in_use >= self.capacity:
            self.refused += 1
            return False
        self.in_use += 1
        return True

    def release(self) -> None:
        """Give one descriptor back to the share."""
        self.in_use = max(0, self.in_use - 1)

    @property
    def available(self) -> int:
        """Descriptors left in the share."""
        return self.capacity - self.in_use
