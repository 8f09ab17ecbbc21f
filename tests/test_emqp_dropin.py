"""eMQP as a drop-in for eventmq 0.3.13, broker side (issue 34), through real sockets: the
admin commands eventmq's ``emq-cli`` sends, eventmq's STATUS keys, six-field cron lines,
cron haste, and an answer to every SCHEDULE a client waits on, malformed ones included.
Where eventmq has the behaviour, its own code (``.venv-interop``) is the peer."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import pytest_twisted
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from twisted.internet import task

from bus.emqp import codec
from bus.emqp.codec import EmqpError
from bus.emqp.worker import EmqpWorker
from bus.testing import RawPeer, start_broker, wait_until
from tests.emqp_helpers import RawClient, RawWorker, broker_in
from tests.ports import free_ports
from tests.processes import BrokerProcess, reported
from tests.test_emqp_interop import (
    JOBS,
    SENT_LINGER,
    InteropProcess,
    free_slots,
    job_manager,
    run_real_client,
)

Message = list[bytes]
ROOT = Path(__file__).resolve().parent.parent
INTEROP_PYTHON = ROOT / ".venv-interop" / "bin" / "python"
SCRIPTS = Path(__file__).resolve().parent / "emqp_interop"
INTEROP_ENV = dict(os.environ, PYTHONPATH=str(ROOT), PYTHONUNBUFFERED="1")


def _interop_python() -> str:
    if not INTEROP_PYTHON.exists():
        pytest.fail(f"{INTEROP_PYTHON} is missing: `make .venv-interop/.installed` makes it")
    return str(INTEROP_PYTHON)


@pytest_twisted.inlineCallbacks
def emq_cli(admin: str, *commands: str) -> Any:
    """eventmq's own emq-cli at ``admin``: command -> {"frames": N, "value": printed}."""
    from twisted.internet import utils

    out, err, code = yield utils.getProcessOutputAndValue(
        _interop_python(), [str(SCRIPTS / "admin.py"), admin, *commands],
        env=INTEROP_ENV, path=str(ROOT),
    )  # fmt: skip
    assert code == 0, err.decode()
    return {entry["command"]: entry for entry in map(json.loads, out.decode().splitlines())}


@pytest_twisted.inlineCallbacks
def emq_cli_until(admin: str, wanted: Callable[[dict[str, Any]], bool], *commands: str) -> Any:
    """emq-cli's answers once ``wanted`` holds of them (each run is its own round trip)."""
    deadline = time.monotonic() + 30
    while True:
        answers = yield emq_cli(admin, *commands)
        if wanted(answers) or time.monotonic() > deadline:
            return answers


@pytest.fixture
def eventmq_router(tmp_path: Path) -> Iterator[dict[str, str]]:
    """eventmq 0.3.13's own router on free ports: its endpoints, as our broker's."""
    first = free_ports(3)
    endpoints = {name: f"tcp://127.0.0.1:{first + i}"
                 for i, name in enumerate(("worker", "client", "admin"))}  # fmt: skip
    log = open(tmp_path / "router.log", "ab")
    process = subprocess.Popen(
        [_interop_python(), str(SCRIPTS / "router.py"), endpoints["worker"], endpoints["client"],
         endpoints["admin"], str(tmp_path / "wal" / "wal.log")],
        stdout=log, stderr=log, env=INTEROP_ENV, cwd=ROOT, start_new_session=True,
    )  # fmt: skip
    try:
        yield endpoints
    finally:
        process.terminate()
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(10)
        if process.poll() is None:
            process.kill()
            process.wait(10)
        log.close()


# -- malformed SCHEDULE and UNSCHEDULE ---------------------------------------------------------


@dataclass
class Scheduling:
    broker: Any
    client: RawPeer
    admin: RawPeer


@pytest.fixture(scope="module")
def scheduling(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Scheduling]:
    broker = start_broker(tmp_path_factory.mktemp("dropin-emqp"))
    client = RawPeer.dealer(broker.endpoints["client"])
    admin = RawPeer.dealer(broker.endpoints["admin"])
    try:
        yield Scheduling(broker, client, admin)
    finally:
        client.close()
        admin.close()
        pytest_twisted.blockon(broker.stopService())


def _not_json(data: bytes) -> bool:
    try:
        json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        return True
    return False


good_fields = [b"q", b"nohaste", b"3600", b'["run", {"path": "a", "callable": "b"}]', b""]


