"""The installed wheel run for real, from a directory where the checkout is not importable:
its imports, every twistd plugin and console script, the composed product with every
protocol's CLI doing its job against it, and the tac file.

The bare venv (``pip install bus``, no extra) runs the same product as the full one: the
base install is what most users have.
"""

from __future__ import annotations

import json
import re
import shutil
import signal
import zipfile
from pathlib import Path

import pytest

from tests.installed import (
    BARE,
    FULL,
    ROOT,
    Child,
    artifact,
    environment,
    http_get,
    needs_artifacts,
    ok,
    run,
    status,
)
from tests.ports import free_ports
from tests.processes import CLEAN_EXIT, wait_for

pytestmark = needs_artifacts
VENVS = pytest.mark.parametrize("venv", [FULL, BARE], ids=["full", "bare"])
# Modules of the extras; a bare venv's import of bus.X may fail only for want of one.
EXTRA_MODULES = ("pyarrow", "pyspark", "pandas", "redis", "nkeys", "OpenSSL", "service_identity")


def plugin_names() -> list[str]:
    """The twistd commands the checkout's plugin files declare."""
    names = []
    for path in sorted((ROOT / "twisted/plugins").glob("bus_*.py")):
        found = re.findall(r'ServiceMaker\(\s*"[^"]*",\s*"[^"]*",\s*(?:"[^"]*"\s*)+,\s*"([^"]+)"',
                           path.read_text())  # fmt: skip
        assert found, f"no ServiceMaker found in {path.name}"
        names += found
    return names


def console_scripts() -> list[str]:
    """The console scripts the wheel declares."""
    with zipfile.ZipFile(artifact(".whl")) as wheel:
        [entry_points] = [n for n in wheel.namelist() if n.endswith(".dist-info/entry_points.txt")]
        text = wheel.read(entry_points).decode()
    section = text.split("[console_scripts]", 1)[1].split("\n[", 1)[0]
    return [line.split("=", 1)[0].strip() for line in section.splitlines() if "=" in line]


def test_the_lists_below_are_the_products() -> None:
    assert {"eventbus", "emqp", "emqp-pubsub", "emqp-worker", "mc0", "dbp", "zre",
            "spark-bridge"} <= set(plugin_names())  # fmt: skip
    assert {"eventbus-cli", "emqp-cli", "emqp-worker", "mc0-cli", "bus-keys", "zre-ping",
            "dbp-cli", "bus-cluster"} <= set(console_scripts())  # fmt: skip


@VENVS
def test_bus_comes_from_the_venv_and_every_module_imports(venv: Path, tmp_path: Path) -> None:
    assert ROOT not in tmp_path.parents
    script = """
import importlib, json, pkgutil, sys
import bus, twisted.plugins
failed = {}
for module in pkgutil.walk_packages(bus.__path__, "bus."):
    try:
        importlib.import_module(module.name)
    except ImportError as error:
        failed[module.name] = error.name or str(error)
print(json.dumps({"bus": bus.__file__, "plugins": list(twisted.plugins.__path__),
                  "path": sys.path, "failed": failed}))
"""
    report = json.loads(ok(run(venv, "python", "-c", script, cwd=tmp_path)))
    assert Path(report["bus"]).is_relative_to(venv), report["bus"]
    assert not [p for p in report["path"] if p and Path(p).resolve().is_relative_to(ROOT)]
    if venv == FULL:
        assert report["failed"] == {}, report["failed"]
    else:
        # Without extras only the modules that need one fail, and for that reason alone.
        assert all(name.split(".")[0] in EXTRA_MODULES for name in report["failed"].values()), (
            report["failed"]
        )
        assert not [m for m in report["failed"] if not m.startswith("bus.spark.")], report


