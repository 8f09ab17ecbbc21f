"""The command-line tools over CURVE (``--server-key``, ``--cert``), as child processes
against servers in this process that speak CURVE and keep an allow-list with rights."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest_twisted
from twisted.internet import defer

from bus.dbp.client import ServiceRegistration
from bus.dbp.config import CatalogConfig
from bus.dbp.server import CatalogService
from bus.emqp.worker import EmqpWorker
from bus.testing import start_broker, wait_until
from tests.curve_helpers import Keys, dash_led_pair
from tests.processes import CommandProcess
from tests.zre_helpers import free_udp_port


class Command(CommandProcess):
    """One of the tools, named by its first argument."""

    def __init__(self, program: str, *args: str) -> None:
        self.program = program
        super().__init__(*args)


@defer.inlineCallbacks
def ran(cleanup: list[Any], program: str, *args: str) -> Any:
    command = Command(program, *args)
    cleanup.append(command)
    yield command.ended()
    return command


def curve_catalog(tmp_path: Path, keys: Keys, cleanup: list[Any]) -> CatalogService:
    """A DBP catalog speaking CURVE with ``keys``' allow-list, started."""
    config = CatalogConfig(
        port=0, beacon_port=0, data_dir=str(tmp_path / "dbp"), curve=keys.settings()
    )
    catalog = CatalogService(config)
    catalog.startService()
    cleanup.append(catalog)
    return catalog


def echo(params: Any) -> Any:
    return params


@pytest_twisted.inlineCallbacks
def test_emqp_cli_submits_and_asks_status_over_curve(
    tmp_path: Path, keys: Keys, cleanup: list[Any]
) -> Any:
    web = str(keys.secret_file("web", role="client", queues="jobs"))
    ops = str(keys.secret_file("ops", role="admin"))
    broker = start_broker(tmp_path / "emqp", curve=keys.settings())
    cleanup.append(broker)
    worker = EmqpWorker(
        broker.endpoints["worker"], queues=[(10, "jobs")], handlers={"echo": echo},
        curve=keys.curve("worker", role="worker"),
    )  # fmt: skip
    worker.startService()
    cleanup.append(worker)
    yield wait_until(lambda: worker.registered, what="the worker over CURVE")
    server_key = str(keys.server_key)
    submitted = yield ran(
        cleanup, "emqp-cli", "submit", "jobs", '["echo", {"n": 7}]',
        "--broker", broker.endpoints["client"], "--admin", broker.endpoints["admin"],
        "--server-key", server_key, "--cert", web,
    )  # fmt: skip
    assert submitted.code == 0, submitted.err
    assert json.loads(submitted.out) == {"n": 7}
    refused = yield ran(
        cleanup, "emqp-cli", "submit", "other", "[]", "--broker", broker.endpoints["client"],
        "--admin", broker.endpoints["admin"], "--server-key", server_key, "--cert", web,
    )  # fmt: skip
    assert refused.code == 1
    assert "forbidden-queue" in refused.err
    status = yield ran(
        cleanup, "emqp-cli", "status", "--admin", broker.endpoints["admin"],
        "--server-key", server_key, "--cert", ops,
    )  # fmt: skip
    assert status.code == 0, status.err
    assert "jobs" in json.loads(status.out)["queues"]


@pytest_twisted.inlineCallbacks
def test_dbp_cli_lists_services_over_curve(tmp_path: Path, keys: Keys, cleanup: list[Any]) -> Any:
    reader = str(keys.secret_file("reader", names=""))
    catalog = curve_catalog(tmp_path, keys, cleanup)
    service = ServiceRegistration(
        catalog.endpoint,
        {
            "name": "pump",
            "address": "127.0.0.1",
            "port": free_udp_port(),
            "function": "test",
            "heartbeat": 0.5,
        },
        curve=keys.curve("pump", names="pump"),
    )
    service.startService()
    cleanup.append(service)
    yield service.registered
    listed = yield ran(
        cleanup, "dbp-cli", "services", "--catalog", catalog.endpoint,
        "--server-key", str(keys.server_key), "--cert", reader,
    )  # fmt: skip
    assert listed.code == 0, listed.err
    assert list(json.loads(listed.out)) == ["pump"]
    plain = yield ran(
        cleanup, "dbp-cli", "services", "--catalog", catalog.endpoint, "--timeout", "1"
    )
    assert plain.code == 1
    assert "no answer" in plain.err


