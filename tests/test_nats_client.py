"""bus.nats.client: the reactor's NATS client against real nats-server processes:
publish and subscribe, requests and no-responders, JetStream's API; a token refused with
the server's reason; a server killed: the client connects to another of its servers and
its subscriptions work again there, and what waited on the lost connection fails at
once; a server that stops answering (SIGSTOP) is left for another; a stream asked again
while JetStream's refusal passes."""

from __future__ import annotations

import json
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import pytest_twisted
from twisted.internet import defer, reactor, task, threads

from bus.nats import jsapi
from bus.nats.client import NatsClient, NoResponders, NotConnected
from bus.nats.codec import Msg
from bus.nats.handshake import ConnectError
from tests.nats_tls import make_certificates
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


@pytest_twisted.inlineCallbacks
def test_flush_fires_once_the_server_read_what_came_before_and_fails_with_its_connection(
    nats_server: Any,
) -> Any:
    """A flush is a PING's PONG: once it fires, the server has the messages published
    before it (a subscriber whose SUB the server read gets them); while the server is
    stopped (SIGSTOP) it waits, keep-alive PINGs in between included, and it fails with
    NotConnected when the connection is given up; without a connection it fails at once."""
    (node,) = nats_server.nodes
    sender = NatsClient(reactor, nats_server.urls, ping_interval=0.3)
    receiver = NatsClient(reactor, nats_server.urls)
    heard: list[bytes] = []
    try:
        with pytest.raises(NotConnected):
            yield sender.flush()
        for client in (sender, receiver):
            client.start()
            yield client.when_connected(timeout=10)
        receiver.subscribe("flushed", lambda msg: heard.append(msg.payload))
        yield receiver.flush()  # the server has the SUB
        for number in range(100):
            sender.publish(b"flushed", b"%d" % number)
        yield sender.flush()
        yield until(lambda: len(heard) == 100)
        assert heard == [b"%d" % n for n in range(100)]
        nats_server.kill(node, signal.SIGSTOP)
        try:
            sender.publish(b"flushed", b"stopped")
            waiting = sender.flush()
            failed: list[Any] = []
            waiting.addErrback(failed.append)
            # Two keep-alive PINGs unanswered: the client leaves the server, and the flush
            # (never answered) fails with the connection.
            try:
                yield until(lambda: bool(failed), timeout=30)
            except AssertionError:
                wire = sender._wire
                raise AssertionError(
                    f"the flush neither failed nor fired: fired {waiting.called}, "
                    f"disconnects {sender.disconnects}, wire {wire!r} unanswered PINGs "
                    f"{getattr(wire, 'unanswered_pings', None)}, flushes waiting "
                    f"{len(getattr(wire, 'flushes', ()))}"
                ) from None
            assert failed[0].check(NotConnected)
        finally:
            nats_server.kill(node, signal.SIGCONT)
    finally:
        sender.stop()
        receiver.stop()


@pytest_twisted.inlineCallbacks
def test_tls_to_the_servers_through_both_clients(tmp_path: Path) -> Any:
    """A nats-server that requires TLS: the reactor's client and the blocking one
    (natswire) connect with the CA that signed it and refuse one without it."""
    from bus.nats.blocking import Connection
    from bus.nats.client import NatsTLS

    paths = make_certificates(tmp_path)
    nodes = nats_cluster(tmp_path / "nats", size=1)
    (node,) = nodes.nodes
    node.config.write_text(
        node.config.read_text()
        + f'tls {{ cert_file: "{paths["cert"]}"\n  key_file: "{paths["key"]}" }}\n'
    )
    nodes.start()
    client = NatsClient(reactor, nodes.urls, tls=NatsTLS(ca=paths["ca"]))
    stranger = NatsClient(reactor, nodes.urls, tls=NatsTLS(), connect_timeout=2)
    client.start()
    stranger.start()
    try:
        yield client.when_connected(timeout=10)
        client.subscribe("echo", lambda m: client.publish(m.reply, m.payload.upper()))
        answer = yield client.request(b"echo", b"over tls")
        assert answer.payload == b"OVER TLS"
        with pytest.raises(ConnectError):
            yield stranger.when_connected(timeout=3)  # no CA: the server is not trusted
        import ssl

        context = ssl.create_default_context(cafile=str(paths["ca"]))

        def ask() -> bytes:  # in a thread: the reactor's client answers it
            with Connection(nodes.urls, tls=context) as blocking:
                return blocking.request("echo", b"blocking").payload

        answered = yield threads.deferToThread(ask)
        assert answered == b"BLOCKING"
    finally:
        client.stop()
        stranger.stop()
        nodes.stop()


@pytest_twisted.inlineCallbacks
def test_no_echo_keeps_a_clients_own_messages_from_its_subscriptions(nats_server: Any) -> Any:
    """nats-py's ``no_echo``: what the front-end's connections ask for."""
    quiet = NatsClient(reactor, nats_server.urls, echo=False)
    loud = NatsClient(reactor, nats_server.urls)
    heard: dict[str, list[bytes]] = {"quiet": [], "loud": []}
    try:
        for name, client in (("quiet", quiet), ("loud", loud)):
            client.start()
            yield client.when_connected(timeout=10)
            client.subscribe("talk", lambda msg, n=name: heard[n].append(msg.payload))
        # A request each: its answer comes once the server read the client's SUBs. The loud
        # one first: it answers its own, and then the quiet one's (no echo: never its own).
        for client in (quiet, loud):
            client.subscribe("ping", lambda msg, c=client: c.publish(msg.reply, b"pong"))
        for client in (loud, quiet):
            yield client.request(b"ping", b"")
        for name, client in (("quiet", quiet), ("loud", loud)):
            client.publish(b"talk", name.encode())
        yield until(lambda: len(heard["loud"]) == 2 and heard["quiet"] == [b"loud"])
        assert sorted(heard["loud"]) == [b"loud", b"quiet"]
    finally:
        quiet.stop()
        loud.stop()


