"""What the NATS servers take, read from them and kept to: ``max_payload`` from INFO, the
command line's length asked of the server; a message that cannot fit refused by the
clients before it is sent (the connection stays); an event that cannot fit dropped at the
front-end's collector and counted, never sent. The property (hypothesis): against a real
nats-server with ``max_payload`` 64 KiB and a real front-end (``twistd -n eventbus
--store jetstream``), no input one publisher sends stops another's events from being
broadcast, nor pauses the collector, nor costs a NATS connection."""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Iterator
from typing import Any

import msgpack
import pytest
import pytest_twisted
import zmq
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from twisted.internet import reactor

from bus.eventbus import codec, subjects
from bus.eventbus.codec import HEARTBEAT_TOPIC, EventFields
from bus.eventbus.stream_core import StreamCore, largest_data
from bus.eventbus.stream_read import encoded_size
from bus.nats import jsapi
from bus.nats.blocking import Connection
from bus.nats.client import MessageTooLarge, NatsClient
from bus.nats.limits import longest_control_line
from bus.nats.publish import Publisher, TooLarge
from bus.testing import wait_until
from tests.eventbus_helpers import TIMESTAMP
from tests.ports import nats_cluster
from tests.processes import ServerProcess, wait_for

pytest.importorskip("nats")

SMALL_PAYLOAD = 64 * 1024


