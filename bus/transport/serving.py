"""What every ZeroMQ server of the product does around its own sockets, in one place.

At start (:meth:`ServerPorts.open`): CURVE's keys are loaded (a bad key file is a
:class:`bus.errors.StartupError` naming the option), a socket factory is made, ZAP is bound in
its context before any secured socket binds, then the service opens and binds its sockets;
if any step fails, what was opened is closed again and the error goes on. Once serving
(:meth:`ServerPorts.announce`): the warning for plain-text ports on a public address and the
line that says how each port is secured. At stop (:meth:`ServerPorts.close`): CURVE's
reloads and ZAP stop and the factory closes every socket it made. The service's periodic
work runs on :attr:`ServerPorts.periodic`, stopped with it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from twisted.logger import Logger

from bus.transport.security import ServerCurve
from bus.transport.zmqsocket import SocketFactory
from bus.util.periodic import Periodic


class ServerPorts:
    """One server's ZeroMQ side: its CURVE, its socket factory, its periodic work.

    ``shared``: a factory another service of the process made, used while CURVE is off
    (a ZeroMQ context has one ZAP handler, so a CURVE server keeps a context of its own)."""

    def __init__(
        self,
        reactor: Any,
        curve: ServerCurve,
        log: Logger,
        shared: SocketFactory | None = None,
    ) -> None:
        self.reactor = reactor
        self.curve = curve
        self.periodic = Periodic(reactor, log)
        #: The factory of the service's sockets, from :meth:`open` until :meth:`close`.
        self.factory: SocketFactory | None = None
        self._shared = shared

    def open(
        self,
        open_sockets: Callable[[SocketFactory], None],
        undo: Callable[[], object] = lambda: None,
    ) -> SocketFactory:
        """Load CURVE, make the factory, start ZAP, then ``open_sockets(factory)``. On
        any failure: ``undo()`` (the service's own cleanup, e.g. its store), then
        :meth:`close`, and the error is raised again."""
        curve = self.curve
        try:
            curve.load()
            shared = self._shared if curve.keys is None else None
            self.factory = factory = shared or SocketFactory(self.reactor)
            curve.start(factory, self.periodic)
            open_sockets(factory)
        except BaseException:
            undo()
            self.close()
            raise
        return factory

    def announce(self, bind: str, endpoints: Iterable[str]) -> None:
        """Say how the ports are secured, and warn about plain text on a public address."""
        listed = sorted(endpoints)
        self.curve.warn_if_open(bind, listed)
        self.curve.log_security(listed)

    def close(self) -> None:
        """Stop the periodic work and CURVE; shut the factory down (a shared one stays)."""
        self.periodic.stop_all()
        self.curve.stop()
        factory, self.factory = self.factory, None
        if factory is not None and factory is not self._shared:
            factory.shutdown()