def test_a_slow_subscription_gets_a_budget_a_turn_and_drops_past_its_pending_limits() -> None:
    """Sans network: 1,010 messages in one read for a subscription whose pending limits
    are 5 messages; 1,000 (the turn's budget) go to it at once, 5 wait for the next turn,
    5 are dropped and counted; another subscription's message waits its turn too."""
    from twisted.internet.testing import MemoryReactorClock, StringTransport

    from bus.nats.blocking import Limits
    from bus.nats.client import DELIVERY_BUDGET

    memory = MemoryReactorClock()
    client = NatsClient(memory, ["nats://a:4222"], ping_interval=100)
    client.start()
    wire = memory.tcpClients[-1][2].buildProtocol(None)
    wire.makeConnection(StringTransport())
    wire.dataReceived(b'INFO {"max_payload": 1048576}\r\nPONG\r\n')
    slow: list[bytes] = []
    other: list[bytes] = []
    busy = client.subscribe("slow", lambda msg: slow.append(msg.payload), pending=Limits(5, 10**6))
    client.subscribe("other", lambda msg: other.append(msg.payload))
    burst = b"".join(b"MSG slow %d 1\r\nx\r\n" % busy.sid for _ in range(DELIVERY_BUDGET + 10))
    wire.dataReceived(burst + b"MSG other %d 1\r\ny\r\n" % (busy.sid + 1))
    assert len(slow) == DELIVERY_BUDGET and other == []
    assert busy.dropped == 5 and client.slow_consumer_drops == 5
    memory.advance(0)
    assert len(slow) == DELIVERY_BUDGET + 5 and other == [b"y"]
    client.stop()


@pytest.fixture
def plain_server(tmp_path: Path) -> Iterator[Any]:
    """One nats-server without JetStream: a test's subscriber answers JetStream's API."""
    server = nats_cluster(tmp_path / "nats", size=1)
    config = server.nodes[0].config
    config.write_text(
        "\n".join(line for line in config.read_text().splitlines() if "jetstream" not in line)
    )
    server.start()
    yield server
    server.stop()


@pytest_twisted.inlineCallbacks
def test_a_stream_whose_replicas_are_not_all_up_is_asked_for_again_until_they_are(
    plain_server: Any,
) -> Any:
    """JetStream answers a stream's creation with 400 "no suitable peers for placement,
    peer offline" (10005) while the cluster's servers have not all reported in (a CI run
    saw it from nats-server 2.15 when front-ends started beside their cluster). That
    passes: ``stream_ready`` asks again until its deadline; a refusal of what was asked
    (overlapping subjects, 10065) is raised at once. The answers, with the server's
    wording, come from a subscriber of the API's subjects."""
    from bus.nats.client import stream_ready

    client = NatsClient(reactor, plain_server.urls, name="t")
    client.start()
    offline = {
        "code": 400,
        "err_code": 10005,
        "description": "no suitable peers for placement, peer offline",
    }
    overlap = {
        "code": 400,
        "err_code": 10065,
        "description": "subjects overlap with an existing stream",
    }
    asked: list[str] = []
    refusals = {"LATE": 3, "WRONG": 1}

    def answer(message: Msg) -> None:
        subject = message.subject.decode()
        name = subject.rsplit(".", 1)[1]
        asked.append(subject)
        if ".STREAM.INFO." in subject:
            reply: dict[str, Any] = {
                "error": {"code": 404, "err_code": 10059, "description": "stream not found"}
            }
        elif name == "WRONG":
            reply = {"error": overlap}
        elif refusals[name] > 0:
            refusals[name] -= 1
            reply = {"error": offline}
        else:
            reply = {"config": json.loads(message.payload), "state": {"messages": 0}}
        client.publish(message.reply, json.dumps(reply).encode())

    try:
        yield client.when_connected(timeout=10)
        client.subscribe(jsapi.API + ".STREAM.>", answer)
        yield client.flush()
        config = {"name": "LATE", "subjects": ["late.>"], "num_replicas": 3}
        # While it lasts, the error passes: asked again until the time is up.
        with pytest.raises(TimeoutError, match="error 10005"):
            yield defer.ensureDeferred(stream_ready(client, config, 0.3))
        assert asked.count("$JS.API.STREAM.CREATE.LATE") >= 2
        # A refusal of what was asked is raised at once, whatever time is left.
        wrong = dict(config, name="WRONG")
        with pytest.raises(jsapi.JetStreamError) as refusal:
            yield defer.ensureDeferred(stream_ready(client, wrong, 60.0))
        assert refusal.value.err_code == 10065 and not refusal.value.passes
        assert asked.count("$JS.API.STREAM.CREATE.WRONG") == 1
        # It passes within the time: the stream is made.
        refusals["LATE"] = 3
        info, made = yield defer.ensureDeferred(stream_ready(client, config, 60.0))
        assert made and info["config"] == config
        assert asked.count("$JS.API.STREAM.CREATE.LATE") >= 2 + 4
    finally:
        client.stop()
