"""Interoperability with the real eventmq 0.3.13 from PyPI, through real sockets.

eventmq pins pyzmq 18.1.0, which does not build on this Python, so the Makefile installs it
with ``--no-deps`` and its other dependencies into its own venv (``.venv-interop``, made by
``make test``). Its JobManager runs in its own process (it installs signal handlers and
forks its worker processes) and its client code runs as a script there too; our broker and
libraries run here, in the test's reactor."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import pytest_twisted
from twisted.internet import defer, reactor, task

from bus.emqp.client import EmqpClient
from bus.emqp.worker import EmqpWorker
from bus.testing import start_broker, wait_until
from tests.processes import CLEAN_EXIT, BrokerProcess, broker_ports, ended, reported

ROOT = Path(__file__).resolve().parent.parent
INTEROP_PYTHON = ROOT / ".venv-interop" / "bin" / "python"
SCRIPTS = Path(__file__).resolve().parent / "emqp_interop"
JOBS = "tests.emqp_interop.jobs"
#: How long schedule.py and publish.py take, at most, to get what they send out once it is
#: sent (their socket's linger), and client.py waits for its answers: their own bounds.
SENT_LINGER = 5.0
CLIENT_WAIT = 30.0


class InteropProcess:
    """A script of tests/emqp_interop run by the interop interpreter, in its own process
    group (the JobManager forks workers): stopped by SIGTERM, then the group is killed.
    ``prefix`` runs it elsewhere (``ip netns exec NS``: a host of tests/netns.py)."""

    def __init__(
        self,
        script: str,
        *args: str,
        log: Path,
        env: dict[str, str] | None = None,
        prefix: list[str] | None = None,
    ):
        if not INTEROP_PYTHON.exists():
            pytest.fail(f"{INTEROP_PYTHON} is missing: `make .venv-interop/.installed` makes it")
        self.log_path = log
        self.log = open(log, "ab")
        environment = dict(os.environ, PYTHONPATH=str(ROOT), PYTHONUNBUFFERED="1", **(env or {}))
        self.process = subprocess.Popen(
            [*(prefix or []), str(INTEROP_PYTHON), str(SCRIPTS / script), *args],
            stdout=subprocess.PIPE if script == "client.py" else self.log,
            stderr=self.log,
            env=environment,
            cwd=ROOT,
            start_new_session=True,
        )

    def finished(self) -> bool:
        return self.process.poll() is not None

    def ended(self, within: float, what: str) -> defer.Deferred[int]:
        """Its exit status once it has ended, ``within`` its own bound once it runs
        (:func:`tests.processes.ended`)."""
        return ended(self.process, within, what)

    def kill(self) -> None:
        """kill -9 of the whole group: the job manager and its worker processes."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait(10)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.process.wait(10)
        self.kill()  # what is left of the group (worker processes)
        if self.process.stdout is not None:
            self.process.stdout.close()
        self.log.close()


@pytest.fixture
def processes() -> Iterator[list[InteropProcess]]:
    started: list[InteropProcess] = []
    yield started
    for process in started:
        process.stop()


def job_manager(
    broker: Any, processes: list[InteropProcess], tmp_path: Path, jobs: int = 2, **env: str
) -> InteropProcess:
    log = tmp_path / f"jobmanager-{len(processes)}.log"
    process = InteropProcess(
        "jobmanager.py", broker.endpoints["worker"], json.dumps([[10, "default"]]), str(jobs),
        log=log, env={f"EVENTMQ_{k}": v for k, v in env.items()},
    )  # fmt: skip
    processes.append(process)
    return process


def free_slots(broker: Any) -> int:
    return sum(worker["free_slots"] for worker in broker.status()["workers"])


@pytest_twisted.inlineCallbacks
def run_real_client(
    broker: Any, processes: list[InteropProcess], tmp_path: Path, requests: list[dict[str, Any]]
) -> Any:
    client = InteropProcess(
        "client.py", broker.endpoints["client"], json.dumps(requests), log=tmp_path / "client.log"
    )
    processes.append(client)
    yield client.ended(CLIENT_WAIT, "the real client to finish")
    assert client.process.returncode == 0, client.log_path.read_text()
    assert client.process.stdout is not None
    return [json.loads(line) for line in client.process.stdout.read().splitlines()]


