"""eMQP brokers sharing guaranteed requests through a JetStream stream (--store
jetstream), real processes only: three clustered nats-servers, ``twistd -n emqp``
brokers, raw and library peers. A request taken at one broker runs on a worker of
another and its answers come back through the first; a broker killed while it holds
requests loses none (another broker's worker gets them, the client its answers); while
JetStream cannot store, the client port waits and nothing is acknowledged."""

from __future__ import annotations

import base64
import itertools
import json
import signal
from collections.abc import Callable, Iterator
from datetime import datetime
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import pytest_twisted
from twisted.internet import defer, reactor, task

from bus.emqp import codec, jobstream
from bus.emqp.client import EmqpClient
from bus.nats import codec as natscodec
from bus.nats import jsapi
from bus.nats.blocking import Connection
from bus.testing import wait_until
from tests.emqp_helpers import RawClient, RawWorker
from tests.ports import nats_cluster
from tests.processes import BrokerProcess, reported
from tests.test_emqp_interop import JOBS, InteropProcess, free_slots, job_manager, run_real_client

pytest.importorskip("nats")


@pytest.fixture
def eventmq() -> Iterator[list[InteropProcess]]:
    """eventmq's own processes (tests/emqp_interop), stopped after the test."""
    started: list[InteropProcess] = []
    yield started
    for process in started:
        process.stop()


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Any]:
    nodes = nats_cluster(tmp_path / "nats", size=3)
    nodes.start()
    yield nodes
    nodes.stop()


@pytest.fixture
def brokers(tmp_path: Path, cluster: Any) -> Iterator[Callable[..., tuple[Any, Any]]]:
    """Starts brokers a and b (``brokers(*options)``) and stops those still running after
    the test."""
    started: list[BrokerProcess] = []

    def start(*more: str) -> tuple[BrokerProcess, BrokerProcess]:
        pair = (broker(tmp_path, "a", cluster, *more), broker(tmp_path, "b", cluster, *more))
        started.extend(pair)
        return pair

    yield start
    for each in started:
        if each.process.poll() is None:
            each.stop()


def broker(tmp_path: Path, name: str, cluster: Any, *more: str) -> BrokerProcess:
    return BrokerProcess(
        tmp_path / name,
        None,
        "--store", "jetstream", "--nats", ",".join(cluster.urls), "--nats-replicas", "3",
        # The raw workers here send no heartbeats: they must not be forgotten meanwhile.
        "--heartbeat-interval", "10s", "--stats-interval", "0.2s",
        *more,
    )  # fmt: skip


def streaming(process: BrokerProcess) -> bool:
    return process.ready() and bool((process.status().get("jetstream") or {}).get("ready"))


@defer.inlineCallbacks
def worker_and_client(process: BrokerProcess, peers: list[Any]) -> Any:
    """Once ``process`` streams: a raw worker whose INFORM it acknowledged and a raw
    client, both on it (and in ``peers``, to be closed)."""
    yield reported(lambda: streaming(process), what="the broker")
    worker = RawWorker(process.endpoints["worker"])
    client = RawClient(process.endpoints["client"])
    peers += [worker, client]
    yield wait_until(worker.acked, what="the worker's INFORM acknowledged")
    return worker, client


