"""CPU per event removed by each retention mode of the Event BUS log, and the longest single
retention step (how long a step holds the thread that runs it: the reactor's, in the server).

In one process, the code under test's own log and retention pass (``EventStore``,
``Retention.steps``: whatever ``bus`` is, so that bench/ab.py runs it against another
revision). For each mode:

* ``count``: a log of ``--held`` events (200k); each round appends ``--removed`` more (50k),
  in commits of ``--batch`` (50: a collector's group commit at a few thousand events a
  second), then runs one pass of ``Retention(max_count=held)``;
* ``age``: the same events, each round's received 100 s after the last one's; the pass's
  cutoff (``max_age``) removes the oldest round's;
* ``latest``: ``--topics`` topics (20k) hold one event each; each round appends
  ``--removed`` events over the same topics, in turn (``--random-topics``: drawn at random,
  so that what they supersede lies all over the log); a pass of
  ``Retention(latest_per_topic=True)`` (with the index on (topic, seq) that a revision's
  server makes for it, if it does).

The log is filled, closed and opened again first, as a server start would, and the first pass
after the open is reported apart (it counts the log, or compacts the whole of it, a step at a
time). Each pass's steps are timed one by one: wall time, this thread's CPU time, and how long
the thread waited for a CPU meanwhile (/proc/thread-self/schedstat: on a shared machine the
wall time of a step includes other processes' turns). WAL checkpoints run as the server's
worker thread runs them, once a second: during the appends after every ``--checkpoint-every``
events (3,000: a second at the soak's rate; they count in storing's cost), between two steps
of a pass once a second, and after each pass (they count in the cost of removal, not in a
step). Without them the appends of a round in commits of two events grow the WAL to ~130 MiB,
and the first commit after the WAL starts over cuts the file back to its limit
(``journal_size_limit``): 7-20 ms of the kernel's CPU in the pass's first step, where the
server's WAL, checkpointed every second, has far less to cut. The step with the most CPU says
how much of it was the kernel's.

Baseline, same run, same log: what storing the events cost (the appends' CPU per event,
with their own checkpoint). Targets (issue 46): removing an event costs <= 2 us of CPU, and
no step holds the thread longer than 5 ms (its wall time less its wait for a CPU; both are
reported, with its CPU time). Also: the database file's size (pages, free
pages), which must stop growing once retention frees as much as is stored.

Two witnesses tell a long step's own work from the process or the machine: the time the cyclic
garbage collector ran inside the steps (``gc.callbacks``), and a fixed bit of plain Python timed
before each step (the machine's speed then: on a shared virtual machine the same work sometimes
takes ten times as long for milliseconds at a time, and counts as the thread's CPU).

    python bench/eventbus_retention.py [--modes count,age,latest] [--held 200000]
        [--removed 50000] [--rounds 3] [--topics 20000] [--batch 50] [--checkpoint-every 3000]
        [--random-topics]
"""

from __future__ import annotations

import argparse
import gc
import inspect
import os
import resource
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from _common import (
    CpuAccount,
    Figure,
    machine,
    summary,
    temporary_directory,
    terminate_on_sigterm,
    wait_for_quiet,
)
from _workers import _uuid_format, payload

MODES = ("count", "age", "latest")
TARGET_US_PER_REMOVED = 2.0
TARGET_STEP_MS = 5.0
#: Seconds between two rounds' receipt times (age mode).
ROUND_GAP = 100.0
#: Seconds between two WAL checkpoints during a pass (the server's, on its worker thread).
CHECKPOINT_INTERVAL = 1.0


def waited_for_cpu() -> float:
    """Seconds this thread has waited for a CPU while runnable, so far."""
    try:
        with open("/proc/thread-self/schedstat") as stat:
            return int(stat.read().split()[1]) / 1e9
    except (OSError, IndexError, ValueError):
        return 0.0


class Events:
    """Event fields as the collector hands them to the log: 100-byte msgpack payloads,
    a UUID each; topics from ``topic(n)``."""

    def __init__(self, topic: Callable[[int], bytes]) -> None:
        self.topic = topic
        self.uuid_format = _uuid_format()
        self.next = 0

    def batch(self, count: int) -> list[tuple[bytes, bytes, bytes, bytes, bytes]]:
        first, self.next = self.next, self.next + count
        return [
            (
                self.topic(n),
                b"bench-producer",
                b"2026-11-21T10:00:00.123Z",
                self.uuid_format % n,
                payload(n),
            )
            for n in range(first, first + count)
        ]