@pytest_twisted.inlineCallbacks
def test_the_real_job_manager_runs_jobs_of_the_real_client(
    tmp_path: Path, processes: list[InteropProcess], cleanup: list[Any]
) -> Any:
    broker = start_broker(tmp_path / "emqp")
    cleanup.append(broker)
    manager = job_manager(broker, processes, tmp_path, jobs=2)
    # It INFORMs, is ACKed, starts its workers at our first HEARTBEAT and sends READYs.
    yield reported(lambda: free_slots(broker) == 2, manager.process, what="two READYs")
    assert not manager.finished()
    record = tmp_path / "record.txt"
    requests = [{"func": f"{JOBS}.record", "args": [str(record), f"job-{i}"]} for i in range(3)]
    requests += [
        {"func": f"{JOBS}.add", "args": [2, 3], "reply": True},
        {"func": f"{JOBS}:Greeter.greet", "class_args": ["Hello"], "args": ["eMQP"],
         "reply": True, "guarantee": True, "retries": 2},
    ]  # fmt: skip
    answers = yield run_real_client(broker, processes, tmp_path, requests)
    assert all(answer["acknowledged"] for answer in answers)
    assert answers[3]["result"] == {"value": 5}
    assert answers[4]["result"] == {"value": "Hello, eMQP"}
    yield wait_until(lambda: broker.broker.replied == 5, timeout=30, what="five REPLYs")
    lines = record.read_text().split("\n")[:-1]
    assert sorted(line.split()[0] for line in lines) == ["job-0", "job-1", "job-2"]
    assert {int(line.split()[1]) for line in lines} - {os.getpid()}  # its worker processes
    assert broker.broker.drops.total == 0
    assert broker.store.count() == 0
    yield wait_until(lambda: free_slots(broker) == 2, timeout=30, what="its slots free again")


@pytest_twisted.inlineCallbacks
def test_the_real_job_manager_runs_jobs_of_our_client(
    tmp_path: Path, processes: list[InteropProcess], cleanup: list[Any]
) -> Any:
    broker = start_broker(tmp_path / "emqp")
    cleanup.append(broker)
    manager = job_manager(broker, processes, tmp_path, jobs=2)
    client = EmqpClient(broker.endpoints["client"])
    cleanup.append(client)
    yield reported(lambda: free_slots(broker) == 2, manager.process, what="two READYs")
    body = ["run", {"path": JOBS, "callable": "add", "args": [20, 22]}]
    assert (yield client.submit("default", body)) == 42
    assert (yield client.submit("default", body, guarantee=True, retries=1, timeout=30)) == 42
    record = tmp_path / "ours.txt"
    body = ["run", {"path": JOBS, "callable": "record", "args": [str(record), "fire"]}]
    msgid = yield client.submit("default", body, reply=False)
    assert len(msgid) == 36
    # The job opens the file, then writes its line: a line whole, not the file made.
    yield wait_until(
        lambda: record.exists() and record.read_text().endswith("\n"),
        timeout=30,
        what="the job without reply to run",
    )
    assert record.read_text().startswith("fire ")


@pytest_twisted.inlineCallbacks
def test_our_worker_serves_the_real_client(
    tmp_path: Path, processes: list[InteropProcess], cleanup: list[Any]
) -> Any:
    broker = start_broker(tmp_path / "emqp")
    cleanup.append(broker)
    worker = EmqpWorker(broker.endpoints["worker"], slots=2)
    worker.startService()
    cleanup.append(worker)
    yield wait_until(lambda: worker.registered)
    record = tmp_path / "record.txt"
    requests = [
        {"func": f"{JOBS}.add", "args": [40, 2], "reply": True},
        {"func": f"{JOBS}.record", "args": [str(record), "quiet"]},
        {"func": f"{JOBS}:Greeter.greet", "class_args": ["Hi"], "args": ["you"], "reply": True},
    ]
    answers = yield run_real_client(broker, processes, tmp_path, requests)
    assert [answer["result"] for answer in answers] == [
        {"value": 42}, None, {"value": "Hi, you"}
    ]  # fmt: skip
    assert all(answer["acknowledged"] for answer in answers)
    # Acknowledged is not yet run: the job without a reply may still be in the pool.
    yield wait_until(
        lambda: record.exists() and record.read_text().endswith("\n"),
        what="the job without a reply to run",
    )
    assert record.read_text() == f"quiet {os.getpid()}\n"  # ran in our worker's thread pool