@pytest.fixture(scope="module")
def small(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A nats-server that takes messages of 64 KiB and command lines of 1,024 bytes."""
    server = nats_cluster(
        tmp_path_factory.mktemp("small"),
        size=1,
        extra=f"max_payload: {SMALL_PAYLOAD}\n",
    )
    # node_config sets max_control_line 65536 (long topics); this server reads less.
    for node in server.nodes:
        text = node.config.read_text().replace("max_control_line: 65536", "max_control_line: 1024")
        node.config.write_text(text)
    server.start()
    yield server.urls[0]
    server.stop()


# -- the clients ---------------------------------------------------------------------------


def test_the_command_line_a_server_reads_is_found_by_asking_it(
    small: str, nats_server: Any
) -> None:
    made: list[Connection] = []

    def connect(url: str) -> Connection:
        made.append(Connection([url], timeout=5))
        return made[-1]

    found = longest_control_line(lambda: connect(small), 20_000)
    assert 1024 - 16 <= found <= 1024
    # The cluster's usual config (tests/ports.py) reads 64 KiB: all that was asked fits,
    # on one connection.
    made.clear()
    assert longest_control_line(lambda: connect(nats_server.urls[0]), 20_000) == 20_000
    assert len(made) == 1
    assert all(connection.lame_duck is False for connection in made)


def test_a_batch_with_a_message_over_max_payload_is_refused_unsent_and_the_connection_stays(
    small: str,
) -> None:
    with Connection([small], timeout=5) as connection:
        assert connection.max_payload == SMALL_PAYLOAD
        answer = connection.request(
            f"{jsapi.API}.STREAM.CREATE.LIMITS",
            json.dumps({"name": "LIMITS", "subjects": ["limits.>"]}).encode(),
        )
        jsapi.answer(answer.payload)
        publisher = Publisher(connection)
        msg_id = b"m-" + uuid.uuid4().hex.encode()
        most = SMALL_PAYLOAD - jsapi.headers_most(msg_id)
        fits = (b"limits.a", msg_id, b"x" * most)
        over = (b"limits.b", b"n-" + uuid.uuid4().hex.encode(), b"x" * (most + 100))
        with pytest.raises(TooLarge) as refused:
            publisher.publish([fits, over, fits], timeout=5)
        assert refused.value.indexes == [1] and refused.value.limit == SMALL_PAYLOAD
        # Nothing was sent, and the connection is as good as it was.
        assert publisher.publish([fits], timeout=5) == [1]
        state = jsapi.answer(connection.request(jsapi.stream_info("LIMITS"), b"").payload)
        assert state["state"]["messages"] == 1


@pytest_twisted.inlineCallbacks
def test_the_reactor_client_refuses_a_message_over_max_payload_and_keeps_its_connection(
    small: str,
) -> Any:
    client = NatsClient(reactor, [small], name="limits")
    client.start()
    try:
        yield client.when_connected(timeout=10)
        assert client.max_payload == SMALL_PAYLOAD
        seen: list[bytes] = []
        client.subscribe("echo", lambda msg: client.publish(msg.reply, msg.payload))
        with pytest.raises(MessageTooLarge):
            client.publish(b"echo", b"x" * (SMALL_PAYLOAD + 1))
        with pytest.raises(MessageTooLarge):
            yield client.request(b"echo", b"x" * SMALL_PAYLOAD, headers=b"NATS/1.0\r\n\r\n")
        answer = yield client.request(b"echo", b"x" * SMALL_PAYLOAD)
        seen.append(answer.payload)
        assert seen == [b"x" * SMALL_PAYLOAD]
        assert client.disconnects == 0
    finally:
        client.stop()


# -- the front-end's rules ------------------------------------------------------------------


def event(topic: bytes, data_bytes: int, producer: bytes = b"p") -> EventFields:
    return (
        topic,
        producer,
        TIMESTAMP,
        str(uuid.uuid4()).encode(),
        msgpack.packb(b"x" * data_bytes),
    )


def core(max_message_bytes: int = SMALL_PAYLOAD) -> StreamCore:
    from twisted.logger import Logger

    return StreamCore(
        released=0,
        max_data_bytes=codec.DEFAULT_MAX_DATA_BYTES,
        clock=lambda: 0.0,
        logger=Logger(),
        max_message_bytes=max_message_bytes,
    )


@given(st.integers(0, 2 * SMALL_PAYLOAD), st.integers(0, codec.MAX_PRODUCER_BYTES))
@settings(max_examples=200, deadline=None)
def test_an_event_is_kept_exactly_when_its_message_fits(data_bytes: int, producer: int) -> None:
    taken = core()
    fields = event(b"/t/", data_bytes, b"p" * producer)
    taken.accept([fields])
    message = encoded_size(fields) + jsapi.headers_most(fields[3])
    assert bool(taken.pending) == (message <= SMALL_PAYLOAD)
    assert taken.drops.counts.get("too-large-for-stream", 0) == (message > SMALL_PAYLOAD)
    if len(fields[4]) <= largest_data(SMALL_PAYLOAD):
        assert taken.pending  # what "surely fits" does


def test_what_the_writer_finds_too_large_is_dropped_and_the_rest_goes_first() -> None:
    taken = core()
    batch = [event(b"/a/", 10), event(b"/b/", 10), event(b"/c/", 10)]
    taken.accept(batch)
    later = event(b"/d/", 10)
    assert taken.take_append() == batch
    taken.accept([later])
    taken.too_large([1], 1000)
    assert taken.max_message_bytes == 1000
    assert taken.drops.counts["too-large-for-stream"] == 1
    assert taken.take_append() == [batch[0], batch[2], later]


# -- the property, through a real front-end -------------------------------------------------


class FrontEnd:
    """A ``twistd -n eventbus --store jetstream`` process on the small server, and two
    publishers and a subscriber on it (blocking ZeroMQ sockets)."""

    def __init__(self, process: ServerProcess) -> None:
        self.process = process
        self.context = zmq.Context()
        address = process.address
        host, port = address.rsplit(":", 1)
        self.subscriber = self.context.socket(zmq.SUB)
        self.subscriber.setsockopt(zmq.SUBSCRIBE, b"")
        self.subscriber.connect(f"tcp://{host}:{int(port) + 1}")
        self.publishers = []
        for _ in range(2):
            dealer = self.context.socket(zmq.DEALER)
            dealer.setsockopt(zmq.LINGER, 0)
            dealer.connect(f"tcp://{host}:{int(port) + 2}")
            self.publishers.append(dealer)
        self.seen: set[bytes] = set()

    def send(self, publisher: int, fields: EventFields) -> None:
        topic, producer, timestamp, uuid_, data = fields
        self.publishers[publisher].send_multipart(
            [topic, b"\x00" * 8, producer, timestamp, uuid_, data]
        )

    def broadcast(self, wanted: set[bytes], within: float = 60.0) -> None:
        """Until each uuid of ``wanted`` was broadcast (heartbeats come every 0.1 s)."""
        poller = zmq.Poller()
        poller.register(self.subscriber, zmq.POLLIN)

        def arrived() -> bool:
            while poller.poll(100):
                frames = self.subscriber.recv_multipart()
                if frames[0] != HEARTBEAT_TOPIC and len(frames) >= 5:
                    self.seen.add(frames[4])
            return wanted <= self.seen

        wait_for(arrived, timeout=within, interval=0.0, what="events broadcast")

    def close(self) -> None:
        self.context.destroy(linger=0)


@pytest.fixture(scope="module")
def front_end(small: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[FrontEnd]:
    data = tmp_path_factory.mktemp("front-end") / "data"
    process = ServerProcess(data, "--store", "jetstream", "--nats", small)
    try:
        wait_for(process.ready, timeout=180, what="the front-end")
        wait_for(lambda: process.status().get("jetstream", {}).get("connected"), timeout=60)
        end = FrontEnd(process)

        def subscribed() -> bool:
            """A marker came back: the subscription reached the front-end."""
            marker = event(b"/marker/", 1)
            end.send(1, marker)
            try:
                end.broadcast({marker[3]}, 1.0)
            except AssertionError:
                return False
            return True

        wait_for(subscribed, timeout=60, interval=0.0, what="the subscription")
        yield end
        end.close()
    finally:
        process.stop()


topics = st.one_of(
    st.just(b"/orders/"),
    # Long topics, of letters (a byte a byte in the subject) or of bytes that need escapes
    # (three a byte): past the servers' command line of 1,024 bytes, some.
    st.integers(1, codec.MAX_TOPIC_BYTES - 2).map(lambda n: b"/" + b"a" * n + b"/"),
    st.integers(1, 1400).map(lambda n: b"/" + b"." * n + b"/"),
)
sizes = st.one_of(
    st.integers(0, 1000),
    st.integers(SMALL_PAYLOAD - 1500, SMALL_PAYLOAD + 1500),
    st.integers(SMALL_PAYLOAD, codec.DEFAULT_MAX_DATA_BYTES - 16),
)


@given(st.lists(st.tuples(topics, sizes, st.integers(1, codec.MAX_PRODUCER_BYTES)), max_size=8))
@settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
def test_no_publisher_can_stop_the_collector_for_another(
    front_end: FrontEnd, batch: list[tuple[bytes, int, int]]
) -> None:
    status = front_end.process.status()
    jetstream = status["jetstream"]
    most_subject, most_message = jetstream["max_subject_bytes"], jetstream["max_payload"]
    assert most_message == SMALL_PAYLOAD
    dropped_before = dict(status.get("dropped", {}))
    sent = [event(topic, size, b"p" * producer) for topic, size, producer in batch]
    for fields in sent:
        front_end.send(0, fields)
    other = event(b"/another/publisher/", 10)
    front_end.send(1, other)
    fitting = {
        fields[3]
        for fields in sent
        if len(subjects.subject("eventbus", fields[0])) <= most_subject
        and encoded_size(fields) + jsapi.headers_most(fields[3]) <= most_message
    }
    front_end.broadcast({other[3], *fitting})
    assert not ({fields[3] for fields in sent} - fitting) & front_end.seen

    def counted() -> int:
        dropped = front_end.process.status().get("dropped", {})
        return sum(dropped.get(k, 0) - dropped_before.get(k, 0) for k in dropped)

    # status.json is written every 0.1 s: the drops counted show in it a moment later.
    wait_for(lambda: counted() >= len(sent) - len(fitting), timeout=10, what="drops counted")
    after = front_end.process.status()
    assert counted() == len(sent) - len(fitting)
    assert after["jetstream"]["disconnects"] == 0
    assert after["storage_errors"] == status["storage_errors"] == 0
    assert not after["collector_paused"]


def test_the_front_end_said_at_start_what_the_servers_take(front_end: FrontEnd) -> None:
    log = front_end.process.output()
    assert f"NATS servers take messages of up to {SMALL_PAYLOAD} bytes" in log
    assert f"--max-event-size {codec.DEFAULT_MAX_DATA_BYTES} is more than the NATS" in log
    assert "too-large-for-stream" in log
    assert os.path.exists(front_end.process.status_path)


# -- eMQP's guaranteed requests -----------------------------------------------------------


@pytest_twisted.inlineCallbacks
def test_a_guaranteed_request_the_servers_cannot_take_is_refused_to_its_client_alone(
    small: str, tmp_path_factory: pytest.TempPathFactory, peers: list[Any]
) -> Any:
    from tests.emqp_helpers import RawClient, RawWorker
    from tests.processes import BrokerProcess, reported

    broker = BrokerProcess(
        tmp_path_factory.mktemp("broker") / "b",
        None,
        "--store", "jetstream", "--nats", small, "--heartbeat-interval", "10s",
    )  # fmt: skip
    try:
        yield reported(
            lambda: broker.ready() and (broker.status().get("jetstream") or {}).get("ready"),
            what="the broker",
        )
        worker = RawWorker(broker.endpoints["worker"])
        client = RawClient(broker.endpoints["client"])
        peers += [worker, client]
        yield wait_until(worker.acked, what="the worker's INFORM acknowledged")
        guaranteed = b"guarantee,reply-requested"
        large = client.request("default", "x" * SMALL_PAYLOAD, guaranteed)
        small_one = client.request("default", {"n": 1}, guaranteed)
        yield wait_until(lambda: client.results(large), what="the large one refused")
        [refused] = client.results(large)
        assert refused["error"] == "too-large-for-stream"
        worker.ready()
        yield wait_until(lambda: worker.requests(), timeout=30, what="the small one dispatched")
        assert [r[3] for r in worker.requests()] == [small_one]
        # status.json is written every 0.1 s.
        yield wait_until(lambda: broker.status()["jetstream"]["too_large"] == 1)
        status = broker.status()
        assert status["jetstream"]["disconnects"] == 0
        assert not status["jetstream"]["refusing"]
    finally:
        broker.stop()
    assert "--max-message-size 1048576 is more than the NATS servers take" in (
        broker.log_path.read_text()
    )


@settings(max_examples=200, deadline=None)
@given(
    st.tuples(
        st.binary(min_size=1, max_size=20),
        st.binary(max_size=300),
        st.binary(max_size=70),
        st.binary(max_size=40),
        st.binary(max_size=70_000),
    )
)
def test_the_kept_encoder_makes_the_bodies_encode_makes(fields: EventFields) -> None:
    from bus.eventbus.stream_read import Encoder, encode

    kept = Encoder()
    assert kept(fields) == encode(fields) == kept(fields)
    assert len(kept(fields)) == encoded_size(fields)
