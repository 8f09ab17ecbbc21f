"""A NATS cluster as the clients find it and leave it, with real nats-servers on
127.0.0.1: the servers INFO names (``connect_urls``) join a client's rotation, so a
front-end given one URL of a healthy three-node cluster goes on when that server is
killed; a server put in lame-duck mode (``nats-server --signal ldm=PID``) is left by the
reactor's client and by a front-end's connections before it closes them: nothing lost,
and the subscribers' silence measured and printed."""

from __future__ import annotations

import itertools
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import pytest_twisted
from twisted.internet import reactor, task, threads

from bus.eventbus.codec import HEARTBEAT_TOPIC, SEQUENCE
from bus.eventbus.config import EventBusConfig, JetStreamSettings
from bus.nats.client import NatsClient
from bus.nats.codec import Msg
from bus.nats.rotation import Rotation
from bus.nats.servers import NatsCluster, NatsNode, nats_server_binary
from bus.testing import RawPeer, wait_until
from tests.eventbus_helpers import pub
from tests.jetstream_helpers import lead
from tests.ports import nats_cluster

pytest.importorskip("nats")

#: nats-server's shortest lame-duck duration; its clients are closed from 10 s after the
#: INFO that says ``ldm`` (the grace period).
LAME_DUCK = 'lame_duck_duration: "30s"\n'


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[NatsCluster]:
    nodes = nats_cluster(tmp_path / "nats", size=3, extra=LAME_DUCK)
    nodes.start()
    yield nodes
    for node in nodes.nodes:
        nodes.kill(node)  # a node in lame-duck mode would take its 30 s to stop


def lame_duck(node: NatsNode) -> None:
    """``nats-server --signal ldm=PID``, as an operator puts a server in lame-duck mode."""
    assert node.process is not None
    subprocess.run(
        [nats_server_binary(), "--signal", f"ldm={node.process.pid}"], check=True, timeout=30
    )


def alive(node: NatsNode) -> bool:
    return node.process is not None and node.process.poll() is None


# -- the rotation, sans I/O ------------------------------------------------------------------


def test_the_rotation_adds_what_the_cluster_names_and_starts_after_the_last_reached() -> None:
    rotation = Rotation(["nats://h1:4222", "tls://h2:4222"])
    assert rotation.order() == ["nats://h1:4222", "tls://h2:4222"]
    info = {"connect_urls": ["h1:4222", "H2:4222", "10.0.0.3:4222", "", 7, "[::1]:4223"]}
    assert rotation.reached("tls://h2:4222", info) == ["tls://10.0.0.3:4222", "tls://[::1]:4223"]
    assert rotation.order() == [
        "tls://10.0.0.3:4222",
        "tls://[::1]:4223",
        "nats://h1:4222",
        "tls://h2:4222",
    ]
    assert rotation.elsewhere("tls://10.0.0.3:4222")[0] == "tls://[::1]:4223"
    assert [rotation.take() for _ in range(5)] == [*rotation.servers[2:], *rotation.servers[:3]]
    quiet = Rotation(["nats://h1:4222"], discover=False)
    assert quiet.reached("nats://h1:4222", info) == [] and quiet.servers == ["nats://h1:4222"]


# -- the reactor's client --------------------------------------------------------------------


@pytest_twisted.inlineCallbacks
def test_the_reactor_client_learns_the_cluster_and_leaves_a_lame_duck_before_it_closes(
    cluster: NatsCluster,
) -> Any:
    first = cluster.nodes[0]
    client = NatsClient(reactor, [first.url], name="moves", ping_interval=0.5)
    other = NatsClient(reactor, [cluster.nodes[2].url], name="publisher")
    client.start()
    other.start()
    seen: list[tuple[float, bytes]] = []
    sent = iter(range(10**9))
    sending = task.LoopingCall(lambda: other.publish(b"moves.tick", b"%d" % next(sent)))
    try:
        yield client.when_connected(timeout=10)
        yield other.when_connected(timeout=10)
        yield wait_until(lambda: len(client.servers) == 3, what="the cluster's servers learnt")
        assert client.server == first.url
        client.subscribe("moves.>", lambda msg: seen.append((time.monotonic(), msg.payload)))
        client.subscribe("echo", lambda msg: client.publish(msg.reply, msg.payload))
        sending.start(0.01)
        yield wait_until(lambda: len(seen) > 20, what="messages before")
        lame_duck(first)
        yield wait_until(lambda: client.lame_duck_moves == 1, timeout=30, what="the move")
        assert alive(first), "the client moved only once its server closed it"
        assert client.server != first.url and client.disconnects == 0
        moved = len(seen)
        yield wait_until(lambda: len(seen) > moved + 20, what="messages after the move")
        answer: Msg = yield other.request(b"echo", b"still there", timeout=5)
        assert answer.payload == b"still there"
        gaps = [b[0] - a[0] for a, b in itertools.pairwise(seen)]
        print(f"\nreactor client: longest silence over the move {max(gaps):.3f}s")
        assert len({payload for _, payload in seen}) == len(seen)  # none twice
    finally:
        if sending.running:
            sending.stop()
        client.stop()
        other.stop()


