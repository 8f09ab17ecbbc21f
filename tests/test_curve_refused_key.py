"""A key the server refuses says so (issue 34): ``emqp-worker`` against ``twistd -n emqp``
and ``eventbus-cli`` against a bus, both over CURVE with an allow-list, each given a key not
on it (and the worker a key whose role is not ``worker``), as child processes. Before,
the worker only logged that the broker was silent, and eventbus-cli that no heartbeat came."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest_twisted

from bus.testing import start_bus, wait_until
from bus.transport.certs import write_certificate
from bus.transport.curve import CurveKeyPair
from tests.curve_helpers import Keys
from tests.processes import BrokerProcess, reported
from tests.test_curve_cli import ran
from tests.test_emqp_worker_command import WorkerProcess

ALLOW_LIST = "it is not on the server's allow-list (the directory of its --client-certs)"


def unlisted(keys: Keys, name: str) -> tuple[Path, str]:
    """A client key pair written as a ``--cert`` file, its key on no allow-list; the file
    and its public key."""
    pair = CurveKeyPair.generate()
    write_certificate(keys.root / "private", name, pair.public, pair.secret, {})
    return keys.root / "private" / f"{name}.key_secret", pair.public.decode()


@pytest_twisted.inlineCallbacks
def test_emqp_worker_says_the_broker_refused_its_key(
    tmp_path: Path, keys: Keys, cleanup: list[Any]
) -> Any:
    """An unknown key, and a listed key with only the client role: each worker's log names
    the broker, its key, the allow-list and the role, instead of only the broker's silence."""
    keys.secret_file("web", role="client")  # listed before the broker reads its list
    broker = BrokerProcess(
        tmp_path / "emqp", None, "--server-cert", str(keys.server_cert),
        "--client-certs", str(keys.allowed),
    )  # fmt: skip
    try:
        yield _workers_are_told(tmp_path, keys, cleanup, broker)
    finally:
        broker.stop()


@pytest_twisted.inlineCallbacks
def _workers_are_told(tmp_path: Path, keys: Keys, cleanup: list[Any], broker: Any) -> Any:
    yield reported(broker.ready, what="twistd -n emqp over CURVE")
    endpoint = broker.endpoints["worker"]
    stranger, stranger_key = unlisted(keys, "stranger")
    web = keys.root / "private" / "web.key_secret"
    workers = {}
    for name, cert in (("stranger", stranger), ("web", web)):
        worker = WorkerProcess(
            tmp_path / f"{name}.log", "--broker", endpoint, "--server-key", str(keys.server_key),
            "--cert", str(cert), "--heartbeat-interval", "0.3s", "--slots", "1",
        )  # fmt: skip
        cleanup.append(worker)
        workers[name] = worker
    said = {name: f"the server at {endpoint} refused the key of --cert {cert}" for name, cert in
            (("stranger", stranger), ("web", web))}  # fmt: skip
    yield wait_until(
        lambda: all(said[name] in worker.output() for name, worker in workers.items()),
        timeout=30,
        what="both workers saying their key was refused",
    )
    line = next(
        text for text in workers["stranger"].output().splitlines() if said["stranger"] in text
    )
    assert line.endswith(
        f"{said['stranger']} ({stranger_key}): {ALLOW_LIST}, or its certificate there gives it"
        " roles without worker; add its public certificate (NAME.key, made by bus-keys) there,"
        " with role = worker or no role (docs/security.md)"
    ), line
    refusals = broker.status()["curve"]["refused"]
    assert refusals.get("unknown-key", 0) >= 1 and refusals.get("role", 0) >= 1


@pytest_twisted.inlineCallbacks
def test_eventbus_cli_says_the_bus_refused_its_key(
    tmp_path: Path, keys: Keys, cleanup: list[Any]
) -> Any:
    """A key not on the bus's allow-list, and a fresh key (no --cert): not "timed out
    waiting for a heartbeat" alone, but which key the bus refused and where its list is."""
    bus = start_bus(tmp_path / "bus", curve=keys.settings())
    cleanup.append(bus)
    stranger, stranger_key = unlisted(keys, "stranger")
    server = f"127.0.0.1:{bus.port}"
    curve = ("--server-key", str(keys.server_key))
    refused = yield ran(
        cleanup, "eventbus-cli", "publish", "/a/", "1", "--server", server, "--timeout", "1",
        *curve, "--cert", str(stranger),
    )  # fmt: skip
    assert refused.code == 1
    assert refused.err.strip().endswith(
        f"; the server at tcp://{server} refused the key of --cert {stranger} ({stranger_key}):"
        f" {ALLOW_LIST}; add its public certificate (NAME.key, made by bus-keys) there"
        " (docs/security.md)"
    ), refused.err
    fresh = yield ran(
        cleanup, "eventbus-cli", "publish", "/a/", "1", "--server", server, "--timeout", "1",
        *curve,
    )  # fmt: skip
    assert fresh.code == 1
    assert fresh.err.strip().endswith(
        f"; the server at tcp://{server} refused a fresh key (no --cert was given): {ALLOW_LIST};"
        " give --cert with a key whose public certificate is in that directory"
        " (docs/security.md)"
    ), fresh.err
