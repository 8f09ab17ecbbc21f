"""mc0 as operators run it: ``twistd -n mc0`` and the ``mc0`` service of ``twistd -n eventbus``
(mirroring PUTs onto the bus, /status and /metrics), ``mc0-keys`` and ``mc0-cli``, one-line
start failures."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import pytest_twisted

from bus.testing import wait_until
from tests.processes import reported
from tests.test_product_process import (
    CLEAN_EXIT,
    TWISTD,
    Product,
    environment,
    free_port,
    metric_samples,
)

BIN = Path(sys.executable).parent
MC0_CLI = str(BIN / "mc0-cli")
MC0_KEYS = str(BIN / "mc0-keys")


class Broker:
    """``twistd -n mc0 ARGS`` in a child process."""

    def __init__(self, workdir: Path, *args: str) -> None:
        workdir.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.log_path = workdir / "mc0.log"
        self.log = open(self.log_path, "ab")
        self.process = subprocess.Popen(
            [TWISTD, "-n", "--pidfile=", "mc0", "--port", str(self.port), *args],
            stdout=self.log,
            stderr=subprocess.STDOUT,
            env=environment(),
            cwd=workdir,
        )
        self.endpoint = f"tcp://127.0.0.1:{self.port}"

    def output(self) -> str:
        return self.log_path.read_text()

    def ready(self) -> bool:
        if self.process.poll() is not None:
            raise AssertionError(f"exited with {self.process.returncode}: {self.output()}")
        return "[bus#info] started mc0" in self.output()

    def stop(self) -> int:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        code = self.process.wait(timeout=30)
        self.log.close()
        return code


def run(*command: str, cwd: Path, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        command, capture_output=True, text=True, cwd=cwd, env=environment(), timeout=timeout
    )


@pytest_twisted.inlineCallbacks
def test_twistd_mc0_with_its_own_keys_and_the_cli(tmp_path: Path) -> Any:
    broker = Broker(tmp_path)
    follower = None
    try:
        yield reported(broker.ready, what="twistd mc0 started")
        public = (tmp_path / "mc0-data" / "server.key").read_text()
        logged = next(line for line in broker.output().splitlines() if "public key" in line)
        key = logged.rsplit(" ", 1)[-1]
        assert f'public-key = "{key}"' in public  # the key logged is the one in the file
        assert "created the mc0 server key pair" in broker.output()
        assert "any CURVE client key is accepted" in broker.output()
        # A subscriber process, then a publisher process (both find mc0-data/server.key).
        follower_err = tmp_path / "sub.err"
        follower = subprocess.Popen(
            [MC0_CLI, "--server", broker.endpoint, "sub", "news", "--count", "1"],
            stdout=subprocess.PIPE,
            stderr=open(follower_err, "w"),
            text=True,
            cwd=tmp_path,
            env=environment(),
        )
        yield reported(
            lambda: "subscribed to news" in follower_err.read_text(),
            follower,
            what="the subscriber's SUB acknowledged",
        )
        put = run(
            MC0_CLI, "--server", broker.endpoint, "put", "news", "hello", "world",
            "--header", "X-from=test", cwd=tmp_path,
        )  # fmt: skip
        assert put.returncode == 0, put.stderr
        out, _ = follower.communicate(timeout=30)
        assert follower.returncode == 0, follower_err.read_text()
        assert json.loads(out) == {
            "topic": "news",
            "headers": {"TOPIC": "news", "X-from": "test"},
            "body": ["hello", "world"],
        }
        ping = run(
            MC0_CLI,
            "--server",
            broker.endpoint,
            "--framing",
            "spec",
            "ping",
            "--count",
            "5",
            cwd=tmp_path,
        )
        assert ping.returncode == 0, ping.stderr
        assert json.loads(ping.stdout)["noops"] == 5
        # The program's options after the command, as other tools take them.
        server_key = str(tmp_path / "mc0-data" / "server.key")
        ping = run(
            MC0_CLI, "ping", "--count", "2", "--server", broker.endpoint,
            "--server-key", server_key, "--timeout", "20", cwd=tmp_path,
        )  # fmt: skip
        assert ping.returncode == 0, ping.stderr
        assert json.loads(ping.stdout)["noops"] == 2
        wrong = run(
            MC0_CLI, "--server", broker.endpoint, "--server-key", "x" * 40, "--timeout", "1",
            "ping", cwd=tmp_path,
        )  # fmt: skip
        assert wrong.returncode == 1 and "no answer in time" in wrong.stderr
    finally:
        if follower is not None and follower.poll() is None:
            follower.kill()
            follower.wait()
        code = broker.stop()
    assert code in CLEAN_EXIT, broker.output()
    # The second start reuses the key pair.
    again = Broker(tmp_path)
    try:
        yield reported(again.ready, what="it")
        assert again.output().count("created the mc0 server key pair") == 1
        assert key in again.output().split("created the mc0 server key pair")[-1]
    finally:
        again.stop()


def test_mc0_keys_writes_a_pair_zmq_auth_reads(tmp_path: Path) -> None:
    import zmq.auth

    made = run(MC0_KEYS, "alice", "keys", cwd=tmp_path)
    assert made.returncode == 0, made.stderr
    public, secret = zmq.auth.load_certificate(str(tmp_path / "keys" / "alice.key_secret"))
    assert made.stdout.strip() == public.decode()
    assert zmq.auth.load_certificate(str(tmp_path / "keys" / "alice.key")) == (public, None)
    assert zmq.curve_public(secret) == public
    assert (tmp_path / "keys" / "alice.key_secret").stat().st_mode & 0o077 == 0
    again = run(MC0_KEYS, "alice", "keys", cwd=tmp_path)
    assert again.returncode == 1 and "not overwriting" in again.stderr


@pytest_twisted.inlineCallbacks
def test_composed_mc0_mirrors_puts_onto_the_bus_and_reports(tmp_path: Path) -> Any:
    from bus.mc0.client import Mc0Connector
    from bus.transport.curve import create_key_pair, load_key_pair, load_public_key

    create_key_pair(tmp_path / "clients", "alice")
    mc0_port = free_port()
    product = Product(
        tmp_path,
        "--port", "0", "--services", "eventbus,mc0", "--stats-interval", "0.2s",
        "--mc0-port", str(mc0_port), "--mc0-mirror", "--mc0-client-certs", "clients",
    )  # fmt: skip
    connector = None
    try:
        yield reported(product.ready, what="product started")
        connector = Mc0Connector(
            f"tcp://127.0.0.1:{mc0_port}",
            server_key=load_public_key(tmp_path / "mc0-data" / "server.key"),
            client_keys=load_key_pair(tmp_path / "clients" / "alice.key_secret"),
        )
        yield connector.start()
        for n in range(3):
            yield connector.put(b"mcollective.agent", b"%d" % n)
        yield wait_until(
            lambda: product.status()["services"]["eventbus"]["accepted_local"] == 3,
            timeout=30,
            what="three PUTs mirrored onto the bus",
        )
        mc0 = product.status()["services"]["mc0"]
        assert mc0["puts"] == 3 and mc0["mirrored"] == 3
        assert mc0["auth"]["allowed_keys"] == 1 and mc0["security"] == "curve"
        samples = metric_samples(product.get("/metrics"))
        assert samples["mc0_puts_total"] == 3
        assert samples["mc0_clients"] == 1
        assert samples["mc0_zap_decisions_total{result=accepted}"] >= 1
        assert samples["bus_service_up{service=mc0}"] == 1
    finally:
        if connector is not None:
            yield connector.stop()
        code = product.stop()
    assert code in CLEAN_EXIT, product.output()
    assert "only the 1 client keys in clients are accepted" in product.output()


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["--plain", "--client-certs", "x"], "--client-certs needs CURVE"),
        (["--min-ttl", "soon"], "not a duration: 'soon'"),
        (["--server-cert", "missing.key_secret"], "cannot start mc0: --server-cert"),
    ],
)
def test_bad_settings_give_one_line(tmp_path: Path, args: list[str], expected: str) -> None:
    result = run(TWISTD, "-n", "--pidfile=", "mc0", "--port", "0", *args, cwd=tmp_path)
    output = result.stdout + result.stderr
    assert result.returncode != 0
    assert expected in output
    assert "Traceback" not in output


def test_a_busy_mc0_port_names_the_prefixed_option(tmp_path: Path) -> None:
    import socket

    holder = socket.socket()
    holder.bind(("127.0.0.1", 0))
    holder.listen()
    port = holder.getsockname()[1]
    try:
        result = run(
            TWISTD, "-n", "--pidfile=", "eventbus", "--port", "0", "--http-port", "0",
            "--mc0-port", str(port), cwd=tmp_path,
        )  # fmt: skip
    finally:
        holder.close()
    output = result.stdout + result.stderr
    assert result.returncode == 1, output
    [line] = [line for line in output.splitlines() if "cannot start" in line]
    assert f"cannot start mc0: --mc0-port {port}: " in line and "in use" in line
