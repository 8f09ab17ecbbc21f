"""The mc0 broker core with a task.Clock: verbs, replies in each peer's framing, fan-out,
TTL NOOPs and expiry, bad input answered with ERROR and counted."""

from __future__ import annotations

import pytest
from twisted.internet.task import Clock

from bus.mc0 import codec
from bus.mc0.core import Broker, BrokerSettings, SendResult

A, B, C = b"peer-a", b"peer-b", b"peer-c"


class Wire:
    """What the broker sent, per peer; peers listed in ``full``/``gone`` refuse."""

    def __init__(self) -> None:
        self.sent: list[list[bytes]] = []
        self.full: set[bytes] = set()
        self.gone: set[bytes] = set()

    def __call__(self, frames: list[bytes]) -> SendResult:
        if frames[0] in self.gone:
            return SendResult.GONE
        if frames[0] in self.full:
            return SendResult.FULL
        self.sent.append(frames)
        return SendResult.SENT

    def to(self, identity: bytes) -> list[list[bytes]]:
        return [frames[1:] for frames in self.sent if frames[0] == identity]

    def clear(self) -> None:
        self.sent.clear()


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def wire() -> Wire:
    return Wire()


def make(clock: Clock, wire: Wire, **settings: object) -> Broker:
    return Broker(BrokerSettings(**settings), clock, wire)  # type: ignore[arg-type]


def test_connect_with_id_is_acknowledged_in_the_peers_framing(clock: Clock, wire: Wire) -> None:
    broker = make(clock, wire)
    broker.receive(A, [b"", b"CONNECT", b"ID", b"c1", b"TTL", b"30000", b"VERSION", b"0.2"])
    broker.receive(B, [b"CONNECT", b"VERSION", b"0.1", b"TTL", b"1000", b"ID", b"c2"])
    assert wire.to(A) == [[b"", b"OK", b"ID", b"c1"]]
    assert wire.to(B) == [[b"OK", b"ID", b"c2"]]
    assert broker.clients[A].ttl == 30.0 and broker.clients[A].version == b"0.2"
    assert broker.clients[B].ttl == 1.0


def test_commands_without_id_get_no_reply(clock: Clock, wire: Wire) -> None:
    broker = make(clock, wire)
    broker.receive(A, [b"CONNECT", b"TTL", b"1000"])
    broker.receive(A, [b"SUB", b"", b"t"])
    broker.receive(A, [b"NOOP"])
    assert wire.sent == []
    assert broker.topics == {b"t": {A: broker.clients[A]}}


def test_put_fans_out_to_exact_topic_subscribers_sender_included(clock: Clock, wire: Wire) -> None:
    broker = make(clock, wire)
    broker.receive(A, [b"", b"SUB", b"", b"t", b"u"])
    broker.receive(B, [b"SUB", b"", b"t"])
    broker.receive(C, [b"SUB", b"", b"t.sub", b"T"])
    broker.receive(A, [b"", b"PUT", b"ID", b"p1", b"TOPIC", b"t", b"X-k", b"v", b"", b"body", b"2"])
    assert wire.to(A) == [
        [b"", b"MESSAGE", b"TOPIC", b"t", b"X-k", b"v", b"", b"body", b"2"],
        [b"", b"OK", b"ID", b"p1"],
    ]
    assert wire.to(B) == [[b"MESSAGE", b"TOPIC", b"t", b"X-k", b"v", b"", b"body", b"2"]]
    assert wire.to(C) == []
    assert broker.delivered == 2


def test_unsub_and_disconnect_drop_subscriptions(clock: Clock, wire: Wire) -> None:
    broker = make(clock, wire)
    broker.receive(A, [b"SUB", b"", b"t", b"u"])
    broker.receive(B, [b"SUB", b"", b"t"])
    broker.receive(A, [b"UNSUB", b"ID", b"1", b"", b"t"])
    assert set(broker.topics) == {b"t", b"u"} and set(broker.topics[b"t"]) == {B}
    broker.receive(B, [b"", b"DISCONNECT", b"ID", b"2"])
    assert B not in broker.clients and set(broker.topics) == {b"u"}
    assert wire.to(B) == [[b"", b"OK", b"ID", b"2"]]
    wire.clear()
    broker.receive(C, [b"PUT", b"TOPIC", b"t", b"", b"x"])
    assert wire.sent == []


