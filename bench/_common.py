"""Shared helpers for the Event BUS benchmarks (not a benchmark itself).

Everything here runs on 127.0.0.1 only. Every process a benchmark starts (the twistd
server, the raw pyzmq workers of ``_workers.py``) is started through this module, is
asked to die with its parent (``PR_SET_PDEATHSIG``), and is terminated by its id when
the benchmark ends; every temporary directory is removed.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import json
import os
import platform
import queue
import random
import re
import shlex
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
WORKERS = HERE / "_workers.py"
PYTHON = sys.executable
HOST = "127.0.0.1"
#: The code under test: this checkout, or the tree of another revision that bench/ab.py
#: names in BENCH_CODE. It comes first on the path of this process (benches that run the
#: code in-process) and of every server started here; the load generators (raw pyzmq
#: workers) stay the same for both sides of an A/B.
CODE = Path(os.environ.get("BENCH_CODE") or HERE.parent).resolve()
if sys.path[:1] != [str(CODE)]:
    sys.path.insert(0, str(CODE))


# -- process hygiene -------------------------------------------------------------------


def _die_with_parent() -> None:
    """Runs in the child before exec: SIGTERM it if the benchmark process dies."""
    with contextlib.suppress(Exception):
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def terminate_on_sigterm() -> None:
    """Turn SIGTERM/SIGHUP into SystemExit so ``finally`` blocks clean up."""

    def handler(signum: int, frame: Any) -> None:
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, handler)
    signal.signal(signal.SIGHUP, handler)


def stop_process(proc: subprocess.Popen[Any], timeout: float = 20.0) -> int | None:
    """SIGTERM one process we started (by its id), then SIGKILL it if it lingers."""
    if proc.poll() is not None:
        return proc.returncode
    with contextlib.suppress(ProcessLookupError):
        proc.send_signal(signal.SIGTERM)
    try:
        return proc.wait(timeout)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        return proc.wait(5)


@contextlib.contextmanager
def temporary_directory(prefix: str) -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix=prefix))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


# -- ports -------------------------------------------------------------------------------


def _free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        try:
            probe.bind((HOST, port))
        except OSError:
            return False
    return True


def free_ports(count: int = 3) -> int:
    """A base port P such that P .. P+count-1 are free on 127.0.0.1."""
    rng = random.Random()
    for _ in range(200):
        base = rng.randrange(20000, 60000 - count)
        if all(_free(base + i) for i in range(count)):
            return base
    raise RuntimeError("no free port range found")


# -- /proc -------------------------------------------------------------------------------


def rss_kib(pid: int) -> int:
    """VmRSS of a process in KiB."""
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise RuntimeError(f"no VmRSS for {pid}")


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process so far."""
    return _stat_cpu_seconds(f"/proc/{pid}/stat")


