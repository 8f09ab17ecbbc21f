"""Where option values come from: command line > environment > --config file > default,
the same for the Event BUS's bare options and every other service's prefixed ones."""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any

import pytest
from twisted.python import usage

from bus import tap
from bus.application.options import PROCESS_OPTION_NAMES
from bus.application.services import SERVICE_NAMES, SERVICES, entry
from bus.emqp import tap as emqp_tap
from bus.mc0 import tap as mc0_tap
from bus.spark import tap as spark_tap
from bus.transport.curve_settings import CurveSettings
from bus.util.values import parse_duration


def parse(*args: str) -> Any:
    options = tap.Options()
    options.parseOptions(list(args))
    return options


def write(tmp_path: Path, text: str) -> str:
    path = tmp_path / "bus.toml"
    path.write_text(text)
    return str(path)


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    for name in list(os.environ):
        if name.startswith(("EVENTBUS_", "SPARK_BRIDGE_", "EMQP_", "MC0_", "ZRE_", "DBP_")):
            monkeypatch.delenv(name)


def test_defaults_run_the_protocols_with_http_on() -> None:
    options = parse()
    assert options["services"] == tuple(e.name for e in SERVICES if e.default)
    assert options["http-port"] == tap.DEFAULT_HTTP_PORT
    config = options["service-options"]["eventbus"]["eventbus-config"]
    assert (config.bind, config.port, str(config.data_dir)) == ("127.0.0.1", 5556, "eventbus-data")
    mc0 = options["service-options"]["mc0"]["mc0-config"]
    assert (mc0.bind, mc0.port, str(mc0.data_dir)) == ("127.0.0.1", 61616, "mc0-data")
    assert mc0.curve == CurveSettings(key_dir=Path("mc0-data"))  # CURVE unless --plain
    emqp = options["service-options"]["emqp"]["emqp-config"]
    assert (emqp.bind, emqp.worker_port, emqp.client_port, emqp.admin_port) == (
        "127.0.0.1", 47290, 47291, 47293,
    )  # fmt: skip
    assert str(emqp.data_dir) == "emqp-data"


