"""What the operator's console costs the services, same run: the product's CPU with no
console, with CONSOLES open (each reading /api/v1/stream as the page does), and with each
of them also tailing the whole bus, idle and under a paced load; and that nothing runs
when no console is open (the same product with the HTTP port off, beside it).

* The product: ``twistd -n eventbus`` composing the Event BUS, eMQP, mc0, DBP and ZRE
  (loopback, free ports), as ``make run`` does.
* Consoles: raw HTTP/1.0 clients in this process (a thread reading every socket), which
  count state frames and read the tail's events; the tail's latency is taken from the
  paced publisher's send time inside each event (one clock for every process).
* Load: ``_workers.py paced-publish`` at --rate events a second on the collector.
* ``--nats N``: the Event BUS and eMQP keep their logs in JetStream streams of N replicas on
  N nats-servers the benchmark starts (127.0.0.1, free ports), so the state each console
  receives holds what a service on JetStream shows (the servers, the streams' leaders and
  replicas, the consumers); 0 (the default): SQLite.

    python bench/console_cost.py [--consoles 100] [--seconds 15] [--rate 2000] [--repeat 2]
                                 [--nats 3]
"""

from __future__ import annotations

import argparse
import json
import selectors
import socket
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from _common import (
    HOST,
    BusServer,
    Cleanup,
    CpuAccount,
    Figure,
    Worker,
    add_common_arguments,
    cpu_seconds,
    free_ports,
    machine,
    median,
    noise_line,
    summary,
    terminate_on_sigterm,
    wait_for_quiet,
    wait_until,
    workdir,
)

TARGET_CORES = 0.05


class Consoles:
    """COUNT open consoles: each a socket reading ``path`` of the HTTP port as a browser's
    page does, the state frames counted, tail events timed."""

    def __init__(self, port: int, count: int, path: str) -> None:
        self.frames = 0
        #: Bytes of the state frames read (all consoles).
        self.frame_bytes = 0
        self.events = 0
        self.skipped = 0
        self.latencies: list[float] = []
        self.selector = selectors.DefaultSelector()
        self.sockets: list[socket.socket] = []
        self._buffers: dict[socket.socket, bytes] = {}
        self._stop = threading.Event()
        for _ in range(count):
            sock = socket.create_connection((HOST, port))
            sock.sendall(f"GET {path} HTTP/1.0\r\nHost: bench\r\n\r\n".encode())
            sock.setblocking(False)
            self.selector.register(sock, selectors.EVENT_READ)
            self.sockets.append(sock)
            self._buffers[sock] = b""
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        while not self._stop.is_set():
            for key, _ in self.selector.select(0.2):
                sock: socket.socket = key.fileobj  # type: ignore[assignment]
                try:
                    data = sock.recv(1 << 18)
                except BlockingIOError:
                    continue
                if not data:
                    self.selector.unregister(sock)
                    continue
                now = time.monotonic_ns()
                buffer = self._buffers[sock] + data
                *blocks, self._buffers[sock] = buffer.split(b"\n\n")
                for block in blocks:
                    if block.startswith(b"event: state"):
                        self.frames += 1
                        self.frame_bytes += len(block) + 2
                    elif block.startswith(b"event: event"):
                        self.events += 1
                        # The paced publisher's send time, in the event's value.
                        event = json.loads(block.split(b"data: ", 1)[1])
                        sent = json.loads(event["value"]).get("t")
                        if isinstance(sent, int):
                            self.latencies.append((now - sent) / 1e6)
                    elif block.startswith(b"event: skipped"):
                        self.skipped += json.loads(block.split(b"data: ", 1)[1])["events"]

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        for sock in self.sockets:
            sock.close()
        self.selector.close()


