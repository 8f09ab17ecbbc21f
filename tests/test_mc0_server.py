"""The mc0 broker through real CURVE sockets on 127.0.0.1: every verb, both framings (the real
implementations' empty delimiters and the spec's arrays), TTL NOOPs and expiry, bad input
answered ERROR with the ID, the allow-list, a wrong server key, --plain, start failures."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import pytest_twisted

from bus.errors import StartupError
from bus.testing import wait_until
from bus.transport.curve_settings import CurveSettings
from tests.mc0_helpers import RawMc0Peer, settings, start_broker
from tests.ports import free_port


@pytest.fixture
def closing() -> Iterator[list[Any]]:
    """Peers and connectors made by a test are closed after it."""
    made: list[Any] = []
    yield made
    for thing in made:
        if hasattr(thing, "stop"):
            thing.stop()
        else:
            thing.close()


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[Any]:
    service = start_broker(tmp_path / "mc0", broker=settings(min_ttl_ms=50))
    yield service
    pytest_twisted.blockon(service.stopService())


def connector(broker: Any, closing: list[Any], **kwargs: Any) -> Any:
    from bus.mc0.client import Mc0Connector

    kwargs.setdefault("server_key", broker.keys.public if broker.keys else None)
    made = Mc0Connector(broker.endpoint, **kwargs)
    closing.append(made)
    return made


def peer(broker: Any, closing: list[Any], **kwargs: Any) -> RawMc0Peer:
    kwargs.setdefault("server_key", broker.keys.public if broker.keys else None)
    made = RawMc0Peer(broker.endpoint, **kwargs)
    closing.append(made)
    return made


# -- every verb, through the connector -----------------------------------------------------------


@pytest_twisted.inlineCallbacks
def test_every_verb_through_the_connector(broker: Any, closing: list[Any]) -> Any:
    from bus.mc0.client import Mc0ConnectionLost

    got_a: list[Any] = []
    got_b: list[Any] = []
    a = connector(broker, closing, on_message=got_a.append)
    b = connector(broker, closing, on_message=got_b.append, ttl=5.0)
    yield a.start()
    yield b.start()
    assert sorted(c.ttl for c in broker.broker.clients.values()) == [5.0, 30.0]
    yield a.subscribe(b"t", b"u")
    yield b.subscribe(b"t")
    yield a.noop()
    yield b.put(b"t", [b"part1", b"part2"], {b"X-reply-to": b"b"})
    yield wait_until(lambda: len(got_a) == 1 and len(got_b) == 1, what="fan-out to both")
    for delivery in (got_a[0], got_b[0]):  # the sender receives its own PUT too
        assert delivery.topic == b"t"
        assert delivery.headers == {b"TOPIC": b"t", b"X-reply-to": b"b"}
        assert delivery.body == (b"part1", b"part2")
    yield a.unsubscribe(b"t")
    yield b.put(b"t", b"second")
    yield b.put(b"u", b"third")
    yield wait_until(lambda: len(got_a) == 2 and len(got_b) == 2)
    assert [d.body for d in got_a] == [(b"part1", b"part2"), (b"third",)]
    assert [d.body for d in got_b] == [(b"part1", b"part2"), (b"second",)]
    assert broker.broker.topics.keys() == {b"t", b"u"}
    yield b.stop()  # DISCONNECT
    yield wait_until(lambda: len(broker.broker.clients) == 1, what="DISCONNECT forgets b")
    assert broker.broker.topics.keys() == {b"u"}
    with pytest.raises(Mc0ConnectionLost):
        yield b.put(b"t", b"after stop")
    status = broker.status()
    assert status["commands"]["Put"] == 3 and status["delivered"] == 4
    assert status["security"] == "curve" and status["auth"]["accepted"] == 2


@pytest_twisted.inlineCallbacks
def test_commands_before_connect_wait_for_the_session(broker: Any, closing: list[Any]) -> Any:
    got: list[Any] = []
    a = connector(broker, closing, on_message=got.append)
    subscribed = a.subscribe(b"early")
    put = a.put(b"early", b"x")
    yield a.start()
    yield subscribed
    yield put
    yield wait_until(lambda: len(got) == 1)


# -- both framings, raw ---------------------------------------------------------------------------


@pytest_twisted.inlineCallbacks
def test_the_real_implementations_framing(broker: Any, closing: list[Any]) -> Any:
    """The Ruby connector's and mc0d torture tool's frames, with their empty delimiters."""
    raw = peer(broker, closing)
    raw.send(b"", b"CONNECT", b"ID", b"chattyClient 0")  # the torture tool: no TTL, no VERSION
    raw.send(b"", b"CONNECT", b"ID", b"c1", b"TTL", b"30000", b"VERSION", b"0.2")
    raw.send(b"", b"SUB", b"ID", b"s1", b"", b"mcollective.discovery")
    raw.send(b"", b"NOOP", b"ID", b"chattyClient 0 0")
    raw.send(b"", b"PUT", b"TOPIC", b"mcollective.discovery", b"ID", b"p1", b"", b"payload")
    raw.send(b"", b"FROB", b"ID", b"f1")
    yield wait_until(lambda: len(raw.messages) == 7, what="seven replies")
    assert raw.messages == [
        [b"", b"OK", b"ID", b"chattyClient 0"],
        [b"", b"OK", b"ID", b"c1"],
        [b"", b"OK", b"ID", b"s1"],
        [b"", b"OK", b"ID", b"chattyClient 0 0"],
        [b"", b"MESSAGE", b"TOPIC", b"mcollective.discovery", b"", b"payload"],
        [b"", b"OK", b"ID", b"p1"],
        [b"", b"ERROR", b"MESSAGE", b"Unknown command verb 'FROB'", b"ID", b"f1"],
    ]


@pytest_twisted.inlineCallbacks
def test_the_specs_arrays_are_answered_as_arrays(broker: Any, closing: list[Any]) -> Any:
    spec = peer(broker, closing)
    real = peer(broker, closing)
    spec.send(b"CONNECT", b"VERSION", b"0.1", b"TTL", b"1000", b"ID", b"c")
    spec.send(b"SUB", b"", b"topic1", b"topic2")
    real.send(b"", b"SUB", b"ID", b"r", b"", b"topic1")
    yield wait_until(lambda: spec.messages == [[b"OK", b"ID", b"c"]] and len(real.messages) == 1)
    spec.send(b"PUT", b"TOPIC", b"topic1", b"", b"body")
    yield wait_until(
        lambda: len(spec.replies(b"MESSAGE")) == 1 and len(real.replies(b"MESSAGE")) == 1
    )
    assert spec.replies(b"MESSAGE") == [[b"MESSAGE", b"TOPIC", b"topic1", b"", b"body"]]
    assert real.replies(b"MESSAGE") == [[b"", b"MESSAGE", b"TOPIC", b"topic1", b"", b"body"]]


# -- bad input ------------------------------------------------------------------------------------


@pytest_twisted.inlineCallbacks
def test_bad_input_gets_error_with_the_id_and_the_broker_goes_on(
    broker: Any, closing: list[Any]
) -> Any:
    raw = peer(broker, closing)
    raw.send(b"", b"PUT", b"ID", b"odd", b"TOPIC")  # odd header count: crashed mc0d
    raw.send(b"PUT", b"ID", b"nt", b"", b"body")  # no TOPIC, spec framing
    raw.send(b"", b"PUT", b"ID", b"big", b"TOPIC", b"t", b"", b"x" * (1024 * 1024 + 1))
    raw.send(b"", b"NOOP", b"ID", b"fine")
    yield wait_until(lambda: len(raw.messages) == 4)
    assert [m[:2] for m in raw.messages[:3]] == [
        [b"", b"ERROR"],
        [b"ERROR", b"MESSAGE"],
        [b"", b"ERROR"],
    ]
    assert [m[-2:] for m in raw.messages] == [
        [b"ID", b"odd"],
        [b"ID", b"nt"],
        [b"ID", b"big"],
        [b"ID", b"fine"],
    ]
    assert raw.messages[3] == [b"", b"OK", b"ID", b"fine"]
    assert broker.broker.errors.counts == {"odd-headers": 1, "no-topic": 1, "oversized": 1}


# -- TTL ------------------------------------------------------------------------------------------


@pytest_twisted.inlineCallbacks
def test_a_quiet_client_gets_noops_then_is_forgotten(broker: Any, closing: list[Any]) -> Any:
    raw = peer(broker, closing)
    raw.send(b"", b"CONNECT", b"TTL", b"200", b"ID", b"c")
    raw.send(b"", b"SUB", b"", b"t")
    # Not "until the messages are [OK]": a reactor late by 190 ms reads the OK together with
    # the first NOOP, and that never holds.
    yield wait_until(lambda: raw.messages, what="the CONNECT's OK")
    assert raw.messages[0] == [b"", b"OK", b"ID", b"c"]
    yield wait_until(lambda: raw.replies(b"NOOP"), what="a NOOP after 0.95 x TTL")
    assert raw.replies(b"NOOP")[0] == [b"", b"NOOP"]
    # The SUB without an ID is not answered: nothing came but the OK and NOOPs.
    assert [m for m in raw.messages if m != [b"", b"NOOP"]] == [[b"", b"OK", b"ID", b"c"]]
    yield wait_until(lambda: not broker.broker.clients, what="forgotten after 1.05 x TTL")
    assert broker.broker.topics == {} and broker.broker.expired == 1


@pytest_twisted.inlineCallbacks
def test_the_connector_keeps_its_session_alive(broker: Any, closing: list[Any]) -> Any:
    """TTL 300 ms: the connector's NOOPs keep it known; the broker's keep the connector from
    reconnecting, over many TTLs."""
    from twisted.internet import reactor

    a = connector(broker, closing, ttl=0.3)
    yield a.start()
    yield a.subscribe(b"t")
    ended = False

    def end() -> None:
        nonlocal ended
        ended = True

    reactor.callLater(2.0, end)
    yield wait_until(lambda: ended, what="about seven TTLs")
    assert a.reconnects == 0 and a.connected
    assert broker.broker.expired == 0 and len(broker.broker.clients) == 1
    assert broker.broker.commands.get("Noop", 0) >= 3  # the connector's heartbeats


@pytest_twisted.inlineCallbacks
def test_a_stall_of_the_process_is_not_taken_for_silence(broker: Any, closing: list[Any]) -> Any:
    """TTL 300 ms, broker and connector in one process stalled for 0.6 s (SIGSTOP, a VM's
    pause, a starved machine) three times: their first wakes after each come late with the
    other's NOOPs waiting unread. Neither ends the session."""
    from twisted.internet import reactor

    a = connector(broker, closing, ttl=0.3)
    yield a.start()
    yield a.subscribe(b"t")
    for stall in range(1, 4):
        noops = broker.broker.commands.get("Noop", 0) + 2
        reactor.callLater(0, time.sleep, 0.6)
        yield wait_until(
            lambda n=noops: broker.broker.commands.get("Noop", 0) >= n, what="NOOPs after it"
        )
        assert a.wakes.held >= stall  # its late wake held back
    assert a.reconnects == 0 and a.connected and a.sessions == 1
    assert broker.broker.expired == 0 and len(broker.broker.clients) == 1