def thread_cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process's main thread (its id is the process's) so far."""
    return _stat_cpu_seconds(f"/proc/{pid}/task/{pid}/stat")


def _stat_cpu_seconds(path: str) -> float:
    """utime + stime of a ``stat`` file of /proc (a process's or a thread's), in seconds."""
    with open(path) as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    ticks = os.sysconf("SC_CLK_TCK")
    return (int(fields[11]) + int(fields[12])) / ticks


def cpu_of(pids: Sequence[int]) -> float:
    """CPU seconds of these processes so far (those gone count nothing)."""
    total = 0.0
    for pid in pids:
        with contextlib.suppress(OSError, IndexError):
            total += cpu_seconds(pid)
    return total


def machine_busy_seconds() -> float:
    """CPU seconds spent busy on all cores since boot (from /proc/stat)."""
    with open("/proc/stat") as stat:
        fields = [int(x) for x in stat.readline().split()[1:]]
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)
    return (sum(fields[:8]) - idle) / os.sysconf("SC_CLK_TCK")


def _own_seconds() -> float:
    """CPU of this process plus its reaped children (everything a run started)."""
    import resource

    total = 0.0
    for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN):
        usage = resource.getrusage(who)
        total += usage.ru_utime + usage.ru_stime
    return total


class CpuAccount:
    """How busy the machine was with *other* work while a run went on: busy CPU from
    /proc/stat minus what this benchmark used (itself, its reaped children, and the
    still-running processes listed in ``live``). Benchmarks on a shared 2-core machine
    are only comparable when this is near 0."""

    def __init__(self, live: Sequence[int] = ()) -> None:
        self._live = {pid: _cpu_or_none(pid) for pid in live}
        self._busy = machine_busy_seconds()
        self._own = _own_seconds()
        self._wall = time.monotonic()
        self.foreign_cores = 0.0
        self.wall = 0.0

    def stop(self) -> float:
        self.wall = max(time.monotonic() - self._wall, 1e-9)
        busy = machine_busy_seconds() - self._busy
        own = _own_seconds() - self._own
        for pid, before in self._live.items():
            after = _cpu_or_none(pid)
            if before is not None and after is not None:
                own += after - before  # still running: not in RUSAGE_CHILDREN yet
        self.foreign_cores = max(busy - own, 0.0) / self.wall
        return self.foreign_cores


class RunQueueSampler:
    """Samples how long one thread waited for a CPU while runnable (the run-queue delay
    in /proc/PID/task/TID/schedstat) every ``interval`` seconds, in a background thread.

    A reactor thread that is runnable but not running is late for its timers through no
    fault of its own code: on a shared machine this separates "the server did too much
    in one turn" from "the server was not given a CPU"."""

    def __init__(self, pid: int, tid: int | None = None, interval: float = 0.01) -> None:
        self.path = f"/proc/{pid}/task/{tid or pid}/schedstat"
        self.interval = interval
        self.samples: list[tuple[float, float, float]] = []  # (time, on-CPU s, waiting s)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _read(self) -> tuple[float, float] | None:
        try:
            with open(self.path) as stat:
                running, waiting, _ = stat.read().split()
        except (OSError, ValueError):
            return None
        return int(running) / 1e9, int(waiting) / 1e9

    def _run(self) -> None:
        while not self._stop.is_set():
            value = self._read()
            if value is not None:
                self.samples.append((time.monotonic(), *value))
            self._stop.wait(self.interval)

    def start(self) -> RunQueueSampler:
        self._thread.start()
        return self

    def stop(self) -> RunQueueSampler:
        self._stop.set()
        self._thread.join(5)
        return self

    def total_wait(self) -> float:
        if len(self.samples) < 2:
            return 0.0
        return self.samples[-1][2] - self.samples[0][2]

    def worst_wait(self, window: float = 0.1) -> float:
        """The most run-queue delay accumulated within any ``window`` seconds."""
        worst = 0.0
        start = 0
        for end in range(len(self.samples)):
            while self.samples[end][0] - self.samples[start][0] > window:
                start += 1
            worst = max(worst, self.samples[end][2] - self.samples[start][2])
        return worst

    def describe(self) -> str:
        if len(self.samples) < 2:
            return "no schedstat samples"
        span = self.samples[-1][0] - self.samples[0][0]
        on_cpu = self.samples[-1][1] - self.samples[0][1]
        return (
            f"reactor thread on a CPU {on_cpu / span:.0%} of {span:.1f} s, waiting for one "
            f"{self.total_wait() * 1000:.0f} ms in total ({self.total_wait() / span:.0%}), "
            f"at most {self.worst_wait() * 1000:.0f} ms within any 100 ms"
        )


def _cpu_or_none(pid: int) -> float | None:
    try:
        return cpu_seconds(pid)
    except (OSError, IndexError):
        return None


def background_load(seconds: float = 1.0) -> float:
    """Cores kept busy by other processes while this benchmark does nothing."""
    account = CpuAccount()
    time.sleep(seconds)
    return account.stop()