def product(root: Path, http_port: int, nats: Sequence[str] = ()) -> BusServer:
    """The product with its five protocols (and HTTP on ``http_port``, 0: off); with
    ``nats`` (the servers' URLs), the Event BUS and eMQP on JetStream streams replicated on
    each of them."""
    options = [
        "--services", "eventbus,emqp,mc0,dbp,zre", "--http-port", str(http_port),
        "--emqp-worker-port", "0", "--emqp-client-port", "0", "--emqp-admin-port", "0",
        "--emqp-data-dir", str(root / "emqp"), "--mc0-port", "0",
        "--mc0-data-dir", str(root / "mc0"), "--dbp-port", "0",
        "--dbp-data-dir", str(root / "dbp"),
    ]  # fmt: skip
    if nats:
        urls, replicas = ",".join(nats), str(len(nats))
        options += [
            "--store", "jetstream", "--nats", urls, "--nats-replicas", replicas,
            "--emqp-store", "jetstream", "--emqp-nats", urls, "--emqp-nats-replicas", replicas,
        ]  # fmt: skip
    return BusServer(root, extra=tuple(options))


def nats_servers(root: Path, size: int) -> Any:
    """``size`` nats-servers as one cluster on free ports of 127.0.0.1, started."""
    from bus.nats.servers import NatsCluster

    clients, routes = free_ports(size), free_ports(size)
    cluster = NatsCluster(
        root, size=size, client_ports=range(clients, clients + size),
        route_ports=range(routes, routes + size),
    )  # fmt: skip
    cluster.start()
    return cluster


def window(pid: int, seconds: float) -> float:
    """Cores the process ``pid`` kept busy over the next ``seconds``."""
    before, started = cpu_seconds(pid), time.monotonic()
    time.sleep(seconds)
    return (cpu_seconds(pid) - before) / (time.monotonic() - started)


