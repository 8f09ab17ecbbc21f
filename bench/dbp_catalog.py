"""The DBP catalog under load: registrations/s, info requests/s, and 1000 services heartbeating.

The catalog runs as ``twistd -n dbp`` (127.0.0.1, a free port, no beacon, a temporary data
directory); this script is the load, with raw pyzmq and raw UDP sockets.

* ``register``: 64 DEALERs each send their share of N registrations (distinct names) back to
  back and read the OwOs; measured: registrations answered per second (the catalog saves its
  registry after every batch it reads).
* ``info``: one DEALER keeps 256 info requests (``u_U`` for one registered service) in flight
  until N are answered; measured: requests answered per second.
* ``heartbeats``: 1000 services registered (one DEALER each), each beating every second over
  UDP (from one socket, spread over the second); the catalog beats each of them back over UDP.
  Measured: the catalog process's CPU (all threads, /proc) over 10 s, in % of one core, and the
  beats it sent back.
* *Baseline*, same run: a raw pyzmq ROUTER echo process answering every message with
  ``[identity, '', 'o_O', time, body]`` for the same register/info loads; and for the
  heartbeats a raw Python UDP process receiving 1000 datagrams a second and answering each.

* ``--cluster``: the same loads on the shared catalog (``twistd -n dbp --nats``: three
  nats-servers, the bucket with three replicas, two instances), beside the one catalog's
  figures of the same run: registrations at one instance, info requests at the other, the
  1000 services beating the first; the CPU counts both instances and the three nats-servers.

    python bench/dbp_catalog.py [--requests 20000] [--services 1000] [--seconds 10] [--cluster]

Targets (issue 9): 1000 services heartbeating every second keep the catalog under 20 % of a core.
"""

from __future__ import annotations

import argparse
import json
import socket
import struct
import subprocess
import time
from typing import Any

import zmq
from _common import (
    PYTHON,
    Figure,
    cpu_seconds,
    free_ports,
    machine,
    started_twistd,
    stop_process,
    summary,
    temporary_directory,
)

ECHO = r"""
import sys, zmq
ctx = zmq.Context(); router = ctx.socket(zmq.ROUTER); router.rcvhwm = router.sndhwm = 0
router.bind(sys.argv[1]); print("ready", flush=True)
while True:
    frames = router.recv_multipart()
    router.send_multipart([frames[0], b"", b"o_O", frames[3], frames[-1]])
"""

UDP_ECHO = r"""
import socket, sys
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.bind(("127.0.0.1", int(sys.argv[1])))
print("ready", flush=True)
while True:
    data, address = s.recvfrom(512)
    s.sendto(b"<3" + data[2:10] + b"catalog", address)
"""


def frames(command: bytes, body: bytes) -> list[bytes]:
    return [b"", command, struct.pack("<d", time.time()), body]


def registration(name: str, port: int, heartbeat: float = 1.0) -> bytes:
    return json.dumps(
        {
            "name": name,
            "address": "127.0.0.1",
            "port": port,
            "function": "bench",
            "heartbeat": heartbeat,
        }
    ).encode()


def start(argv: list[str]) -> subprocess.Popen[str]:
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    return proc


def wait_line(proc: subprocess.Popen[str], text: str, timeout: float = 30) -> None:
    assert proc.stdout is not None
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            raise RuntimeError(f"process ended before {text!r}")
        if text in line:
            return
    raise RuntimeError(f"no {text!r} in {timeout}s")


def register_load(endpoint: str, count: int, prefix: str) -> float:
    context = zmq.Context()
    dealers = []
    for _ in range(64):
        dealer = context.socket(zmq.DEALER)
        dealer.sndhwm = dealer.rcvhwm = 0
        dealer.linger = 0
        dealer.connect(endpoint)
        dealers.append(dealer)
    started = time.perf_counter()
    for n in range(count):
        # They never beat: a long heartbeat keeps them from expiring during the other loads.
        body = registration(f"{prefix}{n}", 9, heartbeat=3600.0)
        dealers[n % 64].send_multipart(frames(b"UwU", body))
    poller = zmq.Poller()
    for dealer in dealers:
        poller.register(dealer, zmq.POLLIN)
    answered = 0
    while answered < count:
        for sock, _ in poller.poll(10_000):
            while True:
                try:
                    sock.recv_multipart(zmq.NOBLOCK)
                except zmq.Again:
                    break
                answered += 1
    elapsed = time.perf_counter() - started
    for dealer in dealers:
        dealer.close()
    context.term()
    return count / elapsed


