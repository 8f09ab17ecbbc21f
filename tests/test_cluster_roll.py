"""A planned restart of every nats-server and front-end, one at a time (``bus-cluster
roll``), through real processes on 127.0.0.1, while a :class:`ConfirmedPublisher` and an
:class:`EventBusSubscriber` use the front-ends: every event the publisher was told is
stored reaches the subscriber once, at its sequence, with no hole; each server's
leaderships moved before it stopped (none was left to an election); at the end every
server's replica of the stream is current again.

Two ways in: a cluster named by its URLs, whose servers stop and start through the
commands an operator gives (here tests/roll_service.py, as ``systemctl`` would over
``ssh``); and the cluster ``bus-cluster`` runs, rolled from its directory, front-ends
included."""

from __future__ import annotations

import contextlib
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
from twisted.internet import defer, threads

from bus.eventbus.client import EventBusSubscriber
from bus.eventbus.codec import Event
from bus.nats.roll import group_of
from bus.nats.servers import NatsCluster
from bus.testing import ConditionTimeout, wait_until
from tests.jetstream_helpers import leaders, stream_info
from tests.ports import free_ports, nats_cluster
from tests.processes import ROOT, ServerProcess, reported
from tests.test_eventbus_failover import Traffic, check_history

pytest.importorskip("nats")

BUS_CLUSTER = str(Path(sys.executable).with_name("bus-cluster"))
#: The front-ends' connections leave at the lame-duck INFO: a short grace period only
#: makes each server exit sooner (what ``bus-cluster`` configures too).
LAME_DUCK = 'lame_duck_duration: "30s"\nlame_duck_grace_period: "2s"\n'


def run(
    command: list[str], timeout: float = 600
) -> defer.Deferred[subprocess.CompletedProcess[str]]:
    """``command`` run in a thread (the reactor goes on serving the clients meanwhile)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1"}
    return threads.deferToThread(
        subprocess.run, command, capture_output=True, text=True, timeout=timeout, cwd=ROOT, env=env
    )


def moved_before_stopping(output: str, server: str) -> str:
    """Where ``server``'s leadership of the stream went, said before it was stopped."""
    lines = output.splitlines()
    stepped = next(
        i for i, line in enumerate(lines)
        if re.match(rf"{server}: stepped down as leader of .*stream EVENTBUS \(now (\w+)\)", line)
    )  # fmt: skip
    stopped = next(i for i, line in enumerate(lines) if line.startswith(f"{server}: stopped"))
    assert stepped < stopped, output
    found = re.search(r"stream EVENTBUS \(now (\w+)\)", lines[stepped])
    assert found is not None
    return found[1]