def test_a_subscriber_answers_in_the_framing_it_used_last(clock: Clock, wire: Wire) -> None:
    broker = make(clock, wire)
    broker.receive(A, [b"SUB", b"", b"t"])
    broker.receive(A, [b"", b"NOOP"])
    broker.receive(B, [b"PUT", b"TOPIC", b"t", b"", b"x"])
    assert wire.to(A) == [[b"", b"MESSAGE", b"TOPIC", b"t", b"", b"x"]]


@pytest.mark.parametrize(
    ("frames", "reply", "reason"),
    [
        (
            [b"", b"PUT", b"ID", b"5", b"TOPIC"],
            [b"", b"ERROR", b"MESSAGE", None, b"ID", b"5"],
            "odd-headers",
        ),
        ([b"FROB", b"ID", b"9"], [b"ERROR", b"MESSAGE", None, b"ID", b"9"], "unknown-verb"),
        ([b"", b"PUT", b"", b"x"], [b"", b"ERROR", b"MESSAGE", None], "no-topic"),
        (
            [b"CONNECT", b"TTL", b"5", b"ID", b"t"],
            [b"ERROR", b"MESSAGE", None, b"ID", b"t"],
            "bad-ttl",
        ),
    ],
)
def test_bad_input_is_answered_with_error_and_counted(
    clock: Clock, wire: Wire, frames: list[bytes], reply: list[bytes | None], reason: str
) -> None:
    broker = make(clock, wire)
    broker.receive(A, frames)
    [sent] = wire.to(A)
    text_at = reply.index(None)
    assert sent[:text_at] == reply[:text_at] and sent[text_at + 1 :] == reply[text_at + 1 :]
    assert sent[text_at]
    assert broker.errors.counts[reason] == 1
    assert A not in broker.clients


def test_the_unknown_verb_text_names_the_verb(clock: Clock, wire: Wire) -> None:
    broker = make(clock, wire)
    broker.receive(A, [b"", b"FROB"])
    assert wire.to(A) == [[b"", b"ERROR", b"MESSAGE", b"Unknown command verb 'FROB'"]]


def test_oversized_messages_are_refused(clock: Clock, wire: Wire) -> None:
    broker = make(clock, wire, max_message_bytes=100)
    broker.receive(A, [b"SUB", b"", b"t"])
    broker.receive(B, [b"PUT", b"ID", b"big", b"TOPIC", b"t", b"", b"x" * 200])
    assert wire.to(A) == []
    assert wire.to(B)[0][:2] == [b"ERROR", b"MESSAGE"]
    assert wire.to(B)[0][-2:] == [b"ID", b"big"]
    assert broker.errors.counts["oversized"] == 1


def test_noop_after_095_ttl_without_sending(clock: Clock, wire: Wire) -> None:
    broker = make(clock, wire)
    broker.receive(A, [b"", b"CONNECT", b"TTL", b"1000"])
    clock.advance(0.9)
    broker.receive(A, [b"", b"NOOP"])  # heard: no expiry, but nothing was sent to it yet
    clock.advance(0.04)
    assert wire.to(A) == []
    clock.advance(0.011)
    assert wire.to(A) == [[b"", b"NOOP"]]
    # Something sent to it (an OK) pushes the next NOOP back.
    clock.advance(0.5)
    broker.receive(A, [b"", b"NOOP", b"ID", b"n"])
    clock.advance(0.9)
    assert wire.to(A)[1:] == [[b"", b"OK", b"ID", b"n"]]
    clock.advance(0.06)
    assert wire.to(A)[2:] == [[b"", b"NOOP"]]
    assert broker.noops_sent == 2


def test_a_client_silent_for_105_ttl_is_forgotten(clock: Clock, wire: Wire) -> None:
    broker = make(clock, wire)
    broker.receive(A, [b"CONNECT", b"TTL", b"1000"])
    broker.receive(A, [b"SUB", b"", b"t"])
    clock.advance(1.04)
    assert A in broker.clients
    clock.advance(0.011)
    assert A not in broker.clients and broker.topics == {}
    assert broker.expired == 1
    assert clock.getDelayedCalls() == []


