"""Clients' server lists across JetStream front-ends: two ``twistd -n eventbus --store
jetstream`` processes on one stream, a :class:`ConfirmedPublisher` and a subscriber given
both, events flowing while the front-end they use is killed (kill -9) and later
SIGSTOPped. Checked over what the clients saw: every confirmed event is in the final log
exactly once under the sequence it was confirmed with; the subscriber saw every sequence
once, in order, with no hole; both clients moved to the other front-end. And the same
publisher against a single SQLite server, which never resends there."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import pytest_twisted
from twisted.internet import defer, reactor, task

from bus.eventbus.client import EventBusSubscriber
from bus.eventbus.codec import Event
from bus.nats.servers import NatsCluster
from bus.testing import wait_until
from tests.ports import free_ports
from tests.processes import ServerProcess, reported

pytest.importorskip("nats")

CLI = str(Path(sys.executable).with_name("eventbus-cli"))


def front_end(nats: NatsCluster, root: Path, name: str, port: int) -> ServerProcess:
    return ServerProcess(
        root / name,
        "--services", "eventbus", "--store", "jetstream", "--nats", ",".join(nats.urls),
        "--nats-replicas", "1",
        port=port,
    )  # fmt: skip


class Traffic:
    """Publishes an event every ``interval`` through ``publisher``; keeps what was
    confirmed (uuid -> sequence) and what failed."""

    def __init__(self, publisher: Any, interval: float = 0.01, burst: int = 5) -> None:
        self.publisher = publisher
        self.sent = 0
        self.confirmed: dict[str, int] = {}
        self.failed: list[Any] = []
        self.burst = burst
        self.loop = task.LoopingCall(self.tick)
        self.loop.start(interval, now=False)

    def tick(self) -> None:
        for _ in range(self.burst):
            self.one()

    def one(self) -> None:
        i = self.sent
        self.sent += 1
        event_id = f"00000000-0000-4000-8000-{i:012d}"
        d = self.publisher.publish(f"/f/{i % 3}/", {"i": i}, event_id=event_id)
        d.addCallbacks(
            lambda sequence: self.confirmed.__setitem__(event_id, sequence), self.failed.append
        )

    def stop(self) -> None:
        if self.loop.running:
            self.loop.stop()


def check_history(seen: list[Event], confirmed: dict[str, int]) -> None:
    sequences = [event.sequence for event in seen]
    assert sequences == list(range(1, len(seen) + 1)), "a hole, a repeat or disorder"
    by_uuid: dict[bytes, list[int]] = {}
    for event in seen:
        by_uuid.setdefault(event.uuid, []).append(event.sequence)
    twice = {u: s for u, s in by_uuid.items() if len(s) > 1}
    assert not twice, f"stored more than once: {twice}"
    for event_id, sequence in confirmed.items():
        assert by_uuid.get(event_id.encode()) == [sequence], event_id


@pytest_twisted.inlineCallbacks
def test_clients_fail_over_between_front_ends_with_no_duplicate_and_no_hole(
    nats_server: NatsCluster, tmp_path: Path
) -> Any:
    from bus.eventbus.confirmed import ConfirmedPublisher

    nats = nats_server

    ports = [free_ports(3), free_ports(3)]
    ends = [front_end(nats, tmp_path, name, port) for name, port in zip("ab", ports, strict=True)]
    seen: list[Event] = []
    addresses = [f"127.0.0.1:{port}" for port in ports]
    subscriber = EventBusSubscriber(addresses, [], seen.append, failover_after=0.5)
    publisher = ConfirmedPublisher(addresses, "failover", resend_after=3.0, failover_after=0.5)
    traffic: Traffic | None = None
    try:
        yield reported(lambda: all(end.ready() for end in ends), what="front-ends")
        subscriber.startService()
        publisher.startService()
        yield publisher.when_ready()
        traffic = Traffic(publisher)
        yield wait_until(lambda: len(traffic.confirmed) >= 500, timeout=30, what="50 confirmed")

        # SIGSTOP, then kill -9, of the front-end both clients use: what the publisher
        # sent it meanwhile dies unread with it, and only a resend stores it.
        ends[0].process.send_signal(signal.SIGSTOP)
        yield wait_until(
            lambda: publisher.publisher.failovers >= 1 and subscriber.failovers >= 1,
            timeout=30,
            what="both clients on b",
        )
        ends[0].stop(signal.SIGKILL)
        confirmed = len(traffic.confirmed)
        yield wait_until(
            lambda: len(traffic.confirmed) >= confirmed + 500, timeout=30, what="confirmed on b"
        )

        ends[0] = front_end(nats, tmp_path, "a2", ports[0])
        yield reported(ends[0].ready, what="a again")
        # SIGSTOP of the front-end in use now, continued once the clients left it: it then
        # stores late what it had been sent, which the publisher resent through a.
        ends[1].process.send_signal(signal.SIGSTOP)
        yield wait_until(
            lambda: publisher.publisher.failovers >= 2 and subscriber.failovers >= 2,
            timeout=30,
            what="both clients on a",
        )
        confirmed = len(traffic.confirmed)
        yield wait_until(
            lambda: len(traffic.confirmed) >= confirmed + 500, timeout=40, what="confirmed on a"
        )
        ends[1].process.send_signal(signal.SIGCONT)
        traffic.stop()
        yield wait_until(
            lambda: len(traffic.confirmed) + len(traffic.failed) == traffic.sent,
            timeout=30,
            what="every event confirmed",
        )
        assert not traffic.failed
        yield wait_until(
            lambda: len(seen) >= max(traffic.confirmed.values()), timeout=30, what="caught up"
        )
        check_history(seen, traffic.confirmed)
        # The final log, read whole from the other front-end, holds the same history. Its
        # snapshots stop at what it has broadcast: continued, b reads what it missed while
        # stopped, so it is read once its status.json says it broadcast everything.
        yield wait_until(
            lambda: (ends[1].status().get("jetstream") or {}).get("broadcast", 0) >= len(seen),
            timeout=60,
            what="b broadcasting the whole log",
        )
        dump = subprocess.run(
            [CLI, "snapshot", "--server", addresses[1], "--timeout", "30"],
            capture_output=True, text=True, timeout=60, check=True,
        )  # fmt: skip
        assert len(dump.stdout.splitlines()) == len(seen)
    finally:
        if traffic is not None:
            traffic.stop()
        yield publisher.stopService() if publisher.running else defer.succeed(None)
        yield subscriber.stopService() if subscriber.running else defer.succeed(None)
        for end in ends:
            if end.process.poll() is None:
                end.process.send_signal(signal.SIGCONT)
                end.stop()


@pytest_twisted.inlineCallbacks
def test_a_confirmed_publisher_on_one_sqlite_server_confirms_and_never_resends(
    tmp_path: Path,
) -> Any:
    from bus.eventbus.confirmed import ConfirmedPublisher, NotConfirmed

    server = ServerProcess(tmp_path / "one", "--services", "eventbus", port=free_ports(3))
    publisher = None
    try:
        yield reported(server.ready, what="server")
        publisher = ConfirmedPublisher(server.address, "one", resend=False)
        publisher.startService()
        first = yield publisher.publish("/one/", 1)
        assert first >= 1
        sequences = yield defer.gatherResults([publisher.publish("/one/", i) for i in range(20)])
        assert sorted(sequences) == list(range(first + 1, first + 21))
        assert publisher.resent == 0 and publisher.unconfirmed == 0
        # Stopped before the server could answer: the caller hears it was not confirmed.
        server.process.send_signal(signal.SIGSTOP)
        late = publisher.publish("/one/", "late")
        yield task.deferLater(reactor, 0.2, lambda: None)
        yield publisher.stopService()
        with pytest.raises(NotConfirmed):
            yield late
    finally:
        if publisher is not None and publisher.running:
            yield publisher.stopService()
        server.process.send_signal(signal.SIGCONT)
        server.stop()
