"""mc0 test helpers: a broker on a free port, and raw (CURVE) DEALER peers on the reactor.

Nothing here imports txzmq at import time (conftest rule): imports happen inside calls.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

from bus.mc0.core import BrokerSettings


def start_broker(data_dir: Path, activity: Any = None, **settings: Any) -> Any:
    """A running Mc0Service on a free port of 127.0.0.1 (``settings`` override Mc0Config
    fields; ``broker=`` takes a BrokerSettings). CURVE with the key pair kept in
    ``data_dir``, as the tap makes it, unless ``curve=`` says otherwise (``CurveSettings()``:
    ``--plain``). Stop it with ``stopService()``."""
    from bus.application.activity import NO_ACTIVITY
    from bus.mc0.config import Mc0Config
    from bus.mc0.server import Mc0Service
    from bus.transport.curve_settings import CurveSettings

    config = replace(
        Mc0Config(port=0, data_dir=data_dir, curve=CurveSettings(key_dir=data_dir)), **settings
    )
    service = Mc0Service(config, activity or NO_ACTIVITY)
    service.startService()
    return service


def settings(**values: Any) -> BrokerSettings:
    return BrokerSettings(**values)


class RawMc0Peer:
    """A raw DEALER (CURVE when ``server_key`` is given) that records what it receives."""

    def __init__(
        self,
        endpoint: str,
        server_key: bytes | None = None,
        keys: Any = None,
        identity: bytes | None = None,
    ) -> None:
        import zmq

        from bus.transport.curve import CurveKeyPair, make_curve_client
        from bus.transport.zmqsocket import SocketFactory, SocketOptions
        from bus.util.reactor import reactor_of

        self.factory = SocketFactory(reactor_of(None))
        self.messages: list[list[bytes]] = []
        self.keys = keys or CurveKeyPair.generate()
        self.socket = self.factory.socket(
            zmq.DEALER,
            self.messages.extend,
            SocketOptions(linger_ms=0, send_hwm=100_000, receive_hwm=100_000, identity=identity),
        )
        if server_key is not None:
            make_curve_client(self.socket, server_key, self.keys)
        self.socket.connect(endpoint)

    def send(self, *frames: bytes) -> None:
        if not self.socket.send_frames(list(frames)):
            raise RuntimeError("raw peer would block")

    def replies(self, verb: bytes) -> list[list[bytes]]:
        """Messages whose verb (after an optional empty delimiter) is ``verb``."""
        out = []
        for message in self.messages:
            body = message[1:] if message and not message[0] else message
            if body and body[0] == verb:
                out.append(message)
        return out

    def close(self) -> None:
        self.factory.shutdown()
