"""eMQP as a drop-in for eventmq 0.3.13's router (issue 34), through real processes: the
broker reads eventmq's ``eventmq.conf`` (``-C``, ``--config``, ``EVENTMQ_CONFIG_FILE``,
``EVENTMQ_<NAME>``) under its own options, as eventmq's own router reads the same file; a
SIGHUP reads the settings again instead of ending the broker (alone and composed); and the
log's lines of dropped answers add up to what ``/status`` counts."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import pytest_twisted

from bus.emqp import codec
from bus.testing import RawPeer, wait_until
from bus.transport.certs import write_certificate
from tests.curve_helpers import Keys
from tests.emqp_helpers import RawClient, RawWorker
from tests.ports import free_ports
from tests.processes import (
    CLEAN_EXIT,
    TWISTD,
    BrokerProcess,
    ServerProcess,
    TwistdProcess,
    reported,
)

ROOT = Path(__file__).resolve().parent.parent
INTEROP_BIN = ROOT / ".venv-interop" / "bin"


def clean_environment(**more: str) -> dict[str, str]:
    """The environment without eMQP's and eventmq's variables (the tests' conftest sets
    EMQP_*_PORT=0, which would win over eventmq's file), with ``more``."""
    environment = {k: v for k, v in os.environ.items() if not k.startswith(("EMQP_", "EVENTMQ_"))}
    environment.update(PYTHONUNBUFFERED="1", **more)
    return environment


def write_eventmq_conf(path: Path, first_port: int, **settings: Any) -> dict[str, str]:
    """eventmq's INI file with its three router addresses (and ``settings``) in [global];
    ``router_*`` settings go to a [router] section. The endpoints, by our names."""
    endpoints = {
        "worker": f"tcp://127.0.0.1:{first_port}",
        "client": f"tcp://127.0.0.1:{first_port + 1}",
        "admin": f"tcp://127.0.0.1:{first_port + 2}",
    }
    lines = [
        "[global]",
        f"backend_addr = {endpoints['worker']}",
        f"frontend_addr = {endpoints['client']}",
        f"administrative_addr = {endpoints['admin']}",
        f"wal = {path.parent / 'wal.log'}",
    ]
    lines += [f"{k} = {v}" for k, v in settings.items() if not k.startswith("router_")]
    router = [f"{k[7:]} = {v}" for k, v in settings.items() if k.startswith("router_")]
    if router:
        lines += ["", "[router]", *router]
    path.write_text("\n".join(lines) + "\n")
    return endpoints


class EmqpAlone(TwistdProcess):
    """``twistd -n emqp ARGS`` with no port option: where it serves comes from ``args``,
    eventmq's file and the environment."""

    def __init__(self, workdir: Path, *args: str, env: dict[str, str] | None = None) -> None:
        self.data_dir = workdir / "emqp"
        self.data_dir.mkdir(parents=True, exist_ok=True)
        environment = clean_environment(**(env or {}))
        command = [TWISTD, "-n", "--pidfile=", "emqp", "--data-dir", str(self.data_dir), *args]
        super().__init__(command, workdir / "emqp.log", environment, workdir)

    def status(self) -> dict[str, Any]:
        try:
            return dict(json.loads((self.data_dir / "status.json").read_text()))
        except (FileNotFoundError, json.JSONDecodeError):
            return {}

    def ready(self) -> bool:
        if self.process.poll() is not None:
            raise AssertionError(f"exited {self.process.returncode}: {self.output()}")
        return bool(self.status().get("endpoints"))


@contextlib.contextmanager
def eventmq_router(workdir: Path, *args: str, env: dict[str, str] | None = None) -> Iterator[Any]:
    """eventmq 0.3.13's own ``emq-router ARGS`` (its settings from its file), stopped after."""
    python = INTEROP_BIN / "python"
    if not python.exists():
        pytest.fail(f"{python} is missing: `make .venv-interop/.installed` makes it")
    environment = clean_environment(**(env or {}))
    log_path = workdir / "emq-router.log"
    with open(log_path, "ab") as log:
        process = subprocess.Popen(
            [str(python), str(INTEROP_BIN / "emq-router"), *args],
            stdout=log, stderr=log, env=environment, cwd=workdir, start_new_session=True,
        )  # fmt: skip
    process.log_path = log_path  # type: ignore[attr-defined]
    try:
        yield process
    finally:
        process.terminate()
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(10)
        if process.poll() is None:
            process.kill()
            process.wait(10)


@pytest_twisted.inlineCallbacks
def serves(endpoints: dict[str, str]) -> Any:
    """A worker INFORMs at ``worker``, a client's REQUEST at ``client`` reaches it, and
    ``admin`` answers STATUS: the broker serves at these three addresses. Its STATUS."""
    worker = RawWorker(endpoints["worker"])
    client = RawClient(endpoints["client"])
    # A text identity: a binary one (libzmq's default) crashes eventmq's router.
    admin = RawPeer.dealer(endpoints["admin"], identity=codec.new_msgid())
    try:
        yield wait_until(worker.acked, timeout=30, what=f"ACK at {endpoints['worker']}")
        worker.ready()
        client.request("default", ["run", {"path": "os.path", "callable": "join"}])
        yield wait_until(worker.requests, timeout=30, what=f"a REQUEST via {endpoints['client']}")
        asked = codec.message(b"STATUS")
        admin.send(asked)
        yield wait_until(
            lambda: any(m[2:3] == [b"REPLY"] for m in admin.messages),
            timeout=30,
            what=f"STATUS at {endpoints['admin']}",
        )
        reply = next(m for m in admin.messages if m[2:3] == [b"REPLY"])
        return json.loads(reply[4])
    finally:
        worker.close()
        client.close()
        admin.close()


def setting(status: dict[str, Any], name: str) -> Any:
    """A field of the broker's settings in a status.json (``config.broker``)."""
    return status["config"]["broker"][name]


def _stopped(process: TwistdProcess) -> None:
    assert process.stop() in CLEAN_EXIT, process.output()


# -- 1. eventmq.conf ----------------------------------------------------------------------------


@pytest_twisted.inlineCallbacks
def test_eventmq_conf_serves_where_eventmqs_router_serves(tmp_path: Path) -> Any:
    """The same file: eventmq's router (-C) serves at its three addresses; so does
    ``twistd -n emqp -C``, ``--config`` and ``$EVENTMQ_CONFIG_FILE`` with no option of ours,
    its HWM our queue limit, its heartbeats ours, its WAL_ENABLED one not-honoured line."""
    conf = tmp_path / "eventmq.conf"
    endpoints = write_eventmq_conf(
        conf, free_ports(3), hwm=7, heartbeat_interval=1, heartbeat_timeout=5, wal_enabled="true"
    )
    with eventmq_router(tmp_path, "-C", str(conf)) as router:
        status = yield serves(endpoints)
        assert router.poll() is None
    assert "connected_queues" in status or "inflight_messages_by_queue" in status

    for how, args, env in (
        ("-C", ["-C", str(conf)], {}),
        ("--config", ["--config", str(conf)], {}),
        ("EVENTMQ_CONFIG_FILE", [], {"EVENTMQ_CONFIG_FILE": str(conf)}),
    ):
        workdir = tmp_path / how.strip("-")
        workdir.mkdir()
        broker = EmqpAlone(workdir, *args, env=env)
        try:
            yield reported(broker.ready, what=f"the broker with {how}")
            assert broker.status()["endpoints"] == endpoints, how
            status = yield serves(endpoints)
            assert "inflight_messages_by_queue" in status
            status = broker.status()
            assert setting(status, "queue_limit") == 7, how
            assert setting(status, "heartbeat_interval") == 1.0
            assert setting(status, "heartbeat_liveness") == 5  # 5 s at 1 s intervals
            log = broker.output()
            assert f"eventmq settings read from {conf}" in log
            assert (
                f"eventmq's WAL_ENABLED=true ({conf} [global]) is not honoured: guaranteed "
                "requests are kept in the job store of --data-dir" in log
            )
        finally:
            _stopped(broker)


@pytest_twisted.inlineCallbacks
def test_our_options_environment_and_router_section_over_eventmqs_global(
    tmp_path: Path,
) -> Any:
    """[router] over [global] (eventmq 0.3.13's router itself reads [global] only: it
    stays at [global]'s address), EVENTMQ_<NAME> over the file, then EMQP_* and our command
    line over all of eventmq's."""
    first = free_ports(8)
    conf = tmp_path / "eventmq.conf"
    globals_ = write_eventmq_conf(
        conf, first, hwm=7, router_hwm=9, router_frontend_addr=f"tcp://127.0.0.1:{first + 4}"
    )
    with eventmq_router(tmp_path, "-C", str(conf)):
        yield serves(globals_)  # eventmq's router: [global]'s client address

    broker = EmqpAlone(
        tmp_path,
        "-C", str(conf), "--admin-port", str(first + 5),
        env={
            "EVENTMQ_BACKEND_ADDR": f"tcp://127.0.0.1:{first + 6}",
            "EVENTMQ_HWM": "11",
            "EMQP_QUEUE_LIMIT": "13",
        },
    )  # fmt: skip
    try:
        yield reported(broker.ready, what="the broker")
        ours = {
            "worker": f"tcp://127.0.0.1:{first + 6}",  # EVENTMQ_BACKEND_ADDR over the file
            "client": f"tcp://127.0.0.1:{first + 4}",  # [router] over [global]
            "admin": f"tcp://127.0.0.1:{first + 5}",  # our command line over the file
        }
        assert broker.status()["endpoints"] == ours
        yield serves(ours)
        assert setting(broker.status(), "queue_limit") == 13  # EMQP_ over EVENTMQ_
    finally:
        _stopped(broker)


def test_addresses_on_different_hosts_are_one_line(tmp_path: Path) -> None:
    conf = tmp_path / "eventmq.conf"
    conf.write_text(
        "[global]\nfrontend_addr = tcp://0.0.0.0:47291\nbackend_addr = tcp://127.0.0.1:47290\n"
    )
    done = subprocess.run(
        [TWISTD, "-n", "--pidfile=", "emqp", "-C", str(conf)],
        capture_output=True, text=True, timeout=60, cwd=tmp_path,
        env=clean_environment(),
    )  # fmt: skip
    assert done.returncode != 0
    assert "bind different hosts" in done.stderr + done.stdout
    assert "FRONTEND_ADDR=tcp://0.0.0.0:47291" in done.stderr + done.stdout


# -- 2. SIGHUP ----------------------------------------------------------------------------------


@pytest_twisted.inlineCallbacks
def test_sighup_reads_eventmq_conf_again_as_eventmqs_router_does(tmp_path: Path) -> Any:
    """eventmq's router reads its file again at SIGHUP, then dies of it (0.3.13 binds its
    sockets again: "Receiver ... not ready" or "Address already in use", a traceback). Ours serves on, logs each
    change in a line (applied now, or at the next start), a SIGHUP that changed nothing,
    and a broken file as one error line that changes nothing."""
    first = free_ports(4)
    conf = tmp_path / "eventmq.conf"
    endpoints = write_eventmq_conf(conf, first, hwm=7, heartbeat_interval=1)
    with eventmq_router(tmp_path, "-C", str(conf)) as router:
        yield serves(endpoints)
        write_eventmq_conf(conf, first, hwm=8, heartbeat_interval=2)
        router.send_signal(signal.SIGHUP)
        yield wait_until(lambda: router.poll() is not None, timeout=30, what="its end")
        log = router.log_path.read_text()
        assert "Caught signame 1" in log
        assert "Traceback" in log.rsplit("Caught signame 1", 1)[1]

    broker = EmqpAlone(tmp_path, "-C", str(conf))
    try:
        yield reported(broker.ready, what="the broker")
        yield serves(endpoints)

        def after_sighup(text: str) -> Any:
            broker.process.send_signal(signal.SIGHUP)
            return wait_until(lambda: text in broker.output(), timeout=30, what=text)

        write_eventmq_conf(
            conf, first, hwm=9, heartbeat_interval=2,
            router_frontend_addr=f"tcp://127.0.0.1:{first + 3}",
        )  # fmt: skip
        yield after_sighup("SIGHUP: --queue-limit 8 -> 9")
        log = broker.output()
        assert (
            f"SIGHUP: --client-port {first + 1} -> {first + 3} (takes effect when the broker "
            "starts again)" in log
        )
        yield wait_until(lambda: setting(broker.status(), "queue_limit") == 9, what="the new limit")
        assert broker.status()["endpoints"] == endpoints  # the ports stay until a restart

        yield after_sighup("SIGHUP: eMQP broker settings read again, nothing changed")

        conf.write_text("[global\nhwm = 3\n")
        yield after_sighup("SIGHUP: eMQP broker settings not read again, kept as they were")
        assert setting(broker.status(), "queue_limit") == 9
        yield serves(endpoints)
        assert broker.process.poll() is None
    finally:
        _stopped(broker)


@pytest_twisted.inlineCallbacks
def test_sighup_takes_a_new_curve_allow_list_directory(tmp_path: Path) -> Any:
    """--client-certs changed in the [emqp] table: at SIGHUP the new directory's keys
    get in and the old one's are refused, without a restart."""
    keys = Keys(tmp_path)
    old_key = keys.client("old")
    other = tmp_path / "other-clients"
    other.mkdir()
    new_key = keys.client("new", allowed=False)
    write_certificate(other, "new", new_key.public, None, {})
    toml = tmp_path / "bus.toml"

    def configure(directory: Path) -> None:
        toml.write_text(f'[emqp]\nclient-certs = "{directory}"\n')

    configure(keys.allowed)
    first = free_ports(3)
    broker = EmqpAlone(
        tmp_path, "--config", str(toml), "--server-cert", str(keys.server_cert),
        "--worker-port", str(first), "--client-port", str(first + 1),
        "--admin-port", str(first + 2), "--stats-interval", "0.1s",
    )  # fmt: skip
    admin = f"tcp://127.0.0.1:{first + 2}"

    @pytest_twisted.inlineCallbacks
    def answered(pair: Any) -> Any:
        peer = RawPeer.dealer(admin, curve=(keys.server.public, pair))
        try:
            peer.send(codec.message(b"STATUS"))
            yield wait_until(lambda: peer.messages, timeout=30, what="STATUS over CURVE")
        finally:
            peer.close()

    def refused() -> int:
        return sum(broker.status().get("curve", {}).get("refused", {}).values())

    try:
        yield reported(broker.ready, what="the broker")
        yield answered(old_key)
        peer = RawPeer.dealer(admin, curve=(keys.server.public, new_key))
        yield wait_until(lambda: refused() == 1, timeout=30, what="the new key refused")
        peer.close()
        configure(other)
        broker.process.send_signal(signal.SIGHUP)
        yield wait_until(
            lambda: f"SIGHUP: --client-certs {keys.allowed} -> {other}" in broker.output(),
            timeout=30,
            what="the change logged",
        )
        yield answered(new_key)
        peer = RawPeer.dealer(admin, curve=(keys.server.public, old_key))
        yield wait_until(lambda: refused() == 2, timeout=30, what="the old key refused")
        peer.close()
    finally:
        _stopped(broker)


@pytest_twisted.inlineCallbacks
def test_sighup_in_the_product_reloads_emqp_and_keeps_the_event_bus(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Any:
    """``twistd -n eventbus`` with emqp composed: a SIGHUP applies emqp's changed
    settings (spelled --emqp-...) and every service goes on."""
    for name in list(os.environ):
        if name.startswith(("EMQP_", "EVENTMQ_")):
            monkeypatch.delenv(name)
    first = free_ports(3)
    conf = tmp_path / "eventmq.conf"
    endpoints = write_eventmq_conf(conf, first, hwm=7)
    emqp_data = tmp_path / "emqp"
    product = ServerProcess(
        tmp_path / "bus",
        "--services", "eventbus,emqp", "--emqp-eventmq-config", str(conf),
        "--emqp-data-dir", str(emqp_data), "--emqp-stats-interval", "0.1s",
    )  # fmt: skip

    def emqp_status() -> dict[str, Any]:
        try:
            return dict(json.loads((emqp_data / "status.json").read_text()))
        except (FileNotFoundError, json.JSONDecodeError):
            return {}

    try:
        yield reported(product.ready, what="the product")
        yield wait_until(lambda: emqp_status().get("endpoints"), timeout=30, what="emqp")
        assert emqp_status()["endpoints"] == endpoints
        yield serves(endpoints)
        conf.write_text(conf.read_text().replace("hwm = 7", "hwm = 12"))
        product.process.send_signal(signal.SIGHUP)
        yield wait_until(
            lambda: "SIGHUP: --emqp-queue-limit 7 -> 12" in product.output(),
            timeout=30,
            what="the change logged",
        )
        yield wait_until(lambda: setting(emqp_status(), "queue_limit") == 12, what="applied")
        yield serves(endpoints)
        # The Event BUS goes on: its status.json is written again after the SIGHUP.
        product.status_path.unlink()
        yield reported(product.ready, what="the Event BUS's status again")
    finally:
        _stopped(product)


# -- 3. dropped answers in the log --------------------------------------------------------------

_DROPPED = re.compile(r"dropped (\d+) answers .*?\(?(queue-full|gone|too-many-peers)[);]")


@pytest_twisted.inlineCallbacks
def test_the_log_of_dropped_answers_adds_up_to_status(tmp_path: Path) -> Any:
    """A client that never reads: its answers are dropped past its bounds under one
    rate-limited line; the lines that follow tell the rest, so that what the log says was
    dropped adds up to /status's count, by reason."""
    import zmq

    broker = BrokerProcess(
        tmp_path / "emqp", None, "--client-queue-messages", "5", "--client-hwm", "5",
        "--reply-linger", "1s", "--heartbeat-interval", "60s",
    )  # fmt: skip
    context = zmq.Context()
    worker = None
    try:
        yield reported(broker.ready, what="the broker")
        worker = RawWorker(broker.endpoints["worker"])
        yield wait_until(worker.acked, what="ACK")
        worker.ready(300)
        client = context.socket(zmq.DEALER)
        client.set(zmq.RCVHWM, 1)
        client.set(zmq.LINGER, 0)
        client.connect(broker.endpoints["client"])
        for _ in range(300):
            client.send_multipart(codec.request("default", b"1", b"reply-requested"))
        yield wait_until(lambda: len(worker.requests()) == 300, timeout=60, what="dispatched")
        for request in worker.requests():
            worker.reply(request, "x" * 10_000)
        yield wait_until(
            lambda: broker.status().get("counters", {}).get("replied") == 300, what="replied"
        )
        yield wait_until(
            lambda: broker.status().get("answers_held") == 0, timeout=30, what="all dropped"
        )

        def told() -> dict[str, int]:
            counts: dict[str, int] = {}
            for count, reason in _DROPPED.findall(broker.log_path.read_text()):
                counts[reason] = counts.get(reason, 0) + int(count)
            return counts

        dropped = broker.status()["answers_dropped"]
        assert sum(dropped.values()) > 100
        yield wait_until(lambda: told() == dropped, timeout=30, what=f"the log to tell {dropped}")
    finally:
        if worker is not None:
            worker.close()
        context.destroy(linger=0)
        assert broker.stop() in CLEAN_EXIT, broker.log_path.read_text()


if __name__ == "__main__":  # pragma: no cover
    sys.exit(pytest.main([__file__, "-q"]))