@pytest_twisted.inlineCallbacks
def test_a_request_at_one_broker_runs_on_a_worker_of_another(
    tmp_path: Path, cluster: Any, brokers: Any
) -> Any:
    a, b = brokers()
    peers: list[Any] = []
    try:
        yield reported(lambda: streaming(a) and streaming(b), what="both brokers")
        worker = RawWorker(b.endpoints["worker"])
        client = RawClient(a.endpoints["client"])
        peers += [worker, client]
        yield wait_until(worker.acked, what="the worker's INFORM acknowledged")
        worker.ready(2)
        sent = [client.request("default", {"n": i}, b"guarantee,reply-requested") for i in (1, 2)]
        yield wait_until(lambda: len(worker.requests()) == 2, timeout=30, what="both at b")
        assert sorted(r[3] for r in worker.requests()) == sorted(sent)
        for request in worker.requests():
            worker.reply(request, "done")
        yield wait_until(
            lambda: all(client.results(m) == [{"value": "done"}] for m in sent),
            what="the answers at a",
        )
        assert all(len(client.acks(m)) == 1 for m in sent)  # dispatched, said once each
        yield wait_until(lambda: b.status()["jetstream"]["acks"] == 2, what="b acknowledged")
        assert a.status()["jetstream"]["answers_sent"] == 0
        assert b.status()["jetstream"]["answers_sent"] == 4  # two dispatch notes, two replies
        assert a.status()["counters"]["replied"] == 0 and b.status()["counters"]["replied"] == 2
        # Not kept in the stream (eventmq's meaning), yet run where a worker is.
        worker.ready()
        plain = client.request("default", {"n": 3}, b"reply-requested")
        yield wait_until(lambda: len(worker.requests()) == 3, timeout=30, what="the plain one")
        assert worker.requests()[-1][3] == plain
        worker.reply(worker.requests()[-1], "plain")
        yield wait_until(lambda: client.results(plain) == [{"value": "plain"}], what="its answer")
        yield wait_until(lambda: b.status()["jetstream"]["offers_taken"] == 1, what="b took it")
    finally:
        for peer in peers:
            peer.close()


@pytest_twisted.inlineCallbacks
def test_a_broker_killed_holding_requests_loses_none(
    tmp_path: Path, cluster: Any, brokers: Any
) -> Any:
    a, b = brokers()
    peers: list[Any] = []
    client = None
    try:
        yield reported(lambda: streaming(a) and streaming(b), what="both brokers")
        stuck = RawWorker(b.endpoints["worker"])  # takes requests and never answers
        peers.append(stuck)
        yield wait_until(stuck.acked, what="the stuck worker's INFORM acknowledged")
        stuck.ready(5)
        client = EmqpClient(a.endpoints["client"])
        results = [
            client.submit("default", ["add", {"a": i, "b": 1}], guarantee=True) for i in range(5)
        ]
        yield wait_until(lambda: len(stuck.requests()) == 5, timeout=30, what="all five at b")
        assert b.stop(signal.SIGKILL) == -signal.SIGKILL
        worker = RawWorker(a.endpoints["worker"])
        peers.append(worker)
        yield wait_until(worker.acked, what="a's worker")
        worker.ready(5)
        # The stream gives them to a once b has not said "in progress" for ack_wait.
        yield wait_until(lambda: len(worker.requests()) == 5, timeout=30, what="all five at a")
        for request in worker.requests():
            worker.reply(request, 7)
        answers = yield defer.gatherResults(results).addTimeout(30, reactor)
        assert answers == [7] * 5
        yield wait_until(
            lambda: a.status()["jetstream"]["acks"] == 5, what="a acknowledged all five"
        )
        assert a.status()["counters"]["replied"] == 5
    finally:
        for peer in peers:
            peer.close()
        if client is not None:
            client.close()


@pytest_twisted.inlineCallbacks
def test_eventmqs_own_client_and_job_manager_meet_across_two_brokers(
    tmp_path: Path, cluster: Any, brokers: Any, eventmq: list[InteropProcess]
) -> Any:
    """eventmq 0.3.13 unchanged: its job manager at b, its client at a."""
    a, b = brokers("--heartbeat-interval", "3s")
    yield reported(lambda: streaming(a) and streaming(b), what="both brokers")
    manager = job_manager(b, eventmq, tmp_path, jobs=2)
    yield reported(lambda: free_slots(b) == 2, manager.process, what="two READYs at b")
    requests = [
        {"func": f"{JOBS}.add", "args": [i, 10], "reply": True, "guarantee": True} for i in range(4)
    ]
    requests.append(
        {"func": f"{JOBS}:Greeter.greet", "class_args": ["Hello"], "args": ["cluster"],
         "reply": True, "guarantee": True, "retries": 2}
    )  # fmt: skip
    answers = yield run_real_client(a, eventmq, tmp_path, requests)
    assert all(answer["acknowledged"] for answer in answers), answers
    assert [answer["result"] for answer in answers] == [
        {"value": 10}, {"value": 11}, {"value": 12}, {"value": 13},
        {"value": "Hello, cluster"},
    ]  # fmt: skip
    yield wait_until(lambda: b.status()["jetstream"]["acks"] == 5, what="b acknowledged")


