"""eMQP's PUBLISH service as operators run it: ``twistd -n emqp-pubsub`` alone, and composed
into ``twistd -n eventbus`` (its options prefixed ``--emqp-pubsub-``, its /status and
/metrics entries, its publications on the bus)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import msgpack
import pytest
import pytest_twisted
from twisted.python import usage

from bus import tap
from bus.emqp import pubsub_codec
from bus.testing import RawPeer, wait_until
from tests.ports import free_ports
from tests.processes import CLEAN_EXIT, TWISTD, TwistdProcess, exit_status, reported
from tests.test_emqp_interop import InteropProcess
from tests.test_emqp_pubsub import EXPECTED, interop, publish_with_eventmq
from tests.test_product_process import Product, environment, metric_samples

__all__ = ["interop"]  # the fixture, used by name


@pytest_twisted.inlineCallbacks
def test_twistd_emqp_pubsub_serves_eventmq_s_publisher_alone(
    tmp_path: Path, interop: list[InteropProcess]
) -> Any:
    port = free_ports(2)
    alone = TwistdProcess(
        [
            TWISTD, "-n", "--pidfile=", "emqp-pubsub",
            "--incoming-port", str(port), "--outgoing-port", str(port + 1),
            "--bind", "127.0.0.1", "--stats-interval", "0.1s",
        ],
        tmp_path / "emqp-pubsub.log",
        environment(),
        tmp_path,
    )  # fmt: skip
    try:
        line = f"publishers to tcp://127.0.0.1:{port}, subscribers on tcp://127.0.0.1:{port + 1}"
        yield reported(lambda: line in alone.output(), alone.process, what=line)
        received = yield publish_with_eventmq(
            f"tcp://127.0.0.1:{port}", f"tcp://127.0.0.1:{port + 1}", tmp_path, interop, "alone"
        )
        assert received == EXPECTED
        yield wait_until(lambda: "dropped 0; publishers" in alone.output(), what="a stats line")
    finally:
        code = alone.stop()
    assert code in CLEAN_EXIT, alone.output()
    assert "eMQP PUBLISH service stopped" in alone.output()
    assert "Traceback" not in alone.output()


def test_twistd_emqp_pubsub_refuses_a_busy_port_in_one_line(tmp_path: Path) -> None:
    port = free_ports(2)
    with RawPeerBinding(port):
        alone = TwistdProcess(
            [TWISTD, "-n", "--pidfile=", "emqp-pubsub", "--incoming-port", str(port),
             "--outgoing-port", str(port + 1)],
            tmp_path / "busy.log", environment(), tmp_path,
        )  # fmt: skip
        code = exit_status(alone.process)  # it only starts, and refuses
        alone.log.close()
    assert code == 1, alone.output()
    assert f"cannot start emqp-pubsub: --incoming-port {port}: " in alone.output()


class RawPeerBinding:
    """A plain socket bound to a port while the block runs."""

    def __init__(self, port: int) -> None:
        import socket

        self.socket = socket.socket()
        self.socket.bind(("127.0.0.1", port))
        self.socket.listen()

    def __enter__(self) -> RawPeerBinding:
        return self

    def __exit__(self, *exc: object) -> None:
        self.socket.close()


@pytest_twisted.inlineCallbacks
def test_composed_it_reports_on_status_and_metrics_and_publishes_onto_the_bus(
    tmp_path: Path,
) -> Any:
    product = Product(
        tmp_path,
        "--services", "eventbus,emqp-pubsub", "--port", "0", "--data-dir", str(tmp_path / "bus"),
        "--emqp-pubsub-incoming-port", "0", "--emqp-pubsub-outgoing-port", "0",
        "--emqp-pubsub-subscriber-hwm", "500",
    )  # fmt: skip
    peers: list[RawPeer] = []
    try:
        yield reported(product.ready, what="the product")
        services = product.status()["services"]
        assert list(services) == ["eventbus", "emqp-pubsub", "http"]  # after the bus (AFTER)
        endpoints = services["emqp-pubsub"]["endpoints"]
        assert services["emqp-pubsub"]["config"]["subscriber_hwm"] == 500
        feed = RawPeer.sub(services["eventbus"]["endpoints"]["publisher"], (b"/emqp/publish/",))
        subscriber = RawPeer.sub(endpoints["outgoing"], (b"orders",))
        publisher = RawPeer.dealer(endpoints["incoming"])
        peers += [feed, subscriber, publisher]
        # Publish until both the bus's feed and the SUB show one (no slow-joiner loss).
        warmups = 0
        while not (feed.messages and subscriber.messages):
            publisher.send(pubsub_codec.publish(b"orders.warm", b"0", b"w%d" % warmups))
            warmups += 1
            yield wait_until(lambda: feed.messages and subscriber.messages, timeout=0.1).addErrback(
                lambda _: None
            )
        publisher.send([b"", b"eMQP/1.0", b"PUBLISH", b"bad", b"no message"])
        publisher.send(pubsub_codec.publish(b"orders.created", b'{"id": 7}', b"m7"))
        yield wait_until(
            lambda: subscriber.messages[-1] == [b"orders.created", b'{"id": 7}'],
            what="the publication",
        )
        status = product.status()["services"]["emqp-pubsub"]
        assert status["published"] == warmups + 1
        assert status["dropped"] == {"truncated": 1}
        assert status["connections"] == {"incoming": 1, "outgoing": 1}
        samples = metric_samples(product.get("/metrics"))
        assert samples["emqp_pubsub_published_total"] == warmups + 1
        assert samples["emqp_pubsub_messages_dropped_total{reason=truncated}"] == 1
        assert samples["emqp_pubsub_subscribers"] == 1
        assert samples["emqp_pubsub_curve"] == 0
        # Each publication an event on the bus, under its topic, by emqp-pubsub.
        yield wait_until(
            lambda: any(m[0] == b"/emqp/publish/orders.created/" for m in feed.messages),
            what="the publication on the bus",
        )
        topic, _, producer, _, _, data = feed.messages[-1]
        assert (topic, producer) == (b"/emqp/publish/orders.created/", b"emqp-pubsub")
        value = msgpack.unpackb(data)
        assert value["publisher"].startswith("0x")  # a ROUTER's own identity for a DEALER
        assert {k: value[k] for k in ("topic", "message", "msgid")} == {
            "topic": "orders.created", "message": '{"id": 7}', "msgid": "m7",
        }  # fmt: skip
        assert json.loads(value["message"]) == {"id": 7}
    finally:
        for peer in peers:
            peer.close()
        code = product.stop()
    assert code in CLEAN_EXIT, product.output()
    log = product.output()
    assert log.index("stopped emqp-pubsub") < log.index("stopped eventbus")
    assert "Traceback" not in log


# -- the composed product's options ------------------------------------------------------------


@pytest.fixture
def clean_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    for name in list(os.environ):
        if name.startswith(("EVENTBUS_", "EMQP_")):
            monkeypatch.delenv(name)


def parse(*args: str) -> Any:
    options = tap.Options()
    options.parseOptions(list(args))
    return options


def test_it_is_a_default_service_on_eventmq_s_ports(clean_environment: None) -> None:
    options = parse()
    assert "emqp-pubsub" in options["services"]
    config = options["service-options"]["emqp-pubsub"]["emqp-pubsub-config"]
    assert (config.bind, config.incoming_port, config.outgoing_port) == ("127.0.0.1", 47298, 47299)
    assert not config.curve.enabled


def test_its_options_come_prefixed_from_every_layer(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, clean_environment: None
) -> None:
    config = tmp_path / "bus.toml"
    config.write_text(
        '[emqp-pubsub]\nincoming-port = 1\nsubscriber-hwm = 7\nstats-interval = "1m"\n'
    )
    monkeypatch.setenv("EMQP_PUBSUB_SUBSCRIBER_HWM", "9")
    options = parse(
        "--config", str(config), "--emqp-pubsub-incoming-port", "5000",
        "--emqp-pubsub-outgoing-port", "5001", "--emqp-pubsub-bind", "127.0.0.2",
    )  # fmt: skip
    pubsub = options["service-options"]["emqp-pubsub"]["emqp-pubsub-config"]
    assert pubsub.incoming_port == 5000  # command line over file
    assert pubsub.outgoing_port == 5001
    assert pubsub.bind == "127.0.0.2"
    assert pubsub.subscriber_hwm == 9  # environment over file
    assert pubsub.stats_interval == 60.0  # file
    with pytest.raises(
        usage.UsageError,
        match="--emqp-pubsub-incoming-port and --emqp-pubsub-outgoing-port must differ",
    ):
        parse("--emqp-pubsub-incoming-port", "6000", "--emqp-pubsub-outgoing-port", "6000")
    with pytest.raises(usage.UsageError, match="--emqp-pubsub-subscriber-hwm must be at least 1"):
        parse("--emqp-pubsub-subscriber-hwm", "0")
    with pytest.raises(usage.UsageError, match="which is not among --services"):
        parse("--services", "eventbus", "--emqp-pubsub-incoming-port", "5000")
    # --emqp-pubsub-server-cert: CURVE like every other port.
    cert = tmp_path / "server.key_secret"
    options = parse("--emqp-pubsub-server-cert", str(cert))
    assert options["service-options"]["emqp-pubsub"]["emqp-pubsub-config"].curve.server_cert == cert
