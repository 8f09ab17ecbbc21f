"""``emqp-worker`` in place of eventmq's ``emq-jobmanager``: the same answers to eventmq's
own client, timeouts that end the job, no process left behind when the worker dies, SIGHUP
and ``emq-jobmanager``'s command line. Real processes and sockets: the broker in the test's
reactor, eventmq 0.3.13's client and job manager from ``.venv-interop``."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path
from typing import Any

import psutil
import pytest_twisted

from bus.testing import wait_until
from tests.emqp_helpers import broker_in
from tests.processes import reported
from tests.test_emqp_interop import INTEROP_PYTHON, InteropProcess, processes, run_real_client
from tests.test_emqp_worker_command import (
    JOBS,
    alive,
    client_of,
    free_slots,
    lines,
    run,
    worker,
    workers_seen,
)

__all__ = ["processes"]  # the fixture, for pytest
#: eventmq's console scripts (an absolute path: InteropProcess joins it to nothing).
INTEROP_BIN = INTEROP_PYTHON.parent


def real_job_manager(
    broker: Any, processes: list[InteropProcess], tmp_path: Path, queue: str, **env: str
) -> InteropProcess:
    """eventmq's own job manager with one worker process, serving ``queue``."""
    process = InteropProcess(
        "jobmanager.py", broker.endpoints["worker"], json.dumps([[10, queue]]), "1",
        log=tmp_path / f"jobmanager-{queue}.log", env={f"EVENTMQ_{k}": v for k, v in env.items()},
    )  # fmt: skip
    processes.append(process)
    return process


def gone(pids: list[int]) -> bool:
    return not any(alive(psutil.Process(pid)) for pid in pids if psutil.pid_exists(pid))


@pytest_twisted.inlineCallbacks
def test_failed_and_timed_out_jobs_answer_the_value_eventmqs_job_manager_answers(
    tmp_path: Path, processes: list[InteropProcess], cleanup: list[Any]
) -> Any:
    broker = broker_in(tmp_path, cleanup)
    manager = real_job_manager(broker, processes, tmp_path, "theirs", GLOBAL_TIMEOUT="1")
    ours = worker(
        tmp_path, cleanup, "--broker", broker.endpoints["worker"], "-Q", "ours", "--slots", "1",
        env={"EVENTMQ_GLOBAL_TIMEOUT": "1"},
    )  # fmt: skip
    yield reported(
        lambda: free_slots(broker) == 2, manager.process, ours.process, what="both job managers"
    )
    started, record = tmp_path / "started.txt", tmp_path / "record.txt"
    requests = [
        request
        for queue in ("theirs", "ours")
        for request in (
            {"func": f"{JOBS}.fail", "args": ["no such thing"], "reply": True, "queue": queue},
            {"func": "no_such_module.f", "reply": True, "queue": queue},
            # No timeout:N: GLOBAL_TIMEOUT's second applies.
            {"func": f"{JOBS}.begin_then_record", "args": [str(started), str(record), queue, 60],
             "reply": True, "queue": queue},
        )
    ]  # fmt: skip
    answers = yield run_real_client(broker, processes, tmp_path, requests)
    theirs, mine = [a["result"] for a in answers[:3]], [a["result"] for a in answers[3:]]
    expected = ["no such thing", "No module named 'no_such_module'", "TimeoutError"]
    assert [result["value"] for result in theirs] == expected, theirs
    assert [result["value"] for result in mine] == expected, mine
    # Our reasons stay beside eventmq's value, for our client.
    assert [result["error"] for result in mine] == ["handler-failed", "handler-failed", "timeout"]
    assert mine[0]["message"] == "ValueError: no such thing"
    # eventmq's job manager leaves its timed-out job running; ours is ended with its process.
    pids = {text: int(pid) for text, pid in lines(started)}
    yield wait_until(lambda: gone([pids["ours"]]), timeout=10, what="the timed-out job's end")
    assert "a job ran past its timeout of 1s: ending its process" in ours.output()
    assert alive(psutil.Process(pids["theirs"]))
    yield wait_until(lambda: free_slots(broker) == 2, timeout=30, what="both slots free again")


@pytest_twisted.inlineCallbacks
def test_a_timed_out_job_is_ended_before_the_broker_retries_it(
    tmp_path: Path, processes: list[InteropProcess], cleanup: list[Any]
) -> Any:
    broker = broker_in(tmp_path, cleanup)
    ours = worker(tmp_path, cleanup, "--broker", broker.endpoints["worker"], "--slots", "4")
    yield reported(lambda: free_slots(broker) == 4, ours.process, what="the worker's READYs")
    started, record = tmp_path / "started.txt", tmp_path / "record.txt"
    # 4 s a run: its process must write its first line within that, on a busy machine too.
    slow = {"func": f"{JOBS}.begin_then_record", "args": [str(started), str(record), "slow", 12],
            "reply": True, "guarantee": True, "retries": 2, "timeout": 4}  # fmt: skip
    [answer] = yield run_real_client(broker, processes, tmp_path, [slow])
    assert answer["result"]["error"] == "timeout" and answer["result"]["value"] == "TimeoutError"
    # The first run and two retries, each in a process of its own (the last may write its line
    # after the broker gave up on it and answered).
    yield wait_until(lambda: len(lines(started)) == 3, timeout=30, what="the third run's line")
    pids = [int(pid) for _, pid in lines(started)]
    assert len(set(pids)) == 3
    yield wait_until(lambda: gone(pids), timeout=10, what="every run's process ended")
    assert not record.exists()  # no run got to the end of the job
    assert ours.output().count("a job ran past its timeout of 4s: ending its process") == 3
    yield wait_until(lambda: free_slots(broker) == 4, timeout=30, what="its slots free again")
    os.kill(ours.pid, signal.SIGTERM)
    yield wait_until(ours.finished, timeout=30, what="the worker to stop")