@VENVS
def test_every_twistd_plugin_and_console_script_answers_help(venv: Path, tmp_path: Path) -> None:
    listing = ok(run(venv, "twistd", "--help", cwd=tmp_path))
    for name in plugin_names():
        assert re.search(rf"^\s+{re.escape(name)}\s", listing, re.M), f"{name} not offered"
        text = ok(run(venv, "twistd", name, "--help", cwd=tmp_path))
        assert text.startswith(f"Usage: twistd [options] {name} "), text[:200]
    for script in console_scripts():
        text = ok(run(venv, script, "--help", cwd=tmp_path))
        assert script in text.splitlines()[0], text[:200]


class Product(Child):
    """``twistd -n eventbus`` from ``venv``, every port a free one, watched through /status."""

    def __init__(self, venv: Path, workdir: Path, *args: str) -> None:
        self.http_port = free_ports(1)
        super().__init__(
            venv, "twistd", "-n", "--pidfile=", "eventbus", "--port", "0",
            "--data-dir", "data", "--http-port", str(self.http_port),
            "--emqp-worker-port", "0", "--emqp-client-port", "0", "--emqp-admin-port", "0",
            "--emqp-pubsub-incoming-port", "0", "--emqp-pubsub-outgoing-port", "0",
            "--mc0-port", "0", "--dbp-port", "0", "--dbp-beacon-port", "0", "--zre-port", "0",
            *args, cwd=workdir,
        )  # fmt: skip

    def services(self) -> dict[str, dict[str, object]]:
        self.alive()
        services = status(self.http_port).get("services", {})
        return services if services and all(s["running"] for s in services.values()) else {}

    def endpoint(self, service: str, name: str = "endpoint") -> str:
        services = self.services()
        where = services[service].get("endpoints") or services[service]
        assert isinstance(where, dict)
        return str(where[name])


