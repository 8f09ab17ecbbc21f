"""``emqp-worker`` as operators run it: the console script and ``twistd -n emqp-worker`` in
processes of their own, against a broker in the test's reactor, through real sockets.

The worker's job processes import this module by name for its handlers and hooks (with
``PYTHONPATH`` at the checkout), so those stay at its top and need nothing but ``os``."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import psutil
import pytest
import pytest_twisted
from twisted.python import usage

from bus.emqp.client import EmqpClient, JobFailed
from bus.testing import wait_until
from tests.emqp_helpers import broker_in
from tests.processes import reported

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
JOBS = "tests.emqp_interop.jobs"
HERE = "tests.test_emqp_worker_command"
# twistd re-raises the signal that stopped it; the console script exits 0.
TWISTD_CLEAN_EXIT = (0, -signal.SIGTERM)


def double(params: int) -> int:
    return params * 2


HANDLERS = {"double": double}


def _hook(word: str) -> None:
    with open(os.environ["EMQP_WORKER_TEST_HOOKS"], "a") as out:
        out.write(f"{word} {os.getpid()}\n")


def hook_setup() -> None:
    _hook("setup")


def hook_entry() -> None:
    _hook("entry")


def hook_exit() -> None:
    _hook("exit")


def run(function: str, *args: Any, **params: Any) -> list[Any]:
    """A body as eventmq's ``defer_job`` sends it."""
    return ["run", {"path": JOBS, "callable": function, "args": list(args), **params}]


class WorkerProcess:
    """``emqp-worker`` (or ``twistd -n emqp-worker``) in its own process group, so that its
    job processes go with it when a test ends."""

    def __init__(
        self,
        log: Path,
        *args: str,
        env: dict[str, str] | None = None,
        twistd: bool = False,
    ) -> None:
        if twistd:
            command = [str(BIN / "twistd"), "-n", "--pidfile=", "emqp-worker", *args]
        else:
            command = [str(BIN / "emqp-worker"), *args]
        # Only the settings a test names: none of eventmq's or ours from the machine.
        environment = {
            k: v for k, v in os.environ.items() if not k.startswith(("EVENTMQ_", "EMQP_WORKER_"))
        }
        environment.update(PYTHONPATH=str(ROOT), PYTHONUNBUFFERED="1", **(env or {}))
        self.log_path = log
        self.log = open(log, "ab")
        self.process = subprocess.Popen(
            command,
            stdout=self.log,
            stderr=subprocess.STDOUT,
            env=environment,
            cwd=log.parent,
            start_new_session=True,
        )
        self.pid = self.process.pid

    def output(self) -> str:
        return self.log_path.read_text()

    def finished(self) -> bool:
        return self.process.poll() is not None

    def signal(self, number: int = signal.SIGTERM) -> None:
        self.process.send_signal(number)

    def descendants(self) -> list[psutil.Process]:
        return psutil.Process(self.pid).children(recursive=True)

    def close(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.pid, signal.SIGKILL)
        self.process.wait(10)
        self.log.close()


class Activity:
    """The broker's activity sink: what it would publish on the Event BUS."""

    def __init__(self) -> None:
        self.events: list[tuple[str, Any]] = []

    def publish(self, topic: str, value: object) -> None:
        self.events.append((topic, value))

    def left(self) -> list[Any]:
        return [value for topic, value in self.events if topic == "/emqp/worker/left/"]


def client_of(broker: Any, cleanup: list[Any]) -> EmqpClient:
    client = EmqpClient(broker.endpoints["client"])
    cleanup.append(client)
    return client


def worker(tmp_path: Path, cleanup: list[Any], *args: str, **kwargs: Any) -> WorkerProcess:
    name = f"worker-{sum(isinstance(t, WorkerProcess) for t in cleanup)}.log"
    process = WorkerProcess(tmp_path / name, *args, **kwargs)
    cleanup.append(process)
    return process


def workers_seen(broker: Any) -> list[dict[str, Any]]:
    return list(broker.status()["workers"])