def appended(
    store: Any,
    events: Events,
    count: int,
    batch: int,
    received: float,
    checkpoint_every: int = 0,
) -> tuple[float, float]:
    """Append ``count`` events in commits of ``batch``, with a WAL checkpoint after every
    ``checkpoint_every`` events (0: none) as the server's once a second; the CPU seconds the
    appends took (building the fields is not counted) and those of the checkpoints."""
    cpu = checkpoints = 0.0
    since = 0
    for start in range(0, count, batch):
        fields = events.batch(min(batch, count - start))
        began = time.thread_time()
        store.append_fields(fields, received)
        cpu += time.thread_time() - began
        since += len(fields)
        if checkpoint_every and since >= checkpoint_every:
            checkpoints += checkpointed(store)
            since = 0
    return cpu, checkpoints


def checkpointed(store: Any) -> float:
    """CPU seconds of one WAL checkpoint (in this thread; the server runs it on its own)."""
    began = time.thread_time()
    store.checkpoint()
    return time.thread_time() - began


class CollectorTime:
    """Time this process spent in the cyclic garbage collector (``gc.callbacks``): in all, in
    full (generation 2) collections, and how many of those ran. A step's share of it says
    whether a long step was the collector's walk of the heap rather than the step's work."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self.full_seconds = 0.0
        self.full = 0
        self._began = 0.0
        gc.callbacks.append(self._observe)

    def _observe(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._began = time.perf_counter()
            return
        took = time.perf_counter() - self._began
        self.seconds += took
        if info["generation"] == 2:
            self.full_seconds += took
            self.full += 1

    def reading(self) -> tuple[float, float, int]:
        return self.seconds, self.full_seconds, self.full


COLLECTOR = CollectorTime()


def fixed_work() -> float:
    """Seconds of this thread's CPU a fixed bit of plain Python takes now (~60 us on this
    machine): timed before each step, it says whether a long step ran while the machine was
    slow for everyone (the same work taking several times as long), not because of its own."""
    began = time.thread_time()
    total = 0
    for n in range(1000):
        total += n * n % 7
    return time.thread_time() - began


def system_time() -> float:
    """Seconds of this thread's CPU time spent in the kernel, so far."""
    return resource.getrusage(resource.RUSAGE_THREAD).ru_stime


def timed_pass(
    passing: Iterator[int], checkpoint: Callable[[], float] | None = None
) -> dict[str, Any]:
    """Run a retention pass step by step: what each step removed, its wall time, its CPU
    time and how long it waited for a CPU. The last call, which finds the pass over, is a
    step too (a reactor turn of its own in the server). With ``checkpoint``, a WAL
    checkpoint runs between two steps once a second (the server's worker thread, on its
    timer); their CPU is returned apart (``checkpoint_cpu``), not counted in any step."""
    steps: list[tuple[int, float, float, float]] = []
    kernel: list[float] = []
    #: Per step: the collector's seconds in it, of them full collections', how many full ones.
    collected: list[tuple[float, float, int]] = []
    #: Per step: the fixed work's time just before it.
    speed: list[float] = []
    checkpoint_cpu = 0.0
    due = time.perf_counter() + CHECKPOINT_INTERVAL
    removed: int | None = 0
    while removed is not None:
        if checkpoint is not None and time.perf_counter() >= due:
            checkpoint_cpu += checkpoint()
            due = time.perf_counter() + CHECKPOINT_INTERVAL
        speed.append(fixed_work())
        waited, system = waited_for_cpu(), system_time()
        gc_seconds, gc_full_seconds, gc_full = COLLECTOR.reading()
        cpu, wall = time.thread_time(), time.perf_counter()
        removed = next(passing, None)
        wall, cpu = time.perf_counter() - wall, time.thread_time() - cpu
        steps.append((removed or 0, wall, cpu, waited_for_cpu() - waited))
        kernel.append(system_time() - system)
        after = COLLECTOR.reading()
        collected.append((after[0] - gc_seconds, after[1] - gc_full_seconds, after[2] - gc_full))
    longest = max(steps, key=lambda s: s[1])
    held_most = max(range(len(steps)), key=lambda i: steps[i][1] - steps[i][3])
    most = max(range(len(steps)), key=lambda i: steps[i][2])
    walls = sorted(s[1] for s in steps)
    return {
        "removed": sum(s[0] for s in steps),
        "steps": len(steps),
        "cpu": sum(s[2] for s in steps),
        "wall": sum(s[1] for s in steps),
        "longest_wall": longest[1],
        "longest_cpu": longest[2],
        "longest_waited": longest[3],
        "longest_cpu_any": steps[most][2],
        # Of the step with the most CPU: its CPU in the kernel (a WAL file cut back is there).
        "longest_cpu_system": kernel[most],
        "longest_cpu_index": most,
        "checkpoint_cpu_during": checkpoint_cpu,
        # What the step itself held the thread for: its wall time but the other processes'
        # turns on the CPU meanwhile.
        "longest_held": max(s[1] - s[3] for s in steps),
        # Of the step that held the thread longest: the collector's time in it.
        "longest_held_gc": collected[held_most][0],
        "longest_held_index": held_most,
        "gc_in_steps": sum(c[0] for c in collected),
        "gc_full_in_steps": sum(c[2] for c in collected),
        "gc_full_seconds_in_steps": sum(c[1] for c in collected),
        "gc_longest_in_a_step": max(c[0] for c in collected),
        # The fixed work's time before the step that held the thread longest, and its median.
        "longest_held_fixed_work": speed[held_most],
        "fixed_work_median": statistics.median(speed),
        "held_over_target": sum(1 for s in steps if s[1] - s[3] > TARGET_STEP_MS / 1e3),
        "p99_wall": walls[min(len(walls) - 1, int(0.99 * len(walls)))],
    }


