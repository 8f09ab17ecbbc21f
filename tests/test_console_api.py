"""The console's API through real HTTP: the state, the stream (rates, back-pressure, a
limit, nothing running once the last console closed), the bounded topic tail of a real bus,
the bearer token; and its pieces (bounded lists, rate history) on their own, fuzzed where a
peer chooses the input."""

from __future__ import annotations

import json
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import pytest_twisted
from hypothesis import given, settings
from hypothesis import strategies as st
from twisted.application.service import Service
from twisted.internet import defer, protocol, reactor
from twisted.web.test.requesthelper import DummyRequest

from bus.eventbus import codec
from bus.eventbus.client import EventBusPublisher
from bus.testing import start_broker, start_bus, wait_until
from bus.web.console.history import RateHistory
from bus.web.console.tail import shown
from bus.web.console.view import bounded, counters
from bus.web.server import StatusWebService
from tests.test_http_security import get


class EventStream(protocol.Protocol):
    """A raw HTTP/1.0 client of a Server-Sent Events resource (no chunked encoding), which
    keeps every event it reads, or reads nothing at all when told so."""

    def __init__(self, path: str, token: str | None = None) -> None:
        self.path = path
        self.token = token
        self.head = b""
        self.body = b""
        self.events: list[tuple[str, Any]] = []
        self.closed = False

    def connectionMade(self) -> None:
        auth = f"Authorization: Bearer {self.token}\r\n" if self.token else ""
        self.transport.write(f"GET {self.path} HTTP/1.0\r\nHost: x\r\n{auth}\r\n".encode())

    def dataReceived(self, data: bytes) -> None:
        if not self.head:
            data = self.body + data
            if b"\r\n\r\n" not in data:
                self.body = data
                return
            self.head, _, data = data.partition(b"\r\n\r\n")
            self.body = b""
        self.body += data
        while b"\n\n" in self.body:
            block, _, self.body = self.body.partition(b"\n\n")
            fields = dict(
                line.split(": ", 1) for line in block.decode().splitlines() if ": " in line
            )
            if "event" in fields:
                self.events.append((fields["event"], json.loads(fields["data"])))

    def connectionLost(self, reason: Any = None) -> None:
        self.closed = True

    @property
    def status(self) -> int:
        return int(self.head.split(b" ")[1]) if self.head else 0

    def named(self, name: str) -> list[Any]:
        return [data for event, data in self.events if event == name]


@defer.inlineCallbacks
def open_stream(port: int, path: str, token: str | None = None) -> Any:
    client = EventStream(path, token)
    yield protocol.ClientCreator(reactor, lambda: client).connectTCP("127.0.0.1", port)
    return client


@pytest.fixture
def system(tmp_path: Path) -> Iterator[dict[str, Any]]:
    """A real bus and broker in this process, and the HTTP port showing them."""
    bus = start_bus(tmp_path / "bus")
    broker = start_broker(tmp_path / "emqp")
    web = StatusWebService(
        [("eventbus", bus), ("emqp", broker)],
        0,
        tail_source=lambda: bus,
    )
    web.startService()
    yield {"bus": bus, "broker": broker, "web": web}
    web.stopService()
    broker.stopService()
    bus.stopService()


@pytest_twisted.inlineCallbacks
def test_state_and_the_live_stream_with_rates(system: dict[str, Any]) -> Any:
    web, bus = system["web"], system["bus"]
    code, _, body = yield get(web.port, "/api/v1/state")
    assert code == 200
    state = json.loads(body)
    assert [s["name"] for s in state["services"]] == ["eventbus", "emqp"]
    assert all(s["running"] for s in state["services"])
    assert state["services"][0]["counters"]["events"] == 0
    assert "config" not in state["services"][0]["status"]  # /status has it

    client = yield open_stream(web.port, "/api/v1/stream")
    yield wait_until(lambda: client.named("state"), what="the first state")
    assert client.status == 200 and b"text/event-stream" in client.head
    # Nobody watched before: the history is the sample this console's opening took.
    assert [len(h) for h in client.named("history")] == [1]
    publisher = EventBusPublisher(f"127.0.0.1:{bus.port}", producer_id="console")
    try:
        for n in range(50):
            publisher.publish("/console/", n)
        yield publisher.flush()

        def peak_rate() -> float:
            # The samples the 50 events fall in have a rate; the next ones are 0.
            states = client.named("state")
            return max(float(s["services"][0]["rates"].get("events", 0)) for s in states)

        def last() -> Any:
            return client.named("state")[-1]["services"][0]

        # The bus may read the 50 in two turns with a sample between: the first sample with
        # a rate may count only some of them.
        yield wait_until(
            lambda: last()["counters"]["events"] == 50 and peak_rate() > 0,
            timeout=10,
            what="the 50 events counted, at a rate",
        )
        assert last()["uptime_s"] > 0
    finally:
        publisher.close()
    # A console opened later gets the minutes watched so far.
    second = yield open_stream(web.port, "/api/v1/stream")
    yield wait_until(lambda: second.named("history"))
    assert len(second.named("history")[0]) >= 2
    assert web.status()["console"]["streams"] == 2
    client.transport.loseConnection()
    second.transport.loseConnection()
    yield wait_until(lambda: web.console.streams.streams == set(), what="streams closed")
    assert web.console.streams._loop is None  # nothing ticks when no console is open