def free_slots(broker: Any) -> int:
    return sum(seen["free_slots"] for seen in workers_seen(broker))


def alive(process: psutil.Process) -> bool:
    try:
        return process.is_running() and process.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:  # gone between the two questions
        return False


def lines(path: Path) -> list[list[str]]:
    return [line.split() for line in path.read_text().splitlines()] if path.exists() else []


@pytest_twisted.inlineCallbacks
def test_run_bodies_and_handlers_run_in_job_processes_by_queue_weight(
    tmp_path: Path, cleanup: list[Any]
) -> Any:
    broker = broker_in(tmp_path, cleanup)
    endpoint = broker.endpoints["worker"]
    process = worker(
        tmp_path, cleanup, "--broker", endpoint, "--queues", "10:default,5:mail", "--slots",
        "1", "--handlers", f"{HERE}:HANDLERS", "--stats-interval", "0.1s",
    )  # fmt: skip
    yield reported(lambda: free_slots(broker) == 1, process.process, what="the worker's READY")
    assert workers_seen(broker)[0]["queues"] == [[10, "default"], [5, "mail"]]
    assert f"broker {endpoint}, queues 10:default,5:mail, slots 1, pool process" in (
        process.output()
    )
    client = client_of(broker, cleanup)
    assert (yield client.submit("default", run("add", 2, 3))) == 5
    greeting = run("greet", "eMQP", class_args=["Hello"])
    greeting[1]["path"] = f"{JOBS}:Greeter"
    assert (yield client.submit("mail", greeting)) == "Hello, eMQP"
    assert (yield client.submit("mail", ["double", 21])) == 42

    # One slot, busy: a READY takes the heaviest queue's request first, whatever the order.
    record = tmp_path / "record.txt"
    busy = client.submit("default", run("record", str(record), "busy", 1))
    yield wait_until(lambda: broker.status()["in_flight_count"] == 1, what="the busy job")
    light = client.submit("mail", run("record", str(record), "light"))
    heavy = client.submit("default", run("record", str(record), "heavy"))
    assert (yield light) == "light" and (yield heavy) == "heavy" and (yield busy) == "busy"
    assert [line[0] for line in lines(record)] == ["busy", "heavy", "light"]
    pids = {int(line[1]) for line in lines(record)}
    assert len(pids) == 1 and pids.isdisjoint({process.pid, os.getpid()})  # its job process

    with pytest.raises(JobFailed) as missing:
        yield client.submit("default", ["run", {"path": "no.such.module", "callable": "f"}])
    assert missing.value.reason == "handler-failed"
    assert "ModuleNotFoundError" in missing.value.message
    with pytest.raises(JobFailed) as unknown:
        yield client.submit("default", ["resize", {}])
    assert "no handler for 'resize'" in unknown.value.message
    yield wait_until(lambda: "jobs: 8 run, 2 failed" in process.output(), what="a stats line")
    assert not process.finished()


@pytest_twisted.inlineCallbacks
def test_a_job_that_ends_its_process_fails_alone_and_the_next_runs(
    tmp_path: Path, cleanup: list[Any]
) -> Any:
    broker = broker_in(tmp_path, cleanup)
    process = worker(tmp_path, cleanup, "--broker", broker.endpoints["worker"], "--slots", "1")
    yield reported(lambda: free_slots(broker) == 1, process.process, what="the worker's READY")
    client = client_of(broker, cleanup)
    record = tmp_path / "record.txt"
    yield client.submit("default", run("record", str(record), "before"))
    crashes = [
        ["run", {"path": "os", "callable": "_exit", "args": [3]}],
        ["run", {"path": "ctypes", "callable": "string_at", "args": [0]}],  # SIGSEGV
    ]
    for number, body in enumerate(crashes):
        with pytest.raises(JobFailed) as crashed:
            yield client.submit("default", body)
        assert crashed.value.reason == "handler-failed"
        assert "process died" in crashed.value.message
        assert (yield client.submit("default", run("record", str(record), f"after-{number}")))
    pids = [int(line[1]) for line in lines(record)]
    assert len(set(pids)) == 3  # a new process after each crash
    assert process.pid not in pids
    # The READY after the last REPLY may reach the broker just after the client's answer.
    yield wait_until(lambda: free_slots(broker) == 1, what="its slot free again")
    assert not process.finished()
    assert process.output().count("a job ended its process: starting another") == 2


