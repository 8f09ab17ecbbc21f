"""mc0 broker throughput through CURVE, in the spirit of mc0d's torture tool.

Acknowledged commands: CLIENTS (50) CURVE clients, in two raw pyzmq processes, each
CONNECT, then send COUNT (1000) NOOPs with an ID in lockstep, each waiting for the OK with
the same ID. Measured: acknowledged commands/s (first send to last OK, all clients), and
missing or mismatched acks (must be zero).

Fan-out: SUBSCRIBERS (100) CURVE clients, in two processes, SUB one topic; one client PUTs
PUTS messages (100-byte body) with IDs, at most 50 awaiting their OK. Measured: MESSAGEs/s
delivered (first to last received over all subscribers) and MESSAGEs missing.

Baseline, same run: a raw pyzmq CURVE ROUTER (``_mc0_workers.py echo``) doing the least of
the same work, with the same clients. Runs alternate baseline/server ``--repeat`` times;
medians are reported.

    python bench/mc0_throughput.py [--clients 50] [--count 1000] [--subscribers 100]
                                   [--puts 5000] [--repeat 3]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from _common import (
    Cleanup,
    CpuAccount,
    Figure,
    TwistdProcess,
    Worker,
    add_common_arguments,
    cpu_seconds,
    fmt_rate,
    free_ports,
    machine,
    median,
    noise_line,
    server_prefix,
    summary,
    terminate_on_sigterm,
    wait_for_quiet,
    wait_until,
    workdir,
)

HERE = Path(__file__).resolve().parent
MC0_WORKERS = HERE / "_mc0_workers.py"
TARGET_ACKS = 20_000
TARGET_FANOUT = 50_000
TOPIC = "mcollective.bench"


def Mc0Worker(role: str, *args: object) -> Worker:
    """A ``_mc0_workers.py ROLE`` process (the same READY/GO/JSON protocol as Worker)."""
    return Worker(role, *args, script=MC0_WORKERS)


@dataclass
class Mc0Server(TwistdProcess):
    """``twistd -n mc0`` on 127.0.0.1 with its key pair under ``workdir``."""

    workdir: Path
    prefix: list[str] = field(default_factory=list)
    proc: subprocess.Popen[bytes] | None = None
    port: int = 0
    label = "mc0"

    def __post_init__(self) -> None:
        self.log_path = self.workdir / "twistd.log"
        self.stdout_path = self.workdir / "stdout.txt"
        self.port = free_ports(1)

    @property
    def endpoint(self) -> str:
        return f"tcp://127.0.0.1:{self.port}"

    def start(self) -> Mc0Server:
        args = ["mc0", "--port", str(self.port), "--data-dir", str(self.workdir / "keys")]
        self._spawn(self._twistd_argv(args), "MC0_")
        wait_until(
            lambda: (
                (self.workdir / "keys" / "server.key").exists() and "started mc0" in self.log_tail()
            ),
            60,
            "twistd mc0 to start",
            self.check_alive,
        )
        return self

    @property
    def public_key(self) -> str:
        import zmq.auth

        public, _ = zmq.auth.load_certificate(str(self.workdir / "keys" / "server.key"))
        return str(public.decode())


def start_broker(kind: str, stack: Cleanup, root: Path, prefix: list[str]) -> tuple[str, str, int]:
    """(endpoint, server public key, pid) of the broker under test or of the baseline."""
    if kind == "server":
        server = Mc0Server(root, prefix)
        stack.callback(server.stop)
        server.start()
        return server.endpoint, server.public_key, server.pid
    import zmq

    public, secret = zmq.curve_keypair()
    endpoint = f"tcp://127.0.0.1:{free_ports(1)}"
    echo = Mc0Worker("echo", endpoint, secret.decode())
    stack.callback(echo.stop)
    echo.wait_ready()
    return endpoint, public.decode(), echo.proc.pid


def run_acks(kind: str, args: argparse.Namespace, root: Path, prefix: list[str]) -> dict[str, Any]:
    wait_for_quiet(args.wait_idle)
    account = CpuAccount()
    with Cleanup() as stack:
        endpoint, key, pid = start_broker(kind, stack, root, prefix)
        halves = [args.clients // 2, args.clients - args.clients // 2]
        workers = [Mc0Worker("acker", endpoint, key, n, args.count) for n in halves if n]
        for worker in workers:
            stack.callback(worker.stop)
            worker.wait_ready()
        cpu_before = cpu_seconds(pid)
        for worker in workers:
            worker.go()
        results = [worker.result() for worker in workers]
        cpu = cpu_seconds(pid) - cpu_before
    acks = sum(r["acks"] for r in results)
    elapsed = max(r["end"] for r in results) - min(r["start"] for r in results)
    return {
        "kind": kind,
        "rate": acks / max(elapsed, 1e-9),
        "acks": acks,
        "missing": sum(r["missing"] for r in results),
        "mismatched": sum(r["mismatched"] for r in results),
        "cpu_us_per_ack": cpu / max(acks, 1) * 1e6,
        "foreign_cores": account.stop(),
    }


def run_fanout(
    kind: str, args: argparse.Namespace, root: Path, prefix: list[str]
) -> dict[str, Any]:
    wait_for_quiet(args.wait_idle)
    account = CpuAccount()
    with Cleanup() as stack:
        endpoint, key, pid = start_broker(kind, stack, root, prefix)
        halves = [args.subscribers // 2, args.subscribers - args.subscribers // 2]
        subscribers = [
            Mc0Worker("subscribers", endpoint, key, n, TOPIC, args.puts) for n in halves if n
        ]
        for worker in subscribers:
            stack.callback(worker.stop)
            worker.wait_ready()
        putter = Mc0Worker("putter", endpoint, key, TOPIC, args.puts, 50, 100)
        stack.callback(putter.stop)
        putter.wait_ready()
        cpu_before = cpu_seconds(pid)
        putter.go()
        put = putter.result()
        results = [worker.result() for worker in subscribers]
        cpu = cpu_seconds(pid) - cpu_before
    received = sum(r["received"] for r in results)
    elapsed = max(r["last"] for r in results) - min(r["first"] for r in results)
    expected = args.puts * args.subscribers
    return {
        "kind": kind,
        "rate": received / max(elapsed, 1e-9),
        "received": received,
        "missing": expected - received,
        "bad": sum(r["bad"] for r in results),
        "put_acks": put["acks"],
        "cpu_us_per_message": cpu / max(received, 1) * 1e6,
        "foreign_cores": account.stop(),
    }


def describe(run: dict[str, Any], unit: str) -> str:
    extra = ", ".join(
        f"{k} {v:.2f}" if isinstance(v, float) else f"{k} {v}"
        for k, v in run.items()
        if k not in ("kind", "rate")
    )
    return f"{run['kind']:<8} {fmt_rate(run['rate']):>9} {unit}; {extra}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", type=int, default=50)
    parser.add_argument("--count", type=int, default=1000)
    parser.add_argument("--subscribers", type=int, default=100)
    parser.add_argument("--puts", type=int, default=5000)
    parser.add_argument("--repeat", type=int, default=3)
    add_common_arguments(parser)
    args = parser.parse_args()
    terminate_on_sigterm()
    info = machine()
    prefix = server_prefix(args.server_prefix)
    runs: dict[str, dict[str, list[dict[str, Any]]]] = {
        "acks": {"baseline": [], "server": []},
        "fanout": {"baseline": [], "server": []},
    }
    with workdir("mc0-bench-", args.keep) as root:
        for index in range(args.repeat):
            for kind in ("baseline", "server"):
                run = run_acks(kind, args, root / f"acks-{kind}-{index}", prefix)
                runs["acks"][kind].append(run)
                print(describe(run, "acks/s"), file=sys.stderr)
                run = run_fanout(kind, args, root / f"fanout-{kind}-{index}", prefix)
                runs["fanout"][kind].append(run)
                print(describe(run, "MESSAGEs/s"), file=sys.stderr)
    acks = {kind: median([r["rate"] for r in rs]) for kind, rs in runs["acks"].items()}
    fanout = {kind: median([r["rate"] for r in rs]) for kind, rs in runs["fanout"].items()}
    server_runs = runs["acks"]["server"] + runs["fanout"]["server"]
    clean = all(r["missing"] == 0 and r.get("mismatched", 0) == 0 for r in server_runs)
    verdict = acks["server"] >= TARGET_ACKS and fanout["server"] >= TARGET_FANOUT and clean
    all_runs = [*runs["acks"]["baseline"], *runs["fanout"]["baseline"], *server_runs]
    summary(
        "mc0 CURVE throughput",
        info,
        measured=f"{fmt_rate(acks['server'])} acknowledged commands/s "
        f"({args.clients} clients x {args.count} NOOPs); {fmt_rate(fanout['server'])} "
        f"MESSAGEs/s delivered ({args.puts} PUTs x {args.subscribers} subscribers)",
        baseline=f"raw pyzmq CURVE ROUTER: {fmt_rate(acks['baseline'])} acks/s; "
        f"{fmt_rate(fanout['baseline'])} MESSAGEs/s",
        ratio=f"acks {acks['server'] / acks['baseline']:.2f}; "
        f"fan-out {fanout['server'] / fanout['baseline']:.2f}",
        target=f">= {fmt_rate(TARGET_ACKS)} acks/s, >= {fmt_rate(TARGET_FANOUT)} MESSAGEs/s, "
        "zero missing or mismatched acks and messages",
        verdict=verdict,
        details=[
            ("missing", "none" if clean else "SOME ACKS OR MESSAGES MISSING (see runs)"),
            noise_line(all_runs),
        ],
        json_path=args.json,
        record={"runs": runs},
        figures={
            "acks": Figure(acks["server"], "acks/s"),
            "acks_vs_raw": Figure(acks["server"] / acks["baseline"], "x raw"),
            "fanout": Figure(fanout["server"], "messages/s"),
            "fanout_vs_raw": Figure(fanout["server"] / fanout["baseline"], "x raw"),
        },
    )


if __name__ == "__main__":
    main()
