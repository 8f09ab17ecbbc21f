"""Raw pyzmq processes used by the eMQP benchmark (run by ``_common.Worker``).

Roles:

``workers ENDPOINT COUNT SLOTS``
    COUNT workers in one process, each a DEALER that INFORMs (queue ``default``), waits
    for the ACK and sends SLOTS READYs; then ``READY`` is printed. Each answers every
    REQUEST with a REPLY (``{"value": body}``) and a READY, as the original job manager
    does, and records when each broker HEARTBEAT arrives. ``REPORT`` on stdin prints a JSON
    line (requests served by each, the largest gap between two HEARTBEATs at any of them
    since the last report) and starts a new window; EOF ends it.
``relay CLIENT_PORT WORKER_PORT``
    The baseline: a raw pyzmq ROUTER relay doing the broker's hops for the same frames
    (client REQUEST -> least recently ready worker with the client's msgid -> dispatch
    acknowledgement to the client; worker REPLY -> the client that asked; READY -> the
    worker's slot back), with a dict and a deque instead of the broker's queues, and no
    store, headers, timeouts or activity. Runs until EOF on stdin.
``client ENDPOINT JOBS WINDOW HEADERS``
    A DEALER that prints ``READY`` after one warm-up job, waits for ``GO``, then keeps at
    most WINDOW requests outstanding until JOBS results came back, timing each request to
    its result (6-frame REPLY); prints a JSON line (rate, p50, p99).
"""

from __future__ import annotations

import itertools
import json
import select
import sys
import time
import uuid
from collections import deque
from typing import Any

import zmq

PROTOCOL = b"eMQP/1.0"


def msgid() -> bytes:
    return str(uuid.uuid4()).encode()


# Load generators must cost as little CPU as they can (they share the 2 cores with what
# they measure): message ids of replies and READYs come from a pool made beforehand (the
# broker never tracks them), and multipart messages go out frame by frame (SNDMORE), which
# is several times cheaper than send_multipart.
POOL = [msgid() for _ in range(4096)]


def sender(sock: zmq.Socket) -> Any:
    send = sock.send
    more = zmq.SNDMORE

    def send_frames(frames: list[bytes]) -> None:
        for frame in frames[:-1]:
            send(frame, more)
        send(frames[-1])

    return send_frames


def receiver(sock: zmq.Socket) -> Any:
    recv = sock.recv

    def recv_frames(flags: int = 0) -> list[bytes]:
        frame = recv(flags, copy=False)
        frames = [frame.bytes]
        while frame.more:
            frame = recv(0, copy=False)
            frames.append(frame.bytes)
        return frames

    return recv_frames


def stdin_lines() -> list[str] | None:
    """Lines waiting on stdin (None at EOF), without blocking."""
    lines: list[str] = []
    while select.select([sys.stdin], [], [], 0)[0]:
        line = sys.stdin.readline()
        if not line:
            return None
        lines.append(line.strip())
    return lines


class BenchWorker:
    """One eMQP worker (a DEALER): answers REQUESTs, times the broker's HEARTBEATs."""

    def __init__(self, context: zmq.Context, endpoint: str, slots: int) -> None:
        self.sock = sock = context.socket(zmq.DEALER)
        sock.setsockopt(zmq.IDENTITY, msgid())
        sock.setsockopt(zmq.RCVHWM, 0)
        sock.setsockopt(zmq.SNDHWM, 0)
        sock.connect(endpoint)
        sock.send_multipart([b"", PROTOCOL, b"INFORM", msgid(), b'[[10, "default"]]', b"worker"])
        while sock.recv_multipart()[2] != b"ACK":
            pass
        for _ in range(slots):
            sock.send_multipart([b"", PROTOCOL, b"READY", msgid()])
        self.send, self.recv, self.ids = sender(sock), receiver(sock), itertools.cycle(POOL)
        self.served = 0
        self.last_beat: float | None = None
        self.worst_gap = 0.0

    def drain(self) -> None:
        send, recv, ids = self.send, self.recv, self.ids
        for _ in range(1000):
            try:
                frames = recv(zmq.NOBLOCK)
            except zmq.Again:
                return
            command = frames[2]
            if command == b"REQUEST":
                self.served += 1
                result = b'{"value": ' + frames[6] + b"}"
                send([b"", PROTOCOL, b"REPLY", next(ids), result, frames[3]])
                send([b"", PROTOCOL, b"READY", next(ids)])
            elif command == b"HEARTBEAT":
                now = time.monotonic()
                if self.last_beat is not None:
                    self.worst_gap = max(self.worst_gap, now - self.last_beat)
                self.last_beat = now


def workers(endpoint: str, count: str, slots: str) -> None:
    """COUNT workers in one process: fewer process wake-ups than one process each, so the
    load generators leave more of the two cores to what they measure."""
    context = zmq.Context()
    team = [BenchWorker(context, endpoint, int(slots)) for _ in range(int(count))]
    print("READY", flush=True)
    poller = zmq.Poller()
    for member in team:
        poller.register(member.sock, zmq.POLLIN)
    poller.register(sys.stdin, zmq.POLLIN)
    by_socket = {member.sock: member for member in team}
    while True:
        events = dict(poller.poll(1000))
        for sock, member in by_socket.items():
            if sock in events:
                member.drain()
        if sys.stdin.fileno() in events or sys.stdin in events:
            lines = stdin_lines()
            if lines is None:
                return
            if "REPORT" in lines:  # the window since the last one; a new window starts
                print(json.dumps({
                    "served": [m.served for m in team],
                    "worst_heartbeat_gap_s": max(m.worst_gap for m in team),
                }), flush=True)  # fmt: skip
                for member in team:
                    member.worst_gap, member.last_beat = 0.0, None