@VENVS
def test_the_composed_product_serves_every_protocol_to_the_installed_clis(
    venv: Path, tmp_path: Path
) -> None:
    product = Product(venv, tmp_path)
    try:
        services = wait_for(product.services, timeout=300, what="every service running")
        assert set(services) >= {"eventbus", "emqp", "emqp-pubsub", "mc0", "dbp", "zre", "http"}
        bus = product.endpoint("eventbus", "snapshot").removeprefix("tcp://")

        # The Event BUS: publish, snapshot, tail, status.
        published = ok(run(venv, "eventbus-cli", "publish", "/smoke/1/", '{"n": 1}',
                           "--server", bus, "--timeout", "60", cwd=tmp_path))  # fmt: skip
        assert re.search(r"\b1\b", published), published
        lines = ok(run(venv, "eventbus-cli", "snapshot", "/smoke/", "--server", bus,
                       "--timeout", "60", cwd=tmp_path)).splitlines()  # fmt: skip
        [event] = [json.loads(line) for line in lines]
        assert event["topic"] == "/smoke/1/" and event["value"] == {"n": 1}, event
        tail = Child(venv, "eventbus-cli", "tail", "/smoke/", "--since", "0", "--server", bus,
                     cwd=tmp_path)  # fmt: skip
        try:
            wait_for(lambda: tail.alive() and '"/smoke/1/"' in tail.output(), timeout=120,
                     what="the tail's first event")  # fmt: skip
        finally:
            tail.stop(signal.SIGINT)
        shown = json.loads(ok(run(venv, "eventbus-cli", "status", "--http",
                                  f"127.0.0.1:{product.http_port}", cwd=tmp_path)))  # fmt: skip
        assert shown["services"]["eventbus"]["running"] is True

        # The console's page and its static files, and the metrics.
        code, kind, page = http_get(product.http_port, "/")
        assert code == 200 and kind.startswith("text/html") and b"console.js" in page
        for name, kind_wanted in (("console.js", "text/javascript"), ("console.css", "text/css")):
            code, kind, body = http_get(product.http_port, f"/static/{name}")
            assert code == 200 and kind.startswith(kind_wanted) and len(body) > 1000, name
        metrics = http_get(product.http_port, "/metrics")[2].decode()
        assert "eventbus_events_stored_total" in metrics or "eventbus_" in metrics

        # eMQP: a worker of the installed product runs a job a client submits.
        worker = Child(venv, "emqp-worker", "-B", product.endpoint("emqp", "worker"),
                       "-Q", "default", "--slots", "1", cwd=tmp_path)  # fmt: skip
        try:
            body = json.dumps(["run", {"path": "operator", "callable": "add", "args": [2, 3]}])
            answer = ok(run(venv, "emqp-cli", "submit", "default", body,
                            "--broker", product.endpoint("emqp", "client"),
                            "--admin", product.endpoint("emqp", "admin"),
                            "--wait", "120", cwd=tmp_path))  # fmt: skip
            assert json.loads(answer) == 5, answer
        finally:
            assert worker.stop() in CLEAN_EXIT, worker.output()
        broker = json.loads(ok(run(venv, "emqp-cli", "status", "--admin",
                                   product.endpoint("emqp", "admin"), cwd=tmp_path)))  # fmt: skip
        assert broker, broker

        # mc0: a PUT over CURVE (the broker made its key pair at start) acknowledged.
        key = str(tmp_path / "mc0-data" / "server.key")
        ok(run(venv, "mc0-cli", "--server-key", key, "--server", product.endpoint("mc0"),
               "--timeout", "60", "put", "smoke", "hello", cwd=tmp_path))  # fmt: skip

        # DBP: the catalog answers (no service registered yet).
        answer = ok(run(venv, "dbp-cli", "services", "--catalog", product.endpoint("dbp"),
                        "--timeout", "60", cwd=tmp_path))  # fmt: skip
        json.loads(answer)

        # ZRE: a peer that names the product's node sees it enter.
        ping = Child(venv, "zre-ping", "--port", "0", "--peer", product.endpoint("zre"),
                     "--name", "smoke", "--interval", "1", cwd=tmp_path)  # fmt: skip
        try:
            wait_for(lambda: ping.alive() and '"ENTER"' in ping.output(), timeout=120,
                     what="zre-ping sees the product's node")  # fmt: skip
        finally:
            ping.stop(signal.SIGINT)

        # CURVE keys, in the zcert format.
        for script in ("bus-keys", "mc0-keys"):
            ok(run(venv, script, "alice", str(tmp_path / script), cwd=tmp_path))
            assert (tmp_path / script / "alice.key").exists()
            assert (tmp_path / script / "alice.key_secret").exists()
    finally:
        code = product.stop()
    assert code in CLEAN_EXIT, product.output()
    assert "Traceback" not in product.output(), product.output()


def test_the_tac_file_runs_the_installed_product(tmp_path: Path) -> None:
    shutil.copy(ROOT / "examples/eventbus.tac", tmp_path / "eventbus.tac")
    http = free_ports(1)
    env = environment(
        FULL, EVENTBUS_PORT="0", EVENTBUS_DATA_DIR="data", EVENTBUS_HTTP_PORT=str(http),
        EVENTBUS_SERVICES="eventbus,mc0", MC0_PORT="0",
    )  # fmt: skip
    server = Child(FULL, "twistd", "-n", "--pidfile=", "-y", "eventbus.tac", cwd=tmp_path, env=env)
    try:
        services = wait_for(lambda: server.alive() and status(http).get("services"),
                            timeout=300, what="the tac file's services")  # fmt: skip
        assert set(services) == {"eventbus", "mc0", "http"}
        bus = services["eventbus"]["endpoints"]["snapshot"].removeprefix("tcp://")
        ok(run(FULL, "eventbus-cli", "publish", "/tac/", "1", "--server", bus,
               "--timeout", "60", cwd=tmp_path))  # fmt: skip
        assert "/tac/" in ok(run(FULL, "eventbus-cli", "snapshot", "--server", bus,
                                 "--timeout", "60", cwd=tmp_path))  # fmt: skip
    finally:
        code = server.stop()
    assert code in CLEAN_EXIT, server.output()