@pytest_twisted.inlineCallbacks
def test_the_tail_sends_its_subtree_at_most_twenty_a_second_and_says_what_it_skipped(
    system: dict[str, Any],
) -> Any:
    web, bus = system["web"], system["bus"]
    tail = yield open_stream(web.port, "/api/v1/tail?topic=/console/orders/")
    yield wait_until(lambda: tail.named("tail"), what="the tail opened")
    assert tail.named("tail") == [{"topic": "/console/orders/"}]
    assert web.console.tails.watching
    publisher = EventBusPublisher(f"127.0.0.1:{bus.port}", producer_id="console")
    try:
        for n in range(200):
            publisher.publish("/console/orders/" if n % 2 else "/console/users/", {"n": n})
        yield publisher.flush()
        yield wait_until(lambda: bus.store.last_sequence == 200)

        def accounted() -> int:
            return len(tail.named("event")) + sum(s["events"] for s in tail.named("skipped"))

        yield wait_until(lambda: accounted() == 100, timeout=10, what="every event accounted")
        assert web.console.tails.status()["watched"] == 200
    finally:
        publisher.close()
    shown_events = tail.named("event")
    assert 0 < len(shown_events) < 100  # bounded: the rest was counted as skipped
    assert all(e["topic"] == "/console/orders/" for e in shown_events)
    assert json.loads(shown_events[0]["value"])["n"] % 2 == 1
    sequences = [e["sequence"] for e in shown_events]
    assert sequences == sorted(sequences)
    tail.transport.loseConnection()
    yield wait_until(lambda: not web.console.tails.watching, what="the tail stopped watching")
    assert bus.watchers.watchers == []  # nothing left on the broadcast path


@pytest_twisted.inlineCallbacks
def test_tail_errors_and_the_limit_of_open_streams(tmp_path: Path) -> Any:
    web = StatusWebService([], 0)  # no Event BUS in this process
    web.startService()
    try:
        code, _, body = yield get(web.port, "/api/v1/tail?topic=/x/")
        assert code == 404 and json.loads(body)["error"] == "no Event BUS runs in this process"
        code, _, body = yield get(web.port, "/api/v1/tail?topic=nope")
        assert code == 400 and "subtree" in json.loads(body)["error"]
        assert web.console is not None
        web.console.streams.limit = 2
        first = yield open_stream(web.port, "/api/v1/stream")
        second = yield open_stream(web.port, "/api/v1/stream")
        yield wait_until(lambda: first.named("state") and second.named("state"))
        code, headers, body = yield get(web.port, "/api/v1/stream")
        assert code == 503 and json.loads(body)["error"] == "too many consoles are open"
        assert headers.getRawHeaders(b"retry-after") == [b"10"]
        assert web.status()["console"]["streams_refused"] == 1
        first.transport.loseConnection()
        second.transport.loseConnection()
        yield wait_until(lambda: first.closed and second.closed)
    finally:
        yield web.stopService()


@pytest_twisted.inlineCallbacks
def test_the_page_is_open_and_the_api_wants_the_token(tmp_path: Path) -> Any:
    token = tmp_path / "token"
    token.write_text("console-secret\n")
    web = StatusWebService([], 0, token_file=token)
    web.startService()
    try:
        code, headers, body = yield get(web.port, "/")
        assert code == 200 and b"<title>bus console</title>" in body
        assert headers.getRawHeaders(b"content-type") == [b"text/html; charset=utf-8"]
        (policy,) = headers.getRawHeaders(b"content-security-policy")
        assert b"default-src 'self'" in policy and b"frame-ancestors 'none'" in policy
        for name in ("console.js", "console.css"):
            assert (yield get(web.port, f"/static/{name}"))[0] == 200
        assert (yield get(web.port, "/static/nothing.js"))[0] == 404
        with warnings.catch_warnings():
            # Resource's own 404 is deprecated (it does not escape): raised, it would be a 500.
            warnings.filterwarnings("error", ".*NoResource", DeprecationWarning)
            assert (yield get(web.port, "/nothing", "console-secret"))[0] == 404
        assert (yield get(web.port, "/api/v1/state"))[0] == 401
        assert (yield get(web.port, "/api/v1/state", "console-secret"))[0] == 200
        refused = yield open_stream(web.port, "/api/v1/stream", "wrong")
        yield wait_until(lambda: refused.closed)
        assert refused.status == 401 and not refused.events
        allowed = yield open_stream(web.port, "/api/v1/stream", "console-secret")
        yield wait_until(lambda: allowed.named("state"))
        allowed.transport.loseConnection()
    finally:
        yield web.stopService()


