"""Spark bridge throughput: does the journal keep up with the bus at its peak rate?

One raw pyzmq publisher process (a DEALER, blocking sends) pushes EVENTS PUBs (6
frames, 100-byte msgpack payload, 16 topics) as fast as it can into the bus
(``twistd -n eventbus``); the standalone bridge (``twistd -n spark-bridge --server
127.0.0.1:P --journal-dir J``) journals the bus's feed into Parquet segments.

Measured, sampled every 10 ms from outside the processes: the bus's accepted sequence
(``status.json``, written every 0.1 s) and the journal's latest sequence
(``JournalReader(J).latest_sequence()``). The headline is the journaled rate, EVENTS
over the time from the publisher's first send to the journal holding the last event;
also the lag at the end (publisher done -> journal complete), the rate mid-run (10% ->
90% of the events) and each process's CPU per event. Afterwards the bridge is stopped
and the journal read back: it must hold every sequence once, contiguous, with no gap
recorded, each row being the event published at that position.

Baseline, same run: the same bus and publisher with a raw pyzmq SUB process
(``_workers.py subscribe``: RCVHWM 0, counts and checks sequences, no journaling) in
place of the bridge: what the bus delivers to a trivial consumer, over the same span
(first send -> last event received). Runs alternate baseline/bridge ``--repeat`` times;
medians are reported.

    python bench/spark_bridge.py [--events 200000] [--repeat 3]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from _common import (
    HOST,
    BusServer,
    Cleanup,
    CpuAccount,
    RunQueueSampler,
    TwistdProcess,
    add_common_arguments,
    cpu_seconds,
    fmt_rate,
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
from _workers import PRODUCER, TOPICS, ZERO_SEQUENCE, payload

TARGET_RATE = 60_000
WARMUP_TOPIC = b"/bench/warmup/"
#: status.json period of the bus under test (the default 10 s is too coarse to time a
#: 3 s run; the benchmark README's other benchmarks use 0.5 s).
STATS_INTERVAL = "0.1s"


# -- the bridge under test -------------------------------------------------------------------


@dataclass
class BridgeProcess(TwistdProcess):
    """``twistd -n spark-bridge --server 127.0.0.1:P --journal-dir J`` in ``workdir``.

    ``prefix`` wraps the command (a profiler), as for :class:`_common.BusServer`."""

    workdir: Path
    server_port: int
    prefix: list[str] = field(default_factory=list)
    extra: list[str] = field(default_factory=list)
    proc: subprocess.Popen[bytes] | None = None
    journal_dir: Path = field(init=False)
    log_path: Path = field(init=False)
    stdout_path: Path = field(init=False)
    label = "bridge"

    def __post_init__(self) -> None:
        self.journal_dir = self.workdir / "journal"
        self.log_path = self.workdir / "bridge.log"
        self.stdout_path = self.workdir / "bridge-stdout.txt"

    @property
    def argv(self) -> list[str]:
        return self._twistd_argv(
            [
                "spark-bridge",
                "--server",
                f"{HOST}:{self.server_port}",
                "--journal-dir",
                str(self.journal_dir),
                *self.extra,
            ]
        )

    def start(self, timeout: float = 60.0) -> BridgeProcess:
        self._spawn(self.argv, "SPARK_BRIDGE_")
        wait_until(
            lambda: "spark bridge journaling" in self._log(),
            timeout,
            "the bridge to start",
            self.check_alive,
        )
        return self

    def _log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def warnings(self) -> list[str]:
        """Log lines at warn level or above (pauses, gaps, failures)."""
        return [
            line
            for line in self._log().splitlines()
            if any(w in line for w in ("pausing", "gap", "fail", "Traceback", "timed out"))
        ]


def publish_one(collector: str, topic: bytes, data: bytes, timestamp: bytes) -> None:
    """One PUB through a short-lived raw DEALER (waits until it is on the wire)."""
    import uuid

    import zmq

    context = zmq.Context()
    try:
        dealer = context.socket(zmq.DEALER)
        dealer.linger = 5000
        dealer.connect(collector)
        event_id = str(uuid.uuid4()).encode()
        dealer.send_multipart([topic, ZERO_SEQUENCE, PRODUCER, timestamp, event_id, data])
        dealer.close()
    finally:
        context.term()


def journal_latest(journal: Path) -> int:
    """The journal's latest sequence (0 while the directory does not exist yet)."""
    from bus.spark.journal import JournalReader

    if not journal.exists():
        return 0
    return JournalReader(journal).latest_sequence()