def test_emqp_options_from_every_layer(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    config = write(
        tmp_path, '[emqp]\nqueue-limit = 7\nheartbeat-interval = "2s"\nworker-port = 1\n'
    )
    monkeypatch.setenv("EMQP_HEARTBEAT_INTERVAL", "500ms")
    options = parse("--config", config, "--emqp-worker-port", "5000")
    emqp = options["service-options"]["emqp"]["emqp-config"]
    assert emqp.broker.queue_limit == 7  # file
    assert emqp.broker.heartbeat_interval == 0.5  # environment over file
    assert emqp.worker_port == 5000  # command line over file
    with pytest.raises(usage.UsageError, match="--emqp-durability must be normal or full"):
        parse("--emqp-durability", "maybe")
    with pytest.raises(usage.UsageError, match="--emqp-worker-port, --emqp-client-port and"):
        parse("--emqp-client-port", "47290")


def test_each_layer_overrides_the_one_below(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = write(
        tmp_path,
        """
        [eventbus]
        port = 7000
        publish-hwm = 1234
        stats-interval = "5s"
        heartbeat-interval = "2s"
        services = ["eventbus", "spark-bridge"]

        [spark-bridge]
        roll-events = 7
        journal-dir = "from-file"
        server = ["a:1", "b:2"]
        """,
    )
    monkeypatch.setenv("EVENTBUS_HEARTBEAT_INTERVAL", "300ms")
    monkeypatch.setenv("EVENTBUS_PORT", "7100")
    monkeypatch.setenv("SPARK_BRIDGE_ROLL_EVENTS", "8")
    monkeypatch.setenv("SPARK_BRIDGE_SERVER", "c:3,d:4")
    options = parse("--config", config, "--port", "7200", "--spark-bridge-roll-events", "9")
    bus = options["service-options"]["eventbus"]["eventbus-config"]
    assert bus.publish_hwm == 1234  # file only
    assert bus.stats_interval == 5.0  # file only
    assert bus.heartbeat_interval == 0.3  # environment over file
    assert bus.port == 7200  # command line over environment over file
    bridge = options["service-options"]["spark-bridge"]
    assert options["services"] == ("eventbus", "spark-bridge")
    assert bridge["roll-events"] == 9
    assert bridge["journal-dir"] == "from-file"
    assert bridge["server"] == ["c:3", "d:4"]  # environment list over the file's
    again = parse(
        "--config", config, "--spark-bridge-server", "e:5", "--spark-bridge-server", "f:6"
    )
    assert again["service-options"]["spark-bridge"]["server"] == ["e:5", "f:6"]


def test_the_config_file_can_come_from_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("EVENTBUS_CONFIG", write(tmp_path, "[eventbus]\nhttp-port = 0\n"))
    assert parse()["http-port"] == 0


def test_spark_bridge_alone_reads_its_own_table(tmp_path: Path) -> None:
    config = write(tmp_path, '[eventbus]\nport = 1\n[spark-bridge]\nroll-seconds = "2s"\n')
    options = spark_tap.Options()
    options.parseOptions(["--config", config, "--server", "bus:5556"])
    assert options["bridge-config"].roll_seconds == 2.0
    assert options["server"] == ["bus:5556"]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--prot", "1"], "unknown option --prot; did you mean --port?"),
        (["--spark-bridge-journl", "x"], "did you mean --spark-bridge-journal-dir"),
        (
            ["--services", "eventbus,emqpp"],
            f"no service named 'emqpp'; valid: {', '.join(SERVICE_NAMES)}",
        ),
        (
            ["--spark-bridge-roll-events", "3"],
            "option of spark-bridge, which is not among --services",
        ),
        (["--port", "x"], "--port wants a whole number, not 'x'"),
        (["--spark-bridge", "--spark-bridge-roll-events", "x"], "--spark-bridge-roll-events wants"),
        (["--spark-bridge", "--spark-bridge-roll-seconds", "soon"], "not a duration: 'soon'"),
        (["--dialect", "klingon"], "--dialect must be spec or original"),
        (["--max-snapshots", "0"], "max-snapshots and max-snapshots-per-client must be at least 1"),
        (["--config", "/nonexistent/bus.toml"], "no such file"),
    ],
)
def test_bad_options_are_usage_errors_naming_the_valid_ones(args: list[str], message: str) -> None:
    with pytest.raises(usage.UsageError) as raised:
        parse(*args)
    assert message in str(raised.value)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            "[nosuch]\nport = 1\n",
            f"unknown table [nosuch]; valid tables: {', '.join(sorted(SERVICE_NAMES))}",
        ),
        ("[eventbus]\nprot = 1\n", "[eventbus] has no option 'prot'"),
        ("[spark-bridge]\njournal = 1\n", "[spark-bridge] has no option 'journal'"),
        ("port = 1\n", "'port' is not a table"),
        ("[eventbus\n", "bus.toml"),
        ('[eventbus]\nport = "x"\n', "[eventbus]: port"),
    ],
)
def test_bad_config_files_name_the_file_table_and_key(
    tmp_path: Path, text: str, message: str
) -> None:
    with pytest.raises(usage.UsageError) as raised:
        parse("--config", write(tmp_path, text), "--services", "eventbus,spark-bridge")
    assert message in str(raised.value)


def test_bad_environment_values_name_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EVENTBUS_PORT", "fifty")
    with pytest.raises(usage.UsageError, match="environment EVENTBUS_PORT: port"):
        parse()
    monkeypatch.delenv("EVENTBUS_PORT")
    monkeypatch.setenv("EVENTBUS_SPARK_BRIDGE", "maybe")
    with pytest.raises(usage.UsageError, match="not a yes/no value"):
        parse()


