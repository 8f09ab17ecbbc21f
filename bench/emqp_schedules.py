"""eMQP broker: 10,000 interval schedules at 1 s, fired by the broker's own scheduler.

The broker under test is ``twistd -n emqp`` (the broker alone, its default options but for
free ports and a temporary data directory). Four workers in one raw pyzmq process
(``_emqp_peers.py workers ... STAMPS``, 16 READY slots each) answer every REQUEST with a
REPLY and a READY and note when each arrived (``time.time()``) and the number N of its
body ``["tick", N]``.

* Baseline, same run and same broker first: a raw pyzmq client (``_emqp_peers.py
  paced-client``) sends REQUEST N (body ``["tick", N]``, no headers) at ``t0 + N / rate``,
  10,000 a second for the measured period: the same work for the broker and the workers
  without schedules.
* Then 10,000 SCHEDULEs (``codec.schedule``: queue ``default``, interval 1 s, body
  ``["tick", i]``) go to the admin port, spread evenly over ``--add-over`` seconds
  (default 2: the runs' phases are then even within each second; 0: as fast as the broker
  answers, at most 1,000 unanswered), and the broker fires them for the measured period
  (``--seconds``, starting ``--settle`` seconds after the last one was answered; the
  lateness of the runs due before it, while the SCHEDULEs came in, is reported apart).

*Lateness* of a run, measured at the worker: its arrival minus its due time. Schedule i's
k-th run is due at ``created_i + k * interval``, where ``created_i`` is the broker's own
time of accepting it (its clock is ``time.time()`` on this machine): it runs at once
("haste"), and its SCHEDULE answer says ``next_run_in`` 0. ``created`` is read from the
broker's SCHEDULES listing on the admin port (the answers' arrival plus ``next_run_in``
is kept as a cross-check). A run the broker skipped (a schedule overdue by a whole
interval runs once, never in a burst) counts as late by more than an interval. The
broker's own view, ``schedule_lateness_ms`` of STATUS (due time to the moment it fired
the run, over its last 10,000 runs), is polled every second and reported beside it.
For the baseline, request N is due at ``t0 + N / rate``.

Also: runs delivered per second against those due (10,000/s), and the broker process's
CPU (cores, from /proc) and RSS (VmRSS, sampled every 0.2 s) during the measured period.

    python bench/emqp_schedules.py [--schedules 10000] [--interval 1] [--seconds 20]
                                   [--add-over 2] [--settle 2] [--repeat 1]

Target: lateness p99 < 100 ms at the workers.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import threading
import time
from array import array
from pathlib import Path
from typing import Any

import zmq
from _common import (
    HERE,
    Cleanup,
    CpuAccount,
    EmqpBroker,
    Figure,
    RunQueueSampler,
    Worker,
    add_common_arguments,
    cpu_latency,
    cpu_seconds,
    emqp_args,
    fmt_rate,
    machine,
    median,
    noise_line,
    rss_kib,
    server_prefix,
    summary,
    terminate_on_sigterm,
    wait_for_quiet,
    workdir,
)

from bus.emqp import codec
from bus.emqp.schedules import schedule_id

PEERS = HERE / "_emqp_peers.py"
WORKERS = 4
SLOTS = 16
TAIL = 2.0  # seconds after the measured period for the runs due in it to arrive
TARGET_P99_MS = 100.0


class Broker(EmqpBroker):
    """``twistd -n emqp`` alone on free ports of 127.0.0.1, its data under ``workdir``."""

    def start(self, cpu_latency_us: int | None = None) -> Broker:
        self.launch(lambda port: emqp_args(port, self.data_dir, cpu_latency_us))
        return self


class Peer(Worker):
    """A process of ``_emqp_peers.py``; ``command`` sends a line and returns its JSON answer."""

    def __init__(self, role: str, *args: object) -> None:
        super().__init__(role, *args, script=PEERS)

    def command(self, line: str, timeout: float = 60) -> dict[str, Any]:
        assert self.proc.stdin is not None
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()
        return self.result(timeout)

    def poll_result(self, timeout: float) -> dict[str, Any] | None:
        """Its JSON line if it comes within ``timeout`` seconds, else None."""
        try:
            return self.result(timeout)
        except TimeoutError:
            return None


def peer(stack: Cleanup, role: str, *args: object) -> Peer:
    started = Peer(role, *args)
    stack.callback(started.stop)
    return started


def read_stamps(path: Path) -> tuple[array[int], array[float]]:
    data = path.read_bytes()
    count = len(data) // 16
    numbers, arrivals = array("q"), array("d")
    numbers.frombytes(data[: 8 * count])
    arrivals.frombytes(data[8 * count :])
    return numbers, arrivals


class Admin:
    """A raw pyzmq DEALER on the broker's admin port."""

    def __init__(self, context: zmq.Context, endpoint: str) -> None:
        self.sock = context.socket(zmq.DEALER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.setsockopt(zmq.RCVHWM, 0)
        self.sock.setsockopt(zmq.SNDHWM, 0)
        self.sock.connect(endpoint)

    def ask(self, frames: list[bytes], timeout: float = 30.0) -> Any:
        """Send one request, return its answer's JSON (other answers are dropped)."""
        self.sock.send_multipart(frames)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.sock.poll(100):
                answer = self.sock.recv_multipart()
                if len(answer) == 6 and answer[5] == frames[3]:
                    return json.loads(answer[4])
        raise TimeoutError(f"no answer to {frames[2].decode()} in {timeout:.0f} s")

    def status(self) -> dict[str, Any]:
        value: dict[str, Any] = self.ask(codec.message(codec.STATUS))
        return value

    def add_schedules(
        self, count: int, interval: float, spread: float, window: int = 1000
    ) -> dict[str, Any]:
        """SCHEDULE ``["tick", i]`` for i < count, spread over ``spread`` seconds (0: as
        fast as answered, at most ``window`` unanswered); when each was answered and its
        ``next_run_in``."""
        requests = [
            codec.schedule("default", b'["tick", %d]' % i, b"", interval, None)
            for i in range(count)
        ]
        index = {frames[3]: i for i, frames in enumerate(requests)}
        answered_at = [math.nan] * count
        next_run_in = [math.nan] * count
        errors: list[str] = []
        sock = self.sock
        started = time.time()
        deadline = time.monotonic() + 120
        sent = answered = 0
        while answered < count:
            if time.monotonic() > deadline:
                raise TimeoutError(f"{answered} of {count} SCHEDULEs answered in 120 s")
            now = time.time()
            allowed = (
                count if spread <= 0 else min(count, int((now - started) / spread * count) + 1)
            )
            while sent < allowed and sent - answered < window:
                sock.send_multipart(requests[sent])
                sent += 1
            wait = 100 if sent >= allowed else 0
            if spread > 0 and sent < count:
                wait = max(0, min(100, int((started + sent * spread / count - now) * 1000)))
            if not sock.poll(wait):
                continue
            while True:
                try:
                    answer = sock.recv_multipart(zmq.NOBLOCK)
                except zmq.Again:
                    break
                i = index.get(answer[5]) if len(answer) == 6 else None
                if i is None:
                    continue
                answered += 1
                answered_at[i] = time.time()
                value = json.loads(answer[4])
                if "error" in value:
                    errors.append(f"{value['error']}: {value.get('message', '')}")
                else:
                    next_run_in[i] = float(value["value"]["next_run_in"])
        return {
            "started": started,
            "answered_at": answered_at,
            "next_run_in": next_run_in,
            "errors": errors,
            "seconds": time.time() - started,
        }

    def close(self) -> None:
        self.sock.close()


class Watch:
    """The broker's RSS every 0.2 s (its largest) in a thread, and its STATUS lateness,
    polled by :meth:`poll` once a second from the main thread."""

    def __init__(self, pid: int, admin: Admin) -> None:
        self.pid, self.admin = pid, admin
        self.max_rss_kib = rss_kib(pid)
        self.lateness: list[dict[str, float]] = []
        self.status_rtt_ms = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()
        # The first STATUS a second in: each covers the broker's runs since the previous.
        self._next_poll = time.monotonic() + 1.0

    def _sample(self) -> None:
        while not self._stop.wait(0.2):
            try:
                self.max_rss_kib = max(self.max_rss_kib, rss_kib(self.pid))
            except (OSError, RuntimeError):
                return

    def poll(self) -> dict[str, Any] | None:
        """STATUS if a second has passed since the last one."""
        if time.monotonic() < self._next_poll:
            return None
        self._next_poll += 1.0
        asked = time.monotonic()
        status = self.admin.status()
        self.status_rtt_ms = max(self.status_rtt_ms, (time.monotonic() - asked) * 1000)
        if status.get("schedule_lateness_ms"):
            self.lateness.append(status["schedule_lateness_ms"])
        return status

    def until_next_poll(self) -> float:
        return max(0.0, self._next_poll - time.monotonic())

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(2)


def percentiles(values: list[float]) -> dict[str, float]:
    """p50, p99 and max in ms (an infinite value is a run that never came)."""
    if not values:
        return {"p50_ms": math.nan, "p99_ms": math.nan, "max_ms": math.nan}
    ordered = sorted(values)
    return {
        "p50_ms": ordered[len(ordered) // 2] * 1000,
        "p99_ms": ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))] * 1000,
        "max_ms": ordered[-1] * 1000,
    }


