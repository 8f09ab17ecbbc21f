"""eMQP broker restart: from a broker restart to the first job served again.

The broker is ``twistd -n emqp`` with its default options (heartbeat every 3 s, liveness
3) on three ports of 127.0.0.1 chosen free at the start, and a data directory kept for the
whole run: each restart starts a new broker on the same ports with the same data directory,
as an operator or systemd does. One worker with its DEFAULT heartbeat settings stays
connected across the restarts:

* ours: ``emqp-worker --broker ... --slots 1`` (process pool). A broker that does not
  know it answers its next message KBYE, and it INFORMs again at once; after SIGTERM the
  old broker's KBYE makes it start over even before the new broker is up;
* eventmq 0.3.13's real job manager (``tests/emqp_interop/jobmanager.py`` run by
  ``.venv-interop``, one job process): it ignores KBYE and INFORMs again only after
  ``HEARTBEAT_TIMEOUT`` x ``HEARTBEAT_LIVENESS`` (5 s x 3) of silence from the broker.

Each restart stops the broker (``kill -9``, or SIGTERM and waits for it to exit), starts
the new one at once and, as soon as it is ready (its status.json lists its endpoints), a
raw pyzmq DEALER submits one job (``["run", {"path": "operator", "callable": "add",
"args": [2, 3]}]`` with ``reply-requested``) and waits for its result. Measured: the time
to that result from the restart (the new broker's process start) and from the broker being
ready. Before each restart the worker is left for a random 0.5-3.5 s, so that the restarts
fall at random points of its heartbeat period.

Baseline, same run: the time to the first job served by a broker that was never stopped,
from a fresh worker process's start (the job is submitted as the worker starts and waits
in the queue); the restart's cost shows as the ratio of the two.

    python bench/emqp_restart.py [--repeat 3] [--workers ours,eventmq] [--timeout 90]

Targets (docs/emqp.md): ours serves again within one heartbeat interval (3 s) of the
new broker being ready; eventmq's job manager about 15-20 s after the restart.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import zmq
from _common import (
    HOST,
    PYTHON,
    Cleanup,
    CpuAccount,
    TwistdProcess,
    _children,
    _die_with_parent,
    add_common_arguments,
    code_env,
    cpu_latency,
    cpu_seconds,
    emqp_args,
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

from bus.emqp import codec

ROOT = Path(__file__).resolve().parent.parent
EMQP_WORKER = Path(PYTHON).parent / "emqp-worker"
INTEROP_PYTHON = ROOT / ".venv-interop" / "bin" / "python"
JOBMANAGER = ROOT / "tests" / "emqp_interop" / "jobmanager.py"
BODY = b'["run", {"path": "operator", "callable": "add", "args": [2, 3]}]'
HEARTBEAT = 3.0  # the broker's and both workers' default heartbeat interval
TARGET_OURS_S = HEARTBEAT  # from the new broker being ready
TARGET_EVENTMQ_S = 20.0  # from the restart (docs/emqp.md: "about 15-20 s")
LABELS = {"ours": "emqp-worker", "eventmq": "eventmq 0.3.13 job manager"}
STOPS = {"kill -9": signal.SIGKILL, "SIGTERM": signal.SIGTERM}


@dataclass
class Broker(TwistdProcess):
    """One run of ``twistd -n emqp`` on fixed ports with a shared data directory; its log
    in ``workdir`` (one per run)."""

    workdir: Path
    data_dir: Path
    port: int
    prefix: list[str] = field(default_factory=list)
    proc: Any = None
    label = "broker"

    def __post_init__(self) -> None:
        self.log_path = self.workdir / "twistd.log"
        self.stdout_path = self.workdir / "stdout.txt"

    def spawn(self, cpu_latency_us: int | None) -> float:
        """Start it; returns the time (monotonic) just before the process started."""
        status = self.data_dir / "status.json"
        status.unlink(missing_ok=True)  # a killed broker's last word
        self.data_dir.mkdir(parents=True, exist_ok=True)
        argv = self._twistd_argv(emqp_args(self.port, self.data_dir, cpu_latency_us))
        started = time.monotonic()
        self._spawn(argv, "EMQP_")
        return started

    def wait_ready(self, timeout: float = 60.0) -> float:
        """Poll its status.json (every 5 ms) until it lists the endpoints."""
        path = self.data_dir / "status.json"
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with contextlib.suppress(FileNotFoundError, json.JSONDecodeError):
                if json.loads(path.read_text()).get("endpoints"):
                    return time.monotonic()
            self.check_alive()
            time.sleep(0.005)
        raise TimeoutError(f"the broker not ready in {timeout:.0f} s:\n{self.log_tail()}")

    def kill(self, sig: int) -> None:
        assert self.proc is not None
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, sig)
        self.proc.wait(60)

    def endpoint(self, offset: int) -> str:
        return f"tcp://{HOST}:{self.port + offset}"


class WorkerProcess:
    """Our ``emqp-worker`` or eventmq's job manager, in a session (process group) of its
    own: stopped by SIGTERM, then whatever is left of its group is killed."""

    def __init__(self, kind: str, endpoint: str, log_path: Path) -> None:
        if kind == "ours":
            argv = [str(EMQP_WORKER), "--broker", endpoint, "--queues", "10:default",
                    "--slots", "1"]  # fmt: skip
            drop = ("EMQP_WORKER_", "EVENTMQ_")
        else:
            argv = [str(INTEROP_PYTHON), str(JOBMANAGER), endpoint, '[[10, "default"]]', "1"]
            drop = ("EVENTMQ_",)
        env = {k: v for k, v in os.environ.items() if not k.startswith(drop)}
        if kind == "ours":
            env = code_env(env)
        env.update(PYTHONUNBUFFERED="1", EVENTMQ_CONFIG_FILE=os.devnull)
        self.log = open(log_path, "ab")  # noqa: SIM115
        self.proc = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=self.log,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=ROOT,
            start_new_session=True,
            preexec_fn=_die_with_parent,
        )

    def tree(self) -> list[int]:
        """Its process and every descendant (job processes, fork server)."""
        found, pending = [], [self.proc.pid]
        while pending:
            pid = pending.pop()
            found.append(pid)
            pending.extend(_children(pid))
        return found

    def stop(self) -> None:
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                self.proc.send_signal(signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(15)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, signal.SIGKILL)  # what is left of its group
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(5)
        self.log.close()


def submit_and_wait(context: zmq.Context, endpoint: str, timeout: float) -> float | None:
    """One job from a fresh DEALER; the time (monotonic) its result came, None if none in
    ``timeout`` seconds."""
    sock = context.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    try:
        sock.connect(endpoint)
        msgid = codec.new_msgid()
        sock.send_multipart(codec.request("default", BODY, b"reply-requested", msgid))
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not sock.poll(50):
                continue
            frames = sock.recv_multipart()
            if len(frames) == 6 and frames[2] == codec.REPLY and frames[5] == msgid:
                arrived = time.monotonic()
                value = json.loads(frames[4])
                if value != {"value": 5}:
                    raise RuntimeError(f"the job's result is {value}")
                return arrived
        return None
    finally:
        sock.close()


def noise(account: CpuAccount, started_since: list[int], running: set[int]) -> float:
    """Cores other processes kept busy: ``account``'s figure less what the processes in
    ``started_since`` that it did not follow (they started during the run) used."""
    foreign = account.stop()
    extra = 0.0
    for pid in started_since:
        if pid not in running:
            with contextlib.suppress(OSError, IndexError):
                extra += cpu_seconds(pid)
    return max(0.0, foreign - extra / account.wall)


def run_kind(kind: str, root: Path, args: Any, context: zmq.Context) -> dict[str, Any]:
    """Baseline runs, then restarts, for one kind of worker; one broker port set."""
    port = free_ports(3)
    base = root / kind
    data_dir = base / "data"
    runs: dict[str, Any] = {"baseline": [], **{stop: [] for stop in STOPS}}
    incarnation = 0
    prefix = server_prefix(args.server_prefix)

    def new_broker(stack: Cleanup) -> Broker:
        nonlocal incarnation
        incarnation += 1
        broker = Broker(base / f"broker-{incarnation}", data_dir, port, prefix)
        broker.workdir.mkdir(parents=True, exist_ok=True)
        stack.callback(broker.stop)
        return broker

    def new_worker(stack: Cleanup, broker: Broker) -> WorkerProcess:
        worker = WorkerProcess(kind, broker.endpoint(0), base / "worker.log")
        stack.callback(worker.stop)
        return worker

    with Cleanup() as stack:
        broker = new_broker(stack)
        broker.spawn(args.cpu_latency_us)
        broker.wait_ready()
        # -- baseline: a fresh worker, a broker that was never stopped ---------------------
        for index in range(args.repeat):
            wait_for_quiet(args.wait_idle)
            started = time.monotonic()
            worker = new_worker(stack, broker)
            account = CpuAccount(live=[broker.pid, worker.proc.pid])
            served = submit_and_wait(context, broker.endpoint(1), args.timeout)
            run = {"seconds": None if served is None else served - started}
            run["foreign_cores"] = noise(account, worker.tree(), {worker.proc.pid})
            runs["baseline"].append(run)
            print(f"  {kind} baseline {index}: {show(run['seconds'])}", file=sys.stderr)
            worker.stop()
        # -- restarts ----------------------------------------------------------------------
        worker = new_worker(stack, broker)
        if submit_and_wait(context, broker.endpoint(1), args.timeout) is None:
            raise RuntimeError(f"the {kind} worker served nothing in {args.timeout:.0f} s")
        for index in range(args.repeat):
            for name, sig in STOPS.items():
                wait_for_quiet(args.wait_idle)
                time.sleep(random.uniform(0.5, 0.5 + HEARTBEAT + 0.5))
                stopped = time.monotonic()
                broker.kill(sig)
                exited = time.monotonic()
                broker = new_broker(stack)
                started = broker.spawn(args.cpu_latency_us)
                tree = worker.tree()
                account = CpuAccount(live=[broker.pid, *tree])
                ready = broker.wait_ready()
                served = submit_and_wait(context, broker.endpoint(1), args.timeout)
                run = {
                    "stop_s": exited - stopped,
                    "start_to_ready_s": ready - started,
                    "from_start_s": None if served is None else served - started,
                    "from_ready_s": None if served is None else served - ready,
                    "foreign_cores": noise(account, worker.tree(), set(tree)),
                }
                runs[name].append(run)
                print(
                    f"  {kind} {name} {index}: served {show(run['from_start_s'])} after the "
                    f"restart, {show(run['from_ready_s'])} after ready (stop "
                    f"{run['stop_s']:.2f} s, start to ready {run['start_to_ready_s']:.2f} s)",
                    file=sys.stderr,
                )
    return runs


def show(seconds: float | None) -> str:
    return "never (timed out)" if seconds is None else f"{seconds:.2f} s"


def figures(values: list[float | None]) -> tuple[float, str]:
    """Median (infinite when a run timed out) and the runs' range as text."""
    real = [v if v is not None else float("inf") for v in values]
    text = ", ".join(show(v) for v in values)
    return median(real), f"{min(real):.2f}-{max(real):.2f} s" if len(real) > 1 else text


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeat", type=int, default=3, help="runs per combination")
    parser.add_argument(
        "--workers",
        default="ours,eventmq",
        help="comma-separated: ours (emqp-worker), eventmq (its real job manager)",
    )
    parser.add_argument(
        "--timeout", type=float, default=90.0, help="seconds to wait for a job's result"
    )
    add_common_arguments(parser)
    parser.set_defaults(wait_idle=5.0)  # heartbeats, not CPU, decide these times
    args = parser.parse_args()
    kinds = [k.strip() for k in args.workers.split(",") if k.strip()]
    for kind in kinds:
        if kind not in LABELS:
            raise SystemExit(f"unknown worker {kind!r}: ours or eventmq")
    if "ours" in kinds and not EMQP_WORKER.exists():
        raise SystemExit(f"{EMQP_WORKER} is missing (pip install -e . makes it)")
    if "eventmq" in kinds and not INTEROP_PYTHON.exists():
        raise SystemExit(f"{INTEROP_PYTHON} is missing: `make .venv-interop/.installed`")
    terminate_on_sigterm()
    info = machine()
    results: dict[str, Any] = {}
    context = zmq.Context()
    try:
        with workdir("emqp-restart-", args.keep) as root, cpu_latency(args.cpu_latency_us) as held:
            for kind in kinds:
                results[kind] = run_kind(kind, root, args, context)
    finally:
        context.destroy(linger=0)

    measured, baselines, ratios, verdict = [], [], [], True
    for kind in kinds:
        runs = results[kind]
        base, base_range = figures([run["seconds"] for run in runs["baseline"]])
        baselines.append(f"{LABELS[kind]} {base:.2f} s ({base_range})")
        for name in STOPS:
            start, start_range = figures([run["from_start_s"] for run in runs[name]])
            ready, ready_range = figures([run["from_ready_s"] for run in runs[name]])
            measured.append(
                f"{LABELS[kind]} after {name}: {start:.2f} s from the restart ({start_range}), "
                f"{ready:.2f} s from ready ({ready_range})"
            )
            ratios.append(f"{LABELS[kind]} after {name} {start / base:.1f}x")
            worst_ready = max(
                (r["from_ready_s"] if r["from_ready_s"] is not None else float("inf"))
                for r in runs[name]
            )
            worst_start = max(
                (r["from_start_s"] if r["from_start_s"] is not None else float("inf"))
                for r in runs[name]
            )
            if kind == "ours":
                verdict = verdict and worst_ready <= TARGET_OURS_S
            else:
                verdict = verdict and worst_start <= TARGET_EVENTMQ_S
    startup = [
        run["start_to_ready_s"] for kind in kinds for name in STOPS for run in results[kind][name]
    ]
    all_runs = [run for kind in kinds for runs in results[kind].values() for run in runs]
    summary(
        "eMQP broker restart to the first job served",
        info,
        measured=f"median (range) of {args.repeat} runs each: " + "; ".join(measured),
        baseline=(
            "first job served by a broker never stopped, from a fresh worker's process "
            "start: " + "; ".join(baselines)
        ),
        ratio="restart / fresh worker: " + ", ".join(ratios),
        target=(
            f"ours every time within {TARGET_OURS_S:g} s (one heartbeat interval) of the new "
            f"broker being ready; eventmq's job manager within {TARGET_EVENTMQ_S:g} s of the "
            "restart (docs/emqp.md: about 15-20 s)"
        ),
        verdict=verdict,
        details=[
            (
                "broker start",
                f"process start to status.json with endpoints: median "
                f"{median(startup):.2f} s ({min(startup):.2f}-{max(startup):.2f})",
            ),
            (
                "settings",
                "defaults everywhere: heartbeats every 3 s, liveness 3; eventmq's "
                "HEARTBEAT_TIMEOUT 5 s",
            ),
            noise_line(all_runs),
            *held,
        ],
        json_path=args.json,
        record={"runs": results},
    )


if __name__ == "__main__":
    main()