@pytest_twisted.inlineCallbacks
def test_eventbus_cli_publishes_and_reads_its_subtrees_over_curve(
    tmp_path: Path, keys: Keys, cleanup: list[Any]
) -> Any:
    from bus.testing import start_bus

    orders = str(keys.secret_file("orders", publish="/orders/", subscribe="/orders/"))
    bus = start_bus(tmp_path / "bus", curve=keys.settings())
    cleanup.append(bus)
    server = f"127.0.0.1:{bus.port}"
    curve = ("--server-key", str(keys.server_key), "--cert", orders)
    for topic in ("/orders/1/", "/billing/1/"):
        published = yield ran(
            cleanup, "eventbus-cli", "publish", topic, "1", "--server", server, "--no-confirm",
            *curve,
        )  # fmt: skip
        assert published.code == 0, published.err
    confirmed = yield ran(
        cleanup, "eventbus-cli", "publish", "/orders/2/", "2", "--server", server, *curve
    )
    assert confirmed.code == 0, confirmed.err
    assert json.loads(confirmed.out)["seq"] == 2  # /billing/1/ was dropped, not stored
    assert bus.core.drops.counts["forbidden-topic"] == 1
    dumped = yield ran(cleanup, "eventbus-cli", "snapshot", "--server", server, *curve)
    assert dumped.code == 0, dumped.err
    assert [json.loads(line)["topic"] for line in dumped.out.splitlines()] == [
        "/orders/1/",
        "/orders/2/",
    ]
    missing = yield ran(cleanup, "eventbus-cli", "snapshot", "--server", server, "--cert", orders)
    assert missing.code == 1
    assert "--cert needs --server-key" in missing.err


@pytest_twisted.inlineCallbacks
def test_a_tool_without_the_key_is_told_the_port_speaks_curve(
    tmp_path: Path, keys: Keys, cleanup: list[Any]
) -> Any:
    web = str(keys.secret_file("web", role="client"))
    broker = start_broker(tmp_path / "emqp", curve=keys.settings())
    cleanup.append(broker)
    plain = yield ran(
        cleanup, "emqp-cli", "status", "--admin", broker.endpoints["admin"], "--wait", "1"
    )
    assert plain.code == 1
    assert plain.err.strip().endswith(
        "speaks CURVE and did not answer STATUS: give --server-key (and --cert); gave up after 1 s"
    ), plain.err
    refused = yield ran(
        cleanup, "emqp-cli", "status", "--admin", broker.endpoints["admin"], "--wait", "1",
        "--server-key", str(keys.server_key), "--cert", web,
    )  # fmt: skip
    assert refused.code == 1
    admin = broker.endpoints["admin"]
    assert f"status: the server at {admin} refused the key of --cert {web} (" in refused.err
    assert refused.err.strip().endswith(
        "or its certificate there gives it roles without admin; add its public certificate"
        " (NAME.key, made by bus-keys) there, with role = admin or no role"
        " (docs/security.md); gave up after 1 s"
    ), refused.err
    assert broker.curve.refusals["role"] >= 1


@pytest_twisted.inlineCallbacks
def test_eventbus_cli_without_the_key_is_told_the_bus_speaks_curve(
    tmp_path: Path, keys: Keys, cleanup: list[Any]
) -> Any:
    from bus.testing import start_bus

    bus = start_bus(tmp_path / "bus", curve=keys.settings())
    cleanup.append(bus)
    plain = yield ran(
        cleanup, "eventbus-cli", "publish", "/a/", "1", "--server", f"127.0.0.1:{bus.port}",
        "--timeout", "1",
    )  # fmt: skip
    assert plain.code == 1
    assert plain.err.strip().endswith(
        f"127.0.0.1:{bus.port} speaks CURVE: give --server-key (and --cert)"
    ), plain.err


@pytest_twisted.inlineCallbacks
def test_a_server_key_that_begins_with_a_dash_is_taken_as_the_key(
    tmp_path: Path, cleanup: list[Any]
) -> Any:
    # One Z85 key in 85 begins with "-": argparse alone took it for an option and said
    # "--server-key: expected one argument" (CI saw it once, in bus-cluster's mc0 test).
    keys = Keys(tmp_path, dash_led_pair())
    reader = str(keys.secret_file("reader", names=""))
    catalog = curve_catalog(tmp_path, keys, cleanup)
    server_key = keys.server.public.decode("ascii")
    for spelled in (["--server-key", server_key], [f"--server-key={server_key}"]):
        listed = yield ran(
            cleanup, "dbp-cli", "services", "--catalog", catalog.endpoint, *spelled,
            "--cert", reader,
        )  # fmt: skip
        assert listed.code == 0, (spelled, listed.err)
        assert json.loads(listed.out) == {}
    # bus-keys refuse takes such a key as its positional, wherever it stands; the address
    # answers nothing, so it fails there (status 1), not on its command line (status 2).
    token = tmp_path / "token"
    token.write_text("t" * 32)
    for args in ([server_key, "--http", "127.0.0.1:1"], ["--http", "127.0.0.1:1", server_key]):
        refused = yield ran(
            cleanup, "bus-keys", "refuse", *args, "--token-file", str(token), "--timeout", "2"
        )
        assert refused.code == 1, (args, refused.err)
        assert "127.0.0.1:1" in refused.err, refused.err
    # A forgotten value is still said to be missing, not taken from the next option.
    missing = yield ran(cleanup, "dbp-cli", "services", "--server-key", "--cert", reader)
    assert missing.code == 2
    assert "--server-key: expected one argument" in missing.err, missing.err
