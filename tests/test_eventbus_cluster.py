"""Front-ends on a three-node JetStream cluster (R3 stream), real nats-server processes:
while events flow through two front-ends, the stream's leader is killed (kill -9), then
started again, and the node a front-end is connected to is killed too. A checker over
what the subscribers saw: every event published is broadcast exactly once at each
front-end, under gapless sequences in the same order at both."""

from __future__ import annotations

import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import pytest_twisted
from twisted.internet import reactor
from twisted.internet.task import deferLater

from bus.eventbus.codec import HEARTBEAT_TOPIC, SEQUENCE
from bus.eventbus.config import EventBusConfig, JetStreamSettings
from bus.nats.servers import NatsCluster
from bus.testing import RawPeer, wait_until
from tests.eventbus_helpers import pub
from tests.ports import nats_cluster

pytest.importorskip("nats")


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[NatsCluster]:
    nodes = nats_cluster(tmp_path / "nats", size=3)
    nodes.start()
    yield nodes
    nodes.stop()


def front_end(cluster: NatsCluster, data_dir: Path) -> Any:
    from bus.eventbus.frontend import EventBusFrontEnd

    config = EventBusConfig(
        port=0, data_dir=data_dir, stats_interval=0, heartbeat_interval=0.2,
        storage_retry_max=0.5,
    )  # fmt: skip
    stream = JetStreamSettings(tuple(cluster.urls), replicas=3, ack_timeout=2.0)
    return EventBusFrontEnd(config, stream)


def events(peer: RawPeer) -> list[list[bytes]]:
    return [m for m in peer.messages if m[0] != HEARTBEAT_TOPIC]


@pytest_twisted.inlineCallbacks
def test_a_killed_leader_and_a_killed_connection_lose_nothing_and_fork_nothing(
    cluster: NatsCluster, tmp_path: Path, peers: list[Any]
) -> Any:
    ends = [front_end(cluster, tmp_path / name) for name in ("a", "b")]
    for end in ends:
        yield end.startService()
    try:
        # Appends go as atomic batches on a replicated stream; a resend after a lost
        # connection goes message by message (the stream holds some of its ids).
        assert all(end.stream.atomic for end in ends)
        subs = [RawPeer.sub(end.endpoints["publisher"]) for end in ends]
        producers = [RawPeer.dealer(end.endpoints["collector"]) for end in ends]
        peers += [*subs, *producers]
        yield wait_until(
            lambda: all(any(m[0] == HEARTBEAT_TOPIC for m in s.messages) for s in subs),
            what="subscribed",
        )
        sent: list[bytes] = []

        def send(count: int) -> None:
            for _ in range(count):
                i = len(sent)
                topic = f"/c/{i % 2}/{i}/"
                producers[i % 2].send(pub(topic, {"i": i}))
                sent.append(topic.encode())

        send(100)
        yield wait_until(lambda: all(len(events(s)) >= 100 for s in subs), timeout=30)
        for round_ in range(2):
            yield ends[0].stream.refresh()
            leader = next(n for n in cluster.nodes if n.name == ends[0].stream.leader)
            cluster.kill(leader, signal.SIGKILL)
            for _ in range(10):  # events keep coming while the cluster elects a leader
                send(20)
                yield deferLater(reactor, 0.1, lambda: None)
            yield wait_until(
                lambda: all(len(events(s)) >= len(sent) for s in subs),
                timeout=60,
                what=f"round {round_}: everything broadcast without the old leader",
            )
            yield ends[0].stream.refresh()
            assert ends[0].stream.leader not in (None, leader.name), "another node leads"
            cluster.start(leader)
        seen = [[(int(SEQUENCE.unpack(m[1])[0]), m[0]) for m in events(s)] for s in subs]
        assert seen[0] == seen[1], "both front-ends broadcast the same sequence of events"
        assert [s for s, _ in seen[0]] == list(range(1, len(sent) + 1)), "gapless"
        assert sorted(t for _, t in seen[0]) == sorted(sent), "each event exactly once"
    finally:
        for end in ends:
            yield end.stopService()


@pytest_twisted.inlineCallbacks
def test_status_and_metrics_show_the_servers_the_leader_and_a_killed_replica(
    cluster: NatsCluster, tmp_path: Path
) -> Any:
    """Over HTTP, as operators read them: the three servers in the cluster, the stream's
    leader and its two replicas current; a follower killed, its replica not current and
    its server out of the cluster."""
    from bus.eventbus.frontend import EventBusFrontEnd
    from bus.web.server import StatusWebService
    from tests.ports import free_port
    from tests.seen_helpers import StatusPort, in_cluster, replica

    config = EventBusConfig(port=0, data_dir=tmp_path / "a", stats_interval=0.2)
    end = EventBusFrontEnd(config, JetStreamSettings(tuple(cluster.urls[:1]), replicas=3))
    web = StatusWebService([("eventbus", end)], free_port(), "127.0.0.1")
    yield end.startService()
    web.startService()
    http = StatusPort(web.port, "eventbus")

    def healthy(status: dict[str, Any]) -> bool:
        replicas = status["stream_cluster"]["replicas"]
        return (
            in_cluster(status) == [True] * 3
            and status["stream_cluster"]["leader"] is not None
            and len(replicas) == 2
            and all(r["current"] for r in replicas)
        )

    try:
        seen = yield http.says(healthy)
        assert sorted(s["url"] for s in seen["servers"]) == sorted(cluster.urls)
        assert not any(s["lame_duck"] for s in seen["servers"])
        assert {"management", "append", "feed"} == {r for s in seen["servers"] for r in s["ours"]}
        assert [c["role"] for c in seen["consumers"]] == ["feed"]
        follower = seen["stream_cluster"]["replicas"][0]["name"]
        node = next(n for n in cluster.nodes if n.name == follower)
        cluster.kill(node, signal.SIGKILL)
        yield http.says(
            lambda s: (replica(s["stream_cluster"], follower) or {}).get("current") is False
        )
        seen = yield http.says(lambda s: sum(in_cluster(s)) == 2)
        assert [x["url"] for x in seen["servers"] if not x["connected"]] == [node.url]
        samples = yield http.samples("eventbus_jetstream_")
        stream = (("stream", "EVENTBUS"),)
        assert samples[("eventbus_jetstream_stream_leader", stream)] == 1
        assert (
            samples[("eventbus_jetstream_replica_current", (("replica", follower), *stream))] == 0
        )
        assert samples[("eventbus_jetstream_servers", (("state", "connected"),))] == 2
        assert samples[("eventbus_jetstream_servers", (("state", "known"),))] == 3
    finally:
        yield web.stopService()
        yield end.stopService()
