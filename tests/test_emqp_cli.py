"""emqp-cli as a child process against a broker in this process (real sockets): every way a
command ends is one sentence on stderr and exit status 1, or the answer and exit status 0."""

from __future__ import annotations

import json
import re
import signal
from pathlib import Path
from typing import Any

import pytest_twisted
from twisted.internet import defer, protocol, reactor

from bus.emqp.worker import EmqpWorker
from bus.testing import wait_until
from tests.emqp_helpers import RawClient, RawWorker, broker_in
from tests.ports import free_ports
from tests.processes import CommandProcess, reported

ADD = '["add", {"a": 1, "b": 2}]'


def add(params: dict[str, int]) -> int:
    return params["a"] + params["b"]


def fail(params: Any) -> None:
    raise ValueError("no such thing")


class Cli(CommandProcess):
    """emqp-cli in a child process."""

    program = "emqp-cli"


@defer.inlineCallbacks
def ran(cleanup: list[Any], *args: str) -> Any:
    """The finished command, waited for on the reactor (the broker keeps answering)."""
    command = Cli(*args)
    cleanup.append(command)
    yield command.ended()
    return command


def ports(broker: Any) -> list[str]:
    return ["--broker", broker.endpoints["client"], "--admin", broker.endpoints["admin"]]


def one_failure(command: Cli, status: int = 1) -> str:
    """The single line a failed command wrote, checked to be no traceback."""
    assert command.code == status, command.err
    assert command.out == ""
    assert command.err.count("\n") == 1, command.err
    assert "Traceback" not in command.err and "generator" not in command.err
    return command.err.rstrip("\n")


@pytest_twisted.inlineCallbacks
def test_no_worker_for_the_queue_names_the_queue_and_the_wait(
    tmp_path: Path, cleanup: list[Any]
) -> Any:
    broker = broker_in(tmp_path, cleanup)
    command = yield ran(cleanup, "submit", "default", ADD, *ports(broker), "--wait", "1")
    assert one_failure(command) == (
        "emqp-cli submit: no worker serves queue 'default' (the request waits in its buffer);"
        " gave up after 1 s"
    )
    assert broker.status()["queues"]["default"]["depth"] == 1  # it really waits there


@pytest_twisted.inlineCallbacks
def test_a_worker_that_never_replies_and_one_that_is_busy(
    tmp_path: Path, cleanup: list[Any]
) -> Any:
    # The raw worker sends no heartbeats: at the default 3 s x 3 the broker would forget it
    # (and fail its request) while a CLI starts on a busy machine (10 s and more in CI).
    broker = broker_in(tmp_path, cleanup, heartbeat_interval=60.0)
    worker = RawWorker(broker.endpoints["worker"])
    cleanup.append(worker)
    yield wait_until(worker.acked, what="the worker's ACK")
    worker.ready()
    command = yield ran(cleanup, "submit", "default", ADD, *ports(broker), "--wait", "1")
    # Dispatched just before the CLI gave up, the REQUEST may reach the worker after the
    # CLI's STATUS answer and its end.
    yield wait_until(worker.requests, what="the REQUEST at the worker")
    [request] = worker.requests()
    assert one_failure(command) == (
        f"emqp-cli submit: request {request[3].decode()} went to a worker"
        f" ({worker.identity.decode()}), which has not replied; gave up after 1 s"
    )
    # Its one slot is taken: the next request waits behind another one.
    other = RawClient(broker.endpoints["client"])
    cleanup.append(other)
    other.request("default", ADD)
    yield wait_until(lambda: broker.status()["waiting"] == 1, what="a request waiting")
    command = yield ran(cleanup, "submit", "default", ADD, *ports(broker), "--wait", "1")
    assert one_failure(command) == (
        "emqp-cli submit: the one worker of queue 'default' is busy (1 request in flight,"
        " 2 waiting, this one included); gave up after 1 s"
    )


@pytest_twisted.inlineCallbacks
def test_results_of_a_worker_and_the_status(tmp_path: Path, cleanup: list[Any]) -> Any:
    broker = broker_in(tmp_path, cleanup)
    worker = EmqpWorker(broker.endpoints["worker"], handlers={"add": add, "fail": fail}, slots=3)
    worker.startService()
    cleanup.append(worker)
    yield wait_until(lambda: worker.registered, what="the worker's ACK")
    commands = [
        Cli("submit", "default", ADD, *ports(broker), "--wait", "20"),
        Cli("submit", "default", ADD, *ports(broker), "--no-reply", "--guarantee"),
        Cli("submit", "default", '["fail", {}]', *ports(broker), "--wait", "20"),
    ]
    cleanup.extend(commands)
    for command in commands:
        yield command.ended()
    value, dispatched, failed = commands
    assert (value.code, value.out, value.err) == (0, "3\n", "")
    assert (dispatched.code, dispatched.err) == (0, "")
    assert re.fullmatch(r'"[0-9a-f-]{36}"\n', dispatched.out)
    assert one_failure(failed) == (
        "emqp-cli submit: the worker's handler failed: ValueError: no such thing (handler-failed)"
    )
    command = yield ran(cleanup, "status", "--admin", broker.endpoints["admin"])
    assert (command.code, command.err) == (0, "")
    assert json.loads(command.out)["counters"]["requests"] == 3