def info_load(endpoint: str, count: int, name: bytes) -> float:
    context = zmq.Context()
    dealer = context.socket(zmq.DEALER)
    dealer.sndhwm = dealer.rcvhwm = 0
    dealer.linger = 0
    dealer.connect(endpoint)
    started = time.perf_counter()
    sent = answered = 0
    while answered < count:
        while sent < count and sent - answered < 256:
            dealer.send_multipart(frames(b"u_U", name))
            sent += 1
        dealer.recv_multipart()
        answered += 1
    elapsed = time.perf_counter() - started
    dealer.close()
    context.term()
    return count / elapsed


def heartbeat_load(
    endpoint: str, udp_port: int, services: int, seconds: float, pids: int | list[int]
) -> dict[str, float]:
    """Register ``services`` (one DEALER each), then beat each once a second over UDP for
    ``seconds``; return the servers' CPU share (``pids``, together) and the beats sent back."""
    pids = [pids] if isinstance(pids, int) else pids
    receiver = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    receiver.bind(("127.0.0.1", 0))
    receiver.setblocking(False)
    back_port = receiver.getsockname()[1]
    context = zmq.Context()
    context.set(zmq.MAX_SOCKETS, 10_000)
    dealers = []
    if endpoint:
        for n in range(services):
            dealer = context.socket(zmq.DEALER)
            dealer.linger = 0
            dealer.connect(endpoint)
            dealer.send_multipart(frames(b"UwU", registration(f"svc{n}", back_port)))
            dealers.append(dealer)
        approved = sum(dealer.recv_multipart()[1] == b"OwO" for dealer in dealers)
        if approved < services:
            raise RuntimeError(f"{services - approved} of {services} registrations refused")
    sender = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    beats = [b"<3" + struct.pack("<d", 0.0) + f"svc{n}".encode() for n in range(services)]
    received = 0
    cpu = sum(cpu_seconds(pid) for pid in pids)
    started = time.monotonic()
    n = 0
    while (now := time.monotonic()) - started < seconds:
        due = int((now - started) * services)  # spread over each second
        while n < due:
            sender.sendto(beats[n % services], ("127.0.0.1", udp_port))
            n += 1
        try:
            while True:
                receiver.recv(64)
                received += 1
        except BlockingIOError:
            pass
        time.sleep(0.001)
    used = sum(cpu_seconds(pid) for pid in pids) - cpu
    for dealer in dealers:
        dealer.close()
    context.term()
    receiver.close()
    sender.close()
    return {
        "cores": used / seconds,
        "beats_back_per_s": received / seconds,
        "sent_per_s": n / seconds,
    }


def catalog(tmp: Any, name: str, options: list[str]) -> tuple[subprocess.Popen[bytes], int]:
    """``twistd -n dbp`` started (with ``options``), once it serves: the process, its port."""
    port = free_ports(1)
    args = [
        "dbp", "--port", str(port), "--beacon-port", "0", "--data-dir",
        str(tmp / f"{name}-data"), "--heartbeat-interval", "1s", "--liveness", "5", *options,
    ]  # fmt: skip
    ready = "services in bucket" if options else "DBP catalog on"
    return started_twistd(tmp, name, args, ready), port