# -- reconnect ------------------------------------------------------------------------------------


@pytest_twisted.inlineCallbacks
def test_reconnect_and_resub_after_a_broker_restart(tmp_path: Path, closing: list[Any]) -> Any:
    port = free_port()
    data = tmp_path / "mc0"
    first = start_broker(data, port=port)
    second = None
    try:
        got: list[Any] = []
        a = connector(first, closing, on_message=got.append, ttl=0.5)
        yield a.start()
        yield a.subscribe(b"t1", b"t2")
        yield first.stopService()
        second = start_broker(data, port=port)  # the same key pair, from the data directory
        assert second.keys == first.keys
        try:
            yield wait_until(lambda: a.reconnects >= 1 and a.connected, what="reconnected")
        except AssertionError as error:
            raise AssertionError(f"{error}: {a.status()} {second.status()}") from None
        yield wait_until(lambda: len(second.broker.topics) == 2, what="re-SUB")
        assert second.broker.topics.keys() == {b"t1", b"t2"}
        b = connector(second, closing)
        yield b.start()
        yield b.put(b"t2", b"after restart")
        yield wait_until(lambda: [d.body for d in got] == [(b"after restart",)])
    finally:
        if first.running:
            yield first.stopService()
        if second is not None:
            yield second.stopService()