@pytest_twisted.inlineCallbacks
def test_eventmq_settings_under_variables_under_our_options(
    tmp_path: Path, cleanup: list[Any]
) -> Any:
    broker = broker_in(tmp_path, cleanup)
    hooks = tmp_path / "hooks.txt"
    config = tmp_path / "eventmq.conf"
    config.write_text(
        f"""
[global]
concurrent_jobs = 5
heartbeat_timeout = 60
global_timeout = 60

[jobmanager]
worker_addr = {broker.endpoints["worker"]}
queues = [[10, "default"], [5, "file"]]
concurrent_jobs = 1
subprocess_setup_func = {HERE}.hook_setup
job_entry_func = {HERE}.hook_entry
job_exit_func = {HERE}.hook_exit
max_job_count = 1
"""
    )
    env = {
        "EVENTMQ_CONCURRENT_JOBS": "2",  # over the file's 1 (itself over [global]'s 5)
        "EVENTMQ_QUEUES": '[[3, "env"]]',  # over the file, under --queues
        "EMQP_WORKER_TEST_HOOKS": str(hooks),
    }
    process = worker(
        tmp_path, cleanup, "-C", str(config), "--queues", "7:flag", "--no-run",
        "--handlers", f"{HERE}:HANDLERS", env=env, twistd=True,
    )  # fmt: skip
    # The broker's address came from the file: the worker found it.
    yield reported(lambda: free_slots(broker) == 2, process.process, what="two READYs")
    assert workers_seen(broker)[0]["queues"] == [[7, "flag"]]
    client = client_of(broker, cleanup)
    with pytest.raises(JobFailed) as refused:
        yield client.submit("flag", run("add", 1, 2))
    assert "no handler for 'run'" in refused.value.message
    assert (yield client.submit("flag", ["double", 4])) == 8
    assert (yield client.submit("flag", ["double", 5])) == 10
    # Setup once in each job process (two at start, one more after max_job_count = 1 ended
    # the first job's); entry and exit around each job, the refused one never reached one.
    # The third setup is in a job process started after the first job's ended.
    yield reported(lambda: len(lines(hooks)) == 7, process.process, what="the hooks")
    seen = lines(hooks)
    assert sorted(word for word, _ in seen) == ["entry"] * 2 + ["exit"] * 2 + ["setup"] * 3
    entries = [pid for word, pid in seen if word == "entry"]
    assert len(set(entries)) == 2  # a fresh process for the second job
    assert [pid for word, pid in seen if word == "exit"] == entries
    assert len({pid for word, pid in seen if word == "setup"}) == 3
    assert str(process.pid) not in {pid for _, pid in seen}
    output = process.output()
    assert f"eventmq settings read from {config}" in output
    assert "HEARTBEAT_TIMEOUT=60" in output and "is not honoured" in output
    assert "GLOBAL_TIMEOUT" not in output  # --job-timeout
    process.signal(signal.SIGTERM)
    yield wait_until(process.finished, timeout=30, what="the worker to stop")
    assert process.process.returncode in TWISTD_CLEAN_EXIT, output


