"""eventmq's PUBLISH service across brokers (``twistd -n emqp-pubsub --nats``): the
subjects and the interest, sans I/O, then two brokers on a real nats-server with
eventmq's own publisher at one and plain pyzmq SUBs at both."""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import pytest_twisted
from hypothesis import given, settings
from hypothesis import strategies as st

from bus.emqp import pubsub_cluster
from bus.emqp.pubsub_cluster import Interest, Seen
from bus.testing import RawPeer, wait_until
from tests.ports import free_ports, nats_cluster
from tests.processes import CLEAN_EXIT, TWISTD, TwistdProcess, reported
from tests.test_emqp_interop import InteropProcess
from tests.test_emqp_pubsub import (
    EXPECTED,
    PUBLICATIONS,
    PlainSubscriber,
    interop,
    publish_with_eventmq,
)
from tests.test_eventbus_subjects import matches
from tests.test_product_process import environment, metric_samples

__all__ = ["interop"]  # the fixture, used by name

PREFIX = "emqp-pubsub"


topics = st.binary(max_size=80) | st.sampled_from([b"orders", b"orders.created", b"o", b""])


@given(topic=topics, prefix=topics)
@settings(max_examples=500)
def test_a_subscriber_s_filter_takes_every_topic_its_prefix_matches(
    topic: bytes, prefix: bytes
) -> None:
    subject = pubsub_cluster.subject(PREFIX, topic)
    filter_ = pubsub_cluster.interest(PREFIX, prefix)
    if topic.startswith(prefix):
        assert matches(filter_, subject), (filter_, subject)
    # Valid subjects: no empty token, no wildcard or space inside one.
    assert all(t and not set(t) & set("*> \t\r\n") for t in subject.split("."))
    assert b"".join(pubsub_cluster.chunks(topic)) == topic
    # At least half of the prefix's bytes narrow the filter.
    narrowed = len(filter_.split(".")) - 2
    assert sum(len(c) for c in pubsub_cluster.chunks(prefix)[:narrowed]) * 2 >= len(prefix)


def test_subjects_as_the_docs_show_them() -> None:
    assert pubsub_cluster.subject(PREFIX, b"orders.created") == "emqp-pubsub.o.r.de.rs~2Ec.reated.~"
    assert pubsub_cluster.interest(PREFIX, b"orders") == "emqp-pubsub.o.r.de.>"
    assert pubsub_cluster.interest(PREFIX, b"") == "emqp-pubsub.>"
    assert pubsub_cluster.subject(PREFIX, b"") == "emqp-pubsub.~"


@given(st.lists(st.tuples(st.booleans(), topics), max_size=40))
def test_the_filters_listened_to_cover_every_prefix_and_none_covers_another(
    changes: list[tuple[bool, bytes]],
) -> None:
    interest = Interest(PREFIX)
    held: set[bytes] = set()
    listened: set[str] = set()
    for subscribe, prefix in changes:
        message = (b"\x01" if subscribe else b"\x00") + prefix
        (held.add if subscribe else held.discard)(prefix)
        added, ended = interest.changed([[message]])
        assert not set(added) & listened and set(ended) <= listened
        listened = (listened | set(added)) - set(ended)
        assert listened == interest.filters
        for prefix_held in held:
            for topic in (prefix_held, prefix_held + b"x", prefix_held + b".tail"):
                subject = pubsub_cluster.subject(PREFIX, topic)
                # Exactly one filter takes it: it comes once.
                assert sum(matches(f, subject) for f in listened) == 1
    assert bool(listened) == bool(held)


def test_past_its_limit_it_listens_to_everything_and_counts_what_is_no_subscription() -> None:
    interest = Interest(PREFIX, limit=3)
    interest.changed([[b"\x01" + p] for p in (b"aa", b"bb", b"cc")])
    assert len(interest.filters) == 3
    added, ended = interest.changed([[b"\x01dd"], [b"\x02?"], []])
    assert added == ["emqp-pubsub.>"] and len(ended) == 3
    assert interest.unknown == 2


def test_a_message_heard_twice_goes_out_once_and_the_windows_are_bounded() -> None:
    seen = Seen(window=8, origins=2)
    assert [seen.first(b"a", n) for n in (1, 2, 2, 3, 1)] == [True, True, False, True, False]
    assert seen.first(b"a", 20) and not seen.first(b"a", 12) and seen.first(b"a", 13)
    assert seen.repeats == 3
    seen.first(b"b", 1)
    seen.first(b"c", 1)  # three brokers: the least recently heard (a) is forgotten
    assert seen.first(b"a", 20)


def test_a_publication_s_payload_round_trips_and_garbage_is_refused() -> None:
    payload = pubsub_cluster.encode(b"12345678", 7, b"t\xc3\xa9", b'{"x": 1}')
    assert pubsub_cluster.decode(payload) == (b"12345678", 7, b"t\xc3\xa9", b'{"x": 1}')
    with pytest.raises(pubsub_cluster.BadPublication) as short:
        pubsub_cluster.decode(b"abc")
    assert short.value.reason == "short"
    with pytest.raises(pubsub_cluster.BadPublication) as long:
        pubsub_cluster.decode(payload[: pubsub_cluster.HEAD_BYTES + 1])
    assert long.value.reason == "topic-length"


