"""The clients of the mc0 nemesis test (tests/test_mc0_nemesis.py), one process on a host of
their own: mc0 connectors (CURVE, TTL 2 s) given both brokers (in turned orders, so that
both are used), each subscribed to one topic and PUTting to it with IDs at a steady rate.
Every record goes to ``--out``/``client-N.jsonl`` the moment it is made:

- ``{"kind": "session", "event": "open"|"subscribed"|"closed", "endpoint", "at"}``: the
  connector's sessions (``subscribed``: the topic SUBscribed, acknowledged, at that broker);
- ``{"kind": "put", "seq", "sent", "answered", "answer"}``: a PUT and its answer (``OK``,
  or the ERROR's text, or ``lost`` when its session ended first);
- ``{"kind": "got", "from", "seq", "at"}``: a MESSAGE received.

Progress goes to stdout as JSON lines; ``{"cmd": "finish"}`` on stdin stops the PUTs,
closes the connectors and prints ``FINISHED``.

    python -m tests.mc0_nemesis_clients --broker tcp://A:7000 --broker tcp://B:7000 \\
        --server-key KEY --out DIR
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import IO, Any

from twisted.internet import defer, stdio, task
from twisted.internet import reactor as _reactor
from twisted.protocols.basic import LineReceiver
from twisted.python.failure import Failure

from bus.mc0.client import Mc0CommandError, Mc0ConnectionLost, Mc0Connector

reactor: Any = _reactor
TOPIC = b"nemesis"
_out: list[Any] = []


def say(kind: str, **fields: Any) -> None:
    _out[0].write((json.dumps({"event": kind, **fields}) + "\n").encode())


class Client:
    """One connector: its sessions, its PUTs and what it received, recorded as they come."""

    def __init__(self, index: int, brokers: list[str], key: bytes, out: Path, rate: float):
        self.index = index
        self.file: IO[str] = (out / f"client-{index}.jsonl").open("a")
        self.connector = Mc0Connector(
            brokers,
            self.got,
            server_key=key,
            ttl=2.0,
            on_session=self.session,
            reactor=reactor,
        )
        self.sent = self.acked = self.refused = self.lost = self.received = 0
        self.loop = task.LoopingCall(self.tick)
        self.interval = 1 / rate

    def record(self, **fields: Any) -> None:
        self.file.write(json.dumps(fields) + "\n")
        self.file.flush()

    def session(self, event: str, endpoint: str) -> None:
        self.record(kind="session", event=event, endpoint=endpoint, at=time.time())

    def got(self, delivery: Any) -> None:
        self.received += 1
        sender, number = (int(part) for part in delivery.body[0].split())
        self.record(kind="got", **{"from": sender}, seq=number, at=time.time())

    @defer.inlineCallbacks
    def start(self) -> Any:
        yield self.connector.start()
        yield self.connector.subscribe(TOPIC)
        # The first session's SUB, acknowledged: its broker (and the cluster) hold the topic.
        self.session("subscribed", self.connector.endpoint)
        self.loop.start(self.interval)

    def tick(self) -> None:
        number = self.sent
        self.sent += 1
        sent = time.time()
        d = self.connector.put(TOPIC, b"%d %d" % (self.index, number))
        d.addBoth(self.answered, number, sent)

    def answered(self, result: Any, number: int, sent: float) -> None:
        answer = "OK"
        if isinstance(result, Failure):
            error = result.value
            if isinstance(error, Mc0ConnectionLost):
                self.lost += 1
                answer = "lost"
            elif isinstance(error, Mc0CommandError):
                self.refused += 1
                answer = str(error)
            else:
                answer = f"failed: {error!r}"
        else:
            self.acked += 1
        self.record(kind="put", seq=number, sent=sent, answered=time.time(), answer=answer)

    def stop(self) -> defer.Deferred[None]:
        if self.loop.running:
            self.loop.stop()
        return self.connector.stop()


class Commands(LineReceiver):
    delimiter = b"\n"

    def __init__(self, run: Run) -> None:
        self.run = run

    def connectionMade(self) -> None:
        _out.append(self.transport)

    def lineReceived(self, line: bytes) -> None:
        if json.loads(line).get("cmd") == "finish":
            self.run.finish()


class Run:
    def __init__(self, args: argparse.Namespace) -> None:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        brokers: list[str] = args.broker

        def turned(index: int) -> list[str]:
            return brokers[index % len(brokers) :] + brokers[: index % len(brokers)]

        key = args.server_key.encode()
        self.clients = [Client(i, turned(i), key, out, args.rate) for i in range(args.clients)]

    def start(self) -> None:
        for client in self.clients:
            client.start().addErrback(lambda f: say("FAILED", error=str(f.value)))
        task.LoopingCall(self.report).start(0.5)

    def report(self) -> None:
        say(
            "PROGRESS",
            ready=all(c.loop.running for c in self.clients),
            sent=sum(c.sent for c in self.clients),
            acked=sum(c.acked for c in self.clients),
            refused=sum(c.refused for c in self.clients),
            lost=sum(c.lost for c in self.clients),
            received=sum(c.received for c in self.clients),
            failovers=sum(c.connector.failovers for c in self.clients),
        )

    @defer.inlineCallbacks
    def finish(self) -> Any:
        for client in self.clients:
            yield client.stop()
        say(
            "FINISHED",
            sent=sum(c.sent for c in self.clients),
            acked=sum(c.acked for c in self.clients),
            failovers=sum(c.connector.failovers for c in self.clients),
        )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--broker", action="append", required=True)
    parser.add_argument("--server-key", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--rate", type=float, default=20.0, help="PUTs/s per client")
    args = parser.parse_args()
    run = Run(args)
    stdio.StandardIO(Commands(run))
    reactor.callWhenRunning(run.start)
    reactor.run()


if __name__ == "__main__":
    main()
