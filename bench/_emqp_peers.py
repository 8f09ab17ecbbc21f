"""Raw pyzmq processes used by the eMQP benchmark (run by ``_common.Worker``).

Roles:

``workers ENDPOINT COUNT SLOTS [STAMPS]``
    COUNT workers in one process, each a DEALER that INFORMs (queue ``default``), waits
    for the ACK and sends SLOTS READYs; then ``READY`` is printed. Each answers every
    REQUEST with a REPLY (``{"value": body}``) and a READY, as the original job manager
    does, and records when each broker HEARTBEAT arrives. ``REPORT`` on stdin prints a JSON
    line (requests served by each, the largest gap between two HEARTBEATs at any of them
    since the last report) and starts a new window; EOF ends it. With STAMPS (a file
    path) each worker also notes when every REQUEST arrived (``time.time()``) and the
    number N of its body ``["tick", N]``; ``DUMP`` on stdin writes them all to STAMPS
    (every number as int64, then every time as float64, native byte order), forgets them
    and prints a JSON line ``{"stamps": count}``.
``relay CLIENT_PORT WORKER_PORT``
    The baseline: a raw pyzmq ROUTER relay doing the broker's hops for the same frames
    (client REQUEST -> least recently ready worker with the client's msgid -> dispatch
    acknowledgement to the client; worker REPLY -> the client that asked; READY -> the
    worker's slot back), with a dict and a deque instead of the broker's queues, and no
    store, headers, timeouts or activity. Runs until EOF on stdin.
``paced-client ENDPOINT RATE SECONDS``
    A DEALER that prints ``READY`` after one warm-up request (``["tick", -1]``, no
    headers: the broker answers its dispatch acknowledgement only), waits for ``GO``, then
    sends REQUEST N (body ``["tick", N]``) at ``t0 + N / RATE`` (``time.time()``) for
    SECONDS, reading the acknowledgements meanwhile; prints a JSON line (``t0``, requests
    sent, acknowledgements and error replies received, how late its sends were at worst).
``client ENDPOINT JOBS WINDOW HEADERS``
    A DEALER that prints ``READY`` after one warm-up job, waits for ``GO``, then keeps at
    most WINDOW requests outstanding until JOBS results came back, timing each request to
    its result (6-frame REPLY); prints a JSON line (rate, p50, p99).
``paired ENDPOINT_A ENDPOINT_B PER_SIDE BLOCK HEADERS``
    One DEALER to each of two targets, both up: one warm-up job to each, ``READY``, waits
    for ``GO``, then one request at a time in blocks of BLOCK, alternating A B B A A B ...
    until each side had PER_SIDE, so that both see the same moments of the machine; prints
    a JSON line (``seconds``, ``cpu_s``, ``block``, ``order``: the side of each block,
    ``us``: each side's round trips in microseconds, in the order sent, ``t0``: the start
    (``time.monotonic()``), ``sent_ms``: each side's sends, in ms after ``t0``).
"""

from __future__ import annotations

import itertools
import json
import select
import sys
import time
import uuid
from array import array
from collections import deque
from typing import Any

import zmq
from _curve import secure, serve

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
        secure(sock)
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
                self.beat()

    def beat(self) -> None:
        """The broker's HEARTBEAT: timed, and answered as eventmq's workers answer it (a
        worker silent for three heartbeats is forgotten: while a benchmark waited for a
        busy machine to go quiet, every run was lost)."""
        now = time.monotonic()
        if self.last_beat is not None:
            self.worst_gap = max(self.worst_gap, now - self.last_beat)
        self.last_beat = now
        self.send([b"", PROTOCOL, b"HEARTBEAT", next(self.ids), repr(time.time()).encode()])


class StampingWorker(BenchWorker):
    """A BenchWorker that notes when each REQUEST arrived and the number N of its body
    ``["tick", N]`` (-1 for any other body)."""

    def __init__(self, context: zmq.Context, endpoint: str, slots: int) -> None:
        super().__init__(context, endpoint, slots)
        self.numbers = array("q")
        self.arrivals = array("d")

    def drain(self) -> None:
        send, recv, ids = self.send, self.recv, self.ids
        note_number, note_arrival, now = self.numbers.append, self.arrivals.append, time.time
        for _ in range(1000):
            try:
                frames = recv(zmq.NOBLOCK)
            except zmq.Again:
                return
            command = frames[2]
            if command == b"REQUEST":
                note_arrival(now())
                body = frames[6]
                note_number(int(body[9:-1]) if body.startswith(b'["tick", ') else -1)
                self.served += 1
                send([b"", PROTOCOL, b"REPLY", next(ids), b'{"value": ' + body + b"}", frames[3]])
                send([b"", PROTOCOL, b"READY", next(ids)])
            elif command == b"HEARTBEAT":
                self.beat()


def dump_stamps(team: list[Any], path: str) -> int:
    """Every arrival the team noted, to ``path`` (numbers, then times); then forget them."""
    numbers, arrivals = array("q"), array("d")
    for member in team:
        numbers.extend(member.numbers)
        arrivals.extend(member.arrivals)
        member.numbers, member.arrivals = array("q"), array("d")
    with open(path, "wb") as out:
        numbers.tofile(out)
        arrivals.tofile(out)
    return len(numbers)


def workers(endpoint: str, count: str, slots: str, stamps: str = "") -> None:
    """COUNT workers in one process: fewer process wake-ups than one process each, so the
    load generators leave more of the two cores to what they measure."""
    context = zmq.Context()
    kind = StampingWorker if stamps else BenchWorker
    team = [kind(context, endpoint, int(slots)) for _ in range(int(count))]
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
            if "DUMP" in lines and stamps:
                print(json.dumps({"stamps": dump_stamps(team, stamps)}), flush=True)


