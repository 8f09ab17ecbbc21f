"""What the Event BUS's settings make, without a socket: each port's socket
(:meth:`bus.eventbus.config.EventBusConfig.port_sockets`) and the search for three
consecutive free ports (:func:`bus.transport.zmqsocket.bind_consecutive`)."""

from __future__ import annotations

import errno

import pytest
import zmq

from bus.errors import StartupError
from bus.eventbus.codec import MAX_SUBTREE_SPEC_BYTES, MAX_TOPIC_BYTES
from bus.eventbus.config import EventBusConfig
from bus.transport.zmqsocket import bind_consecutive, ephemeral_range


def test_port_sockets_follow_the_settings_in_port_order() -> None:
    config = EventBusConfig(
        snapshot_hwm=7, publish_hwm=8, collector_hwm=9, read_budget=33, tcp_keepalive_idle=None
    )
    snapshot, publisher, collector = config.port_sockets(rights=False, publish_rights=False)
    assert [p.name for p in (snapshot, publisher, collector)] == [
        "snapshot",
        "publisher",
        "collector",
    ]
    assert (snapshot.kind, publisher.kind, collector.kind) == (zmq.ROUTER, zmq.PUB, zmq.ROUTER)
    assert snapshot.options.send_hwm == 7 and snapshot.options.router_mandatory
    assert snapshot.options.max_message_size == MAX_SUBTREE_SPEC_BYTES + 1024
    assert publisher.options.send_hwm == 8 and publisher.read_budget == 1
    assert collector.options.receive_hwm == 9 and collector.read_budget == 33
    assert collector.options.max_message_size == config.max_data_bytes + MAX_TOPIC_BYTES + 4096
    assert all(p.options.tcp_keepalive_idle is None for p in (snapshot, publisher, collector))
    assert not any(p.options.peer_user_ids or p.manual_subscriptions for p in (snapshot, publisher))


def test_with_an_allow_list_subscriptions_are_the_servers_and_user_ids_kept() -> None:
    config = EventBusConfig()
    snapshot, publisher, collector = config.port_sockets(rights=True, publish_rights=False)
    assert publisher.kind == zmq.XPUB and publisher.manual_subscriptions
    assert snapshot.options.peer_user_ids and publisher.options.peer_user_ids
    assert not collector.options.peer_user_ids  # no certificate names publish
    *_, collector = config.port_sockets(rights=True, publish_rights=True)
    assert collector.options.peer_user_ids


def in_use(base: int) -> None:
    raise zmq.ZMQError(errno.EADDRINUSE)


def test_a_given_base_that_is_taken_names_the_port_option() -> None:
    with pytest.raises(StartupError) as raised:
        bind_consecutive(in_use, lambda: None, base=5556, count=3, host="127.0.0.1")
    assert raised.value.option == "port"
    assert "127.0.0.1, ports 5556-5558" in str(raised.value)


def test_base_zero_tries_random_bases_closing_after_each_in_use() -> None:
    tried: list[int] = []
    closed: list[int] = []

    def open_at(base: int) -> None:
        tried.append(base)
        if len(tried) < 3:
            in_use(base)

    bind_consecutive(open_at, lambda: closed.append(1), base=0, count=3, host="h")
    assert len(tried) == 3 and len(closed) == 2
    # Where the kernel itself picks ports for port 0, never below (services' fixed ports,
    # and those the tests keep for servers they start: tests/ports.py).
    low, high = ephemeral_range()
    assert all(low <= base and base + 2 <= high for base in tried), (tried, low, high)
    assert all(20000 <= base < 60000 for base in tried)
    with pytest.raises(RuntimeError):
        bind_consecutive(in_use, lambda: None, base=0, count=3, host="h", attempts=4)


def test_base_zero_gives_up_at_once_on_another_error() -> None:
    def no_address(base: int) -> None:
        raise zmq.ZMQError(errno.EADDRNOTAVAIL)

    with pytest.raises(zmq.ZMQError):
        bind_consecutive(no_address, lambda: None, base=0, count=3, host="h")