class Sampler:
    """Polls the bus's status.json and the journal every ``interval`` in a thread."""

    def __init__(self, server: BusServer, journal: Path | None, interval: float = 0.01):
        from bus.spark.journal import JournalReader

        self.server = server
        self.journal = JournalReader(journal) if journal is not None else None
        self.journal_dir = journal
        self.interval = interval
        self.samples: list[tuple[float, int, int]] = []  # (monotonic, bus seq, journal seq)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _journal_sequence(self) -> int:
        if self.journal is None or self.journal_dir is None or not self.journal_dir.exists():
            return 0
        try:
            return self.journal.latest_sequence()
        except Exception:  # a listing racing a rename: try next time
            return self.samples[-1][2] if self.samples else 0

    def _run(self) -> None:
        while not self._stop.is_set():
            bus = int(self.server.status()["sequence"])
            journal = self._journal_sequence()
            self.samples.append((time.monotonic(), bus, journal))
            self._stop.wait(self.interval)

    def start(self) -> Sampler:
        self._thread.start()
        return self

    def stop(self) -> Sampler:
        self._stop.set()
        self._thread.join(5)
        return self

    def first_time(self, column: int, value: int) -> float | None:
        """When the sampled column (1: bus, 2: journal) first reached ``value``."""
        for sample in self.samples:
            if sample[column] >= value:
                return sample[0]
        return None

    def latest(self, column: int) -> int:
        return int(self.samples[-1][column]) if self.samples else 0


def catch_up(server: BusServer, bridge: BridgeProcess, total: int) -> dict[str, Any]:
    """Start a second bridge (empty journal) against the idle bus that holds ``total``
    events: it journals them through its first snapshot (SYNCSTART from 0). Timed from
    the first journaled segment to the last, so start-up and the wait for the bus's
    heartbeat are not counted; CPU over the same span."""
    bridge.start()
    first: tuple[float, int, float, float] | None = None
    latest = 0
    deadline = time.monotonic() + 120
    while latest < total:
        bridge.check_alive()
        if time.monotonic() > deadline:
            raise TimeoutError(f"catch-up bridge stuck at {latest} of {total}")
        latest = journal_latest(bridge.journal_dir)
        if latest and first is None:
            first = (time.monotonic(), latest, cpu_seconds(bridge.pid), cpu_seconds(server.pid))
        time.sleep(0.005)
    done = time.monotonic()
    assert first is not None
    events = total - first[1]
    span = max(done - first[0], 1e-9)
    return {
        "rate": events / span if events else float("nan"),
        "events_timed": events,
        "bridge_cpu_us_per_event": (cpu_seconds(bridge.pid) - first[2]) / max(events, 1) * 1e6,
        "bus_cpu_us_per_event": (cpu_seconds(server.pid) - first[3]) / max(events, 1) * 1e6,
        "bridge_exit": bridge.stop(),
    }


def t_bus_span(sampler: RunQueueSampler) -> float:
    return sampler.samples[-1][0] - sampler.samples[0][0] if len(sampler.samples) > 1 else 0.0


# -- reading the journal back ---------------------------------------------------------------


def check_journal(journal: Path, warmups: int, events: int) -> dict[str, Any]:
    """Read the whole journal back: sequences 1..warmups+events once and contiguous, no
    gap recorded, and row ``warmups + 1 + n`` is the publisher's event n."""
    from bus.spark.journal import JournalReader

    reader = JournalReader(journal)
    latest = reader.latest_sequence()
    gaps = reader.gaps()
    table = reader.read(0, latest)
    seq = table.column("seq").to_pylist()
    total = warmups + events
    contiguous = seq == list(range(1, total + 1))
    topics = table.column("topic").to_pylist()[warmups:]
    payloads = table.column("payload").to_pylist()[warmups:]
    mismatched = sum(
        1
        for n, (topic, data) in enumerate(zip(topics, payloads, strict=False))
        if data != payload(n) or topic.encode() != TOPICS[n % 16]
    ) + abs(len(payloads) - events)
    timestamps = table.column("timestamp").null_count
    return {
        "latest": latest,
        "rows": table.num_rows,
        "segments": len(reader.segments()),
        "gaps": len(gaps),
        "contiguous": contiguous,
        "content_mismatches": mismatched,
        "null_timestamps": timestamps,
        "complete": contiguous and not gaps and mismatched == 0 and latest == total,
    }


