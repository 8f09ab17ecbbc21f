"""ProductService: ordered start, reverse awaited stop, one-line start failures; the
in-process activity sink; /status and /metrics served for the composed services."""

from __future__ import annotations

import json
import socket
from pathlib import Path
from typing import Any

import msgpack
import pytest
import pytest_twisted
from twisted.application.service import Service
from twisted.internet import defer, reactor

from bus.application.composition import Composition, ProductService, StartFailed
from bus.errors import StartupError
from bus.testing import RawPeer, start_bus, wait_until
from tests.ports import free_port


class Recorder(Service):
    """Records when it starts and stops; its stop takes a while (a Deferred)."""

    def __init__(self, name: str, journal: list[str], fail: Exception | None = None) -> None:
        self.label = name
        self.journal = journal
        self.fail = fail
        self.stopping: defer.Deferred[None] | None = None

    def startService(self) -> None:
        if self.fail is not None:
            raise self.fail
        Service.startService(self)
        self.journal.append(f"start {self.label}")

    def stopService(self) -> defer.Deferred[None]:
        Service.stopService(self)
        self.journal.append(f"stopping {self.label}")
        self.stopping = defer.Deferred()
        self.stopping.addCallback(lambda _: self.journal.append(f"stopped {self.label}"))
        reactor.callLater(0.01, self.stopping.callback, None)
        return self.stopping


@pytest_twisted.inlineCallbacks
def test_services_start_in_order_and_stop_in_reverse_each_stop_awaited() -> Any:
    journal: list[str] = []
    product = ProductService()
    for name in ("a", "b", "c"):
        product.add(name, Recorder(name, journal))
    product.startService()
    yield product.when_started()
    assert journal == ["start a", "start b", "start c"]
    yield product.stopService()
    assert journal[3:] == [
        "stopping c",
        "stopped c",
        "stopping b",
        "stopped b",
        "stopping a",
        "stopped a",
    ]


@pytest_twisted.inlineCallbacks
def test_a_service_that_cannot_start_names_itself_its_option_and_the_cause() -> Any:
    journal: list[str] = []
    product = ProductService()
    product.add("a", Recorder("a", journal))
    busy = StartupError("port", "address already in use")
    product.add("b", Recorder("b", journal, fail=busy), "b-", {"port": 5556})
    product.add("c", Recorder("c", journal))
    product.startService()
    with pytest.raises(StartFailed) as failed:
        yield product.when_started()
    assert str(failed.value) == "cannot start b: --b-port 5556: address already in use"
    yield wait_until(lambda: "stopped a" in journal)
    assert "start c" not in journal


@pytest_twisted.inlineCallbacks
def test_a_service_may_start_asynchronously_and_the_next_waits_for_it() -> Any:
    journal: list[str] = []
    gate: defer.Deferred[None] = defer.Deferred()

    class Slow(Recorder):
        def startService(self) -> Any:  # type: ignore[override]
            Recorder.startService(self)
            return gate

    product = ProductService()
    product.add("slow", Slow("slow", journal))
    product.add("next", Recorder("next", journal))
    product.startService()
    assert journal == ["start slow"]
    gate.callback(None)
    yield product.when_started()
    assert journal == ["start slow", "start next"]
    yield product.stopService()


