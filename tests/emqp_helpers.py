"""Raw eMQP peers for tests: a worker and a client made of a RawPeer, speaking the frames
themselves, so that tests can make a worker take a job and die, stay silent, or reply late."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from bus.emqp import codec
from bus.testing import RawPeer, start_broker


def broker_in(tmp_path: Path, cleanup: list[Any], **settings: Any) -> Any:
    """A broker on free ports with its store in ``tmp_path``, stopped after the test."""
    broker = start_broker(tmp_path / "emqp", **settings)
    cleanup.append(broker)
    return broker


class RawWorker:
    def __init__(
        self, endpoint: str, queues: list[list[Any]] | None = None, identity: bytes | None = None
    ) -> None:
        self.identity = identity or codec.new_msgid()
        self.peer = RawPeer.dealer(endpoint, identity=self.identity)
        frames = codec.inform([tuple(q) for q in (queues or [[10, "default"]])], codec.WORKER)
        self.inform_msgid = frames[3]
        self.peer.send(frames)

    @property
    def messages(self) -> list[list[bytes]]:
        return self.peer.messages

    def commands(self, command: bytes) -> list[list[bytes]]:
        return [m for m in self.peer.messages if len(m) > 2 and m[2] == command]

    def acked(self) -> bool:
        return any(m[4:] == [self.inform_msgid] for m in self.commands(codec.ACK))

    def requests(self) -> list[list[bytes]]:
        return self.commands(codec.REQUEST)

    def ready(self, count: int = 1) -> None:
        for _ in range(count):
            self.peer.send(codec.ready())

    def reply(self, request: list[bytes], value: Any) -> None:
        self.peer.send(codec.reply(json.dumps({"value": value}).encode(), request[3]))

    def heartbeat(self) -> None:
        self.peer.send(codec.heartbeat(0.0))

    def close(self) -> None:
        self.peer.close()


class RawClient:
    def __init__(self, endpoint: str, identity: bytes | None = None) -> None:
        self.identity = identity or codec.new_msgid()
        self.peer = RawPeer.dealer(endpoint, identity=self.identity)

    def request(self, queue: str, body: Any, headers: bytes = b"reply-requested") -> bytes:
        frames = codec.request(queue, json.dumps(body).encode(), headers)
        self.peer.send(frames)
        return frames[3]

    def acks(self, msgid: bytes) -> list[list[bytes]]:
        """Dispatch acknowledgements (5-frame REPLY) of a request."""
        return [m for m in self.peer.messages if len(m) == 5 and m[2] == b"REPLY" and m[4] == msgid]

    def results(self, msgid: bytes) -> list[Any]:
        """Decoded results (6-frame REPLY) of a request."""
        return [
            json.loads(m[4])
            for m in self.peer.messages
            if len(m) == 6 and m[2] == b"REPLY" and m[5] == msgid
        ]

    def close(self) -> None:
        self.peer.close()