@pytest_twisted.inlineCallbacks
def test_a_sub_in_flight_when_the_session_dies_is_settled_by_the_resub(
    tmp_path: Path, closing: list[Any]
) -> Any:
    port = free_port()
    data = tmp_path / "mc0"
    first = start_broker(data, port=port)
    yield first.stopService()  # the connector's first CONNECT goes unanswered
    from bus.mc0.client import Mc0Connector

    a = Mc0Connector(f"tcp://127.0.0.1:{port}", server_key=first.keys.public, ttl=0.3)
    closing.append(a)
    started = a.start()
    subscribed = a.subscribe(b"x")
    yield wait_until(lambda: a.sessions >= 2, what="a retry on a fresh socket")
    second = start_broker(data, port=port)
    try:
        yield started
        yield subscribed
        assert second.broker.topics.keys() == {b"x"}
    finally:
        yield second.stopService()


# -- security -------------------------------------------------------------------------------------


@pytest_twisted.inlineCallbacks
def test_only_keys_on_the_allow_list_get_in(tmp_path: Path, closing: list[Any]) -> Any:
    from bus.transport.curve import create_key_pair, load_key_pair

    allowed = tmp_path / "clients"
    create_key_pair(allowed, "alice")
    create_key_pair(tmp_path / "others", "mallory")
    alice = load_key_pair(allowed / "alice.key_secret")
    mallory = load_key_pair(tmp_path / "others" / "mallory.key_secret")
    service = start_broker(
        tmp_path / "mc0", curve=CurveSettings(client_certs=allowed, key_dir=tmp_path / "mc0")
    )
    try:
        good = connector(service, closing, client_keys=alice)
        bad = connector(service, closing, client_keys=mallory, ttl=0.3)
        raw = peer(service, closing, keys=mallory)
        raw.send(b"", b"NOOP", b"ID", b"let me in")
        bad.start()
        yield good.start()
        yield wait_until(lambda: service.zap.denied >= 2, what="two refusals")
        yield wait_until(lambda: service.handshake_failures["auth"] >= 2)
        assert not bad.connected and raw.messages == []
        assert list(service.broker.clients) and len(service.broker.clients) == 1
        assert service.zap.accepted >= 1
        # A key added to the directory is allowed once the directory is re-read.
        (allowed / "mallory.key").write_bytes((tmp_path / "others" / "mallory.key").read_bytes())
        assert service.zap.reload()
        yield bad.when_connected()
    finally:
        yield service.stopService()