def one_run(args: Any, root: Path, index: int) -> dict[str, Any]:
    run: dict[str, Any] = {}
    account = CpuAccount()
    with Cleanup() as stack:
        urls: list[str] = []
        if args.nats:
            cluster = nats_servers(root / f"nats-{index}", args.nats)
            stack.callback(cluster.stop)
            urls = list(cluster.urls)
        # The HTTP port off, then on with no console: nothing may run for it.
        off = stack.server(product(root / f"off-{index}", 0, urls))
        wait_for_quiet(args.wait_idle)
        time.sleep(2)  # startup's work done
        run["idle_http_off"] = window(off.pid, args.seconds)
        off.stop()
        http_port = free_ports(1)
        server = stack.server(product(root / f"on-{index}", http_port, urls))
        wait_until(lambda: server.status().get("http"), 30, "the HTTP port")
        time.sleep(2)
        pid = server.pid
        run["idle_no_console"] = window(pid, args.seconds)
        consoles = Consoles(http_port, args.consoles, "/api/v1/stream")
        stack.callback(consoles.close)
        time.sleep(2)  # every console's welcome sent
        run["idle_consoles"] = window(pid, args.seconds)
        frames = consoles.frames
        run["state_frame_bytes"] = consoles.frame_bytes / max(1, frames)
        consoles.close()
        time.sleep(2)

        def loaded(path: str | None) -> tuple[float, Consoles | None, dict[str, Any]]:
            watching = Consoles(http_port, args.consoles, path) if path else None
            paths = [watching] if watching else []
            tails = Consoles(http_port, args.consoles, "/api/v1/tail?topic=/") if path else None
            if tails:
                paths.append(tails)
            time.sleep(2)
            load = Worker("paced-publish", server.collector, args.rate, args.seconds + 4)
            try:
                load.wait_ready()
                load.go()
                time.sleep(2)  # the paced rate reached
                cores = window(pid, args.seconds)
                result = load.result()
            finally:
                load.stop()
                for opened in paths:
                    opened.close()
            return cores, tails, result

        run["load_no_console"], _, sent = loaded(None)
        run["load_consoles_and_tails"], tails, _ = loaded("/api/v1/stream")
        run["sent_late"] = sent["late"]
        assert tails is not None
        run["state_frames_per_console_s"] = frames / args.consoles / args.seconds
        run["tail_events"] = tails.events
        run["tail_skipped"] = tails.skipped
        latencies = sorted(tails.latencies)
        run["tail_latency_ms_p50"] = latencies[len(latencies) // 2] if latencies else None
        run["tail_latency_ms_p99"] = latencies[int(len(latencies) * 0.99)] if latencies else None
    run["foreign_cores"] = account.stop()
    run["consoles_cores_idle"] = run["idle_consoles"] - run["idle_no_console"]
    run["consoles_cores_load"] = run["load_consoles_and_tails"] - run["load_no_console"]
    run["no_console_cores"] = run["idle_no_console"] - run["idle_http_off"]
    print(
        f"run {index + 1}/{args.repeat}: product {run['idle_no_console']:.3f} cores idle "
        f"(HTTP off {run['idle_http_off']:.3f}), {run['idle_consoles']:.3f} with "
        f"{args.consoles} consoles; under {args.rate:,} ev/s {run['load_no_console']:.3f}, "
        f"{run['load_consoles_and_tails']:.3f} with the consoles each tailing /; tail "
        f"{run['tail_events']} events shown, {run['tail_skipped']} skipped, latency p50 "
        f"{run['tail_latency_ms_p50']} ms p99 {run['tail_latency_ms_p99']} ms; state frames of "
        f"{run['state_frame_bytes']:.0f} bytes",
        flush=True,
    )
    return run


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--consoles", type=int, default=100)
    parser.add_argument("--seconds", type=float, default=15.0)
    parser.add_argument("--rate", type=int, default=2000)
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument(
        "--nats", type=int, default=0, help="nats-servers under the Event BUS and eMQP (0: SQLite)"
    )
    add_common_arguments(parser)
    args = parser.parse_args()
    terminate_on_sigterm()
    info = machine()
    with workdir("console-cost-", args.keep) as root:
        runs = [one_run(args, root, index) for index in range(args.repeat)]

    def mid(key: str) -> float:
        return median([run[key] for run in runs])

    idle, load, nothing = (
        mid("consoles_cores_idle"),
        mid("consoles_cores_load"),
        mid("no_console_cores"),
    )
    p99 = [run["tail_latency_ms_p99"] for run in runs if run["tail_latency_ms_p99"] is not None]
    verdict = idle < TARGET_CORES and load < TARGET_CORES and abs(nothing) < 0.01
    summary(
        "what the console costs",
        info,
        measured=(
            f"{args.consoles} consoles cost the product {idle:.3f} cores idle, {load:.3f} under "
            f"{args.rate:,} events/s each also tailing the whole bus; with none open the HTTP "
            f"port costs {nothing:+.3f} cores; tail latency p99 {median(p99):.0f} ms; state "
            f"frames of {mid('state_frame_bytes'):.0f} bytes"
            + (f" (Event BUS and eMQP on {args.nats} nats-server(s))" if args.nats else "")
        ),
        baseline=(
            f"the product without consoles: {mid('idle_no_console'):.3f} cores idle, "
            f"{mid('load_no_console'):.3f} under load; with the HTTP port off "
            f"{mid('idle_http_off'):.3f} (same run)"
        ),
        ratio=f"+{idle * 100:.1f} % of a core idle, +{load * 100:.1f} % under load",
        target=f"{args.consoles} consoles < {TARGET_CORES * 100:.0f} % of a core; none open: 0",
        verdict=verdict,
        details=[noise_line(runs)],
        json_path=args.json,
        record={"runs": runs},
        figures={
            "console_cores_idle": Figure(idle, "cores", better="lower"),
            "console_cores_load": Figure(load, "cores", better="lower"),
            "state_frame_bytes": Figure(mid("state_frame_bytes"), "bytes", better="lower"),
        },
    )
    return 0 if verdict else 1


if __name__ == "__main__":
    sys.exit(main())