@st.composite
def malformed_schedules(draw: st.DrawFn) -> Message:
    """A SCHEDULE or UNSCHEDULE eventmq's client could never send: too few or too many
    fields, or a body that is not JSON; its message id sound, so it can be answered."""
    command = draw(st.sampled_from([codec.SCHEDULE, codec.UNSCHEDULE]))
    if draw(st.booleans()):
        count = draw(st.sampled_from([0, 2, 3, 4, 6, 7, 11]))
        fields = [draw(st.sampled_from(good_fields)) for _ in range(count)]
    else:
        body = draw(st.binary(min_size=0, max_size=40).filter(_not_json))
        fields = [*good_fields[:3], body, b""]
    return codec.message(command, *fields)


@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(batch=st.lists(st.tuples(st.sampled_from(["client", "admin"]), malformed_schedules()),
                      min_size=1, max_size=8))  # fmt: skip
@pytest_twisted.inlineCallbacks
def test_a_malformed_schedule_is_answered_bad_schedule_and_counted(
    scheduling: Scheduling, batch: list[tuple[str, Message]]
) -> Any:
    """Each gets one 6-frame REPLY ``bad-schedule`` naming its id (a client waits for an
    answer), and is still dropped and counted under the codec's reason."""
    core = scheduling.broker.broker
    before = Counter(core.drops.counts)
    expected: Counter[str] = Counter()
    for _port, frames in batch:
        try:
            codec.parse(frames)
        except EmqpError as error:
            expected[error.reason] += 1
        else:
            assume(False)
    for port, frames in batch:
        getattr(scheduling, port).send(frames)

    def answers(port: str, msgid: bytes) -> list[Any]:
        peer = getattr(scheduling, port)
        return [json.loads(m[4]) for m in peer.messages if len(m) == 6 and m[5] == msgid]

    for port, frames in batch:
        yield wait_until(lambda p=port, f=frames: answers(p, f[3]), what="the bad-schedule answer")
    for port, frames in batch:
        [answer] = answers(port, frames[3])
        assert answer["error"] == "bad-schedule" and answer["message"]
    assert Counter(core.drops.counts) - before == expected
    assert len(core.schedules) == 0


# -- eventmq's admin commands ------------------------------------------------------------------


@pytest_twisted.inlineCallbacks
def _admin_answers(endpoints: dict[str, str], cleanup: list[Any]) -> Any:
    """Two workers (one INFORMing its queues lightest first) with free slots and a scheduler
    peer at a broker; then emq-cli's ``show_workers`` and ``show_schedulers``, once it
    shows them all, and its ``status``."""
    first = RawWorker(endpoints["worker"], [[5, "mail"], [10, "default"]], identity=b"w-1")
    cleanup.append(first)
    # One after the other: a queue lists its workers in the order they came.
    yield wait_until(first.acked, timeout=30, what="the first worker's ACK")
    second = RawWorker(endpoints["worker"], [[10, "default"]], identity=b"w-2")
    scheduler = RawPeer.dealer(endpoints["client"], identity=b"s-1")
    cleanup += [second, scheduler]
    scheduler.send(codec.inform([], codec.SCHEDULER))
    yield wait_until(second.acked, timeout=30, what="the second worker's ACK")
    yield wait_until(lambda: scheduler.messages, timeout=30, what="the scheduler's ACK")
    first.ready(2)
    second.ready(1)

    def heartbeats() -> None:  # eventmq's router forgets peers silent for 5 s
        for peer in (first.peer, second.peer, scheduler):
            peer.send(codec.heartbeat(time.time()))

    def complete(answers: dict[str, Any]) -> bool:
        shown = answers["show_workers"]["value"] or {}
        slots = {w: s["available_slots"] for w, s in shown.get("connected_workers", {}).items()}
        return slots == {"w-1": 2, "w-2": 1}

    # Every second while emq-cli runs, not once before each run: its interpreter may take
    # longer than those 5 s to start on a busy machine (and our broker forgets them in 9).
    beating = task.LoopingCall(heartbeats)
    beating.start(1.0)
    try:
        answers = yield emq_cli_until(
            endpoints["admin"], complete, "show_workers", "show_schedulers", "status"
        )
    finally:
        beating.stop()
    return answers


