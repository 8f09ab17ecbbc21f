"""The clients of the nemesis test (tests/test_eventbus_nemesis.py) and of the Spark
cluster test, one process on a host of their own: confirming publishers and full-feed subscribers, each given both front-ends
(in turned orders, so that both are used). Every record goes to a JSON-lines file in
``--out`` the moment it is made: ``pub-N.jsonl`` holds ``{"uuid", "seq"}`` for each event
its publisher was told was stored, ``sub-N.jsonl`` ``{"seq", "uuid", "t"}`` for each event
its subscriber delivered (``t``: when, on CLOCK_MONOTONIC, which every host of the machine
shares). Progress goes to stdout as JSON lines; ``{"cmd": "finish"}`` on
stdin stops publishing, waits until every event sent is confirmed and every subscriber
holds the log's last sequence, then prints ``FINISHED``.

    python -m tests.nemesis_clients --server 10.1.2.4:7000 --server 10.1.2.5:7000 --out DIR
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import IO, Any

from twisted.internet import reactor as _reactor
from twisted.internet import stdio, task
from twisted.protocols.basic import LineReceiver

from bus.eventbus.client import EventBusSubscriber
from bus.eventbus.codec import Event
from bus.eventbus.confirmed import ConfirmedPublisher

reactor: Any = _reactor


#: stdin and stdout belong to Twisted's StandardIO: lines go out through its transport.
_out: list[Any] = []


def say(kind: str, **fields: Any) -> None:
    _out[0].write((json.dumps({"event": kind, **fields}) + "\n").encode())


class Publishing:
    def __init__(self, index: int, servers: list[str], out: Path, rate: int) -> None:
        self.index = index
        self.client = ConfirmedPublisher(
            servers, f"nemesis-{index}", resend_after=5.0, failover_after=1.0
        )
        self.file: IO[str] = (out / f"pub-{index}.jsonl").open("a")
        self.sent = self.confirmed = self.failed = self.top = 0
        self.loop = task.LoopingCall(self.tick)
        self.burst = max(rate // 20, 1)

    def start(self) -> None:
        self.client.startService()
        self.client.when_ready().addCallback(lambda _: self.loop.start(0.05))

    def tick(self) -> None:
        for _ in range(self.burst):
            number = self.sent
            self.sent += 1
            event_id = f"{self.index:08x}-0000-4000-8000-{number:012x}"
            d = self.client.publish(
                f"/nemesis/{self.index}/{number % 7}/", number, event_id=event_id
            )
            d.addCallbacks(self.stored, self.lost, callbackArgs=(event_id,))

    def stored(self, sequence: int, event_id: str) -> None:
        self.confirmed += 1
        self.top = max(self.top, sequence)
        self.file.write(json.dumps({"uuid": event_id, "seq": sequence}) + "\n")
        self.file.flush()

    def lost(self, failure: Any) -> None:
        self.failed += 1

    def stop_sending(self) -> None:
        if self.loop.running:
            self.loop.stop()


class Following:
    def __init__(self, index: int, servers: list[str], out: Path) -> None:
        self.file: IO[str] = (out / f"sub-{index}.jsonl").open("a")
        self.client = EventBusSubscriber(servers, [], self.deliver, failover_after=1.0)
        self.delivered = 0

    def deliver(self, event: Event) -> None:
        self.delivered += 1
        record = {"seq": event.sequence, "uuid": event.uuid.decode(), "t": time.monotonic()}
        self.file.write(json.dumps(record) + "\n")
        self.file.flush()


class Commands(LineReceiver):
    delimiter = b"\n"

    def __init__(self, run: Run) -> None:
        self.run = run

    def connectionMade(self) -> None:
        _out.append(self.transport)

    def lineReceived(self, line: bytes) -> None:
        command = json.loads(line)
        if command.get("cmd") == "finish":
            self.run.finish()


class Run:
    def __init__(self, args: argparse.Namespace) -> None:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        servers: list[str] = args.server

        def turned(index: int) -> list[str]:
            return servers[index % len(servers) :] + servers[: index % len(servers)]

        self.publishers = [Publishing(i, turned(i), out, args.rate) for i in range(args.publishers)]
        self.subscribers = [Following(i, turned(i), out) for i in range(args.subscribers)]
        self.finishing = False

    def start(self) -> None:
        for sub in self.subscribers:
            sub.client.startService()
        for pub in self.publishers:
            pub.start()
        task.LoopingCall(self.report).start(1.0)

    def counts(self) -> dict[str, Any]:
        return {
            "sent": sum(p.sent for p in self.publishers),
            "confirmed": sum(p.confirmed for p in self.publishers),
            "failed": sum(p.failed for p in self.publishers),
            "resent": sum(p.client.resent for p in self.publishers),
            "delivered": [s.delivered for s in self.subscribers],
            "last": [s.client.last_sequence for s in self.subscribers],
            "head": [s.client.core.server_sequence for s in self.subscribers],
            "failovers": [p.client.publisher.failovers for p in self.publishers]
            + [s.client.failovers for s in self.subscribers],
        }

    def report(self) -> None:
        counts = self.counts()
        ready = all(p.client.ready for p in self.publishers)
        say("PROGRESS", ready=ready, **counts)
        if self.finishing and self.settled():
            self.finishing = False
            say("FINISHED", **counts)

    def settled(self) -> bool:
        if any(p.client.unconfirmed for p in self.publishers):
            return False
        if not self.subscribers:
            return True
        head = max(s.client.core.server_sequence for s in self.subscribers)
        top = max((p.top for p in self.publishers), default=0)
        return head >= top and all(s.client.last_sequence == head for s in self.subscribers)

    def finish(self) -> None:
        for pub in self.publishers:
            pub.stop_sending()
        self.finishing = True


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--server", action="append", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--publishers", type=int, default=2)
    parser.add_argument("--subscribers", type=int, default=2)
    parser.add_argument("--rate", type=int, default=200, help="events/s per publisher")
    args = parser.parse_args()
    run = Run(args)
    stdio.StandardIO(Commands(run))
    reactor.callWhenRunning(run.start)
    reactor.run()


if __name__ == "__main__":
    main()
