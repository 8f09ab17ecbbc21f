"""eventmq's PUBLISH service (``emq-pubsub``) served by eMQP, through real sockets.

eventmq's own ``send_publish_request`` (run by the interop interpreter, see
tests/test_emqp_interop.py) publishes to our service and, for comparison, to eventmq's own
``emq-pubsub`` process; a plain pyzmq SUB reads the outgoing port of each, with prefix
subscriptions. Both must deliver the same frames."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
import pytest_twisted
import zmq

from bus.emqp import pubsub_codec
from bus.emqp.codec import EmqpError
from bus.emqp.pubsub_core import PubsubConfig, Relay
from bus.emqp.pubsub_server import PubsubService
from bus.testing import RawPeer, wait_until
from bus.util.polling import ConditionTimeout
from tests.curve_helpers import Keys
from tests.ports import free_ports
from tests.test_emqp_interop import SENT_LINGER, InteropProcess

#: What the publisher sends, in order: the last one is on a subscribed topic, so once it
#: arrived everything before it has (one PUB, one connection: in order).
PUBLICATIONS: list[list[Any]] = [
    ["orders.created", {"id": 1}],
    ["weather", {"celsius": 20}],
    ["orders", [1, "two", None]],
    ["news.orders", "not a prefix match"],
    ["ordersx", "prefix match"],
    ["", "the empty topic"],
    ["orders.shipped", {"id": 1, "to": "Zürich"}],
]
SUBSCRIBED = (b"orders",)
#: What a SUB of "orders" receives: [topic, the JSON eventmq's client made of the value].
EXPECTED = [
    [topic.encode(), json.dumps(value).encode()]
    for topic, value in PUBLICATIONS
    if topic.startswith("orders")
]


@pytest.fixture
def interop() -> Iterator[list[InteropProcess]]:
    started: list[InteropProcess] = []
    yield started
    for process in started:
        process.stop()


class PlainSubscriber:
    """A plain pyzmq SUB (no txzmq, no bus code), read without blocking."""

    def __init__(self, endpoint: str, prefixes: tuple[bytes, ...]) -> None:
        self.context = zmq.Context()
        self.socket = self.context.socket(zmq.SUB)
        self.socket.linger = 0
        for prefix in prefixes:
            self.socket.subscribe(prefix)
        self.socket.connect(endpoint)
        self.received: list[list[bytes]] = []

    def read(self) -> list[list[bytes]]:
        while True:
            try:
                self.received.append(self.socket.recv_multipart(zmq.NOBLOCK))
            except zmq.Again:
                return self.received

    def close(self) -> None:
        self.socket.close()
        self.context.term()


@pytest_twisted.inlineCallbacks
def publish_with_eventmq(
    incoming: str,
    outgoing: str,
    tmp_path: Path,
    interop: list[InteropProcess],
    name: str,
    joined: Sequence[PlainSubscriber] = (),
    explain: Callable[[], str] | None = None,
) -> Any:
    """eventmq's ``send_publish_request`` of :data:`PUBLICATIONS` to ``incoming``; what a
    plain SUB of ``orders`` read on ``outgoing`` (the sync publications left out). The
    publications start once that SUB, and each of ``joined`` (SUBs of ``sync`` elsewhere),
    had a sync publication."""
    subscriber = PlainSubscriber(outgoing, (*SUBSCRIBED, b"sync"))
    try:
        ready = tmp_path / f"{name}.ready"
        publisher = InteropProcess(
            "publish.py", incoming, str(ready), json.dumps(PUBLICATIONS),
            log=tmp_path / f"{name}-publisher.log",
        )  # fmt: skip
        interop.append(publisher)
        for sub in (subscriber, *joined):
            yield wait_until(
                lambda sub=sub: any(m[0] == b"sync" for m in sub.read()),
                timeout=60,
                what=f"a sync publication through {name}",
            )
        ready.touch()
        yield publisher.ended(SENT_LINGER, "eventmq's publisher to finish")
        assert publisher.process.returncode == 0, publisher.log_path.read_text()

        def published() -> list[list[bytes]]:
            return [m for m in subscriber.read() if m[0] != b"sync"]

        try:
            yield wait_until(
                lambda: len(published()) >= len(EXPECTED), timeout=30, what="the publications"
            )
        except ConditionTimeout:
            got = published()
            missing = [m[0].decode() for m in EXPECTED if m not in got]
            raise AssertionError(
                f"{len(got)} of {len(EXPECTED)} publications through {name} in 30 s, missing "
                f"{missing}; the publisher said: {publisher.log_path.read_text()[-2000:]}"
                + (f"; {explain()}" if explain is not None else "")
            ) from None
        return published()
    finally:
        subscriber.close()


def start_pubsub(activity: Any = None, **settings: Any) -> PubsubService:
    config = PubsubConfig(incoming_port=0, outgoing_port=0, stats_interval=0, **settings)
    service = (
        PubsubService(config) if activity is None else PubsubService(config, activity=activity)
    )
    service.startService()
    return service


@pytest_twisted.inlineCallbacks
def test_eventmq_publishes_through_our_service_as_through_its_own(
    tmp_path: Path, interop: list[InteropProcess], cleanup: list[Any]
) -> Any:
    service = start_pubsub()
    cleanup.append(service)
    ours = yield publish_with_eventmq(
        service.endpoints["incoming"], service.endpoints["outgoing"], tmp_path, interop, "ours"
    )
    assert ours == EXPECTED
    status = service.status()
    syncs = status["topics"]["sync"]
    assert status["published"] == status["received"] == syncs + len(PUBLICATIONS)
    assert status["dropped"] == {}
    assert status["topics"]["weather"] == 1

    # eventmq's own emq-pubsub, given the same publications by the same client code.
    port = free_ports(2)
    incoming, outgoing = f"tcp://127.0.0.1:{port}", f"tcp://127.0.0.1:{port + 1}"
    original = InteropProcess("pubsub.py", incoming, outgoing, log=tmp_path / "emq-pubsub.log")
    interop.append(original)
    theirs = yield publish_with_eventmq(incoming, outgoing, tmp_path, interop, "eventmq")
    assert not original.finished(), original.log_path.read_text()
    assert theirs == ours


@pytest_twisted.inlineCallbacks
def test_bad_messages_are_counted_and_logged_and_serving_goes_on(
    cleanup: list[Any], peers: list[Any]
) -> Any:
    from twisted.logger import globalLogPublisher

    lines: list[str] = []

    def observe(event: dict[str, Any]) -> None:
        if event.get("log_namespace") == "bus.emqp.pubsub":
            from twisted.logger import formatEvent

            lines.append(formatEvent(event))

    globalLogPublisher.addObserver(observe)
    service = start_pubsub()
    cleanup.append(service)
    subscriber = RawPeer.sub(service.endpoints["outgoing"], (b"",))
    publisher = RawPeer.dealer(service.endpoints["incoming"])
    peers += [subscriber, publisher]
    try:
        # Publish until the SUB has joined (no slow-joiner loss), then the garbage. Counted
        # as sent: one may still be on its way to the service when the SUB has an earlier one.
        warm = 0
        while not subscriber.messages:
            publisher.send(pubsub_codec.publish(b"warm", b"1", b"w"))
            warm += 1
            yield wait_until(lambda: subscriber.messages, timeout=0.2, what="").addErrback(
                lambda _: None
            )
        garbage = [
            [b"PUBLISH"],
            [b"", b"eMQP/1.0", b"PUBLISH", b"m1", b"only a topic"],
            [b"", b"eMQP/1.0", b"PUBLISH", b"m2", b"t", b"x", b"extra"],
            [b"", b"eMQP/0.9", b"PUBLISH", b"m3", b"t", b"x"],
            [b"x", b"eMQP/1.0", b"PUBLISH", b"m4", b"t", b"x"],
            [b"", b"eMQP/1.0", b"PUBLISH", b"m5", b"\xff\xfe", b"x"],
            [b"", b"eMQP/1.0", b"PUBLISH", b"m6", b"t", b"\xc3"],
            [b"", b"eMQP/1.0", b"PUBLISH", b"", b"t", b"x"],
            [b"", b"eMQP/1.0", b"REQUEST", b"m7", b"default", b"", b"{}"],
        ]
        for frames in garbage:
            publisher.send(frames)
        publisher.send([b"", b"eMQP/1.0", b"HEARTBEAT", b"h", b"1.5"])
        publisher.send(pubsub_codec.publish(b"after", b'"still serving"', b"m8"))
        yield wait_until(lambda: subscriber.messages[-1][0] == b"after", what="the last one")
    finally:
        globalLogPublisher.removeObserver(observe)
    assert subscriber.messages[-1] == [b"after", b'"still serving"']
    status = service.status()
    assert status["dropped"] == {
        "truncated": 2, "extra-frames": 1, "bad-protocol": 1, "bad-delimiter": 1,
        "not-utf8": 2, "bad-msgid": 1, "unknown-command": 1,
    }  # fmt: skip
    assert status["heartbeats"] == 1
    assert status["published"] == warm + 1
    assert any("dropped 1 bad publisher messages (not-utf8)" in line for line in lines), lines
    samples = {m.name: m for m in service.metrics()}
    dropped = samples["emqp_pubsub_messages_dropped"].samples
    assert {s.labels["reason"]: s.value for s in dropped}["truncated"] == 2


class Recorded:
    """An activity sink that keeps what it is given (and refuses one topic, as a bus may)."""

    def __init__(self) -> None:
        self.events: list[tuple[str, Any]] = []

    def publish(self, topic: str, value: object) -> None:
        if "refused" in topic:
            raise ValueError("cannot publish: the bus refuses it")
        self.events.append((topic, value))


def test_each_publication_is_mirrored_onto_the_bus_and_a_refusal_is_counted() -> None:
    from twisted.logger import Logger

    recorded = Recorded()
    relay = Relay(lambda: 0.0, Logger(), recorded)
    out = relay.receive_batch(
        [
            [b"pub-1", *pubsub_codec.publish(b"orders.created", b'{"id": 1}', b"m1")],
            [b"pub-1", *pubsub_codec.publish(b"refused", b"1", b"m2")],
        ]
    )
    assert out == [[b"orders.created", b'{"id": 1}'], [b"refused", b"1"]]
    assert recorded.events == [
        (
            "/emqp/publish/orders.created/",
            {
                "topic": "orders.created",
                "message": '{"id": 1}',
                "msgid": "m1",
                "publisher": "pub-1",
            },
        )
    ]
    assert (relay.mirrored, relay.unmirrored, relay.published) == (1, 1, 2)
    assert relay.drops.total == 0  # the subscribers had it: not a bad message


@pytest.mark.parametrize(
    ("frames", "reason"),
    [
        ([b"", b"eMQP/1.0", b"PUBLISH", b"m"], "truncated"),
        ([b"", b"eMQP/1.0", b"PUBLISH", b"m" * 129, b"t", b"x"], "bad-msgid"),
        ([b"", b"eMQP/1.0", b"HEARTBEAT", b"m", b"1", b"2"], "extra-frames"),
        ([b"", b"eMQP/1.0", b"publish", b"m", b"t", b"x"], "unknown-command"),
    ],
)
def test_the_codec_names_each_defect(frames: list[bytes], reason: str) -> None:
    with pytest.raises(EmqpError) as refused:
        pubsub_codec.parse(frames)
    assert refused.value.reason == reason


@pytest_twisted.inlineCallbacks
def test_curve_on_both_ports_and_a_key_s_role_picks_its_port(
    tmp_path: Path, cleanup: list[Any], peers: list[Any]
) -> Any:
    keys = Keys(tmp_path)
    subscriber_keys = keys.client("reader", role="subscriber")
    publisher_keys = keys.client("writer", role="publisher")
    service = start_pubsub(curve=keys.settings())
    cleanup.append(service)
    server = keys.server.public
    subscriber = RawPeer.sub(service.endpoints["outgoing"], (b"",), curve=(server, subscriber_keys))
    publisher = RawPeer.dealer(service.endpoints["incoming"], curve=(server, publisher_keys))
    # A subscriber's key may not publish; a key off the allow-list may not subscribe.
    wrong_role = RawPeer.dealer(service.endpoints["incoming"], curve=(server, subscriber_keys))
    stranger = RawPeer.sub(
        service.endpoints["outgoing"], (b"",), curve=(server, keys.client("x", allowed=False))
    )
    plain = RawPeer.dealer(service.endpoints["incoming"])
    peers += [subscriber, publisher, wrong_role, stranger, plain]
    wrong_role.send(pubsub_codec.publish(b"forged", b"1", b"f"))
    plain.send(pubsub_codec.publish(b"forged", b"1", b"f"))
    yield wait_until(
        lambda: service.curve.refusals.keys() >= {"role", "unknown-key", "handshake"},
        what="the wrong role, the stranger and the plain peer refused",
    )
    while not subscriber.messages:
        publisher.send(pubsub_codec.publish(b"secret", b'"s"', b"s"))
        yield wait_until(lambda: subscriber.messages, timeout=0.2, what="").addErrback(
            lambda _: None
        )
    assert subscriber.messages[0] == [b"secret", b'"s"']
    assert stranger.messages == []
    assert all(m[0] != b"forged" for m in subscriber.messages)
    assert service.status()["topics"].get("forged") is None
