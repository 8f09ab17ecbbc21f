"""The compiled helper bus.transport._frames against pyzmq itself, through real sockets:
whatever messages a peer sends, it reads the same whole messages pyzmq reads, in the same
order, with the same peer properties; what it sends arrives as pyzmq would have sent it.
(tests/test_transport.py runs the socket layer both ways.)"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
import zmq
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bus.transport import frames
from tests.ports import free_port

native = frames.native
needs_native = pytest.mark.skipif(native is None, reason="bus.transport._frames not built")

messages_strategy = st.lists(
    st.lists(st.binary(max_size=300), min_size=1, max_size=9), min_size=1, max_size=40
)


@pytest.fixture(scope="module")
def pair() -> Iterator[tuple[Any, Any]]:
    """A raw ROUTER and a DEALER connected to it over TCP (the ROUTER's reads carry a
    Peer-Address)."""
    context = zmq.Context()
    router = context.socket(zmq.ROUTER)
    router.linger = 0
    port = router.bind_to_random_port("tcp://127.0.0.1")
    dealer = context.socket(zmq.DEALER)
    dealer.linger = 0
    dealer.connect(f"tcp://127.0.0.1:{port}")
    yield router, dealer
    router.close()
    dealer.close()
    context.term()


def send_all(sock: Any, messages: list[list[bytes]]) -> None:
    for message in messages:
        sock.send_multipart(message)


def read_all(router: Any, count: int, budget: int) -> tuple[list[list[bytes]], list[Any]]:
    """``count`` messages through the helper, ``budget`` at a time; every call's results."""
    assert native is not None
    got: list[list[bytes]] = []
    calls: list[Any] = []
    deadline = time.monotonic() + 10
    while len(got) < count and time.monotonic() < deadline:
        batch, error, addresses, user_ids = native.read(router.underlying, budget, True, True)
        calls.append((len(batch), error, addresses, user_ids))
        got += batch
        if error:
            router.poll(100)
    return got, calls


@needs_native
@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(messages=messages_strategy, budget=st.integers(1, 50))
def test_it_reads_the_whole_messages_pyzmq_reads(
    pair: tuple[Any, Any], messages: list[list[bytes]], budget: int
) -> None:
    router, dealer = pair
    send_all(dealer, messages)
    got, calls = read_all(router, len(messages), budget)
    identity = got[0][0]
    assert got == [[identity, *message] for message in messages]
    for size, error, addresses, user_ids in calls:
        # 0 when the budget ran out (more may wait); EAGAIN when the socket had no more.
        assert size == budget if error == 0 else (size < budget and error == zmq.EAGAIN)
        assert addresses == ["127.0.0.1"] * size and user_ids == [""] * size
    # And pyzmq reads the same thing (the same messages once more).
    send_all(dealer, messages)
    again = [router.recv_multipart() for _ in messages]
    assert again == got


@needs_native
@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(messages=messages_strategy, kinds=st.lists(st.sampled_from("bam"), min_size=1))
def test_what_it_sends_arrives_whole_and_in_order(
    pair: tuple[Any, Any], messages: list[list[bytes]], kinds: str
) -> None:
    assert native is not None
    router, dealer = pair
    # Frames as bytes, bytearray or memoryview: anything with a buffer goes.
    kind = {"b": bytes, "a": bytearray, "m": memoryview}
    mixed = [
        [kind[kinds[(i + j) % len(kinds)]](frame) for j, frame in enumerate(message)]
        for i, message in enumerate(messages)
    ]
    assert native.send(dealer.underlying, mixed) == (len(messages), 0)
    got = []
    for _ in messages:
        assert router.poll(5000)
        got.append(router.recv_multipart()[1:])
    assert got == messages


def test_bad_messages_to_send_are_refused_and_nothing_of_them_is_sent(
    pair: tuple[Any, Any],
) -> None:
    if native is None:
        pytest.skip("bus.transport._frames not built")
    router, dealer = pair
    with pytest.raises(ValueError):
        native.send(dealer.underlying, [[b"one"], []])
    with pytest.raises(TypeError):
        native.send(dealer.underlying, [[b"two"], 5])
    with pytest.raises(TypeError):  # a frame without a buffer, behind one that has one
        native.send(dealer.underlying, [[b"three", bytearray(b"x"), "text"]])
    assert native.send(dealer.underlying, [[b"four", memoryview(b"x")]]) == (1, 0)
    got = []
    for _ in range(3):
        assert router.poll(5000)
        got.append(router.recv_multipart()[1:])
    # The whole messages before each bad one went; nothing of the bad ones.
    assert got == [[b"one"], [b"two"], [b"four", b"x"]]
    assert not router.poll(100)


def test_at_the_high_water_mark_it_stops_with_eagain() -> None:
    if native is None:
        pytest.skip("bus.transport._frames not built")
    context = zmq.Context()
    try:
        dealer = context.socket(zmq.DEALER)
        dealer.linger = 0
        dealer.sndhwm = 3
        dealer.connect(f"tcp://127.0.0.1:{free_port()}")  # nobody: nothing leaves the queue
        sent, error = native.send(dealer.underlying, [[b"m", b"%d" % i] for i in range(50)])
        assert 1 <= sent <= 3 and error == zmq.EAGAIN
        dealer.close()
    finally:
        context.term()


def test_readable_says_whether_a_message_waits() -> None:
    from bus.transport.frames import native

    if native is None:
        pytest.skip("bus.transport._frames was not built here")
    context = zmq.Context()
    try:
        receiver, sender = context.socket(zmq.PAIR), context.socket(zmq.PAIR)
        receiver.bind("inproc://readable")
        sender.connect("inproc://readable")
        assert native.readable(receiver.underlying) is False
        sender.send_multipart([b"a", b"b"])
        assert native.readable(receiver.underlying) is True
        assert receiver.recv_multipart() == [b"a", b"b"]
        assert native.readable(receiver.underlying) is False
        receiver.close(), sender.close()
    finally:
        context.term()
