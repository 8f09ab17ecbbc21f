"""An Event BUS pair in one process, through real sockets: mirroring, sync releases,
failover with clients given both addresses, going on alone and healing, rejoining."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgpack
import pytest
import pytest_twisted
import zmq

from bus.eventbus.client import EventBusPublisher, EventBusSubscriber
from bus.eventbus.codec import Event, sync_start_frames
from bus.eventbus.config import PairConfig
from bus.eventbus.store import EventStore
from bus.testing import RawPeer, start_bus, wait_until
from bus.util.polling import ConditionTimeout
from tests.ports import free_port

#: --ha-failover-timeout and --ha-alone-timeout. Both halves share this process's reactor
#: and GIL: one half's stop, or a collection in a loaded full run, can hold the other past
#: half the shorter timeout, which it must take for a pause of its own (pair_core: a passive
#: then stops counting itself in sync). 2 s, as the process tests use, leaves room.
TIMEOUT = 2.0


class Pair:
    """Two halves on free ports; ``start`` (re)starts one with its data directory."""

    def __init__(self, root: Path, **pair: Any) -> None:
        self.root = root
        self.links = {"primary": free_port(), "backup": free_port()}
        self.pair = pair
        self.servers: dict[str, Any] = {}

    def start(self, role: str) -> Any:
        other = "backup" if role == "primary" else "primary"
        config = PairConfig(
            role,  # type: ignore[arg-type]
            f"127.0.0.1:{self.links[other]}",
            port=self.links[role],
            failover_timeout=TIMEOUT,
            alone_timeout=TIMEOUT,
            **self.pair,
        )
        server = start_bus(self.root / role, pair=config, heartbeat_interval=0.1)
        self.servers[role] = server
        return server

    def stop(self, role: str) -> Any:
        server = self.servers.pop(role)
        return server.stopService()

    def address(self, role: str) -> str:
        return f"127.0.0.1:{self.servers[role].port}"


@pytest.fixture
def pair(tmp_path: Path) -> Iterator[Pair]:
    made = Pair(tmp_path)
    yield made
    for server in list(made.servers.values()):
        pytest_twisted.blockon(server.stopService())


def log_of(server: Any) -> list[Event]:
    return list(server.store.read(0, limit=10**7))


def formed(pair: Pair) -> bool:
    primary, backup = pair.servers["primary"], pair.servers["backup"]
    return bool(
        primary.pair.state == "active"
        and primary.pair.paired
        and backup.pair.state == "passive"
        and backup.pair.core.in_sync
    )


def voted_active(server: Any, timeout: float = 10.0, what: str = "active") -> Any:
    """Ask ``server`` for a snapshot every 0.2 s until it is active, as a client does: a
    vote counts for ``--ha-failover-timeout`` only, and one sent just after the start can
    expire before the peer's silence is long enough (seen once in a loaded full run)."""
    voter = RawPeer.dealer(server.endpoints["snapshot"])
    last = [0.0]

    def active() -> bool:
        now = time.monotonic()
        if server.pair.state != "active" and now - last[0] >= 0.2:
            last[0] = now
            voter.send(sync_start_frames((), 0))
        return bool(server.pair.state == "active")

    def explain(failure: Any) -> Any:
        # What the pair's state machine thought, for a failure seen only in CI's log.
        failure.trap(ConditionTimeout)
        raise ConditionTimeout(f"{failure.value}; the pair: {server.pair.status()}")

    waited = wait_until(active, timeout=timeout, what=what).addErrback(explain)
    return waited.addBoth(lambda result: (voter.close(), result)[1])