@pytest_twisted.inlineCallbacks
def test_a_worker_with_one_slot_takes_a_queue_one_by_one(
    tmp_path: Path, cluster: Any, brokers: Any
) -> Any:
    a, b = brokers()
    peers: list[Any] = []
    try:
        yield reported(lambda: streaming(a) and streaming(b), what="both brokers")
        worker = RawWorker(b.endpoints["worker"])
        client = RawClient(a.endpoints["client"])
        peers += [worker, client]
        yield wait_until(worker.acked, what="the worker's INFORM acknowledged")
        sent = [client.request("default", {"n": i}, b"guarantee,reply-requested") for i in range(4)]
        for count in range(1, 5):
            worker.ready()
            yield wait_until(
                lambda c=count: len(worker.requests()) == c, timeout=30, what=f"request {count}"
            )
            worker.reply(worker.requests()[-1], count)
        yield wait_until(lambda: all(client.results(m) for m in sent), what="every answer")
        assert [r[3] for r in worker.requests()] == sent  # in the order taken
    finally:
        for peer in peers:
            peer.close()


@pytest_twisted.inlineCallbacks
def test_without_a_quorum_the_client_port_waits_and_nothing_is_acknowledged(
    tmp_path: Path, cluster: Any
) -> Any:
    a = broker(tmp_path, "a", cluster, "--nats", cluster.urls[0])
    peers: list[Any] = []
    try:
        worker, client = yield worker_and_client(a, peers)
        beating = task.LoopingCall(worker.heartbeat)
        beating.start(1.0)
        peers.append(SimpleNamespace(close=beating.stop))
        worker.ready(3)
        first = client.request("default", 1, b"guarantee,reply-requested")
        yield wait_until(lambda: len(worker.requests()) == 1, timeout=30, what="the first")
        worker.reply(worker.requests()[0], "one")
        yield wait_until(lambda: client.results(first), what="its answer")
        # The stream confirmed the first one's acknowledgement (said after the answer): one
        # still unconfirmed when the majority goes is redelivered once it is back, and the
        # request runs again (at least once, by design), beside the two held ones.
        yield wait_until(
            lambda: (
                a.status()["jetstream"]["acks"] >= 1
                and not a.status()["jetstream"]["acks_confirming"]
            ),
            what="the first acknowledgement confirmed",
        )
        for node in cluster.nodes[1:]:  # the stream's replicas lose their majority
            cluster.kill(node)
        held = [client.request("default", i, b"guarantee,reply-requested") for i in (2, 3)]
        yield wait_until(
            lambda: a.status().get("client_port_paused") and a.status()["jetstream"]["refusing"],
            timeout=60,
            what="the client port paused",
        )
        assert a.status()["storage_error"]
        assert len(worker.requests()) == 1 and not any(client.acks(m) for m in held)
        for node in cluster.nodes[1:]:
            cluster.start(node)
        yield wait_until(lambda: len(worker.requests()) == 3, timeout=60, what="both, stored")
        assert sorted(r[3] for r in worker.requests()[1:]) == sorted(held)
        for request in worker.requests()[1:]:
            worker.reply(request, "later")
        yield wait_until(lambda: all(client.results(m) for m in held), what="their answers")
        yield wait_until(lambda: not a.status().get("client_port_paused"), what="port read")
    finally:
        for peer in peers:
            peer.close()
        a.stop()


