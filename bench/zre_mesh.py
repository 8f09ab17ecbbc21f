"""ZRE at scale in one process: N nodes on loopback discover each other, then SHOUT fan-out,
then the CPU the idle mesh costs.

* ``mesh``: N ``ZreNode``s (one shared ZeroMQ context, each its own UDP socket on a private
  beacon port, beacons to 127.255.255.255 every second) are started together; measured: the
  time until every node has the N-1 others ready (HELLO received both ways).
  *Baseline*: raw pyzmq doing the same connection work with the endpoints known in advance:
  N ROUTERs, N x (N-1) DEALERs connecting and sending one greeting each, until every ROUTER
  has N-1 greetings.
* ``shout``: one node SHOUTs M messages to a group the N-1 others joined; measured: deliveries
  per second (SHOUT events at the receivers). *Baseline*: raw pyzmq sending the same frames
  through N-1 DEALERs to N-1 ROUTERs, and reading them, in one thread. R rounds of each,
  interleaved in the same process; the medians are compared.
* ``idle``: the full mesh left alone for S seconds; measured: this process's CPU (all
  threads, getrusage) per second, in % of one core, for all N nodes together and per node.
  *Baseline*: the same beacon traffic in raw Python (N UDP sockets sending a 22-byte beacon
  a second to 127.255.255.255 and reading every one, with selectors), no ZRE logic.

    python bench/zre_mesh.py [--nodes 50] [--shouts 2000] [--rounds 5] [--idle 10] [--zyre BIN]

Targets (issue 10): full mesh of 50 under 5 s; 50 idle peers under 2% of a core. Issue 19:
SHOUT fan-out at least 0.8 of raw pyzmq.
"""

from __future__ import annotations

import argparse
import json
import resource
import selectors
import socket
import statistics
import struct
import subprocess
import sys
import time
import uuid
from typing import Any

import zmq
from _common import Figure, machine, summary


def process_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def free_udp_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


# -- raw pyzmq baselines ------------------------------------------------------------------


def baseline_mesh(nodes: int) -> float:
    context = zmq.Context()
    context.set(zmq.MAX_SOCKETS, 100_000)
    routers, endpoints = [], []
    for _ in range(nodes):
        router = context.socket(zmq.ROUTER)
        router.linger = 0
        port = router.bind_to_random_port("tcp://127.0.0.1", 0xC000, 0x10000)
        routers.append(router)
        endpoints.append(f"tcp://127.0.0.1:{port}")
    started = time.perf_counter()
    dealers = []
    for i in range(nodes):
        for j in range(nodes):
            if i != j:
                dealer = context.socket(zmq.DEALER)
                dealer.linger = 0
                dealer.identity = b"\x01" + uuid.uuid4().bytes
                dealer.connect(endpoints[j])
                dealer.send(b"\xaa\xa1\x01\x02\x00\x01hello")
                dealers.append(dealer)
    poller = zmq.Poller()
    for router in routers:
        poller.register(router, zmq.POLLIN)
    received = 0
    while received < nodes * (nodes - 1):
        for sock, _ in poller.poll(1000):
            while True:
                try:
                    sock.recv_multipart(zmq.NOBLOCK)
                except zmq.Again:
                    break
                received += 1
    elapsed = time.perf_counter() - started
    for sock in [*dealers, *routers]:
        sock.close()
    context.term()
    return elapsed


def baseline_shout(receivers: int, shouts: int) -> float:
    context = zmq.Context()
    context.set(zmq.MAX_SOCKETS, 100_000)
    pairs = []
    for _ in range(receivers):
        router = context.socket(zmq.ROUTER)
        router.linger = 0
        router.rcvhwm = 0
        port = router.bind_to_random_port("tcp://127.0.0.1")
        dealer = context.socket(zmq.DEALER)
        dealer.linger = 0
        dealer.sndhwm = 0
        dealer.identity = b"\x01" + uuid.uuid4().bytes
        dealer.connect(f"tcp://127.0.0.1:{port}")
        pairs.append((dealer, router))
    # Warm the connections.
    for dealer, router in pairs:
        dealer.send(b"warm")
        router.recv_multipart()
    head = b"\xaa\xa1\x03\x02\x00\x01\x01G"
    started = time.perf_counter()
    for n in range(shouts):
        for dealer, _ in pairs:
            dealer.send(head, zmq.SNDMORE)
            dealer.send(b"shout %d" % n)
    for _, router in pairs:
        for _ in range(shouts):
            router.recv_multipart()
    elapsed = time.perf_counter() - started
    for dealer, router in pairs:
        dealer.close()
        router.close()
    context.term()
    return receivers * shouts / elapsed