@pytest_twisted.inlineCallbacks
def test_every_process_of_a_killed_worker_ends_with_it(tmp_path: Path, cleanup: list[Any]) -> Any:
    broker = broker_in(tmp_path, cleanup)
    client = client_of(broker, cleanup)
    ours = worker(tmp_path, cleanup, "--broker", broker.endpoints["worker"], "--slots", "2")
    yield reported(lambda: free_slots(broker) == 2, ours.process, what="the worker's READYs")
    started, record = tmp_path / "started.txt", tmp_path / "record.txt"
    busy = client.submit("default", run("begin_then_record", str(started), str(record), "x", 120))
    busy.addErrback(lambda _: None)  # never answered: its worker dies
    yield wait_until(lambda: len(lines(started)) == 1, timeout=30, what="a job running")
    # The fork server, the resource tracker, a busy and an idle job process.
    descendants = [process.pid for process in ours.descendants()]
    assert len(descendants) >= 4 and int(lines(started)[0][1]) in descendants
    os.kill(ours.pid, signal.SIGKILL)
    yield wait_until(ours.finished, timeout=10, what="the worker's death")
    yield wait_until(lambda: gone(descendants), timeout=10, what="every descendant's end")
    assert not record.exists()


@pytest_twisted.inlineCallbacks
def test_emq_jobmanagers_command_line_runs_emqp_worker(
    tmp_path: Path, processes: list[InteropProcess], cleanup: list[Any]
) -> Any:
    broker = broker_in(tmp_path, cleanup)
    config = tmp_path / "eventmq.conf"
    config.write_text(
        "[global]\nhwm = 500\n"
        "[jobmanager]\nworker_addr = tcp://127.0.0.1:9\nmax_sockets = 10\n"
        "worker_addr_default = tcp://127.0.0.1:9\ndefault_queue_name = other\n"
    )
    command_line = [
        "--config", str(config), "--broker-addr", broker.endpoints["worker"], "--jobs", "2",
        "-n", "box-1", "-Q", "default", "mail",
    ]  # fmt: skip
    # The same command line, given to eventmq's own job manager (whose -Q names reach the
    # broker as no queue at all: it serves default only).
    theirs = InteropProcess(
        str(INTEROP_BIN / "emq-jobmanager"), *command_line, log=tmp_path / "emq-jobmanager.log"
    )
    processes.append(theirs)
    ours = worker(tmp_path, cleanup, *command_line)
    yield reported(
        lambda: free_slots(broker) == 4, theirs.process, ours.process, what="both job managers"
    )
    assert sorted(seen["queues"] for seen in workers_seen(broker)) == [
        [[10, "default"]],
        [[10, "default"], [10, "mail"]],
    ]
    output = ours.output()
    assert f"eventmq settings read from {config}" in output
    assert f"eMQP worker box-1: broker {broker.endpoints['worker']}" in output
    for setting in ("HWM=500", "MAX_SOCKETS=10", "WORKER_ADDR_DEFAULT=", "DEFAULT_QUEUE_NAME="):
        assert f"eventmq's {setting}" in output, output
    record = tmp_path / "record.txt"
    requests = [{"func": f"{JOBS}.record", "args": [str(record), "m"], "reply": True,
                 "queue": "mail"}]  # fmt: skip
    [answer] = yield run_real_client(broker, processes, tmp_path, requests)
    assert answer["result"] == {"value": "m"}


@pytest_twisted.inlineCallbacks
def test_sighup_reads_the_settings_again_and_never_ends_the_worker(
    tmp_path: Path, cleanup: list[Any]
) -> Any:
    broker = broker_in(tmp_path, cleanup)
    config = tmp_path / "eventmq.conf"

    def settings(queues: str, jobs: int, extra: str = "") -> None:
        config.write_text(
            f"[jobmanager]\nworker_addr = {broker.endpoints['worker']}\nqueues = {queues}\n"
            f"concurrent_jobs = {jobs}\n{extra}"
        )

    settings('[[10, "a"]]', 1)
    ours = worker(tmp_path, cleanup, "-C", str(config), twistd=True)
    yield reported(lambda: free_slots(broker) == 1, ours.process, what="the worker's READY")
    client = client_of(broker, cleanup)
    started, record = tmp_path / "started.txt", tmp_path / "record.txt"
    running = client.submit("a", run("begin_then_record", str(started), str(record), "x", 1))
    yield wait_until(lambda: len(lines(started)) == 1, timeout=30, what="a job running")

    settings('[[10, "a"], [5, "b"]]', 2, f"job_entry_func = {JOBS}.add\nhwm = 5\n")
    ours.signal(signal.SIGHUP)
    # The running job ends and answers on the old connection, then the worker INFORMs again.
    assert (yield running) == "x"
    yield wait_until(lambda: free_slots(broker) == 2, timeout=30, what="two READYs")
    assert [seen["queues"] for seen in workers_seen(broker)] == [[[10, "a"], [5, "b"]]]
    assert (yield client.submit("b", run("add", 1, 2))) == 3
    output = ours.output()
    assert "SIGHUP: queues 10:a -> 10:a,5:b" in output
    assert "SIGHUP: slots 1 -> 2" in output
    assert f"SIGHUP: job-entry-func None -> {JOBS}.add (takes effect when" in output
    assert "eventmq's HWM=5" in output

    config.write_text("worker_addr = no section\n")  # not INI: a usage error at start
    ours.signal(signal.SIGHUP)
    yield wait_until(
        lambda: "SIGHUP: settings not read again, kept as they were" in ours.output(),
        what="the bad file's line",
    )
    assert (yield client.submit("a", run("add", 2, 2))) == 4
    assert not ours.finished()
