"""The pair's options: command line, [eventbus] table, EVENTBUS_HA_* variables, bad values,
and a busy link port named as the option that set it."""

from __future__ import annotations

import socket
from pathlib import Path
from typing import Any

import pytest
from twisted.python import usage

from bus import tap
from bus.errors import StartupError
from bus.eventbus import tap as eventbus_tap
from bus.eventbus.config import PairConfig


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    for name in list(os.environ):
        if name.startswith("EVENTBUS_"):
            monkeypatch.delenv(name)


def pair_of(*args: str) -> PairConfig | None:
    options = tap.Options()
    options.parseOptions(list(args))
    config = options["service-options"]["eventbus"]["eventbus-config"]
    pair: PairConfig | None = config.pair
    return pair


def test_no_pair_by_default() -> None:
    assert pair_of() is None


def test_the_command_line_makes_half_of_a_pair() -> None:
    pair = pair_of("--ha-role", "backup", "--ha-peer", "10.0.0.7:5559")
    assert pair == PairConfig("backup", "10.0.0.7:5559")
    assert (pair.replication, pair.failover_timeout, pair.alone_timeout) == ("sync", 1.0, 1.0)
    pair = pair_of("--ha-role", "primary", "--ha-peer", "tcp://h:7000", "--ha-port", "7001",
                   "--ha-replication", "async", "--ha-async-window", "500",
                   "--ha-failover-timeout", "1500ms", "--ha-alone-timeout", "3s")  # fmt: skip
    assert pair == PairConfig("primary", "h:7000", 7001, "async", 1.5, 3.0, 500)
    assert pair.window == 500 and pair.beat_interval == 0.375


def test_file_environment_and_command_line_in_that_order(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "bus.toml"
    path.write_text(
        '[eventbus]\nha-role = "primary"\nha-peer = "b.example:5559"\n'
        'ha-replication = "async"\nha-failover-timeout = "2s"\n'
    )
    pair = pair_of("--config", str(path))
    assert pair == PairConfig("primary", "b.example:5559", replication="async",
                              failover_timeout=2.0)  # fmt: skip
    monkeypatch.setenv("EVENTBUS_HA_ROLE", "backup")
    monkeypatch.setenv("EVENTBUS_HA_REPLICATION", "sync")
    pair = pair_of("--config", str(path))
    assert pair is not None and (pair.role, pair.replication) == ("backup", "sync")
    pair = pair_of("--config", str(path), "--ha-peer", "c.example:1")
    assert pair is not None and (pair.role, pair.peer) == ("backup", "c.example:1")


def test_the_bus_alone_offers_the_same_options() -> None:
    options = eventbus_tap.Options()
    options.parseOptions(["--ha-role", "primary", "--ha-peer", "127.0.0.1:9"])
    assert options["eventbus-config"].pair == PairConfig("primary", "127.0.0.1:9")


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--ha-role", "primary"], "--ha-role needs --ha-peer"),
        (["--ha-peer", "h:1"], "--ha-role must be primary or backup"),
        (["--ha-role", "leader", "--ha-peer", "h:1"], "--ha-role must be primary or backup"),
        (["--ha-role", "backup", "--ha-peer", "h"], "--ha-peer must be HOST:PORT"),
        (["--ha-role", "backup", "--ha-peer", "h:99999"], "--ha-peer must be HOST:PORT"),
        (["--ha-role", "backup", "--ha-peer", "h:1", "--ha-replication", "quorum"],
         "--ha-replication must be sync or async"),
        (["--ha-role", "backup", "--ha-peer", "h:1", "--ha-failover-timeout", "0"],
         "ha-failover-timeout and ha-alone-timeout must be positive"),
        (["--ha-role", "backup", "--ha-peer", "h:1", "--ha-async-window", "0"],
         "ha-async-window must be at least 1"),
    ],
)  # fmt: skip
def test_bad_pair_options_are_usage_errors(args: list[str], message: str) -> None:
    with pytest.raises(usage.UsageError) as raised:
        pair_of(*args)
    assert message in str(raised.value)


def test_a_busy_link_port_fails_the_start_naming_ha_port(tmp_path: Path) -> Any:
    from bus.testing import start_bus

    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        busy = holder.getsockname()[1]
        with pytest.raises(StartupError) as raised:
            start_bus(tmp_path, pair=PairConfig("primary", "127.0.0.1:9", port=busy))
    assert raised.value.option == "ha-port"