def relay(client_port: str, worker_port: str) -> None:
    context = zmq.Context()
    clients = context.socket(zmq.ROUTER)
    workers = context.socket(zmq.ROUTER)
    for sock, port in ((clients, client_port), (workers, worker_port)):
        sock.setsockopt(zmq.ROUTER_MANDATORY, 1)
        sock.setsockopt(zmq.SNDHWM, 100_000)
        sock.setsockopt(zmq.RCVHWM, 100_000)
        serve(sock)
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
    secure(sock)
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


def paired(endpoint_a: str, endpoint_b: str, per_side: str, block: str, headers: str) -> None:
    each, size = int(per_side), int(block)
    if size < 1 or each % size:
        raise SystemExit("PER_SIDE must be a multiple of BLOCK")
    context = zmq.Context()
    header = headers.encode()
    body = b'["bench", {"n": 1}]'
    sides = []
    for endpoint in (endpoint_a, endpoint_b):
        sock = context.socket(zmq.DEALER)
        sock.setsockopt(zmq.IDENTITY, msgid())
        secure(sock)
        sock.connect(endpoint)
        sides.append((sender(sock), receiver(sock)))
    request_ids = iter([msgid() for _ in range(2 * each + 2)])  # made before the clock runs

    sent_at: list[list[float]] = [[], []]

    def round_trip(side: int) -> float:
        send_frames, recv_frames = sides[side]
        request_id = next(request_ids)
        sent = time.perf_counter()
        sent_at[side].append(time.monotonic())
        send_frames([b"", PROTOCOL, b"REQUEST", request_id, b"default", header, body])
        while True:
            frames = recv_frames()
            if len(frames) == 6 and frames[2] == b"REPLY":  # not the dispatch ack
                elapsed = time.perf_counter() - sent
                if b"error" in frames[4] or frames[5] != request_id:
                    raise RuntimeError(frames[4].decode())
                return elapsed

    round_trip(0)  # warm-up: both paths work
    round_trip(1)
    print("READY", flush=True)
    sys.stdin.readline()
    sent_at[0].clear()
    sent_at[1].clear()
    times: list[list[float]] = [[], []]
    order: list[int] = []
    t0 = time.monotonic()
    started = time.perf_counter()
    cpu_started = time.process_time()
    for index in range(2 * each // size):
        side = (index + 1) // 2 % 2  # A B B A A B ...: neither side always goes second
        order.append(side)
        times[side].extend(round_trip(side) for _ in range(size))
    seconds = time.perf_counter() - started
    cpu = time.process_time() - cpu_started
    print(json.dumps({
        "seconds": seconds, "cpu_s": cpu, "block": size, "order": order,
        "us": [[round(t * 1e6, 2) for t in side_times] for side_times in times],
        "t0": t0, "sent_ms": [[round((t - t0) * 1e3, 3) for t in side] for side in sent_at],
    }), flush=True)  # fmt: skip


def paced_client(endpoint: str, rate: str, seconds: str) -> None:
    context = zmq.Context()
    sock = context.socket(zmq.DEALER)
    sock.setsockopt(zmq.IDENTITY, msgid())
    sock.setsockopt(zmq.RCVHWM, 0)
    sock.setsockopt(zmq.SNDHWM, 0)
    sock.connect(endpoint)
    send_frames, recv_frames = sender(sock), receiver(sock)
    per_second = float(rate)
    total = int(per_second * float(seconds))
    # Everything a send needs is made before the clock runs.
    request_ids = [msgid() for _ in range(total)]
    bodies = [b'["tick", %d]' % number for number in range(total)]
    send_frames([b"", PROTOCOL, b"REQUEST", msgid(), b"default", b"", b'["tick", -1]'])
    while len(recv_frames()) != 5:  # the warm-up's dispatch acknowledgement
        pass
    print("READY", flush=True)
    sys.stdin.readline()
    acks = errors = 0

    def read_answers() -> None:
        nonlocal acks, errors
        while True:
            try:
                frames = recv_frames(zmq.NOBLOCK)
            except zmq.Again:
                return
            if frames[2] == b"REPLY" and len(frames) == 5:
                acks += 1
            elif frames[2] == b"REPLY" and b'"error"' in frames[4]:
                errors += 1

    poller = zmq.Poller()
    poller.register(sock, zmq.POLLIN)
    t0 = time.time() + 0.01
    sent = 0
    worst_lag = 0.0
    while sent < total:
        now = time.time()
        due = min(total, int((now - t0) * per_second) + 1) if now >= t0 else 0
        if due > sent:
            worst_lag = max(worst_lag, now - (t0 + sent / per_second))
        while sent < due:
            send_frames([b"", PROTOCOL, b"REQUEST", request_ids[sent], b"default", b"",
                         bodies[sent]])  # fmt: skip
            sent += 1
        read_answers()
        wait = t0 + sent / per_second - time.time()
        if wait > 0:
            poller.poll(max(1, int(wait * 1000)))
    deadline = time.time() + 5
    while acks + errors < total and time.time() < deadline:
        poller.poll(100)
        read_answers()
    print(json.dumps({
        "t0": t0, "rate": per_second, "sent": sent, "acks": acks, "errors": errors,
        "worst_send_lag_s": worst_lag,
    }), flush=True)  # fmt: skip


def main(argv: list[str]) -> None:
    roles = {
        "workers": workers, "relay": relay, "client": client, "paired": paired,
        "paced-client": paced_client,
    }  # fmt: skip
    roles[argv[0]](*argv[1:])


if __name__ == "__main__":
    main(sys.argv[1:])
