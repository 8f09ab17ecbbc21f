"""``emqp-cli schedules import`` (issue 34): the schedules eventmq's own scheduler keeps in a
real redis-server brought into a real ``twistd -n emqp``, from the running Redis and from a
dump file of it.

Needs Debian's redis-server (``make test`` installs it when it runs as root) and the ``redis``
package (the ``redis`` extra, in the main venv and in ``.venv-interop`` for eventmq's
scheduler); skipped with the reason otherwise."""

from __future__ import annotations

import contextlib
import json
import shutil
import subprocess
from collections.abc import Iterator
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import pytest_twisted

from bus.emqp.worker import EmqpWorker
from bus.testing import wait_until
from tests.ports import free_ports
from tests.processes import BrokerProcess, CommandProcess, reported
from tests.test_emqp_interop import INTEROP_PYTHON, JOBS, SENT_LINGER, InteropProcess

redis = pytest.importorskip(
    "redis", reason="the redis extra is not installed (pip install 'bus[redis]')"
)

REDIS_SERVER = shutil.which("redis-server")
if REDIS_SERVER is None:
    pytest.skip(
        "redis-server is not installed (Debian: apt-get install redis-server; `make test`"
        " installs it when run as root)",
        allow_module_level=True,
    )

#: eventmq's RQ_DB: not 0, so that the database in the URL is seen to count.
DB = 2


class Redis:
    """A redis-server on a free port of 127.0.0.1, its files in ``directory``."""

    def __init__(self, directory: Path) -> None:
        assert REDIS_SERVER is not None
        self.directory = directory
        directory.mkdir()
        self.port = free_ports(1)
        self.log = open(directory / "redis.log", "ab")
        self.process = subprocess.Popen(
            [REDIS_SERVER, "--port", str(self.port), "--bind", "127.0.0.1", "--dir",
             str(directory), "--save", "", "--appendonly", "no", "--daemonize", "no"],
            stdout=self.log, stderr=subprocess.STDOUT,
        )  # fmt: skip
        self.client = redis.Redis(host="127.0.0.1", port=self.port, db=DB)

    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/{DB}"

    def answers(self) -> bool:
        if self.process.poll() is not None:
            raise AssertionError(
                f"redis-server exited: {(self.directory / 'redis.log').read_text()}"
            )
        try:
            return bool(self.client.ping())
        except redis.ConnectionError:
            return False

    def stop(self) -> None:
        self.client.close()
        if self.process.poll() is None:
            self.process.terminate()
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.process.wait(10)
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait(10)
        self.log.close()


@pytest.fixture
def redis_server(tmp_path: Path) -> Iterator[Redis]:
    server = Redis(tmp_path / "redis")
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def processes() -> Iterator[list[Any]]:
    started: list[Any] = []
    yield started
    for process in reversed(started):
        process.stop()


class Cli(CommandProcess):
    program = "emqp-cli"


@pytest_twisted.inlineCallbacks
def emqp_cli(cleanup: list[Any], *args: str) -> Any:
    command = Cli(*args)
    cleanup.append(command)
    yield command.ended()
    return command


def stamp(record: Path) -> str:
    """A job of ``jobs.stamp(record)``, as eventmq's ``schedule()`` names it."""
    return json.dumps([str(record)])


def _runs(record: Path) -> int:
    return len(record.read_text().splitlines()) if record.exists() else 0


