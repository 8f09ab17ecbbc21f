"""Event BUS under stuck snapshot clients: 200 DEALERs that ask for everything and never read.

The server's store is filled with EVENTS events (default 200k) through its collector.
Then, in order:

1. idle: the server's CPU and RSS over ``--window`` seconds with no client (the baseline);
2. alone: a healthy raw pyzmq DEALER times SYNCSTART -> SYNCEND for all EVENTS
   (``--repeat`` times, a fresh socket each time);
3. stuck: one process opens CLIENTS DEALERs (default options: RCVHWM 1000) that each
   send SYNCSTART for everything and never read. Once the server reports them all as
   streams, and it has sent nothing for two seconds (they take data until their kernel
   socket buffers and ZeroMQ queues are full; up to ``--settle`` seconds), the
   server's CPU and RSS are measured over ``--window`` seconds;
4. meanwhile: the healthy client's snapshot again, with the stuck clients connected;
5. left: the stuck clients close their sockets; the server's RSS is read once it
   reports no stream left and RSS has stopped falling (up to 30 s).

Baseline, same run: the idle server (1) and the healthy client alone (2).

    python bench/eventbus_stuck_snapshots.py [--events 200000] [--clients 200]
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

from _common import (
    BusServer,
    Cleanup,
    CpuAccount,
    Figure,
    add_common_arguments,
    cpu_seconds,
    machine,
    median,
    rss_kib,
    server_prefix,
    summary,
    terminate_on_sigterm,
    wait_for_quiet,
    workdir,
)

TARGET_CPU = 0.05  # of one core, above the idle server, while the stuck clients stay
TARGET_RSS_MIB = 100.0  # above the idle server, while they stay
TARGET_SLOWDOWN = 1.5  # the healthy client's snapshot time, meanwhile / alone
#: "Back to the baseline's neighbourhood" once they left.
LEFT_RSS_MIB = 30.0


def window(pid: int, seconds: float) -> dict[str, float]:
    """The process's CPU (cores) and its largest and last RSS over ``seconds``."""
    cpu = cpu_seconds(pid)
    started = time.monotonic()
    largest = 0
    while time.monotonic() - started < seconds:
        largest = max(largest, rss_kib(pid))
        time.sleep(0.1)
    elapsed = time.monotonic() - started
    last = rss_kib(pid)
    return {
        "cores": (cpu_seconds(pid) - cpu) / elapsed,
        "rss_mib": max(largest, last) / 1024,
        "last_rss_mib": last / 1024,
    }


def snapshot_times(stack: Cleanup, server: BusServer, events: int, repeat: int) -> list[Any]:
    worker = stack.worker("snapshot-client", server.snapshot, events, repeat)
    runs: list[Any] = worker.result()["runs"]
    worker.proc.wait(30)
    return runs