def relay(client_port: str, worker_port: str) -> None:
    context = zmq.Context()
    clients = context.socket(zmq.ROUTER)
    workers = context.socket(zmq.ROUTER)
    for sock, port in ((clients, client_port), (workers, worker_port)):
        sock.setsockopt(zmq.ROUTER_MANDATORY, 1)
        sock.setsockopt(zmq.SNDHWM, 100_000)
        sock.setsockopt(zmq.RCVHWM, 100_000)
        sock.bind(f"tcp://127.0.0.1:{port}")
    ready: deque[bytes] = deque()  # one entry per free slot, least recently ready first
    waiting: deque[list[bytes]] = deque()
    asked: dict[bytes, bytes] = {}  # request msgid -> client identity
    poller = zmq.Poller()
    poller.register(clients, zmq.POLLIN)
    poller.register(workers, zmq.POLLIN)
    poller.register(sys.stdin, zmq.POLLIN)
    print("READY", flush=True)

    to_clients, to_workers = sender(clients), sender(workers)
    from_clients, from_workers = receiver(clients), receiver(workers)

    def dispatch(client: bytes, frames: list[bytes]) -> None:
        worker_id = ready.popleft()
        asked[frames[3]] = client
        to_workers([worker_id, *frames])
        to_clients([client, b"", PROTOCOL, b"REPLY", msgid(), frames[3]])

    while True:
        events = dict(poller.poll(1000))
        if clients in events:
            for _ in range(256):
                try:
                    client, *frames = from_clients(zmq.NOBLOCK)
                except zmq.Again:
                    break
                if frames[2] == b"REQUEST":
                    if ready:
                        dispatch(client, frames)
                    else:
                        waiting.append([client, *frames])
        if workers in events:
            for _ in range(256):
                try:
                    worker_id, *frames = from_workers(zmq.NOBLOCK)
                except zmq.Again:
                    break
                command = frames[2]
                if command == b"READY":
                    ready.append(worker_id)
                    if waiting:
                        client, *request = waiting.popleft()
                        dispatch(client, request)
                elif command == b"REPLY":
                    client = asked.pop(frames[5], None)
                    if client is not None:
                        to_clients([client, b"", PROTOCOL, b"REPLY", msgid(), frames[4], frames[5]])
                elif command == b"INFORM":
                    to_workers([worker_id, b"", PROTOCOL, b"ACK", msgid(), frames[3]])
        if (sys.stdin.fileno() in events or sys.stdin in events) and stdin_lines() is None:
            return


def client(endpoint: str, jobs: str, window: str, headers: str) -> None:
    context = zmq.Context()
    sock = context.socket(zmq.DEALER)
    sock.setsockopt(zmq.IDENTITY, msgid())
    sock.setsockopt(zmq.RCVHWM, 0)
    sock.setsockopt(zmq.SNDHWM, 0)
    sock.connect(endpoint)
    header = headers.encode()
    body = b'["bench", {"n": 1}]'
    sent_at: dict[bytes, float] = {}
    send_frames, recv_frames = sender(sock), receiver(sock)
    request_ids = iter([msgid() for _ in range(int(jobs) + 1)])  # made before the clock runs

    def send() -> None:
        request_id = next(request_ids)
        sent_at[request_id] = time.perf_counter()
        send_frames([b"", PROTOCOL, b"REQUEST", request_id, b"default", header, body])

    def receive() -> float | None:
        frames = recv_frames()
        if len(frames) == 6 and frames[2] == b"REPLY":
            if b"error" in frames[4]:
                raise RuntimeError(frames[4].decode())
            return time.perf_counter() - sent_at.pop(frames[5])
        return None

    send()  # warm-up: the whole path works
    while receive() is None:
        pass
    print("READY", flush=True)
    sys.stdin.readline()
    total, limit = int(jobs), int(window)
    times: list[float] = []
    started = time.perf_counter()
    cpu_started = time.process_time()
    sent = 0
    while len(times) < total:
        while sent < total and len(sent_at) < limit:
            send()
            sent += 1
        elapsed = receive()
        if elapsed is not None:
            times.append(elapsed)
    seconds = time.perf_counter() - started
    cpu = time.process_time() - cpu_started
    times.sort()
    print(json.dumps({
        "jobs": total, "seconds": seconds, "rate": total / seconds, "cpu_s": cpu,
        "p50_us": times[len(times) // 2] * 1e6, "p99_us": times[int(len(times) * 0.99)] * 1e6,
    }), flush=True)  # fmt: skip


def main(argv: list[str]) -> None:
    roles = {"workers": workers, "relay": relay, "client": client}
    roles[argv[0]](*argv[1:])


if __name__ == "__main__":
    main(sys.argv[1:])