@pytest_twisted.inlineCallbacks
def test_schedules_of_eventmqs_redis_are_imported_into_twistd_emqp(
    tmp_path: Path, redis_server: Redis, processes: list[Any], cleanup: list[Any]
) -> Any:
    """eventmq's router and scheduler (RQ_DB 2 of a real redis-server) take three schedules
    of eventmq's client, one of them twice; a listed hash whose key is gone and a stored
    interval of 0 stand for what such a Redis may also hold. ``schedules import --redis``
    brings the three into ``twistd -n emqp`` (with their ids, queues, intervals and cron
    lines, and bodies that run the same jobs) and says why the other two were refused; run
    again, from a dump file of that Redis, it finds them all already there."""
    if not INTEROP_PYTHON.exists():
        pytest.fail(f"{INTEROP_PYTHON} is missing: `make .venv-interop/.installed` makes it")
    yield wait_until(redis_server.answers, timeout=30, what="redis-server")
    first = free_ports(3)
    router = {name: f"tcp://127.0.0.1:{first + i}"
              for i, name in enumerate(("worker", "client", "admin"))}  # fmt: skip
    processes.append(InteropProcess(
        "router.py", router["worker"], router["client"], router["admin"],
        str(tmp_path / "wal" / "wal.log"), log=tmp_path / "router.log",
    ))  # fmt: skip
    scheduler = InteropProcess(
        "scheduler.py", router["client"], log=tmp_path / "scheduler.log",
        env={"EVENTMQ_RQ_HOST": "127.0.0.1", "EVENTMQ_RQ_PORT": str(redis_server.port),
             "EVENTMQ_RQ_DB": str(DB)},
    )  # fmt: skip
    processes.append(scheduler)
    scheduler_log = tmp_path / "scheduler.log"
    yield reported(
        lambda: "Received ACK" in scheduler_log.read_text(), scheduler.process,
        what="eventmq's scheduler taken in by its router",
    )  # fmt: skip
    every, fast_cron, weekdays = (tmp_path / f"{n}.txt" for n in ("every", "fast", "weekdays"))
    # Weekdays at a minute twelve hours from now: it cannot come while the test runs (a fixed
    # 06:30 would, in a run at 06:30 on a weekday).
    later = datetime.now() + timedelta(hours=12)
    timings = [
        (every, "2"),
        (fast_cron, "cron:* * * * * */2"),
        (weekdays, f"cron:{later.minute} {later.hour} * * 1-5"),
    ]
    for record, timing in [*timings, timings[-1]]:  # the last twice: listed twice
        sender = InteropProcess(
            "schedule.py", router["client"], f"{JOBS}.stamp", stamp(record), timing,
            log=tmp_path / "schedule.log",
        )  # fmt: skip
        processes.append(sender)
        yield sender.ended(SENT_LINGER, "eventmq's SCHEDULE sent")
        assert sender.process.returncode == 0, sender.log_path.read_text()
    store = redis_server.client
    yield wait_until(
        lambda: len(store.lrange("interval_jobs", 0, -1)) >= 4, timeout=30,
        what="eventmq's scheduler storing the schedules",
    )  # fmt: skip
    for process in processes:
        process.stop()
    processes.clear()
    kept = {
        key.decode(): json.loads(store.get(key))
        for key in set(store.lrange("interval_jobs", 0, -1))
    }
    assert len(kept) == 3
    gone, zero = "0" * 40, "f" * 40
    body = ["run", {"path": JOBS, "callable": "stamp", "args": [str(tmp_path / "zero.txt")]}]
    store.lpush("interval_jobs", gone, zero)
    store.set(zero, json.dumps(["default", "guarantee", "0", json.dumps(body), ""]))

    broker = BrokerProcess(tmp_path / "emqp", None)
    processes.append(broker)
    yield reported(broker.ready, what="twistd -n emqp")
    admin = broker.endpoints["admin"]
    worker = EmqpWorker(broker.endpoints["worker"], slots=2, heartbeat_interval=0.2)
    worker.startService()
    cleanup.append(worker)

    imported = yield emqp_cli(
        cleanup, "schedules", "import", "--redis", redis_server.url(), "--admin", admin
    )
    assert imported.code == 1, imported.err  # two were refused
    outcomes = {line["key"]: line for line in imported.lines()}
    assert {k: o["outcome"] for k, o in outcomes.items()} == {
        **dict.fromkeys(kept, "imported"),
        gone: "refused",
        zero: "refused",
    }
    assert outcomes[gone]["why"] == "listed in interval_jobs, but its key is gone"
    assert outcomes[zero]["why"] == "interval 0: a schedule needs at least 1 s"
    summary = imported.err.strip().splitlines()[-1]
    assert summary.startswith(
        f"emqp-cli schedules: 3 imported, 0 already there, 2 refused, of 5 schedules in"
        f" {redis_server.url()} (interval_jobs names 1 of them more than once): "
    ), summary
    assert f"{gone[:12]}: listed in interval_jobs, but its key is gone" in summary

    listed = yield emqp_cli(cleanup, "schedules", "--admin", admin)
    assert listed.code == 0, listed.err
    schedules = {entry["id"]: entry for entry in listed.lines()}
    assert set(schedules) == set(kept)  # eventmq's hash of each body is its id here
    for key, (queue, headers, interval, _body, cron) in kept.items():
        ours = schedules[key]
        assert ours["queue"] == queue
        assert ours["interval"] == (None if interval == "-1" else float(interval))
        assert ours["cron"] == (cron or None)
        assert ours["headers"] == f"{headers},nohaste"  # resumed, not run at once
    # The bodies run the jobs they named: the two fast schedules stamp their own files.
    yield wait_until(
        lambda: _runs(every) >= 2 and _runs(fast_cron) >= 2, timeout=30, what="their runs"
    )
    assert _runs(weekdays) == 0

    store.save()  # dump.rdb, as a Redis configured to save writes it
    again = yield emqp_cli(
        cleanup, "schedules", "import", "--rdb", str(redis_server.directory / "dump.rdb"),
        "--db", str(DB), "--admin", admin,
    )  # fmt: skip
    assert {line["key"]: line["outcome"] for line in again.lines()} == {
        **dict.fromkeys(kept, "already-there"),
        gone: "refused",
        zero: "refused",
    }
    assert "0 imported, 3 already there, 2 refused, of 5 schedules in" in again.err, again.err


@pytest_twisted.inlineCallbacks
def test_an_unreadable_redis_or_dump_is_one_sentence(tmp_path: Path, cleanup: list[Any]) -> Any:
    """Nothing listening at --redis, a dump file that is not one or of a newer Redis: one
    line, exit 1."""
    port = free_ports(1)
    url = f"redis://127.0.0.1:{port}/0"
    silent = yield emqp_cli(cleanup, "schedules", "import", "--redis", url)
    assert silent.code == 1
    assert silent.err.startswith(f"emqp-cli schedules: {url}: Error 111 connecting"), silent.err
    junk = tmp_path / "dump.rdb"
    junk.write_bytes(b"not a dump")
    broken = yield emqp_cli(cleanup, "schedules", "import", "--rdb", str(junk))
    assert broken.code == 1
    assert broken.err.startswith(f"emqp-cli schedules: redis-server could not load {junk}:"), (
        broken.err
    )
    future = tmp_path / "future.rdb"
    future.write_bytes(b"REDIS0099\xff")
    newer = yield emqp_cli(cleanup, "schedules", "import", "--rdb", str(future))
    assert newer.code == 1
    assert newer.err == (
        f"emqp-cli schedules: redis-server could not load {future}: Can't handle RDB format"
        " version 99\n"
    )
    both = yield emqp_cli(cleanup, "schedules", "--redis", url)
    assert both.code == 1 and "--redis: only with `schedules import`" in both.err
