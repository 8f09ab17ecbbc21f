"""Shared fixtures. Nothing here imports txzmq at import time (it would pick the
global reactor before pytest-twisted installs its own)."""

from __future__ import annotations

import atexit
import os
import shutil
import signal
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import pytest_twisted
from hypothesis import HealthCheck, settings

from tests.jvm import TEST_JVM_OPTIONS, spark_submit_args

# The suite runs on machines whose cores other work keeps busy: how long Hypothesis takes
# to draw an input, or to run one example, says nothing about the code under test (no
# timing assertions), so neither fails a test. A test's own @settings still applies.
settings.register_profile(
    "busy-machine", deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
settings.load_profile("busy-machine")

# A suite started in the background (`make test &`, nohup, a CI runner) has SIGINT ignored,
# and every child inherits that: a CLI or twistd a test stops with SIGINT (Ctrl-C as a user
# presses it) would keep running, and whether it did depended on which earlier test of the
# worker had set a handler. Children of the tests see Ctrl-C as a user's shell gives it.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

# Every JVM the tests start runs with tests.jvm's options (half the CPU on short runs).
_java_options = os.environ.get("JAVA_TOOL_OPTIONS", "")
if TEST_JVM_OPTIONS not in _java_options:
    os.environ["JAVA_TOOL_OPTIONS"] = f"{_java_options} {TEST_JVM_OPTIONS}".strip()
# And every Spark application they start has tests.jvm's settings (no web UI), with the
# JVM's class path the class archive's (no SPARK_CONF_DIR on it).
os.environ["PYSPARK_SUBMIT_ARGS"] = spark_submit_args()
os.environ.pop("SPARK_CONF_DIR", None)

# `twistd -n eventbus` composes the eMQP broker by default, on the original's fixed ports
# (47290, 47291, 47293) and ./emqp-data: the products these tests start (and inherit this
# environment) take free ports and a directory of this session instead, so that they never
# collide with each other or with a broker running on this machine.
_EMQP_DATA = tempfile.mkdtemp(prefix="tests-emqp-")
atexit.register(shutil.rmtree, _EMQP_DATA, True)
_EMQP_PORTS = ("EMQP_WORKER_PORT", "EMQP_CLIENT_PORT", "EMQP_ADMIN_PORT")
# And its PUBLISH service, on the original's 47298 and 47299.
for _name in (*_EMQP_PORTS, "EMQP_PUBSUB_INCOMING_PORT", "EMQP_PUBSUB_OUTGOING_PORT"):
    os.environ.setdefault(_name, "0")
os.environ.setdefault("EMQP_DATA_DIR", _EMQP_DATA)


@pytest.fixture
def bus_server(tmp_path: Path) -> Iterator[Any]:
    """A running Event BUS on free ports of 127.0.0.1 with its log in tmp_path."""
    from bus.testing import start_bus

    server = start_bus(tmp_path / "bus")
    yield server
    pytest_twisted.blockon(server.stopService())


@pytest.fixture
def peers() -> Iterator[list[Any]]:
    """Raw peers made by a test are closed after it."""
    made: list[Any] = []
    yield made
    for peer in made:
        peer.close()


@pytest.fixture
def cleanup() -> Iterator[list[Any]]:
    """What a test started (services, peers, clients, child processes): closed after it,
    the last made first; services are stopped, the rest closed."""
    made: list[Any] = []
    yield made
    for thing in reversed(made):
        if hasattr(thing, "stopService"):
            pytest_twisted.blockon(thing.stopService())
        else:
            thing.close()


@pytest.fixture
def keys(tmp_path: Path) -> Any:
    """A CURVE server key pair and an allow-list of client certificates
    (:class:`tests.curve_helpers.Keys`) in tmp_path."""
    from tests.curve_helpers import Keys

    return Keys(tmp_path / "keys")


@pytest.fixture
def make_node() -> Iterator[Any]:
    """Starts ZRE nodes (``make_node(config, **kwargs)``: the node and its
    ``tests.zre_helpers.EventLog``) and stops those still running afterwards."""
    from bus.zre.node import ZreNode
    from tests.zre_helpers import EventLog

    made: list[ZreNode] = []

    def make(config: Any, **kwargs: Any) -> tuple[ZreNode, EventLog]:
        node = ZreNode(config, **kwargs)
        events = EventLog()
        node.add_listener(events)
        node.startService()
        made.append(node)
        return node, events

    yield make
    for node in made:
        pytest_twisted.blockon(node.stopService())


#: The suite's longest files (wall time in a fresh-clone CI run with four workers on two
#: cores: 203 s down to 29 s), started first, so that no worker is left with one of them
#: while the others have run out of work (the four finished within 13 s of each other).
#: Run with ``--dist loadfile --no-loadscope-reorder`` (the Makefile): xdist otherwise
#: starts the files with the most tests first, which put the one-test nemesis files last.
LONGEST_FIRST = (
    "tests/spark/test_spark_pipeline.py",
    "tests/test_emqp_nemesis.py",
    "tests/test_emqp_pubsub_nemesis.py",
    "tests/spark/test_spark_cluster.py",
    "tests/spark/test_spark_source.py",
    "tests/test_console_browser.py",
    "tests/test_mc0_nemesis.py",
    "tests/test_emqp_cluster.py",
    "tests/test_nats_discovery.py",
    "tests/spark/test_spark_end_to_end.py",
    "tests/test_eventbus_import.py",
    "tests/test_cluster_roll.py",
    "tests/test_console_alerts.py",
    "tests/spark/test_spark_stream_failover.py",
    "tests/test_emqp_interop.py",
    "tests/test_installed_product.py",
    "tests/test_eventbus_cluster.py",
    "tests/test_emqp_cli.py",
    "tests/test_cli_arguments.py",
    "tests/test_eventbus_pair_process.py",
    "tests/test_eventbus_codec_fastpath.py",
    "tests/test_emqp_worker_eventmq.py",
    "tests/test_eventbus_pair.py",
    "tests/test_http_hostile.py",
    "tests/test_eventbus_heal.py",
    "tests/test_inbound_flood.py",
    "tests/test_eventbus_nemesis.py",
    "tests/test_curve_cli.py",
    "tests/test_natswire_failover.py",
    "tests/test_eventbus_wal_process.py",
)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The files of :data:`LONGEST_FIRST` first, in its order; the rest as collected."""
    root = config.rootpath
    missing = [name for name in LONGEST_FIRST if not (root / name).exists()]
    if missing:  # a file renamed or gone: its place in the list would be silently lost
        raise pytest.UsageError(f"LONGEST_FIRST names files that do not exist: {missing}")
    rank = {name: place for place, name in enumerate(LONGEST_FIRST)}

    def place(item: pytest.Item) -> int:
        return rank.get(item.path.relative_to(root).as_posix(), len(rank))

    items.sort(key=place)


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    """Each phase's report kept on the item (``item.report_call``), so that a fixture's
    teardown knows whether its test failed (the browser tests save a screenshot then)."""
    report = yield
    setattr(item, f"report_{report.when}", report)
    return report


@pytest.fixture
def nats_server(tmp_path: Path) -> Iterator[Any]:
    """One nats-server with JetStream on 127.0.0.1 (the cluster extra's binary)."""
    pytest.importorskip("nats")
    from tests.ports import nats_cluster

    cluster = nats_cluster(tmp_path / "nats", size=1)
    cluster.start()
    yield cluster
    cluster.stop()


def _cpu_seconds() -> float:
    """CPU of this worker, its reaped children, and its living descendants (a JVM, servers)."""
    import psutil

    times = os.times()
    total = times.user + times.system + times.children_user + times.children_system
    for child in psutil.Process().children(recursive=True):
        try:
            used = child.cpu_times()
        except psutil.Error:
            continue
        total += used.user + used.system
    return total


#: What the running test waited for, with ``BUS_TEST_CPU`` set: (what, seconds) of each wait.
_waits: list[tuple[str, float]] = []


def pytest_configure(config: pytest.Config) -> None:
    """``BUS_TEST_CPU``: the waits of the tests (``bus.util.polling.wait_until``, which
    ``bus.testing`` gives the tests, and tests.processes' and tests.netns' blocking polls)
    are timed, so that a test whose wall time is far above its CPU says what it waited for."""
    if not os.environ.get("BUS_TEST_CPU"):
        return
    import time

    import bus.testing
    import bus.util.polling
    import tests.netns
    import tests.processes

    def timed(wait: Any, described: Any) -> Any:
        def timing(*args: Any, **kwargs: Any) -> Any:
            start = time.monotonic()
            what = str(described(*args, **kwargs))[:160]

            def record(result: Any = None) -> Any:
                _waits.append((what, round(time.monotonic() - start, 2)))
                return result

            try:
                result = wait(*args, **kwargs)
            except BaseException:
                record()
                raise
            if hasattr(result, "addBoth"):  # a Deferred: timed until it fires
                return result.addBoth(record)
            return record(result)

        return timing

    def what(predicate: Any, *args: Any, what: str = "", **kwargs: Any) -> str:
        return what or (args[-1] if args and isinstance(args[-1], str) else str(predicate))

    reactor_wait = timed(bus.util.polling.wait_until, what)
    bus.util.polling.wait_until = reactor_wait
    bus.testing.wait_until = reactor_wait
    tests.processes.wait_for = timed(tests.processes.wait_for, what)
    tests.netns.poll_until = timed(tests.netns.poll_until, what)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Any:
    """``BUS_TEST_CPU=DIR``: each test's CPU (setup to teardown, the processes it started
    included), wall time and longest waits (what, seconds: over a second, longest first)
    appended to a file per worker, to see which tests cost the suite its minutes on a
    machine whose cores it keeps busy (the durations do not say) and what those far above
    their CPU waited for."""
    into = os.environ.get("BUS_TEST_CPU")
    if not into:
        return (yield)
    import json
    import time

    _waits.clear()
    cpu, wall = _cpu_seconds(), time.monotonic()
    try:
        return (yield)
    finally:
        row = {
            "test": item.nodeid,
            "cpu": round(_cpu_seconds() - cpu, 3),
            "wall": round(time.monotonic() - wall, 3),
            "waits": sorted((w for w in _waits if w[1] > 1), key=lambda w: -w[1])[:8],
        }
        worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
        with open(Path(into) / f"cpu-{worker}.jsonl", "a") as out:
            out.write(json.dumps(row) + "\n")
