"""``/status`` of the whole product, as ``eventbus-cli status`` shows it, is JSON all the way
down: no value is a Python repr in a string (``"{'heartbeat_interval': 3.0}"``,
``"Retention(max_age=None)"``, ``"None"``, ``"<... object at 0x...>"``)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from bus.application.statusjson import config_json
from tests.processes import CLEAN_EXIT, wait_for
from tests.test_product_process import Product, environment
from tests.zre_helpers import free_udp_port

CLI = str(Path(sys.executable).with_name("eventbus-cli"))

_REPRS = (
    re.compile(r"^\{.*:.*\}$", re.DOTALL),  # a dict
    re.compile(r"^\[.*\]$", re.DOTALL),  # a list
    re.compile(r"^\(.*\)$", re.DOTALL),  # a tuple
    re.compile(r"^[A-Za-z_][\w.]*\(.*=.*\)$", re.DOTALL),  # a dataclass
    re.compile(r"<[\w.]+ object at 0x[0-9a-f]+>"),  # an object
    re.compile(r"^[A-Z]\w*\.[A-Z][A-Z0-9_]*$"),  # an enum member
    re.compile(r"^(None|True|False)$"),
    re.compile(r"^b'.*'$|^b\".*\"$", re.DOTALL),  # bytes
)


def reprs_in(value: Any, path: str = "") -> Iterator[str]:
    """``path: text`` of every string under ``value`` that reads as a Python repr."""
    if isinstance(value, dict):
        for key, item in value.items():
            yield from reprs_in(item, f"{path}.{key}")
    elif isinstance(value, list):
        for index, item in enumerate(value):
            yield from reprs_in(item, f"{path}[{index}]")
    elif isinstance(value, str) and any(pattern.search(value) for pattern in _REPRS):
        yield f"{path}: {value}"


def test_reprs_in_finds_what_str_of_python_values_gives() -> None:
    from bus.eventbus.store import Retention

    status = {
        "a": [str({"x": 1}), str([1]), str((1, 2)), str(Retention()), str(None), str(object())],
        "fine": ["tcp://127.0.0.1:5556", "[::1]:80", "0.5", "/orders/", "ok (2 of 3)"],
    }
    assert len(list(reprs_in(status))) == 6


def test_a_config_is_json_values() -> None:
    from bus.eventbus.config import EventBusConfig

    shown = config_json(EventBusConfig())
    assert json.loads(json.dumps(shown, allow_nan=False)) == shown
    assert shown["retention"] == {"max_age": None, "max_count": None, "latest_per_topic": False}
    assert shown["curve"]["server_cert"] is None
    assert list(reprs_in(shown)) == []


def test_the_composed_status_holds_no_python_repr(tmp_path: Path) -> None:
    product = Product(
        tmp_path,
        "--services", "eventbus,emqp,emqp-pubsub,mc0,dbp,zre,spark-bridge",
        "--port", "0", "--data-dir", str(tmp_path / "bus"),
        "--retention-max-age", "7d",
        "--emqp-worker-port", "0", "--emqp-client-port", "0", "--emqp-admin-port", "0",
        "--emqp-data-dir", str(tmp_path / "emqp"),
        "--emqp-pubsub-incoming-port", "0", "--emqp-pubsub-outgoing-port", "0",
        "--mc0-port", "0", "--mc0-data-dir", str(tmp_path / "mc0"),
        "--dbp-port", "0", "--dbp-data-dir", str(tmp_path / "dbp"),
        "--dbp-beacon-port", str(free_udp_port()),
        "--zre-port", "0",
        "--spark-bridge-journal-dir", str(tmp_path / "journal"),
        env=environment(),
    )  # fmt: skip
    try:
        wait_for(product.ready, timeout=90, what="the product")
        # Its own bound (3 s by default) from its request to the answer: the seven
        # services' process, just started on a loaded machine, gets 30.
        shown = subprocess.run(
            [CLI, "status", "--http", f"127.0.0.1:{product.http_port}", "--timeout", "30"],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert shown.returncode == 0, shown.stderr
        status = json.loads(shown.stdout)
        services = status["services"]
        assert {"eventbus", "emqp", "emqp-pubsub", "mc0", "dbp", "zre"} <= set(services)
        assert isinstance(services["eventbus"]["config"]["retention"], dict)
        assert isinstance(services["emqp"]["config"]["broker"], dict)
        assert isinstance(services["mc0"]["config"]["broker"], dict)
        assert list(reprs_in(status)) == []
    finally:
        code = product.stop()
    assert code in CLEAN_EXIT, product.output()
