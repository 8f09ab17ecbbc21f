"""The eMQP broker as operators run it: ``twistd -n emqp`` killed with -9 and restarted,
composed into ``twistd -n eventbus``, and ``emqp-cli``."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import msgpack
import pytest_twisted
from twisted.internet import defer

from bus.emqp import codec
from bus.emqp.client import EmqpClient
from bus.emqp.worker import EmqpWorker
from bus.eventbus.codec import HEARTBEAT_TOPIC
from bus.testing import RawPeer, wait_until
from tests.emqp_helpers import RawWorker
from tests.processes import BrokerProcess, reported
from tests.test_product_process import Product, environment, metric_samples

TWISTD = str(Path(sys.executable).with_name("twistd"))
CLI = str(Path(sys.executable).with_name("emqp-cli"))
CLEAN_EXIT = (0, -signal.SIGTERM)


def add(params: dict[str, int]) -> int:
    return params["a"] + params["b"]


def handed_back(status: dict[str, Any], replied: int) -> bool:
    """The broker replied ``replied`` times and no free memory waits to be handed back."""
    done = status.get("counters", {}).get("replied") == replied
    return done and status.get("memory_release_pending") is False


@pytest_twisted.inlineCallbacks
def test_kill_9_loses_no_guaranteed_request(tmp_path: Path) -> Any:
    data = tmp_path / "emqp"
    # Its ports kept: the restart binds them again. The stuck raw worker never heartbeats:
    # at BrokerProcess's 0.2 s x 3 the broker forgot it 0.6 s after its READY (its request
    # back in the queue: 20 waiting, never 19) unless the test was quicker than that.
    broker = BrokerProcess(data, None, "--heartbeat-interval", "60s")
    restarted = client = worker = stuck = None
    try:
        yield reported(broker.ready, what="the broker")
        endpoints, ports = broker.endpoints, broker.ports()
        stuck = RawWorker(endpoints["worker"])  # takes one request and never answers
        yield wait_until(stuck.acked, what="ACK")
        stuck.ready()
        client = EmqpClient(endpoints["client"])
        results = [
            client.submit("default", ["add", {"a": i, "b": 100}], guarantee=True) for i in range(20)
        ]
        yield wait_until(lambda: stuck.requests(), what="one request in flight")
        yield wait_until(
            lambda: broker.status().get("stored") == 20 and broker.status().get("waiting") == 19,
            what="all 20 stored, 19 waiting for a worker",
        )
        assert broker.stop(signal.SIGKILL) == -signal.SIGKILL
        stuck.close()
        restarted = BrokerProcess(data, ports)
        yield reported(restarted.ready, what="the broker again")
        assert restarted.status()["counters"]["restored"] == 20
        assert restarted.status()["stored"] == 20
        # Our client's socket reconnects by itself, with the same identity.
        worker = EmqpWorker(
            endpoints["worker"], slots=4, handlers={"add": add}, heartbeat_interval=0.2
        )
        worker.startService()
        values = yield defer.gatherResults(results)
        assert values == [i + 100 for i in range(20)]
        yield wait_until(lambda: restarted.status().get("stored") == 0, what="the store emptied")
        status = restarted.status()
        assert status["counters"]["workers_lost"] == 0 and status["dropped"] == {}
        assert status["client_send_failures"] == 0
    finally:
        for thing in (client, stuck):
            if thing is not None:
                thing.close()
        if worker is not None:
            yield worker.stopService()
        if broker.process.poll() is None:
            broker.stop()
        if restarted is not None:
            assert restarted.stop() in CLEAN_EXIT, restarted.log_path.read_text()
    assert "eMQP broker stopped" in restarted.log_path.read_text()


@pytest_twisted.inlineCallbacks
def test_our_worker_informs_again_after_a_kill_9_of_the_broker(tmp_path: Path) -> Any:
    data = tmp_path / "emqp"
    broker = BrokerProcess(data)  # its ports kept: the restart binds them again
    restarted = client = worker = None
    try:
        yield reported(broker.ready, what="the broker")
        endpoints, ports = broker.endpoints, broker.ports()
        worker = EmqpWorker(endpoints["worker"], handlers={"add": add}, heartbeat_interval=0.2)
        worker.startService()
        yield wait_until(lambda: worker.registered, what="the worker's ACK")
        assert broker.stop(signal.SIGKILL) == -signal.SIGKILL  # no KBYE: it just vanishes
        restarted = BrokerProcess(data, ports)
        yield reported(restarted.ready, what="the broker again")
        # The new broker answers the worker's HEARTBEAT with KBYE (or the worker notices
        # the silence); either way it INFORMs again and serves.
        yield wait_until(lambda: worker.informs >= 2 and worker.registered, what="re-INFORM")
        client = EmqpClient(endpoints["client"])
        assert (yield client.submit("default", ["add", {"a": 5, "b": 6}])) == 11
    finally:
        if client is not None:
            client.close()
        if worker is not None:
            yield worker.stopService()
        if broker.process.poll() is None:
            broker.stop()
        if restarted is not None:
            assert restarted.stop() in CLEAN_EXIT, restarted.log_path.read_text()


@pytest_twisted.inlineCallbacks
def test_composed_into_the_product_its_job_life_is_on_the_bus(tmp_path: Path) -> Any:
    product = Product(
        tmp_path, "--port", "0", "--data-dir", "bus-data", "--emqp-data-dir", "emqp-data",
        "--services", "eventbus,emqp", env=environment(),
    )  # fmt: skip
    subscriber = client = worker = None
    try:
        yield reported(product.ready, what="the product")
        status = product.status()["services"]
        assert set(status) == {"eventbus", "emqp", "http"}
        emqp = status["emqp"]["endpoints"]
        subscriber = RawPeer.sub(
            status["eventbus"]["endpoints"]["publisher"], (b"/emqp/", HEARTBEAT_TOPIC)
        )
        # A heartbeat first: the subscription is in place before the worker joins (a SUB
        # that connects late misses what was published before, a loaded machine's race).
        yield wait_until(
            lambda: any(m[0] == HEARTBEAT_TOPIC for m in subscriber.messages),
            what="a heartbeat",
        )
        worker = EmqpWorker(emqp["worker"], handlers={"add": add})
        worker.startService()
        yield wait_until(
            lambda: any(m[0] == b"/emqp/worker/joined/" for m in subscriber.messages),
            what="/emqp/worker/joined/ on the bus",
        )
        client = EmqpClient(emqp["client"])
        assert (yield client.submit("default", ["add", {"a": 1, "b": 2}], guarantee=True)) == 3
        yield wait_until(
            lambda: any(m[0] == b"/emqp/job/replied/" for m in subscriber.messages),
            what="the job's life on the bus",
        )
        life = [m for m in subscriber.messages if m[0] != HEARTBEAT_TOPIC]
        topics = [m[0] for m in life]
        assert topics == [
            b"/emqp/worker/joined/", b"/emqp/job/queued/", b"/emqp/job/dispatched/",
            b"/emqp/job/replied/",
        ]  # fmt: skip
        queued = msgpack.unpackb(life[1][-1])
        assert queued["queue"] == "default" and queued["guaranteed"] is True
        samples = metric_samples(product.get("/metrics"))
        assert samples["emqp_replied_total"] == 1
        assert samples["emqp_workers"] == 1
        assert samples["bus_service_up{service=emqp}"] == 1
        assert (tmp_path / "emqp-data" / "emqp.sqlite3").exists()
    finally:
        for thing in (client, subscriber):
            if thing is not None:
                thing.close()
        if worker is not None:
            yield worker.stopService()
        code = product.stop()
    assert code in CLEAN_EXIT, product.output()


def run_cli(*args: str) -> subprocess.Popen[str]:
    return subprocess.Popen([CLI, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


@pytest_twisted.inlineCallbacks
def test_emqp_cli_submit_and_status(tmp_path: Path) -> Any:
    broker = BrokerProcess(tmp_path / "emqp")
    worker = None
    try:
        yield reported(broker.ready, what="the broker")
        endpoints = broker.endpoints
        worker = EmqpWorker(
            endpoints["worker"], slots=2, handlers={"add": add}, heartbeat_interval=0.2
        )
        worker.startService()
        yield wait_until(lambda: worker.registered)
        # The CLI runs its own reactor in a child; ours keeps serving the worker meanwhile.
        submit = run_cli(
            "submit", "default", '["add", {"a": 40, "b": 2}]', "--broker", endpoints["client"],
            "--guarantee", "--retries", "1", "--timeout", "30", "--wait", "30",
        )  # fmt: skip
        yield wait_until(lambda: submit.poll() is not None, timeout=60, what="emqp-cli submit")
        out, err = submit.communicate()
        assert submit.returncode == 0, err
        assert json.loads(out) == 42
        nobody = run_cli(
            "submit", "nobody", "1", "--broker", endpoints["client"], "--timeout", "1",
            "--wait", "1", "--admin", endpoints["admin"],
        )  # fmt: skip
        yield wait_until(lambda: nobody.poll() is not None, timeout=60, what="a failing submit")
        out, err = nobody.communicate()
        assert nobody.returncode == 1 and "no worker serves queue 'nobody'" in err
        status = run_cli("status", "--admin", endpoints["admin"])
        yield wait_until(lambda: status.poll() is not None, timeout=60, what="emqp-cli status")
        out, err = status.communicate()
        assert status.returncode == 0, err
        answer = json.loads(out)
        assert answer["counters"]["replied"] == 1
        assert answer["queues"]["nobody"]["depth"] == 1
        assert answer["workers"][0]["queues"] == [[10, "default"]]
    finally:
        if worker is not None:
            yield worker.stopService()
        assert broker.stop() in CLEAN_EXIT, broker.log_path.read_text()


def test_a_busy_port_stops_the_product_with_one_line_naming_the_emqp_option(
    tmp_path: Path,
) -> None:
    import socket

    holder = socket.socket()
    holder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    holder.bind(("127.0.0.1", 0))
    holder.listen()
    port = holder.getsockname()[1]
    try:
        run = subprocess.run(
            [
                TWISTD, "-n", "--pidfile=", "eventbus", "--port", "0", "--http-port", "0",
                "--data-dir", str(tmp_path / "bus"), "--emqp-admin-port", str(port),
            ],
            capture_output=True, text=True, cwd=tmp_path, env=environment(), timeout=60,
        )  # fmt: skip
    finally:
        holder.close()
    output = run.stdout + run.stderr
    assert run.returncode == 1, output
    [line] = [line for line in output.splitlines() if "cannot start" in line]
    assert f"cannot start emqp: --emqp-admin-port {port}: cannot bind" in line
    assert "in use" in line and "Traceback" not in output


@pytest_twisted.inlineCallbacks
def test_a_client_that_never_reads_costs_bounded_memory_given_back_when_it_goes(
    tmp_path: Path,
) -> Any:
    import psutil
    import zmq

    broker = BrokerProcess(
        # 100 kB answers: libzmq's own queue per client kept to 100 of them (the default
        # 1000 would let it hold 100 MB; docs/emqp.md, "Clients that do not read").
        tmp_path / "emqp", None, "--client-queue-bytes", "8MiB", "--client-hwm", "100",
        "--reply-linger", "1s",
        "--heartbeat-interval", "60s",  # the raw worker does not heartbeat
    )  # fmt: skip
    context = zmq.Context()
    worker = None
    try:
        yield reported(broker.ready, what="the broker")
        rss = psutil.Process(broker.process.pid).memory_info
        worker = RawWorker(broker.endpoints["worker"])
        yield wait_until(worker.acked, what="ACK")
        worker.ready(2000)
        # A client that sends and never reads (its own queue kept tiny, so that what it
        # does not read stays on the broker's side).
        client = context.socket(zmq.DEALER)
        client.set(zmq.RCVHWM, 10)
        client.set(zmq.LINGER, 0)
        client.connect(broker.endpoints["client"])
        for _ in range(2000):
            client.send_multipart(codec.request("default", b"1", b"reply-requested"))
        yield wait_until(lambda: len(worker.requests()) == 2000, timeout=60, what="dispatched")
        before = rss().rss
        value = "x" * 100_000
        for request in worker.requests():
            worker.reply(request, value)
        # The broker has read every answer and handed back the memory of those it dropped.
        # Measured before that, the RSS depends on scheduling: libzmq's I/O thread reads
        # the worker's answers ahead into the worker port's queue (up to --hwm messages)
        # as fast as they come, and they are freed only as the broker takes and drops
        # them, into an arena glibc keeps until it is trimmed. On a busy machine the
        # broker's thread lagged its I/O thread by 60-190 MB of answers (CI: "grew by
        # 78 MiB", "by 105 MiB", where nothing but the client's bound was held).
        yield wait_until(
            lambda: handed_back(broker.status(), replied=2000),
            timeout=60,
            what="2000 replies of 100 kB, the memory of the dropped ones handed back",
        )
        status = broker.status()
        grown = rss().rss - before
        # 200 MB of answers: what waits for the client is bounded (8 MiB in its outbox,
        # 100 messages in libzmq's pipe, the kernel's socket buffer), the rest dropped.
        answer = len(json.dumps({"value": value})) + 64  # its frames, about
        bound = 8 * 2**20 + 100 * answer + 10 * 2**20  # and the interpreter's own slack
        assert grown < bound, f"grew by {grown / 2**20:.0f} MiB (bound {bound / 2**20:.0f})"
        assert status["answers_held_bytes"] <= 8 * 2**20
        assert status["answers_dropped"]["queue-full"] > 1000
        client.close()
        yield wait_until(
            lambda: broker.status().get("answers_held") == 0, timeout=30, what="dropped, gone"
        )
        yield wait_until(
            lambda: rss().rss - before < 25 * 2**20, timeout=30, what="memory given back"
        )
    finally:
        if worker is not None:
            worker.close()
        context.destroy(linger=0)  # closes the client too, if an assertion left it open
        assert broker.stop() in CLEAN_EXIT, broker.log_path.read_text()
