"""The eMQP broker over CURVE through real sockets: each key's role says which ports it may
connect to (refused at the handshake otherwise), its queues which queues it may serve or use."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import pytest_twisted

from bus.emqp.client import EmqpClient, JobFailed, query_status
from bus.emqp.worker import EmqpWorker
from bus.testing import start_broker, wait_until
from bus.transport.certs import set_metadata
from bus.transport.curve import ClientCurve
from tests.curve_helpers import Keys


def echo(params: Any) -> Any:
    return params


@pytest.fixture
def broker(tmp_path: Path, keys: Keys, cleanup: list[Any]) -> Any:
    broker = start_broker(tmp_path / "emqp", curve=keys.settings())
    cleanup.append(broker)
    return broker


def worker(broker: Any, cleanup: list[Any], curve: Any, queues: Any) -> EmqpWorker:
    started = EmqpWorker(
        broker.endpoints["worker"], queues=queues, handlers={"echo": echo}, curve=curve
    )
    started.startService()
    cleanup.append(started)
    return started


def client(broker: Any, cleanup: list[Any], curve: Any, port: str = "client") -> EmqpClient:
    made = EmqpClient(broker.endpoints[port], curve=curve)
    cleanup.append(made)
    return made


def listed(broker: Any, count: int) -> Any:
    """Once the allow-list was re-read with ``count`` keys (a refused key stays refused)."""
    return wait_until(lambda: broker.curve.zap.allowed_keys == count, what=f"{count} keys")


@pytest_twisted.inlineCallbacks
def test_roles_and_queues_of_each_key(broker: Any, keys: Keys, cleanup: list[Any]) -> Any:
    worker_key = keys.curve("w", role="worker", queues="jobs")
    client_key = keys.curve("c", role="client", queues="jobs,other")
    any_key = keys.curve("any", role="client,admin")
    yield listed(broker, 3)
    serving = worker(broker, cleanup, worker_key, [(10, "jobs"), (10, "secrets")])
    yield wait_until(lambda: serving.registered, what="the worker's ACK")
    # Served for the queue its key allows only: "secrets" was refused, counted.
    assert broker.broker.drops.counts["forbidden-queue"] == 1
    assert [
        name for _, name in broker.broker.workers[next(iter(broker.broker.workers))].queues
    ] == [b"jobs"]
    user = client(broker, cleanup, client_key)
    result = yield user.submit("jobs", ["echo", {"n": 1}])
    assert result == {"n": 1}
    with pytest.raises(JobFailed) as failed:
        yield user.submit("secrets", ["echo", {}])
    assert failed.value.reason == "forbidden-queue"
    # A key without queues may use every queue.
    anyone = client(broker, cleanup, any_key)
    assert (yield anyone.submit("jobs", ["echo", 2])) == 2


@pytest_twisted.inlineCallbacks
def test_queues_are_checked_from_the_moment_a_certificate_names_them(
    broker: Any, keys: Keys, cleanup: list[Any]
) -> Any:
    pair = keys.client("c")  # no rights written: every queue
    yield listed(broker, 1)
    assert not broker._rights  # no certificate names queues: no message is looked up
    worker(broker, cleanup, keys.curve("w"), [(10, "jobs"), (10, "secrets")])
    user = client(broker, cleanup, ClientCurve(keys.server.public, pair))
    assert (yield user.submit("secrets", ["echo", 1])) == 1
    # The same key's certificate now names its queues: checked from the re-read on.
    set_metadata(keys.allowed / "c.key", {"queues": "jobs"})  # as bus-keys set does
    yield wait_until(lambda: broker._rights, what="the allow-list re-read")
    assert broker.client_socket.keep_user_ids
    assert (yield user.submit("jobs", ["echo", 2])) == 2
    with pytest.raises(JobFailed) as failed:
        yield user.submit("secrets", ["echo", 3])
    assert failed.value.reason == "forbidden-queue"


@pytest_twisted.inlineCallbacks
def test_a_worker_key_cannot_act_as_a_client_or_an_admin(
    broker: Any, keys: Keys, cleanup: list[Any]
) -> Any:
    worker_key = keys.curve("w", role="worker")
    admin = keys.curve("admin", role="admin")
    yield listed(broker, 2)
    impostor = client(broker, cleanup, worker_key)
    impostor.submit("jobs", ["echo", 1], reply=False)
    yield wait_until(
        lambda: broker.curve.refusals.get("role", 0) >= 1, what="the client port refusing it"
    )
    with pytest.raises(TimeoutError):
        yield query_status(broker.endpoints["admin"], timeout=0.5, curve=worker_key)
    assert broker.curve.refusals["role"] >= 2
    assert broker.broker.requests == 0
    answer = yield query_status(broker.endpoints["admin"], timeout=5, curve=admin)
    assert "queues" in answer
    status = broker.status()["curve"]
    assert status["security"] == "curve"
    assert status["refused"]["role"] >= 2


@pytest_twisted.inlineCallbacks
def test_unknown_and_plain_peers_are_refused_and_counted(
    broker: Any, keys: Keys, cleanup: list[Any]
) -> Any:
    stranger = client(broker, cleanup, keys.curve("s", allowed=False))
    plain = client(broker, cleanup, None)
    stranger.submit("jobs", ["echo", 1], reply=False)
    plain.submit("jobs", ["echo", 1], reply=False)
    yield wait_until(
        lambda: (
            broker.curve.refusals.get("unknown-key", 0) >= 1
            and broker.curve.refusals.get("handshake", 0) >= 1
        ),
        what="both refused",
    )
    assert broker.broker.requests == 0
    families = {f.name: f for f in broker.metrics()}
    assert families["emqp_curve"].samples[0].value == 1.0