@pytest_twisted.inlineCallbacks
def test_a_wrong_server_key_never_connects(broker: Any, closing: list[Any]) -> Any:
    from bus.transport.curve import CurveKeyPair

    impostor = CurveKeyPair.generate()
    a = connector(broker, closing, server_key=impostor.public, ttl=0.2)
    a.start()
    yield wait_until(lambda: broker.handshake_failures["protocol"] >= 2, what="refused handshakes")
    yield wait_until(lambda: a.sessions >= 2, what="the connector retried")
    assert not a.connected and not broker.broker.clients
    assert broker.zap.accepted == 0


@pytest_twisted.inlineCallbacks
def test_plain_mode_and_a_curve_client_against_it(tmp_path: Path, closing: list[Any]) -> Any:
    from bus.transport.curve import CurveKeyPair

    service = start_broker(tmp_path / "mc0", curve=CurveSettings())  # --plain
    try:
        assert service.keys is None and service.zap is None
        assert not (tmp_path / "mc0" / "server.key").exists()
        got: list[Any] = []
        a = connector(service, closing, on_message=got.append)
        yield a.start()
        yield a.subscribe(b"t")
        yield a.put(b"t", b"clear")
        yield wait_until(lambda: len(got) == 1)
        curve = connector(service, closing, server_key=CurveKeyPair.generate().public, ttl=0.2)
        curve.start()
        yield wait_until(lambda: service.handshake_failures["protocol"] >= 1)
        assert not curve.connected and service.status()["security"] == "plain"
    finally:
        yield service.stopService()


# -- mirroring onto the Event BUS -------------------------------------------------------------------


