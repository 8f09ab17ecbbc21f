"""bus.nats.failover, the blocking client's way through a cluster, against real
sockets: a closed port, a port that accepts and says nothing, real nats-servers, one of
them killed (kill -9) under a read; and what counts as passing."""

from __future__ import annotations

import functools
import signal
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from bus.nats import jsapi
from bus.nats.blocking import Connection
from bus.nats.codec import ProtocolError
from bus.nats.failover import Failover, Retry, Unavailable, discovered, passing
from bus.nats.handshake import ConnectError
from tests.ports import free_port, nats_cluster

pytest.importorskip("nats")

connect = functools.partial(Connection, timeout=0.5)
hasty = functools.partial(Connection, timeout=0.2)


@pytest.fixture
def closed() -> str:
    """A port nothing listens on: a connection is refused at once."""
    return f"nats://127.0.0.1:{free_port()}"


@pytest.fixture
def silent() -> Iterator[str]:
    """A port that accepts (the kernel completes the handshake) and never says a word."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(8)
        yield f"nats://127.0.0.1:{listener.getsockname()[1]}"


class Clock:
    """Time that moves only when the failover sleeps: its pauses, counted exactly."""

    def __init__(self) -> None:
        self.now = 0.0
        self.pauses: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.pauses.append(seconds)
        self.now += seconds


def test_what_passes_and_what_lasts() -> None:
    assert passing(ConnectionError("the NATS server closed the connection"))
    assert passing(ConnectionRefusedError("no responders for $JS.API.STREAM.INFO.S"))
    assert passing(TimeoutError("nothing from the NATS server in 5s"))
    assert passing(ConnectError("nats://a:4222: [Errno 111] Connection refused"))
    assert passing(ProtocolError("Stale Connection"))
    assert passing(jsapi.JetStreamError(503, 10008, "JetStream system temporarily unavailable"))
    assert passing(jsapi.JetStreamError(503, 0, "No Responders"))
    assert passing(jsapi.JetStreamError(500, 10009, "JetStream cluster can not handle request"))
    assert passing(jsapi.JetStreamError(500, 10118, "stream is offline"))
    assert passing(jsapi.JetStreamError(500, 0, "no leader elected yet"))
    # Asking again changes nothing.
    assert not passing(jsapi.JetStreamError(404, 10059, "stream not found"))
    assert not passing(jsapi.JetStreamError(503, 10039, "JetStream not enabled for account"))
    assert not passing(ProtocolError("Authorization Violation"))
    assert not passing(ConnectError("nats://a:4222: Authorization Violation"))
    assert not passing(ConnectError("nats://a:4222: [SSL: CERTIFICATE_VERIFY_FAILED] ..."))
    assert not passing(ValueError("a JetStream reply that is no JSON object"))
    assert not passing(KeyError("state"))


def test_servers_that_refuse_or_say_nothing_are_left_for_one_that_answers(
    closed: str, silent: str, nats_server: Any
) -> None:
    good = nats_server.urls[0]
    failover = Failover([closed, silent, good], connect, Retry(within=30), discover=False)
    try:
        answer = failover.call("asking", lambda c: c.request("$JS.API.INFO", b""))
        assert jsapi.answer(answer.payload)["type"].endswith("account_info_response")
        assert failover.current is not None and failover.current.server == good
        assert failover.tried == [closed, silent, good]
        assert failover.retried == 0  # one connection tried them in turn
        # A failure leaves the connection; the next one starts after its server (and
        # comes round to it again).
        attempts: list[str] = []

        def fails_once(connection: Connection) -> str:
            attempts.append(connection.server)
            if len(attempts) == 1:
                raise ConnectionError("the NATS server closed the connection")
            return connection.server

        assert failover.call("asking", fails_once) == good
        assert attempts == [good, good] and failover.retried == 1
    finally:
        failover.close()


def test_the_bound_ends_in_one_line_naming_the_servers_and_the_last_cause(
    closed: str, silent: str
) -> None:
    clock = Clock()
    failover = Failover(
        [closed, silent], hasty, Retry(within=4, first=0.1, most=1), discover=False,
        clock=clock, sleep=clock.sleep,
    )  # fmt: skip
    with pytest.raises(Unavailable) as raised:
        failover.call("asking for stream S's state", lambda c: c.request("x", b""))
    said = str(raised.value)
    assert "\n" not in said
    assert said.startswith("asking for stream S's state still failing after 3.5s ")
    assert f"(servers tried: {closed}, {silent}); last: " in said
    assert "Connection refused" in said and "nothing from the NATS server in 0.2s" in said
    # Pauses doubled up to the cap, and none that would end past the bound.
    assert clock.pauses == [0.1, 0.2, 0.4, 0.8, 1, 1]
    # Without a bound: one try, and the same line.
    once = Failover([closed], hasty, Retry(within=0), discover=False, sleep=clock.sleep)
    with pytest.raises(Unavailable, match=rf"^asking failed \(servers tried: {closed}\); last: "):
        once.call("asking", lambda c: c.request("x", b""))
    # What lasts fails at once, as it is.
    with pytest.raises(ConnectError, match="no host"):
        Failover(["nats://:4222"], connect)


def test_a_server_in_lame_duck_mode_is_left_before_the_next_request(tmp_path: Path) -> None:
    """Its INFO says ``ldm`` (nats-server's SIGUSR2): the next request goes elsewhere,
    before the server closes anything."""
    from tests.processes import wait_for

    one, other = (nats_cluster(tmp_path / name, size=1) for name in ("a", "b"))
    one.start()
    other.start()
    failover = Failover([one.urls[0], other.urls[0]], connect, discover=False)
    try:

        def ask(connection: Connection) -> str:
            # A round trip (the server says no one listens); what it sent comes with it.
            with pytest.raises(ConnectionRefusedError):
                connection.request("nobody.listens", b"")
            return connection.server

        assert failover.call("asking", ask) == one.urls[0]
        one.kill(one.nodes[0], signal.SIGUSR2)
        wait_for(lambda: failover.call("asking", ask) == other.urls[0], timeout=30)
        assert failover.retried == 0  # left, not failed
    finally:
        failover.close()
        one.kill(one.nodes[0], signal.SIGKILL)  # in lame-duck mode a stop waits 10 s
        other.stop()


def test_urls_the_cluster_names_keep_the_scheme_and_credentials_of_the_one_given() -> None:
    assert discovered("tls://u:p@h1:4222", ["10.0.0.2:4222", "[::1]:4223"]) == [
        "tls://u:p@10.0.0.2:4222",
        "tls://u:p@[::1]:4223",
    ]
    assert discovered("h1:4222", ["h2:4222"]) == ["nats://h2:4222"]


def test_a_read_goes_on_from_the_last_event_given_when_its_server_is_killed(
    tmp_path: Path,
) -> None:
    """Given n1 alone, a read learns n2 and n3 from the cluster; n1, the stream's leader,
    is killed between two batches: the read goes on from a server it learnt while the
    cluster elects a leader, and every event comes once, in order."""
    from bus.eventbus.config import JetStreamSettings
    from bus.eventbus.stream_read import RangeReader, failover, stream_state
    from bus.spark.synthetic import events
    from tests.jetstream_helpers import lead, make_stream, publish

    cluster = nats_cluster(tmp_path / "nats", size=3)
    cluster.start()
    try:
        make_stream(cluster.urls)
        publish(cluster.urls, list(events(1, 3000)))
        lead(cluster, "n1")
        settings = JetStreamSettings((cluster.urls[0],))
        reader = RangeReader(settings, 0, 3000, retry=Retry(within=60)).open()
        state = failover(settings, retry=Retry(within=60))
        try:
            assert state.call("state", lambda c: stream_state(c, "EVENTBUS"))["last_seq"] == 3000
            assert sorted(state.servers[1:]) == sorted(cluster.urls[1:])  # learnt
            read = list(reader.next_events(1000).sequences)
            cluster.kill(cluster.nodes[0], signal.SIGKILL)
            while chunk := reader.next_events(1000):
                read += chunk.sequences
            assert read == list(range(1, 3001))
            assert reader.take_removed() == []
            after = state.call("state", lambda c: stream_state(c, "EVENTBUS"))
            assert after["last_seq"] == 3000
            assert state.current is not None and state.current.server in cluster.urls[1:]
        finally:
            reader.close()
            state.close()
    finally:
        cluster.stop()


def test_what_retention_removed_before_a_read_made_again_reached_it_is_reported(
    nats_server: Any,
) -> None:
    from bus.eventbus.config import JetStreamSettings
    from bus.eventbus.stream_read import RangeReader
    from bus.spark.synthetic import events
    from tests.jetstream_helpers import make_stream, publish

    url = nats_server.urls[0]
    make_stream([url], replicas=1, max_msgs=1000)  # the newest 1000 kept
    publish([url], list(events(1, 1000)))
    reader = RangeReader(JetStreamSettings((url,)), 0, 1000, retry=Retry(within=30))
    try:
        reader.open(check_retention=True)
        assert reader.take_removed() == []
        assert reader.next_events(100).sequences == list(range(1, 101))
        publish([url], list(events(1001, 500)))  # 1..500 go
        assert reader._failover is not None
        # Its connection left (as after a failure): the read is made again from 100,
        # whatever it had received beyond what it gave.
        reader._failover.drop()
        rest = []
        while chunk := reader.next_events(1000):
            rest += chunk.sequences
        assert reader.take_removed() == [(101, 500)]
        assert rest == list(range(501, 1001))
    finally:
        reader.close()


def test_a_read_returns_at_once_when_its_server_goes_into_lame_duck_mode(tmp_path: Path) -> None:
    """A read waiting for messages returns none at the INFO that says ``ldm`` (before the
    server closes anything), once: the caller leaves the server now, not when it is shut."""
    cluster = nats_cluster(tmp_path / "nats", size=1)
    cluster.start()
    try:
        with Connection(cluster.urls) as connection:
            connection.subscribe("quiet")
            connection.flush()
            assert not connection.lame_duck
            cluster.kill(cluster.nodes[0], signal.SIGUSR2)  # nats-server --signal ldm=PID
            assert connection.read(60) == []
            assert connection.lame_duck
            with pytest.raises(TimeoutError):  # said once: the next read waits as ever
                connection.read(0.2)
    finally:
        cluster.kill(cluster.nodes[0], signal.SIGKILL)  # in lame-duck mode a stop waits 10 s


def test_a_follower_whose_consumer_falls_silent_fails_and_one_idle_does_not(
    tmp_path: Path,
) -> None:
    """Following, each pull asks for heartbeats: an idle stream's reader hears them and
    reads on; a consumer whose server stopped answering (SIGSTOP: nothing closes, nothing
    ends the pulls) is taken for gone within a second of silence, for its caller to make
    it again."""
    from bus.nats.ranged import HEARTBEAT, SILENT, RangeRead
    from tests.jetstream_helpers import make_stream

    cluster = nats_cluster(tmp_path / "nats", size=1)
    cluster.start()
    node = cluster.nodes[0]
    try:
        make_stream(cluster.urls, replicas=1)
        with Connection(cluster.urls) as connection:
            reader = RangeRead(connection, "EVENTBUS", 0, 0, ["eventbus.>"], follow=True).open()
            # Many times the silence that fails a read, on a stream where nothing comes.
            for _ in range(int(3 * SILENT / HEARTBEAT)):
                assert reader.next_batch().sequences == []
            cluster.kill(node, signal.SIGSTOP)
            with pytest.raises(TimeoutError, match=r"silent .* taken for gone"):
                while True:
                    reader.next_batch()
    finally:
        cluster.kill(node, signal.SIGCONT)
        cluster.kill(node, signal.SIGKILL)


def test_a_batch_whose_leader_is_lost_unanswered_is_refused_once_another_leads(
    tmp_path: Path,
) -> None:
    """A batch the leader took and never answered (here the leader is stopped, SIGSTOP;
    a leader that steps down drops it the same way): the late acknowledgement has the
    stream asked, every second, whether its leader changed; once the others elected one,
    the batch is refused at once (to be sent again) rather than at its timeout."""
    from bus.nats.publish import Publisher, PublishError
    from tests.jetstream_helpers import lead, make_stream

    cluster = nats_cluster(tmp_path / "nats", size=3)
    cluster.start()
    try:
        make_stream(cluster.urls)
        lead(cluster, "n1")
        with Connection([cluster.urls[1]]) as connection:
            publisher = Publisher(connection, stream="EVENTBUS")
            assert publisher.publish([(b"eventbus.a", b"id-1", b"one")], timeout=10) == [1]
            cluster.kill(cluster.nodes[0], signal.SIGSTOP)
            with pytest.raises(PublishError, match="the stream's leader changed while"):
                publisher.publish([(b"eventbus.a", b"id-2", b"two")], timeout=120)
    finally:
        cluster.kill(cluster.nodes[0], signal.SIGCONT)
        cluster.stop()
