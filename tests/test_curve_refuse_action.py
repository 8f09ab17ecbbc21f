"""Refusing a CURVE key now, on every port of the process (the HTTP port's ``curve/refuse``),
through real sockets: an eMQP broker and an Event BUS in one process over CURVE, sharing
one allow-list; a client of each holds a connection with the key. Refused, the key's
connections are cut and its reconnections refused on both services, while another key's
client goes on; the certificate leaves the allow-list (the list says it too), and moved
back it lets the key in again."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest_twisted

from bus.emqp.client import EmqpClient
from bus.emqp.worker import EmqpWorker
from bus.eventbus.client import EventBusPublisher
from bus.testing import start_broker, start_bus, wait_until
from bus.transport.certs import REFUSED_DIR
from bus.transport.curve import ClientCurve
from bus.web.server import StatusWebService
from tests.curve_helpers import Keys
from tests.test_http_actions import TOKEN, post


def echo(params: Any) -> Any:
    return params


@pytest_twisted.inlineCallbacks
def test_a_refused_key_is_cut_off_every_curve_port_of_the_process(
    tmp_path: Path, keys: Keys, cleanup: list[Any]
) -> Any:
    bad_pair = keys.client("leaked")
    good = keys.curve("good")
    worker_key = keys.curve("worker")
    broker = start_broker(tmp_path / "emqp", curve=keys.settings())
    cleanup.append(broker)
    bus = start_bus(tmp_path / "bus", curve=keys.settings())
    cleanup.append(bus)
    (tmp_path / "token").write_text(TOKEN)
    web = StatusWebService([("eventbus", bus), ("emqp", broker)], 0, token_file=tmp_path / "token")
    web.startService()
    cleanup.append(web)
    bad = ClientCurve(keys.server.public, bad_pair)
    worker = EmqpWorker(
        broker.endpoints["worker"], queues=[(10, "jobs")], handlers={"echo": echo}, curve=worker_key
    )
    worker.startService()
    cleanup.append(worker)
    leaked_client = EmqpClient(broker.endpoints["client"], curve=bad)
    cleanup.append(leaked_client)
    good_client = EmqpClient(broker.endpoints["client"], curve=good)
    cleanup.append(good_client)
    assert (yield leaked_client.submit("jobs", ["echo", 1])) == 1
    assert (yield good_client.submit("jobs", ["echo", 2])) == 2
    publisher = EventBusPublisher(f"127.0.0.1:{bus.port}", producer_id="leaked", curve=bad)
    cleanup.append(publisher)
    publisher.publish("/leaked/", {"n": 1})
    yield wait_until(lambda: bus.store.last_sequence >= 1, timeout=30, what="its event stored")
    assert (yield post(web.port, "/api/v1/actions/curve/refuse", {"key": "short"}))[0] == 400
    own = keys.server.public.decode()
    code, answer = yield post(web.port, "/api/v1/actions/curve/refuse", {"key": own})
    assert code == 400 and "own key" in answer["error"]

    public = bad_pair.public.decode()
    code, answer = yield post(web.port, "/api/v1/actions/curve/refuse", {"key": public})
    assert code == 200, answer
    done = answer["result"]["services"]
    # The allow-list says it: the certificate moved out by the first service, refused
    # in memory by both.
    assert not (keys.allowed / "leaked.key").exists()
    assert (keys.allowed / REFUSED_DIR / "leaked.key").exists()
    assert sorted(done) == ["emqp", "eventbus"]
    assert [Path(p).name for s in done.values() for p in s["moved"]] == ["leaked.key"]
    # Only on the ports it was let in on, from where it came: eMQP's client port (the other
    # client from 127.0.0.1 too), the bus's collector; not eMQP's worker port.
    assert done["emqp"]["connections_cut"] == {"emqp-clients": 2}
    assert done["eventbus"]["connections_cut"] == {"collector": 1}
    # Its connections were cut: each reconnects by itself, and is refused.
    yield wait_until(
        lambda: (
            broker.curve.refusals.get("refused", 0) >= 1
            and bus.curve.refusals.get("refused", 0) >= 1
        ),
        timeout=30,
        what="the leaked key's reconnections refused on both services",
    )
    # Another key's client goes on (its connection cut too, and made again).
    assert (yield good_client.submit("jobs", ["echo", 3])) == 3
    assert broker.status()["curve"]["denied_keys"] == [public]
    # Moved back, the certificate lets the key in again.
    (keys.allowed / REFUSED_DIR / "leaked.key").rename(keys.allowed / "leaked.key")
    yield wait_until(
        lambda: not broker.curve.zap.denied_keys and not bus.curve.zap.denied_keys,
        timeout=30,
        what="the allow-list re-read",
    )
    again = EmqpClient(broker.endpoints["client"], curve=bad)
    cleanup.append(again)
    assert (yield again.submit("jobs", ["echo", 4])) == 4
