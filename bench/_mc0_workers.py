"""Raw pyzmq CURVE processes for the mc0 benchmark (run by ``mc0_throughput.Mc0Worker``).

Every client socket is a CURVE DEALER with a fresh key pair and speaks the real
implementations' framing (a leading empty frame). Roles:

``acker ENDPOINT SERVER_KEY CLIENTS COUNT``
    CLIENTS sockets each CONNECT (and wait for the OK with their ID), print ``READY``, wait for
    ``GO``, then each sends COUNT NOOPs with an ID in lockstep (the next once the OK with the
    same ID came back), like mc0d's torture tool, all sockets at once through one poller.
    Prints a JSON line: acks, missing, mismatched, start, end.
``subscribers ENDPOINT SERVER_KEY CLIENTS TOPIC EXPECTED``
    CLIENTS sockets each CONNECT and SUB to TOPIC (waiting for both OKs), print ``READY``,
    then count MESSAGEs until every socket has EXPECTED (or 60 s pass in silence). Prints a
    JSON line: received, per-socket minimum, first and last receive times, bad messages.
``putter ENDPOINT SERVER_KEY TOPIC COUNT WINDOW BODY_BYTES``
    One socket: CONNECT, ``READY``, ``GO``, then COUNT PUTs with IDs, at most WINDOW waiting
    for their OK. Prints a JSON line: start, end, acks.
``echo ENDPOINT SECRET_KEY``
    The baseline broker: a raw pyzmq CURVE ROUTER doing the least of the same work — OK for
    every ID, SUB remembers the identity per topic, PUT sends MESSAGE (the PUT's headers but
    ID, then the body) to each subscriber. No validation, no TTL. Runs until killed.
"""

from __future__ import annotations

import json
import sys
import time

import zmq

DELIMITER = b""


def _socket(
    context: zmq.Context[zmq.Socket[bytes]], endpoint: str, server_key: bytes
) -> zmq.Socket[bytes]:
    public, secret = zmq.curve_keypair()
    sock = context.socket(zmq.DEALER)
    sock.curve_serverkey = server_key
    sock.curve_publickey = public
    sock.curve_secretkey = secret
    sock.rcvhwm = 0
    sock.sndhwm = 0
    sock.linger = 0
    sock.connect(endpoint)
    return sock


def _await_ok(sock: zmq.Socket[bytes], message_id: bytes, timeout: float = 30.0) -> None:
    if not sock.poll(int(timeout * 1000)):
        raise SystemExit(f"no answer to {message_id!r} in {timeout}s")
    reply = sock.recv_multipart()
    if reply != [DELIMITER, b"OK", b"ID", message_id]:
        raise SystemExit(f"expected OK {message_id!r}, got {reply!r}")


def _connect(sock: zmq.Socket[bytes], name: bytes) -> None:
    sock.send_multipart([DELIMITER, b"CONNECT", b"ID", name, b"TTL", b"60000", b"VERSION", b"0.2"])
    _await_ok(sock, name)


def _wait_go() -> None:
    print("READY", flush=True)
    if sys.stdin.readline().strip() != "GO":
        raise SystemExit("expected GO")


def acker(endpoint: str, server_key: str, clients: str, count: str) -> None:
    context = zmq.Context()
    n, total = int(clients), int(count)
    sockets = [_socket(context, endpoint, server_key.encode()) for _ in range(n)]
    for index, sock in enumerate(sockets):
        _connect(sock, b"chattyClient %d" % index)
    poller = zmq.Poller()
    for sock in sockets:
        poller.register(sock, zmq.POLLIN)
    _wait_go()
    sent = [0] * n
    expected: list[bytes] = [b""] * n
    index_of = {sock: i for i, sock in enumerate(sockets)}
    acks = mismatched = 0
    start = time.time()
    for i, sock in enumerate(sockets):
        expected[i] = b"chattyClient %d %d" % (i, 0)
        sock.send_multipart([DELIMITER, b"NOOP", b"ID", expected[i]])
        sent[i] = 1
    open_clients = n
    last_progress = time.monotonic()
    while open_clients:
        events = poller.poll(1000)
        if not events:
            if time.monotonic() - last_progress > 30:
                break
            continue
        last_progress = time.monotonic()
        for sock, _ in events:
            i = index_of[sock]
            while True:
                try:
                    reply = sock.recv_multipart(zmq.NOBLOCK)
                except zmq.Again:
                    break
                if reply == [DELIMITER, b"OK", b"ID", expected[i]]:
                    acks += 1
                elif reply[:2] == [DELIMITER, b"NOOP"]:
                    continue  # a broker heartbeat
                else:
                    mismatched += 1
                if sent[i] < total:
                    expected[i] = b"chattyClient %d %d" % (i, sent[i])
                    sock.send_multipart([DELIMITER, b"NOOP", b"ID", expected[i]])
                    sent[i] += 1
                else:
                    open_clients -= 1
                    sock.send_multipart([DELIMITER, b"DISCONNECT"])
                    break
    end = time.time()
    print(json.dumps({
        "acks": acks, "missing": n * total - acks, "mismatched": mismatched,
        "start": start, "end": end,
    }), flush=True)  # fmt: skip