@pytest_twisted.inlineCallbacks
def test_puts_are_mirrored_onto_the_bus_when_asked(tmp_path: Path, closing: list[Any]) -> Any:
    import msgpack

    from bus.testing import start_bus

    bus = start_bus(tmp_path / "bus")
    service = start_broker(tmp_path / "mc0", bus.activity_sink("mc0"), mirror=True)
    try:
        a = connector(service, closing)
        yield a.start()
        yield a.put(b"mcollective.discovery", [b"b1", b"b2"], {b"X-k": b"v"})
        yield a.put(b"\xff not utf-8", b"x")
        yield wait_until(lambda: bus.store.last_sequence == 1, what="stored on the bus")
        [event] = bus.store.read(0)
        assert event.topic == b"/mc0/mcollective.discovery/"
        assert event.producer == b"mc0"
        value = msgpack.unpackb(event.data)
        assert value["topic"] == "mcollective.discovery"
        assert value["headers"] == {"TOPIC": "mcollective.discovery", "X-k": "v"}
        assert value["body"] == [b"b1", b"b2"]
        assert service.mirrored == 1 and service.mirror_drops.counts == {"unmirrorable": 1}
    finally:
        yield service.stopService()
        yield bus.stopService()


@pytest_twisted.inlineCallbacks
def test_without_mirror_nothing_reaches_the_bus(tmp_path: Path, closing: list[Any]) -> Any:
    from bus.testing import start_bus

    bus = start_bus(tmp_path / "bus")
    service = start_broker(tmp_path / "mc0", bus.activity_sink("mc0"))
    try:
        a = connector(service, closing)
        yield a.start()
        yield a.put(b"t", b"x")
        yield a.noop()
        assert bus.store.last_sequence == 0 and service.mirrored == 0
    finally:
        yield service.stopService()
        yield bus.stopService()


# -- start and stop ---------------------------------------------------------------------------------


def test_start_failures_name_the_option(tmp_path: Path) -> None:
    holder = socket.socket()
    holder.bind(("127.0.0.1", 0))
    holder.listen()
    try:
        with pytest.raises(StartupError) as caught:
            start_broker(tmp_path / "a", port=holder.getsockname()[1])
        assert caught.value.option == "port"
    finally:
        holder.close()
    (tmp_path / "junk").write_text("not a key\n")
    for option, overrides in [
        ("server-cert", {"server_cert": tmp_path / "missing.key_secret"}),
        ("server-cert", {"server_cert": tmp_path / "junk"}),
        ("client-certs", {"client_certs": tmp_path / "nowhere"}),
        ("data-dir", {"key_dir": tmp_path / "junk"}),  # a file, not a directory
    ]:
        with pytest.raises(StartupError) as caught:
            curve = CurveSettings(**{"key_dir": tmp_path / "b", **overrides})
            start_broker(tmp_path / "b", curve=curve)
        assert caught.value.option == option


@pytest_twisted.inlineCallbacks
def test_server_cert_files_of_both_formats(tmp_path: Path, closing: list[Any]) -> Any:
    from bus.transport.curve import CurveKeyPair, create_key_pair

    _public, secret = create_key_pair(tmp_path / "keys", "broker")
    bare = CurveKeyPair.generate()
    (tmp_path / "mc0d.key").write_bytes(bare.secret + b"\n")  # mc0d: the Z85 secret alone
    for path, public in [(secret, None), (tmp_path / "mc0d.key", bare.public)]:
        service = start_broker(
            tmp_path / "data", curve=CurveSettings(path, key_dir=tmp_path / "data")
        )
        try:
            if public is not None:
                assert service.keys.public == public
            a = connector(service, closing)
            yield a.start()
            yield a.stop()
        finally:
            yield service.stopService()
    assert not (tmp_path / "data" / "server.key").exists()


@pytest_twisted.inlineCallbacks
def test_stop_is_idempotent_and_metrics_name_the_counters(broker: Any, closing: list[Any]) -> Any:
    a = connector(broker, closing)
    yield a.start()
    yield a.subscribe(b"t")
    yield a.put(b"t", b"x")
    yield wait_until(lambda: a.received == 1)
    names = {family.name: family for family in broker.metrics()}
    assert {"mc0_clients", "mc0_commands", "mc0_messages_delivered", "mc0_zap_decisions"} <= set(
        names
    )
    assert names["mc0_clients"].samples[0].value == 1
    delivered = names["mc0_messages_delivered"].samples[0].value
    assert delivered == 1
    first = broker.stopService()
    assert broker.stopService() is first
    yield first
    assert broker.socket is None