def test_every_service_option_is_offered_with_its_prefix() -> None:
    product = {name.rstrip("=") for name in tap.Options().longOpt}
    for prefix, options in (
        ("spark-bridge", spark_tap.Options),
        ("mc0", mc0_tap.Options),
        ("emqp", emqp_tap.Options),
    ):
        specs = [s for s in options.option_specs() if s.name not in PROCESS_OPTION_NAMES]
        assert len(specs) > 5
        for spec in specs:
            assert f"{prefix}-{spec.name}" in product
    for name in ("port", "bind", "data-dir", "dialect", "services", "http-port", "config"):
        assert name in product


def test_mc0_speaks_curve_with_its_kept_key_unless_plain() -> None:
    def mc0(*args: str) -> Any:
        return parse("--services", "mc0", *args)["service-options"]["mc0"]["mc0-config"].curve

    data = Path("mc0-data")
    assert mc0("--mc0-client-certs", "c") == CurveSettings(client_certs=Path("c"), key_dir=data)
    assert mc0("--mc0-server-cert", "s.key_secret") == CurveSettings(
        Path("s.key_secret"), key_dir=data
    )
    assert not mc0("--mc0-plain").enabled
    with pytest.raises(usage.UsageError, match="--mc0-client-certs needs CURVE"):
        mc0("--mc0-plain", "--mc0-client-certs", "c")


def test_durations() -> None:
    assert [parse_duration(t) for t in ("90", "1.5s", "250ms", "10m", "2h", "7d")] == [
        90.0,
        1.5,
        0.25,
        600.0,
        7200.0,
        604800.0,
    ]
    with pytest.raises(usage.UsageError):
        parse_duration("soon")


def test_the_example_config_file_parses_and_sets_every_service(tmp_path: Path) -> None:
    example = Path(__file__).resolve().parent.parent / "examples" / "bus.toml"
    options = parse("--config", str(example))
    assert options["services"] == (
        "eventbus", "emqp", "emqp-pubsub", "mc0", "dbp", "zre", "spark-bridge",
    )  # fmt: skip
    pubsub = options["service-options"]["emqp-pubsub"]["emqp-pubsub-config"]
    assert (pubsub.incoming_port, pubsub.outgoing_port) == (47298, 47299)
    zre = options["service-options"]["zre"]["zre-config"]
    assert (zre.interface, zre.beacon_port, zre.groups, zre.expired) == (
        "lo",
        5670,
        ["GLOBAL"],
        30.0,
    )
    dbp = options["service-options"]["dbp"]["dbp-config"]
    assert (dbp.bind, dbp.port, dbp.beacon_port, dbp.liveness, dbp.grace) == (
        "127.0.0.1",
        5246,
        5245,
        3,
        60.0,
    )
    emqp = options["service-options"]["emqp"]["emqp-config"]
    assert (emqp.worker_port, str(emqp.data_dir), emqp.broker.queue_limit) == (
        47290, "emqp-data", 10_000,
    )  # fmt: skip
    bus = options["service-options"]["eventbus"]["eventbus-config"]
    assert bus.retention.max_age == 30 * 86400
    mc0 = options["service-options"]["mc0"]["mc0-config"]
    assert (mc0.port, mc0.mirror, mc0.broker.default_ttl_ms) == (61616, True, 30_000)
    assert (
        options["service-options"]["spark-bridge"]["bridge-config"].retention_max_age == 90 * 86400
    )


def test_zre_options_composed_prefixed_from_file_environment_and_command_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = write(
        tmp_path,
        """
        [zre]
        name = "from-file"
        group = ["A", "B"]
        header = ["K=v"]
        evasive = "2s"
        """,
    )
    monkeypatch.setenv("ZRE_EXPIRED", "20s")
    options = parse("--config", config, "--zre-name", "cli", "--zre-peer", "tcp://10.1.2.3:50000")
    zre = options["service-options"]["zre"]["zre-config"]
    assert zre.name == "cli"
    assert (zre.groups, zre.headers, zre.evasive, zre.expired) == (
        ["A", "B"],
        {"K": "v"},
        2.0,
        20.0,
    )
    assert zre.peers == ["tcp://10.1.2.3:50000"]
    assert (zre.interface, zre.beacon_port, zre.version) == ("lo", 5670, 2)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--zre-version", "3"], "--zre-version must be 2 (36/ZRE) or 1 (20/ZRE)"),
        (["--zre-header", "novalue"], "--zre-header wants KEY=VALUE"),
        (["--zre-peer", "10.0.0.1:5"], "--zre-peer wants tcp://HOST:PORT"),
        (["--zre-evasive", "40s"], "--zre-evasive must be above 0 and below --zre-expired"),
    ],
)
def test_bad_zre_options_are_usage_errors(args: list[str], message: str) -> None:
    with pytest.raises(usage.UsageError) as raised:
        parse(*args)
    assert message in str(raised.value)


