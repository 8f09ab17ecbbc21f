"""How fast each CPU of the machine ran while a benchmark did: a small fixed probe, timed.

On this shared VM a CPU's speed changes by up to two times within seconds (another guest on
its host core), seen in no counter the guest has (``steal`` in /proc/stat stays at 0): the
same broker costs 17 us of CPU a job in one run and 30 us in the next. A
:class:`PaceSampler` runs a fixed piece of Python (dictionary and bytes work, like a
server's) on each CPU in turn, about 0.5 ms every ``interval`` (0.1 s: about 1 % of each CPU, measured),
and times it in CPU time (a probe that waits for a CPU is not slowed by it). Its figures:
per CPU, the median nanoseconds a probe step took during the run, and the run's slowdown:
that against the machine at full speed (the fastest tenth of every sample the bench took).
Figures of runs with different slowdowns are not comparable; CPU per unit grows with it.
"""

from __future__ import annotations

import os
import threading
import time
from typing import Any

#: Probe steps a sample (about 0.5 ms at full speed on the machines measured).
STEPS = 1_200


def _probe(steps: int) -> None:
    table: dict[bytes, tuple[int, bytes]] = {}
    out: list[bytes] = []
    for i in range(steps):
        key = b"k%d" % (i & 1023)
        table[key] = (i, key)
        out.append(table[key][1] + b"x")
        if len(out) > 64:
            out.clear()


def probe_ns(steps: int = STEPS) -> float:
    """Nanoseconds of CPU time a probe step took, on the CPU this thread runs on now."""
    started = time.thread_time()
    _probe(steps)
    return (time.thread_time() - started) / steps * 1e9


class PaceSampler:
    """Samples each CPU's pace (:func:`probe_ns`) every ``interval`` seconds in a thread
    of its own, pinned to one CPU after the other."""

    def __init__(self, interval: float = 0.1) -> None:
        self.interval = interval
        self.cpus = sorted(os.sched_getaffinity(0))
        self.samples: dict[int, list[float]] = {cpu: [] for cpu in self.cpus}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        # pid 0: this thread alone (Linux sets a thread's affinity, not the process's)
        while not self._stop.is_set():
            for cpu in self.cpus:
                try:
                    os.sched_setaffinity(0, {cpu})
                except OSError:
                    continue
                step = probe_ns()
                self.samples[cpu].append(step)
                _ALL.append(step)
            self._stop.wait(self.interval)

    def start(self) -> PaceSampler:
        self._thread.start()
        return self

    def stop(self) -> PaceSampler:
        self._stop.set()
        self._thread.join(5)
        return self

    def summary(self) -> dict[str, Any]:
        """Per CPU, the median probe step (ns) during the run; the run's ``slowdown``
        (:func:`slowdown`) against :func:`full_pace` (``full_ns``) as it is now."""
        cpus = {
            f"cpu{cpu}": {"median_ns": round(sorted(values)[len(values) // 2])}
            for cpu, values in self.samples.items()
            if values
        }
        summary: dict[str, Any] = {"cpus": cpus, "full_ns": round(full_pace())}
        summary["slowdown"] = round(slowdown(summary), 2)
        return summary


#: Every probe step timed in this process, any CPU: the machine at full speed is the
#: fastest tenth of them.
_ALL: list[float] = []


def full_pace() -> float:
    """The median of the fastest tenth of every sample this process took so far (ns): the
    machine's CPUs at full speed, as well as this run saw them."""
    if not _ALL:
        return float("nan")
    ordered = sorted(_ALL)
    fastest = ordered[: max(1, len(ordered) // 10)]
    return fastest[len(fastest) // 2]


def describe(summary: dict[str, Any]) -> str:
    """One line: each CPU's median probe step and its slowdown against full speed."""
    parts = [f"{name} {c['median_ns']} ns" for name, c in summary["cpus"].items()]
    return (
        f"CPU pace {', '.join(parts)}: {summary['slowdown']:.2f} x full speed "
        f"({summary['full_ns']} ns, the fastest tenth of this bench's samples)"
    )


def slowdown(summary: dict[str, Any]) -> float:
    """A run's slowdown (its CPUs' mean) against :func:`full_pace` as it is now, at the end
    of a bench that saw more of the machine than the run alone."""
    full = full_pace()
    medians = [c["median_ns"] for c in summary["cpus"].values()]
    return sum(medians) / len(medians) / full if medians else float("nan")