@defer.inlineCallbacks
def workers_and_a_schedule(
    a: BrokerProcess, b: BrokerProcess, peers: list[Any], cleanup: list[Any], ready: int
) -> Any:
    """Once both brokers stream: a raw worker on each (in ``peers``) with ``ready`` slots,
    and a 1 s schedule of ``["tick"]`` added at ``a`` by emqp-cli (its run, which worked)."""
    from tests.test_emqp_cli import ran

    yield reported(lambda: streaming(a) and streaming(b), what="both brokers")
    workers = [RawWorker(p.endpoints["worker"]) for p in (a, b)]
    peers += workers
    for worker in workers:
        yield wait_until(worker.acked, what="a worker's INFORM acknowledged")
        worker.ready(ready)
    added = yield ran(
        cleanup, "schedule", "default", '["tick"]', "--every", "1s",
        "--admin", a.endpoints["admin"],
    )  # fmt: skip
    assert added.code == 0, added.err
    return workers, added


@pytest_twisted.inlineCallbacks
def test_a_schedule_fires_once_across_brokers_and_goes_on_when_one_dies(
    tmp_path: Path, cluster: Any, brokers: Any, cleanup: list[Any]
) -> Any:
    from tests.test_emqp_cli import ran

    a, b = brokers()
    peers: list[Any] = []
    try:
        workers, added = yield workers_and_a_schedule(a, b, peers, cleanup, ready=50)
        schedule = json.loads(added.out)["schedule"]
        listed = yield ran(cleanup, "schedules", "--admin", b.endpoints["admin"])
        assert [json.loads(line)["id"] for line in listed.out.splitlines()] == [schedule]

        def runs() -> list[bytes]:
            return [r[3] for w in workers for r in w.requests()]

        # The workers answer each run at once: answered, a run is the stream's no more.
        answered: set[tuple[int, bytes]] = set()

        def answer() -> None:
            for worker in workers[1:] if a.process.poll() is not None else workers:
                for request in worker.requests():
                    if (id(worker), request[3]) not in answered:
                        answered.add((id(worker), request[3]))
                        worker.reply(request, "tick")

        answering = task.LoopingCall(answer)
        answering.start(0.05)
        peers.append(SimpleNamespace(close=answering.stop))
        yield wait_until(lambda: len(runs()) >= 5, timeout=30, what="five runs")
        assert len(set(runs())) == len(runs())  # each run once, whichever broker fired it
        assert a.stop(signal.SIGKILL) == -signal.SIGKILL
        seen = len(runs())
        yield wait_until(lambda: len(runs()) >= seen + 3, timeout=30, what="runs after a died")
        # Once each; again only a run a's worker held unanswered when a died (the stream
        # gives it to b: at least once). All a's worker has came from a before it died, one
        # sent just before the kill read only after it: taken now, not at the kill.
        at_a = {r[3] for r in workers[0].requests()}
        again = [m for m in set(runs()) if runs().count(m) > 1]
        assert set(again) <= at_a and len(again) <= 1, again
        listed = yield ran(cleanup, "schedules", "--admin", b.endpoints["admin"])
        (entry,) = map(json.loads, listed.out.splitlines())
        assert entry["id"] == schedule and entry["runs"] >= seen + 3
    finally:
        for peer in peers:
            peer.close()


def stored_runs(urls: list[str]) -> dict[bytes, float]:
    """Every message of the stream EMQP: its Nats-Msg-Id -> when the stream stored it."""
    stored = {}
    with Connection(urls) as nats:
        info = jsapi.answer(nats.request(jsapi.stream_info("EMQP"), b"").payload)["state"]
        for seq in range(info["first_seq"], info["last_seq"] + 1):
            reply = nats.request(jsapi.message_get("EMQP"), json.dumps({"seq": seq}).encode())
            try:
                message = jsapi.answer(reply.payload)["message"]
            except jsapi.JetStreamError:
                continue  # removed: a missed run, acknowledged without running
            headers = base64.b64decode(message["hdrs"])
            msg_id = natscodec.header(headers, b"Nats-Msg-Id")
            assert msg_id is not None
            stored[msg_id] = datetime.fromisoformat(message["time"]).timestamp()
    return stored