@pytest_twisted.inlineCallbacks
def test_the_passive_mirrors_the_log_caught_up_by_snapshot_then_live(pair: Pair) -> Any:
    primary = pair.start("primary")
    publisher = EventBusPublisher(pair.address("primary"), producer_id="mirror")
    try:
        # Alone first (no backup yet): a primary takes over on silence and a vote.
        yield voted_active(primary, what="primary active alone")
        for i in range(3000):
            publisher.publish(f"/mirror/{i % 7}/", {"n": i})
        yield wait_until(lambda: primary.store.last_sequence == 3000, what="stored alone")
        # The loop above holds this process's reactor (the servers' too) for as long as the
        # machine makes it: past half the timeout the active takes itself for stalled and
        # doubts until the silence of alone_timeout says it is alone again.
        yield wait_until(lambda: primary.pair.status()["alone"], what="active alone")
        backup = pair.start("backup")
        yield wait_until(lambda: backup.pair.state == "passive", what="backup passive")
        # Live while it catches up.
        for i in range(3000, 5000):
            publisher.publish(f"/mirror/{i % 7}/", {"n": i})
        yield wait_until(lambda: formed(pair), timeout=20, what="paired")
        yield wait_until(lambda: backup.store.last_sequence == 5000, what="mirrored")
        assert backup.store.store_id == primary.store.store_id
        assert log_of(backup) == log_of(primary)
        status = backup.status()["ha"]
        assert status["state"] == "passive" and status["behind"] == 0
        assert status["events_replicated"] == 5000 and status["peer"]["state"] == "active"
        assert primary.status()["ha"]["paired"] and not primary.status()["ha"]["alone"]
        # The passive serves nobody: no heartbeat on its PUB socket.
        sub = RawPeer.sub(backup.endpoints["publisher"])
        listener = RawPeer.sub(primary.endpoints["publisher"])
        yield wait_until(lambda: len(listener.messages) >= 3, what="heartbeats of the active")
        assert sub.messages == []
        sub.close()
        listener.close()
    finally:
        publisher.close()


@pytest_twisted.inlineCallbacks
def test_sync_replication_broadcasts_only_what_the_passive_stored(pair: Pair) -> Any:
    primary = pair.start("primary")
    backup = pair.start("backup")
    yield wait_until(lambda: formed(pair), what="pair formed")
    behind: list[int] = []

    def check(event: Event) -> None:
        if backup.store.last_sequence < event.sequence:
            behind.append(event.sequence)

    subscriber = EventBusSubscriber([pair.address("primary")], [], check)
    subscriber.startService()
    publisher = EventBusPublisher(pair.address("primary"), producer_id="sync")
    try:
        yield wait_until(lambda: not subscriber.core.syncing, what="subscribed")
        for i in range(4000):
            publisher.publish("/sync/", i)
        yield wait_until(lambda: subscriber.last_sequence == 4000, timeout=20, what="received")
        assert behind == [], f"{len(behind)} events broadcast before the passive held them"
        assert primary.core.released == 4000
    finally:
        publisher.close()
        yield subscriber.stopService()


@pytest_twisted.inlineCallbacks
def test_clients_given_both_addresses_continue_across_a_failover(pair: Pair) -> Any:
    primary = pair.start("primary")
    backup = pair.start("backup")
    yield wait_until(lambda: formed(pair), what="pair formed")
    addresses = [pair.address("primary"), pair.address("backup")]
    received: list[Event] = []
    subscriber = EventBusSubscriber(addresses, [], received.append, heartbeat_timeout=TIMEOUT)
    subtree: list[Event] = []
    partial = EventBusSubscriber(addresses, ["/fail/odd/"], subtree.append,
                                 heartbeat_timeout=TIMEOUT)  # fmt: skip
    publisher = EventBusPublisher(addresses, producer_id="failover", failover_after=0.3)
    subscriber.startService()
    partial.startService()
    try:
        yield wait_until(lambda: not subscriber.core.syncing, what="subscribed")
        for i in range(2000):
            publisher.publish(f"/fail/{'odd' if i % 2 else 'even'}/", i)
        yield wait_until(lambda: subscriber.last_sequence == 2000, what="before")
        yield wait_until(lambda: subscriber.core.store_id is not None, what="store named")
        yield pair.stop("primary")
        yield wait_until(lambda: backup.pair.state == "active", timeout=15, what="takeover")
        reason = backup.status()["ha"]["changes"][-1]["reason"]
        assert "silent" in reason and "client" in reason
        for i in range(2000, 3000):
            publisher.publish(f"/fail/{'odd' if i % 2 else 'even'}/", i)
        yield wait_until(lambda: subscriber.last_sequence == 3000, timeout=15, what="after")
        yield wait_until(lambda: len(subtree) == 1500, timeout=15, what="subtree after")
        assert [e.sequence for e in received] == list(range(1, 3001))
        assert [e.value() for e in received] == list(range(3000))
        assert log_of(backup) == received
        assert [e.sequence for e in subtree] == list(range(2, 3001, 2))
        assert subscriber.failovers >= 1 and subscriber.core.stats.store_changes == 0
        assert publisher.failovers >= 1
    finally:
        publisher.close()
        yield subscriber.stopService()
        yield partial.stopService()
    assert primary.pair.state == "active"  # it was stopped as the active