# -- two brokers on a nats-server ------------------------------------------------------------


class Broker(TwistdProcess):
    """The product with eMQP's PUBLISH service alone (``twistd -n eventbus --services
    emqp-pubsub --emqp-pubsub-nats URL``) on free ports, its /status on HTTP."""

    def __init__(self, tmp_path: Path, name: str, nats: str, *more: str) -> None:
        self.incoming = free_ports(2)
        self.http_port = free_ports(1)
        super().__init__(
            [
                TWISTD, "-n", "--pidfile=", "eventbus", "--services", "emqp-pubsub",
                "--http-port", str(self.http_port), "--emqp-pubsub-bind", "127.0.0.1",
                "--emqp-pubsub-incoming-port", str(self.incoming),
                "--emqp-pubsub-outgoing-port", str(self.incoming + 1),
                "--emqp-pubsub-stats-interval", "0.2s", "--emqp-pubsub-nats", nats, *more,
            ],
            tmp_path / f"{name}.log",
            environment(),
            tmp_path,
        )  # fmt: skip
        self.publishers = f"tcp://127.0.0.1:{self.incoming}"
        self.subscribers = f"tcp://127.0.0.1:{self.incoming + 1}"

    def get(self, path: str) -> str:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.http_port}{path}", timeout=10) as r:
            return str(r.read().decode())

    def status(self) -> dict[str, Any]:
        return dict(json.loads(self.get("/status"))["services"]["emqp-pubsub"])

    def on_cluster(self) -> bool:
        return "the servers take messages of up to" in self.output()


@pytest.fixture
def one_nats(tmp_path: Path) -> Any:
    pytest.importorskip("nats")
    cluster = nats_cluster(tmp_path / "nats", size=1, extra="max_payload: 2048")
    cluster.start()
    yield cluster
    cluster.stop()


def filters_at(broker: Broker, count: int) -> bool:
    return len(broker.status()["cluster"]["filters"]) == count


@pytest_twisted.inlineCallbacks
def test_a_publish_at_one_broker_reaches_the_subscribers_of_both_once(
    tmp_path: Path, one_nats: Any, interop: list[InteropProcess]
) -> Any:
    url = one_nats.urls[0]
    a, b = Broker(tmp_path, "a", url), Broker(tmp_path, "b", url)
    brokers = [a, b]
    subscribers: list[PlainSubscriber] = []
    peers: list[RawPeer] = []
    try:
        yield reported(lambda: a.on_cluster() and b.on_cluster(), a.process, b.process,
                       what="both brokers on NATS")  # fmt: skip
        assert "subjects of up to" in a.output()
        # At B: the test's own prefixes, overlapping on purpose ("o" covers "orders"): one
        # filter, each message once; and a SUB of everything.
        everything = PlainSubscriber(b.subscribers, (b"",))
        subscribers.append(everything)
        # eventmq's publisher at A, a plain SUB of "orders" at A and one at B (with "o" too):
        # the same publications, in order, once each.
        overlapping = PlainSubscriber(b.subscribers, (b"orders", b"o", b"sync"))
        subscribers.append(overlapping)
        at_a = yield publish_with_eventmq(
            a.publishers, a.subscribers, tmp_path, interop, "a", [overlapping, everything],
            explain=lambda: (
                f"a: {json.dumps(a.status())}; b: {json.dumps(b.status())}; "
                f"a's log: {a.output()[-3000:]}"
            ),
        )  # fmt: skip
        assert at_a == EXPECTED

        def published(subscriber: PlainSubscriber) -> list[list[bytes]]:
            return [m for m in subscriber.read() if m[0] != b"sync"]

        orders_or_o = [
            [t.encode(), json.dumps(v).encode()] for t, v in PUBLICATIONS if t.startswith("o")
        ]
        yield wait_until(lambda: len(published(overlapping)) >= len(orders_or_o),
                         what="B's SUB to have them")  # fmt: skip
        assert published(overlapping) == orders_or_o
        every = [[t.encode(), json.dumps(v).encode()] for t, v in PUBLICATIONS]
        yield wait_until(lambda: len(published(everything)) >= len(every),
                         what="B's SUB of everything")  # fmt: skip
        assert published(everything) == every
        # A publisher at B: A's subscribers are gone, so A listens to nothing.
        yield wait_until(lambda: filters_at(a, 0), what="A's interest ended")
        status_b = b.status()["cluster"]
        assert status_b["connected"] and status_b["refused"] == {}
        # B listens to everything (its SUB of ""): what reached it from A, each once. eventmq's
        # publisher sends sync publications until the SUBs have one, and the first may go
        # before B's interest reached the NATS server, which then drops it for B (CI at
        # 9403430: A sent 9, B received 8 and its SUB had every publication).
        reached = len(everything.read())
        assert (status_b["received"], status_b["repeats_dropped"]) == (reached, 0)
        assert a.status()["cluster"]["sent"] >= reached
        # Too large for the servers (max_payload 2048): B's own SUBs have it, A never sees it.
        publisher = RawPeer.dealer(b.publishers)
        peers.append(publisher)
        at_a_sub = PlainSubscriber(a.subscribers, (b"",))
        subscribers.append(at_a_sub)
        warmups = 0
        while not at_a_sub.read():  # until A hears B (its NATS interest is in place)
            publisher.send([b"", b"eMQP/1.0", b"PUBLISH", b"w%d" % warmups, b"warm", b"0"])
            warmups += 1
            yield wait_until(lambda: at_a_sub.read(), timeout=0.2).addErrback(lambda _: None)
        big = b"x" * 4096
        publisher.send([b"", b"eMQP/1.0", b"PUBLISH", b"m1", b"big", big])
        publisher.send([b"", b"eMQP/1.0", b"PUBLISH", b"m2", b"after", b"1"])
        yield wait_until(lambda: [b"after", b"1"] in at_a_sub.read(), what="the one after")
        # Each SUB has its own context and I/O thread: B's own SUB may read the big one
        # after A's read the one after (CI, under load).
        yield wait_until(lambda: [b"big", big] in everything.read(), what="B's SUB has it")
        assert [b"big", big] not in at_a_sub.read()
        assert b.status()["cluster"]["refused"] == {"too-large-for-cluster": 1}
        samples = metric_samples(b.get("/metrics"))
        assert samples["emqp_pubsub_nats_refused_total{reason=too-large-for-cluster}"] == 1
        assert samples["emqp_pubsub_nats_connected"] == 1
    finally:
        for subscriber in subscribers:
            subscriber.close()
        for peer in peers:
            peer.close()
        codes = [broker.stop() for broker in brokers]
    assert all(code in CLEAN_EXIT for code in codes), [x.output() for x in brokers]
    for broker in brokers:
        assert "Traceback" not in broker.output()


