"""A blocking client's way through a NATS cluster: one connection at a time, to whichever
server answers, and an operation tried again while what fails it may pass by itself.

What passes (:func:`passing`): a server lost, refusing or silent (the connection is
left and the next server tried first), a request nobody answered (503: a consumer not
yet known everywhere, JetStream's API between leaders), and JetStream's answers while it
elects a leader or places a stream or a consumer. Those are tried again, after a pause
doubled from :attr:`Retry.first` up to :attr:`Retry.most`, for up to :attr:`Retry.within`
seconds from the first failure; then :class:`Unavailable` says in one line what was
being done, the servers tried and the last cause. Anything else (a refused credential,
a stream that does not exist) fails at once.

The servers go round as :class:`bus.nats.rotation.Rotation` says: those given, then
those the cluster's INFO names (``connect_urls``); a server in lame-duck mode (``ldm``)
is left before the next operation, for another.

Spark's stream source uses it on its driver (the stream's state) and on its executors
(each partition's read, :class:`bus.eventbus.stream_read.RangeReader`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TypeVar

from bus.nats import jsapi
from bus.nats.blocking import Connection
from bus.nats.codec import ProtocolError
from bus.nats.credentials import shown
from bus.nats.handshake import ConnectError
from bus.nats.rotation import Rotation, discovered

__all__ = ["ONCE", "Failover", "Retry", "Unavailable", "discovered", "passing"]

T = TypeVar("T")

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Retry:
    """How long an operation is tried again while it fails for passing reasons."""

    #: Seconds from its first failure before it fails for good (0: at the first). An
    #: attempt under way then ends first: a silent server costs its connection's timeout.
    within: float = 60.0
    #: The first pause between attempts, doubled after each up to ``most``.
    first: float = 0.1
    most: float = 2.0


#: Fail at the first failure (the connection is still left for the next server).
ONCE = Retry(within=0.0)

#: What a server's -ERR says when it refuses our credentials or permissions, and what a
#: failed connection says of a certificate that does not verify: asking again changes
#: nothing.
LASTING = (
    "authorization violation",
    "authentication expired",
    "authentication revoked",
    "permissions violation",
    "certificate_verify_failed",
)


class Unavailable(ConnectError):
    """An operation failed for passing reasons for longer than :attr:`Retry.within`."""


def passing(error: BaseException) -> bool:
    """Whether a failure may pass by itself, so that the operation is worth trying again
    (on another server)."""
    if isinstance(error, jsapi.JetStreamError):
        return error.passes
    if isinstance(error, (ProtocolError, ConnectError)):
        # A server's -ERR, or every server refused, was silent or said -ERR.
        said = str(error).lower()
        return not any(lasting in said for lasting in LASTING)
    if isinstance(error, (ValueError, LookupError)):
        # An answer we cannot read, or a certificate that does not verify (an OSError
        # and a ValueError).
        return False
    # Lost, refused, silent (TimeoutError), no responders (ConnectionRefusedError).
    return isinstance(error, OSError)


class Failover:
    """One connection at a time to the servers of a cluster (:meth:`connection`), left
    for the next server when it fails (:meth:`drop`), and operations on it tried again
    while they fail for passing reasons (:meth:`call`).

    ``connect`` makes a connection to the first of the servers it is given that admits
    it (:class:`bus.nats.blocking.Connection` with the timeouts, TLS and credentials
    of the caller); the servers are given in turn, starting after the last one used."""

    def __init__(
        self,
        servers: Sequence[str],
        connect: Callable[[Sequence[str]], Connection],
        retry: Retry = ONCE,
        *,
        discover: bool = True,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.rotation = Rotation(servers, discover)
        self.retry = retry
        #: Every server tried, in the order first tried.
        self.tried: list[str] = []
        #: Failures that were tried again.
        self.retried = 0
        #: Connections left because their server went into lame-duck mode.
        self.left_lame_duck = 0
        self._connect, self._clock, self._sleep = connect, clock, sleep
        self._connection: Connection | None = None

    @property
    def servers(self) -> list[str]:
        """The servers given, then those discovered."""
        return self.rotation.servers

    def connection(self) -> Connection:
        """The connection, made when there is none (or its server is in lame-duck mode:
        then to the others first), to the servers in turn from the one after the last
        used."""
        order = None
        current = self._connection
        if current is not None:
            try:
                current.poll()  # an INFO that came meanwhile may say lame duck
            except (OSError, ProtocolError) as error:
                log.info("NATS server %s: %s", shown(current.server), error)
                self.drop()
                current = None
        if current is not None and current.lame_duck:
            log.info("NATS server %s is in lame-duck mode: leaving it", shown(current.server))
            self.left_lame_duck += 1
            order = [*self.rotation.elsewhere(current.server), current.server]
            self.drop()
        if self._connection is None:
            order = order or self.rotation.order()
            try:
                made = self._connect(order)
            except BaseException:
                self._tried(order)
                raise
            self._tried(order[: order.index(made.server) + 1] if made.server in order else order)
            self.rotation.reached(made.server, made.info)
            self._connection = made
        return self._connection

    def _tried(self, servers: Sequence[str]) -> None:
        self.tried += [url for url in servers if url not in self.tried]

    @property
    def current(self) -> Connection | None:
        """The connection made and not left since, if any."""
        return self._connection

    def drop(self) -> None:
        """Leave the connection: the next one goes to the next server."""
        connection, self._connection = self._connection, None
        if connection is not None:
            connection.close()

    def call(self, what: str, operation: Callable[[Connection], T]) -> T:
        """``operation(connection)``, tried again (on a new connection, to the next server)
        while it fails for passing reasons, for up to :attr:`Retry.within` seconds from the
        first failure; then :class:`Unavailable`, naming ``what``, the servers tried and
        the last cause. Other failures are raised as they are (the connection left too)."""
        first_failure: float | None = None
        pause = self.retry.first
        while True:
            server = ""
            try:
                connection = self.connection()
                server = connection.server
                done = operation(connection)
            except Exception as error:
                self.drop()  # whatever it was, the next operation starts afresh
                if not passing(error):
                    raise
                now = self._clock()
                if first_failure is None:
                    first_failure = now
                failing = now - first_failure
                if now + pause - first_failure > self.retry.within:
                    raise Unavailable(self._gave_up(what, server, error, failing)) from error
                self.retried += 1
                log.log(
                    logging.WARNING if failing == 0 else logging.INFO,
                    "%s: %s; trying again in %.2gs on the next server",
                    what,
                    _cause(server, error),
                    pause,
                )
                self._sleep(pause)
                pause = min(pause * 2, self.retry.most)
            else:
                if first_failure is not None:
                    log.warning(
                        "%s: answered again, by %s, after %.1fs",
                        what,
                        server,
                        self._clock() - first_failure,
                    )
                return done

    def _gave_up(self, what: str, server: str, error: BaseException, failing: float) -> str:
        """One line: what failed, for how long, on which servers, and the last cause."""
        cause = _cause(server, error)
        still = f" still failing after {failing:.1f}s" if self.retry.within > 0 else " failed"
        tried = ", ".join(map(shown, self.tried))
        return f"{what}{still} (servers tried: {tried}); last: {cause}"

    def close(self) -> None:
        """Leave the connection (as :meth:`drop`)."""
        self.drop()


def _cause(server: str, error: BaseException) -> str:
    """What failed, where (a ConnectError names each server itself)."""
    cause = str(error) or type(error).__name__
    return f"{shown(server)}: {cause}" if server else cause