@pytest_twisted.inlineCallbacks
def test_a_passive_without_a_client_turning_to_it_stays_passive(pair: Pair) -> Any:
    pair.start("primary")
    backup = pair.start("backup")
    yield wait_until(lambda: formed(pair), what="pair formed")
    yield pair.stop("primary")
    core = backup.pair.core
    reactor = backup.reactor
    yield wait_until(lambda: reactor.seconds() - core.peer_heard > 3 * TIMEOUT, what="silence")
    assert backup.pair.state == "passive"
    # A client's SYNCSTART is a vote: the backup takes over and answers it.
    client = RawPeer.dealer(backup.endpoints["snapshot"])
    try:
        client.send(sync_start_frames((), 0))
        yield wait_until(lambda: backup.pair.state == "active", what="takeover on a vote")
        yield wait_until(lambda: any(m[0] == b"SYNCEND" for m in client.messages), what="answer")
    finally:
        client.close()


@pytest_twisted.inlineCallbacks
def test_an_active_back_from_a_pause_judges_it_before_announcing_or_serving(
    pair: Pair,
) -> Any:
    """After a pause the reactor hands over I/O before it runs timers: the heartbeat and
    a snapshot request that come first must already see the pause (doubt), not serve as
    an active that the peer may have replaced meanwhile."""
    primary = pair.start("primary")
    pair.start("backup")
    yield wait_until(lambda: formed(pair), what="pair formed")
    sent: list[list[bytes]] = []
    publisher = primary.publisher_socket
    real_send = publisher.send_frames

    def recording(frames: list[bytes]) -> bool:
        sent.append(list(frames))
        return bool(real_send(frames))

    publisher.send_frames = recording
    try:
        # What a pause looks like from inside: no timer ran for 5 s.
        primary.pair.core._last_tick -= 5.0
        primary._heartbeat()
        assert primary.pair.state == "doubt"
        assert sent == []
        request = [b"client", *sync_start_frames((), 0)]
        primary._on_snapshot_requests([request])
        assert [held[1] for held in primary.core.held_requests] == [b"client"]
        assert primary.snapshots.streams == set()
    finally:
        publisher.send_frames = real_send
    # The peer answers that it is still passive: active again, and heartbeats resume.
    yield wait_until(lambda: primary.pair.state == "active", what="active again")


@pytest_twisted.inlineCallbacks
def test_the_active_goes_on_alone_and_the_pair_heals(pair: Pair) -> Any:
    primary = pair.start("primary")
    pair.start("backup")
    yield wait_until(lambda: formed(pair), what="pair formed")
    received: list[Event] = []
    subscriber = EventBusSubscriber([pair.address("primary")], [], received.append)
    subscriber.startService()
    publisher = EventBusPublisher(pair.address("primary"), producer_id="alone")
    try:
        yield wait_until(lambda: not subscriber.core.syncing, what="subscribed")
        yield pair.stop("backup")
        for i in range(500):
            publisher.publish("/alone/", i)
        # Held for the passive, then released once the active goes on alone.
        yield wait_until(lambda: len(received) == 500, timeout=10, what="released alone")
        status = primary.status()["ha"]
        assert status["alone"] and status["went_alone"] == 1 and not status["paired"]
        metrics = {m.name: m for m in primary.metrics()}
        assert metrics["eventbus_ha_alone"].samples[0].value == 1
        backup = pair.start("backup")
        for i in range(500, 800):
            publisher.publish("/alone/", i)
        yield wait_until(lambda: formed(pair), timeout=15, what="healed")
        yield wait_until(lambda: backup.store.last_sequence == 800, what="caught up")
        assert log_of(backup) == log_of(primary)
        assert primary.status()["ha"]["healed"] == 1
        # Released once the passive's acknowledgement is back, after it stored them (the
        # last events the primary reads once paired again are held for it).
        yield wait_until(lambda: [e.sequence for e in received][-1:] == [800], what="released")
    finally:
        publisher.close()
        yield subscriber.stopService()