# -- one run ------------------------------------------------------------------------------------


def run_once(
    kind: str,
    events: int,
    root: Path,
    index: int,
    prefixes: tuple[list[str], list[str]],
    wait_idle: float,
    catchup: bool = True,
) -> dict[str, Any]:
    server_wrap, bridge_wrap = prefixes
    wait_for_quiet(wait_idle)
    with Cleanup() as stack:
        server = stack.server(
            BusServer(root / f"{kind}-{index}", stats_interval=STATS_INTERVAL, prefix=server_wrap)
        )
        bridge: BridgeProcess | None = None
        subscriber = None
        warmups = 0
        if kind == "bridge":
            bridge = BridgeProcess(root / f"{kind}-{index}" / "bridge", server.port, bridge_wrap)
            stack.callback(bridge.stop)
            bridge.start()
            # One event through the whole path: the bridge's subscription is live (its
            # first snapshot is done) before the timed publisher starts.
            publish_one(server.collector, WARMUP_TOPIC, payload(0), b"2026-11-21T10:00:00Z")
            warmups = 1
            wait_until(
                lambda: journal_latest(bridge.journal_dir) >= warmups,
                60,
                "the warm-up event in the journal",
                bridge.check_alive,
            )
            consumer_pid = bridge.pid
        else:
            subscriber = stack.worker("subscribe", server.publisher, events)
            subscriber.wait_ready()
            consumer_pid = subscriber.proc.pid
        publisher = stack.worker("publish", server.collector, events)
        publisher.wait_ready()
        total = warmups + events
        sampler = Sampler(server, bridge.journal_dir if bridge else None).start()
        stack.callback(sampler.stop)
        server_pid = server.pid
        cpu_before = {"bus": cpu_seconds(server_pid), "consumer": cpu_seconds(consumer_pid)}
        account = CpuAccount(live=[server_pid, consumer_pid])
        # Is the bus's reactor thread kept off the CPUs (run-queue delay)?
        reactor = RunQueueSampler(server_pid).start()
        stack.callback(reactor.stop)
        publisher.go()
        sent = publisher.result()
        result: dict[str, Any] = {"kind": kind}
        if subscriber is not None:
            received = subscriber.result()
            t_done = received["t_last"]
            result.update(
                lost=received["lost"],
                gaps=received["gaps"],
                consumer_cpu_us_per_event=received["cpu_seconds"] / events * 1e6,
                complete=received["lost"] == 0 and received["gaps"] == 0,
            )
        else:
            assert bridge is not None
            wait_until(
                lambda: sampler.latest(2) >= total,
                120,
                f"journal sequence {total}",
                bridge.check_alive,
                0.01,
            )
            t_done = sampler.first_time(2, total) or time.monotonic()
        cpu = {
            "bus": cpu_seconds(server_pid) - cpu_before["bus"],
            "consumer": cpu_seconds(consumer_pid) - cpu_before["consumer"],
        }
        wait_until(lambda: sampler.latest(1) >= total, 30, f"bus sequence {total}", None, 0.01)
        sampler.stop()
        reactor.stop()
        t_start, t_sent = sent["t_start"], sent["t_flushed"]
        # status.json is written every 0.1 s: when the consumer had the last event first,
        # the bus had it then at the latest.
        t_bus = min(sampler.first_time(1, total) or t_done, t_done)
        result.update(
            rate=events / max(t_done - t_start, 1e-9),
            bus_rate=events / max(t_bus - t_start, 1e-9),
            publisher_rate=sent["send_rate"],
            lag_after_publisher=t_done - t_sent,
            lag_after_bus=t_done - t_bus,
            bus_cpu_us_per_event=cpu["bus"] / events * 1e6,
            publisher_cpu_us_per_event=sent["cpu_seconds"] / events * 1e6,
            bus_reactor=reactor.describe(),
            bus_reactor_waiting=reactor.total_wait() / max(t_bus_span(reactor), 1e-9),
            snapshots_served=server.status().get("snapshots_served"),
            dropped=server.status().get("dropped"),
        )
        if subscriber is None:
            result["consumer_cpu_us_per_event"] = cpu["consumer"] / events * 1e6
            # Mid-run rate: journal from 10% to 90% of the events (segments make it step).
            lo = sampler.first_time(2, warmups + events // 10)
            hi = sampler.first_time(2, warmups + events * 9 // 10)
            result["mid_rate"] = (events * 8 // 10) / (hi - lo) if lo and hi and hi > lo else 0.0
            assert bridge is not None
            result["bridge_exit"] = bridge.stop()  # flushes its buffer, then exits
            result["bridge_warnings"] = bridge.warnings()
            if catchup:
                second = BridgeProcess(root / f"{kind}-{index}" / "catchup", server.port)
                stack.callback(second.stop)
                result["catchup"] = catch_up(server, second, total)
    # Every process of the run is stopped and reaped: their CPU is accounted for.
    result["foreign_cores"] = account.stop()
    if bridge is not None:
        check = check_journal(bridge.journal_dir, warmups, events)
        result["journal"] = check
        if "catchup" in result:
            again = check_journal(bridge.workdir.parent / "catchup" / "journal", warmups, events)
            result["catchup"]["complete"] = again["complete"]
        # twistd re-raises the SIGTERM it handled once shut down: -15 is a clean stop.
        result["complete"] = check["complete"] and result["bridge_exit"] in (0, -15)
    return result


def describe(run: dict[str, Any]) -> str:
    name = "bridge" if run["kind"] == "bridge" else "raw SUB"
    text = (
        f"{name:<7} {fmt_rate(run['rate']):>7} ev/s "
        f"{'journaled' if run['kind'] == 'bridge' else 'received'} "
        f"(bus accepted {fmt_rate(run['bus_rate'])} ev/s, publisher {fmt_rate(run['publisher_rate'])}"
        f" ev/s), end lag {run['lag_after_publisher'] * 1000:.0f} ms after the publisher, "
        f"{run['lag_after_bus'] * 1000:.0f} ms after the bus"
    )
    if run["kind"] == "bridge":
        j = run["journal"]
        if "catchup" in run:
            c = run["catchup"]
            text += (
                f"; catch-up from the bus's log {fmt_rate(c['rate'])} ev/s "
                f"({'complete' if c.get('complete') else 'INCOMPLETE'}, CPU-us/event bridge "
                f"{c['bridge_cpu_us_per_event']:.1f}, bus {c['bus_cpu_us_per_event']:.1f})"
            )
        text += (
            f"; mid-run {fmt_rate(run['mid_rate'])} ev/s; journal {j['rows']} rows in "
            f"{j['segments']} segments, {'complete and contiguous' if j['complete'] else 'INCOMPLETE'}"
            f" (gaps {j['gaps']}, content mismatches {j['content_mismatches']}); bridge exit "
            f"code {run['bridge_exit']}"
        )
    else:
        text += f"; lost {run['lost']}, gaps {run['gaps']}"
    text += (
        f"; CPU-us/event: bus {run['bus_cpu_us_per_event']:.1f}, {name} "
        f"{run['consumer_cpu_us_per_event']:.1f}, publisher {run['publisher_cpu_us_per_event']:.1f}"
        f"; bus reactor thread waiting for a CPU {run['bus_reactor_waiting']:.0%} of the run"
        f"; snapshots served {run['snapshots_served']}; other processes "
        f"{run['foreign_cores']:.2f} cores"
    )
    return text


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--events", type=int, default=200_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--bridge-only", action="store_true", help="skip the baseline")
    parser.add_argument(
        "--no-catchup",
        action="store_true",
        help="skip the catch-up measurement (a second bridge journaling the idle bus's log)",
    )
    parser.add_argument(
        "--bridge-prefix",
        default="",
        help="wrap the bridge command, e.g. "
        "'.venv/bin/py-spy record -o /tmp/bridge.txt --format raw -r 200 --'",
    )
    add_common_arguments(parser)
    args = parser.parse_args()
    terminate_on_sigterm()
    info = machine()
    prefixes = (server_prefix(args.server_prefix), server_prefix(args.bridge_prefix))
    runs: dict[str, list[dict[str, Any]]] = {"baseline": [], "bridge": []}
    with workdir("spark-bridge-bench-", args.keep) as root:
        for index in range(args.repeat):
            kinds = ["bridge"] if args.bridge_only else ["baseline", "bridge"]
            for kind in kinds:
                run = run_once(
                    kind, args.events, root, index, prefixes, args.wait_idle, not args.no_catchup
                )
                runs[kind].append(run)
                print(f"run {index + 1}/{args.repeat} {describe(run)}", flush=True)
                for line in run.get("bridge_warnings", [])[:5]:
                    print(f"    bridge log: {line}", flush=True)

    bridge = runs["bridge"]
    catchups = [r for r in bridge if "catchup" in r]
    rate = median([r["rate"] for r in bridge])
    baseline = median([r["rate"] for r in runs["baseline"]])
    ratio = rate / baseline if runs["baseline"] else float("nan")
    complete = all(r["complete"] for r in bridge)
    verdict = rate >= TARGET_RATE and complete
    summary(
        "spark_bridge",
        info,
        measured=(
            f"bridge journaled {fmt_rate(rate)} events/s (median of {len(bridge)}; first send -> "
            f"journal complete), journal complete and contiguous in "
            f"{sum(r['complete'] for r in bridge)}/{len(bridge)} runs"
        ),
        baseline=(
            f"raw pyzmq SUB {fmt_rate(baseline)} events/s received (median of "
            f"{len(runs['baseline'])}; first send -> last received), lost "
            f"{sum(r['lost'] for r in runs['baseline'])}"
            if runs["baseline"]
            else "skipped (--bridge-only)"
        ),
        ratio=f"{ratio:.2f} (bridge journaled / raw SUB received)",
        target=f">= {fmt_rate(TARGET_RATE)} events/s journaled, complete and contiguous",
        verdict=verdict,
        details=[
            ("events", f"{args.events:,} per run, 6 frames, 100-byte msgpack payload, 16 topics"),
            (
                "bus accepted",
                f"bridge runs {fmt_rate(median([r['bus_rate'] for r in bridge]))} events/s, "
                "baseline runs "
                f"{fmt_rate(median([r['bus_rate'] for r in runs['baseline']]))} events/s "
                f"(status.json every {STATS_INTERVAL}: up to 0.1 s late, capped by the consumer's time)",
            ),
            (
                "mid-run",
                f"journal 10% -> 90%: {fmt_rate(median([r['mid_rate'] for r in bridge]))} "
                "events/s (median)",
            ),
            (
                "end lag",
                "journal complete "
                f"{median([r['lag_after_publisher'] for r in bridge]) * 1000:.0f} ms after the "
                "publisher finished, "
                f"{median([r['lag_after_bus'] for r in bridge]) * 1000:.0f} ms after the bus had "
                "the last event (medians; raw SUB: "
                f"{median([r['lag_after_publisher'] for r in runs['baseline']]) * 1000:.0f} ms "
                "after the publisher)",
            ),
            (
                "CPU-us/event",
                "bridge runs: bus "
                f"{median([r['bus_cpu_us_per_event'] for r in bridge]):.1f}, bridge "
                f"{median([r['consumer_cpu_us_per_event'] for r in bridge]):.1f}, publisher "
                f"{median([r['publisher_cpu_us_per_event'] for r in bridge]):.1f}; baseline: bus "
                f"{median([r['bus_cpu_us_per_event'] for r in runs['baseline']]):.1f}, SUB "
                f"{median([r['consumer_cpu_us_per_event'] for r in runs['baseline']]):.1f}",
            ),
            (
                "catch-up",
                "a second bridge journaling the same events from the idle bus's log "
                "(its first snapshot), no publisher running: "
                + (
                    f"{fmt_rate(median([r['catchup']['rate'] for r in catchups]))} events/s "
                    f"(median), bridge "
                    f"{median([r['catchup']['bridge_cpu_us_per_event'] for r in catchups]):.1f} "
                    "CPU-us/event, complete and contiguous in "
                    f"{sum(bool(r['catchup'].get('complete')) for r in catchups)}/{len(catchups)}"
                    if catchups
                    else "skipped (--no-catchup)"
                ),
            ),
            (
                "bus reactor",
                "share of the run the bus's reactor thread was runnable but waiting for a CPU "
                f"(schedstat): bridge runs "
                f"{median([r['bus_reactor_waiting'] for r in bridge]):.0%}, baseline runs "
                f"{median([r['bus_reactor_waiting'] for r in runs['baseline']]):.0%} (medians)",
            ),
            (
                "heals",
                "snapshots served by the bus per bridge run (1 = the initial one): "
                + ", ".join(str(r["snapshots_served"]) for r in bridge),
            ),
            noise_line(runs["baseline"] + bridge),
        ],
        json_path=args.json,
        record={"runs": runs},
    )
    return 0 if verdict else 1


if __name__ == "__main__":
    sys.exit(main())
