"""bus.nats.sequenced against a real nats-server, a message at a time and in atomic
batches: each message stored at the sequence it was sent for, pipelined; a message whose
id the stream holds, a writer that appended meanwhile, a message too large, and a stop
are each said as such, and the stream then holds exactly what was acknowledged."""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterator
from typing import Any

import pytest

from bus.nats import jsapi
from bus.nats.admin import StreamAdmin
from bus.nats.blocking import Connection
from bus.nats.publish import TooLarge
from bus.nats.sequenced import Misplaced, Placed, Repeated, SequencedPublisher
from bus.nats.servers import NatsCluster

_NAMES = itertools.count(1)


@pytest.fixture
def stream(nats_server: NatsCluster) -> Iterator[tuple[Connection, StreamAdmin, str]]:
    """A connection and a new stream starting at sequence 101 (subjects ``<name>.>``)."""
    name = f"SEQ{next(_NAMES)}"
    connection = Connection(nats_server.urls, timeout=10)
    admin = StreamAdmin(connection, name)
    admin.create(
        {"name": name, "subjects": [f"{name.lower()}.>"], "storage": "file",
         "num_replicas": 1, "allow_atomic": True, "first_seq": 101}
    )  # fmt: skip
    yield connection, admin, name
    connection.close()


def messages(name: str, first: int, count: int, ids: bool = True) -> list[Placed]:
    subject = f"{name.lower()}.m".encode()
    return [
        Placed(s, subject, b"id-%d" % s if ids else b"", json.dumps(s).encode())
        for s in range(first, first + count)
    ]


def held(connection: Connection, name: str) -> dict[int, Any]:
    state = StreamAdmin(connection, name).info()
    assert state is not None
    last = int(state["state"]["last_seq"])
    found = {}
    for sequence in range(int(state["state"]["first_seq"]), last + 1):
        message = StreamAdmin(connection, name).message(sequence)
        if message is not None:
            found[sequence] = json.loads(message[2])
    return found


@pytest.mark.parametrize("atomic", [False, True], ids=["each", "atomic"])
def test_each_message_is_stored_at_its_sequence_pipelined(
    stream: tuple[Connection, StreamAdmin, str], atomic: bool
) -> None:
    connection, admin, name = stream
    told: list[int] = []
    publisher = SequencedPublisher(connection, window=3000, atomic=atomic)
    last = publisher.publish(messages(name, 101, 4321), 10.0, stored=told.append)
    assert last == 4421 and told[-1] == 4421 and told == sorted(told)
    info = admin.info()
    assert info is not None
    assert (info["state"]["first_seq"], info["state"]["last_seq"]) == (101, 4421)
    assert info["state"]["messages"] == 4321
    assert StreamAdmin(connection, name).message(2000) is not None
    assert json.loads(StreamAdmin(connection, name).message(2000)[2]) == 2000  # type: ignore[index]


@pytest.mark.parametrize("atomic", [False, True], ids=["each", "atomic"])
def test_an_id_the_stream_holds_stops_there_and_nothing_after_it_is_stored(
    stream: tuple[Connection, StreamAdmin, str], atomic: bool
) -> None:
    connection, admin, name = stream
    publisher = SequencedPublisher(connection, window=2000, atomic=atomic)
    publisher.publish(messages(name, 101, 10), 10.0)
    again = messages(name, 111, 3000)
    again[1500] = again[1500]._replace(msg_id=b"id-105")  # held at 105
    with pytest.raises(Repeated) as repeated:
        publisher.publish(again, 10.0)
    info = admin.info()
    assert info is not None
    stopped = int(info["state"]["last_seq"])
    if atomic:  # the batch holding it is refused whole; which message is not said
        assert repeated.value.batch and repeated.value.sequence == stopped + 1
        assert stopped < 1611 <= stopped + jsapi.ATOMIC_LIMIT
    else:
        assert (repeated.value.sequence, stopped) == (1611, 1610)
    # Sent again from there, that one without its id: everything is stored, in place.
    rest = [m._replace(msg_id=b"") if m.sequence == 1611 else m for m in again[stopped - 110 :]]
    SequencedPublisher(connection, atomic=atomic).publish(rest, 10.0)
    found = held(connection, name)
    assert sorted(found) == list(range(101, 3111)) and all(found[s] == s for s in found)


@pytest.mark.parametrize("atomic", [False, True], ids=["each", "atomic"])
def test_a_message_another_writer_appended_is_noticed(
    stream: tuple[Connection, StreamAdmin, str], atomic: bool
) -> None:
    connection, _, name = stream
    publisher = SequencedPublisher(connection, atomic=atomic)
    publisher.publish(messages(name, 101, 5), 10.0)
    answer = connection.request(f"{name.lower()}.other", b'"someone"', timeout=10)
    assert jsapi.stored_sequence(answer.payload) == 106
    with pytest.raises(Misplaced) as misplaced:
        publisher.publish(messages(name, 106, 50), 10.0)
    assert misplaced.value.sequence == 106
    assert "wrong last sequence" in str(misplaced.value)
    # Ours for 106 is refused. Those after it that were sent expect the sequence before
    # their own: one at a time, they may be stored after the other writer's, each at its
    # own place, never shifted (an atomic batch, checked by its first, is refused whole).
    found = held(connection, name)
    assert found[106] == "someone"
    assert all(found[s] == s for s in found if s != 106)
    if atomic:
        assert max(found) == 106


@pytest.mark.parametrize("atomic", [False, True], ids=["each", "atomic"])
def test_a_message_too_large_and_a_stop(
    stream: tuple[Connection, StreamAdmin, str], atomic: bool
) -> None:
    connection, admin, name = stream
    publisher = SequencedPublisher(connection, window=1000, atomic=atomic)
    big = messages(name, 101, 3)
    big[2] = big[2]._replace(body=b"x" * (connection.max_payload + 1))
    with pytest.raises(TooLarge):
        publisher.publish(big, 10.0)
    info = admin.info()
    assert info is not None and info["state"]["last_seq"] == 100  # its chunk was not sent

    sent: list[int] = []

    def endless() -> Iterator[Placed]:
        for message in messages(name, 101, 10**6):
            sent.append(message.sequence)
            yield message

    told: list[int] = []
    last = publisher.publish(endless(), 10.0, stored=told.append, stop=lambda: bool(told))
    # What was sent before the stop is waited for, and nothing is sent after it.
    assert last == sent[-1] == told[-1] and last < 10**6
    info = admin.info()
    assert info is not None and info["state"]["last_seq"] == last