@pytest_twisted.inlineCallbacks
def test_an_active_that_did_not_run_does_not_go_alone_for_acks_it_did_not_read(
    pair: Pair,
) -> Any:
    """The process stops for longer than the alone timeout (a long collection on a loaded
    machine, SIGSTOP) just after the active sent the passive a batch: the ack waits unread.
    The active doubts, hears the passive, and stays paired: it does not blame the passive
    for its own pause (it went alone, and healed, in loaded full runs)."""
    primary = pair.start("primary")
    backup = pair.start("backup")
    yield wait_until(lambda: formed(pair), what="pair formed")
    send = primary.pair.appended

    def then_pause(first: int, fields: Any) -> None:
        send(first, fields)
        primary.pair.appended = send
        assert primary.pair.position > primary.pair.acked  # in flight
        time.sleep(TIMEOUT * 1.5)

    primary.pair.appended = then_pause
    publisher = EventBusPublisher(pair.address("primary"), producer_id="paused")
    try:
        publisher.publish("/paused/", 1)
        yield wait_until(lambda: primary.pair.core.stalls >= 1, what="the pause seen")
        yield wait_until(
            lambda: formed(pair) and primary.pair.acked == 1, timeout=15, what="paired still"
        )
        status = primary.status()["ha"]
        assert status["went_alone"] == 0 and status["healed"] == 0, status
        assert status["stalls"] >= 1 and status["transitions"].get("doubt", 0) >= 1, status
        assert backup.store.last_sequence == 1
    finally:
        publisher.close()


@pytest_twisted.inlineCallbacks
def test_the_old_primary_rejoins_drops_what_it_alone_held_and_becomes_a_backup(
    pair: Pair,
) -> Any:
    primary = pair.start("primary")
    backup = pair.start("backup")
    yield wait_until(lambda: formed(pair), what="pair formed")
    publisher = EventBusPublisher(pair.address("primary"), producer_id="rejoin")
    for i in range(1000):
        publisher.publish("/rejoin/", i)
    yield wait_until(lambda: backup.store.last_sequence == 1000, what="replicated")
    publisher.close()
    yield pair.stop("primary")
    # Events the old active stored but never had acknowledged (what a kill -9 between its
    # commit and the passive's leaves behind): they diverge from the new active's log.
    old = EventStore(pair.root / "primary")
    old.append_fields([(b"/lost/", b"x", b"2026-01-01T00:00:00Z",
                        b"00000000-0000-0000-0000-%012d" % i, msgpack.packb(i))
                       for i in range(7)], 0.0)  # fmt: skip
    old.close()
    yield voted_active(backup, timeout=10, what="takeover")
    publisher = EventBusPublisher(pair.address("backup"), producer_id="rejoin")
    try:
        for i in range(1000, 1500):
            publisher.publish("/rejoin/", i)
        yield wait_until(lambda: backup.store.last_sequence == 1500, what="new active stores")
        rejoined = pair.start("primary")
        yield wait_until(lambda: rejoined.pair.state == "passive", what="rejoined as passive")
        yield wait_until(lambda: backup.pair.paired and rejoined.pair.core.in_sync,
                         timeout=15, what="paired again")  # fmt: skip
        # Its 7 own events, and maybe a few agreed ones just below (marks are 1, 2, 4...
        # apart): those come back from the active.
        assert 7 <= rejoined.pair.truncated <= 14
        # The events only it held come back through the active, under new sequences;
        # those the active already had do not come twice.
        yield wait_until(lambda: backup.store.last_sequence == 1507, what="handed over")
        yield wait_until(lambda: rejoined.store.last_sequence == 1507, what="mirrored")
        assert rejoined.pair.republished == 7
        assert log_of(rejoined) == log_of(backup)
        lost = [e for e in log_of(backup) if e.topic == b"/lost/"]
        assert [e.sequence for e in lost] == list(range(1501, 1508))
        assert len({e.uuid for e in log_of(backup)}) == 1507
        assert rejoined.pair.core.term == backup.pair.core.term == 2
        # And it is a correct backup: it takes over again when needed.
        yield pair.stop("backup")
        yield voted_active(rejoined, timeout=10, what="back")
        assert rejoined.store.last_sequence == 1507 and rejoined.pair.core.term == 3
    finally:
        publisher.close()
    assert primary.store is not None