@contextlib.contextmanager
def cpu_load(processes: int) -> Iterator[None]:
    """``processes`` busy loops (one process each) for the block: the busy machine, since a
    real server is rarely alone on its own. Runs under it count them as noise."""
    burners = [
        subprocess.Popen(
            [PYTHON, "-c", "while True: pass"],
            stdin=subprocess.DEVNULL,
            preexec_fn=_die_with_parent,
        )
        for _ in range(processes)
    ]
    try:
        yield
    finally:
        for burner in burners:
            stop_process(burner, timeout=5)


def wait_for_quiet(limit: float, threshold: float = 0.3) -> float:
    """Wait up to ``limit`` seconds for other processes to use less than ``threshold``
    cores (this machine is shared); return the background load last seen."""
    deadline = time.monotonic() + limit
    load = background_load(0.5)
    while load > threshold and time.monotonic() < deadline:
        load = background_load(0.5)
    return load


def _children(pid: int) -> list[int]:
    found: list[int] = []
    with contextlib.suppress(OSError):
        for task in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{task}/children") as children:
                found.extend(int(c) for c in children.read().split())
    return found


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as cmdline:
            return cmdline.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


# -- the machine -------------------------------------------------------------------------


def machine() -> dict[str, Any]:
    import zmq

    model = "?"
    with contextlib.suppress(OSError), open("/proc/cpuinfo") as cpuinfo:
        for line in cpuinfo:
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    memory_mib = 0
    with contextlib.suppress(OSError), open("/proc/meminfo") as meminfo:
        for line in meminfo:
            if line.startswith("MemTotal:"):
                memory_mib = int(line.split()[1]) // 1024
                break
    return {
        "background_cores_busy": round(background_load(), 2),
        "cores": os.cpu_count(),
        "usable_cores": len(os.sched_getaffinity(0)),
        "cpu": model,
        "memory_mib": memory_mib,
        "kernel": platform.release(),
        "python": platform.python_version(),
        "pyzmq": zmq.__version__,
        "libzmq": zmq.zmq_version(),
    }


def describe_machine(info: dict[str, Any]) -> str:
    return (
        f"{info['cores']} cores ({info['usable_cores']} usable, {info['cpu']}), "
        f"{info['memory_mib']} MiB RAM, Linux {info['kernel']}, Python {info['python']}, "
        f"pyzmq {info['pyzmq']} / libzmq {info['libzmq']}; other processes kept "
        f"{info['background_cores_busy']:.2f} cores busy before the run"
    )


def command_line() -> str:
    return "python " + " ".join(
        shlex.quote(a) for a in [os.path.relpath(sys.argv[0]), *sys.argv[1:]]
    )


# -- the server under test -----------------------------------------------------------------


def twistd_pid(proc: subprocess.Popen[Any], prefix: Sequence[str]) -> int:
    """The twistd process started as ``proc``, found among its children when a profiler
    ``prefix`` (e.g. py-spy) forked it."""
    if not prefix:
        return proc.pid
    pending = [proc.pid]
    while pending:
        pid = pending.pop()
        if "twistd" in _cmdline(pid) and "py-spy" not in _cmdline(pid):
            return pid
        pending.extend(_children(pid))
    return proc.pid


def noise_line(runs: Sequence[dict[str, Any]]) -> tuple[str, str]:
    """The summary's line of how busy other processes kept the CPUs in each run."""
    return (
        "noise",
        "other processes kept "
        + ", ".join(f"{r['foreign_cores']:.2f}" for r in runs)
        + " cores busy during the runs (baseline runs first)",
    )


def code_env(env: dict[str, str] | None = None) -> dict[str, str]:
    """``env`` (default: this process's) for a process of the code under test: CODE first
    on its path."""
    env = dict(os.environ if env is None else env)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(CODE), env.get("PYTHONPATH")]))
    return env


@functools.cache
def plugin_options(plugin: str) -> frozenset[str]:
    """The long options ``twistd PLUGIN`` of the code under test takes: an older revision
    under bench/ab.py may not know an option added since."""
    done = subprocess.run(
        [*twistd_command(), plugin, "--help"],
        env=code_env(),
        capture_output=True,
        text=True,
        check=False,
    )
    return frozenset(re.findall(r"--([a-z][a-z0-9-]*)", done.stdout))


