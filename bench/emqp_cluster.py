"""eMQP on a JetStream cluster: guaranteed jobs through two brokers sharing an R3 stream,
beside one broker keeping them in SQLite; and how long requests held by a broker that
dies wait before they run again.

* throughput: ``guarantee`` requests with ``reply-requested``, pipelined (up to 1,000
  outstanding per client). Baseline, same run: one broker (``twistd -n eventbus
  --services emqp``, durability normal) with four workers of 16 slots and one client.
  Cluster: three nats-servers on this machine (a stream of three replicas), two brokers
  (``--emqp-store jetstream``), two workers of 16 slots and one client at each broker,
  half of the jobs each. The C load generators of ``emqp_peers.c`` (as
  ``bench/emqp_broker.py``). Runs alternate baseline/cluster ``--repeat`` times; medians.
* failover: a worker at broker B takes ``--held`` guaranteed requests sent at broker A
  and never answers; B is killed (-9); a worker then joins A: the seconds from the kill
  until every held request reached it (the stream gives them to A once B stopped saying
  "in progress" for the consumer's ack_wait, 4 s by default). ``--repeat`` times.

    python bench/emqp_cluster.py [--repeat 3] [--jobs 40000] [--held 50]

Targets (issue 30): cluster >= 0.5 x the SQLite broker's guaranteed jobs/s; held requests
run again < 5 s after their broker's host died.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

import zmq
from _common import (
    HOST,
    Cleanup,
    CpuAccount,
    Figure,
    add_common_arguments,
    cpu_of,
    fmt_rate,
    machine,
    machine_busy_seconds,
    median,
    noise_line,
    summary,
    terminate_on_sigterm,
    wait_for_quiet,
    workdir,
)
from emqp_broker import Broker, build_c_peers, peer

from bus.emqp import codec
from bus.nats.servers import NatsCluster

SLOTS = 16
WINDOW = 1_000
TARGET_RATIO = 0.5
TARGET_FAILOVER_S = 5.0
HEADERS = "reply-requested,guarantee"


def cluster_options(nats: NatsCluster) -> list[str]:
    return ["--emqp-store", "jetstream", "--emqp-nats", ",".join(nats.urls),
            "--emqp-nats-replicas", "3"]  # fmt: skip


def nats_pids(nats: NatsCluster | None) -> list[int]:
    if nats is None:
        return []
    return [node.process.pid for node in nats.nodes if node.process is not None]


def start_nats(root: Path, stack: Cleanup) -> NatsCluster:
    nats = NatsCluster(root / "nats", size=3)
    nats.start()
    stack.callback(nats.stop)
    return nats


def ready_broker(broker: Broker, stack: Cleanup, options: list[str]) -> Broker:
    stack.callback(broker.stop)
    broker.start(None, [*options, "--emqp-heartbeat-interval", "1s"])
    deadline = time.monotonic() + 60
    while True:  # the product starts its broker once the stream and bucket are there
        if not options:
            return broker
        status = (broker.data_dir / "status.json").read_text()
        if '"ready": true' in status:
            return broker
        if time.monotonic() > deadline:
            raise SystemExit(f"the broker did not open its stream: see {broker.log_path}")
        time.sleep(0.1)


def throughput(kind: str, root: Path, index: int, args: Any) -> dict[str, Any]:
    with Cleanup() as stack:
        nats = None
        if kind == "sqlite":
            brokers = [ready_broker(Broker(root / f"sqlite-{index}"), stack, [])]
        else:
            nats = start_nats(root / f"cluster-{index}", stack)
            brokers = [
                ready_broker(Broker(root / f"cluster-{index}-{name}"), stack, cluster_options(nats))
                for name in ("a", "b")
            ]
        workers_each = 4 // len(brokers)
        live = [broker.pid for broker in brokers] + nats_pids(nats)
        for broker in brokers:
            team = peer(stack, "workers", f"tcp://{HOST}:{broker.port}", workers_each, SLOTS,
                        program=args.program)  # fmt: skip
            team.wait_ready()
            live.append(team.proc.pid)
        jobs_each = args.jobs // len(brokers)
        wait_for_quiet(args.wait_idle)
        clients = []
        for broker in brokers:
            client = peer(stack, "client", f"tcp://{HOST}:{broker.port + 1}", jobs_each,
                          WINDOW // len(brokers), HEADERS, program=args.program)  # fmt: skip
            client.wait_ready()
            clients.append(client)
            live.append(client.proc.pid)
        account = CpuAccount(live=live)
        nats_cpu, broker_cpu = cpu_of(nats_pids(nats)), cpu_of([b.pid for b in brokers])
        busy = machine_busy_seconds()
        for client in clients:
            client.go()
        results = [client.result() for client in clients]
        busy = machine_busy_seconds() - busy
        nats_cpu = cpu_of(nats_pids(nats)) - nats_cpu
        broker_cpu = cpu_of([b.pid for b in brokers]) - broker_cpu
        foreign = account.stop()
        seconds = max(jobs_each / result["rate"] for result in results)
        rate = jobs_each * len(brokers) / seconds
        p99 = max(result["p99_us"] for result in results)
        print(f"  {kind}: {fmt_rate(rate)} guaranteed jobs/s, p99 {p99:.0f} us",
              file=sys.stderr)  # fmt: skip
        jobs = jobs_each * len(brokers)
        return {
            "rate": rate,
            "p99_us": p99,
            "clients": results,
            "foreign_cores": foreign,
            # Every process of the machine: clients, workers, brokers, nats-servers.
            "machine_cpu_us_per_job": busy / jobs * 1e6,
            "broker_cpu_us_per_job": broker_cpu / jobs * 1e6,
            "nats_cpu_us_per_job": nats_cpu / jobs * 1e6,
        }


def dealer(context: zmq.Context[Any], endpoint: str) -> zmq.Socket[Any]:
    sock = context.socket(zmq.DEALER)
    sock.linger = 0
    sock.connect(endpoint)
    return sock


def inform(sock: zmq.Socket[Any], slots: int) -> None:
    sock.send_multipart(codec.inform([(10, "default")], codec.WORKER))
    while sock.recv_multipart()[2] != codec.ACK:
        pass
    for _ in range(slots):
        sock.send_multipart(codec.ready())


def requests_received(sock: zmq.Socket[Any], count: int, deadline: float) -> set[bytes]:
    seen: set[bytes] = set()
    while len(seen) < count:
        left = deadline - time.monotonic()
        if left <= 0 or not sock.poll(left * 1000):
            raise SystemExit(f"only {len(seen)} of {count} held requests came back")
        frames = sock.recv_multipart()
        if frames[2] == codec.REQUEST:
            seen.add(frames[3])
    return seen


def failover(root: Path, index: int, args: Any) -> float:
    context = zmq.Context()
    try:
        with Cleanup() as stack:
            nats = start_nats(root / f"failover-{index}", stack)
            a, b = (
                ready_broker(Broker(root / f"failover-{index}-{n}"), stack, cluster_options(nats))
                for n in ("a", "b")
            )
            stuck = dealer(context, f"tcp://{HOST}:{b.port}")
            inform(stuck, args.held)
            time.sleep(0.5)  # its READYs reach b, and b pulls for them
            client = dealer(context, f"tcp://{HOST}:{a.port + 1}")
            for n in range(args.held):
                client.send_multipart(codec.request("default", b"%d" % n, HEADERS.encode()))
            requests_received(stuck, args.held, time.monotonic() + 30)
            b.proc.send_signal(signal.SIGKILL)
            killed = time.monotonic()
            worker = dealer(context, f"tcp://{HOST}:{a.port}")
            inform(worker, args.held)
            requests_received(worker, args.held, killed + 60)
            waited = time.monotonic() - killed
            print(f"  failover: {args.held} held requests ran again {waited:.2f} s after the "
                  "kill", file=sys.stderr)  # fmt: skip
            for sock in (stuck, client, worker):
                sock.close()
            return waited
    finally:
        context.term()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--jobs", type=int, default=40_000)
    parser.add_argument("--held", type=int, default=50)
    add_common_arguments(parser)
    args = parser.parse_args()
    terminate_on_sigterm()
    info = machine()
    runs: dict[str, list[dict[str, Any]]] = {"sqlite": [], "cluster": []}
    waits: list[float] = []
    with workdir("emqp-cluster-bench-", args.keep) as root:
        args.program = build_c_peers(root)
        for index in range(args.repeat):
            for kind in ("sqlite", "cluster"):
                runs[kind].append(throughput(kind, root, index, args))
            waits.append(failover(root, index, args))
    rate = median([run["rate"] for run in runs["cluster"]])
    base = median([run["rate"] for run in runs["sqlite"]])
    ratio = rate / base
    wait = max(waits)
    machine_cpu = median([run["machine_cpu_us_per_job"] for run in runs["cluster"]])
    bound = (os.cpu_count() or 1) / (machine_cpu / 1e6)
    verdict = ratio >= TARGET_RATIO and wait < TARGET_FAILOVER_S
    summary(
        "eMQP guaranteed jobs on a JetStream cluster",
        info,
        measured=(
            f"{fmt_rate(rate)} guaranteed jobs/s through two brokers on an R3 stream; held "
            f"requests ran again {median(waits):.2f} s (median), {wait:.2f} s (worst) after "
            "their broker was killed"
        ),
        baseline=f"one broker, SQLite store: {fmt_rate(base)} guaranteed jobs/s",
        ratio=f"{ratio:.2f} of the SQLite broker's rate",
        target=f">= {TARGET_RATIO} x the SQLite broker; held requests run again < "
        f"{TARGET_FAILOVER_S:g} s after their broker died",
        verdict=verdict,
        details=[
            (
                "CPU per job",
                "; ".join(
                    f"{kind}: machine {median([r['machine_cpu_us_per_job'] for r in runs[kind]]):.0f}"
                    f" us, brokers {median([r['broker_cpu_us_per_job'] for r in runs[kind]]):.0f}"
                    f" us, nats-servers {median([r['nats_cpu_us_per_job'] for r in runs[kind]]):.0f}"
                    " us"
                    for kind in ("sqlite", "cluster")
                )
                + f"; so with all {os.cpu_count()} cores busy the cluster could run at most "
                f"{fmt_rate(bound)} jobs/s here, {bound / base:.2f} x the SQLite broker's rate",
            ),
            noise_line([r for kind in runs for r in runs[kind]]),
        ],
        json_path=args.json,
        record={"runs": runs, "failover_s": waits},
        figures={
            "guaranteed_cluster": Figure(rate, "jobs/s"),
            "guaranteed_vs_sqlite": Figure(ratio, "x sqlite"),
            "failover": Figure(wait, "s", better="lower"),
        },
    )


if __name__ == "__main__":
    main()