# -- the pieces -----------------------------------------------------------------------------


def test_lists_and_mappings_are_cut_and_say_how_much() -> None:
    status = {
        "workers": [{"id": n} for n in range(120)],
        "queues": {f"q{n}": {"depth": n} for n in range(60)},
        "sequence": 7,
        "nested": {"list": list(range(55))},
    }
    cut = bounded(status, limit=50)
    assert len(cut["workers"]) == 50 and cut["workers_omitted"] == 70
    assert len(cut["queues"]) == 51 and cut["queues"]["_omitted"] == 10
    assert cut["sequence"] == 7
    assert cut["nested"]["list"] == list(range(50))


def test_counters_come_from_the_declared_paths_and_drops_are_summed() -> None:
    class Service:
        console_rates = {"jobs": "counters.replied", "missing": "nowhere.at.all"}

    found = counters(Service(), {"counters": {"replied": 5}, "dropped": {"a": 2, "b": 3}})  # type: ignore[arg-type]
    assert found == {"jobs": 5.0, "dropped": 5.0}


def test_rates_per_second_with_gaps_and_restarts() -> None:
    history = RateHistory(length=3)
    assert history.add(10.0, {"s": {"n": 100}}, gap_after=3)["rates"] == {}
    assert history.add(12.0, {"s": {"n": 150}}, gap_after=3)["rates"] == {"s": {"n": 25.0}}
    # A counter that went down (the service restarted) gives no rate that once.
    assert history.add(13.0, {"s": {"n": 4}}, gap_after=3)["rates"] == {"s": {}}
    # Nobody watched for a minute: no rate across the gap.
    assert history.add(80.0, {"s": {"n": 90}}, gap_after=3)["rates"] == {}
    assert [sample["t"] for sample in history.recent()] == [12.0, 13.0, 80.0]


@pytest_twisted.inlineCallbacks
def test_a_console_that_does_not_read_is_skipped_not_buffered(tmp_path: Path) -> Any:
    class Big(Service):
        """A service with a large status: half a megabyte per state frame."""

        def status(self) -> dict[str, Any]:
            return {"blob": "x" * 500_000}

    big = Big()
    big.startService()
    web = StatusWebService([("big", big)], 0)
    web.startService()
    try:
        assert web.console is not None
        web.console.streams.period = 0.02
        stuck = yield open_stream(web.port, "/api/v1/stream")
        yield wait_until(lambda: stuck.head, what="the stream's headers")
        stuck.transport.pauseProducing()  # reads nothing more: the kernel's buffers fill
        yield wait_until(lambda: web.console.streams.skipped > 0, timeout=30, what="a skip")
        (stream,) = web.console.streams.streams
        # twisted.web paused it: nothing piles up in the process. (It may resume a moment
        # when the kernel's buffers grow, and pause again: the client reads nothing.)
        yield wait_until(lambda: stream.paused, timeout=30, what="the stream paused")
        buffered = len(stream.request.channel.transport.dataBuffer)
        assert buffered < 2_000_000
        stuck.transport.resumeProducing()
        before = len(stuck.named("state"))
        yield wait_until(lambda: len(stuck.named("state")) > before + 3, timeout=30)
        assert web.status()["console"]["frames_skipped"] >= 1
        stuck.transport.loseConnection()
    finally:
        yield web.stopService()


@settings(max_examples=300, deadline=None)
@given(
    topic=st.binary(max_size=40),
    producer=st.binary(max_size=20),
    timestamp=st.binary(max_size=30),
    data=st.binary(max_size=300),
)
def test_any_event_a_publisher_sent_is_shown_without_an_error(
    topic: bytes, producer: bytes, timestamp: bytes, data: bytes
) -> None:
    event = codec.Event(topic, 1, producer, timestamp, b"u", data)
    described = shown(event)
    assert described["sequence"] == 1
    assert len(described["value"]) <= 2000 + 40
    json.dumps(described)  # what is sent is JSON


@settings(max_examples=200, deadline=None)
@given(query=st.binary(max_size=300))
def test_any_tail_query_gets_an_answer_never_an_error(query: bytes) -> None:
    from bus.web.console.api import Console

    console = Console([], reactor, 0.0, lambda: None)
    resource = console_tail(console)
    request = DummyRequest([b""])
    request.args = {b"topic": [query]}
    body = resource.render_GET(request)
    assert request.responseCode in (400, 404)
    assert "error" in json.loads(body)


def console_tail(console: Any) -> Any:
    from bus.web.console.api import _Tail

    return _Tail(console)
