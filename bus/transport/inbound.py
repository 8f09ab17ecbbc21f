"""Connections others open to our ZeroMQ ports, bounded.

libzmq accepts every TCP connection a bound socket is offered, and holds each until its
peer leaves (an unfinished handshake for ``ZMQ_HANDSHAKE_IVL``). A few thousand idle
connections from anyone who can reach a port pinned a process at its descriptor limit:
its own sockets failed with "Too many open files" and libzmq's I/O thread spun on the
accept it could not make. Here each bound TCP port is watched through its socket monitor:
an accepted connection beyond the port's limit, beyond its peer address's limit on that
port, or beyond the process's share of descriptors for inbound connections is shut down
as soon as the monitor reports it (libzmq then closes it and gives the descriptor back),
and counted by reason. The rest of the descriptors stay for each service's own work.

The monitor reports a connection's descriptor, not its peer: the peer is read from the
descriptor when the event is handled, and a descriptor is only ever shut down after it was
checked to be a TCP connection accepted on that very port. A descriptor reported gone is
forgotten; one reused before its events were read is counted once, as what it is now.

:func:`raise_descriptor_limit` lifts the soft ``RLIMIT_NOFILE`` to the hard one at start.
No zmq import: the socket layer feeds :meth:`InboundGuard.accepted` and
:meth:`InboundGuard.disconnected`.
"""

from __future__ import annotations

import contextlib
import os
import resource
import socket
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from twisted.logger import Logger

from bus.transport.fdbudget import DescriptorBudget, descriptor_limit
from bus.util.droplog import RefusalCounter

log = Logger(namespace="bus.transport.inbound")

#: The share of the descriptor limit that inbound connections of all ports may hold
#: together; the rest is the process's own (stores, its own sockets, the HTTP port).
INBOUND_SHARE = 0.5
#: Refusal reasons, as counted.
REASONS = ("port", "address", "descriptors")


@dataclass(frozen=True, slots=True)
class DescriptorLimits:
    """The process's ``RLIMIT_NOFILE`` as found at start and as it is now."""

    found: int
    soft: int
    hard: int


def raise_descriptor_limit() -> DescriptorLimits:
    """Lift the soft descriptor limit to the hard one (an unprivileged process may), so
    that connections and the process's own files have the room the system allows."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    found = soft
    if soft != hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            soft = hard
        except (ValueError, OSError) as error:
            log.warn(
                "cannot raise the descriptor limit from {soft} to {hard}: {error}",
                soft=soft,
                hard=hard,
                error=str(error),
            )
    return DescriptorLimits(_finite(found), _finite(soft), _finite(hard))


def _finite(limit: int) -> int:
    return descriptor_limit() if limit == resource.RLIM_INFINITY or limit < 0 else limit


def open_descriptors() -> int | None:
    """How many descriptors the process holds now (None where /proc does not tell)."""
    try:
        return len(os.listdir("/proc/self/fd")) - 1  # the listing's own
    except OSError:
        return None


class InboundPolicy:
    """The process's bounds on inbound connections, and what they refused.

    ``per_port`` and ``per_address`` of 0 take defaults from the descriptor limit: a
    port at most half the inbound share, one peer address at most a quarter of a port's
    (64 at least)."""

    def __init__(self, per_port: int = 0, per_address: int = 0, limit: int | None = None) -> None:
        self.budget = DescriptorBudget(INBOUND_SHARE, per_socket=1, limit=limit)
        self.per_port = per_port or max(1, self.budget.capacity // 2)
        self.per_address = per_address or max(64, self.per_port // 4)
        self.guards: list[InboundGuard] = []
        self.refusals = RefusalCounter(
            log,
            "closed {count} inbound connection(s) beyond the {what} limit; latest on {port} "
            "from {address}",
            time.monotonic,
        )
        self._audited = -1.0

    def guard(self, name: str) -> InboundGuard:
        """The guard of one bound socket (``name`` in /status and the log)."""
        guard = InboundGuard(self, name)
        self.guards.append(guard)
        return guard

    def forget(self, guard: InboundGuard) -> None:
        """Stop watching a socket's guard (its socket closed)."""
        if guard in self.guards:
            self.guards.remove(guard)

    def refuse(self, guard: InboundGuard, reason: str, address: str) -> None:
        """Count a connection ``guard`` shut down for ``reason`` (``port``, ``address`` or
        ``descriptors``), and log it, rate-limited."""
        guard.refused[reason] += 1
        what = {
            "port": f"per-port ({self.per_port})",
            "address": f"per-address ({self.per_address})",
            "descriptors": f"inbound descriptor ({self.budget.capacity})",
        }[reason]
        self.refusals.refuse(reason, what=what, port=guard.name, address=address)

    @property
    def refused(self) -> Counter[str]:
        """Connections refused, by reason, over every port."""
        return self.refusals.counts

    def may_audit(self) -> bool:
        """Whether a refusal may look again (:meth:`audit`): once a second at most."""
        now = time.monotonic()
        if now - self._audited < 1.0:
            return False
        self._audited = now
        return True

    def audit(self) -> None:
        """Look again at every port's connections: the monitor's events are not all a
        connection's story (libzmq may end one without reporting it, a full pipe drops
        events), so what is held is checked against the descriptors themselves."""
        for guard in list(self.guards):
            guard.audit()

    def held_by_name(self) -> dict[str, int]:
        """Connections held on the bound sockets, summed by socket name (``collector``,
        ``zre-mailbox``): what ``/metrics`` labels, stable across restarts (no port numbers,
        which may be ephemeral). As last audited (:meth:`status` audits)."""
        held: Counter[str] = Counter()
        for guard in self.guards:
            held[guard.name] += guard.held
        return dict(held)

    def status(self) -> dict[str, Any]:
        """The bounds, what is held and what was refused, per port (``/status``); audits first."""
        self.audit()
        return {
            "per_port": self.per_port,
            "per_address": self.per_address,
            "share": self.budget.capacity,
            "held": self.budget.in_use,
            "refused": {reason: self.refused[reason] for reason in REASONS},
            "ports": {
                f"{g.name}:{','.join(map(str, sorted(g.ports)))}": g.held for g in self.guards
            },
        }