def file_pages(store: Any) -> tuple[int, int]:
    """(pages in the database file, of them free)."""
    db = store._db
    return int(db.execute("PRAGMA page_count").fetchone()[0]), int(
        db.execute("PRAGMA freelist_count").fetchone()[0]
    )


def run_mode(mode: str, args: argparse.Namespace, root: Path) -> dict[str, Any]:
    from bus.eventbus.store import EventStore, Retention

    directory = root / mode
    # As each revision's server opens its log: one that compacts through an index on
    # (topic, seq) makes it for latest-per-topic.
    indexed = "topic_index" in inspect.signature(EventStore).parameters
    options = {"topic_index": True} if indexed and mode == "latest" else {}
    if mode == "latest":
        topics = args.topics

        def topic(n: int) -> bytes:
            if args.random_topics and n >= topics:  # a multiplicative hash: all over
                return b"/bench/%06d/" % ((n * 2654435761 >> 8) % topics)
            return b"/bench/%06d/" % (n % topics)

        events = Events(topic)
        initial = args.topics + args.removed  # the first pass compacts the whole log
    else:
        events = Events(lambda n: b"/bench/topic-%02d/" % (n % 16))
        groups = -(-args.held // args.removed)
        initial = (groups + 1) * args.removed  # the first pass removes one round's worth
    rounds_of = args.removed

    def retention() -> Any:
        if mode == "count":
            return Retention(max_count=args.held)
        if mode == "age":
            return Retention(max_age=groups * ROUND_GAP - ROUND_GAP / 2)
        return Retention(latest_per_topic=True)

    store = EventStore(directory, **options)
    group = 0
    for start in range(0, initial, rounds_of):
        appended(store, events, min(rounds_of, initial - start), 1000, 1000.0 + group * ROUND_GAP)
        group += 1
    store.close()
    store = EventStore(directory, **options)  # as a server start opens it

    def checkpoint() -> float:
        return checkpointed(store)

    rounds: list[dict[str, Any]] = []
    try:
        now = 1000.0 + (group - 1) * ROUND_GAP
        first = timed_pass(retention().steps(lambda: store, now), checkpoint)
        first["checkpoint_cpu"] = first["checkpoint_cpu_during"] + checkpointed(store)
        pages_after_first = file_pages(store)
        wait_for_quiet(args.wait_idle)
        account = CpuAccount()
        for _ in range(args.rounds):
            received = 1000.0 + group * ROUND_GAP
            group += 1
            append_cpu, append_checkpoint = appended(
                store, events, rounds_of, args.batch, received, args.checkpoint_every
            )
            append_checkpoint += checkpointed(store)
            measured = timed_pass(retention().steps(lambda: store, received), checkpoint)
            measured["checkpoint_cpu"] = measured["checkpoint_cpu_during"] + checkpointed(store)
            measured["append_cpu"] = append_cpu
            measured["append_checkpoint_cpu"] = append_checkpoint
            measured["appended"] = rounds_of
            rounds.append(measured)
        noise = account.stop()
        held = store.count()
        pages = file_pages(store)
    finally:
        store.close()
    removed = sum(r["removed"] for r in rounds)
    appended_total = sum(r["appended"] for r in rounds)
    per_removed = [(r["cpu"] + r["checkpoint_cpu"]) / max(r["removed"], 1) * 1e6 for r in rounds]
    return {
        "mode": mode,
        "first_pass": first,
        "rounds": rounds,
        "removed": removed,
        "held": held,
        "noise": noise,
        "us_per_removed": statistics.median(per_removed),
        "us_per_removed_runs": per_removed,
        "delete_us_per_removed": sum(r["cpu"] for r in rounds) / max(removed, 1) * 1e6,
        "checkpoint_us_per_removed": sum(r["checkpoint_cpu"] for r in rounds)
        / max(removed, 1)
        * 1e6,
        "append_us_per_event": sum(r["append_cpu"] + r["append_checkpoint_cpu"] for r in rounds)
        / appended_total
        * 1e6,
        "longest_step_ms": max(r["longest_wall"] for r in rounds) * 1e3,
        "longest_held_ms": max(r["longest_held"] for r in rounds) * 1e3,
        "longest_held_gc_ms": max(rounds, key=lambda r: r["longest_held"])["longest_held_gc"] * 1e3,
        "gc_in_steps_ms": sum(r["gc_in_steps"] for r in rounds) * 1e3,
        "gc_full_in_steps": sum(r["gc_full_in_steps"] for r in rounds),
        "gc_longest_in_a_step_ms": max(r["gc_longest_in_a_step"] for r in rounds) * 1e3,
        "longest_held_fixed_work_us": max(rounds, key=lambda r: r["longest_held"])[
            "longest_held_fixed_work"
        ]
        * 1e6,
        "fixed_work_median_us": statistics.median(r["fixed_work_median"] for r in rounds) * 1e6,
        "longest_step": max(rounds, key=lambda r: r["longest_wall"]),
        "longest_step_cpu_ms": max(r["longest_cpu_any"] for r in rounds) * 1e3,
        "p99_step_ms": max(r["p99_wall"] for r in rounds) * 1e3,
        "steps": sum(r["steps"] for r in rounds),
        "held_over_target": sum(r["held_over_target"] for r in rounds),
        "pages_after_first": pages_after_first,
        "pages": pages,
    }


def describe(result: dict[str, Any]) -> str:
    first = result["first_pass"]
    longest = result["longest_step"]
    most = max(result["rounds"], key=lambda r: r["longest_cpu_any"])
    return (
        f"{result['removed']:,} removed in {result['steps']} steps: "
        f"{result['us_per_removed']:.2f} us CPU per event removed "
        f"(delete {result['delete_us_per_removed']:.2f} + checkpoint "
        f"{result['checkpoint_us_per_removed']:.2f}; rounds "
        + ", ".join(f"{v:.2f}" for v in result["us_per_removed_runs"])
        + f"); longest step held the thread {result['longest_held_ms']:.2f} ms (wall less "
        f"its wait for a CPU; {result['held_over_target']} of {result['steps']} steps over "
        f"{TARGET_STEP_MS:g} ms); longest wall {result['longest_step_ms']:.2f} ms "
        f"({longest['longest_cpu'] * 1e3:.2f} ms CPU, {longest['longest_waited'] * 1e3:.2f} ms "
        f"waiting for a CPU), longest CPU {result['longest_step_cpu_ms']:.2f} ms (step "
        f"{most['longest_cpu_index']}, {most['longest_cpu_system'] * 1e3:.2f} ms of it in the "
        f"kernel), "
        f"p99 wall {result['p99_step_ms']:.2f} ms; the garbage collector: "
        f"{result['longest_held_gc_ms']:.2f} ms of the longest held step, "
        f"{result['gc_in_steps_ms']:.1f} ms in all steps ({result['gc_full_in_steps']} full "
        f"collections), at most {result['gc_longest_in_a_step_ms']:.2f} ms in one; the machine's "
        f"speed: a fixed bit of Python took {result['longest_held_fixed_work_us']:.0f} us before "
        f"the longest held step ({result['fixed_work_median_us']:.0f} us median); "
        f"first pass after the open: "
        f"{first['removed']:,} removed in {first['steps']} steps, {first['wall']:.2f} s, "
        f"{first['cpu']:.2f} s CPU, longest held {first['longest_held'] * 1e3:.2f} ms "
        f"({first['longest_held_gc'] * 1e3:.2f} ms of it the collector's; "
        f"{first['gc_full_in_steps']} full collections in its steps, "
        f"{first['gc_longest_in_a_step'] * 1e3:.2f} ms at most in one; the fixed work "
        f"{first['longest_held_fixed_work'] * 1e6:.0f} us before it); "
        f"held {result['held']:,}; file "
        f"{result['pages_after_first'][0]:,} pages ({result['pages_after_first'][1]:,} free) "
        f"after the first pass, {result['pages'][0]:,} ({result['pages'][1]:,} free) after "
        f"the rounds"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--modes", default=",".join(MODES))
    parser.add_argument("--held", type=int, default=200_000, help="count, age: events kept")
    parser.add_argument("--removed", type=int, default=50_000, help="events removed per round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--topics", type=int, default=20_000, help="latest: topics held")
    parser.add_argument("--batch", type=int, default=50, help="events per append commit")
    parser.add_argument(
        "--checkpoint-every",
        type=int,
        default=3000,
        help="a WAL checkpoint after this many events appended (the server's once a second "
        "at 3,000 events/s; 0: only after a round's appends)",
    )
    parser.add_argument(
        "--random-topics",
        action="store_true",
        help="latest: each round's events go to topics drawn at random (default: in turn)",
    )
    parser.add_argument("--json", default=None)
    parser.add_argument("--wait-idle", type=float, default=30.0)
    args = parser.parse_args()
    modes = [m for m in args.modes.split(",") if m]
    if not modes or any(m not in MODES for m in modes):
        parser.error(f"--modes: some of {', '.join(MODES)}")
    terminate_on_sigterm()
    info = machine()
    results: dict[str, dict[str, Any]] = {}
    with temporary_directory("bench-retention-") as root:
        for mode in modes:
            wait_for_quiet(args.wait_idle)
            print(f"{mode}: filling, then {args.rounds} rounds ...", file=sys.stderr, flush=True)
            results[mode] = run_mode(mode, args, root)
            print(f"  {describe(results[mode])}", file=sys.stderr, flush=True)
    figures: dict[str, Figure] = {}
    details: list[tuple[str, str]] = []
    passed = True
    for mode, result in results.items():
        ratio = result["us_per_removed"] / result["append_us_per_event"]
        figures[f"{mode}_us_per_removed"] = Figure(result["us_per_removed"], "us", "lower")
        figures[f"{mode}_longest_held_ms"] = Figure(result["longest_held_ms"], "ms", "lower")
        figures[f"{mode}_first_pass_longest_held_ms"] = Figure(
            result["first_pass"]["longest_held"] * 1e3, "ms", "lower"
        )
        figures[f"{mode}_longest_step_cpu_ms"] = Figure(
            result["longest_step_cpu_ms"], "ms", "lower"
        )
        figures[f"{mode}_removed_per_stored"] = Figure(ratio, "x", "lower")
        ok = (
            result["us_per_removed"] <= TARGET_US_PER_REMOVED
            and result["longest_held_ms"] <= TARGET_STEP_MS
        )
        passed = passed and ok
        details.append((mode, f"{describe(result)} -> {'PASS' if ok else 'MISS'}"))
    details.append(
        (
            "noise",
            "other processes kept "
            + ", ".join(f"{m} {r['noise']:.2f}" for m, r in results.items())
            + " cores busy during the rounds",
        )
    )
    details.append(
        ("process", f"one process (pid {os.getpid()}): every figure is this thread's CPU")
    )
    summary(
        "Event BUS retention: CPU per event removed, longest step",
        info,
        "; ".join(
            f"{m}: {r['us_per_removed']:.2f} us/removed, longest step held "
            f"{r['longest_held_ms']:.2f} ms"
            for m, r in results.items()
        ),
        "storing (same run, same log): "
        + "; ".join(f"{m}: {r['append_us_per_event']:.2f} us/event" for m, r in results.items()),
        "removing / storing: "
        + "; ".join(
            f"{m}: {r['us_per_removed'] / r['append_us_per_event']:.2f}" for m, r in results.items()
        ),
        f"<= {TARGET_US_PER_REMOVED} us CPU per event removed, no step holding the thread "
        f"> {TARGET_STEP_MS} ms",
        passed,
        details,
        json_path=args.json,
        record={"results": results, "args": vars(args)},
        figures=figures,
    )
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())
