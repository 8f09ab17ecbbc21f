"""Event BUS snapshot: SYNCSTART -> 100k SYNC -> SYNCEND.

The server's store is filled with EVENTS events published through its collector (a raw
pyzmq publisher process; the script waits until status.json shows the sequence). Then:

* a raw pyzmq DEALER (RCVHWM 0, a fresh socket each time) times SYNCSTART (all subtrees,
  from sequence 0) until SYNCEND, checking it got EVENTS contiguous SYNCs;
* the project's own Twisted client, ``bus.eventbus.client.EventBusSubscriber``, times
  startService() until the snapshot is delivered and SYNCEND applied (a fresh process
  each time).

Baseline, same run: a raw pyzmq ROUTER serving the same EVENTS pre-built SYNC messages
from memory to the same raw DEALER client.

    python bench/eventbus_snapshot.py [--events 100000] [--repeat 3]
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
    free_ports,
    machine,
    median,
    server_prefix,
    summary,
    terminate_on_sigterm,
    wait_for_quiet,
    workdir,
)

TARGET_SECONDS = 1.0


def times(runs: list[dict[str, Any]]) -> str:
    return ", ".join(f"{r['seconds']:.3f}" for r in runs)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--events", type=int, default=100_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--no-twisted", action="store_true", help="skip the Twisted client")
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

        wait_for_quiet(args.wait_idle)
        account = CpuAccount(live=[server.pid])
        raw_worker = stack.worker("snapshot-client", server.snapshot, events, args.repeat)
        raw = raw_worker.result()["runs"]
        raw_worker.proc.wait(30)
        noise = [account.stop()]
        print(f"raw DEALER from the server: {times(raw)} s", flush=True)

        twisted: list[dict[str, Any]] = []
        if not args.no_twisted:
            for _ in range(args.repeat):
                wait_for_quiet(args.wait_idle)
                run = stack.worker("twisted-snapshot", f"127.0.0.1:{server.port}", events).result()
                twisted.append(run)
            print(f"EventBusSubscriber from the server: {times(twisted)} s", flush=True)
        served = server.status()

        port = free_ports(1)
        endpoint = f"tcp://127.0.0.1:{port}"
        baseline_server = stack.worker("snapshot-server", endpoint, events)
        baseline_server.wait_ready()
        wait_for_quiet(args.wait_idle)
        account = CpuAccount(live=[server.pid, baseline_server.proc.pid])
        base_worker = stack.worker("snapshot-client", endpoint, events, args.repeat)
        base = base_worker.result()["runs"]
        base_worker.proc.wait(30)
        noise.append(account.stop())
        print(f"raw DEALER from the raw ROUTER baseline: {times(base)} s", flush=True)

    server_seconds = median([r["seconds"] for r in raw])
    base_seconds = median([r["seconds"] for r in base])
    complete = all(r["complete"] for r in raw)
    twisted_seconds = median([r["seconds"] for r in twisted]) if twisted else float("nan")
    twisted_complete = all(r["complete"] for r in twisted)
    verdict = complete and server_seconds < TARGET_SECONDS
    details = [
        ("events", f"{events:,} stored, 6 frames each, 100-byte msgpack payload"),
        ("raw runs", f"server {times(raw)} s; baseline {times(base)} s"),
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
    details.append(
        (
            "noise",
            f"other processes kept {noise[0]:.2f} (server runs) and {noise[1]:.2f} (baseline "
            "runs) cores busy",
        )
    )
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
            f"{base_seconds / server_seconds:.2f} (server rate / baseline rate; the server "
            f"takes {server_seconds / base_seconds:.1f}x the baseline's time)"
        ),
        target=f"< {TARGET_SECONDS:.0f} s for {events:,} events, all received",
        verdict=verdict,
        details=details,
        json_path=args.json,
        record={"raw": raw, "baseline": base, "twisted": twisted},
        figures={
            "snapshot": Figure(server_seconds, "s", better="lower"),
            "snapshot_vs_raw_router": Figure(base_seconds / server_seconds, "x raw"),
        },
    )
    return 0 if verdict else 1


if __name__ == "__main__":
    sys.exit(main())