@pytest_twisted.inlineCallbacks
def test_errors_the_broker_answers(tmp_path: Path, cleanup: list[Any]) -> Any:
    # The raw worker sends no heartbeats: at the default 3 s x 3 the broker would forget it
    # while the CLI starts on a busy machine, and the request would find no worker.
    broker = broker_in(tmp_path, cleanup, queue_limit=1, heartbeat_interval=60.0)
    waiting = RawClient(broker.endpoints["client"])
    cleanup.append(waiting)
    waiting.request("full", ADD)
    yield wait_until(lambda: broker.status()["waiting"] == 1, what="the queue full")
    command = yield ran(cleanup, "submit", "full", ADD, *ports(broker), "--wait", "20")
    assert one_failure(command) == (
        "emqp-cli submit: the broker refused the request: the buffer of queue 'full' is full"
        " (queue-full)"
    )
    worker = RawWorker(broker.endpoints["worker"])
    cleanup.append(worker)
    yield wait_until(worker.acked, what="the worker's ACK")
    worker.ready()
    args = ["submit", "default", ADD, *ports(broker), "--timeout", "1", "--wait", "20"]
    command = yield ran(cleanup, *args)
    assert worker.requests()  # it had the request, and said nothing
    assert one_failure(command) == (
        "emqp-cli submit: no reply came within the request's --timeout of 1 s (timeout)"
    )


@pytest_twisted.inlineCallbacks
def test_nothing_listening(cleanup: list[Any]) -> Any:
    port = free_ports(2)
    client, admin = f"tcp://127.0.0.1:{port}", f"tcp://127.0.0.1:{port + 1}"
    args = ["submit", "default", ADD, "--broker", client, "--admin", admin, "--wait", "1"]
    submitted = yield ran(cleanup, *args)
    assert one_failure(submitted) == (
        f"emqp-cli submit: nothing listens at {client}, and the admin port {admin} did not"
        " answer STATUS either; gave up after 1 s"
    )
    asked = yield ran(cleanup, "status", "--admin", admin, "--wait", "1")
    assert one_failure(asked) == f"emqp-cli status: nothing listens at {admin}; gave up after 1 s"


class _NotZeroMQ(protocol.Protocol):
    def connectionMade(self) -> None:
        assert self.transport is not None
        self.transport.write(b"HTTP/1.1 400 Bad Request\r\n\r\n")
        self.transport.loseConnection()


@pytest_twisted.inlineCallbacks
def test_ports_that_are_not_an_emqp_broker(tmp_path: Path, cleanup: list[Any]) -> Any:
    listening = reactor.listenTCP(  # type: ignore[attr-defined]
        0, protocol.Factory.forProtocol(_NotZeroMQ), interface="127.0.0.1"
    )
    try:
        http = f"tcp://127.0.0.1:{listening.getHost().port}"
        nowhere = f"tcp://127.0.0.1:{free_ports(1)}"
        asked = yield ran(cleanup, "status", "--admin", http, "--wait", "1")
        assert one_failure(asked) == (
            f"emqp-cli status: {http} is not an eMQP broker's admin port (it does not speak"
            " ZeroMQ); gave up after 1 s"
        )
        args = ["submit", "default", ADD, "--broker", http, "--admin", nowhere, "--wait", "1"]
        submitted = yield ran(cleanup, *args)
        assert one_failure(submitted) == (
            f"emqp-cli submit: {http} is not an eMQP broker's client port (it does not speak"
            f" ZeroMQ), and the admin port {nowhere} did not answer STATUS either;"
            " gave up after 1 s"
        )
    finally:
        yield listening.stopListening()
    # The broker's other ports, mistaken for the admin and the client port.
    broker = broker_in(tmp_path, cleanup)
    client, workers = broker.endpoints["client"], broker.endpoints["worker"]
    asked = yield ran(cleanup, "status", "--admin", client, "--wait", "1")
    assert one_failure(asked) == (
        f"emqp-cli status: {client} speaks ZeroMQ but did not answer STATUS (is it the"
        " broker's admin port?); gave up after 1 s"
    )
    args = ["submit", "default", ADD, "--broker", workers, "--admin", broker.endpoints["admin"]]
    submitted = yield ran(cleanup, *args, "--wait", "1")
    assert one_failure(submitted) == (
        f"emqp-cli submit: {workers} answered KBYE: it is an eMQP broker's worker port, not"
        " its client port"
    )