def stream_server(cluster: Any) -> Any:
    """The nats-server that holds the stream EMQP (its only replica, with R1)."""
    with Connection(cluster.urls) as nats:
        info = jsapi.answer(nats.request(jsapi.stream_info("EMQP"), b"").payload)
    (node,) = [n for n in cluster.nodes if n.name == info["cluster"]["leader"]]
    return node


@pytest_twisted.inlineCallbacks
def test_a_stream_that_stops_storing_brings_one_run_after_it_not_a_burst(
    tmp_path: Path, cluster: Any, brokers: Any, cleanup: list[Any]
) -> Any:
    """The stream's only server stopped (SIGSTOP) for five intervals of a 1 s schedule:
    afterwards the runs the workers got were stored at least half an interval apart (before:
    the runs each broker fired meanwhile were all stored at once when it came back)."""

    a, b = brokers("--nats-replicas", "1")
    peers: list[Any] = []
    stopped = None
    try:
        # The workers hold every run (never answer): each stays in the stream, with the
        # time the stream stored it.
        workers, _ = yield workers_and_a_schedule(a, b, peers, cleanup, ready=100)

        def runs() -> set[bytes]:
            return {r[3] for w in workers for r in w.requests()}

        yield wait_until(lambda: len(runs()) >= 3, timeout=30, what="three runs")
        # The runs held across the stop outlast ack_wait unconfirmed: the stream gives them
        # out again and a broker takes them for missed runs, acknowledged away. Their stored
        # times are read now.
        stored_before = stored_runs(cluster.urls)
        stopped = stream_server(cluster)
        cluster.kill(stopped, signal.SIGSTOP)
        yield task.deferLater(reactor, 5.0, lambda: None)  # the fault: five intervals
        cluster.kill(stopped, signal.SIGCONT)
        stopped = None
        before = len(runs())
        yield wait_until(lambda: len(runs()) >= before + 4, timeout=60, what="runs after it")
        stored = {**stored_before, **stored_runs(cluster.urls)}
        times = sorted(stored[jobstream.msg_id(msgid)] for msgid in runs())
        gaps = [round(later - earlier, 3) for earlier, later in itertools.pairwise(times)]
        assert max(gaps) >= 3, gaps  # nothing stored while its server was stopped
        # No burst: one run in the outage's wake, then one a second (the rule's half an
        # interval, less a margin for the clock's reading; a burst is milliseconds apart).
        assert min(gaps) >= 0.45, gaps
    finally:
        if stopped is not None:
            cluster.kill(stopped, signal.SIGCONT)
        for peer in peers:
            peer.close()


@pytest_twisted.inlineCallbacks
def test_a_request_resent_at_another_broker_is_stored_once(
    tmp_path: Path, cluster: Any, brokers: Any
) -> Any:
    """A client that resends after a failover, in a burst the other broker appends as one
    atomic batch: JetStream refuses the batch for the id it holds, the broker sends each
    alone, and the stream keeps the first copy only."""
    a, b = brokers()
    peers: list[Any] = []
    try:
        yield reported(lambda: streaming(a) and streaming(b), what="both brokers")
        first = RawClient(a.endpoints["client"])
        peers.append(first)
        frames = codec.request("default", b"1", b"guarantee,reply-requested")
        first.peer.send(frames)
        yield wait_until(lambda: a.status()["jetstream"]["appending"] == 0
                         and a.status()["counters"]["requests"] == 1, what="stored at a")  # fmt: skip
        again = RawClient(b.endpoints["client"])
        peers.append(again)
        burst = [codec.request("default", b"%d" % n, b"guarantee") for n in range(10)]
        burst.insert(5, frames)
        for message in burst:
            again.peer.send(message)
        yield wait_until(lambda: b.status()["jetstream"]["batches_resent_each"] >= 1,
                         timeout=30, what="the batch sent again one by one")  # fmt: skip
        worker = RawWorker(b.endpoints["worker"])
        peers.append(worker)
        yield wait_until(worker.acked, what="the worker")
        worker.ready(20)
        yield wait_until(lambda: len(worker.requests()) == 11, timeout=30, what="eleven")
        taken = [r[3] for r in worker.requests()]
        assert len(set(taken)) == 11 and frames[3] in taken
        for request in worker.requests():
            worker.reply(request, "ok")
        yield wait_until(lambda: b.status()["jetstream"]["acks"] == 11, what="all acknowledged")
        with Connection(cluster.urls) as nats:
            state = jsapi.answer(nats.request(jsapi.stream_info("EMQP"), b"").payload)["state"]
        assert (state["last_seq"], state["messages"]) == (11, 0)  # the resent one: no copy
    finally:
        for peer in peers:
            peer.close()


