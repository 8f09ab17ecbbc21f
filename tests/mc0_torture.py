"""A fake of mc0d's torture tool (``mc0torture``, puppetlabs-toy-chest/mc0d src/torture.cpp)
that moves to another broker when its own dies, for tests and by hand:

    python -m tests.mc0_torture --server-key KEY --broker tcp://A --broker tcp://B --out F

What the real tool sends, client by client (50 of them, each its own CURVE key pair and
socket identity ``chattyClient N``): ``["", "CONNECT", "ID", identity]`` (no TTL), then
1000 ``["", "NOOP", "ID", "<identity> <i>"]`` in lockstep (the next once the OK with the
same ID came), then ``["", "DISCONNECT"]``. The real tool connects to tcp://127.0.0.1:61616
alone and waits for each OK for ever (a blocking receive): a NOOP lost with its broker
stops its thread for good.

This one does the same on sockets of one process (a poller instead of 50 threads and
contexts: the brokers see the same connections and messages), and more:

- client N starts at broker ``N * len(brokers) // clients`` (the clients split between
  them), and when an answer does not come within ``--answer-timeout`` it opens a new
  socket at the next broker, CONNECTs and SUBscribes again, and sends again the NOOP it
  waited for (a NOOP twice is harmless) or, for a PUT, goes on with the next command (a
  PUT sent again could be delivered twice);
- with ``--put-every K`` each K-th command is a PUT with an ID (lockstep too) of the
  client's number and sequence to topic ``torture.<(N + 1) % 10>``; each client holds
  ``torture.<N % 10>``, so every topic has subscribers at every broker.

It prints ``{"event": "PROGRESS", "acked": N, "moves": M}`` lines while it runs and one
``{"event": "DONE", ...}`` line at the end, and writes what each client did (sessions,
PUTs and their answers, MESSAGEs received, IDs answered wrongly) to ``--out`` as JSON, for
:func:`check` (tests/test_mc0_torture.py).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import zmq

TOPICS = 10
#: A subscriber's session must have held its topic this long after a PUT was answered OK
#: for the PUT to count as one it must have had: its MESSAGE is on its way meanwhile.
GRACE = 5.0


@dataclass
class Client:
    """One chatty client: its sockets (one a session), what it sent and received."""

    number: int
    identity: bytes
    broker: int
    count: int
    put_every: int
    keys: tuple[bytes, bytes]
    socket: zmq.Socket[bytes] | None = None
    step: int = 0
    waiting: bytes | None = None  # the ID whose answer is awaited
    kind: str = ""  # connect, sub, noop, put
    sent_at: float = 0.0
    done: bool = False
    finished_at: float = 0.0  # its last command answered
    #: [broker index, connected at, ended at (None: open), SUB acknowledged at]
    sessions: list[list[Any]] = field(default_factory=list)
    puts: list[dict[str, Any]] = field(default_factory=list)
    received: list[list[Any]] = field(default_factory=list)
    wrong: list[str] = field(default_factory=list)
    noops_acked: int = 0
    moves: int = 0

    @property
    def topic(self) -> bytes:
        return b"torture.%d" % (self.number % TOPICS)

    @property
    def target(self) -> bytes:
        return b"torture.%d" % ((self.number + 1) % TOPICS)


class Torture:
    """The clients and their poller (see the module's text)."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.brokers: list[str] = args.broker
        self.context = zmq.Context()
        self.poller = zmq.Poller()
        self.by_socket: dict[zmq.Socket[bytes], Client] = {}
        self.clients = [
            Client(
                number,
                b"chattyClient %d" % number,
                number * len(self.brokers) // args.clients,
                args.count,
                args.put_every,
                zmq.curve_keypair(),
            )
            for number in range(args.clients)
        ]

    def open(self, client: Client) -> None:
        """A session at the client's broker: a fresh socket, CONNECT as the real tool does."""
        sock = self.context.socket(zmq.DEALER)
        sock.curve_serverkey = self.args.server_key
        sock.curve_publickey, sock.curve_secretkey = client.keys
        sock.setsockopt(zmq.IDENTITY, client.identity)
        sock.setsockopt(zmq.LINGER, 0)
        sock.connect(self.brokers[client.broker])
        client.socket = sock
        self.by_socket[sock] = client
        self.poller.register(sock, zmq.POLLIN)
        client.sessions.append([client.broker, None, None, None])
        self.send(client, "connect", client.identity, [b"", b"CONNECT", b"ID", client.identity])

    def close(self, client: Client) -> None:
        sock = client.socket
        if sock is not None:
            self.poller.unregister(sock)
            del self.by_socket[sock]
            sock.close(0)
        client.socket = None

    def send(self, client: Client, kind: str, message_id: bytes, frames: list[bytes]) -> None:
        assert client.socket is not None
        client.kind, client.waiting, client.sent_at = kind, message_id, time.time()
        client.socket.send_multipart(frames)

    def next_command(self, client: Client) -> None:
        """The client's next step: a NOOP (or a PUT every ``put_every``), or the end."""
        if client.step >= client.count:
            # The session stays, receiving, until the run's end (see :meth:`linger`).
            client.finished_at = time.time()
            client.done = True
            client.waiting = None
            return
        message_id = b"%s %d" % (client.identity, client.step)
        if client.put_every and client.step % client.put_every == client.put_every - 1:
            body = b"%d %d" % (client.number, client.step)
            client.puts.append({"seq": client.step, "sent": time.time(), "answer": None})
            frames = [b"", b"PUT", b"ID", message_id, b"TOPIC", client.target, b"", body]
            self.send(client, "put", message_id, frames)
        else:
            self.send(client, "noop", message_id, [b"", b"NOOP", b"ID", message_id])

    def answered(self, client: Client, frames: list[bytes]) -> None:
        now = time.time()
        body = frames[1:] if frames and not frames[0] else frames
        if body and body[0] == b"MESSAGE":
            payload = body[body.index(b"", 1) + 1]
            publisher, sequence = (int(part) for part in payload.split())
            client.received.append([publisher, sequence, now, len(client.sessions) - 1])
            return
        if not body or body[0] not in (b"OK", b"ERROR"):
            return  # a NOOP from the broker
        message_id = body[body.index(b"ID") + 1] if b"ID" in body else b""
        if message_id != client.waiting:
            client.wrong.append(
                f"{body[0].decode()} for {message_id!r}, awaited {client.waiting!r}"
            )
            return
        ok = body[0] == b"OK"
        if client.kind == "final":
            if ok:
                client.sessions[-1][2] = now  # its broker held the session all along
            client.waiting = None
            return
        if client.kind == "connect":
            if not ok:
                client.wrong.append(f"CONNECT refused: {body!r}")
                return
            client.sessions[-1][1] = now
            sub_id = b"%s sub %d" % (client.identity, len(client.sessions))
            self.send(client, "sub", sub_id, [b"", b"SUB", b"ID", sub_id, b"", client.topic])
            return
        if client.kind == "sub":
            client.sessions[-1][3] = now
        elif client.kind == "noop":
            if not ok:
                client.wrong.append(f"NOOP {message_id!r} answered ERROR")
            client.noops_acked += 1
            client.step += 1
        else:  # put
            client.puts[-1]["answer"] = "OK" if ok else body[body.index(b"MESSAGE") + 1].decode()
            client.puts[-1]["answered"] = now
            client.step += 1
        self.next_command(client)

    def move(self, client: Client) -> None:
        """No answer in time: the next broker, a new session; a PUT is not sent again."""
        client.sessions[-1][2] = time.time()
        client.moves += 1
        if client.kind == "put":
            client.step += 1
        self.close(client)
        client.broker = (client.broker + 1) % len(self.brokers)
        self.open(client)

    def run(self) -> dict[str, Any]:
        for client in self.clients:
            self.open(client)
        started = time.time()
        last_progress = 0.0
        while not all(c.done for c in self.clients):
            self.receive(50)
            now = time.time()
            for client in self.clients:
                if client.done or client.waiting is None:
                    continue
                if now - client.sent_at > self.args.answer_timeout:
                    self.move(client)
            if now - last_progress >= 0.5:
                last_progress = now
                self.progress()
        self.linger()
        for client in self.clients:
            self.close(client)
        self.context.term()
        elapsed = time.time() - started
        acked = sum(c.noops_acked for c in self.clients)
        return {"event": "DONE", "seconds": round(elapsed, 3), "acked": acked,
                "moves": sum(c.moves for c in self.clients)}  # fmt: skip

    def receive(self, timeout_ms: int) -> None:
        """What came within ``timeout_ms``, each message to its client (after a move's SUB,
        the command it waited for: a NOOP again, or the PUT after the one whose answer
        never came)."""
        for sock, _ in self.poller.poll(timeout_ms):
            client = self.by_socket.get(sock)  # type: ignore[call-overload]
            while client is not None and client.socket is sock:
                try:
                    frames = sock.recv_multipart(zmq.NOBLOCK)  # type: ignore[union-attr]
                except zmq.Again:
                    break
                self.answered(client, frames)

    def linger(self) -> None:
        """Every client done: the sessions go on receiving until :data:`GRACE` after the
        last PUT answered OK (so that every such PUT is owed to every subscriber whose
        SUB was acknowledged before it, however fast the run went), then each is asked a
        last NOOP: a session whose broker answers it ends now, one whose broker does
        not at its last command's answer. (mc0torture disconnects at once: this is the
        checker's addition.)"""
        answered = [p["answered"] for c in self.clients for p in c.puts if p["answer"] == "OK"]
        until = max(answered, default=0.0) + GRACE
        while time.time() < until:
            self.receive(min(200, max(1, int((until - time.time()) * 1000))))
        for client in self.clients:
            client.sessions[-1][2] = client.finished_at
            final = b"%s final" % client.identity
            self.send(client, "final", final, [b"", b"NOOP", b"ID", final])
        deadline = time.time() + self.args.answer_timeout
        while time.time() < deadline and any(c.waiting for c in self.clients):
            self.receive(50)
        for client in self.clients:
            assert client.socket is not None
            client.socket.send_multipart([b"", b"DISCONNECT"])

    def progress(self) -> None:
        acked = sum(c.noops_acked + len([p for p in c.puts if p["answer"]]) for c in self.clients)
        moves = sum(c.moves for c in self.clients)
        print(json.dumps({"event": "PROGRESS", "acked": acked, "moves": moves}), flush=True)

    def records(self) -> dict[str, Any]:
        return {
            "brokers": self.brokers,
            "clients": [
                {
                    "number": c.number,
                    "topic": c.topic.decode(),
                    "target": c.target.decode(),
                    "sessions": c.sessions,
                    "puts": c.puts,
                    "received": c.received,
                    "wrong": c.wrong,
                    "noops_acked": c.noops_acked,
                    "steps": c.step,
                    "moves": c.moves,
                }
                for c in self.clients
            ],
        }


def check(records: dict[str, Any], grace: float = GRACE) -> tuple[dict[str, int], list[str]]:
    """What the run shows, and every anomaly (one line each):

    - each client went through all its commands, every NOOP acknowledged, and no answer
      named an ID other than the one it waited for;
    - no subscriber received a message twice (over all its sessions);
    - every PUT answered OK was received by every subscriber of its topic whose session
      held the topic (its SUB acknowledged) before the PUT was sent and lasted until
      ``grace`` seconds after its OK, whichever broker each was at."""
    anomalies: list[str] = []
    clients = records["clients"]
    by_topic: dict[str, list[dict[str, Any]]] = {}
    for client in clients:
        by_topic.setdefault(client["topic"], []).append(client)
        if client["wrong"]:
            anomalies.append(f"client {client['number']}: {client['wrong'][:3]}")
        puts = len(client["puts"])
        if client["steps"] != client["noops_acked"] + puts:
            anomalies.append(
                f"client {client['number']}: {client['steps']} steps, "
                f"{client['noops_acked']} NOOPs acknowledged and {puts} PUTs"
            )
        seen = [(publisher, sequence) for publisher, sequence, _, _ in client["received"]]
        if len(seen) != len(set(seen)):
            twice = sorted({m for m in seen if seen.count(m) > 1})
            anomalies.append(f"client {client['number']} received twice: {twice[:5]}")
    must = lost = acknowledged = 0
    for client in clients:
        for put in client["puts"]:
            if put["answer"] != "OK":
                continue
            acknowledged += 1
            for subscriber in by_topic[client["target"]]:
                held = any(
                    session[3] is not None
                    and session[3] <= put["sent"]
                    and (session[2] is None or session[2] >= put["answered"] + grace)
                    for session in subscriber["sessions"]
                )
                if not held:
                    continue
                must += 1
                if not any(
                    publisher == client["number"] and sequence == put["seq"]
                    for publisher, sequence, _, _ in subscriber["received"]
                ):
                    lost += 1
                    if lost <= 10:
                        anomalies.append(
                            f"PUT {client['number']}/{put['seq']} acknowledged, never received "
                            f"by client {subscriber['number']} (sessions "
                            f"{subscriber['sessions']})"
                        )
    counts = {
        "clients": len(clients),
        "noops_acked": sum(c["noops_acked"] for c in clients),
        "puts": sum(len(c["puts"]) for c in clients),
        "puts_acknowledged": acknowledged,
        "deliveries_owed": must,
        "received": sum(len(c["received"]) for c in clients),
        "moves": sum(c["moves"] for c in clients),
    }
    if lost > 10:
        anomalies.append(f"... {lost} acknowledged deliveries lost in all")
    return counts, anomalies


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m tests.mc0_torture", description=__doc__)
    parser.add_argument("--broker", action="append", required=True, help="tcp://HOST:PORT")
    parser.add_argument("--server-key", required=True, type=str.encode, help="Z85 public key")
    parser.add_argument("--clients", type=int, default=50)
    parser.add_argument("--count", type=int, default=1000)
    parser.add_argument("--put-every", type=int, default=0)
    parser.add_argument("--answer-timeout", type=float, default=2.0)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    torture = Torture(args)
    done = torture.run()
    if args.out is not None:
        args.out.write_text(json.dumps(torture.records()))
    print(json.dumps(done), flush=True)
    sys.exit(0)


if __name__ == "__main__":
    main()