# -- a front-end -----------------------------------------------------------------------------


def front_end(servers: tuple[str, ...], data_dir: Path) -> Any:
    from bus.eventbus.frontend import EventBusFrontEnd

    config = EventBusConfig(
        port=0, data_dir=data_dir, stats_interval=0, heartbeat_interval=0.2,
        storage_retry_max=0.5,
    )  # fmt: skip
    return EventBusFrontEnd(config, JetStreamSettings(servers, replicas=3, ack_timeout=2.0))


def events(peer: RawPeer) -> list[list[bytes]]:
    return [m for m in peer.messages if m[0] != HEARTBEAT_TOPIC]


class Timed:
    """A subscriber that notes when each event came (to measure its silences)."""

    def __init__(self, endpoint: str) -> None:
        self.peer = RawPeer.sub(endpoint)
        self.arrivals: list[float] = []
        self.peer.socket.on_messages = self._received

    def _received(self, messages: list[list[bytes]]) -> None:
        now = time.monotonic()
        for message in messages:
            self.peer.messages.append(message)
            if message[0] != HEARTBEAT_TOPIC:
                self.arrivals.append(now)

    def longest_silence(self, since: float, until: float) -> float:
        times = [since, *(t for t in self.arrivals if since <= t <= until), until]
        return max(b - a for a, b in itertools.pairwise(times))


def gapless(peer: RawPeer, count: int) -> None:
    got = events(peer)
    assert [SEQUENCE.unpack(m[1])[0] for m in got] == list(range(1, count + 1))
    assert len({m[4] for m in got}) == count  # every uuid once


@pytest_twisted.inlineCallbacks
def test_a_front_end_given_one_server_of_three_goes_on_when_that_one_dies(
    cluster: NatsCluster, tmp_path: Path, peers: list[Any]
) -> Any:
    only = cluster.nodes[0]
    end = front_end((only.url,), tmp_path / "a")
    yield end.startService()
    try:
        # The INFO of a connection names the cluster's servers routed to so far, and a new
        # INFO the others as their routes form.
        yield wait_until(lambda: len(end.status()["jetstream"]["servers"]) == 3)
        listed = [server["url"] for server in end.status()["jetstream"]["servers"]]
        assert listed[0] == only.url and sorted(listed[1:]) == sorted(cluster.urls[1:])
        yield wait_until(lambda: all(len(f.servers) == 3 for f in end.stream._failovers.values()))
        sub = RawPeer.sub(end.endpoints["publisher"])
        producer = RawPeer.dealer(end.endpoints["collector"])
        peers += [sub, producer]
        yield wait_until(lambda: any(m[0] == HEARTBEAT_TOPIC for m in sub.messages))
        for i in range(100):
            producer.send(pub(f"/before/{i}/"))
        yield wait_until(lambda: len(events(sub)) == 100, what="events before")
        cluster.kill(only)
        for i in range(100):
            producer.send(pub(f"/after/{i}/"))
        yield wait_until(lambda: len(events(sub)) == 200, timeout=90, what="events after")
        gapless(sub, 200)
        assert end.stream.client.server != only.url
    finally:
        yield end.stopService()