@pytest_twisted.inlineCallbacks
def test_a_stream_named_error_takes_and_runs_guaranteed_requests(
    tmp_path: Path, nats_server: Any
) -> Any:
    """Every acknowledgement then holds the bytes "error" (the stream's name): each is still
    read as stored (a check on those bytes alone took every append for a refusal)."""
    one = BrokerProcess(
        tmp_path / "a", None, "--store", "jetstream", "--nats", ",".join(nats_server.urls),
        "--nats-stream", "error", "--heartbeat-interval", "10s",
    )  # fmt: skip
    peers: list[Any] = []
    try:
        worker, client = yield worker_and_client(one, peers)
        worker.ready(3)
        sent = []
        for n in (1, 2):  # one at a time: each appended alone (a burst is an atomic batch)
            sent.append(client.request("default", {"n": n}, b"guarantee,reply-requested"))
            yield wait_until(lambda: one.status()["counters"]["requests"] == len(sent),
                             what="the request taken")  # fmt: skip
        yield wait_until(lambda: len(worker.requests()) == 2, timeout=30, what="both run")
        for request in worker.requests():
            worker.reply(request, "done")
        yield wait_until(
            lambda: all(client.results(m) == [{"value": "done"}] for m in sent), what="answers"
        )
        yield wait_until(lambda: one.status()["jetstream"]["acks"] == 2, what="acknowledged")
        status = one.status()
        assert status["jetstream"]["refusals"] == 0 and status["counters"]["requests"] == 2
        with Connection(nats_server.urls) as nats:
            state = jsapi.answer(nats.request(jsapi.stream_info("error"), b"").payload)["state"]
        assert state["last_seq"] == 2
    finally:
        for peer in peers:
            peer.close()
        one.stop()


