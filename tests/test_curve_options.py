"""CURVE options, one way for every service: prefixed in the product, from the environment
and the config file; a service bound beyond loopback without CURVE says so in one line."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from twisted.logger import LogEvent, formatEvent, globalLogPublisher
from twisted.python import usage

from bus import tap
from bus.transport.curve_settings import CurveSettings
from bus.transport.security import ServerCurve


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    for name in list(os.environ):
        if name.startswith(("EVENTBUS_", "EMQP_", "DBP_", "MC0_", "SPARK_BRIDGE_")):
            monkeypatch.delenv(name)


def parse(*args: str) -> Any:
    options = tap.Options()
    options.parseOptions(["--services", "eventbus,emqp,dbp,spark-bridge", *args])
    return options["service-options"]


def test_every_service_takes_the_options_with_its_prefix(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = tmp_path / "bus.toml"
    config.write_text('[dbp]\nserver-cert = "d.key_secret"\nclient-certs = "d-clients"\n')
    monkeypatch.setenv("EMQP_SERVER_CERT", "e.key_secret")
    services = parse(
        "--config", str(config), "--server-cert", "b.key_secret", "--client-certs", "b-clients",
        "--spark-bridge-server-key", "A" * 40,
    )  # fmt: skip
    assert services["eventbus"]["eventbus-config"].curve == CurveSettings(
        Path("b.key_secret"), Path("b-clients")
    )
    assert services["emqp"]["emqp-config"].curve == CurveSettings(Path("e.key_secret"))
    assert services["dbp"]["dbp-config"].curve == CurveSettings(
        Path("d.key_secret"), Path("d-clients")
    )
    assert services["spark-bridge"]["server-key"] == "A" * 40


def test_an_allow_list_without_a_server_key_is_a_usage_error() -> None:
    with pytest.raises(usage.UsageError, match="--emqp-client-certs needs --emqp-server-cert"):
        parse("--emqp-client-certs", "somewhere")


@pytest.fixture
def warnings() -> Iterator[list[str]]:
    lines: list[str] = []

    def observe(event: LogEvent) -> None:
        if event.get("log_namespace") == "bus.transport.security":
            lines.append(f"{event['log_level'].name}: {formatEvent(event)}")

    globalLogPublisher.addObserver(observe)
    yield lines
    globalLogPublisher.removeObserver(observe)


@pytest.mark.parametrize(
    ("bind", "warned"),
    [("127.0.0.1", False), ("::1", False), ("localhost", False), ("0.0.0.0", True),
     ("10.1.2.3", True), ("eth0", True)],
)  # fmt: skip
def test_an_open_port_beyond_loopback_is_one_warning(
    warnings: list[str], bind: str, warned: bool
) -> None:
    ServerCurve("emqp", CurveSettings(), lambda: 0.0).warn_if_open(bind, ["tcp://x:1", "tcp://x:2"])
    assert len(warnings) == int(warned)
    if warned:
        assert warnings[0].startswith("warn: emqp: tcp://x:1, tcp://x:2 on ")
        assert "WITHOUT CURVE" in warnings[0]