@pytest_twisted.inlineCallbacks
def test_a_guaranteed_job_outlives_a_killed_job_manager(
    tmp_path: Path, processes: list[InteropProcess], cleanup: list[Any]
) -> Any:
    # It heartbeats every second here; the broker forgets it after 3 s of silence.
    broker = start_broker(tmp_path / "emqp", heartbeat_interval=1.0, heartbeat_liveness=3)
    cleanup.append(broker)
    first = job_manager(broker, processes, tmp_path, jobs=1, HEARTBEAT_INTERVAL="1")
    client = EmqpClient(broker.endpoints["client"])
    cleanup.append(client)
    yield reported(lambda: free_slots(broker) == 1, first.process, what="a READY")
    marker = tmp_path / "marker"
    body = ["run", {"path": JOBS, "callable": "slow_the_first_time", "args": [str(marker), "ok"]}]
    result = client.submit("default", body, guarantee=True)
    yield wait_until(marker.exists, timeout=30, what="the first attempt to start")
    first.kill()
    yield wait_until(lambda: broker.broker.workers_lost == 1, timeout=30, what="it forgotten")
    assert broker.broker.retried == 1 and broker.store.count() == 1
    job_manager(broker, processes, tmp_path, jobs=1, HEARTBEAT_INTERVAL="1")
    value = yield result
    assert value == "ok"
    yield wait_until(lambda: broker.store.count() == 0)


@pytest_twisted.inlineCallbacks
def test_the_real_scheduler_gets_schedule_and_unschedule_through_an_external_broker(
    tmp_path: Path, processes: list[InteropProcess], cleanup: list[Any]
) -> Any:
    broker = start_broker(tmp_path / "emqp", scheduler="external")
    cleanup.append(broker)
    # One slot: the scheduler's requests run in the order it sends them.
    worker = EmqpWorker(broker.endpoints["worker"], slots=1)
    worker.startService()
    cleanup.append(worker)
    scheduler = InteropProcess("scheduler.py", broker.endpoints["client"], log=tmp_path / "s.log")
    processes.append(scheduler)
    yield reported(lambda: broker.status()["schedulers"], scheduler.process, what="its INFORM")
    record = tmp_path / "record.txt"

    def lines(word: str) -> int:
        text = record.read_text() if record.exists() else ""
        return sum(line.split()[0] == word for line in text.splitlines())

    def real_schedule(word: str, *unschedule: str) -> Any:
        sender = InteropProcess(
            "schedule.py", broker.endpoints["client"], f"{JOBS}.record",
            json.dumps([str(record), word]), "1", *unschedule, log=tmp_path / "schedule.log",
        )  # fmt: skip
        processes.append(sender)
        return sender.ended(SENT_LINGER, "the SCHEDULE sent")

    yield real_schedule("tick")
    # Run at once ("haste"), then every second: the scheduler's REQUESTs reach our worker.
    yield wait_until(lambda: lines("tick") >= 2, timeout=30, what="two scheduled runs")
    yield real_schedule("tick", "unschedule")
    yield wait_until(lambda: broker.broker.schedules_forwarded == 2, what="UNSCHEDULE forwarded")
    yield real_schedule("tock")
    yield wait_until(lambda: lines("tock") >= 1, timeout=30, what="the second schedule")
    ticks = lines("tick")  # every tick sent before the UNSCHEDULE has run by now
    yield wait_until(lambda: lines("tock") >= 3, timeout=30, what="two more tocks")
    assert lines("tick") == ticks
    assert broker.broker.drops.total == 0


@pytest_twisted.inlineCallbacks
def test_the_real_job_manager_serves_again_after_the_broker_restarts(
    tmp_path: Path, processes: list[InteropProcess]
) -> Any:
    """A restarted broker tells the job manager's heartbeats KBYE once, then stays silent:
    the job manager (which ignores KBYE) sees the silence, INFORMs again and serves."""
    ports = broker_ports()
    data = tmp_path / "emqp"
    brokers: list[BrokerProcess] = []
    client = None
    try:
        brokers.append(BrokerProcess(data, ports))
        yield reported(brokers[-1].ready, what="the broker")
        # Its defaults (heartbeat every 3 s, silence judged per 5 s, liveness 3) scaled down
        # to 1 s and 2 s: it notices silence after about 6 s instead of 15.
        manager = job_manager(
            brokers[-1], processes, tmp_path, jobs=1, HEARTBEAT_INTERVAL="1", HEARTBEAT_TIMEOUT="2"
        )
        client = EmqpClient(brokers[-1].endpoints["client"])
        body = ["run", {"path": JOBS, "callable": "add", "args": [2, 3]}]
        assert (yield client.submit("default", body)) == 5
        for stop in (signal.SIGKILL, signal.SIGTERM):
            # The job manager held still while the broker restarts: its heartbeats are to meet
            # the new broker (and its KBYE) before it takes the silence for the broker's end
            # (about 10 s after the stop) and INFORMs on a fresh socket, which a broker slower
            # than that to start on a busy machine would never see: no not-informed drop.
            os.killpg(manager.process.pid, signal.SIGSTOP)
            try:
                code = brokers[-1].stop(stop)
                assert code == -signal.SIGKILL if stop == signal.SIGKILL else code in CLEAN_EXIT
                brokers.append(BrokerProcess(data, ports))
                yield reported(brokers[-1].ready, what="the broker again")
            finally:
                os.killpg(manager.process.pid, signal.SIGCONT)
            # Our client reconnects by itself; the job waits for the job manager's INFORM.
            assert (yield client.submit("default", body).addTimeout(60, reactor)) == 5
            yield wait_until(
                lambda: brokers[-1].status()["counters"]["replied"] == 1, what="status"
            )
            status = brokers[-1].status()
            assert status["counters"]["workers_joined"] == 1
            assert status["dropped"].get("not-informed", 0) >= 1
    finally:
        if client is not None:
            client.close()
        for broker in brokers:
            if broker.process.poll() is None:
                broker.stop()


