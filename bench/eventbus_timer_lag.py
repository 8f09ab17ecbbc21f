"""Event BUS timer lag: how late a 10 ms timer in the server's reactor runs under load.

The server measures it itself: ``max_timer_lag_ms`` is the largest lateness of an internal
10 ms LoopingCall since the previous stats report (every 0.5 s here); each report is
written to status.json and logged. This script reads every report from the server's log,
so none is missed between two reads of status.json.

Phase 1 (baseline): the idle server with one subscriber connected, ``--idle-seconds``.
Phase 2 (measured): a raw pyzmq publisher floods EVENTS (300k) events as fast as blocking
sends allow, while a raw pyzmq subscriber consumes the PUB feed; the reports from the
start of the flood to the first report after the last event was stored are kept.

    python bench/eventbus_timer_lag.py [--events 300000] [--idle-seconds 5]
"""

from __future__ import annotations

import argparse
import sys

from _common import (
    BusServer,
    Cleanup,
    CpuAccount,
    LagReport,
    RunQueueSampler,
    add_common_arguments,
    machine,
    median,
    server_prefix,
    summary,
    terminate_on_sigterm,
    wait_for_quiet,
    workdir,
)

TARGET_MS = 50.0


def spread(reports: list[LagReport]) -> str:
    lags = sorted(r.lag_ms for r in reports)
    if not lags:
        return "no reports"
    p90 = lags[min(int(len(lags) * 0.9), len(lags) - 1)]
    return (
        f"{len(lags)} reports: median {median(lags):.1f} ms, p90 {p90:.1f} ms, "
        f"max {lags[-1]:.1f} ms; {sum(1 for x in lags if x > TARGET_MS)} over {TARGET_MS:.0f} ms"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--events", type=int, default=300_000)
    parser.add_argument("--idle-seconds", type=float, default=5.0)
    parser.add_argument("--no-subscriber", action="store_true")
    add_common_arguments(parser)
    args = parser.parse_args()
    terminate_on_sigterm()
    events = args.events
    info = machine()
    with workdir("eventbus-lag-", args.keep) as root, Cleanup() as stack:
        wait_for_quiet(args.wait_idle)
        server = stack.server(BusServer(root / "server", prefix=server_prefix(args.server_prefix)))
        subscriber = None
        if not args.no_subscriber:
            subscriber = stack.worker("subscribe", server.publisher, events, 30)
            subscriber.wait_ready()
        publisher = stack.worker("publish", server.collector, events)
        publisher.wait_ready()

        first_idle = len(server.wait_reports(1))  # skip the report covering start-up
        idle_count = max(int(args.idle_seconds / 0.5), 2)
        idle = server.wait_reports(first_idle + idle_count)[first_idle : first_idle + idle_count]

        wait_for_quiet(args.wait_idle)
        before = len(server.reports())
        account = CpuAccount(live=[server.pid])
        sampler = RunQueueSampler(server.pid).start()
        publisher.go()
        sent = publisher.result()
        server.wait_sequence(events, timeout=600)
        received = subscriber.result() if subscriber else {}
        sampler.stop()
        publisher.proc.wait(30)
        if subscriber:
            subscriber.proc.wait(30)
        noise = account.stop()
        after_store = len(server.reports())
        loaded = server.wait_reports(after_store + 1)[before : after_store + 1]
        status = server.status()

    idle_max = max(r.lag_ms for r in idle)
    loaded_max = max(r.lag_ms for r in loaded)
    verdict = loaded_max <= TARGET_MS
    worst = sorted(loaded, key=lambda r: r.lag_ms, reverse=True)[:5]
    flood_seconds = sent["t_sent"] - sent["t_start"]
    details = [
        ("idle", spread(idle)),
        ("flood", spread(loaded)),
        (
            "worst",
            "; ".join(f"{r.lag_ms:.1f} ms at sequence {r.sequence:,}" for r in worst),
        ),
        (
            "load",
            f"{events:,} events sent in {flood_seconds:.1f} s "
            f"({events / flood_seconds:,.0f} events/s); server accepted {status['accepted']:,}",
        ),
    ]
    details.append(("noise", f"other processes kept {noise:.2f} cores busy during the flood"))
    details.append(("scheduling", sampler.describe()))
    if received:
        details.append(
            ("subscriber", f"received {received['received']:,}, lost {received['lost']}")
        )
    summary(
        "eventbus_timer_lag",
        info,
        measured=f"max 10 ms timer lateness under a {events:,}-event flood: {loaded_max:.1f} ms",
        baseline=f"same figure, idle server: {idle_max:.1f} ms",
        ratio=f"{loaded_max / max(idle_max, 0.001):.1f} (flood / idle; lower is better)",
        target=f"never late by more than {TARGET_MS:.0f} ms",
        verdict=verdict,
        details=details,
        json_path=args.json,
        record={
            "run_queue_wait_ms": sampler.total_wait() * 1000,
            "worst_run_queue_wait_100ms_ms": sampler.worst_wait() * 1000,
            "idle_ms": [r.lag_ms for r in idle],
            "flood": [(r.sequence, r.lag_ms) for r in loaded],
        },
    )
    return 0 if verdict else 1


if __name__ == "__main__":
    sys.exit(main())
