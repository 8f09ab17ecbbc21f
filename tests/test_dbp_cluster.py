"""DBP on the cluster: ``twistd -n dbp --nats URL`` instances sharing one catalog in a
JetStream key-value bucket, through real processes: Hermes' service and client (as the
interop tests speak them, tests/test_dbp_hermes.py) at one instance and another, an
instance killed (kill -9) while our service library heartbeats and clients ask, and an
instance cut from NATS that never answers from its stale view."""

from __future__ import annotations

import json
import signal
from pathlib import Path
from typing import Any

import pytest
import pytest_twisted

from bus.dbp import codec, shared
from bus.dbp.client import CatalogClient, ServiceRegistration
from bus.testing import wait_until
from tests.nats_proxy import NatsProxy
from tests.ports import free_ports, nats_cluster
from tests.processes import TWISTD, TwistdProcess, reported
from tests.test_dbp_hermes import hermes_registration, hermes_request
from tests.test_product_process import CLEAN_EXIT, environment


class Instance(TwistdProcess):
    """``twistd -n dbp --nats URL`` on a free port (its beacon off)."""

    def __init__(self, tmp_path: Path, name: str, nats: str, *more: str) -> None:
        self.port = free_ports(1)
        self.endpoint = f"tcp://127.0.0.1:{self.port}"
        super().__init__(
            [
                TWISTD, "-n", "--pidfile=", "dbp", "--bind", "127.0.0.1",
                "--port", str(self.port), "--beacon-port", "0",
                "--data-dir", str(tmp_path / f"{name}-data"), "--heartbeat-interval", "200ms",
                "--nats", nats, "--nats-refresh", "1s", "--hermes-services", "keep", *more,
            ],
            tmp_path / f"{name}.log",
            environment(),
            tmp_path,
        )  # fmt: skip

    def caught_up(self) -> bool:
        return "services in bucket DBP_CATALOG" in self.output()


@pytest.fixture
def nats(tmp_path: Path) -> Any:
    pytest.importorskip("nats")
    cluster = nats_cluster(tmp_path / "nats", size=1)
    cluster.start()
    yield cluster
    cluster.stop()


def listed(answer: list[bytes]) -> dict[str, Any]:
    """A Hermes client's reply (command, time, body) as the JSON it carries."""
    assert answer[0] == codec.INFO_REPLY
    return dict(json.loads(answer[2]))


