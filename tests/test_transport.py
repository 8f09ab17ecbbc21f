"""The txzmq-based socket layer (bus.transport.zmqsocket): budgeted reads, whole multipart
messages on SUB, backpressure on HWM, ROUTER_MANDATORY, idempotent shutdown; each through
the compiled helper (bus.transport.frames) and through pyzmq alone."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import pytest_twisted
import zmq
from twisted.internet import reactor

from bus.testing import wait_until
from tests.ports import free_port

# bus.transport.zmqsocket imports txzmq, which imports the global reactor: import it only
# once pytest-twisted has installed its reactor, i.e. inside fixtures and tests.


def transport() -> Any:
    from bus.transport import zmqsocket

    return zmqsocket


def options(**settings: Any) -> Any:
    settings.setdefault("linger_ms", 0)
    return transport().SocketOptions(**settings)


@pytest.fixture(params=["native", "pyzmq"])
def factory(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """Sockets that read and send through the compiled helper, then through pyzmq alone:
    every test here holds for both."""
    zmqsocket = transport()
    if request.param == "pyzmq":
        monkeypatch.setattr(zmqsocket, "_native_frames", None)
    elif zmqsocket._native_frames is None:
        pytest.skip("bus.transport._frames was not built here (see test_transport_frames)")
    made = zmqsocket.SocketFactory(reactor)
    yield made
    made.shutdown()


def flat(batches: list[list[list[bytes]]]) -> list[list[bytes]]:
    return [message for batch in batches for message in batch]


# -- endpoints -------------------------------------------------------------------------------


def test_bind_returns_the_concrete_endpoint(factory: Any) -> None:
    router = factory.socket(zmq.ROUTER, None, options())
    endpoint = router.bind("tcp://127.0.0.1:*")
    assert endpoint.startswith("tcp://127.0.0.1:")
    assert int(endpoint.rsplit(":", 1)[1]) > 0
    assert router.name == "ROUTER"
    assert factory.socket(zmq.DEALER, None, options(), name="mine").name == "mine"


def test_options_are_applied_to_the_zeromq_socket(factory: Any) -> None:
    sock = factory.socket(
        zmq.ROUTER,
        None,
        options(
            send_hwm=7,
            receive_hwm=9,
            max_message_size=1234,
            linger_ms=5,
            identity=b"me",
            tcp_keepalive_idle=30,
        ),
    )
    raw = sock.socket
    assert raw.get(zmq.SNDHWM) == 7  # never txzmq's 0 = unbounded
    assert raw.get(zmq.RCVHWM) == 9
    assert raw.get(zmq.MAXMSGSIZE) == 1234
    assert raw.get(zmq.LINGER) == 5
    assert raw.get(zmq.IDENTITY) == b"me"
    assert raw.get(zmq.TCP_KEEPALIVE) == 1
    assert raw.get(zmq.TCP_KEEPALIVE_IDLE) == 30
    default = factory.socket(zmq.DEALER).socket
    assert default.get(zmq.SNDHWM) == 1000
    assert default.get(zmq.RCVHWM) == 1000


# -- budgeted reads ------------------------------------------------------------------------------


@pytest_twisted.inlineCallbacks
def test_reads_are_budgeted_and_resume_on_the_next_reactor_turn(factory: Any) -> Any:
    total, budget = 200, 10
    batches: list[list[list[bytes]]] = []
    receiver = factory.socket(zmq.PULL, batches.append, options(), read_budget=budget)
    receiver.bind("inproc://budgeted")
    sender = factory.socket(zmq.PUSH, None, options())
    sender.connect("inproc://budgeted")
    # inproc messages are in the receiver's pipe as soon as send returns; the reactor does
    # not run before the next yield, so all 200 are queued when doRead is called.
    for i in range(total):
        assert sender.send_frames([b"%d" % i, b"part"])
    receiver.doRead()
    assert [len(batch) for batch in batches] == [budget]
    assert receiver.read_scheduled is not None and receiver.read_scheduled.active()

    delivered_when_timer_ran: list[int] = []
    reactor.callLater(0, lambda: delivered_when_timer_ran.append(len(flat(batches))))
    # No new message arrives, so no new readable edge on the ZeroMQ fd: the rest can only
    # come from the reader rescheduling itself.
    yield wait_until(lambda: len(flat(batches)) == total, what="all queued messages")
    assert all(1 <= len(batch) <= budget for batch in batches)
    assert flat(batches) == [[b"%d" % i, b"part"] for i in range(total)]
    assert receiver.messages_received == total
    # A timer due now ran before the backlog was drained: the reader yields the reactor.
    assert delivered_when_timer_ran and delivered_when_timer_ran[0] < total


@pytest_twisted.inlineCallbacks
def test_a_failing_handler_does_not_stop_the_socket(factory: Any) -> Any:
    seen: list[list[bytes]] = []

    def handler(batch: list[list[bytes]]) -> None:
        seen.extend(batch)
        if len(seen) == 1:
            raise RuntimeError("handler bug")

    receiver = factory.socket(zmq.PULL, handler, options())
    endpoint = receiver.bind("tcp://127.0.0.1:*")
    sender = factory.socket(zmq.PUSH, None, options())
    sender.connect(endpoint)
    assert sender.send_frames([b"first"])
    yield wait_until(lambda: len(seen) == 1)
    assert sender.send_frames([b"second"])
    yield wait_until(lambda: len(seen) == 2)
    assert seen == [[b"first"], [b"second"]]


# -- multipart on SUB ------------------------------------------------------------------------------


@pytest_twisted.inlineCallbacks
def test_sub_receives_multipart_messages_of_three_or_more_frames_whole(factory: Any) -> Any:
    publisher = factory.socket(zmq.PUB, None, options())
    endpoint = publisher.bind("tcp://127.0.0.1:*")
    received: list[list[bytes]] = []
    subscriber = factory.socket(zmq.SUB, received.extend, options())
    subscriber.connect(endpoint)
    subscriber.subscribe(b"")

    def probe_arrived() -> bool:
        # Subscriptions propagate asynchronously: publish probes until one gets through.
        publisher.send_frames([b"probe"])
        return bool(received)

    yield wait_until(probe_arrived, what="subscription")
    messages = [
        [b"/t/", b"\x00" * 8, b"p"],
        [b"/t/", b"", b"", b""],
        [b"/t/", *(b"%d" % i for i in range(10))],
        [b"/t/", b"x" * 100_000, b"y", b"z" * 70_000, b""],
        [b"/t/", b"1", b"producer", b"2026-11-21T10:00:00Z", b"uuid", b"\x80"],
    ]
    for message in messages:
        assert publisher.send_frames(message)
    yield wait_until(lambda: len([m for m in received if m != [b"probe"]]) == len(messages))
    assert [m for m in received if m != [b"probe"]] == messages


@pytest_twisted.inlineCallbacks
def test_sub_prefix_subscription_filters_whole_messages(factory: Any) -> Any:
    publisher = factory.socket(zmq.PUB, None, options())
    endpoint = publisher.bind("tcp://127.0.0.1:*")
    received: list[list[bytes]] = []
    subscriber = factory.socket(zmq.SUB, received.extend, options())
    subscriber.connect(endpoint)
    subscriber.subscribe(b"/a/")

    def probe_arrived() -> bool:
        publisher.send_frames([b"/a/probe", b"1", b"2"])
        return bool(received)

    yield wait_until(probe_arrived, what="subscription")
    publisher.send_frames([b"/b/", b"1", b"2", b"3"])
    publisher.send_frames([b"/a/x", b"/b/", b"3"])  # only the first frame is matched
    yield wait_until(lambda: received[-1][0] == b"/a/x")
    assert {m[0] for m in received} == {b"/a/probe", b"/a/x"}
    assert received[-1] == [b"/a/x", b"/b/", b"3"]
    subscriber.unsubscribe(b"/a/")
    assert subscriber.socket.get(zmq.TYPE) == zmq.SUB


# -- backpressure ----------------------------------------------------------------------------------


def test_dealer_without_any_peer_reports_backpressure(factory: Any) -> None:
    dealer = factory.socket(zmq.DEALER, None, options(send_hwm=5))
    assert dealer.send_frames([b"a", b"b", b"c"]) is False
    assert dealer.send_frames([b"single"]) is False
    assert dealer.send_many([[b"a"], [b"b"]]) == 0
    with pytest.raises(zmq.Again):
        dealer.send(b"txzmq api")
    with pytest.raises(zmq.Again):
        dealer.send([b"txzmq", b"api"])


@pytest_twisted.inlineCallbacks
def test_send_frames_returns_false_at_hwm_and_nothing_partial_is_sent(factory: Any) -> Any:
    hwm = 5
    address = f"tcp://127.0.0.1:{free_port()}"
    dealer = factory.socket(zmq.DEALER, None, options(send_hwm=hwm, receive_hwm=hwm))
    dealer.connect(address)  # nobody listens yet: messages queue until the HWM
    accepted = []
    for i in range(100):
        frames = [b"msg", b"%d" % i, b"tail"]
        if not dealer.send_frames(frames):
            break
        accepted.append(frames)
    assert 1 <= len(accepted) <= hwm
    assert dealer.send_frames([b"msg", b"rejected", b"tail"]) is False
    assert dealer.send_many([[b"rejected"], [b"rejected"]]) == 0
    with pytest.raises(zmq.Again):
        dealer.send([b"rejected", b"via", b"txzmq api"])

    # A peer appears: exactly the accepted messages arrive, whole and in order, and
    # sending works again.
    got: list[list[bytes]] = []
    router = factory.socket(zmq.ROUTER, got.extend, options())
    router.bind(address)
    yield wait_until(lambda: len(got) == len(accepted), what="queued messages")
    assert [m[1:] for m in got] == accepted
    assert dealer.send_frames([b"after", b"the", b"peer", b"came"])
    yield wait_until(lambda: len(got) == len(accepted) + 1)
    assert got[-1][1:] == [b"after", b"the", b"peer", b"came"]
    assert all(b"rejected" not in m for m in got)


def test_send_many_stops_at_the_first_message_that_would_block(factory: Any) -> None:
    dealer = factory.socket(zmq.DEALER, None, options(send_hwm=3))
    dealer.connect(f"tcp://127.0.0.1:{free_port()}")
    sent = dealer.send_many([[b"m", b"%d" % i] for i in range(50)])
    assert 1 <= sent <= 3
    assert dealer.send_many([[b"more"]]) == 0


def test_send_each_says_how_many_went_and_why_the_next_did_not(factory: Any) -> None:
    router = factory.socket(zmq.ROUTER, None, options(router_mandatory=True))
    router.bind("tcp://127.0.0.1:*")
    assert router.send_each([]) == (0, 0)
    assert router.send_each([[b"nobody", b"x"], [b"other", b"y"]]) == (0, zmq.EHOSTUNREACH)
    dealer = factory.socket(zmq.DEALER, None, options(send_hwm=3))
    dealer.connect(f"tcp://127.0.0.1:{free_port()}")
    sent, error = dealer.send_each([[b"m", b"%d" % i] for i in range(50)])
    assert 1 <= sent <= 3 and error == zmq.EAGAIN


@pytest.mark.parametrize("eager", [False, True])
@pytest_twisted.inlineCallbacks
def test_a_handler_that_answers_on_its_socket_misses_no_message(factory: Any, eager: bool) -> Any:
    """A send from the handler can take in the descriptor's signal of a message that came
    meanwhile; the socket asks, once the batch is handled, whether one waits (no timer
    when none does), so an echo ping-pong runs to its end on signals alone; an eager
    socket reads what waits in the same reactor turn."""
    rounds = 300
    echoed: list[bytes] = []

    def echo(batch: list[list[bytes]]) -> None:
        for frames in batch:
            assert server.send_frames(frames)

    server = factory.socket(zmq.ROUTER, echo, options(), eager_reads=eager)
    endpoint = server.bind("tcp://127.0.0.1:*")

    def answered(batch: list[list[bytes]]) -> None:
        for frames in batch:
            echoed.append(frames[0])
            if len(echoed) < rounds:
                assert client.send_frames([b"%d" % len(echoed)])

    client = factory.socket(zmq.DEALER, answered, options())
    client.connect(endpoint)
    assert client.send_frames([b"0"])
    yield wait_until(lambda: len(echoed) == rounds, what="every echo")
    assert echoed == [b"%d" % i for i in range(rounds)]
    # Idle again: nothing scheduled, the descriptor will say when the next message comes.
    yield wait_until(lambda: server.read_scheduled is None, what="the server idle")
    assert client.send_frames([b"late"])
    yield wait_until(lambda: echoed[-1] == b"late", what="the echo of a message after idling")


# -- ROUTER_MANDATORY -------------------------------------------------------------------------------


def test_router_mandatory_to_an_unknown_identity_raises_peer_unreachable(factory: Any) -> None:
    router = factory.socket(zmq.ROUTER, None, options(router_mandatory=True))
    router.bind("tcp://127.0.0.1:*")
    with pytest.raises(transport().PeerUnreachable) as caught:
        router.send_frames([b"nobody", b"hello", b"world"])
    assert caught.value.args[0] == b"nobody"


def test_router_without_mandatory_drops_silently(factory: Any) -> None:
    router = factory.socket(zmq.ROUTER, None, options(router_mandatory=False))
    router.bind("tcp://127.0.0.1:*")
    assert router.send_frames([b"nobody", b"hello"]) is True


@pytest_twisted.inlineCallbacks
def test_router_mandatory_reaches_a_known_peer_then_reports_it_gone(factory: Any) -> Any:
    router_got: list[list[bytes]] = []
    router = factory.socket(zmq.ROUTER, router_got.extend, options(router_mandatory=True))
    endpoint = router.bind("tcp://127.0.0.1:*")
    peer_factory = transport().SocketFactory(reactor)
    try:
        dealer_got: list[list[bytes]] = []
        dealer = peer_factory.socket(zmq.DEALER, dealer_got.extend, options(identity=b"peer-1"))
        dealer.connect(endpoint)
        assert dealer.send_frames([b"hello"])
        yield wait_until(lambda: router_got == [[b"peer-1", b"hello"]])
        assert router.send_frames([b"peer-1", b"reply", b"two", b"three"])
        yield wait_until(lambda: dealer_got == [[b"reply", b"two", b"three"]])
    finally:
        peer_factory.shutdown()

    def unreachable() -> bool:
        try:
            router.send_frames([b"peer-1", b"anyone there?"])
        except transport().PeerUnreachable:
            return True
        return False

    yield wait_until(unreachable, what="the ROUTER to notice the peer left")


@pytest_twisted.inlineCallbacks
def test_router_signals_when_a_full_pipe_to_a_peer_drains(factory: Any) -> Any:
    """A ROUTER has no per-peer writability event, but libzmq signals its descriptor
    when a peer's full pipe drains to half: ``on_signal`` is called then, not on the
    reads a send schedules."""
    heard: list[list[bytes]] = []
    router = factory.socket(
        zmq.ROUTER, heard.extend, options(router_mandatory=True, send_hwm=5, send_buffer=4096)
    )
    signals: list[int] = []
    router.on_signal = lambda: signals.append(1)
    endpoint = router.bind("tcp://127.0.0.1:*")
    peer_factory = transport().SocketFactory(reactor)
    try:
        got: list[list[bytes]] = []
        dealer = peer_factory.socket(
            zmq.DEALER, got.extend, options(identity=b"slow", receive_hwm=5)
        )
        dealer.connect(endpoint)
        dealer.pause_reading()
        assert dealer.send_frames([b"hello"])
        # Read: the ROUTER knows the peer by its identity only once its first message came
        # (a signal alone may be an earlier command of the connection's).
        yield wait_until(lambda: heard and signals, what="the hello, signalled")
        assert heard == [[b"slow", b"hello"]]
        big = b"x" * 65536
        sent = 0

        def full() -> bool:
            nonlocal sent
            accepted = router.send_many([[b"slow", big]] * 8)
            sent += accepted
            return accepted < 8

        yield wait_until(full, what="the pipe to the paused peer to fill")
        before = len(signals)
        dealer.resume_reading()
        yield wait_until(lambda: len(signals) > before, what="the drained pipe's signal")
        assert router.send_frames([b"slow", b"room again"])
        yield wait_until(lambda: got[-1:] == [[b"room again"]], timeout=20)
        assert len(got) == sent + 1
    finally:
        peer_factory.shutdown()


# -- shutdown ---------------------------------------------------------------------------------------


def test_socket_shutdown_is_idempotent_and_cancels_a_scheduled_read(factory: Any) -> None:
    sock = factory.socket(zmq.DEALER, None, options())
    sock.connect(f"tcp://127.0.0.1:{free_port()}")
    sock.send_frames([b"x"])  # schedules a read on the next turn
    scheduled = sock.read_scheduled
    assert scheduled is not None and scheduled.active()
    assert not sock.closed
    sock.shutdown()
    assert sock.closed
    assert not scheduled.active()
    assert sock.read_scheduled is None
    sock.shutdown()  # again: no error
    sock.doRead()  # a late reader call on a closed socket is harmless
    assert sock.closed
    assert sock.read_scheduled is None
    assert sock not in factory.txzmq_factory.connections


def test_factory_shutdown_is_idempotent_and_closes_every_socket(factory: Any) -> None:
    a = factory.socket(zmq.ROUTER, None, options())
    b = factory.socket(zmq.DEALER, None, options())
    a.bind("tcp://127.0.0.1:*")
    b.shutdown()
    assert not factory.closed
    factory.shutdown()
    assert factory.closed
    assert a.closed and b.closed
    factory.shutdown()  # txzmq's own ZmqFactory.shutdown raises the second time
    a.shutdown()
    with pytest.raises(RuntimeError):
        factory.socket(zmq.DEALER)


@pytest_twisted.inlineCallbacks
def test_watch_connections_counts_peers_as_they_come_and_go(factory: Any) -> Any:
    router = factory.socket(zmq.ROUTER, lambda batch: None, options())
    endpoint = router.bind("tcp://127.0.0.1:*")
    router.watch_connections()
    peers = [factory.socket(zmq.DEALER, None, options()) for _ in range(3)]
    for peer in peers:
        peer.connect(endpoint)
    yield wait_until(lambda: router.connections == 3, what="three peers connected")
    peers[0].shutdown()
    yield wait_until(lambda: router.connections == 2, what="one peer gone")
    router.shutdown()  # the monitor goes with it
    assert router.closed


def test_peer_outboxes_hand_memory_back_once_small_drops_add_up() -> None:
    """Answers of 100 kB dropped one at a time for a client that does not read are each
    below the MiB worth a hand-back: together they are not (2,000 of them left 190 MB of
    a broker's RSS with glibc while the client stayed)."""
    from twisted.internet.task import Clock
    from twisted.logger import Logger

    from bus.transport.outbox import PeerOutboxes
    from bus.util.memory import MemoryRelease

    class FullPipe:
        """A ROUTER whose peer's pipe is full."""

        closed = False

        def raw_send(self, frame: bytes, flags: int) -> None:
            raise zmq.Again

        def send_each(self, messages: Any) -> tuple[int, int]:
            return 0, zmq.EAGAIN

        def look_for_input(self) -> None:
            pass

    clock = Clock()
    memory = MemoryRelease(clock, delay=1.0)
    outboxes = PeerOutboxes(
        clock, Logger(), linger=30, max_bytes=100_000, max_messages=10**6, memory=memory
    )
    sock: Any = FullPipe()
    answer = [b"client", b"x" * 100_000]
    try:
        outboxes.send(sock, [answer] * 11)  # one waits, ten dropped: 1,000,060 bytes
        assert outboxes.held_messages == 1 and outboxes.dropped["queue-full"] == 10
        assert not memory.pending
        outboxes.send(sock, [answer])  # a MiB dropped in all
        assert memory.pending
        clock.advance(1.0)
        assert memory.releases == 1 and not memory.pending
        outboxes.send(sock, [answer] * 10)  # counted again from the hand-back
        assert not memory.pending
    finally:
        outboxes.stop()
        memory.stop()


@pytest_twisted.inlineCallbacks
def test_peer_outboxes_hold_in_order_bound_by_bytes_and_deliver_when_read(factory: Any) -> Any:
    from twisted.logger import Logger

    from bus.testing import RawPeer
    from bus.transport.outbox import PeerOutboxes

    got: list[list[bytes]] = []
    router = factory.socket(
        zmq.ROUTER, lambda batch: got.extend(batch), options(send_hwm=2, router_mandatory=True)
    )
    endpoint = router.bind("tcp://127.0.0.1:*")
    outboxes = PeerOutboxes(reactor, Logger(), linger=30, max_bytes=8 << 20, max_messages=10**6)
    router.on_signal = lambda: outboxes.signalled(router)
    reader = RawPeer.dealer(endpoint, identity=b"slow", receive_hwm=2)
    try:
        reader.send([b"hello"])
        yield wait_until(lambda: got == [[b"slow", b"hello"]], what="the client connected")
        reader.socket.pause_reading()  # a client that stops reading
        chunk = b"x" * 65536
        outboxes.send(router, [[b"slow", b"%d" % n, chunk] for n in range(400)])
        # 26 MB for a client that reads nothing: some went to its pipe and the kernel,
        # then up to 8 MiB waits in order, the rest is dropped and counted.
        assert outboxes.held_bytes <= 8 << 20 and outboxes.dropped["queue-full"] > 0
        waiting = outboxes.held_messages
        assert waiting > 0
        reader.socket.resume_reading()
        expected = 400 - outboxes.dropped["queue-full"]
        yield wait_until(lambda: len(reader.messages) == expected, timeout=30, what="drained")
        numbers = [int(m[0]) for m in reader.messages]
        assert numbers == sorted(numbers) and numbers[0] == 0  # in order, the oldest first
        assert outboxes.peers == 0 and outboxes.held_bytes == 0
    finally:
        outboxes.stop()
        reader.close()
