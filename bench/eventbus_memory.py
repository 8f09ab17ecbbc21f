"""Event BUS memory: the server's RSS while its store grows to EVENTS events.

A raw pyzmq publisher process publishes EVENTS events (default 1M) through the
collector while a raw pyzmq subscriber consumes the PUB feed (``--no-subscriber`` to
leave the PUB socket without peers). The script samples the server's VmRSS from
/proc/PID/status every 50 ms and records it each time the stored sequence (status.json)
crosses a multiple of ``--every`` (100k); at the end it reads VmHWM, the kernel's
record of the peak RSS.

Baseline, same run: the RSS of the idle server right after start.

    python bench/eventbus_memory.py [--events 1000000] [--every 100000]
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import time
from typing import Any

from _common import (
    BusServer,
    Cleanup,
    CpuAccount,
    add_common_arguments,
    machine,
    rss_kib,
    server_prefix,
    summary,
    terminate_on_sigterm,
    wait_for_quiet,
    workdir,
)

TARGET_MIB = 200.0
#: "Flat": after the first checkpoint, RSS may grow by at most this much in total.
FLAT_MIB = 20.0


def hwm_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--every", type=int, default=100_000)
    parser.add_argument("--no-subscriber", action="store_true")
    add_common_arguments(parser)
    args = parser.parse_args()
    terminate_on_sigterm()
    events = args.events
    info = machine()
    checkpoints: list[tuple[int, float]] = []
    with workdir("eventbus-memory-", args.keep) as root, Cleanup() as stack:
        wait_for_quiet(args.wait_idle)
        server = stack.server(BusServer(root / "server", prefix=server_prefix(args.server_prefix)))
        pid = server.pid
        server.wait_reports(2)  # let it settle: two stats intervals
        idle_kib = 0
        for _ in range(5):
            idle_kib = max(idle_kib, rss_kib(pid))
            time.sleep(0.05)
        subscriber = None
        if not args.no_subscriber:
            subscriber = stack.worker("subscribe", server.publisher, events, 30)
            subscriber.wait_ready()
        publisher = stack.worker("publish", server.collector, events)
        publisher.wait_ready()
        started = time.monotonic()
        account = CpuAccount(live=[pid])
        publisher.go()
        max_kib = 0
        next_mark = args.every
        sequence = 0
        while sequence < events:
            time.sleep(0.05)
            kib = rss_kib(pid)
            max_kib = max(max_kib, kib)
            with contextlib.suppress(RuntimeError):
                sequence = int(server.status()["sequence"])
            while sequence >= next_mark:
                checkpoints.append((sequence, kib / 1024))
                print(f"  sequence {sequence:>9,}  RSS {kib / 1024:7.1f} MiB", flush=True)
                next_mark += args.every
            if time.monotonic() - started > 1800:
                raise TimeoutError("store did not reach the target sequence in 30 min")
        elapsed = time.monotonic() - started
        publisher.result()
        received: dict[str, Any] = subscriber.result() if subscriber else {}
        publisher.proc.wait(30)
        if subscriber:
            subscriber.proc.wait(30)
        noise = account.stop()
        time.sleep(1.0)
        final_kib = rss_kib(pid)
        max_kib = max(max_kib, final_kib)
        peak_kib = hwm_kib(pid)
        db_mib = sum(p.stat().st_size for p in server.data_dir.glob("events.sqlite3*")) / 2**20

    idle = idle_kib / 1024
    peak = max(peak_kib, max_kib) / 1024
    first = checkpoints[0][1] if checkpoints else idle
    growth = max(kib for _, kib in checkpoints) - first if checkpoints else 0.0
    flat = growth <= FLAT_MIB
    verdict = peak < TARGET_MIB and flat
    per_step = growth / max(len(checkpoints) - 1, 1)
    details = [
        (
            "samples",
            "; ".join(f"{seq // 1000}k: {mib:.0f}" for seq, mib in checkpoints) + " (MiB)",
        ),
        (
            "final",
            f"{final_kib / 1024:.1f} MiB after the last event; store on disk {db_mib:.0f} MiB",
        ),
        (
            "growth",
            f"{growth:+.1f} MiB from the first checkpoint to the largest later one "
            f"({per_step:+.1f} MiB per {args.every // 1000}k; flat means <= {FLAT_MIB:.0f} MiB)",
        ),
        (
            "ingest",
            f"{events:,} events stored in {elapsed:.1f} s ({events / elapsed:,.0f} events/s)",
        ),
    ]
    details.append(("noise", f"other processes kept {noise:.2f} cores busy while filling"))
    if received:
        details.append(
            ("subscriber", f"received {received['received']:,}, lost {received['lost']}")
        )
    summary(
        "eventbus_memory",
        info,
        measured=f"max server RSS {peak:.1f} MiB (VmHWM) while storing {events:,} events",
        baseline=f"idle server RSS right after start {idle:.1f} MiB",
        ratio=f"{peak / idle:.2f} (max / idle)",
        target=f"max RSS < {TARGET_MIB:.0f} MiB and flat",
        verdict=verdict,
        details=details,
        json_path=args.json,
        record={"checkpoints": checkpoints, "idle_mib": idle, "peak_mib": peak},
    )
    return 0 if verdict else 1


if __name__ == "__main__":
    sys.exit(main())