def subscribers(endpoint: str, server_key: str, clients: str, topic: str, expected: str) -> None:
    context = zmq.Context()
    n, want = int(clients), int(expected)
    sockets = [_socket(context, endpoint, server_key.encode()) for _ in range(n)]
    for index, sock in enumerate(sockets):
        _connect(sock, b"subscriber %d" % index)
        sub_id = b"sub %d" % index
        sock.send_multipart([DELIMITER, b"SUB", b"ID", sub_id, DELIMITER, topic.encode()])
        _await_ok(sock, sub_id)
    poller = zmq.Poller()
    for sock in sockets:
        poller.register(sock, zmq.POLLIN)
    print("READY", flush=True)
    counts = [0] * n
    index_of = {sock: i for i, sock in enumerate(sockets)}
    first = last = 0.0
    bad = 0
    remaining = n
    while remaining:
        events = poller.poll(60_000)
        if not events:
            break
        for sock, _ in events:
            i = index_of[sock]
            while True:
                try:
                    frames = sock.recv_multipart(zmq.NOBLOCK)
                except zmq.Again:
                    break
                if frames[1:2] == [b"NOOP"]:
                    continue
                if frames[1:2] != [b"MESSAGE"]:
                    bad += 1
                    continue
                now = time.time()
                first = first or now
                last = now
                counts[i] += 1
                if counts[i] == want:
                    remaining -= 1
    print(json.dumps({
        "received": sum(counts), "minimum": min(counts), "first": first, "last": last,
        "bad": bad,
    }), flush=True)  # fmt: skip


def putter(endpoint: str, server_key: str, topic: str, count: str, window: str, size: str) -> None:
    context = zmq.Context()
    sock = _socket(context, endpoint, server_key.encode())
    _connect(sock, b"putter")
    total, limit = int(count), int(window)
    body = b"x" * int(size)
    _wait_go()
    start = time.time()
    sent = acked = 0
    waiting: set[bytes] = set()
    while acked < total:
        while sent < total and len(waiting) < limit:
            message_id = b"%d" % sent
            sock.send_multipart(
                [DELIMITER, b"PUT", b"TOPIC", topic.encode(), b"ID", message_id, DELIMITER, body]
            )
            waiting.add(message_id)
            sent += 1
        if not sock.poll(30_000):
            break
        while True:
            try:
                reply = sock.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                break
            if reply[1:3] == [b"OK", b"ID"] and reply[3] in waiting:
                waiting.discard(reply[3])
                acked += 1
    end = time.time()
    print(json.dumps({"start": start, "end": end, "acks": acked}), flush=True)


def echo(endpoint: str, secret_key: str) -> None:
    context = zmq.Context()
    router = context.socket(zmq.ROUTER)
    router.curve_server = True
    router.curve_secretkey = secret_key.encode()
    router.curve_publickey = zmq.curve_public(secret_key.encode())
    router.sndhwm = 10_000
    router.rcvhwm = 10_000
    router.linger = 0
    router.bind(endpoint)
    topics: dict[bytes, list[bytes]] = {}
    print("READY", flush=True)
    while True:
        frames = router.recv_multipart()
        identity, verb = frames[0], frames[2] if len(frames) > 2 else b""
        headers: list[bytes] = []
        positionals: list[bytes] = []
        index = 3
        while index + 1 < len(frames):
            if not frames[index]:
                break
            headers += frames[index : index + 2]
            index += 2
        positionals = frames[index + 1 :] if index < len(frames) else []
        message_id = None
        for k in range(0, len(headers), 2):
            if headers[k] == b"ID":
                message_id = headers[k + 1]
        if verb == b"SUB":
            for topic in positionals:
                topics.setdefault(topic, []).append(identity)
        elif verb == b"PUT":
            topic = next(
                (headers[k + 1] for k in range(0, len(headers), 2) if headers[k] == b"TOPIC"), b""
            )
            kept = [
                h
                for k in range(0, len(headers), 2)
                if headers[k] != b"ID"
                for h in headers[k : k + 2]
            ]
            message = [DELIMITER, b"MESSAGE", *kept, DELIMITER, *positionals]
            for subscriber in topics.get(topic, ()):
                router.send_multipart([subscriber, *message])
        if message_id is not None:
            router.send_multipart([identity, DELIMITER, b"OK", b"ID", message_id])


if __name__ == "__main__":
    role, *arguments = sys.argv[1:]
    {"acker": acker, "subscribers": subscribers, "putter": putter, "echo": echo}[role](*arguments)