def schedule_runs(
    numbers: array[int],
    arrivals: array[float],
    created: list[float],
    interval: float,
    start: float,
    end: float,
) -> dict[str, Any]:
    """Runs due in [start, end): each arrival is schedule n's run k when its due time
    ``created[n] + k * interval`` is the last one before it arrived."""
    seen: set[tuple[int, int]] = set()
    late: list[float] = []
    by_second: dict[int, list[float]] = {}
    duplicates = 0
    count = len(created)
    for number, arrival in zip(numbers, arrivals, strict=True):
        if not 0 <= number < count:
            continue
        base = created[number]
        k = math.floor((arrival - base) / interval + 1e-9)
        due = base + k * interval
        if not start <= due < end:
            continue
        if (number, k) in seen:
            duplicates += 1
            continue
        seen.add((number, k))
        late.append(arrival - due)
        by_second.setdefault(int(due - start), []).append(arrival - due)
    expected = 0
    for base in created:
        first = max(0, math.ceil((start - base) / interval - 1e-9))
        after = math.ceil((end - base) / interval - 1e-9)
        expected += max(0, after - first)
    missed = max(0, expected - len(late))
    result = percentiles(late + [math.inf] * missed)
    result.update(
        expected=expected,
        missed=missed,
        duplicates=duplicates,
        delivered_per_s=len(late) / (end - start),
        expected_per_s=expected / (end - start),
        delivered_max_ms=max(late) * 1000 if late else math.nan,
        p99_ms_by_second=per_second_p99(by_second),
    )
    return result