@pytest_twisted.inlineCallbacks
def test_sigterm_lets_the_running_job_finish_then_says_kbye(
    tmp_path: Path, cleanup: list[Any]
) -> Any:
    activity = Activity()
    broker = broker_in(tmp_path, cleanup, activity=activity)
    # The worker's heartbeats as the broker's (3 s): with a shorter interval its liveness
    # (3 intervals) ran out between two of the broker's, whenever SIGTERM came later than
    # that after the REQUEST (busy cores), and it connected again, its job's connection lost.
    process = worker(tmp_path, cleanup, "--broker", broker.endpoints["worker"], "--slots", "1")
    yield reported(lambda: free_slots(broker) == 1, process.process, what="the worker's READY")
    client = client_of(broker, cleanup)
    record, started = tmp_path / "record.txt", tmp_path / "started.txt"
    slow = client.submit("default", run("begin_then_record", str(started), str(record), "slow", 3))
    # Running in the job process, not only dispatched (see the grace-period test below).
    yield wait_until(lambda: len(lines(started)) == 1, timeout=30, what="the slow job running")
    process.signal(signal.SIGTERM)
    yield wait_until(
        lambda: "waiting for 1 running job(s) at most 300s" in process.output(),
        what="the worker draining",
    )
    # No READY after SIGTERM: a request sent now waits at the broker.
    client.submit("default", run("record", str(record), "later"))
    assert (yield slow) == "slow"
    yield wait_until(lambda: not broker.broker.workers, what="the worker's KBYE")
    assert [left["reason"] for left in activity.left()] == ["worker-left"]
    assert broker.broker.workers_lost == 0
    yield wait_until(process.finished, timeout=30, what="the worker to exit")
    assert process.process.returncode == 0, process.output()
    assert broker.status()["waiting"] == 1
    assert [line[0] for line in lines(record)] == ["slow"]
    assert int(lines(record)[0][1]) != process.pid


@pytest_twisted.inlineCallbacks
def test_the_grace_period_or_a_second_sigterm_ends_running_jobs(
    tmp_path: Path, cleanup: list[Any]
) -> Any:
    activity = Activity()
    broker = broker_in(tmp_path, cleanup, activity=activity)
    endpoint = broker.endpoints["worker"]
    brief = worker(tmp_path, cleanup, "--broker", endpoint, "-Q", "brief", "--grace-period", "0.5s")
    patient = worker(tmp_path, cleanup, "--broker", endpoint, "-Q", "patient", "-J", "1")
    yield reported(
        lambda: free_slots(broker) == 5, brief.process, patient.process, what="both workers' READYs"
    )
    client = client_of(broker, cleanup)
    record, started = tmp_path / "record.txt", tmp_path / "started.txt"
    stuck = {
        queue: client.submit(queue, run("begin_then_record", str(started), str(record), queue, 120))
        for queue in ("brief", "patient")
    }
    # Running in the job processes, not only dispatched: a worker told to stop before its
    # job reached the pool has nothing to wait for and ends at once, with no grace period.
    yield wait_until(lambda: len(lines(started)) == 2, timeout=30, what="both jobs running")
    job_processes = brief.descendants() + patient.descendants()
    assert job_processes

    brief.signal(signal.SIGTERM)  # its grace period ends the job
    with pytest.raises(JobFailed) as ended:
        yield stuck["brief"]
    assert ended.value.reason == "worker-left"
    yield wait_until(brief.finished, timeout=30, what="the first worker to exit")
    assert brief.process.returncode == 0, brief.output()
    assert "grace period of 0.5s over" in brief.output()

    patient.signal(signal.SIGTERM)
    yield wait_until(lambda: "waiting for 1 running job(s)" in patient.output(), what="draining")
    patient.signal(signal.SIGTERM)
    with pytest.raises(JobFailed) as ended:
        yield stuck["patient"]
    assert ended.value.reason == "worker-left"
    yield wait_until(patient.finished, timeout=30, what="the second worker to exit")
    assert patient.process.returncode == 0, patient.output()
    assert "SIGTERM again: ending the running jobs" in patient.output()

    assert [left["reason"] for left in activity.left()] == ["worker-left", "worker-left"]
    assert not broker.broker.workers and broker.broker.workers_lost == 0
    yield wait_until(lambda: not any(map(alive, job_processes)), what="no job process left")
    assert not record.exists()  # the jobs never got to the end
    assert broker.status()["waiting"] == 0