@pytest_twisted.inlineCallbacks
def test_its_own_publications_heard_back_on_another_connection_go_out_once(
    tmp_path: Path, one_nats: Any
) -> Any:
    """``echo: false`` holds for one connection: a broker's publications sent on a connection
    it has left (its server cut off with them, then healed and routing them to the server it
    moved to) come back on its new one. Its subscribers had them already (CI at 2c71018: two
    SUBs received three publications twice after a nats-server's host was cut). Here another
    connection sends what the broker's old one would have: the broker's origin, a sequence
    it sent; then one of another broker's, which goes out."""
    from bus.nats.blocking import connection
    from bus.nats.settings import NatsSettings

    broker = Broker(tmp_path, "a", one_nats.urls[0])
    subscriber: PlainSubscriber | None = None
    try:
        yield reported(broker.on_cluster, broker.process, what="the broker on NATS")
        subscriber = PlainSubscriber(broker.subscribers, (b"",))
        yield wait_until(lambda: filters_at(broker, 1), what="its interest on NATS")
        origin = bytes.fromhex(broker.status()["cluster"]["origin"])
        subject = pubsub_cluster.subject(PREFIX, b"orders")
        with connection(NatsSettings((one_nats.urls[0],)), name="the-old-connection") as old:
            old.publish(subject, pubsub_cluster.encode(origin, 1, b"orders", b"again"))
            old.publish(subject, pubsub_cluster.encode(b"another!", 1, b"orders", b"other"))
            old.flush(10)
        yield wait_until(lambda: [b"orders", b"other"] in subscriber.read(),
                         what="the other broker's publication")  # fmt: skip
        # One connection, in order: the broker read its own one before the other one.
        assert [b"orders", b"again"] not in subscriber.read()
        cluster = broker.status()["cluster"]
        assert (cluster["own_returned"], cluster["received"]) == (1, 1)
        samples = metric_samples(broker.get("/metrics"))
        assert samples["emqp_pubsub_nats_own_returned_total"] == 1
    finally:
        if subscriber is not None:
            subscriber.close()
        code = broker.stop()
    assert code in CLEAN_EXIT, broker.output()
    assert "Traceback" not in broker.output()


def test_an_unreachable_cluster_ends_the_start_in_one_line(tmp_path: Path) -> None:
    from tests.processes import exit_status

    port = free_ports(3)
    alone = TwistdProcess(
        [TWISTD, "-n", "--pidfile=", "emqp-pubsub", "--incoming-port", str(port + 1),
         "--outgoing-port", str(port + 2), "--nats", f"nats://127.0.0.1:{port}"],
        tmp_path / "alone.log", environment(), tmp_path,
    )  # fmt: skip
    code = exit_status(alone.process)
    alone.log.close()
    assert code == 1, alone.output()
    assert f"cannot start emqp-pubsub: --nats nats://127.0.0.1:{port}" in alone.output()
