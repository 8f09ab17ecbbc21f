"""A pull that the server never ends (issue 49): a consumer leader elected anew, or cut
away, forgets the pulls it held and answers none of them; here a proxy in front of a real
nats-server loses the pull on its way, which the broker sees the same way. The broker must
take it for lost once past its expiry and pull again, so that a request stored afterwards
still reaches the ready worker. Before, the queue was never pulled again."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest_twisted

from bus.testing import wait_until
from tests.emqp_helpers import RawClient, RawWorker
from tests.nats_proxy import NatsProxy
from tests.processes import CLEAN_EXIT, BrokerProcess


def jetstream(process: BrokerProcess) -> dict[str, Any]:
    return dict(process.status().get("jetstream") or {})


@pytest_twisted.inlineCallbacks
def test_a_pull_lost_on_its_way_is_asked_again_and_the_queue_is_served(
    tmp_path: Path, nats_server: Any
) -> Any:
    proxy = NatsProxy(int(nats_server.urls[0].rsplit(":", 1)[1]))
    # Every pull is lost until the test says otherwise.
    proxy.drop = lambda subject: b".CONSUMER.MSG.NEXT." in subject
    broker = BrokerProcess(
        tmp_path / "broker", None,
        "--store", "jetstream", "--nats", proxy.url, "--nats-replicas", "1",
        "--heartbeat-interval", "10s",  # the raw worker sends none
    )  # fmt: skip
    peers: list[Any] = []
    try:
        yield wait_until(lambda: broker.ready() and jetstream(broker).get("ready"), timeout=120,
                         what="the broker on JetStream")  # fmt: skip
        worker = RawWorker(broker.endpoints["worker"])
        client = RawClient(broker.endpoints["client"])
        peers += [worker, client]
        yield wait_until(worker.acked, timeout=60, what="the worker's INFORM acknowledged")
        worker.ready(1)
        yield wait_until(lambda: proxy.dropped, timeout=60, what="the broker's pull (lost)")
        assert jetstream(broker).get("pulls_lapsed", 0) == 0
        proxy.drop = lambda _: False  # the cluster is whole again; the lost pull stays lost
        sent = client.request("default", {"n": 1}, b"guarantee,reply-requested")
        yield wait_until(lambda: worker.requests(), timeout=120, what="the request at the worker")
        assert worker.requests()[0][3] == sent
        # (status.json is written every 0.1 s: read until it tells of the delivery.)
        yield wait_until(lambda: jetstream(broker)["pulled"] == 1, timeout=30, what="status")
        status = jetstream(broker)
        assert status["pulls_lapsed"] >= 1, json.dumps(status)
        assert status["queues"]["default"]["last_delivery_s_ago"] is not None, status
        worker.reply(worker.requests()[0], "done")
        yield wait_until(lambda: client.results(sent) == [{"value": "done"}], timeout=60,
                         what="the answer")  # fmt: skip
    finally:
        for peer in peers:
            peer.close()
        code = broker.stop()
        yield proxy.close()
    assert code in CLEAN_EXIT, broker.log_path.read_text()