@pytest_twisted.inlineCallbacks
def test_bad_input_is_refused_before_anything_is_sent(cleanup: list[Any]) -> Any:
    port = free_ports(2)
    nowhere = ["--broker", f"127.0.0.1:{port}", "--admin", f"127.0.0.1:{port + 1}"]
    cases = [
        (["default", ADD, "--broker", "foo"], "the broker endpoint 'foo' is not valid: write"),
        (
            ["default", ADD, "--broker", "tcp://nohost.invalid:1"],
            "the broker endpoint 'tcp://nohost.invalid:1' is not valid: host 'nohost.invalid'"
            " cannot be resolved",
        ),
        (["default", ADD, "--broker", "bogus://x"], "the broker endpoint 'bogus://x' is not"),
        (["default", ADD, *nowhere, "--admin", "127.0.0.1:x"], "the admin endpoint"),
        (["default", "[1,", *nowhere], "the request body is not valid JSON"),
        (["", ADD, *nowhere], "the queue name '' is not valid (empty queue name)"),
        (["q" * 300, ADD, *nowhere], "the queue name 'qqq"),
        (["default", ADD, *nowhere, "--wait", "-1"], "--wait must be 0 (wait forever) or"),
        (["default", ADD, *nowhere, "--retries", "-1"], "--retries must be between 0 and"),
    ]
    commands = [Cli("submit", *args) for args, _ in cases]
    cleanup.extend(commands)
    for command in commands:
        yield command.ended()
    for command, (args, expected) in zip(commands, cases, strict=True):
        assert one_failure(command).startswith(f"emqp-cli submit: {expected}"), args


@pytest_twisted.inlineCallbacks
def test_ctrl_c_says_what_was_waited_for(tmp_path: Path, cleanup: list[Any]) -> Any:
    broker = broker_in(tmp_path, cleanup)
    command = Cli("submit", "default", ADD, *ports(broker), "--wait", "0")
    cleanup.append(command)
    # The request leaves once the CLI's reactor runs, so its SIGINT handler is in place.
    yield reported(lambda: broker.broker.requests == 1, command.process, what="the request")
    command.process.send_signal(signal.SIGINT)
    yield wait_until(command.finished, timeout=30, what="the CLI to stop")
    assert re.fullmatch(
        r"emqp-cli submit: interrupted after [0-9.]+ s, before the broker at"
        f" {re.escape(broker.endpoints['client'])} dispatched the request",
        one_failure(command, status=130),  # as shells give it for Ctrl-C
    )


@pytest_twisted.inlineCallbacks
def test_schedule_list_and_unschedule_through_the_admin_port(
    tmp_path: Path, cleanup: list[Any]
) -> Any:
    broker = broker_in(tmp_path, cleanup)
    seen: list[Any] = []
    worker = EmqpWorker(broker.endpoints["worker"], handlers={"tick": seen.append}, slots=2)
    worker.startService()
    cleanup.append(worker)
    admin = ["--admin", broker.endpoints["admin"]]
    added = yield ran(cleanup, "schedule", "default", '["tick", 7]', "--every", "1s", *admin)
    assert added.code == 0, added.err
    answer = json.loads(added.out)
    assert answer["replaced"] is False and answer["next_run_in"] == 0
    yield wait_until(lambda: len(seen) >= 2, timeout=10, what="two runs a second apart")
    assert seen[:2] == [7, 7]
    # One in eventmq's form too: the listing says what each runs.
    job = '["run", {"path": "os.path", "callable": "join", "args": ["a", "b"]}]'
    added = yield ran(cleanup, "schedule", "default", job, "--every", "1h", "--no-haste", *admin)
    assert added.code == 0, added.err
    eventmq = json.loads(added.out)["schedule"]
    listed = yield ran(cleanup, "schedules", *admin)
    assert listed.code == 0, listed.err
    entries = {entry["id"]: entry for entry in map(json.loads, listed.out.splitlines())}
    assert set(entries) == {answer["schedule"], eventmq}
    entry = entries[answer["schedule"]]
    assert entry["interval"] == 1.0
    assert (entry["path"], entry["callable"], entry["body"]) == (None, None, '["tick", 7]')
    entry = entries[eventmq]
    assert (entry["path"], entry["callable"], entry["body"]) == ("os.path", "join", None)
    removed = yield ran(cleanup, "unschedule", eventmq, *admin)
    assert removed.code == 0, removed.err
    removed = yield ran(cleanup, "unschedule", answer["schedule"], *admin)
    assert removed.code == 0 and json.loads(removed.out)["removed"] is True
    assert broker.broker.schedules is not None and len(broker.broker.schedules) == 0
    again = yield ran(cleanup, "unschedule", answer["schedule"], *admin)
    assert (
        one_failure(again)
        == f"emqp-cli unschedule: the broker keeps no schedule {answer['schedule']!r}"
    )
    bad = yield ran(cleanup, "schedule", "default", "1", "--cron", "every day", *admin)
    line = one_failure(bad)
    assert line.startswith("emqp-cli schedule: the broker refused the SCHEDULE: ")
    assert line.endswith("(bad-schedule)")
    neither = yield ran(cleanup, "schedule", "default", "1", *admin)
    assert "name one of --every" in one_failure(neither)
