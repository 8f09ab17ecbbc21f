"""bus.transport.nats: the reactor's NATS client against real nats-server processes:
publish and subscribe, requests and no-responders, JetStream's API; a token refused with
the server's reason; a server killed: the client connects to another of its servers and
its subscriptions work again there, and what waited on the lost connection fails at
once; a server that stops answering (SIGSTOP) is left for another."""

from __future__ import annotations

import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import pytest_twisted
from twisted.internet import defer, reactor, task

from bus.natswire import jsapi
from bus.natswire.codec import Msg
from bus.natswire.handshake import ConnectError
from bus.transport.nats import NatsClient, NoResponders, NotConnected
from tests.ports import nats_cluster


def until(condition: Any, timeout: float = 15.0) -> defer.Deferred[None]:
    @defer.inlineCallbacks
    def poll() -> Any:
        deadline = reactor.seconds() + timeout  # type: ignore[attr-defined]
        while not condition():
            if reactor.seconds() > deadline:  # type: ignore[attr-defined]
                raise AssertionError("condition not met in time")
            yield task.deferLater(reactor, 0.02, lambda: None)

    return poll()


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Any]:
    nodes = nats_cluster(tmp_path / "nats", size=2, token="s3cret")
    nodes.start()
    yield nodes
    nodes.stop()


def with_token(url: str, token: str = "s3cret") -> str:
    return url.replace("nats://", f"nats://{token}@")


@pytest_twisted.inlineCallbacks
def test_publish_subscribe_request_and_jetstream(cluster: Any) -> Any:
    client = NatsClient(reactor, [with_token(u) for u in cluster.urls], name="t")
    client.start()
    try:
        yield client.when_connected(timeout=10)
        seen: list[Msg] = []
        client.subscribe("orders.>", seen.append)
        client.subscribe("echo", lambda m: client.publish(m.reply, b"re:" + m.payload))
        client.publish(b"orders.a", b"one")
        client.publish(b"orders.b.c", b"two", headers=b"NATS/1.0\r\nX-K: v\r\n\r\n")
        answer = yield client.request(b"echo", b"hi")
        assert answer.payload == b"re:hi"
        yield until(lambda: len(seen) == 2)
        assert [(m.subject, m.payload) for m in seen] == [
            (b"orders.a", b"one"),
            (b"orders.b.c", b"two"),
        ]
        assert b"X-K: v" in seen[1].headers
        with pytest.raises(NoResponders):
            yield client.request(b"nobody.here", b"x")
        # JetStream answers once the cluster elected its meta leader (a few seconds).
        info = None
        for _ in range(20):
            try:
                info = yield client.jetstream(jsapi.API + ".INFO", timeout=1)
                break
            except (TimeoutError, jsapi.JetStreamError):
                continue
        assert info is not None and "memory" in info
        with pytest.raises(jsapi.JetStreamError) as missing:
            yield client.jetstream(jsapi.stream_info("NOSUCH"))
        assert missing.value.code == 404
    finally:
        client.stop()


@pytest_twisted.inlineCallbacks
def test_a_refused_token_and_unreachable_servers_are_named(cluster: Any) -> Any:
    client = NatsClient(
        reactor,
        [with_token(cluster.urls[0], "wrong"), "nats://127.0.0.1:1"],
        connect_timeout=1.0,
    )
    client.start()
    try:
        with pytest.raises(ConnectError) as refused:
            yield client.when_connected(timeout=3)
        text = str(refused.value)
        assert "uthorization" in text and "127.0.0.1:1" in text, text
        assert not client.connected
        with pytest.raises(NotConnected):
            client.publish(b"a", b"b")
    finally:
        client.stop()


@pytest_twisted.inlineCallbacks
def test_a_killed_server_is_left_for_another_with_the_subscriptions(cluster: Any) -> Any:
    client = NatsClient(reactor, [with_token(u) for u in cluster.urls], ping_interval=0.5)
    other = NatsClient(reactor, [with_token(u) for u in reversed(cluster.urls)])
    client.start()
    other.start()
    try:
        yield client.when_connected(timeout=10)
        yield other.when_connected(timeout=10)
        first = client.server
        seen: list[bytes] = []
        client.subscribe("news", lambda m: seen.append(m.payload))
        states: list[bool] = []
        client.listeners.append(states.append)
        # A request nobody answers yet: it fails when its connection goes, not later.
        client.subscribe("slow", lambda m: None)
        pending = client.request(b"slow", b"", timeout=30)
        node = next(n for n in cluster.nodes if str(first).endswith(f":{n.port}"))
        cluster.kill(node)
        with pytest.raises(NotConnected):
            yield pending
        yield until(lambda: client.connected and client.server != first)
        assert states[:2] == [False, True], states
        # Published from a client on the surviving server, until the subscription is back.
        yield until(lambda: other.connected)
        n = 0
        while not seen:
            n += 1
            other.publish(b"news", b"%d" % n)
            yield task.deferLater(reactor, 0.05, lambda: None)
        assert client.disconnects == 1 and client.connects == 2
    finally:
        client.stop()
        other.stop()


@pytest_twisted.inlineCallbacks
def test_a_server_that_stops_answering_is_left(cluster: Any) -> Any:
    node = cluster.nodes[0]
    client = NatsClient(
        reactor, [with_token(node.url), with_token(cluster.nodes[1].url)], ping_interval=0.3
    )
    client.start()
    try:
        yield client.when_connected(timeout=10)
        assert client.server is not None and str(node.port) in client.server
        cluster.kill(node, signal.SIGSTOP)
        try:
            yield until(
                lambda: client.connected and str(cluster.nodes[1].port) in (client.server or "")
            )
        finally:
            cluster.kill(node, signal.SIGCONT)
    finally:
        client.stop()