@pytest_twisted.inlineCallbacks
def test_the_real_schedule_call_runs_on_our_scheduler_and_goes_on_after_a_restart(
    tmp_path: Path, processes: list[InteropProcess]
) -> Any:
    """eventmq's own ``schedule()`` against the broker's scheduler (no scheduler peer, no
    redis): at interval 1 s it runs again and again; the broker is killed (-9) and
    restarted, and the stored schedule goes on. (Its rhythm, and that missed runs are not
    made up, are the scheduler's rules, tested on its own clock in test_emqp_schedules.py:
    the times jobs ran at here are a loaded worker's.)"""
    ports = broker_ports()
    data = tmp_path / "emqp"
    record = tmp_path / "record.txt"
    brokers = [BrokerProcess(data, ports)]
    worker = None

    def runs() -> list[float]:
        text = record.read_text() if record.exists() else ""
        return [float(line.split()[0]) for line in text.splitlines()]

    try:
        yield reported(brokers[-1].ready, what="the broker")
        worker = EmqpWorker(brokers[-1].endpoints["worker"], slots=2, heartbeat_interval=0.2)
        worker.startService()
        yield wait_until(lambda: worker.registered, what="our worker")
        sender = InteropProcess(
            "schedule.py", brokers[-1].endpoints["client"], f"{JOBS}.stamp",
            json.dumps([str(record)]), "1", log=tmp_path / "schedule.log",
        )  # fmt: skip
        processes.append(sender)
        yield sender.ended(SENT_LINGER, "the SCHEDULE sent")
        yield wait_until(lambda: runs(), timeout=60, what="the first run (at once)")
        yield wait_until(lambda: len(runs()) >= 4, timeout=60, what="three more runs")
        assert brokers[-1].status()["schedules_count"] == 1
        informs = worker.informs
        assert brokers[-1].stop(signal.SIGKILL) == -signal.SIGKILL
        # A run the broker sent just before its death may still be on its way to the worker
        # or running: its line would come after those counted here, as if run after the
        # restart. Counted once the worker has seen the silence and connected again (what
        # the old connection held is gone with its socket) and runs nothing.
        yield wait_until(
            lambda: worker.informs > informs and worker.running_jobs == 0,
            what="the worker connecting again, idle",
        )
        before = len(runs())
        killed_at = runs()[-1]
        # Down for 3 s (part of the scenario, not a synchronisation): three runs missed.
        yield task.deferLater(reactor, 3.0, lambda: None)
        brokers.append(BrokerProcess(data, ports))
        yield reported(brokers[-1].ready, what="the broker again")
        yield wait_until(lambda: len(runs()) >= before + 3, timeout=30, what="runs again")
        after = runs()[before:]
        # That the three missed runs are not made up at once is the scheduler's rule, tested
        # on its own clock (test_restore_after_a_downtime_runs_each_once_then_keeps_the_phase):
        # the times jobs ran at here are the loaded worker's, not the scheduler's.
        assert after[0] - killed_at >= 3.0
        yield wait_until(
            lambda: brokers[-1].status()["counters"]["schedules_fired"] >= 3, what="its status"
        )
    finally:
        if worker is not None:
            yield worker.stopService()
        for broker in brokers:
            if broker.process.poll() is None:
                broker.stop()