@pytest_twisted.inlineCallbacks
def test_status_and_metrics_show_the_streams_leaders_their_replicas_and_a_killed_one(
    tmp_path: Path, cluster: Any
) -> Any:
    """Over HTTP, as operators read them: the three servers in the cluster, the requests'
    stream and the schedules' bucket each with a leader and two current replicas, the
    queue's consumer with its leader and a request its worker holds unacknowledged; a
    follower of the stream killed: its server out of the cluster, its replica not current
    and behind by the requests appended since."""
    from bus.application.activity import NO_ACTIVITY
    from bus.emqp.config import EmqpConfig, JetStreamSettings
    from bus.emqp.server import EmqpService
    from bus.web.server import StatusWebService
    from tests.ports import free_port
    from tests.seen_helpers import StatusPort, in_cluster, replica

    settings = JetStreamSettings(tuple(cluster.urls[:1]), replicas=3, pull_expires=1.0)
    config = EmqpConfig(
        worker_port=0, client_port=0, admin_port=0, data_dir=tmp_path / "a",
        stats_interval=0.2, jetstream=settings,
    )  # fmt: skip
    service = EmqpService(config, NO_ACTIVITY)
    web = StatusWebService([("emqp", service)], free_port(), "127.0.0.1")
    yield service.startService()
    web.startService()
    http = StatusPort(web.port, "emqp")
    streams = ("EMQP", "KV_EMQP_SCHEDULES")
    peers: list[Any] = []

    def led(cluster: dict[str, Any] | None) -> bool:
        replicas = (cluster or {}).get("replicas") or []
        return bool(cluster and cluster["leader"]) and len(replicas) == 2

    def healthy(status: dict[str, Any]) -> bool:
        clusters = status["stream_clusters"]
        queue = [c for c in status["consumers"] if c["serves"] == "default"]
        return (
            in_cluster(status) == [True] * 3
            and all(led(clusters[name]) for name in streams)
            and all(r["current"] for name in streams for r in clusters[name]["replicas"])
            and len(queue) == 1
            and led(queue[0]["cluster"])
            and queue[0]["ack_pending"] == 1
        )

    try:
        worker = RawWorker(service.endpoints["worker"])
        client = RawClient(service.endpoints["client"])
        peers += [worker, client]
        yield wait_until(worker.acked, what="the worker's INFORM acknowledged")
        worker.ready()
        client.request("default", {"n": 0}, b"guarantee,reply-requested")
        yield wait_until(lambda: len(worker.requests()) == 1, timeout=30, what="held by the worker")
        seen = yield http.says(healthy)
        assert sorted(s["url"] for s in seen["servers"]) == sorted(cluster.urls)
        assert [s["ours"] for s in seen["servers"] if s["ours"]] == [["broker"]]
        assert {(c["role"], c["stream"]) for c in seen["consumers"]} == {
            ("queue", "EMQP"),
            ("schedules", "KV_EMQP_SCHEDULES"),
        }
        samples = yield http.samples("emqp_jetstream_")
        assert samples[("emqp_jetstream_queue_ack_pending", (("queue", "default"),))] == 1
        assert samples[("emqp_jetstream_queue_consumer_leader", (("queue", "default"),))] == 1
        for name in streams:
            assert samples[("emqp_jetstream_stream_leader", (("stream", name),))] == 1

        # A follower of the requests' stream, on a server the broker is not connected to.
        ours = next(s["url"] for s in seen["servers"] if s["ours"])
        victim = next(
            node
            for node in cluster.nodes
            if replica(seen["stream_clusters"]["EMQP"], node.name) and node.url != ours
        )
        cluster.kill(victim, signal.SIGKILL)
        seen = yield http.says(lambda s: sum(in_cluster(s)) == 2)
        assert [s["url"] for s in seen["servers"] if not s["connected"]] == [victim.url]
        for n in range(1, 21):  # kept: no worker serves "later"
            client.request("later", {"n": n}, b"guarantee")
        yield wait_until(lambda: service.stream.appending == {}, timeout=60, what="appended")

        def behind(status: dict[str, Any]) -> bool:
            found = replica(status["stream_clusters"]["EMQP"], victim.name) or {}
            return found.get("current") is False and found.get("lag", 0) > 0

        seen = yield http.says(behind)
        lag = replica(seen["stream_clusters"]["EMQP"], victim.name)["lag"]  # type: ignore[index]
        samples = yield http.samples("emqp_jetstream_")
        stream_replica = (("replica", victim.name), ("stream", "EMQP"))
        assert samples[("emqp_jetstream_replica_current", stream_replica)] == 0
        assert samples[("emqp_jetstream_replica_lag", stream_replica)] >= lag
        assert samples[("emqp_jetstream_stream_leader", (("stream", "EMQP"),))] == 1
        assert samples[("emqp_jetstream_servers", (("state", "connected"),))] == 2
        assert samples[("emqp_jetstream_servers", (("state", "known"),))] == 3
    finally:
        for peer in peers:
            peer.close()
        yield web.stopService()
        yield service.stopService()