def times(runs: list[dict[str, Any]]) -> str:
    return ", ".join(f"{r['seconds']:.3f}" for r in runs)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--events", type=int, default=200_000)
    parser.add_argument("--clients", type=int, default=200)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--window", type=float, default=10.0, help="seconds per measurement")
    parser.add_argument(
        "--settle",
        type=float,
        default=120.0,
        help="wait up to this long for the stuck clients' buffers to fill (a server "
        "that does not report snapshot_messages_sent: this long)",
    )
    add_common_arguments(parser)
    args = parser.parse_args()
    terminate_on_sigterm()
    events, clients = args.events, args.clients
    info = machine()
    with workdir("eventbus-stuck-", args.keep) as root, Cleanup() as stack:
        server = stack.server(BusServer(root / "server", prefix=server_prefix(args.server_prefix)))
        pid = server.pid
        publisher = stack.worker("publish", server.collector, events)
        publisher.wait_ready()
        publisher.go()
        publisher.result()
        server.wait_sequence(events, timeout=600)
        print(f"store filled: sequence {events}", flush=True)

        wait_for_quiet(args.wait_idle)
        account = CpuAccount(live=[pid])
        idle = window(pid, args.window)
        print(f"idle: {idle['cores']:.1%} of a core, RSS {idle['rss_mib']:.1f} MiB", flush=True)
        alone = snapshot_times(stack, server, events, args.repeat)
        print(f"healthy client alone: {times(alone)} s", flush=True)

        stuck = stack.worker("stuck-snapshot", server.snapshot, clients)
        stuck.wait_ready()
        asked = time.monotonic()
        while True:
            status = server.status()
            started = status["snapshots_active"] + status.get("snapshots_waiting", 0)
            if started >= clients or time.monotonic() - asked > 60:
                break
            time.sleep(0.1)
        print(f"{started} stuck streams after {time.monotonic() - asked:.1f} s", flush=True)
        # Until their kernel socket buffers and ZeroMQ queues are full, the stuck clients
        # do take data: wait until the server sends nothing for two seconds.
        settling = time.monotonic()
        sent, still = -1, time.monotonic()
        if "snapshot_messages_sent" not in server.status():
            time.sleep(args.settle)  # an older server: no count to watch, wait it out
        while time.monotonic() - settling < args.settle and time.monotonic() - still < 2.0:
            time.sleep(0.25)
            now_sent = server.status().get("snapshot_messages_sent", 0)
            if now_sent != sent:
                sent, still = now_sent, time.monotonic()
        filled_after = time.monotonic() - asked
        print(f"stuck clients' buffers full after {filled_after:.1f} s", flush=True)
        during = window(pid, args.window)
        print(
            f"stuck: {during['cores']:.1%} of a core, RSS {during['rss_mib']:.1f} MiB",
            flush=True,
        )
        meanwhile = snapshot_times(stack, server, events, args.repeat)
        print(f"healthy client meanwhile: {times(meanwhile)} s", flush=True)
        with_stuck = server.status()

        stuck.go()  # any line: close every stuck socket
        stuck.result()
        stuck.proc.wait(30)
        left_at = time.monotonic()
        previous = rss_kib(pid)
        while time.monotonic() - left_at < 30:
            time.sleep(1.0)
            current = rss_kib(pid)
            gone = server.status()["snapshots_active"] == 0
            if gone and time.monotonic() - left_at > 7 and current >= previous:
                break
            previous = current
        left_rss = rss_kib(pid) / 1024
        left_seconds = time.monotonic() - left_at
        noise = account.stop()
        final = server.status()

    above_cpu = during["cores"] - idle["cores"]
    above_rss = during["rss_mib"] - idle["rss_mib"]
    alone_s = median([r["seconds"] for r in alone])
    meanwhile_s = median([r["seconds"] for r in meanwhile])
    complete = all(r["complete"] for r in alone + meanwhile)
    slowdown = meanwhile_s / alone_s
    left_above = left_rss - idle["rss_mib"]
    verdict = (
        complete
        and above_cpu < TARGET_CPU
        and above_rss < TARGET_RSS_MIB
        and slowdown < TARGET_SLOWDOWN
        and left_above < LEFT_RSS_MIB
    )
    details = [
        ("events", f"{events:,} stored, 6 frames each, 100-byte msgpack payload"),
        (
            "stuck",
            f"{clients} DEALERs (RCVHWM 1000), SYNCSTART for everything, never read; their "
            f"buffers were full after {filled_after:.1f} s",
        ),
        (
            "healthy",
            f"alone {times(alone)} s; meanwhile {times(meanwhile)} s; "
            f"{'all complete' if complete else 'INCOMPLETE'}",
        ),
        (
            "rss",
            f"idle {idle['rss_mib']:.1f} MiB; stuck {during['rss_mib']:.1f} MiB "
            f"(+{above_rss:.1f}); {left_seconds:.0f} s after they left {left_rss:.1f} MiB "
            f"(+{left_above:.1f}; target < +{LEFT_RSS_MIB:.0f})",
        ),
        (
            "cpu",
            f"idle {idle['cores']:.1%} of a core; stuck {during['cores']:.1%} "
            f"(+{above_cpu:.1%}), each over {args.window:.0f} s",
        ),
        (
            "server",
            "with the stuck clients: "
            + ", ".join(
                f"{k.removeprefix('snapshots_')} {with_stuck.get(k)}"
                for k in (
                    "snapshots_active",
                    "snapshots_waiting",
                    "snapshots_served",
                    "snapshots_stalled",
                    "snapshots_refused",
                )
            )
            + f"; at the end: aborted {final.get('snapshots_aborted')}",
        ),
        ("noise", f"other processes kept {noise:.2f} cores busy during the run"),
    ]
    summary(
        "eventbus_stuck_snapshots",
        info,
        measured=(
            f"with {clients} stuck snapshot clients: server +{above_cpu:.1%} of a core, "
            f"RSS +{above_rss:.1f} MiB; healthy snapshot {meanwhile_s:.3f} s"
        ),
        baseline=(
            f"idle server {idle['cores']:.1%} of a core, RSS {idle['rss_mib']:.1f} MiB; "
            f"healthy snapshot alone {alone_s:.3f} s"
        ),
        ratio=f"{slowdown:.2f} (healthy snapshot time meanwhile / alone)",
        target=(
            f"< {TARGET_CPU:.0%} of a core and < {TARGET_RSS_MIB:.0f} MiB above idle, "
            f"healthy snapshot < {TARGET_SLOWDOWN}x alone, RSS back within "
            f"{LEFT_RSS_MIB:.0f} MiB of idle once they left"
        ),
        verdict=verdict,
        details=details,
        json_path=args.json,
        record={"idle": idle, "stuck": during, "alone": alone, "meanwhile": meanwhile},
        figures={
            "extra_cpu": Figure(above_cpu, "cores", better="lower"),
            "extra_rss": Figure(above_rss, "MiB", better="lower"),
            "healthy_alone": Figure(alone_s, "s", better="lower"),
            "healthy_meanwhile_vs_alone": Figure(slowdown, "x", better="lower"),
        },
    )
    return 0 if verdict else 1


if __name__ == "__main__":
    sys.exit(main())