def test_a_broker_woken_late_puts_off_an_expiry_once_per_silence(clock: Clock, wire: Wire) -> None:
    """A timer that fires later than the margin between NOOP and expiry says the broker did
    not run (a stall): what its clients sent meanwhile may wait unread, so none is forgotten
    then. Each gets its NOOP and 1.05 x TTL from that wake, once per silence."""
    broker = make(clock, wire)
    for peer in (A, B):
        broker.receive(peer, [b"CONNECT", b"TTL", b"1000"])
        broker.receive(peer, [b"SUB", b"", b"t"])
    clock.advance(3.0)  # stalled through both NOOPs and expiries
    assert A in broker.clients and B in broker.clients and broker.expired == 0
    assert wire.to(A)[-1] == wire.to(B)[-1] == [b"NOOP"]
    assert broker.expiries_put_off == 2
    broker.receive(A, [b"NOOP"])  # what waited unread: A goes on; B stays silent
    clock.advance(3.0)  # stalled again: A, heard since, is put off again; B is forgotten
    assert A in broker.clients and B not in broker.clients
    assert broker.expiries_put_off == 3 and broker.expired == 1
    # On time from here: A, silent, goes 1.05 x TTL after that wake.
    clock.advance(1.04)
    assert A in broker.clients
    clock.advance(0.011)
    assert A not in broker.clients and broker.expired == 2
    assert clock.getDelayedCalls() == []


def test_traffic_keeps_a_client(clock: Clock, wire: Wire) -> None:
    broker = make(clock, wire)
    broker.receive(A, [b"CONNECT", b"TTL", b"1000"])
    for _ in range(10):
        clock.advance(0.5)
        broker.receive(A, [b"NOOP"])
    assert A in broker.clients
    assert len(clock.getDelayedCalls()) == 1  # one lazy timer per client


def test_a_client_without_connect_gets_the_default_ttl(clock: Clock, wire: Wire) -> None:
    broker = make(clock, wire, default_ttl_ms=2000)
    broker.receive(A, [b"SUB", b"", b"t"])
    assert broker.clients[A].ttl == 2.0
    clock.advance(1.9)  # its NOOP, on time (a wake later than 2.1 s would put it off)
    clock.advance(0.21)
    assert A not in broker.clients


def test_a_gone_peer_is_forgotten_and_a_full_one_counted(clock: Clock, wire: Wire) -> None:
    broker = make(clock, wire)
    for peer in (A, B, C):
        broker.receive(peer, [b"SUB", b"", b"t"])
    wire.gone.add(A)
    wire.full.add(B)
    broker.receive(C, [b"PUT", b"TOPIC", b"t", b"", b"x"])
    assert broker.undelivered == {"full": 1, "gone": 1}
    assert A not in broker.clients and B in broker.clients
    assert broker.delivered == 1


def test_put_observer_sees_every_put(clock: Clock, wire: Wire) -> None:
    seen: list[tuple[bytes, codec.Put]] = []
    broker = Broker(BrokerSettings(), clock, wire, on_put=lambda c, p: seen.append((c.identity, p)))
    broker.receive(A, [b"PUT", b"TOPIC", b"nobody", b"ID", b"1", b"", b"x"])
    assert seen == [(A, codec.Put(b"nobody", ((b"TOPIC", b"nobody"),), (b"x",), b"1"))]


def test_too_many_clients(clock: Clock, wire: Wire) -> None:
    broker = make(clock, wire, max_clients=2)
    broker.receive(A, [b"NOOP"])
    broker.receive(B, [b"NOOP"])
    broker.receive(C, [b"NOOP", b"ID", b"x"])
    assert C not in broker.clients
    assert wire.to(C)[0][0] == b"ERROR" and wire.to(C)[0][-1] == b"x"


def test_close_cancels_timers(clock: Clock, wire: Wire) -> None:
    broker = make(clock, wire)
    broker.receive(A, [b"NOOP"])
    broker.close()
    assert clock.getDelayedCalls() == []


def test_too_many_topics_for_one_client(clock: Clock, wire: Wire) -> None:
    broker = make(clock, wire, max_topics_per_client=3)
    broker.receive(A, [b"SUB", b"", b"a", b"b"])
    broker.receive(A, [b"SUB", b"ID", b"s", b"", b"b", b"c", b"d"])
    assert broker.clients[A].topics == {b"a", b"b"}
    [reply] = wire.to(A)
    assert reply[0] == b"ERROR" and reply[-2:] == [b"ID", b"s"]
    assert broker.errors.counts["too-many-topics"] == 1
    broker.receive(A, [b"SUB", b"ID", b"s2", b"", b"b", b"c"])  # three in all: fine
    assert broker.clients[A].topics == {b"a", b"b", b"c"}