def catalog_loads(
    tmp: Any, args: Any, options: list[str], name: str, more_pids: list[int] | None = None
) -> dict[str, Any]:
    """The three loads on one catalog (no ``options``) or on two instances of a shared one:
    registrations at the first, info requests at the second, heartbeats to the first."""
    first, port = catalog(tmp, f"{name}dbp", options)
    started = [first]
    try:
        second_port = port
        if options:
            second, second_port = catalog(tmp, f"{name}dbp-2", options)
            started.append(second)
        results: dict[str, Any] = {}
        results["register"] = register_load(f"tcp://127.0.0.1:{port}", args.requests, "r")
        results["info"] = info_load(f"tcp://127.0.0.1:{second_port}", args.requests, b"r1")
        pids = [p.pid for p in started] + list(more_pids or [])
        results["heartbeats"] = heartbeat_load(
            f"tcp://127.0.0.1:{port}", port, args.services, args.seconds, pids
        )
        return results
    finally:
        for process in started:
            stop_process(process)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=20_000)
    parser.add_argument("--services", type=int, default=1000)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--json", default=None)
    parser.add_argument(
        "--cluster", action="store_true", help="also the shared catalog (dbp --nats, R3)"
    )
    args = parser.parse_args()
    info = machine()
    results: dict[str, Any] = {}
    with temporary_directory("dbp-bench-") as tmp:
        port = free_ports(1)
        echo = start([PYTHON, "-c", ECHO, f"tcp://127.0.0.1:{port}"])
        try:
            wait_line(echo, "ready")
            endpoint = f"tcp://127.0.0.1:{port}"
            results["echo_register"] = register_load(endpoint, args.requests, "r")
            results["echo_info"] = info_load(endpoint, args.requests, b"r1")
        finally:
            stop_process(echo)
        udp_port = free_ports(1)
        udp_echo = start([PYTHON, "-c", UDP_ECHO, str(udp_port)])
        try:
            wait_line(udp_echo, "ready")
            results["echo_udp"] = heartbeat_load(
                "", udp_port, args.services, args.seconds, udp_echo.pid
            )
        finally:
            stop_process(udp_echo)

        results.update(catalog_loads(tmp, args, [], ""))
        if args.cluster:
            from bus.nats.servers import NatsCluster

            nats = NatsCluster(tmp / "nats", size=3)
            nats.start()
            try:
                urls = ",".join(nats.urls)
                pids = [node.process.pid for node in nats.nodes if node.process is not None]
                shared = ["--nats", urls, "--nats-replicas", "3"]
                for name, value in catalog_loads(tmp, args, shared, "shared-", pids).items():
                    results[f"cluster_{name}"] = value
            finally:
                nats.stop()
    hb, base_hb = results["heartbeats"], results["echo_udp"]
    verdict = hb["cores"] < 0.20
    details: list[tuple[str, str]] = []
    figures = {
        "registrations": Figure(results["register"], "/s"),
        "info_requests": Figure(results["info"], "/s"),
        "heartbeat_cpu": Figure(hb["cores"], "cores", better="lower"),
    }
    if args.cluster:
        chb = results["cluster_heartbeats"]
        details.append(
            (
                "cluster",
                f"dbp --nats, 2 instances, R3 bucket: registrations "
                f"{results['cluster_register']:,.0f}/s "
                f"({results['cluster_register'] / results['register']:.2f} x one catalog), info "
                f"{results['cluster_info']:,.0f}/s "
                f"({results['cluster_info'] / results['info']:.2f} x); {args.services} services "
                f"beating: {chb['cores']:.1%} of a core for both instances and the three "
                f"nats-servers (x{chb['cores'] / max(hb['cores'], 1e-6):.1f} one catalog's), "
                f"{chb['beats_back_per_s']:,.0f} beats/s sent back",
            )
        )
        figures.update(
            cluster_registrations=Figure(results["cluster_register"], "/s"),
            cluster_info_requests=Figure(results["cluster_info"], "/s"),
            cluster_heartbeat_cpu=Figure(chb["cores"], "cores", better="lower"),
        )
    summary(
        "DBP catalog",
        info,
        measured=(
            f"registrations {results['register']:,.0f}/s; info requests {results['info']:,.0f}/s; "
            f"{args.services} services beating every second: catalog {hb['cores']:.1%} of a core "
            f"({hb['beats_back_per_s']:,.0f} beats/s sent back)"
        ),
        baseline=(
            f"raw pyzmq ROUTER echo: {results['echo_register']:,.0f}/s (register load), "
            f"{results['echo_info']:,.0f}/s (info load); raw UDP echo {base_hb['cores']:.1%} of a core"
        ),
        ratio=(
            f"registrations {results['register'] / results['echo_register']:.2f}, info "
            f"{results['info'] / results['echo_info']:.2f}, heartbeat CPU "
            f"x{hb['cores'] / max(base_hb['cores'], 1e-6):.1f}"
        ),
        target="1000 services heartbeating every second: catalog < 20% of one core",
        verdict=verdict,
        details=details,
        json_path=args.json,
        record=results,
        figures=figures,
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
