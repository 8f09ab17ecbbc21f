"""The echo service as a Twisted service: one ROUTER, the core, status and metrics."""

from __future__ import annotations

from typing import Any

import zmq
from twisted.application.service import Service
from twisted.logger import Logger

from bus.extension import (
    NO_ACTIVITY,
    ActivitySink,
    Metric,
    SocketFactory,
    SocketOptions,
    StartupError,
    ZmqSocket,
    counter,
    counters_by,
    reactor_of,
)
from echo_service.core import EchoCore

log = Logger(namespace="echo_service")


class EchoService(Service):
    """Echoes ``[b"ECHO", payload]`` on a ROUTER; composed, tells the bus about each echo."""

    def __init__(
        self,
        bind: str,
        port: int,
        max_bytes: int,
        activity: ActivitySink = NO_ACTIVITY,
        reactor: Any = None,
    ) -> None:
        self.bind, self.port = bind, port
        self.core = EchoCore(max_bytes)
        self.activity = activity
        self.reactor = reactor_of(reactor)
        self.endpoint = ""
        self._factory: SocketFactory | None = None
        self._router: ZmqSocket | None = None

    def startService(self) -> None:
        self._factory = SocketFactory(self.reactor)
        self._router = self._factory.socket(
            zmq.ROUTER, self._on_requests, SocketOptions(linger_ms=0), name="echo"
        )
        try:
            self.endpoint = self._router.bind(f"tcp://{self.bind}:{self.port or '*'}")
        except zmq.ZMQError as error:
            self._factory.shutdown()
            raise StartupError("port", f"cannot bind {self.bind}:{self.port}: {error}") from None
        Service.startService(self)
        log.info("echo service on {endpoint}", endpoint=self.endpoint)

    def _on_requests(self, batch: list[list[bytes]]) -> None:
        assert self._router is not None
        for identity, *frames in batch:
            answer, size = self.core.handle(frames)
            self._router.send_frames([identity, *answer])
            if size is not None:
                self.activity.publish("/echo/requests/", {"bytes": size})

    def stopService(self) -> None:
        Service.stopService(self)
        if self._factory is not None:
            self._factory.shutdown()
            self._factory = self._router = None

    #: What the console charts, as rates per second (a path into status()).
    console_rates = {"echoes": "echoed"}

    def status(self) -> dict[str, Any]:
        return {
            "endpoint": self.endpoint,
            "echoed": self.core.echoed,
            "echoed_bytes": self.core.echoed_bytes,
            "refused": dict(self.core.refused),
        }

    def metrics(self) -> list[Metric]:
        return [
            counter("echo_requests_total", "Requests echoed", self.core.echoed),
            counters_by(
                "echo_refused_total", "Requests refused, by reason", "reason", self.core.refused
            ),
        ]