@pytest_twisted.inlineCallbacks
def test_instances_share_one_catalog_and_clients_go_on_when_one_is_killed(
    tmp_path: Path, nats: Any
) -> Any:
    url = nats.urls[0]
    proxy = NatsProxy(int(url.rpartition(":")[2]))
    first = Instance(tmp_path, "first", url)
    second = Instance(tmp_path, "second", url)
    third = Instance(tmp_path, "third", proxy.url)
    instances = [first, second, third]
    service = client = None
    try:
        yield reported(
            lambda: all(i.caught_up() for i in instances),
            *(i.process for i in instances),
            what="three catalog instances on the bucket",
        )
        # Hermes' service registers at the first; Hermes' client asks the second.
        reply = yield hermes_request(first.endpoint, codec.REGISTER, hermes_registration("Rohan"))
        assert reply[0] == codec.APPROVED and len(reply[1]) == 4

        def rohan_at(instance: Instance) -> Any:
            return hermes_request(instance.endpoint, codec.INFO_REQUEST, b"Rohan").addCallback(
                lambda answer: "Rohan" in listed(answer)
            )

        for instance in (second, third):
            yield wait_until_true(lambda instance=instance: rohan_at(instance), "Rohan listed")
        # Its update (from yet another connection, as Hermes sends it) at the third.
        update = json.dumps({"name": "Rohan", "topics": ["horses"]}).encode()
        reply = yield hermes_request(third.endpoint, codec.UPDATE, update)
        assert reply[0] == codec.ACKNOWLEDGED

        def topics_at_second() -> Any:
            asked = hermes_request(second.endpoint, codec.INFO_REQUEST, b"Rohan")
            return asked.addCallback(lambda a: listed(a)["Rohan"].get("topics") == ["horses"])

        yield wait_until_true(topics_at_second, "the update at the second")

        # Our service library, given the first two: registers at the first, heartbeats.
        service = ServiceRegistration(
            [first.endpoint, second.endpoint],
            {"name": "sensor", "address": "127.0.0.1", "port": free_ports(1),
             "function": "temperature", "heartbeat": 0.2},
        )  # fmt: skip
        service.startService()
        yield service.registered
        assert service.catalog == first.endpoint
        client = CatalogClient(second.endpoint)
        yield wait_until_true(
            lambda: client.services("sensor").addCallback(lambda a: "sensor" in a), "sensor at 2"
        )
        # The first killed: the service moves to the second; every answer the second gives
        # meanwhile lists it active, and Rohan (kept) too.
        first.process.send_signal(signal.SIGKILL)
        first.process.wait(30)
        answers: list[dict[str, Any]] = []

        def moved() -> Any:
            def seen(answer: dict[str, Any]) -> bool:
                answers.append(answer)
                return service.moves >= 1 and service.state == "registered"

            return client.services().addCallback(seen)

        yield wait_until_true(moved, "the service at the second", timeout=60)
        assert service.catalog == second.endpoint
        for answer in answers:
            assert answer["sensor"]["active"] is True, answer
            assert answer["Rohan"]["active"] is True, answer
        # A few heartbeats later, held at the second: still active, beaten by it.
        ticks = service.ticks
        yield wait_until(lambda: service.ticks >= ticks + 10, what="ten service ticks")
        answer = yield client.services("sensor")
        assert answer["sensor"]["active"] is True
        assert service.last_catalog_any > 0 and service.state == "registered"

        # The third cut from NATS: it stops answering from its view (an Error that says so),
        # never from a stale one; a service registered meanwhile at the second is there
        # once the link is back.
        proxy.cut = True

        def refused_at_third() -> Any:
            asked = hermes_request(third.endpoint, codec.INFO_REQUEST, b"")
            return asked.addCallback(lambda a: listed(a).get("Error") == shared.NOT_CURRENT)

        yield wait_until_true(refused_at_third, "the third to refuse", timeout=60)
        reply = yield hermes_request(second.endpoint, codec.REGISTER, hermes_registration("Gondor"))
        assert reply[0] == codec.APPROVED
        answer = yield hermes_request(third.endpoint, codec.INFO_REQUEST, b"")
        assert listed(answer).get("unavailable") is True
        proxy.cut = False
        after: list[dict[str, Any]] = []

        def gondor_at_third() -> Any:
            asked = hermes_request(third.endpoint, codec.INFO_REQUEST, b"")

            def seen(answer: list[bytes]) -> bool:
                after.append(listed(answer))
                return "Gondor" in after[-1]

            return asked.addCallback(seen)

        yield wait_until_true(gondor_at_third, "Gondor at the third after the heal", timeout=90)
        for said in after:  # never a list without Gondor: refused until current
            assert "Gondor" in said or said.get("Error") == shared.NOT_CURRENT, said
    finally:
        if service is not None:
            yield service.stopService()
        if client is not None:
            client.close()
        codes = [instance.stop() for instance in instances]
        yield proxy.close()
    assert codes[0] == -signal.SIGKILL
    assert all(code in CLEAN_EXIT for code in codes[1:]), [i.output() for i in instances]
    for instance in instances:
        assert "Traceback" not in instance.output()
    assert "not in touch with the shared catalog" in third.output()


@pytest_twisted.inlineCallbacks
def wait_until_true(ask: Any, what: str, timeout: float = 30.0) -> Any:
    """Ask (a Deferred of a bool) again until it says True."""
    from twisted.internet import reactor
    from twisted.internet.task import deferLater

    deadline = reactor.seconds() + timeout  # type: ignore[attr-defined]
    while True:
        if (yield ask()):
            return
        if reactor.seconds() > deadline:  # type: ignore[attr-defined]
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        yield deferLater(reactor, 0.1, lambda: None)
