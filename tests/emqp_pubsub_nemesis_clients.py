"""The clients of the eMQP pub/sub nemesis (tests/test_emqp_pubsub_nemesis.py), one process on
a host of their own: at each broker a publisher (a plain DEALER sending eventmq's
``PUBLISH``) and two subscribers (plain SUBs: one of ``nemesis``, one of everything), and a
watcher that asks every broker's ``/status`` and every nats-server's ``/routez`` four times a
second what they say of themselves. Records go to ``--out``:

- ``sent.jsonl``: ``{"pub", "seq", "sent"}``, each PUBLISH as it is handed to ZeroMQ;
- ``got.jsonl``: ``{"sub", "at_broker", "pub", "seq", "at"}``, each publication a subscriber
  received;
- ``polls.jsonl``: ``{"who", "asked", "answered"}`` with, for a broker, its ``pid`` and its
  link's ``connected``, ``disconnects`` and ``own_returned`` (``/status``), for a nats-server its
  ``server_id`` and the ids of its routes (``/routez``); ``answered`` is null when no answer
  came within a second.

A publication's message is ``PUB SEQ``. Progress goes to stdout as JSON lines (``READY``,
``PROGRESS`` each second: the latest ``sent`` time each subscriber has received from each
publisher); ``{"cmd": "finish"}`` on stdin stops the publishers, lets the subscribers drain
for ``--drain`` seconds, writes everything out and prints ``FINISHED``.

    python -m tests.emqp_pubsub_nemesis_clients --broker NAME=PUBLISHERS,SUBSCRIBERS,STATUS \\
        --nats NAME=ROUTEZ --out DIR
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
import urllib.request
from pathlib import Path
from typing import IO, Any

import zmq

TOPIC = b"nemesis"
#: Each broker's subscribers: the topic's prefix, and everything.
PREFIXES = (TOPIC, b"")
POLL_EVERY = 0.25


def say(event: str, **fields: Any) -> None:
    sys.stdout.write(json.dumps({"event": event, **fields}) + "\n")
    sys.stdout.flush()


class Records:
    """JSON lines to a file, written by one thread."""

    def __init__(self, path: Path) -> None:
        self.file: IO[str] = path.open("a")

    def write(self, **fields: Any) -> None:
        self.file.write(json.dumps(fields) + "\n")

    def close(self) -> None:
        self.file.close()


def ask(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=1.0) as answer:
        return json.load(answer)


def watch(brokers: dict[str, str], nats: dict[str, str], out: Path, stop: threading.Event) -> None:
    """Every broker's and nats-server's own account of itself, four times a second."""
    polls = Records(out / "polls.jsonl")
    try:
        while not stop.is_set():
            started = time.time()
            for who, url in [*brokers.items(), *nats.items()]:
                asked = time.time()
                record: dict[str, Any] = {"who": who, "asked": asked, "answered": None}
                try:
                    found = ask(url)
                except (OSError, ValueError):
                    polls.write(**record)
                    continue
                record["answered"] = time.time()
                if who in brokers:
                    service = (found.get("services") or {}).get("emqp-pubsub") or {}
                    cluster = service.get("cluster") or {}
                    record.update(pid=found.get("pid"), connected=bool(cluster.get("connected")),
                                  disconnects=cluster.get("disconnects"),
                                  own_returned=cluster.get("own_returned"))  # fmt: skip
                else:
                    record.update(server_id=found.get("server_id"),
                                  routes=sorted(str(r.get("rid")) for r in found.get("routes") or []),
                                  peers=sorted({str(r.get("remote_id")) for r in found.get("routes") or []}))  # fmt: skip
                polls.write(**record)
            stop.wait(max(0.0, POLL_EVERY - (time.time() - started)))
    finally:
        polls.close()


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--broker", action="append", required=True, help="NAME=PUB,SUB,STATUS")
    parser.add_argument("--nats", action="append", default=[], help="NAME=ROUTEZ-URL")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--rate", type=float, default=40.0, help="PUBLISHes a second each")
    parser.add_argument("--drain", type=float, default=5.0)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    brokers: dict[str, tuple[str, str, str]] = {}
    for given in args.broker:
        name, endpoints = given.split("=", 1)
        publishers, subscribers, status = endpoints.split(",")
        brokers[name] = (publishers, subscribers, status)
    nats = dict(given.split("=", 1) for given in args.nats)

    context = zmq.Context()
    publishers: dict[str, zmq.Socket[bytes]] = {}
    subscribers: dict[str, tuple[str, zmq.Socket[bytes]]] = {}
    poller = zmq.Poller()
    for name, (incoming, outgoing, _) in brokers.items():
        dealer = context.socket(zmq.DEALER)
        dealer.linger = 0
        dealer.sndhwm = 100_000  # a broker down a few seconds: its PUBLISHes wait, none refused
        dealer.connect(incoming)
        publishers[name] = dealer
        for index, prefix in enumerate(PREFIXES):
            sub = context.socket(zmq.SUB)
            sub.linger = 0
            sub.rcvhwm = 100_000
            sub.subscribe(prefix)
            sub.connect(outgoing)
            subscribers[f"{name}.{index}"] = (name, sub)
            poller.register(sub, zmq.POLLIN)

    stop = threading.Event()
    watcher = threading.Thread(
        target=watch, args=({n: b[2] for n, b in brokers.items()}, nats, args.out, stop),
        daemon=True,
    )  # fmt: skip
    watcher.start()
    commands: list[dict[str, Any]] = []

    def read_commands() -> None:
        for line in sys.stdin:
            if line.strip():
                commands.append(json.loads(line))

    threading.Thread(target=read_commands, daemon=True).start()
    sent_file, got_file = Records(args.out / "sent.jsonl"), Records(args.out / "got.jsonl")
    latest: dict[str, dict[str, float]] = {sub: {} for sub in subscribers}
    sent_at: dict[tuple[str, int], float] = {}
    seq = 0
    interval = 1 / args.rate
    next_send = time.time()
    next_progress = time.time() + 1
    finishing_until: float | None = None
    say("READY", subscribers=sorted(subscribers))
    while True:
        now = time.time()
        if finishing_until is None and commands and commands[0].get("cmd") == "finish":
            finishing_until = now + args.drain
        if finishing_until is not None and now >= finishing_until:
            break
        if finishing_until is None and now >= next_send:
            seq += 1
            for name, dealer in publishers.items():
                sent = time.time()
                try:
                    dealer.send_multipart(
                        [b"", b"eMQP/1.0", b"PUBLISH", b"%s-%d" % (name.encode(), seq), TOPIC,
                         f"{name} {seq}".encode()],
                        zmq.NOBLOCK,
                    )  # fmt: skip
                except zmq.Again:
                    continue  # not sent: not recorded
                sent_file.write(pub=name, seq=seq, sent=sent)
                sent_at[(name, seq)] = sent
            next_send += interval
            if next_send < now - 1:  # a busy machine: no burst to catch up
                next_send = now
        wait_ms = max(0, int(1000 * (min(next_send, next_progress) - time.time())))
        for sock, _ in poller.poll(min(wait_ms, 50)):
            for sub, (broker, candidate) in subscribers.items():
                if candidate is not sock:
                    continue
                while True:
                    try:
                        frames = sock.recv_multipart(zmq.NOBLOCK)
                    except zmq.Again:
                        break
                    at = time.time()
                    pub, number = frames[1].decode().split()
                    got_file.write(sub=sub, at_broker=broker, pub=pub, seq=int(number), at=at)
                    when = sent_at.get((pub, int(number)))
                    if when is not None and when > latest[sub].get(pub, 0.0):
                        latest[sub][pub] = when
        if time.time() >= next_progress:
            next_progress += 1
            say("PROGRESS", sent=seq, latest=latest)
    stop.set()
    watcher.join(10)
    sent_file.close()
    got_file.close()
    for sock in [*publishers.values(), *(s for _, s in subscribers.values())]:
        sock.close()
    context.term()
    say("FINISHED", sent=seq)
    return 0


if __name__ == "__main__":
    sys.exit(main())