def twistd_command() -> list[str]:
    local = Path(PYTHON).parent / "twistd"
    if local.exists():
        return [str(local)]
    found = shutil.which("twistd")
    if found is None:
        raise RuntimeError("twistd not found next to the interpreter or on PATH")
    return [found]


def started_twistd(
    tmp: Path, name: str, plugin_args: Sequence[str], ready: str, timeout: float = 60.0
) -> subprocess.Popen[bytes]:
    """``twistd -n PLUGIN_ARGS`` logging to ``tmp/NAME.log``, once its log says ``ready``
    (stopped, and RuntimeError, when it ends or does not within ``timeout``)."""
    log = tmp / f"{name}.log"
    command = [*twistd_command(), "-n", "--pidfile=", "--logfile", str(log), *plugin_args]
    process = subprocess.Popen(command, cwd=tmp, env=code_env())
    deadline = time.monotonic() + timeout
    while ready not in (log.read_text() if log.exists() else ""):
        if time.monotonic() > deadline or process.poll() is not None:
            stop_process(process)
            raise RuntimeError(f"{name} did not start: see {log}")
        time.sleep(0.05)
    return process


_REPORT = re.compile(
    r"sequence (?P<sequence>\d+); accepted (?P<accepted>\d+);.*max timer lag "
    r"(?P<lag>[0-9.]+) ms"
)


@dataclass
class LagReport:
    sequence: int
    accepted: int
    lag_ms: float


def emqp_args(port: int, data_dir: Path, cpu_latency_us: int | None = None) -> list[str]:
    """``twistd -n emqp``'s arguments for the broker alone on ``port`` (workers), ``port + 1``
    (clients) and ``port + 2`` (admin) of HOST, its store in ``data_dir``."""
    extra = [] if cpu_latency_us is None else ["--cpu-latency-us", str(cpu_latency_us)]
    return [
        "emqp", "--bind", HOST, "--worker-port", str(port), "--client-port", str(port + 1),
        "--admin-port", str(port + 2), "--data-dir", str(data_dir), *extra,
    ]  # fmt: skip


class TwistdProcess:
    """What the benchmarks' twistd children share. Subclasses are dataclasses with
    ``workdir``, ``prefix``, ``proc``, ``log_path`` and ``stdout_path``, and a ``label``."""

    label = "twistd"
    workdir: Path
    prefix: Sequence[str]
    proc: subprocess.Popen[bytes] | None
    log_path: Path
    stdout_path: Path

    def _twistd_argv(self, plugin_args: Sequence[str]) -> list[str]:
        return [
            *self.prefix,
            *twistd_command(),
            "-n",
            "--pidfile=",
            "--logfile",
            str(self.log_path),
            *plugin_args,
        ]

    def _spawn(self, argv: Sequence[str], drop_env_prefix: str) -> None:
        """Start ``argv`` in ``workdir`` without the plugin's own settings variables, so
        the command line alone decides."""
        self.workdir.mkdir(parents=True, exist_ok=True)
        env = code_env({k: v for k, v in os.environ.items() if not k.startswith(drop_env_prefix)})
        self.proc = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=open(self.stdout_path, "wb"),  # noqa: SIM115
            stderr=subprocess.STDOUT,
            env=env,
            cwd=self.workdir,
            preexec_fn=_die_with_parent,
        )

    def check_alive(self) -> None:
        assert self.proc is not None
        if self.proc.poll() is not None:
            raise RuntimeError(
                f"{self.label} exited with {self.proc.returncode}:\n{self.log_tail()}"
            )

    @property
    def pid(self) -> int:
        """The twistd process itself (a child of ``prefix`` when that forks, e.g. py-spy)."""
        assert self.proc is not None
        return twistd_pid(self.proc, self.prefix)

    def log_tail(self, lines: int = 30) -> str:
        text = ""
        for path in (self.log_path, self.stdout_path):
            with contextlib.suppress(OSError):
                text += "".join(path.read_text(errors="replace").splitlines(True)[-lines:])
        return text

    def stop(self) -> int | None:
        """SIGTERM by process id (twistd flushes and exits), then reap."""
        if self.proc is None:
            return None
        if self.prefix and self.proc.poll() is None:
            # Stop twistd itself so the wrapper (profiler) writes its output and exits.
            twistd = self.pid
            if twistd != self.proc.pid:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(twistd, signal.SIGTERM)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    self.proc.wait(60)
        return stop_process(self.proc, timeout=60)