@pytest.mark.parametrize("leader", ["n1", "n2"], ids=["n1 leads the stream", "n2 leads it"])
@pytest_twisted.inlineCallbacks
def test_a_front_end_leaves_a_server_in_lame_duck_mode_before_it_exits_losing_nothing(
    cluster: NatsCluster, tmp_path: Path, peers: list[Any], leader: str
) -> Any:
    n1 = cluster.nodes[0]
    end = front_end(tuple(cluster.urls), tmp_path / "a")
    yield end.startService()
    sending = None
    try:
        yield threads.deferToThread(lead, cluster, leader)
        timed = Timed(end.endpoints["publisher"])
        producer = RawPeer.dealer(end.endpoints["collector"])
        peers += [timed.peer, producer]
        yield wait_until(lambda: any(m[0] == HEARTBEAT_TOPIC for m in timed.peer.messages))
        stream = end.stream
        # All three of its connections are on n1, the first listed.
        assert stream.client.server == n1.url
        assert {f.current.server for f in stream._failovers.values() if f.current} == {n1.url}
        sent = [0]

        def send() -> None:
            producer.send(pub(f"/steady/{sent[0]}/"))
            sent[0] += 1

        sending = task.LoopingCall(send)
        sending.start(0.005)  # about 200 a second
        yield wait_until(lambda: len(events(timed.peer)) > 200, what="events flowing")
        began = time.monotonic()
        lame_duck(n1)

        def moved() -> bool:
            on = {f.current.server for f in stream._failovers.values() if f.current}
            return stream.client.server not in (None, n1.url) and bool(on) and n1.url not in on

        yield wait_until(moved, timeout=30, what="every connection off the lame duck")
        assert alive(n1), "the front-end left n1 only once n1 closed its connections"
        left_at = time.monotonic()
        yield wait_until(lambda: not alive(n1), timeout=60, what="n1 to exit")
        yield wait_until(lambda: len(events(timed.peer)) > sent[0] - 5, what="still flowing")
        sending.stop()
        ended = time.monotonic()
        yield wait_until(lambda: len(events(timed.peer)) == sent[0], timeout=60, what="all")
        gapless(timed.peer, sent[0])
        # The management connection follows the INFO that says ldm. nats-server sends it
        # only once it has handed its Raft leaders over and shut its JetStream down: a
        # data connection whose consumer or append that cost may have failed first, and
        # was made again elsewhere then (counted as a disconnect, nothing lost).
        assert stream.client.lame_duck_moves == 1 and stream.client.disconnects == 0
        assert stream.lame_duck_moves + stream.disconnects >= 2
        print(
            f"\nfront-end over nats-server's lame-duck mode ({leader} leading the stream): "
            f"{sent[0]} events, 0 lost, 0 "
            f"twice; every connection off n1 {left_at - began:.2f}s after the signal "
            f"({stream.lame_duck_moves} data connections left for its ldm INFO, "
            f"{stream.disconnects} failed first, {end.core.append_failures} appends "
            f"refused); the subscriber's longest silence "
            f"{timed.longest_silence(began, ended):.3f}s"
        )
    finally:
        if sending is not None and sending.running:
            sending.stop()
        yield end.stopService()


def test_a_move_that_finds_no_other_server_stays_then_reconnects_as_after_any_loss() -> None:
    """Sans network (a memory reactor): lame duck, no other server answers, the old one
    closes; and the old one closing while the move is still being tried."""
    from twisted.internet.error import ConnectionDone, ConnectionRefusedError
    from twisted.internet.testing import MemoryReactorClock, StringTransport
    from twisted.python.failure import Failure

    for lost_first in (False, True):
        memory = MemoryReactorClock()
        client = NatsClient(memory, ["nats://a:4222", "nats://b:4222"], ping_interval=100)
        client.start()
        wire = memory.tcpClients[-1][2].buildProtocol(None)
        wire.makeConnection(StringTransport())
        wire.dataReceived(b'INFO {"max_payload": 1048576}\r\n')
        wire.dataReceived(b"PONG\r\n")
        assert client.connected and client.server == "nats://a:4222"
        wire.dataReceived(b'INFO {"ldm": true}\r\n')
        assert memory.tcpClients[-1][:2] == ("b", 4222)  # the move
        refused = Failure(ConnectionRefusedError())
        if lost_first:
            wire.connectionLost(Failure(ConnectionDone()))
        memory.tcpClients[-1][2].clientConnectionFailed(None, refused)
        if not lost_first:
            assert client.connected  # nowhere to go: stays until the server closes it
            wire.connectionLost(Failure(ConnectionDone()))
        memory.advance(5)
        assert len(memory.tcpClients) == 3, "no attempt after the loss"
        client.stop()
