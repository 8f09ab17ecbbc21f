"""A stand-in for the original Node.js Event BUS (micro-toolkit/event-bus-zeromq 3.0.4), as
its lib/bus.js behaves on the wire (learned from its behaviour, not its code; run and probed
at commit 3eb44e5 on 2026-11-23, with its in-memory test store and with MongoDB's casts):

* no heartbeat at all;
* SYNCSTART's sequence frame is read with JavaScript's parseInt of the frame as a string:
  8 binary bytes parse as NaN, and then it logs ``Sending snapshot=NaN``. With its MongoDB
  store (as deployed) it answers nothing (the driver refuses to cast NaN); with its in-memory
  store it answers at once with a SYNCEND carrying its current sequence and no SYNC
  (``nan_answers=True``);
* subtrees are split on ``,`` and matched as plain string prefixes (empty: everything);
* it turns the snapshot client's ROUTER identity into a string and back, so only an identity
  that is valid UTF-8 gets its answers routed back;
* BROADCAST, SYNC and SYNCEND carry sequences as decimal text; SYNCEND carries its current
  sequence; a snapshot replays every stored event above the sequence, in order.
"""

from __future__ import annotations

import re
from typing import Any

import zmq

from bus.transport.zmqsocket import SocketFactory, SocketOptions, bind_consecutive

_LEADING_INTEGER = re.compile(r"\s*([+-]?\d+)")


def parse_int(frame: bytes) -> int | None:
    """JavaScript's parseInt(buffer.toString()): None for NaN."""
    match = _LEADING_INTEGER.match(frame.decode("utf-8", "replace"))
    return int(match.group(1)) if match else None


class FakeOriginalBus:
    def __init__(self, reactor: Any, nan_answers: bool = False) -> None:
        #: Its in-memory store's behaviour for a NaN sequence: a SYNCEND at once.
        self.nan_answers = nan_answers
        self.events: list[tuple[bytes, int, bytes, bytes, bytes, bytes]] = []
        self.log: list[str] = []
        #: Sequences stored but not broadcast (to show that clients heal lost tails).
        self.lose_broadcasts: set[int] = set()
        # P, P+1 and P+2 must all be free: another test may hold P+1 or P+2.
        bind_consecutive(
            lambda base: self._bind_ports(reactor, base),
            lambda: self.factory.shutdown(),
            base=0,
            count=3,
            host="127.0.0.1",
        )

    def _bind_ports(self, reactor: Any, port: int) -> None:
        self.factory = SocketFactory(reactor)
        self.snapshot = self.factory.socket(
            zmq.ROUTER, self._on_snapshot, SocketOptions(linger_ms=0), name="fake-snapshot"
        )
        self.publisher = self.factory.socket(
            zmq.PUB, None, SocketOptions(linger_ms=0), name="fake-publisher"
        )
        self.collector = self.factory.socket(
            zmq.ROUTER, self._on_collected, SocketOptions(linger_ms=0), name="fake-collector"
        )
        self.port = port
        self.snapshot.bind(f"tcp://127.0.0.1:{port}")
        self.publisher.bind(f"tcp://127.0.0.1:{self.port + 1}")
        self.collector.bind(f"tcp://127.0.0.1:{self.port + 2}")

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def sequence(self) -> int:
        return len(self.events)

    def _on_collected(self, batch: list[list[bytes]]) -> None:
        for frames in batch:
            topic, _sequence, producer, timestamp, uuid, data = frames[1:]
            sequence = self.sequence + 1
            self.events.append((topic, sequence, producer, timestamp, uuid, data))
            if sequence not in self.lose_broadcasts:
                self.publisher.send_frames(
                    [topic, str(sequence).encode(), producer, timestamp, uuid, data]
                )

    def _on_snapshot(self, batch: list[list[bytes]]) -> None:
        for identity, command, spec, sequence_frame in (m for m in batch if len(m) == 4):
            if command != b"SYNCSTART":
                continue
            since = parse_int(sequence_frame)
            self.log.append(f"Sending snapshot={'NaN' if since is None else since}")
            if since is None and not self.nan_answers:
                continue
            # Through a string and back: a binary identity no longer names the peer.
            routed = identity.decode("utf-8", "replace").encode("utf-8")
            prefixes = [p for p in spec.split(b",") if p]
            for topic, sequence, producer, timestamp, uuid, data in self.events:
                if since is None:
                    break  # nothing compares above NaN
                if sequence > since and (not prefixes or topic.startswith(tuple(prefixes))):
                    self.snapshot.send_frames(
                        [routed, b"SYNC", topic, str(sequence).encode(), producer, timestamp,
                         uuid, data]
                    )  # fmt: skip
            self.snapshot.send_frames([routed, b"SYNCEND", spec, str(self.sequence).encode()])

    def close(self) -> None:
        self.factory.shutdown()