@pytest_twisted.inlineCallbacks
def test_emq_cli_shows_workers_and_schedulers_as_eventmq_router_does(
    tmp_path: Path, cleanup: list[Any], eventmq_router: dict[str, str]
) -> Any:
    """eventmq's emq-cli (HELLO as it connects, then ROUTER_SHOW_WORKERS and
    ROUTER_SHOW_SCHEDULERS) gets from our broker what it gets from eventmq's own router
    in the same situation: the same frames, the same JSON, but for the time last heard."""
    broker = broker_in(tmp_path, cleanup)
    ours = yield _admin_answers(broker.endpoints, cleanup)
    theirs = yield _admin_answers(eventmq_router, cleanup)
    for answers in (ours, theirs):
        for command in ("show_workers", "show_schedulers"):
            assert answers[command]["frames"] == 5, answers
        workers = answers["show_workers"]["value"]["connected_workers"]
        schedulers = answers["show_schedulers"]["value"]["connected_schedulers"]
        for peer in (*workers.values(), *schedulers.values()):
            assert isinstance(peer.pop("hb"), float)
    assert ours["show_workers"] == theirs["show_workers"]
    assert ours["show_workers"]["value"] == {
        "connected_workers": {
            "w-1": {"queues": [[5, "mail"], [10, "default"]], "available_slots": 2},
            "w-2": {"queues": [[10, "default"]], "available_slots": 1},
        },
        "connected_queues": {"default": [[10, "w-1"], [10, "w-2"]], "mail": [[5, "w-1"]]},
    }
    assert ours["show_schedulers"] == theirs["show_schedulers"]
    assert ours["show_schedulers"]["value"] == {"connected_schedulers": {"s-1": {}}}
    # HELLO was neither answered (emq-cli would print that answer for `status`) nor counted.
    assert "queues" in ours["status"]["value"]
    assert broker.broker.drops.total == 0


# -- eventmq's STATUS keys ---------------------------------------------------------------------

EVENTMQ_STATUS_KEYS = {
    "inflight_messages_by_queue",
    "latency_messages_by_queue",
    "max_latency_messages_by_queue",
    "waiting_messages_by_queue",
    "processed_messages_by_queue",
    "processed_messages_by_worker",
}


@pytest.fixture
def processes() -> Iterator[list[InteropProcess]]:
    started: list[InteropProcess] = []
    yield started
    for process in started:
        process.stop()


@pytest_twisted.inlineCallbacks
def test_status_has_eventmq_keys_with_real_values(
    tmp_path: Path,
    cleanup: list[Any],
    processes: list[InteropProcess],
    eventmq_router: dict[str, str],
) -> Any:
    """emq-cli ``status`` shows eventmq's router's keys beside ours, with what happened:
    jobs of eventmq's client run by eventmq's job manager, and a request nobody serves."""
    theirs = yield emq_cli(eventmq_router["admin"], "status")
    assert set(theirs["status"]["value"]) == EVENTMQ_STATUS_KEYS  # what monitoring reads
    broker = broker_in(tmp_path, cleanup)
    manager = job_manager(broker, processes, tmp_path, jobs=2)
    yield reported(lambda: free_slots(broker) == 2, manager.process, what="two READYs")
    requests = [{"func": f"{JOBS}.add", "args": [i, 1], "reply": True} for i in range(3)]
    answers = yield run_real_client(broker, processes, tmp_path, requests)
    assert [a["result"] for a in answers] == [{"value": i + 1} for i in range(3)]
    client = RawClient(broker.endpoints["client"])
    cleanup.append(client)
    client.request("nobody", ["run", {"path": JOBS, "callable": "add", "args": [1, 1]}])
    yield wait_until(lambda: b"nobody" in broker.broker.queues, what="the request waiting")
    ours = yield emq_cli(broker.endpoints["admin"], "status")
    status = ours["status"]["value"]
    assert set(status) >= EVENTMQ_STATUS_KEYS | {"queues", "workers", "counters"}
    assert status["processed_messages_by_queue"] == {"default": 3}
    [(manager, processed)] = status["processed_messages_by_worker"].items()
    assert processed == 3 and manager == status["workers"][0]["id"]
    assert status["waiting_messages_by_queue"] == {"nobody": 1}
    assert status["inflight_messages_by_queue"] == {"nobody": 1}
    mean, oldest = (status[k]["nobody"] for k in ("latency_messages_by_queue",
                                                  "max_latency_messages_by_queue"))  # fmt: skip
    assert set(status["latency_messages_by_queue"]) == {"nobody"}
    assert isinstance(mean, int) and isinstance(oldest, int) and 0 <= mean <= oldest


# -- cron ----------------------------------------------------------------------------------------