@pytest_twisted.inlineCallbacks
def test_other_services_publish_their_activity_into_the_bus_log(tmp_path: Path) -> Any:
    bus = start_bus(tmp_path / "bus")
    sub = RawPeer.sub(bus.endpoints["publisher"], (b"/emqp/",))
    try:
        composition = Composition()
        composition.local_bus = bus
        sink = composition.activity("emqp")
        yield wait_until(lambda: bus.connections().get("publisher") == 1, what="SUB connected")
        # A SUB's subscription reaches the PUB a moment after it connects: publish until seen.
        while not sub.messages:
            sink.publish("/emqp/job/queued/", {"queue": "default", "n": 0})
            yield wait_until(lambda: bus.accepted > 0)
            yield _pause(0.02)
        for n in range(1, 4):
            sink.publish("/emqp/job/queued/", {"queue": "default", "n": n})
        yield wait_until(lambda: sub.messages[-1:] and _value(sub.messages[-1])["n"] == 3)
        stored = bus.store.read(0, limit=100)
        assert [msgpack.unpackb(e.data)["n"] for e in stored][-4:] == [0, 1, 2, 3]
        assert {e.producer for e in stored} == {b"emqp"}
        assert [e.sequence for e in stored] == list(range(1, len(stored) + 1))
        assert bus.status()["accepted_local"] == len(stored)
        with pytest.raises(ValueError, match="cannot publish"):
            sink.publish("", {})
        with pytest.raises(ValueError, match="cannot publish"):
            sink.publish("/emqp/x/", object())
    finally:
        sub.close()
        yield bus.stopService()


def test_without_a_local_bus_activity_goes_nowhere() -> None:
    sink = Composition().activity("zre")
    sink.publish("/zre/peer/enter/", {"peer": "x"})  # accepted and dropped, no error


@pytest_twisted.inlineCallbacks
def test_status_and_metrics_over_http_match_what_was_published(tmp_path: Path) -> Any:
    from prometheus_client.parser import text_string_to_metric_families
    from twisted.web.client import Agent, readBody

    from bus.web.server import StatusWebService

    bus = start_bus(tmp_path / "bus")
    web = StatusWebService([("eventbus", bus)], free_port(), "127.0.0.1")
    web.startService()
    publisher = RawPeer.dealer(bus.endpoints["collector"])
    try:
        from bus.eventbus import codec

        for n in range(25):
            publisher.send(
                codec.pub_frames(
                    b"/orders/",
                    b"test",
                    codec.iso_timestamp(),
                    b"6f1c8c4e-8a8e-4e55-9a49-2b1d7b0c0c%02d" % n,
                    msgpack.packb(n),
                )
            )
        publisher.send([b"/orders/", b"garbage"])
        yield wait_until(lambda: bus.accepted == 25 and bus.drops.total == 1)
        agent = Agent(reactor)
        response = yield agent.request(b"GET", f"http://127.0.0.1:{web.port}/status".encode())
        status = json.loads((yield readBody(response)))
        assert status["services"]["eventbus"]["accepted"] == 25
        assert status["services"]["eventbus"]["clients"]["collector"] == 1
        response = yield agent.request(b"GET", f"http://127.0.0.1:{web.port}/metrics".encode())
        text = (yield readBody(response)).decode()
        samples = {
            (s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text)
            for s in family.samples
        }
        assert samples[("eventbus_events_accepted_total", ())] == 25
        assert samples[("eventbus_sequence", ())] == 25
        assert samples[("eventbus_messages_dropped_total", (("reason", "frame-count"),))] == 1
        assert samples[("eventbus_connections", (("socket", "collector"),))] == 1
        assert samples[("bus_service_up", (("service", "eventbus"),))] == 1
        assert samples[("eventbus_store_bytes", ())] > 0
        assert ("process_resident_memory_bytes", ()) in samples
    finally:
        publisher.close()
        yield web.stopService()
        yield bus.stopService()


def test_a_busy_http_port_is_a_startup_error_naming_the_option() -> None:
    from bus.web.server import StatusWebService

    holder = socket.socket()
    holder.bind(("127.0.0.1", 0))
    holder.listen()
    try:
        web = StatusWebService([], holder.getsockname()[1], "127.0.0.1")
        with pytest.raises(StartupError) as raised:
            web.startService()
        assert raised.value.option == "http-port"
        assert "in use" in raised.value.cause
    finally:
        holder.close()


def _value(frames: list[bytes]) -> Any:
    return msgpack.unpackb(frames[-1])


def _pause(seconds: float) -> defer.Deferred[None]:
    from twisted.internet import task

    return task.deferLater(reactor, seconds, lambda: None)