@pytest_twisted.inlineCallbacks
def test_async_replication_broadcasts_first_and_a_new_active_steps_over_the_window(
    tmp_path: Path,
) -> Any:
    pair = Pair(tmp_path, replication="async", async_window=100)
    try:
        pair.start("primary")
        backup = pair.start("backup")
        yield wait_until(lambda: formed(pair), what="pair formed")
        addresses = [pair.address("primary"), pair.address("backup")]
        received: list[Event] = []
        subscriber = EventBusSubscriber(addresses, [], received.append, heartbeat_timeout=TIMEOUT)
        subscriber.startService()
        publisher = EventBusPublisher(addresses, producer_id="async", failover_after=0.3)
        yield wait_until(lambda: not subscriber.core.syncing, what="subscribed")
        for i in range(300):
            publisher.publish("/async/", i)
        yield wait_until(lambda: subscriber.last_sequence == 300, what="before")
        yield wait_until(lambda: backup.store.last_sequence == 300, what="replicated")
        yield pair.stop("primary")
        yield wait_until(lambda: backup.pair.state == "active", timeout=15, what="takeover")
        for i in range(300, 310):
            publisher.publish("/async/", i)
        yield wait_until(lambda: len(received) == 310, timeout=15, what="after")
        sequences = [e.sequence for e in received]
        assert sequences[:300] == list(range(1, 301))
        # The window the old active might have broadcast ahead is never reused.
        assert sequences[300:] == list(range(401, 411))
        assert backup.store.last_sequence == 410
        publisher.close()
        yield subscriber.stopService()
    finally:
        for server in list(pair.servers.values()):
            yield server.stopService()


@pytest_twisted.inlineCallbacks
def test_publishers_reaching_the_passive_are_forwarded_in_order(pair: Pair) -> Any:
    primary = pair.start("primary")
    pair.start("backup")
    yield wait_until(lambda: formed(pair), what="pair formed")
    publisher = EventBusPublisher(pair.address("backup"), producer_id="via-passive")
    try:
        for i in range(1000):
            publisher.publish("/forward/", i)
        yield wait_until(lambda: primary.store.last_sequence == 1000, what="forwarded")
        assert [e.value() for e in log_of(primary)] == list(range(1000))
        assert pair.servers["backup"].pair.forwarded == 1000
    finally:
        publisher.close()


@pytest_twisted.inlineCallbacks
def test_a_backup_holding_another_log_keeps_it_aside(pair: Pair) -> Any:
    foreign = EventStore(pair.root / "backup")
    foreign.append_fields([(b"/old/", b"x", b"2026-01-01T00:00:00Z",
                            b"00000000-0000-0000-0000-000000000001", msgpack.packb(1))],
                          0.0)  # fmt: skip
    foreign_id = foreign.store_id
    foreign.close()
    primary = pair.start("primary")
    yield voted_active(primary, timeout=30, what="primary active")
    publisher = EventBusPublisher(pair.address("primary"), producer_id="fresh")
    for i in range(10):
        publisher.publish("/fresh/", i)
    yield wait_until(lambda: primary.store.last_sequence == 10, what="stored")
    publisher.close()
    backup = pair.start("backup")
    yield wait_until(lambda: formed(pair), timeout=15, what="pair formed")
    assert backup.store.store_id == primary.store.store_id
    assert log_of(backup) == log_of(primary)
    aside = pair.root / "backup" / f"events.sqlite3.replaced-{foreign_id}"
    assert aside.exists()
    kept = pair.root / "kept"
    kept.mkdir()
    aside.rename(kept / "events.sqlite3")
    store = EventStore(kept)
    try:
        assert [event.topic for event in store.read(0)] == [b"/old/"]
    finally:
        store.close()


@pytest_twisted.inlineCallbacks
def test_garbage_on_the_peer_link_is_dropped_and_counted(pair: Pair) -> Any:
    primary = pair.start("primary")
    backup = pair.start("backup")
    yield wait_until(lambda: formed(pair), what="pair formed")
    rogue = RawPeer(zmq.DEALER, f"tcp://127.0.0.1:{pair.links['backup']}")
    try:
        for frames in ([b"junk"], [b"EBPAIR1", b"EVENTS", b"\xc1"],
                       [b"EBPAIR1", b"NOPE", msgpack.packb(1)],
                       [b"EBPAIR1", b"ACK", msgpack.packb(-5)]):  # fmt: skip
            rogue.send(frames)
        yield wait_until(lambda: sum(backup.pair.drops.counts.values()) >= 4, what="dropped")
        assert formed(pair)
        assert backup.pair.state == "passive" and primary.pair.state == "active"
    finally:
        rogue.close()