def baseline_idle(nodes: int, seconds: float) -> float:
    port = free_udp_port()
    selector = selectors.DefaultSelector()
    socks = []
    for _ in range(nodes):
        sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_BROADCAST, 1)
        sock.setblocking(False)
        sock.bind(("0.0.0.0", port))
        selector.register(sock, selectors.EVENT_READ)
        socks.append(sock)
    beacons = [b"ZRE\x01" + uuid.uuid4().bytes + struct.pack(">H", 50000) for _ in socks]
    seen: dict[bytes, float] = {}
    cpu = process_cpu()
    end = time.monotonic() + seconds
    next_beacon = time.monotonic()
    while time.monotonic() < end:
        now = time.monotonic()
        if now >= next_beacon:
            for sock, beacon in zip(socks, beacons, strict=True):
                sock.sendto(beacon, ("127.255.255.255", port))
            next_beacon += 1.0
        for key, _ in selector.select(max(0.0, next_beacon - time.monotonic())):
            data = key.fileobj.recv(64)  # type: ignore[union-attr]
            seen[data[4:20]] = now
    used = process_cpu() - cpu
    for sock in socks:
        sock.close()
    return used / seconds


def zyre_shout(binary: str, nodes: int, shouts: int) -> float:
    """zyre's own fan-out, same nodes and shouts: bench/zre_zyre_shout.c, built against a
    zyre of your own (its README says how); it connects its nodes by gossip on loopback."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    done = subprocess.run(
        [binary, str(port), str(nodes), str(shouts)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(f"{binary} failed: {done.stderr.strip()}")
    rate: float = json.loads(done.stdout.strip().splitlines()[-1])["rate"]
    return rate


# -- the project's nodes ----------------------------------------------------------------------


def run_nodes(args: argparse.Namespace) -> dict[str, Any]:
    from twisted.internet import reactor as global_reactor

    from bus.transport.zmqsocket import SocketFactory
    from bus.util.polling import wait_until
    from bus.zre.config import ZreConfig
    from bus.zre.node import ZreNode

    reactor: Any = global_reactor
    results: dict[str, Any] = {}
    port = free_udp_port()
    factory = SocketFactory(reactor)
    factory.txzmq_factory.context.set(zmq.MAX_SOCKETS, 100_000)
    nodes = [
        ZreNode(ZreConfig(name=f"n{i}", port=port), reactor=reactor, socket_factory=factory)
        for i in range(args.nodes)
    ]
    delivered = [0]

    def count(event: Any) -> None:
        if event.type == "SHOUT":
            delivered[0] += 1

    async def scenario() -> None:
        from twisted.internet.defer import Deferred

        def full_mesh() -> bool:
            return all(len(node.peers()) == args.nodes - 1 for node in nodes)

        started = time.perf_counter()
        for node in nodes:
            node.startService()
        await wait_until(full_mesh, timeout=60, interval=0.001, reactor=reactor, what="mesh")
        results["mesh_seconds"] = time.perf_counter() - started

        sender, receivers = nodes[0], nodes[1:]
        for node in receivers:
            node.add_listener(count)
            node.join("G")
        await wait_until(
            lambda: len(sender.core.peer_groups.get("G", ())) == len(receivers),  # type: ignore[union-attr]
            timeout=30,
            reactor=reactor,
            what="joins",
        )
        total = len(receivers) * args.shouts
        rates, base_rates, zyre_rates = [], [], []
        for _ in range(args.rounds):
            # Interleaved with ours, in this process: both see the same machine.
            base_rates.append(baseline_shout(len(receivers), args.shouts))
            delivered[0] = 0
            started = time.perf_counter()
            for n in range(args.shouts):
                sender.shout("G", [b"shout %d" % n])
                if n % 50 == 49:
                    # Let the receivers read: the peers' HWM (3000) bounds what may be queued.
                    pause: Deferred[None] = Deferred()
                    reactor.callLater(0, pause.callback, None)
                    await pause
            await wait_until(
                lambda: delivered[0] >= total, timeout=120, reactor=reactor, what="shouts"
            )
            rates.append(total / (time.perf_counter() - started))
            if args.zyre:
                zyre_rates.append(zyre_shout(args.zyre, args.nodes, args.shouts))
        results["shout_rates"], results["base_shout_rates"] = rates, base_rates
        if zyre_rates:
            results["zyre_shout_rates"] = zyre_rates
        results["shout_rate"] = statistics.median(rates)
        results["base_shout_rate"] = statistics.median(base_rates)
        results["shout_blocked"] = sum(node.send_blocked for node in nodes)

        settle: Deferred[None] = Deferred()
        reactor.callLater(2.0, settle.callback, None)
        await settle
        cpu = process_cpu()
        idle: Deferred[None] = Deferred()
        reactor.callLater(args.idle, idle.callback, None)
        await idle
        results["idle_cores"] = (process_cpu() - cpu) / args.idle
        results["peers_after_idle"] = min(len(node.peers()) for node in nodes)
        for node in nodes:
            await node.stopService()
        factory.shutdown()

    from twisted.internet.defer import ensureDeferred

    def run() -> None:
        done = ensureDeferred(scenario())
        done.addErrback(lambda failure: results.setdefault("error", failure.getTraceback()))
        done.addBoth(lambda _: reactor.stop())

    reactor.callWhenRunning(run)
    reactor.run()
    return results


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=50)
    parser.add_argument("--shouts", type=int, default=2000)
    parser.add_argument("--idle", type=float, default=10.0)
    parser.add_argument(
        "--rounds", type=int, default=5, help="SHOUT rounds, each beside a baseline round"
    )
    parser.add_argument(
        "--zyre",
        default=None,
        metavar="BINARY",
        help="also run zyre's own fan-out each round: bench/zre_zyre_shout.c, built",
    )
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    info = machine()
    base_mesh = baseline_mesh(args.nodes)
    base_idle = baseline_idle(args.nodes, args.idle)
    ours = run_nodes(args)
    if "error" in ours:
        print(ours["error"], file=sys.stderr)
        return 1
    mesh, rate, idle = ours["mesh_seconds"], ours["shout_rate"], ours["idle_cores"]
    base_shout = ours["base_shout_rate"]
    verdict = (
        mesh < 5.0
        and idle < 0.02
        and ours["peers_after_idle"] == args.nodes - 1
        and rate >= 0.8 * base_shout
    )
    summary(
        f"ZRE mesh of {args.nodes} nodes in one process",
        info,
        measured=(
            f"full mesh {mesh:.2f} s; SHOUT fan-out {rate:,.0f} deliveries/s; idle mesh "
            f"{idle:.1%} of a core ({idle / args.nodes:.2%} per node)"
        ),
        baseline=(
            f"raw pyzmq mesh {base_mesh:.2f} s; raw pyzmq fan-out {base_shout:,.0f} msg/s; "
            f"raw beacon traffic {base_idle:.1%} of a core"
        ),
        ratio=(
            f"mesh time x{mesh / base_mesh:.1f}; fan-out {rate / base_shout:.2f}; "
            f"idle CPU x{idle / max(base_idle, 1e-6):.1f}"
        ),
        target="full mesh of 50 < 5 s, 50 idle peers < 2% of a core, fan-out >= 0.8 of raw",
        verdict=verdict,
        details=[
            (
                "fan-out rounds (ours / raw)",
                ", ".join(
                    f"{a / 1000:.0f}k/{b / 1000:.0f}k"
                    for a, b in zip(ours["shout_rates"], ours["base_shout_rates"], strict=True)
                ),
            ),
            *(
                [
                    (
                        "zyre (C) fan-out",
                        f"{statistics.median(ours['zyre_shout_rates']):,.0f} deliveries/s "
                        "(median; rounds "
                        + ", ".join(f"{r / 1000:.0f}k" for r in ours["zyre_shout_rates"])
                        + "; its nodes connected by gossip, one thread each)",
                    )
                ]
                if "zyre_shout_rates" in ours
                else []
            ),
            ("shout sends refused (HWM)", str(ours["shout_blocked"])),
            ("peers after idle", f"{ours['peers_after_idle']} of {args.nodes - 1}"),
        ],
        json_path=args.json,
        record={"ours": ours, "baseline": [base_mesh, base_shout, base_idle]},
        figures={
            "mesh": Figure(mesh, "s", better="lower"),
            "fanout": Figure(rate, "deliveries/s"),
            "fanout_vs_raw": Figure(rate / base_shout, "x raw"),
            "idle_cpu": Figure(idle, "cores", better="lower"),
        },
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