def test_where_each_option_comes_from(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from bus.emqp.worker_tap import Options

    for name in [n for n in os.environ if n.startswith(("EVENTMQ_", "EMQP_WORKER_"))]:
        monkeypatch.delenv(name)
    eventmq = tmp_path / "eventmq.conf"
    eventmq.write_text(
        "[global]\nheartbeat_liveness = 7\nconcurrent_jobs = 9\n"
        "[jobmanager]\nconcurrent_jobs = 5\nkill_grace_period = 12\nglobal_timeout = 30\n"
        "setup_path = pkg.mod:Ignored\nsetup_callable = prepare\n"
    )
    ours = tmp_path / "bus.toml"
    ours.write_text('[emqp]\nbind = "0.0.0.0"\n[emqp-worker]\nslots = 3\npool = "thread"\n')
    monkeypatch.setenv("EVENTMQ_CONFIG_FILE", str(eventmq))
    monkeypatch.setenv("EVENTMQ_HEARTBEAT_INTERVAL", "2")
    monkeypatch.setenv("EVENTMQ_KILL_GRACE_PERIOD", "20")
    monkeypatch.setenv("EMQP_WORKER_POOL", "process")
    options = Options()
    options.parseOptions(["--config", str(ours), "--heartbeat-interval", "250ms"])
    assert options["heartbeat-liveness"] == 7  # eventmq's [global]
    assert options["grace-period"] == 20  # EVENTMQ_* over its file
    assert options["slots"] == 3  # our TOML over eventmq's file
    assert options["pool"] == "process"  # EMQP_WORKER_* over our TOML
    assert options["heartbeat-interval"] == 0.25  # the command line over all
    assert options["hooks"].setup == "pkg.mod.prepare"  # eventmq's older spelling
    assert options["queues"] == ((10, "default"),)
    assert options["job-timeout"] == 30  # eventmq's GLOBAL_TIMEOUT
    assert options.eventmq.not_honoured() == []
    with pytest.raises(usage.UsageError, match="no such file"):
        Options().parseOptions(["-C", str(tmp_path / "missing.conf")])


@pytest.mark.parametrize("given", ["default:10", "mail,default:10", "a:b:7"])
def test_a_weight_after_the_name_is_refused_with_the_right_form(given: str) -> None:
    from bus.emqp.worker_tap import Options

    wrong = given.split(",")[-1]
    front, _, number = wrong.rpartition(":")
    with pytest.raises(usage.UsageError) as raised:
        Options().parseOptions(["--queues", given])
    assert f"as in {number}:{front}" in str(raised.value)
    # A name with a colon but no number after it is still a name.
    assert queues_of(["--queues", "jobs:mail"]) == ((10, "jobs:mail"),)


def queues_of(argv: list[str]) -> object:
    from bus.emqp.worker_tap import Options

    options = Options()
    options.parseOptions(argv)
    return options["queues"]


@pytest.mark.parametrize("kill", [True, False])
def test_a_job_pool_shut_down_is_not_woken_again_at_the_exit(kill: bool) -> None:
    """Python 3.11's exit wakes every process pool's manager thread through a pipe the thread
    may be closing just then (CPython gh-125451): a worker stopped with Ctrl-C printed an
    EBADF traceback (CI, once, with the pool's process still starting). A pool the worker
    shut down is woken by that shutdown, and is off the list the exit wakes, whether or not
    its thread ended within the join; the thread itself still ends."""
    import concurrent.futures.process as futures_process
    import multiprocessing

    from bus.emqp.worker import _JobProcess
    from bus.emqp.worker_process import NO_HOOKS

    pool = _JobProcess(NO_HOOKS, multiprocessing.get_context("forkserver"))
    pool.start()
    manager = pool.executor._executor_manager_thread  # type: ignore[attr-defined]
    assert manager in futures_process._threads_wakeups  # type: ignore[attr-defined]
    if kill:
        pool.kill()
    pool.shutdown()  # the thread may outlive it: still off the exit's list
    assert manager not in futures_process._threads_wakeups  # type: ignore[attr-defined]
    manager.join(30)
    assert not manager.is_alive()