@pytest_twisted.inlineCallbacks
def test_errors_fail_the_commands_deferred(broker: Any, closing: list[Any]) -> Any:
    from bus.mc0.client import Mc0CommandError

    a = connector(broker, closing)
    yield a.start()
    with pytest.raises(Mc0CommandError, match="empty topic"):
        yield a.put(b"", b"nowhere")
    with pytest.raises(Mc0CommandError, match="empty topic"):
        yield a.subscribe(b"ok", b"")
    assert a.topics == set()  # a refused SUB is not held for the next session
    yield a.noop()  # the session goes on
    refused = connector(broker, closing, ttl=0.01)  # below the broker's --min-ttl (50 ms)
    with pytest.raises(Mc0CommandError, match="TTL 10 ms out of this broker's range"):
        yield refused.start()
    with pytest.raises(Mc0CommandError):
        yield refused.put(b"t", b"x")
    assert refused.sessions == 1  # a refused CONNECT is not retried


def torture_client(endpoint: str, server_key: bytes, name: bytes, count: int) -> list[list[bytes]]:
    """mc0d's torture client as plain blocking pyzmq (its own context, in a thread): CONNECT
    with only an ID, COUNT NOOPs in lockstep, DISCONNECT. Returns every reply."""
    import zmq

    context = zmq.Context()
    sock = context.socket(zmq.DEALER)
    public, secret = zmq.curve_keypair()
    sock.curve_serverkey, sock.curve_publickey, sock.curve_secretkey = server_key, public, secret
    sock.setsockopt(zmq.IDENTITY, name)
    sock.linger = 1000
    sock.rcvtimeo = 10_000
    replies = []
    try:
        sock.connect(endpoint)
        sock.send_multipart([b"", b"CONNECT", b"ID", name])
        replies.append(sock.recv_multipart())
        for i in range(count):
            sock.send_multipart([b"", b"NOOP", b"ID", b"%s %d" % (name, i)])
            replies.append(sock.recv_multipart())
        sock.send_multipart([b"", b"DISCONNECT"])
    finally:
        sock.close()
        context.term()
    return replies


@pytest_twisted.inlineCallbacks
def test_torture_clients_in_plain_pyzmq(broker: Any) -> Any:
    from twisted.internet import defer, threads

    names = [b"chattyClient %d" % i for i in range(4)]
    results = yield defer.gatherResults(
        [
            threads.deferToThread(torture_client, broker.endpoint, broker.keys.public, name, 50)
            for name in names
        ]
    )
    for name, replies in zip(names, results, strict=True):
        assert replies == [
            [b"", b"OK", b"ID", name],
            *([b"", b"OK", b"ID", b"%s %d" % (name, i)] for i in range(50)),
        ]
    yield wait_until(lambda: not broker.broker.clients, what="every torture client DISCONNECTed")
    assert broker.broker.disconnected == 4 and broker.broker.acknowledged == 4 * 51


@pytest_twisted.inlineCallbacks
def test_a_broker_silent_for_105_ttl_means_a_new_session_and_resub(closing: list[Any]) -> Any:
    """A fake broker (a raw ROUTER) that answers, then falls silent for one identity while
    the TCP connection stays up: the connector must start over on a fresh socket."""
    import zmq

    from bus.mc0 import codec
    from bus.mc0.client import Mc0Connector
    from bus.transport.zmqsocket import SocketFactory, SocketOptions
    from bus.util.reactor import reactor_of

    factory = SocketFactory(reactor_of(None))
    seen: list[tuple[bytes, Any]] = []
    muted: set[bytes] = set()

    def on_messages(batch: list[list[bytes]]) -> None:
        for identity, *frames in batch:
            command = codec.decode_client(frames)
            seen.append((identity, command))
            if identity not in muted and command.id is not None:
                router.send_frames([identity, *codec.ok_frames(command.id, command.framing)])

    router = factory.socket(zmq.ROUTER, on_messages, SocketOptions(linger_ms=0))
    endpoint = router.bind("tcp://127.0.0.1:*")
    try:
        a = Mc0Connector(endpoint, ttl=0.3)
        closing.append(a)
        yield a.start()
        yield a.subscribe(b"x", b"y")
        first = seen[0][0]
        muted.add(first)
        yield wait_until(lambda: a.reconnects == 1 and a.connected, what="a new session")
        later = [(i, c) for i, c in seen if i != first]
        assert isinstance(later[0][1], codec.Connect) and later[0][1].ttl_ms == 300
        yield wait_until(
            lambda: any(
                isinstance(c, codec.Subscribe) and set(c.topics) == {b"x", b"y"}
                for i, c in seen
                if i != first
            ),
            what="the re-SUB on the new identity",
        )
        assert a.sessions == 2
    finally:
        factory.shutdown()