def interrupt_a_roll(directory: Path) -> subprocess.CompletedProcess[str]:
    """``bus-cluster roll`` of the servers, Ctrl-C (SIGINT) once it began with n1."""
    roll = subprocess.Popen(
        [BUS_CLUSTER, "roll", "--dir", str(directory), "--no-front-ends"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert roll.stdout is not None
    said = []
    while not said or not said[-1].startswith("n1: "):
        line = roll.stdout.readline()
        assert line, said
        said.append(line)
    roll.send_signal(signal.SIGINT)
    out, err = roll.communicate(timeout=120)
    return subprocess.CompletedProcess(roll.args, roll.returncode, "".join(said) + out, err)


@defer.inlineCallbacks
def every_replica_current(urls: list[str]) -> Any:
    """Once the stream has a leader and its three replicas are current, as its servers say: a
    replica may be a message behind just after the last publish (beside busy cores: lag 1),
    and catches up."""
    seen: list[Any] = []

    def current() -> bool:
        group = group_of(stream_info(urls[0], "EVENTBUS"), "EVENTBUS")
        seen[:] = [group]
        return (
            group.leader is not None
            and len(group.peers) == 3
            and all(group.current_on(name) for name in group.peers)
        )

    try:
        yield wait_until(current, timeout=30, what="every replica current")
    except ConditionTimeout:
        raise AssertionError(f"not every replica current: {seen}") from None


@pytest.fixture
def nats(tmp_path: Path) -> Iterator[NatsCluster]:
    cluster = nats_cluster(tmp_path / "nats", size=3, extra=LAME_DUCK)
    cluster.start()
    yield cluster
    # A server started again by tests/roll_service.py is no child of this process: its
    # pid file names it.
    for node in cluster.nodes:
        with contextlib.suppress(OSError, ValueError, IndexError):
            os.kill(int(node.pid_file.read_text().split()[0]), signal.SIGKILL)
    cluster.stop()


class Clients:
    """A confirming publisher and a subscriber given both front-ends."""

    def __init__(self, addresses: list[str]) -> None:
        from bus.eventbus.confirmed import ConfirmedPublisher

        self.seen: list[Event] = []
        self.subscriber = EventBusSubscriber(addresses, [], self.seen.append, failover_after=0.5)
        self.publisher = ConfirmedPublisher(
            addresses[::-1], "roll", resend_after=3.0, failover_after=0.5
        )
        self.traffic: Traffic | None = None

    @defer.inlineCallbacks
    def start(self) -> Any:
        self.subscriber.startService()
        self.publisher.startService()
        yield self.publisher.when_ready()
        self.traffic = Traffic(self.publisher, interval=0.05, burst=5)  # ~100 a second
        yield wait_until(lambda: len(self.traffic.confirmed) >= 100, timeout=60, what="flow")

    @defer.inlineCallbacks
    def finish(self) -> Any:
        """Stop publishing; wait for every confirmation and for the subscriber; check."""
        traffic = self.traffic
        assert traffic is not None
        before = len(traffic.confirmed)
        yield wait_until(lambda: len(traffic.confirmed) > before + 100, timeout=60, what="after")
        traffic.stop()
        yield wait_until(
            lambda: len(traffic.confirmed) + len(traffic.failed) == traffic.sent,
            timeout=60,
            what="every event confirmed",
        )
        assert not traffic.failed
        top = max(traffic.confirmed.values())
        yield wait_until(lambda: len(self.seen) >= top, timeout=60, what="the subscriber")
        check_history(self.seen, traffic.confirmed)
        return len(traffic.confirmed)

    @defer.inlineCallbacks
    def stop(self) -> Any:
        if self.traffic is not None:
            self.traffic.stop()
        for service in (self.publisher, self.subscriber):
            if service.running:
                yield service.stopService()


def front_end(nats: NatsCluster, data_dir: Path, port: int) -> ServerProcess:
    """A front-end of the stream (three replicas) on the cluster's every server."""
    return ServerProcess(
        data_dir,
        "--services", "eventbus", "--store", "jetstream", "--nats", ",".join(nats.urls),
        "--nats-replicas", "3",
        port=port,
    )  # fmt: skip


@pytest_twisted.inlineCallbacks
def test_rolling_a_cluster_named_by_its_urls_moves_every_leader_first_and_loses_nothing(
    nats: NatsCluster, tmp_path: Path
) -> Any:
    ports = [free_ports(3), free_ports(3)]
    ends = [front_end(nats, tmp_path / name, port) for name, port in zip("ab", ports, strict=True)]
    clients = Clients([f"127.0.0.1:{port}" for port in ports])
    try:
        yield reported(lambda: all(end.ready() for end in ends), what="front-ends")
        yield clients.start()
        led = (yield threads.deferToThread(leaders, nats.urls, ["EVENTBUS"]))["stream EVENTBUS"]
        service = [sys.executable, "-m", "tests.roll_service"]
        where = str(nats.directory)
        done = yield run(
            [
                BUS_CLUSTER, "roll", "--nats", ",".join(nats.urls),
                "--stop", " ".join([*service, "stop", where, "{name}"]),
                "--start", " ".join([*service, "start", where, "{name}"]),
            ]
        )  # fmt: skip
        assert done.returncode == 0, done.stdout + done.stderr
        for node in nats.nodes:  # each in turn, in the order given
            assert f"{node.name}: done in " in done.stdout, done.stdout
        assert moved_before_stopping(done.stdout, led) != led
        assert done.stdout.splitlines()[-1].startswith("restarted 3 server(s) and 0 front-end(s)")
        # Two of the steps alone, as a runbook uses them.
        urls = ",".join(nats.urls)
        led = (yield threads.deferToThread(leaders, nats.urls, ["EVENTBUS"]))["stream EVENTBUS"]
        moved = yield run([BUS_CLUSTER, "step-down", led, "--nats", urls])
        assert moved.returncode == 0, moved.stdout + moved.stderr
        now = (yield threads.deferToThread(leaders, nats.urls, ["EVENTBUS"]))["stream EVENTBUS"]
        assert now != led and f"(now {now})" in moved.stdout, moved.stdout
        current = yield run([BUS_CLUSTER, "wait-current", led, "--nats", urls])
        assert current.returncode == 0 and "are current" in current.stdout, current
        typo = yield run([BUS_CLUSTER, "wait-current", "n9", "--nats", urls])
        assert typo.returncode == 1 and "is the name right?" in typo.stderr, typo
        confirmed = yield clients.finish()
        yield every_replica_current(nats.urls)
        print(
            f"\nroll of 3 servers by their URLs: {confirmed} events confirmed, each delivered once"
        )
    finally:
        yield clients.stop()
        for end in ends:
            end.stop()


@pytest_twisted.inlineCallbacks
def test_rolling_the_cluster_bus_cluster_runs_restarts_its_servers_and_front_ends(
    tmp_path: Path,
) -> Any:
    base, http, nats_port, routes = free_ports(6), free_ports(2), free_ports(3), free_ports(3)
    directory = tmp_path / "c"
    demo = subprocess.Popen(
        [
            BUS_CLUSTER, "--dir", str(directory), "--port", str(base), "--http-port", str(http),
            "--nats-port", str(nats_port), "--nats-route-port", str(routes),
        ],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    out: list[str] = []

    def read_until(last: str) -> bool:
        assert demo.stdout is not None
        while not out or not out[-1].startswith(last):
            line = demo.stdout.readline()
            assert line, "".join(out)
            out.append(line)
        return True

    clients = Clients([f"127.0.0.1:{base}", f"127.0.0.1:{base + 3}"])
    urls = [f"nats://127.0.0.1:{nats_port + i}" for i in range(3)]
    try:
        yield threads.deferToThread(read_until, "ready")
        yield clients.start()
        led = (yield threads.deferToThread(leaders, urls, ["EVENTBUS"]))["stream EVENTBUS"]
        done = yield run([BUS_CLUSTER, "roll", "--dir", str(directory)])
        assert done.returncode == 0, done.stdout + done.stderr
        assert moved_before_stopping(done.stdout, led) != led
        for index in (1, 2):
            assert (
                f"front-end http://127.0.0.1:{http + index - 1}/status: serving again"
                in done.stdout
            )
        assert done.stdout.splitlines()[-1].startswith("restarted 3 server(s) and 2 front-end(s)")
        confirmed = yield clients.finish()
        yield every_replica_current(urls)
        print(f"\nroll of bus-cluster's 3 servers and 2 front-ends: {confirmed} events confirmed")
        # Ctrl-C in the middle of another roll: one line, what it was doing, status 130.
        interrupted = yield threads.deferToThread(interrupt_a_roll, directory)
        assert interrupted.returncode == 130, interrupted
        last = interrupted.stderr.splitlines()[-1]
        assert re.match(r"bus-cluster roll: interrupted after [0-9.]+ s, .*n1", last), last
    finally:
        yield clients.stop()
        demo.send_signal(signal.SIGINT)
        rest = demo.communicate(timeout=120)[0]
    said = "".join(out) + rest
    # bus-cluster started each process the roll stopped, and said so.
    for name in ("n1", "n2", "n3"):
        assert f"nats-server {name} ended (status 0); starting it again" in said, said
    for index in (1, 2):
        assert f"front-end {index} ended" in said, said
    assert demo.returncode == 130, said
    leftover = subprocess.run(["pgrep", "-f", str(directory)], capture_output=True, text=True)
    assert leftover.stdout == "", "every process it started stopped"