def test_dbp_options_and_allow_file(tmp_path: Path) -> None:
    allow = tmp_path / "allow.txt"
    allow.write_text("# services\nthermo\nvault  s3cr3t\n")
    options = parse("--dbp-allow", str(allow), "--dbp-liveness", "5", "--dbp-grace", "2m")
    config = options["service-options"]["dbp"]["dbp-config"]
    assert config.allow == {"thermo": None, "vault": "s3cr3t"}
    assert (config.liveness, config.grace) == (5, 120.0)
    allow.write_text("one two three\n")
    with pytest.raises(usage.UsageError, match="want NAME"):
        parse("--dbp-allow", str(allow))
    with pytest.raises(usage.UsageError, match="--dbp-allow"):
        parse("--dbp-allow", str(tmp_path / "missing"))
    with pytest.raises(usage.UsageError, match="--dbp-liveness must be at least 1"):
        parse("--dbp-liveness", "0")


@pytest.mark.parametrize("name", SERVICE_NAMES)
def test_the_process_options_are_every_plugins_and_the_products_bare(name: str) -> None:
    """``--cpu-latency-us`` belongs to a process: each plugin run alone takes it, the product
    takes it once, bare, and never hands it to one of its services."""
    assert "cpu-latency-us" in PROCESS_OPTION_NAMES
    alone = importlib.import_module(entry(name).tap).Options()
    alone.parse_layered(["--cpu-latency-us", "5"])
    assert alone["cpu-latency-us"] == 5
    product = {option.rstrip("=") for option in tap.Options().longOpt}
    assert "cpu-latency-us" in product
    assert f"{name}-cpu-latency-us" not in product


def test_a_process_option_in_a_services_table_or_environment_is_refused_by_the_product(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = tmp_path / "bus.toml"
    config.write_text("[emqp]\ncpu-latency-us = 0\n")
    with pytest.raises(usage.UsageError, match="option of the whole process, not of emqp"):
        tap.Options().parseOptions(["--services", "emqp", "--config", str(config)])
    monkeypatch.setenv("EMQP_CPU_LATENCY_US", "0")
    with pytest.raises(usage.UsageError, match="--cpu-latency-us, EVENTBUS_CPU_LATENCY_US"):
        tap.Options().parseOptions(["--services", "emqp"])
    monkeypatch.delenv("EMQP_CPU_LATENCY_US")
    monkeypatch.setenv("EVENTBUS_CPU_LATENCY_US", "3")
    options = tap.Options()
    options.parseOptions(["--services", "emqp"])
    assert options["cpu-latency-us"] == 3


def test_the_start_order_follows_what_each_tap_declares() -> None:
    """The Event BUS starts before the services that publish onto it, because their taps
    say so (AFTER), not because the product knows it."""
    import importlib

    order = tap.service_order()
    for service in entry_names(order):
        declared = getattr(importlib.import_module(entry(service).tap), "AFTER", ())
        for before in declared:
            if before in order:
                assert order.index(before) < order.index(service), (before, service)
    assert order[0] == "eventbus"
    assert all("eventbus" in importlib.import_module(entry(n).tap).AFTER for n in order[1:5])


def entry_names(order: tuple[str, ...]) -> list[str]:
    return [name for name in order if name in SERVICE_NAMES]
