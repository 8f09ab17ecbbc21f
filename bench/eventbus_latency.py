"""Event BUS tail latency at a steady rate, and fan-out to many subscribers.

Latency: one raw pyzmq publisher process sends RATE events a second (default 2000) for
SECONDS, each carrying its send time (CLOCK_MONOTONIC, the same clock in every process);
one raw pyzmq subscriber process reads it back out of each BROADCAST and reports
p50/p90/p99/p99.9/max (the first 200 events are warm-up). Baseline, same run: the raw
pyzmq ROUTER -> PUB forwarder (``_workers.py forward``) between the same processes.

Fan-out: one raw publisher sends EVENTS as fast as it can; SUBSCRIBERS raw subscribers
(default 10) count them. Measured: the slowest subscriber's delivered rate and any loss.
Baseline: the same with the raw forwarder.

Runs alternate baseline/server ``--repeat`` times; medians are reported.

    python bench/eventbus_latency.py [--rate 2000] [--seconds 10] [--subscribers 10]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from _common import (
    BusServer,
    Cleanup,
    CpuAccount,
    Figure,
    add_common_arguments,
    cpu_latency,
    fmt_rate,
    free_ports,
    machine,
    median,
    noise_line,
    server_prefix,
    summary,
    terminate_on_sigterm,
    wait_for_quiet,
    workdir,
)

TARGET_P99_MS = 1.0
TARGET_FANOUT_RATIO = 0.9


def endpoints(stack: Cleanup, kind: str, root: Path, prefix: list[str], extra: list[str]) -> Any:
    if kind == "server":
        # The product's default stats interval (the throughput benches' 0.5 s adds a 1-3 ms
        # status write to the reactor twice a second).
        server = stack.server(BusServer(root, prefix=prefix, extra=extra, stats_interval="10s"))
        return server.publisher, server.collector
    base = free_ports(2)
    publisher, collector = f"tcp://127.0.0.1:{base}", f"tcp://127.0.0.1:{base + 1}"
    stack.worker("forward", collector, publisher).wait_ready()
    return publisher, collector


def latency_once(kind: str, args: Any, root: Path, prefix: list[str]) -> dict[str, Any]:
    wait_for_quiet(args.wait_idle)
    account = CpuAccount()
    with Cleanup() as stack:
        publisher_endpoint, collector = endpoints(stack, kind, root, prefix, args.server_arg)
        count = int(args.rate * args.seconds)
        subscriber = stack.worker("latency-subscribe", publisher_endpoint, count)
        subscriber.wait_ready()
        publisher = stack.worker("paced-publish", collector, args.rate, args.seconds)
        publisher.wait_ready()
        publisher.go()
        sent = publisher.result()
        result = dict(subscriber.result(), kind=kind, late_sends=sent["late"])
    result["foreign_cores"] = account.stop()
    return result


def fanout_once(kind: str, args: Any, root: Path, prefix: list[str]) -> dict[str, Any]:
    wait_for_quiet(args.wait_idle)
    account = CpuAccount()
    with Cleanup() as stack:
        publisher_endpoint, collector = endpoints(stack, kind, root, prefix, args.server_arg)
        subscribers = [
            stack.worker("subscribe", publisher_endpoint, args.events)
            for _ in range(args.subscribers)
        ]
        for subscriber in subscribers:
            subscriber.wait_ready()
        publisher = stack.worker("publish", collector, args.events)
        publisher.wait_ready()
        publisher.go()
        publisher.result()
        results = [s.result() for s in subscribers]
    return {
        "kind": kind,
        "slowest": min(r["rate"] for r in results),
        "fastest": max(r["rate"] for r in results),
        "lost": sum(r["lost"] for r in results),
        "gaps": sum(r["gaps"] for r in results),
        "foreign_cores": account.stop(),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rate", type=float, default=2000)
    parser.add_argument("--seconds", type=float, default=10)
    parser.add_argument("--events", type=int, default=100_000, help="fan-out events")
    parser.add_argument("--subscribers", type=int, default=10)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--only", choices=("latency", "fanout"), default=None)
    parser.add_argument(
        "--server-arg", action="append", default=[], help="extra server option (repeatable)"
    )
    add_common_arguments(parser)
    args = parser.parse_args()
    terminate_on_sigterm()
    info = machine()
    prefix = server_prefix(args.server_prefix)
    verdict = True
    if args.cpu_latency_us is not None:
        args.server_arg += ["--cpu-latency-us", str(args.cpu_latency_us)]
    with workdir("bus-bench-latency-", args.keep) as root, cpu_latency(args.cpu_latency_us) as held:
        figures: dict[str, Figure] = {}  # for bench/ab.py: latency's, then fan-out's too
        if args.only in (None, "latency"):
            runs: dict[str, list[dict[str, Any]]] = {"baseline": [], "server": []}
            for index in range(args.repeat):
                for kind in ("baseline", "server"):
                    run = latency_once(kind, args, root / f"latency-{kind}-{index}", prefix)
                    runs[kind].append(run)
                    print(
                        f"{kind:<8} p50 {run['p50_ms']:.3f} p90 {run['p90_ms']:.3f} p99 "
                        f"{run['p99_ms']:.3f} p99.9 {run['p999_ms']:.3f} max {run['max_ms']:.2f}"
                        f" ms over {run['received']} events, gaps {run['gaps']}, late sends "
                        f"{run['late_sends']}; other processes {run['foreign_cores']:.2f} cores",
                        file=sys.stderr,
                    )

            def med(kind: str, key: str) -> float:
                return median([r[key] for r in runs[kind]])

            p99, base = med("server", "p99_ms"), med("baseline", "p99_ms")
            latency_figures = {
                "p50": Figure(med("server", "p50_ms"), "ms", better="lower"),
                "p99": Figure(p99, "ms", better="lower"),
                "p99_vs_forwarder": Figure(p99 / base, "x raw", better="lower"),
            }
            figures.update(latency_figures)
            ok = p99 <= TARGET_P99_MS and all(r["gaps"] == 0 for r in runs["server"])
            verdict = verdict and ok
            noise = noise_line(runs["baseline"] + runs["server"])
            summary(
                f"Event BUS latency at {args.rate:,.0f} events/s",
                info,
                f"server p50 {med('server', 'p50_ms'):.3f} ms, p99 {p99:.3f} ms, p99.9 "
                f"{med('server', 'p999_ms'):.3f} ms (medians of {args.repeat} runs)",
                f"raw forwarder p50 {med('baseline', 'p50_ms'):.3f} ms, p99 {base:.3f} ms, "
                f"p99.9 {med('baseline', 'p999_ms'):.3f} ms",
                f"p99 {p99 / base:.2f}x the forwarder's",
                f"p99 <= {TARGET_P99_MS} ms, no gap",
                ok,
                [noise, *held],
                args.json if args.only == "latency" else None,  # else once, with the fan-out
                {"runs": runs},
                figures=dict(figures),
            )
        if args.only in (None, "fanout"):
            fan: dict[str, list[dict[str, Any]]] = {"baseline": [], "server": []}
            for index in range(args.repeat):
                for kind in ("baseline", "server"):
                    run = fanout_once(kind, args, root / f"fanout-{kind}-{index}", prefix)
                    fan[kind].append(run)
                    print(
                        f"{kind:<8} slowest {fmt_rate(run['slowest'])} ev/s, fastest "
                        f"{fmt_rate(run['fastest'])} ev/s, lost {run['lost']}, gaps {run['gaps']};"
                        f" other processes {run['foreign_cores']:.2f} cores",
                        file=sys.stderr,
                    )
            slowest = median([r["slowest"] for r in fan["server"]])
            base_rate = median([r["slowest"] for r in fan["baseline"]])
            ratio = slowest / base_rate
            ok = ratio >= TARGET_FANOUT_RATIO and all(r["lost"] == 0 for r in fan["server"])
            verdict = verdict and ok
            noise = noise_line(fan["baseline"] + fan["server"])
            summary(
                f"Event BUS fan-out to {args.subscribers} subscribers",
                info,
                f"slowest subscriber {fmt_rate(slowest)} ev/s, lost "
                f"{sum(r['lost'] for r in fan['server'])}",
                f"raw forwarder, slowest {fmt_rate(base_rate)} ev/s",
                f"{ratio:.2f}",
                f">= {TARGET_FANOUT_RATIO} x the forwarder, none lost",
                ok,
                [noise, *held],
                args.json,
                {"runs": fan},
                figures=figures
                | {
                    "fanout_slowest": Figure(slowest, "events/s"),
                    "fanout_vs_forwarder": Figure(ratio, "x raw"),
                },
            )
    return 0 if verdict else 1


if __name__ == "__main__":
    sys.exit(main())