def per_second_p99(by_second: dict[int, list[float]]) -> list[float]:
    """p99 lateness (ms) of the runs due in each second of the period: where it was late."""
    return [round(percentiles(by_second[s])["p99_ms"], 1) for s in sorted(by_second)]


def baseline_runs(
    numbers: array[int], arrivals: array[float], t0: float, rate: float, total: int
) -> dict[str, Any]:
    """Request N of the paced client is due at ``t0 + N / rate``."""
    seen: set[int] = set()
    late: list[float] = []
    by_second: dict[int, list[float]] = {}
    for number, arrival in zip(numbers, arrivals, strict=True):
        if not 0 <= number < total or number in seen:
            continue
        seen.add(number)
        late.append(arrival - (t0 + number / rate))
        by_second.setdefault(int(number / rate), []).append(late[-1])
    missed = total - len(late)
    result = percentiles(late + [math.inf] * missed)
    result.update(
        expected=total,
        missed=missed,
        delivered_per_s=len(late) / (total / rate),
        expected_per_s=rate,
        delivered_max_ms=max(late) * 1000 if late else math.nan,
        p99_ms_by_second=per_second_p99(by_second),
    )
    return result


def run_once(root: Path, index: int, args: Any, context: zmq.Context) -> dict[str, Any]:
    """One broker: the paced client's period (baseline), then the schedules' period."""
    results: dict[str, Any] = {}
    stamps = root / f"stamps-{index}.bin"
    with Cleanup() as stack:
        broker = Broker(root / f"broker-{index}", server_prefix(args.server_prefix))
        stack.callback(broker.stop)
        broker.start(args.cpu_latency_us)
        pid = broker.pid
        idle_rss = rss_kib(pid)
        team = peer(stack, "workers", broker.endpoint(0), WORKERS, SLOTS, stamps)
        team.wait_ready()
        admin = Admin(context, broker.endpoint(2))
        stack.callback(admin.close)
        rate = args.schedules / args.interval

        # -- baseline: 10,000 REQUESTs a second from a paced client, no schedules ----------
        client = peer(stack, "paced-client", broker.endpoint(1), rate, args.seconds)
        client.wait_ready()
        team.command("DUMP")  # the warm-up's arrival is not measured
        wait_for_quiet(args.wait_idle)
        account = CpuAccount(live=[pid, team.proc.pid])
        watch = Watch(pid, admin)
        stack.callback(watch.stop)
        sampler = RunQueueSampler(pid).start()
        stack.callback(sampler.stop)
        cpu_before, began = cpu_seconds(pid), time.monotonic()
        team_before = cpu_seconds(team.proc.pid)
        client.go()
        outcome = None
        while outcome is None:
            watch.poll()
            outcome = client.poll_result(watch.until_next_poll() + 0.01)
            if time.monotonic() - began > args.seconds + 60:
                raise TimeoutError("the paced client did not finish")
        wall = time.monotonic() - began
        cpu = cpu_seconds(pid) - cpu_before
        team_cpu = cpu_seconds(team.proc.pid) - team_before
        watch.stop()
        sampler.stop()
        foreign = account.stop()
        team.command("DUMP")
        numbers, arrivals = read_stamps(stamps)
        baseline = baseline_runs(numbers, arrivals, outcome["t0"], rate, outcome["sent"])
        baseline.update(
            broker_cores=cpu / wall,
            workers_cores=team_cpu / wall,
            max_rss_mib=watch.max_rss_kib / 1024,
            foreign_cores=foreign,
            run_queue_worst_100ms_ms=sampler.worst_wait() * 1000,
            client=outcome,
        )
        results["baseline"] = baseline
        print(f"  baseline {index}: {describe(baseline)}", file=sys.stderr)

        # -- the schedules -----------------------------------------------------------------
        wait_for_quiet(args.wait_idle)
        rss_before = rss_kib(pid)
        added = admin.add_schedules(args.schedules, args.interval, args.add_over)
        if added["errors"]:
            raise RuntimeError(f"SCHEDULEs refused: {added['errors'][:3]}")
        # The measured period starts --settle seconds after the last SCHEDULE was answered
        # (the runs due until then are reported apart: they met the adding's work).
        time.sleep(args.settle)
        start = time.time()
        end = start + args.seconds
        account = CpuAccount(live=[pid, team.proc.pid])
        watch = Watch(pid, admin)
        stack.callback(watch.stop)
        sampler = RunQueueSampler(pid).start()
        stack.callback(sampler.stop)
        cpu_before, began = cpu_seconds(pid), time.monotonic()
        team_before = cpu_seconds(team.proc.pid)
        status: dict[str, Any] = {}
        while time.time() < end:
            status = watch.poll() or status
            time.sleep(min(watch.until_next_poll(), max(0.0, end - time.time())) + 0.001)
        wall = time.monotonic() - began
        cpu = cpu_seconds(pid) - cpu_before
        team_cpu = cpu_seconds(team.proc.pid) - team_before
        watch.stop()
        sampler.stop()
        foreign = account.stop()
        time.sleep(TAIL)
        status = admin.status()
        team.command("DUMP")
        # When the broker accepted each schedule (asked after the period: building the
        # listing of every schedule is work the measured broker should not do).
        listing = admin.ask(codec.message(codec.SCHEDULES))["value"]
        created_by_id = {entry["id"]: float(entry["created"]) for entry in listing}
        ids = [schedule_id(b'["tick", %d]' % i) for i in range(args.schedules)]
        created = [created_by_id[i] for i in ids]
        # Cross-check: the SCHEDULE answers' arrival + next_run_in, against `created`.
        answer_gap = [
            at + after - base
            for at, after, base in zip(
                added["answered_at"], added["next_run_in"], created, strict=True
            )
        ]
        numbers, arrivals = read_stamps(stamps)
        runs = schedule_runs(numbers, arrivals, created, args.interval, start, end)
        # The runs due while the SCHEDULEs came in and in the settle seconds after.
        adding = schedule_runs(numbers, arrivals, created, args.interval, added["started"], start)
        broker_view = watch.lateness
        runs.update(
            broker_cores=cpu / wall,
            workers_cores=team_cpu / wall,
            max_rss_mib=watch.max_rss_kib / 1024,
            status_rtt_ms=watch.status_rtt_ms,
            run_queue_worst_100ms_ms=sampler.worst_wait() * 1000,
            rss_before_mib=rss_before / 1024,
            idle_rss_mib=idle_rss / 1024,
            foreign_cores=foreign,
            add_seconds=added["seconds"],
            adding_p99_ms=adding["p99_ms"],
            adding_max_ms=adding["max_ms"],
            adding_missed=adding["missed"],
            phase_spread_s=max(created) - min(created),
            answer_minus_created_ms=median(answer_gap) * 1000,
            broker_lateness_p50_ms=median([s["p50"] for s in broker_view]),
            broker_lateness_p99_median_ms=median([s["p99"] for s in broker_view]),
            broker_lateness_p99_ms=max((s["p99"] for s in broker_view), default=math.nan),
            broker_lateness_max_ms=max((s["max"] for s in broker_view), default=math.nan),
            broker_p99_ms_by_poll=[s["p99"] for s in broker_view],
            schedules_count=status.get("schedules_count"),
            counters=status.get("counters"),
        )
        results["schedules"] = runs
        print(f"  schedules {index}: {describe(runs)}", file=sys.stderr)
    return results