class ManyWire(Wire):
    """A wire that also takes many messages a call, as the service's socket does."""

    def __init__(self) -> None:
        super().__init__()
        self.calls = 0

    def many(self, messages: list[list[bytes]]) -> tuple[int, SendResult]:
        self.calls += 1
        for sent, frames in enumerate(messages):
            result = self(frames)
            if result is not SendResult.SENT:
                return sent, result
        return len(messages), SendResult.SENT


@pytest.mark.parametrize("many", [False, True])
def test_a_batch_of_noops_is_acknowledged_as_one_by_one_in_order(clock: Clock, many: bool) -> None:
    """The known clients' ``["", NOOP, ID, id]`` take a short way: the same OKs, in the
    same order among the other answers, the same counts and times."""
    wire = ManyWire()
    broker = Broker(BrokerSettings(), clock, wire, transmit_many=wire.many if many else None)
    broker.receive(A, [b"", b"CONNECT", b"ID", b"c"])
    broker.receive(B, [b"", b"SUB", b"ID", b"s", b"", b"t"])
    wire.clear()
    clock.advance(5)
    batch = [
        [A, b"", b"NOOP", b"ID", b"n1"],
        [B, b"", b"NOOP", b"ID", b"n2"],
        [A, b"", b"PUT", b"TOPIC", b"t", b"ID", b"p", b"", b"body"],
        [A, b"NOOP", b"ID", b"spec"],  # another framing: the long way
        [C, b"", b"NOOP", b"ID", b"new"],  # not a client yet: the long way
        [B, b"", b"NOOP", b"ID", b"n3"],
    ]
    broker.receive_batch(batch)
    assert wire.sent == [
        [A, b"", b"OK", b"ID", b"n1"],
        [B, b"", b"OK", b"ID", b"n2"],
        [B, b"", b"MESSAGE", b"TOPIC", b"t", b"", b"body"],
        [A, b"", b"OK", b"ID", b"p"],
        [A, b"OK", b"ID", b"spec"],
        [C, b"", b"OK", b"ID", b"new"],
        [B, b"", b"OK", b"ID", b"n3"],
    ]
    assert broker.commands["Noop"] == 5 and broker.acknowledged == 2 + 6
    assert broker.clients[A].last_heard == broker.clients[B].last_sent == 5
    assert broker.clients[A].framing is codec.Framing.SPEC


def test_noops_too_large_for_the_limits_are_refused_as_before(clock: Clock, wire: Wire) -> None:
    broker = make(clock, wire, max_message_bytes=16)
    broker.receive(A, [b"", b"CONNECT"])
    broker.receive_batch([[A, b"", b"NOOP", b"ID", b"x" * 20]])
    assert wire.to(A)[0][1] == b"ERROR" and broker.acknowledged == 0


def test_batched_sends_forget_gone_peers_and_count_full_ones(clock: Clock) -> None:
    wire = ManyWire()
    broker = Broker(BrokerSettings(), clock, wire, transmit_many=wire.many)
    for peer in (A, B, C):
        broker.receive(peer, [b"", b"SUB", b"", b"t"])
    wire.gone.add(A)
    wire.full.add(B)
    clock.advance(3)
    broker.receive(C, [b"", b"PUT", b"TOPIC", b"t", b"", b"hello"])
    assert broker.delivered == 1
    assert broker.undelivered == {"full": 1, "gone": 1}
    assert A not in broker.clients and B in broker.clients
    assert broker.clients[C].last_sent == 3 and broker.clients[B].last_sent == 0
    # The NOOPs of a batch: a gone peer is forgotten, a full one only misses its OK.
    wire.clear()
    broker.receive_batch([[B, b"", b"NOOP", b"ID", b"1"], [C, b"", b"NOOP", b"ID", b"2"]])
    assert wire.sent == [[C, b"", b"OK", b"ID", b"2"]]
    wire.gone.add(C)
    broker.receive_batch([[C, b"", b"NOOP", b"ID", b"3"]])
    assert C not in broker.clients
