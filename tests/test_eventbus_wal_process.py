"""The WAL's bound against the server as users run it (twistd): under a steady stream of
publishes the WAL file stays near ``--wal-limit`` at every sample (checkpoints restart it),
and a subscriber sees every sequence (the restarts hold appends, they lose none).

Without the bound the WAL only grows while commits keep coming (bench/README.md, "The WAL"):
this load writes several times the bound asserted here."""

from __future__ import annotations

import urllib.request
from pathlib import Path
from typing import Any

import pytest_twisted
from twisted.internet import defer, reactor, task

from bus.eventbus.client import EventBusPublisher, EventBusSubscriber
from bus.testing import wait_until
from tests.processes import CLEAN_EXIT, ServerProcess, reported

LIMIT = 1024 * 1024
#: How far above the limit the file may be: what the publisher adds between two checkpoints
#: (every second) and a restart put off by commits in progress, with room for a slow machine.
MARGIN = 15 * 1024 * 1024
EVENTS = 40_000
BURST = 20
PAYLOAD = "x" * 1000


@pytest_twisted.inlineCallbacks
def test_the_wal_stays_within_its_bound_under_steady_publishing_and_nothing_is_lost(
    tmp_path: Path,
) -> Any:
    data = tmp_path / "data"
    data.mkdir()
    wal = data / "events.sqlite3-wal"
    server = ServerProcess(data, "--wal-limit", "1MiB", http=True)
    publisher = subscriber = None
    sampler: task.LoopingCall | None = None
    sizes: list[int] = []

    def sample() -> None:
        sizes.append(wal.stat().st_size if wal.exists() else 0)

    try:
        yield reported(server.ready, server.process, what="server start")
        assert server.status()["wal_limit"] == LIMIT
        received: list[Any] = []
        subscriber = EventBusSubscriber([server.address], [], received.append)
        subscriber.startService()
        yield wait_until(lambda: not subscriber.core.syncing, timeout=60, what="subscribed")
        publisher = EventBusPublisher(server.address, producer_id="wal")
        sampler = task.LoopingCall(sample)
        sampler.start(0.05)
        sent = 0
        # A burst every 10 ms, paced by what the server stored: the load follows the machine.
        while sent < EVENTS:
            for _ in range(BURST):
                publisher.publish(f"/wal/{sent % 100}/", PAYLOAD)
                sent += 1
            yield task.deferLater(reactor, 0.01, lambda: None)
            if sent - int(server.status().get("sequence", 0)) > 2000:
                yield wait_until(
                    lambda sent=sent: sent - int(server.status().get("sequence", 0)) <= 500,
                    timeout=120,
                    interval=0.05,
                    what="the server to catch up",
                )
        yield wait_until(
            lambda: len(received) >= EVENTS, timeout=300, interval=0.05, what="every event"
        )
        sampler.stop()
        sampler = None
        yield wait_until(
            lambda: server.status().get("sequence") == EVENTS, timeout=60, what="status.json"
        )
        status = server.status()
        assert [event.sequence for event in received] == list(range(1, EVENTS + 1))
        assert subscriber.core.stats.gaps == 0
        # The load wrote far more than the bound (the database holds it) ...
        assert (data / "events.sqlite3").stat().st_size > 2 * (LIMIT + MARGIN)
        # ... and the WAL was restarted, never above the bound at any sample.
        assert status["wal_restarts"] > 0
        assert len(sizes) > 100
        assert max(sizes) <= LIMIT + MARGIN, f"WAL at most {max(sizes)} bytes"
        # /metrics says the same.
        with urllib.request.urlopen(
            f"http://127.0.0.1:{server.http_port}/metrics", timeout=30
        ) as response:
            metrics = dict(
                line.rsplit(" ", 1)
                for line in response.read().decode().splitlines()
                if line.startswith("eventbus_wal_")
            )
        assert float(metrics["eventbus_wal_restarts_total"]) >= status["wal_restarts"]
        assert 0 <= float(metrics["eventbus_wal_bytes"]) <= LIMIT + MARGIN
    finally:
        if sampler is not None:
            sampler.stop()
        if subscriber is not None and subscriber.running:
            yield subscriber.stopService()
        if publisher is not None:
            publisher.close()
        yield defer.succeed(None)
        assert server.stop() in CLEAN_EXIT