class InboundGuard:
    """The accepted connections of one bound socket, by descriptor and peer address."""

    def __init__(self, policy: InboundPolicy, name: str) -> None:
        self.policy = policy
        self.name = name
        #: The TCP ports this socket is bound to.
        self.ports: set[int] = set()
        self._peers: dict[int, str] = {}
        self._by_address: Counter[str] = Counter()
        self.refused: Counter[str] = Counter()

    @property
    def held(self) -> int:
        """Connections this socket holds now."""
        return len(self._peers)

    def holds(self, fd: int) -> bool:
        """Whether ``fd`` is a connection this port let in and holds."""
        return fd in self._peers

    def by_address(self) -> dict[str, int]:
        """Connections held, by peer address."""
        return dict(self._by_address)

    def accepted(self, fd: int) -> None:
        """The monitor reported ``fd`` accepted: keep it, or shut it down and count why."""
        if fd in self._peers:  # reused before its DISCONNECTED was read: counted anew
            self._forget(fd)
        peer = self._peer_of(fd)
        if peer is None:
            return  # gone already, or no longer a connection of this port
        reason = self._over(peer)
        # A connection ended unreported must not refuse anyone: look again, at most once
        # a second (a look costs a few system calls per connection held; floods refuse many).
        if reason is not None and self.policy.may_audit():
            self.policy.audit()
            reason = self._over(peer)
        if reason is None and not self.policy.budget.acquire():
            if self.policy.may_audit():
                self.policy.audit()
            if not self.policy.budget.acquire():
                reason = "descriptors"
        if reason is not None:
            self._shut(fd)
            self.policy.refuse(self, reason, peer)
            return
        self._peers[fd] = peer
        self._by_address[peer] += 1

    def shut(self, address: str | None = None) -> int:
        """Shut down every connection held (from ``address`` only, when given); libzmq sees
        each end, closes it and reports it. Returns how many."""
        shut = [fd for fd, peer in self._peers.items() if address is None or peer == address]
        for fd in shut:
            self._shut(fd)
        return len(shut)

    def disconnected(self, fd: int) -> None:
        """The monitor reported ``fd`` closed."""
        if fd in self._peers:
            self._forget(fd)

    def close(self) -> None:
        """The socket is closed: everything it held is given back."""
        for fd in list(self._peers):
            self._forget(fd)
        self.policy.forget(self)

    def _over(self, peer: str) -> str | None:
        if len(self._peers) >= self.policy.per_port:
            return "port"
        if self._by_address[peer] >= self.policy.per_address:
            return "address"
        return None

    def _forget(self, fd: int) -> None:
        peer = self._peers.pop(fd)
        self._by_address[peer] -= 1
        if self._by_address[peer] <= 0:
            del self._by_address[peer]
        self.policy.budget.release()

    def audit(self) -> None:
        """Forget descriptors no longer connections of this port from the peer recorded."""
        for fd, peer in list(self._peers.items()):
            if self._peer_of(fd) != peer:
                self._forget(fd)

    def _peer_of(self, fd: int) -> str | None:
        """The peer address of ``fd`` if it is a TCP connection accepted on our port."""
        with _borrowed(fd) as sock:
            if sock is None or sock.family not in (socket.AF_INET, socket.AF_INET6):
                return None
            if sock.getsockname()[1] not in self.ports:
                return None
            return str(sock.getpeername()[0])
        return None  # an OSError inside: the connection is gone

    def _shut(self, fd: int) -> None:
        """Shut the connection down; libzmq sees it end and closes the descriptor."""
        with _borrowed(fd) as sock:
            if sock is not None:
                sock.shutdown(socket.SHUT_RDWR)


@contextlib.contextmanager
def _borrowed(fd: int) -> Iterator[socket.socket | None]:
    """libzmq's descriptor as a socket object (None if it is no socket now), never closed
    here; an OSError inside (the connection gone meanwhile) is swallowed, leaving None
    where a value was due."""
    try:
        sock = socket.socket(fileno=fd)
    except OSError:
        yield None
        return
    try:
        yield sock
    except OSError:
        pass
    finally:
        sock.detach()


_policy: InboundPolicy | None = None


def policy() -> InboundPolicy:
    """The process's policy (made with defaults on first use)."""
    global _policy
    if _policy is None:
        _policy = InboundPolicy()
    return _policy


def configure(per_port: int = 0, per_address: int = 0) -> InboundPolicy:
    """Set the process's bounds (``--max-connections``, ``--max-connections-per-address``)
    before any port is bound; 0 keeps a default."""
    global _policy
    _policy = InboundPolicy(per_port, per_address)
    return _policy