@dataclass
class EmqpBroker(TwistdProcess):
    """A broker of the code under test on three free ports of HOST (``port``: workers, then
    clients, then admin), its data, log and output under ``workdir``."""

    workdir: Path
    prefix: list[str] = field(default_factory=list)
    port: int = 0
    proc: Any = None
    label = "broker"

    def __post_init__(self) -> None:
        self.data_dir = self.workdir / "data"
        self.log_path = self.workdir / "twistd.log"
        self.stdout_path = self.workdir / "stdout.txt"

    def launch(self, plugin_args: Callable[[int], Sequence[str]]) -> None:
        """Start ``twistd -n PLUGIN_ARGS(port)`` on free ports; return once it wrote its
        status.json."""
        self.port = free_ports(3)
        self._spawn(self._twistd_argv(plugin_args(self.port)), "EMQP_")
        wait_until(
            lambda: (self.data_dir / "status.json").exists(), 60, "the broker", self.check_alive
        )

    def endpoint(self, offset: int) -> str:
        return f"tcp://{HOST}:{self.port + offset}"


@dataclass
class BusServer(TwistdProcess):
    """``twistd -n eventbus`` on 127.0.0.1 with its data directory under ``workdir``.

    ``prefix`` wraps the command, e.g. ``python -m cProfile -o out.prof`` or
    ``py-spy record -o out.txt --format raw --``.
    """

    workdir: Path
    stats_interval: str = "0.5s"
    extra: Sequence[str] = ()
    prefix: Sequence[str] = ()
    port: int = 0
    proc: subprocess.Popen[bytes] | None = None
    data_dir: Path = field(init=False)
    log_path: Path = field(init=False)
    stdout_path: Path = field(init=False)
    label = "server"

    def __post_init__(self) -> None:
        self.data_dir = self.workdir / "data"
        self.log_path = self.workdir / "twistd.log"
        self.stdout_path = self.workdir / "stdout.txt"

    @property
    def argv(self) -> list[str]:
        return self._twistd_argv(
            [
                "eventbus",
                # The bus alone: the protocols composed by default (mc0 on 61616) stay out
                # (an older revision under bench/ab.py may serve only the bus anyway).
                *(["--services", "eventbus"] if "services" in plugin_options("eventbus") else []),
                # A free HTTP port: another server on this machine may hold the default one
                # (the server then stops at start, after writing its status.json).
                *(["--http-port", "0"] if "http-port" in plugin_options("eventbus") else []),
                "--bind",
                HOST,
                "--port",
                str(self.port),
                "--data-dir",
                str(self.data_dir),
                "--stats-interval",
                self.stats_interval,
                *self.extra,
            ]
        )

    @property
    def snapshot(self) -> str:
        return f"tcp://{HOST}:{self.port}"

    @property
    def publisher(self) -> str:
        return f"tcp://{HOST}:{self.port + 1}"

    @property
    def collector(self) -> str:
        return f"tcp://{HOST}:{self.port + 2}"

    def start(self, timeout: float = 60.0) -> BusServer:
        if not self.port:
            self.port = free_ports(3)
        self._spawn(self.argv, "EVENTBUS_")
        wait_until(
            lambda: (self.data_dir / "status.json").exists(),
            timeout,
            "server to write status.json",
            self.check_alive,
        )
        return self

    def status(self) -> dict[str, Any]:
        for _ in range(50):
            try:
                value: dict[str, Any] = json.loads((self.data_dir / "status.json").read_text())
                return value
            except (json.JSONDecodeError, FileNotFoundError):
                time.sleep(0.01)
        raise RuntimeError("status.json unreadable")

    def wait_sequence(self, sequence: int, timeout: float) -> dict[str, Any]:
        result: dict[str, Any] = {}

        def reached() -> bool:
            result.update(self.status())
            return int(result["sequence"]) >= sequence

        wait_until(reached, timeout, f"server sequence {sequence}", self.check_alive, 0.05)
        return result

    def reports(self) -> list[LagReport]:
        """Every periodic report the server logged so far (one per stats interval)."""
        found = []
        with contextlib.suppress(FileNotFoundError), open(self.log_path, errors="replace") as log:
            for line in log:
                match = _REPORT.search(line)
                if match:
                    found.append(
                        LagReport(
                            int(match["sequence"]), int(match["accepted"]), float(match["lag"])
                        )
                    )
        return found

    def wait_reports(self, count: int, timeout: float = 30.0) -> list[LagReport]:
        wait_until(
            lambda: len(self.reports()) >= count, timeout, f"{count} reports", self.check_alive
        )
        return self.reports()