@pytest_twisted.inlineCallbacks
def _schedule_with_eventmq(
    broker: Any, processes: list[InteropProcess], tmp_path: Path, record: Path, timing: str
) -> Any:
    """eventmq's own ``schedule()`` of ``jobs.stamp(record)``; ``timing``: an interval in
    seconds or ``cron:LINE``."""
    sender = InteropProcess(
        "schedule.py", broker.endpoints["client"], f"{JOBS}.stamp", json.dumps([str(record)]),
        timing, log=tmp_path / "schedule.log",
    )  # fmt: skip
    processes.append(sender)
    yield sender.ended(SENT_LINGER, "the SCHEDULE sent")
    assert sender.process.returncode == 0, sender.log_path.read_text()


def _runs(record: Path) -> list[float]:
    text = record.read_text() if record.exists() else ""
    return [float(line.split()[0]) for line in text.splitlines()]


@pytest_twisted.inlineCallbacks
def test_a_six_field_cron_of_eventmq_runs_every_few_seconds(
    tmp_path: Path, cleanup: list[Any], processes: list[InteropProcess]
) -> Any:
    """``* * * * * */2`` from eventmq's client: its sixth field is seconds (croniter's
    reading), so the job runs again and again within seconds, never refused."""
    broker = broker_in(tmp_path, cleanup)
    worker = EmqpWorker(broker.endpoints["worker"], slots=2, heartbeat_interval=0.2)
    worker.startService()
    cleanup.append(worker)
    yield wait_until(lambda: worker.registered, what="our worker")
    record = tmp_path / "record.txt"
    yield _schedule_with_eventmq(broker, processes, tmp_path, record, "cron:* * * * * */2")
    yield wait_until(lambda: len(_runs(record)) >= 3, timeout=30, what="three runs")
    [listed] = broker.broker.schedules.listing(time.time())
    assert listed["cron"] == "* * * * * */2" and listed["runs"] >= 3
    assert "bad-schedule" not in broker.broker.drops.counts


@pytest_twisted.inlineCallbacks
def test_a_cron_schedule_of_eventmq_runs_at_once_unless_no_haste(
    tmp_path: Path, processes: list[InteropProcess]
) -> Any:
    """eventmq's scheduler runs a new cron schedule at once (its haste), whatever its line:
    a yearly one from eventmq's ``schedule()`` runs on our broker within seconds. Under
    ``twistd -n emqp --no-haste`` the same SCHEDULE waits for its first cron time."""
    record = tmp_path / "record.txt"
    hasty = BrokerProcess(tmp_path / "hasty", None)
    patient = BrokerProcess(tmp_path / "patient", None, "--no-haste")
    worker = None
    try:
        yield reported(lambda: hasty.ready() and patient.ready(), what="brokers")
        worker = EmqpWorker(hasty.endpoints["worker"], slots=1, heartbeat_interval=0.2)
        worker.startService()
        yield wait_until(lambda: worker.registered, what="our worker")
        # Yearly, on a day half a year from now: never while the test runs (a fixed first of
        # January would come in a run at midnight on New Year's Eve).
        later = datetime.now() + timedelta(days=182)
        yearly = f"0 0 {later.day} {later.month} *"
        for broker in (hasty, patient):
            yield _schedule_with_eventmq(broker, processes, tmp_path, record, f"cron:{yearly}")
        yield wait_until(lambda: _runs(record), timeout=30, what="the run at once")

        def listed(broker: BrokerProcess) -> list[dict[str, Any]]:
            return list(broker.status().get("schedules", []))

        yield wait_until(lambda: listed(hasty) and listed(patient), what="both in status.json")
        assert listed(hasty)[0]["runs"] == 1
        # Accepted, not run: its first run is half a year away.
        [waiting] = listed(patient)
        assert waiting["runs"] == 0 and waiting["cron"] == yearly
        assert waiting["next_run_in"] > 0
        assert patient.status()["counters"]["schedules_fired"] == 0
    finally:
        if worker is not None:
            yield worker.stopService()
        for broker in (hasty, patient):
            if broker.process.poll() is None:
                broker.stop()


def test_no_haste_is_an_option_of_the_broker_and_of_the_product() -> None:
    from bus import tap
    from bus.emqp.tap import Options

    alone = Options()
    alone.parseOptions([])
    assert alone["emqp-config"].broker.cron_haste is True  # eventmq's default
    alone = Options()
    alone.parseOptions(["--no-haste"])
    assert alone["emqp-config"].broker.cron_haste is False
    product = tap.Options()
    product.parseOptions(["--services", "eventbus,emqp", "--emqp-no-haste"])
    assert product["service-options"]["emqp"]["emqp-config"].broker.cron_haste is False