def describe(run: dict[str, Any]) -> str:
    text = (
        f"lateness p50 {run['p50_ms']:.1f} ms, p99 {run['p99_ms']:.1f} ms, max "
        f"{run['max_ms']:.1f} ms; {fmt_rate(run['delivered_per_s'])} runs/s of "
        f"{fmt_rate(run['expected_per_s'])}, {run['missed']} missed; broker "
        f"{run['broker_cores']:.2f} cores (workers {run['workers_cores']:.2f}), RSS max "
        f"{run['max_rss_mib']:.0f} MiB; p99 ms of the runs due in each second: "
        f"{' '.join(f'{v:.0f}' for v in run['p99_ms_by_second'])}; its thread "
        f"waited up to {run['run_queue_worst_100ms_ms']:.0f} ms for a CPU within 100 ms"
    )
    if "broker_lateness_p99_ms" in run:
        text += (
            f"; broker's own lateness p50 {run['broker_lateness_p50_ms']:.1f} ms, p99 "
            f"{run['broker_lateness_p99_ms']:.1f} ms (worst second; p99 ms at each STATUS: "
            f"{' '.join(f'{v:.0f}' for v in run['broker_p99_ms_by_poll'])})"
        )
    return text


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--schedules", type=int, default=10_000)
    parser.add_argument("--interval", type=float, default=1.0, help="seconds (at least 1)")
    parser.add_argument("--seconds", type=float, default=20.0, help="measured period")
    parser.add_argument(
        "--add-over",
        type=float,
        default=2.0,
        help="spread the SCHEDULEs evenly over this many seconds (0: as fast as the broker "
        "answers): it sets the runs' phases, even within each interval when this is a "
        "multiple of it (default 2: the broker need not take 10,000 SCHEDULEs in 1 s)",
    )
    parser.add_argument(
        "--settle",
        type=float,
        default=2.0,
        help="seconds between the last SCHEDULE answered and the measured period (the runs "
        "due meanwhile are reported apart)",
    )
    parser.add_argument("--repeat", type=int, default=1)
    add_common_arguments(parser)
    args = parser.parse_args()
    terminate_on_sigterm()
    info = machine()
    runs: list[dict[str, Any]] = []
    context = zmq.Context()
    try:
        with (
            workdir("emqp-schedules-", args.keep) as root,
            cpu_latency(args.cpu_latency_us) as held,
        ):
            for index in range(args.repeat):
                runs.append(run_once(root, index, args, context))
    finally:
        context.destroy(linger=0)

    def med(kind: str, key: str) -> float:
        return median([run[kind][key] for run in runs])

    def spread(kind: str, key: str, digits: int = 1) -> str:
        if len(runs) < 2:
            return ""
        values = [run[kind][key] for run in runs]
        return f" ({min(values):.{digits}f}-{max(values):.{digits}f})"

    p50, p99, worst = (
        med("schedules", "p50_ms"),
        med("schedules", "p99_ms"),
        med("schedules", "max_ms"),
    )
    base_p50, base_p99 = med("baseline", "p50_ms"), med("baseline", "p99_ms")
    cores, base_cores = med("schedules", "broker_cores"), med("baseline", "broker_cores")
    missed = sum(run["schedules"]["missed"] for run in runs)
    duplicates = sum(run["schedules"]["duplicates"] for run in runs)
    verdict = p99 < TARGET_P99_MS
    kinds = [run[kind] for run in runs for kind in ("baseline", "schedules")]
    first = runs[0]["schedules"]
    summary(
        "eMQP broker: 10,000 schedules at 1 s"
        if args.schedules == 10_000 and args.interval == 1
        else f"eMQP broker: {args.schedules:,} schedules every {args.interval:g} s",
        info,
        measured=(
            f"{args.schedules:,} interval schedules every {args.interval:g} s, {WORKERS} "
            f"workers, {args.seconds:g} s: run lateness at the workers p50 {p50:.1f} ms"
            f"{spread('schedules', 'p50_ms')}, p99 {p99:.1f} ms{spread('schedules', 'p99_ms')}, "
            f"max {worst:.1f} ms; {fmt_rate(med('schedules', 'delivered_per_s'))} runs/s "
            f"delivered of {fmt_rate(med('schedules', 'expected_per_s'))} due, {missed} "
            f"missed, {duplicates} twice; broker {cores:.2f} cores"
            f"{spread('schedules', 'broker_cores', 2)}, RSS max "
            f"{med('schedules', 'max_rss_mib'):.0f} MiB (idle at start "
            f"{med('schedules', 'idle_rss_mib'):.0f}, before the SCHEDULEs "
            f"{med('schedules', 'rss_before_mib'):.0f})"
        ),
        baseline=(
            f"the same broker and workers, no schedules, a raw pyzmq client sending "
            f"{fmt_rate(args.schedules / args.interval)} REQUESTs/s on time: lateness "
            f"(due send time to arrival) p50 {base_p50:.1f} ms, p99 {base_p99:.1f} ms; "
            f"{fmt_rate(med('baseline', 'delivered_per_s'))}/s delivered; broker "
            f"{base_cores:.2f} cores{spread('baseline', 'broker_cores', 2)}, RSS max "
            f"{med('baseline', 'max_rss_mib'):.0f} MiB"
        ),
        ratio=(
            f"broker CPU {cores / base_cores:.2f}x the baseline's; lateness p99 "
            f"{p99 / base_p99:.2f}x"
        ),
        target=f"lateness p99 < {TARGET_P99_MS:.0f} ms at the workers (missed runs count as late)",
        verdict=verdict,
        details=[
            (
                "broker's view",
                "STATUS schedule_lateness_ms (due time to the broker firing the run; polled "
                "every second, each time over its last 10,000 runs): p50 "
                f"{med('schedules', 'broker_lateness_p50_ms'):.1f} ms, p99 "
                f"{med('schedules', 'broker_lateness_p99_median_ms'):.1f} ms (median of the "
                f"polls); worst poll p99 {med('schedules', 'broker_lateness_p99_ms'):.1f} ms, "
                f"max {med('schedules', 'broker_lateness_max_ms'):.1f} ms",
            ),
            (
                "cores",
                f"workers {med('schedules', 'workers_cores'):.2f} (baseline "
                f"{med('baseline', 'workers_cores'):.2f}); the broker's thread waited up to "
                f"{max(r['schedules']['run_queue_worst_100ms_ms'] for r in runs):.0f} ms for "
                "a CPU within 100 ms (baseline "
                f"{max(r['baseline']['run_queue_worst_100ms_ms'] for r in runs):.0f} ms)",
            ),
            (
                "adding",
                f"{args.schedules:,} SCHEDULEs answered in {first['add_seconds']:.2f} s "
                f"(--add-over {args.add_over:g}), the broker's acceptance times spanning "
                f"{first['phase_spread_s']:.2f} s; due times from its SCHEDULES listing's "
                f"`created` (each answer's arrival + its next_run_in is "
                f"{first['answer_minus_created_ms']:.1f} ms later, median); the runs due "
                f"while they came in and in the {args.settle:g} s after, before the measured "
                f"period: lateness p99 {first['adding_p99_ms']:.1f} ms, max "
                f"{first['adding_max_ms']:.1f} ms, {first['adding_missed']} missed",
            ),
            noise_line(kinds),
            *held,
        ],
        json_path=args.json,
        record={"runs": runs},
        figures={
            "lateness_p50": Figure(p50, "ms", better="lower"),
            "lateness_p99": Figure(p99, "ms", better="lower"),
            "delivered": Figure(med("schedules", "delivered_per_s"), "runs/s"),
            "broker_cores": Figure(cores, "cores", better="lower"),
            "broker_cpu_vs_baseline": Figure(cores / base_cores, "x", better="lower"),
        },
    )


if __name__ == "__main__":
    main()