def wait_until(
    condition: Callable[[], bool],
    timeout: float,
    what: str,
    check: Callable[[], None] | None = None,
    interval: float = 0.02,
) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if check is not None:
            check()
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(interval)


def build_c_program(source: Path, root: Path) -> Path:
    """A C load generator of bench/ (``source``, including zmq_peers.h) compiled into
    ``root`` against the libzmq that pyzmq loads: the copy in its wheel, else (pyzmq built
    against the system's) ``-lzmq``."""
    import zmq

    compiler = shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        raise SystemExit(f"no C compiler (cc) to build {source.name}: run with --peers python")
    bundled = sorted((Path(zmq.__file__).resolve().parent.parent / "pyzmq.libs").glob("libzmq*"))
    link = [str(bundled[0]), f"-Wl,-rpath,{bundled[0].parent}"] if bundled else ["-lzmq"]
    program = root / source.stem
    built = subprocess.run(
        [compiler, "-O2", "-o", str(program), str(source), *link], capture_output=True, text=True
    )
    if built.returncode != 0:
        raise SystemExit(
            f"cannot build {source.name} (or run with --peers python):\n{built.stderr}"
        )
    return program


# -- raw pyzmq worker processes (bench/_workers.py) -----------------------------------------


class Worker:
    """One ``_workers.py ROLE`` process: it prints ``READY`` when set up, reads ``GO`` on
    stdin when it must wait for one, and prints one JSON line with its result."""

    def __init__(
        self, role: str, *args: object, script: Path = WORKERS, program: Path | None = None
    ) -> None:
        """``program``: an executable taking the role and arguments, instead of ``script``."""
        self.role = role
        command = [str(program)] if program is not None else [PYTHON, str(script)]
        self.proc = subprocess.Popen(
            [*command, role, *map(str, args)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            preexec_fn=_die_with_parent,
        )
        self._lines: queue.Queue[str | None] = queue.Queue()
        self._stderr: list[str] = []
        threading.Thread(target=self._read, daemon=True).start()
        threading.Thread(target=self._read_stderr, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self._lines.put(line.rstrip("\n"))
        self._lines.put(None)

    def _read_stderr(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self._stderr.append(line)

    def _next_line(self, timeout: float) -> str:
        try:
            line = self._lines.get(timeout=timeout)
        except queue.Empty:
            raise TimeoutError(f"{self.role} worker silent for {timeout:.0f}s") from None
        if line is None:
            self.proc.wait(5)
            raise RuntimeError(
                f"{self.role} worker exited ({self.proc.returncode}):\n{''.join(self._stderr)}"
            )
        return line

    def wait_ready(self, timeout: float = 60.0) -> None:
        while (line := self._next_line(timeout)) != "READY":
            print(f"  [{self.role}] {line}", file=sys.stderr)

    def go(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write("GO\n")
        self.proc.stdin.flush()

    def result(self, timeout: float = 300.0) -> dict[str, Any]:
        while True:
            line = self._next_line(timeout)
            if line.startswith("{"):
                value: dict[str, Any] = json.loads(line)
                return value
            print(f"  [{self.role}] {line}", file=sys.stderr)

    def stop(self) -> None:
        if self.proc.stdin is not None:
            with contextlib.suppress(OSError):
                self.proc.stdin.close()
        stop_process(self.proc)


class Cleanup(contextlib.ExitStack):
    """An ExitStack that stops workers and servers it was given, newest first."""

    def worker(self, role: str, *args: object, program: Path | None = None) -> Worker:
        """``program``: a C load generator taking the same role and arguments."""
        worker = Worker(role, *args, program=program)
        self.callback(worker.stop)
        return worker

    def server(self, server: BusServer) -> BusServer:
        self.callback(server.stop)
        return server.start()


# -- reporting ---------------------------------------------------------------------------


def median(values: Sequence[float]) -> float:
    return statistics.median(values) if values else float("nan")


def fmt_rate(value: float) -> str:
    return f"{value:,.0f}"


@dataclass(frozen=True)
class Figure:
    """One number a benchmark measured, as bench/ab.py compares it between revisions."""

    value: float
    unit: str
    #: "higher" or "lower": which way is better.
    better: str = "higher"


def summary(
    name: str,
    info: dict[str, Any],
    measured: str,
    baseline: str,
    ratio: str,
    target: str,
    verdict: bool,
    details: Sequence[tuple[str, str]] = (),
    json_path: str | None = None,
    record: dict[str, Any] | None = None,
    figures: dict[str, Figure] | None = None,
) -> None:
    """Print the SUMMARY block; with ``json_path``, also write it, with ``figures`` (the
    numbers bench/ab.py compares: the measured ones and their ratios to the baseline)."""
    width = 78
    lines = [
        ("command", command_line()),
        ("machine", describe_machine(info)),
        ("measured", measured),
        ("baseline", baseline),
        ("ratio", ratio),
        ("target", f"{target} -> {'PASS' if verdict else 'MISS'}"),
        *details,
    ]
    print()
    print(f" SUMMARY: {name} ".center(width, "="))
    label_width = max(len(label) for label, _ in lines)
    for label, value in lines:
        print(f"{label:<{label_width}} : {value}")
    print("=" * width)
    sys.stdout.flush()
    if json_path:
        payload = {
            "benchmark": name,
            "command": command_line(),
            "machine": info,
            "measured": measured,
            "baseline": baseline,
            "ratio": ratio,
            "target": target,
            "pass": verdict,
            "code": str(CODE),
            "figures": {
                key: {"value": f.value, "unit": f.unit, "better": f.better}
                for key, f in (figures or {}).items()
            },
            **(record or {}),
        }
        Path(json_path).write_text(json.dumps(payload, indent=1, default=str) + "\n")


def add_common_arguments(parser: Any) -> None:
    parser.add_argument(
        "--server-prefix",
        default="",
        help="wrap the server command, e.g. 'python -m cProfile -o /tmp/bus.prof' or "
        "'py-spy record -o /tmp/bus.txt --format raw --' (figures then include its overhead)",
    )
    parser.add_argument("--json", default=None, help="also write the result to this JSON file")
    parser.add_argument(
        "--wait-idle",
        type=float,
        default=30.0,
        help="before each measurement, wait up to this many seconds for other processes "
        "to leave the CPUs (near) idle (default 30; 0: do not wait)",
    )
    parser.add_argument(
        "--keep", action="store_true", help="keep the temporary directory (prints its path)"
    )
    parser.add_argument(
        "--cpu-latency-us",
        type=int,
        default=None,
        help="hold the CPUs' wake-up latency at this bound (Linux PM QoS) for the whole run, "
        "baseline and target alike, and start the server with the same option (needs root)",
    )


@contextlib.contextmanager
def cpu_latency(microseconds: int | None) -> Iterator[list[tuple[str, str]]]:
    """Hold a PM QoS CPU latency request (as ``--cpu-latency-us`` does in the product) for
    the whole run, so that the baseline gets the same machine as the server; yields the
    summary's line that says so (none when off)."""
    if microseconds is None:
        yield []
        return
    from bus.application.cpulatency import CpuLatencyService

    request = CpuLatencyService(microseconds)
    request.startService()
    try:
        text = f"wake-up latency held at {microseconds} us (PM QoS) for baseline and server alike"
        yield [("cpus", text)]
    finally:
        request.stopService()


def server_prefix(text: str) -> list[str]:
    words = shlex.split(text)
    return [PYTHON if w in ("python", "python3") else w for w in words]


@contextlib.contextmanager
def workdir(prefix: str, keep: bool) -> Iterator[Path]:
    if keep:
        path = Path(tempfile.mkdtemp(prefix=prefix))
        print(f"keeping {path}", file=sys.stderr)
        yield path
        return
    with temporary_directory(prefix) as path:
        yield path


# -- instruction counts (eventbus_instructions, emqp_instructions) ----------------------------


def instruction_args(
    description: str, stages: Sequence[str], run_stage: Callable[[str, int], None]
) -> Any:
    """The command line of an instruction bench: with ``--stage`` (what
    :func:`cachegrind_instructions` runs under valgrind) the stage runs in this process and
    None is returned; otherwise the arguments, once valgrind is known to be there."""
    import argparse

    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--batches", type=int, default=20)
    parser.add_argument("--stages", default=",".join(stages))
    parser.add_argument("--stage", help=argparse.SUPPRESS)
    parser.add_argument("--json")
    args = parser.parse_args()
    if args.stage:
        run_stage(args.stage, args.batches)
        return None
    terminate_on_sigterm()
    if shutil.which("valgrind") is None:
        raise SystemExit("valgrind is not installed (Debian: apt install valgrind)")
    return args


def cachegrind_instructions(script: str, stage: str, batches: int, env: dict[str, str]) -> int:
    """Instructions valgrind counted (no cache simulation) for ``script --stage STAGE
    --batches N``, run with ``env`` over this environment and the code under test."""
    done = subprocess.run(
        [
            "valgrind", "--tool=cachegrind", "--cache-sim=no", "--cachegrind-out-file=/dev/null",
            PYTHON, script, "--stage", stage, "--batches", str(batches),
        ],
        env={**os.environ, "BENCH_CODE": str(CODE), **env},
        capture_output=True,
        text=True,
    )  # fmt: skip
    found = re.search(r"I\s+refs:\s+([\d,]+)", done.stderr)
    if done.returncode != 0 or found is None:
        raise SystemExit(f"valgrind run of {stage} failed:\n{done.stderr[-2000:]}")
    return int(found[1].replace(",", ""))


def instruction_summary(
    bench: str,
    info: dict[str, Any],
    args: Any,
    counted: dict[str, dict[str, float]],
    main_stage: str,
    unit: str,
    *,
    baseline: str,
    ratio: str,
    details: list[tuple[str, str]],
) -> None:
    """An instruction bench's :func:`summary`: ``counted[stage]["code"]`` per ``unit`` of
    each stage (a figure each, for bench/ab.py), ``main_stage`` first."""
    figures: dict[str, Any] = {
        f"{name}_instructions": Figure(value["code"], f"instructions/{unit}", better="lower")
        for name, value in counted.items()
    }
    summary(
        bench,
        info,
        measured=f"{main_stage}: {counted[main_stage]['code']:,.0f} instructions per {unit} "
        + ", ".join(f"{n} {v['code']:,.0f}" for n, v in counted.items() if n != main_stage),
        baseline=baseline,
        ratio=ratio,
        target="none: the count behind the CPU figures, for A/B on a busy machine",
        verdict=True,
        details=details,
        json_path=args.json,
        record={"counted": counted},
        figures=figures,
    )