@pytest_twisted.inlineCallbacks
def test_what_a_lost_broker_sent_before_it_went_is_still_delivered(closing: list[Any]) -> Any:
    """A fake broker sends a MESSAGE and then its connection is lost, before the connector
    read it (its reactor busy elsewhere: reading paused here). The connection's loss ends
    the session; the message already in the socket is handed over before it closes."""
    import zmq

    from bus.mc0 import codec
    from bus.mc0.client import Mc0Connector
    from bus.transport.zmqsocket import SocketFactory, SocketOptions
    from bus.util.reactor import reactor_of

    factory = SocketFactory(reactor_of(None))
    identities: list[bytes] = []

    def on_messages(batch: list[list[bytes]]) -> None:
        for identity, *frames in batch:
            command = codec.decode_client(frames)
            identities.append(identity)
            if command.id is not None:
                router.send_frames([identity, *codec.ok_frames(command.id, command.framing)])

    router = factory.socket(zmq.ROUTER, on_messages, SocketOptions(linger_ms=1000))
    endpoint = router.bind("tcp://127.0.0.1:*")
    got: list[Any] = []
    connector = Mc0Connector(endpoint, got.append, ttl=30.0)
    closing.append(connector)
    try:
        yield connector.start()
        yield connector.subscribe(b"t")
        assert connector._socket is not None
        connector._socket.pause_reading()
        put = codec.Put(b"t", ((b"TOPIC", b"t"),), (b"sent before the loss",))
        router.send_frames([identities[0], *codec.message_frames(put, codec.Framing.SPEC)])
        factory.shutdown()  # lingers until the MESSAGE is out, then the connection goes
        yield wait_until(lambda: connector.reconnects == 1, what="the loss noticed")
        assert [(d.topic, d.body) for d in got] == [(b"t", (b"sent before the loss",))]
        assert connector.received == 1
    finally:
        factory.shutdown()


@pytest_twisted.inlineCallbacks
def test_a_slow_answer_to_connect_is_waited_for_past_a_short_ttl(closing: list[Any]) -> Any:
    """A broker that answers CONNECT 200 ms late (a loaded machine, a slow handshake),
    to a connector whose TTL is 10 ms: the connector waits for that answer rather than
    give up after 1.05 x TTL and CONNECT again (which only earned a second refusal)."""
    import zmq
    from twisted.internet import reactor, task

    from bus.mc0 import codec
    from bus.mc0.client import Mc0Connector
    from bus.testing import RawPeer

    port = free_port()
    late = RawPeer(zmq.ROUTER, f"tcp://127.0.0.1:{port}", bind=True)
    closing.append(late)
    refused = Mc0Connector(f"tcp://127.0.0.1:{port}", ttl=0.01)
    closing.append(refused)
    starting = refused.start()
    yield wait_until(lambda: late.messages, what="the CONNECT")
    identity, *frames = late.messages[0]
    command = codec.decode_client(frames)
    assert isinstance(command, codec.Connect)
    yield task.deferLater(reactor, 0.2, lambda: None)  # the broker's slowness, on purpose
    late.send([identity, *codec.error_frames(b"TTL too short", command.id, command.framing)])
    with pytest.raises(Exception, match="TTL too short"):
        yield starting
    assert refused.sessions == 1 and len(late.messages) == 1  # one CONNECT, not two
