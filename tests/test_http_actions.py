"""The HTTP port's actions through real sockets: who may act (the token, the body's type and
size, the origin), each refusal made at the headers before a byte of the body is read, and
eMQP's actions effective on a real broker with real peers (a purged queue's requests never
reach a worker that connects after, a paused queue holds its requests until resumed, a
removed schedule does not fire, a forgotten worker is told to leave)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest_twisted
from twisted.internet import defer, protocol, reactor

from bus.emqp import codec
from bus.testing import start_broker, wait_until
from bus.web.server import StatusWebService
from tests.emqp_helpers import RawClient, RawWorker, broker_in

TOKEN = "act-secret"


class RawHttp(protocol.Protocol):
    """Sends ``head`` (and ``body`` only when told), keeps what comes back."""

    def __init__(self, head: bytes, body: bytes = b"", send_body: bool = True) -> None:
        self.head = head
        self.body = body
        self.send_body = send_body
        self.received = b""
        self.closed: defer.Deferred[bytes] = defer.Deferred()

    def connectionMade(self) -> None:
        self.transport.write(self.head + (self.body if self.send_body else b""))

    def dataReceived(self, data: bytes) -> None:
        self.received += data

    def connectionLost(self, reason: Any = None) -> None:
        self.closed.callback(self.received)


@defer.inlineCallbacks
def post(
    port: int,
    path: str,
    body: Any = None,
    token: str | None = TOKEN,
    headers: dict[str, str] | None = None,
    send_body: bool = True,
) -> Any:
    """POST ``body`` (JSON unless bytes) with ``headers``; (status, JSON answer or raw)."""
    raw = body if isinstance(body, bytes) else json.dumps(body or {}).encode()
    fields = {"Host": f"127.0.0.1:{port}", "Content-Type": "application/json"}
    if token is not None:
        fields["Authorization"] = f"Bearer {token}"
    fields.update(headers or {})
    fields.setdefault("Content-Length", str(len(raw)))
    head = f"POST {path} HTTP/1.1\r\n" + "".join(
        f"{k}: {v}\r\n" for k, v in fields.items() if v is not None
    )
    head += "Connection: close\r\n\r\n"
    client = RawHttp(head.encode(), raw, send_body)
    yield protocol.ClientCreator(reactor, lambda: client).connectTCP("127.0.0.1", port)
    answer = yield client.closed
    status_line, _, rest = answer.partition(b"\r\n")
    _, _, payload = rest.partition(b"\r\n\r\n")
    code = int(status_line.split(b" ")[1])
    try:
        return code, json.loads(payload)
    except ValueError:
        return code, payload


def web_for(
    tmp_path: Path, cleanup: list[Any], services: list[Any], token: bool = True
) -> StatusWebService:
    token_file = None
    if token:
        token_file = tmp_path / "token"
        token_file.write_text(TOKEN + "\n")
    web = StatusWebService(services, 0, token_file=token_file)
    web.startService()
    cleanup.append(web)
    return web


def waits_for(check: Callable[[], bool], what: str, timeout: float = 30.0) -> Any:
    return wait_until(check, timeout=timeout, what=what)


@defer.inlineCallbacks
def only_the_next_request_reaches_a_new_worker(broker: Any, client: Any, cleanup: list[Any]) -> Any:
    """A worker of ``stuck`` that connects now is sent the request sent after it, and none
    of those sent before (the purged ones)."""
    worker = RawWorker(broker.endpoints["worker"], [[10, "stuck"]])
    cleanup.append(worker)
    yield waits_for(worker.acked, "the worker's INFORM acknowledged")
    worker.ready()
    after = client.request("stuck", "after", b"reply-requested,guarantee")
    yield waits_for(lambda: bool(worker.requests()), "a request delivered")
    assert [r[3] for r in worker.requests()] == [after]


@pytest_twisted.inlineCallbacks
def test_only_the_token_bearer_of_this_origin_with_a_small_json_body_may_act(
    tmp_path: Path, cleanup: list[Any]
) -> Any:
    broker = broker_in(tmp_path, cleanup)
    web = web_for(tmp_path, cleanup, [("emqp", broker)])
    port, path = web.port, "/api/v1/actions/emqp/pause"
    body = {"queue": "jobs"}
    # Without the token: 401 at the headers, the body never sent and never waited for
    # (a Content-Length of a megabyte the server does not read).
    code, answer = yield post(
        port, path, body, token=None, headers={"Content-Length": "1000000"}, send_body=False
    )
    assert code == 401 and answer["error"] == "action-token"
    assert (yield post(port, path, body, token="wrong"))[0] == 401
    # Another page's browser: its Origin or its Sec-Fetch-Site says so.
    code, answer = yield post(port, path, body, headers={"Origin": "http://evil.example"})
    assert code == 403 and answer["error"] == "action-origin"
    code, _ = yield post(port, path, body, headers={"Origin": f"http://127.0.0.1:{port + 1}"})
    assert code == 403
    code, _ = yield post(port, path, body, headers={"Sec-Fetch-Site": "cross-site"})
    assert code == 403
    # What an HTML form can send is not JSON.
    code, answer = yield post(
        port, path, b"queue=jobs", headers={"Content-Type": "application/x-www-form-urlencoded"}
    )
    assert code == 415 and answer["error"] == "action-type"
    code, answer = yield post(port, path, b"x" * 5000, send_body=False)
    assert code == 413 and answer["error"] == "body"
    code, _ = yield post(
        port, path, body, headers={"Content-Length": None, "Transfer-Encoding": "chunked"}
    )
    assert code == 411
    # POST elsewhere, other methods: as before.
    assert (yield post(port, "/status", body))[0] == 413
    assert (yield post(port, "/status", b""))[0] == 405
    assert broker.broker.paused == set()  # none of these acted
    # The console's own page: same origin, a JSON body, the token.
    code, answer = yield post(
        port,
        path,
        body,
        headers={"Origin": f"http://127.0.0.1:{port}", "Sec-Fetch-Site": "same-origin"},
    )
    assert code == 200 and answer == {
        "ok": True,
        "service": "emqp",
        "action": "pause",
        "result": {"queue": "jobs", "paused": True, "changed": True},
    }
    assert broker.broker.paused == {b"jobs"}
    # Bad parameters, unknown actions: answered in JSON, counted, logged.
    code, answer = yield post(port, path, {"queue": ""})
    assert code == 400 and "queue" in answer["error"]
    code, answer = yield post(port, "/api/v1/actions/emqp/explode", body)
    assert code == 404 and "purge" in answer["error"]
    code, answer = yield post(port, path, b"[1, 2]")
    assert code == 400
    status = web.status()
    refused = status["refused_at_headers"]
    assert refused["action-token"] == 2 and refused["action-origin"] == 3
    assert refused["action-type"] == 1 and refused["body"] == 2
    actions = status["actions"]
    assert actions["offered"]["emqp"] == [
        "forget-worker", "pause", "purge", "remove-schedule", "resume",
    ]  # fmt: skip
    assert actions["counts"] == {"done": 1, "refused": 3}
    latest = actions["recent"][0]
    assert latest["who"] == "127.0.0.1" and latest["params"] == body
    samples = {
        tuple(sorted(s.labels.items())): s.value
        for family in web.metrics()
        if family.name == "bus_http_actions"
        for s in family.samples
    }
    done = (("action", "pause"), ("outcome", "done"), ("service", "emqp"))
    assert samples[done] == 1.0


@pytest_twisted.inlineCallbacks
def test_a_port_without_a_token_takes_no_action(tmp_path: Path, cleanup: list[Any]) -> Any:
    broker = broker_in(tmp_path, cleanup)
    web = web_for(tmp_path, cleanup, [("emqp", broker)], token=False)
    code, answer = yield post(web.port, "/api/v1/actions/emqp/pause", {"queue": "q"}, None)
    assert code == 403 and answer["error"] == "action-no-token-file"
    assert broker.broker.paused == set()


@pytest_twisted.inlineCallbacks
def test_a_purged_queue_never_reaches_a_worker_that_connects_after(
    tmp_path: Path, cleanup: list[Any]
) -> Any:
    broker = broker_in(tmp_path, cleanup)
    web = web_for(tmp_path, cleanup, [("emqp", broker)])
    client = RawClient(broker.endpoints["client"])
    cleanup.append(client)
    # Guaranteed: kept in the SQLite store until a worker replies.
    sent = [client.request("stuck", i, b"reply-requested,guarantee") for i in range(3)]
    yield waits_for(lambda: broker.store.count() == 3, "three requests stored")
    code, answer = yield post(web.port, "/api/v1/actions/emqp/purge", {"queue": "stuck"})
    assert code == 200 and answer["result"] == {"queue": "stuck", "purged": 3}
    assert broker.store.count() == 0
    # Each client hears why its request will never run.
    yield waits_for(lambda: all(client.results(m) for m in sent), "the clients told")
    assert {client.results(m)[0]["error"] for m in sent} == {"purged"}
    yield only_the_next_request_reaches_a_new_worker(broker, client, cleanup)


@defer.inlineCallbacks
def held_and_free(broker: Any, cleanup: list[Any], worker: Any) -> Any:
    """A request to the paused queue ``held`` and one to ``free`` after it: only the free
    one reaches ``worker``. Fires with (the client, the held request's msgid)."""
    client = RawClient(broker.endpoints["client"])
    cleanup.append(client)
    held = client.request("held", "wait")
    free = client.request("free", "go")  # sent after: once it arrived, the held one had
    yield waits_for(lambda: bool(worker.requests()), "the free queue's request delivered")
    assert [r[3] for r in worker.requests()] == [free]
    return client, held


@pytest_twisted.inlineCallbacks
def test_a_paused_queue_holds_its_requests_until_resumed(tmp_path: Path, cleanup: list[Any]) -> Any:
    broker = broker_in(tmp_path, cleanup)
    web = web_for(tmp_path, cleanup, [("emqp", broker)])
    worker = RawWorker(broker.endpoints["worker"], [[10, "held"], [5, "free"]])
    cleanup.append(worker)
    yield waits_for(worker.acked, "the worker's INFORM acknowledged")
    worker.ready(2)
    yield waits_for(
        lambda: broker.status()["queues"].get("held", {}).get("free_slots") == 2, "two slots"
    )
    code, _ = yield post(web.port, "/api/v1/actions/emqp/pause", {"queue": "held"})
    assert code == 200
    _, held = yield held_and_free(broker, cleanup, worker)
    queues = broker.status()["queues"]
    assert queues["held"]["depth"] == 1 and queues["held"]["paused"]
    assert broker.status()["paused_queues"] == ["held"]
    code, answer = yield post(web.port, "/api/v1/actions/emqp/resume", {"queue": "held"})
    assert code == 200 and answer["result"]["changed"]
    yield waits_for(lambda: len(worker.requests()) == 2, "the held request delivered")
    assert worker.requests()[1][3] == held


@pytest_twisted.inlineCallbacks
def test_a_paused_queue_stays_paused_across_a_restart(tmp_path: Path, cleanup: list[Any]) -> Any:
    """The pause is kept in the broker's job store: a broker started again on the same data
    directory holds the queue's requests until an operator resumes it."""
    first = start_broker(tmp_path / "emqp")
    cleanup.append(first)
    code, _ = yield post(
        web_for(tmp_path, cleanup, [("emqp", first)]).port,
        "/api/v1/actions/emqp/pause",
        {"queue": "held"},
    )
    assert code == 200
    yield first.stopService()
    broker = broker_in(tmp_path, cleanup)
    assert broker.status()["paused_queues"] == ["held"]
    worker = RawWorker(broker.endpoints["worker"], [[10, "held"], [5, "free"]])
    cleanup.append(worker)
    yield waits_for(worker.acked, "the worker's INFORM acknowledged")
    worker.ready(2)
    _, held = yield held_and_free(broker, cleanup, worker)
    web = web_for(tmp_path, cleanup, [("emqp", broker)])
    code, answer = yield post(web.port, "/api/v1/actions/emqp/resume", {"queue": "held"})
    assert code == 200 and answer["result"]["changed"]
    yield waits_for(lambda: len(worker.requests()) == 2, "the held request delivered")
    assert worker.requests()[1][3] == held
    # Resumed is kept too: started again, nothing is paused.
    yield broker.stopService()
    again = broker_in(tmp_path, cleanup)
    assert again.status()["paused_queues"] == []


@pytest_twisted.inlineCallbacks
def test_a_removed_schedule_is_gone_and_a_forgotten_worker_told_to_leave(
    tmp_path: Path, cleanup: list[Any]
) -> Any:
    broker = broker_in(tmp_path, cleanup)
    web = web_for(tmp_path, cleanup, [("emqp", broker)])
    client = RawClient(broker.endpoints["client"])
    cleanup.append(client)
    client.peer.send(codec.schedule("nightly", b'"run"', b"", 86400.0, None))
    yield waits_for(lambda: broker.status()["schedules_count"] == 1, "the schedule kept")
    schedule = broker.status()["schedules"][0]["id"]
    code, answer = yield post(
        web.port, "/api/v1/actions/emqp/remove-schedule", {"schedule": schedule}
    )
    assert code == 200 and answer["result"] == {"schedule": schedule, "removed": True}
    assert broker.status()["schedules_count"] == 0
    assert broker.store.load_schedules() == []  # committed before the answer
    code, _ = yield post(web.port, "/api/v1/actions/emqp/remove-schedule", {"schedule": schedule})
    assert code == 404
    worker = RawWorker(broker.endpoints["worker"], [[10, "nightly"]])
    cleanup.append(worker)
    yield waits_for(worker.acked, "the worker's INFORM acknowledged")
    name = broker.status()["workers"][0]["id"]
    code, answer = yield post(web.port, "/api/v1/actions/emqp/forget-worker", {"worker": name})
    assert code == 200 and answer["result"]["forgotten"]
    assert broker.status()["workers"] == []
    yield waits_for(lambda: bool(worker.commands(codec.KBYE)), "the worker told KBYE")
    code, _ = yield post(web.port, "/api/v1/actions/emqp/forget-worker", {"worker": name})
    assert code == 404


@pytest_twisted.inlineCallbacks
def test_a_dropped_snapshot_client_frees_its_place_for_the_next(
    tmp_path: Path, cleanup: list[Any], peers: list[Any]
) -> Any:
    from bus.testing import RawPeer, start_bus
    from tests.test_eventbus_snapshots import fill, healthy_client, syncends, syncstart

    # One snapshot at a time: a client that stopped reading holds the place (for ten
    # minutes before the stall timeout) while the next waits behind it.
    bus = start_bus(tmp_path / "bus", snapshot_hwm=5, snapshot_stall_timeout=600, max_snapshots=1)
    cleanup.append(bus)
    web = web_for(tmp_path, cleanup, [("eventbus", bus)])
    yield fill(bus, peers)
    stuck = RawPeer.dealer(bus.endpoints["snapshot"], receive_hwm=5, identity=b"stuck-1")
    peers.append(stuck)
    stuck.socket.pause_reading()
    syncstart(stuck)
    yield waits_for(lambda: bus.snapshots.streams, "the stuck client's stream")
    waiting = healthy_client(bus, peers)
    yield waits_for(lambda: bus.status()["snapshots_waiting"] == 1, "the next one waiting")
    listed = {c["client"]: c for c in bus.status()["snapshot_clients"]}
    assert listed[b"stuck-1".hex()]["streams"] == 1
    code, answer = yield post(
        web.port, "/api/v1/actions/eventbus/drop-snapshot", {"client": b"stuck-1".hex()}
    )
    assert code == 200 and answer["result"]["dropped"] == 1
    # The place is the next client's: it gets its whole snapshot.
    yield waits_for(lambda: syncends(waiting), "the waiting client's SYNCEND")
    status = bus.status()
    assert status["snapshots_dropped"] == 1 and status["snapshots_served"] == 1
    code, _ = yield post(
        web.port, "/api/v1/actions/eventbus/drop-snapshot", {"client": b"stuck-1".hex()}
    )
    assert code == 404


@defer.inlineCallbacks
def purge_telling(port: int, queue: str, client: Any, told: list[bytes], removed: int) -> Any:
    """A purge of ``queue`` through the HTTP port that removes ``removed`` requests from the
    stream and tells ``client`` of each of ``told``."""
    code, answer = yield post(port, "/api/v1/actions/emqp/purge", {"queue": queue})
    assert code == 200
    assert answer["result"] == {
        "queue": queue, "purged": 0, "purged_from_stream": removed, "clients_told": len(told),
    }  # fmt: skip
    yield waits_for(lambda: all(client.results(m) for m in told), "the clients told")
    assert [client.results(m)[0]["error"] for m in told] == ["purged"] * len(told)


@pytest_twisted.inlineCallbacks
def test_a_queue_purged_in_its_jetstream_stream_never_reaches_a_worker(
    tmp_path: Path, cleanup: list[Any], nats_server: Any
) -> Any:
    from bus.emqp.config import JetStreamSettings

    settings = JetStreamSettings(tuple(nats_server.urls), pull_expires=1.0)
    broker = broker_in(tmp_path, cleanup, jetstream=settings, heartbeat_interval=10.0)
    yield waits_for(lambda: broker.stream is not None and broker.stream.ready, "the stream")
    web = web_for(tmp_path, cleanup, [("emqp", broker)])
    client = RawClient(broker.endpoints["client"])
    cleanup.append(client)
    sent = []
    for i in range(3):  # one at a time: each appended alone
        sent.append(client.request("stuck", i, b"reply-requested,guarantee"))
        yield waits_for(lambda n=i: broker.broker.appended == n + 1, "the request in the stream")
    # Held only in the stream, each one's client is told, as for a purge of one broker.
    yield purge_telling(web.port, "stuck", client, sent, removed=3)
    yield only_the_next_request_reaches_a_new_worker(broker, client, cleanup)


@pytest_twisted.inlineCallbacks
def test_a_stream_purge_tells_clients_at_other_brokers_and_leaves_requests_in_flight(
    tmp_path: Path, cleanup: list[Any], nats_server: Any
) -> Any:
    """Two brokers on one stream: the client and the worker at A, the purge at B. The request
    A's worker holds runs on and is answered; the two the stream gave to no broker are
    purged, and their client is told through A."""
    from bus.emqp.config import JetStreamSettings

    settings = JetStreamSettings(tuple(nats_server.urls), pull_expires=1.0)
    a = broker_in(tmp_path / "a", cleanup, jetstream=settings, heartbeat_interval=10.0)
    b = broker_in(tmp_path / "b", cleanup, jetstream=settings, heartbeat_interval=10.0)
    for broker in (a, b):
        yield waits_for(lambda x=broker: x.stream is not None and x.stream.ready, "the stream")
    worker = RawWorker(a.endpoints["worker"], [[10, "busy"]])
    cleanup.append(worker)
    yield waits_for(worker.acked, "the worker's INFORM acknowledged")
    worker.ready()  # one slot: the first request takes it, the others stay in the stream
    client = RawClient(a.endpoints["client"])
    cleanup.append(client)
    running = client.request("busy", "first", b"reply-requested,guarantee")
    yield waits_for(lambda: bool(worker.requests()), "the first request at the worker")
    waiting = [client.request("busy", n, b"reply-requested,guarantee") for n in (2, 3)]
    yield waits_for(lambda: a.broker.appended == 3, "the others in the stream")
    web = web_for(tmp_path, cleanup, [("emqp", b)])
    yield purge_telling(web.port, "busy", client, waiting, removed=3)
    assert client.results(running) == []
    worker.reply(worker.requests()[0], "done")
    yield waits_for(lambda: bool(client.results(running)), "the first request answered")
    assert client.results(running) == [{"value": "done"}]
    assert len(worker.requests()) == 1  # the purged ones never reach it


@pytest_twisted.inlineCallbacks
def test_the_command_line_tools_act_through_the_http_port(
    tmp_path: Path, cleanup: list[Any], keys: Any
) -> Any:
    import subprocess
    import sys

    from twisted.internet import threads

    from bus.testing import start_bus
    from bus.transport.certs import REFUSED_DIR

    broker = broker_in(tmp_path, cleanup, curve=keys.settings())
    bus = start_bus(tmp_path / "bus")
    cleanup.append(bus)
    web = web_for(tmp_path, cleanup, [("eventbus", bus), ("emqp", broker)])
    http = ["--http", f"127.0.0.1:{web.port}"]
    token = ["--token-file", str(tmp_path / "token")]
    (tmp_path / "wrong").write_text("not-it")
    bin_dir = Path(sys.executable).parent

    def run(*command: str) -> Any:
        return threads.deferToThread(
            subprocess.run, [str(bin_dir / command[0]), *command[1:]],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip

    done = yield run("emqp-cli", "pause", "jobs", *http, *token)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == {"changed": True, "paused": True, "queue": "jobs"}
    assert broker.broker.paused == {b"jobs"}
    done = yield run("emqp-cli", "resume", "jobs", *http, "--token-file", str(tmp_path / "wrong"))
    assert done.returncode == 1 and "HTTP 401" in done.stderr
    done = yield run("emqp-cli", "resume", "jobs", *http)
    assert done.returncode == 1 and "--token-file" in done.stderr
    assert broker.broker.paused == {b"jobs"}
    done = yield run("emqp-cli", "purge", "jobs", *http, *token)
    assert done.returncode == 0 and json.loads(done.stdout)["purged"] == 0
    done = yield run("eventbus-cli", "drop-snapshot", "abcd", *http, *token)
    assert done.returncode == 1 and "HTTP 404" in done.stderr and "abcd" in done.stderr
    keys.client("leaked")
    done = yield run("bus-keys", "refuse", str(keys.allowed / "leaked.key"), *http, *token)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["services"]["emqp"]["moved"] == [
        str(keys.allowed / REFUSED_DIR / "leaked.key")
    ]
    assert not (keys.allowed / "leaked.key").exists()
