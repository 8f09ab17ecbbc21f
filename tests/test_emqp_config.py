"""eMQP as a drop-in for eventmq 0.3.13's router (issue 34), through real processes: the
broker reads eventmq's ``eventmq.conf`` (``-C``, ``--config``, ``EVENTMQ_CONFIG_FILE``,
``EVENTMQ_<NAME>``) under its own options, as eventmq's own router reads the same file."""

from __future__ import annotations

import ast
import contextlib
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import pytest_twisted

from bus.emqp import codec
from bus.testing import RawPeer, wait_until
from tests.emqp_helpers import RawClient, RawWorker
from tests.ports import free_ports
from tests.processes import CLEAN_EXIT, TWISTD, TwistdProcess

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
    return ast.literal_eval(status["config"]["broker"])[name]


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
            yield wait_until(broker.ready, timeout=30, what=f"the broker with {how}")
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
        yield wait_until(broker.ready, timeout=30, what="the broker")
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


if __name__ == "__main__":  # pragma: no cover
    sys.exit(pytest.main([__file__, "-q"]))
