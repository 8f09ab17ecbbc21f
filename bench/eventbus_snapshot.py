"""Event BUS snapshot: SYNCSTART -> 100k SYNC -> SYNCEND.

The server's store is filled with EVENTS events published through its collector (a raw
pyzmq publisher process; the script waits until status.json shows the sequence). Then:

* a raw pyzmq DEALER (RCVHWM 0, a fresh socket each time) times SYNCSTART (all subtrees,
  from sequence 0) until SYNCEND, checking it got EVENTS contiguous SYNCs;
* the project's own Twisted client, ``bus.eventbus.client.EventBusSubscriber``, times
  startService() until the snapshot is delivered and SYNCEND applied (a fresh process
  each time).

Baseline, same run: a raw pyzmq ROUTER serving the same EVENTS pre-built SYNC messages
from memory to the same raw DEALER client (same send HWM, blocking sends), its runs
alternating with the server's. ``--load N`` runs N busy loops beside them (a busy machine).
Also: the server's CPU per SYNC (all its threads), steadier than its time on a shared machine.

    python bench/eventbus_snapshot.py [--events 100000] [--repeat 3] [--load 2]
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from _common import (
    BusServer,
    Cleanup,
    CpuAccount,
    Figure,
    add_common_arguments,
    cpu_load,
    cpu_seconds,
    free_ports,
    machine,
    median,
    server_prefix,
    summary,
    terminate_on_sigterm,
    wait_for_quiet,
    workdir,
)

#: Seconds per 100k events (issue 3); every run at least this much of the baseline's rate
#: (issue 20).
TARGET_SECONDS = 1.0
TARGET_RATIO = 0.9


def one_snapshot(stack: Cleanup, endpoint: str, events: int) -> list[dict[str, Any]]:
    """One raw DEALER's SYNCSTART -> SYNCEND (a fresh process and socket)."""
    worker = stack.worker("snapshot-client", endpoint, events, 1)
    runs: list[dict[str, Any]] = worker.result()["runs"]
    worker.proc.wait(30)
    return runs


def times(runs: list[dict[str, Any]]) -> str:
    return ", ".join(f"{r['seconds']:.3f}" for r in runs)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--events", type=int, default=100_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--no-twisted", action="store_true", help="skip the Twisted client")
    parser.add_argument(
        "--load",
        type=int,
        default=0,
        help="busy loops running beside the raw runs (2 on this machine: a busy machine)",
    )
    add_common_arguments(parser)
    args = parser.parse_args()
    terminate_on_sigterm()
    events = args.events
    info = machine()
    with workdir("eventbus-snapshot-", args.keep) as root, Cleanup() as stack:
        server = stack.server(BusServer(root / "server", prefix=server_prefix(args.server_prefix)))
        publisher = stack.worker("publish", server.collector, events)
        publisher.wait_ready()
        publisher.go()
        publisher.result()
        status = server.wait_sequence(events, timeout=600)
        print(f"store filled: sequence {status['sequence']}", flush=True)

        port = free_ports(1)
        endpoint = f"tcp://127.0.0.1:{port}"
        baseline_server = stack.worker("snapshot-server", endpoint, events)
        baseline_server.wait_ready()
        raw: list[dict[str, Any]] = []
        base: list[dict[str, Any]] = []
        server_cpu: list[float] = []
        wait_for_quiet(args.wait_idle)
        with cpu_load(args.load):
            account = CpuAccount(live=[server.pid, baseline_server.proc.pid])
            # Server and baseline alternate, run by run: each pair saw the same machine.
            for _ in range(args.repeat):
                before = cpu_seconds(server.pid)
                raw += one_snapshot(stack, server.snapshot, events)
                server_cpu.append(cpu_seconds(server.pid) - before)
                base += one_snapshot(stack, endpoint, events)
            noise = account.stop()
        print(f"raw DEALER from the server: {times(raw)} s", flush=True)
        print(f"raw DEALER from the raw ROUTER baseline: {times(base)} s", flush=True)

        twisted: list[dict[str, Any]] = []
        if not args.no_twisted:
            for _ in range(args.repeat):
                wait_for_quiet(args.wait_idle)
                run = stack.worker("twisted-snapshot", f"127.0.0.1:{server.port}", events).result()
                twisted.append(run)
            print(f"EventBusSubscriber from the server: {times(twisted)} s", flush=True)
        served = server.status()

    server_seconds = median([r["seconds"] for r in raw])
    base_seconds = median([r["seconds"] for r in base])
    # Per pair (server run, then the baseline's), the server's rate over the baseline's.
    ratios = [b["seconds"] / r["seconds"] for r, b in zip(raw, base, strict=True)]
    worst = min(ratios)
    per_event_us = median(server_cpu) / events * 1e6
    complete = all(r["complete"] for r in raw)
    twisted_seconds = median([r["seconds"] for r in twisted]) if twisted else float("nan")
    twisted_complete = all(r["complete"] for r in twisted)
    target_seconds = TARGET_SECONDS * events / 100_000
    verdict = complete and server_seconds < target_seconds and worst >= TARGET_RATIO
    details = [
        ("events", f"{events:,} stored, 6 frames each, 100-byte msgpack payload"),
        ("raw runs", f"server {times(raw)} s; baseline {times(base)} s (alternated)"),
        ("per run", "server rate / baseline rate " + ", ".join(f"{r:.2f}" for r in ratios)),
        (
            "server CPU",
            f"{per_event_us:.2f} us per SYNC (median of the runs; all its threads)"
            + (f"; {args.load} busy loops ran beside" if args.load else ""),
        ),
    ]
    if twisted:
        details.append(
            (
                "twisted client",
                f"EventBusSubscriber: median {twisted_seconds:.3f} s ({times(twisted)}), "
                f"{'complete' if twisted_complete else 'INCOMPLETE'}; "
                f"{events / twisted_seconds:,.0f} events/s",
            )
        )
    details.append(("noise", f"other processes kept {noise:.2f} cores busy during the runs"))
    details.append(
        (
            "server",
            f"snapshots served {served['snapshots_served']}, aborted {served['snapshots_aborted']}",
        )
    )
    summary(
        "eventbus_snapshot",
        info,
        measured=(
            f"SYNCSTART -> SYNCEND with {events:,} SYNC from the server: median "
            f"{server_seconds:.3f} s ({events / server_seconds:,.0f} events/s), "
            f"{'all received, contiguous' if complete else 'INCOMPLETE'}"
        ),
        baseline=(
            f"raw pyzmq ROUTER serving pre-built SYNCs from memory: median {base_seconds:.3f} s "
            f"({events / base_seconds:,.0f} events/s)"
        ),
        ratio=(
            f"{median(ratios):.2f} (median of the runs' server rate / baseline rate), worst "
            f"{worst:.2f}"
        ),
        target=(
            f"< {target_seconds:.1f} s for {events:,} events, all received, every run >= "
            f"{TARGET_RATIO} of the baseline"
        ),
        verdict=verdict,
        details=details,
        json_path=args.json,
        record={"raw": raw, "baseline": base, "twisted": twisted},
        figures={
            "snapshot": Figure(server_seconds, "s", better="lower"),
            "snapshot_vs_raw_router": Figure(median(ratios), "x raw"),
            "worst_vs_raw_router": Figure(worst, "x raw"),
            "server_cpu_per_sync": Figure(per_event_us, "us", better="lower"),
        },
    )
    return 0 if verdict else 1


if __name__ == "__main__":
    sys.exit(main())
