"""The shared catalog's core (bus.dbp.shared), sans I/O: two instances on one simulated
clock and a simulated bucket (revisions, compare-and-set, every write seen by both)."""

from __future__ import annotations

from typing import Any

from twisted.internet.task import Clock

from bus.dbp import codec
from bus.dbp.core import CatalogSettings
from bus.dbp.shared import NOT_CURRENT, SharedCatalogCore, Write


class Bucket:
    """Keys with revisions; a write with ``expected`` is refused unless the key is there."""

    def __init__(self) -> None:
        self.keys: dict[str, tuple[bytes, int]] = {}
        self.revision = 0
        self.watchers: list[SharedCatalogCore] = []
        self.refused = 0

    def put(self, write: Write) -> int | None:
        now = self.keys.get(write.name, (b"", 0))[1]
        if write.expected is not None and write.expected != now:
            self.refused += 1
            return None
        self.revision += 1
        if write.value is None:
            self.keys.pop(write.name, None)
        else:
            self.keys[write.name] = (write.value, self.revision)
        for core in self.watchers:
            core.apply(write.name, write.value, self.revision)
        return self.revision


def instance(clock: Clock, bucket: Bucket, name: str) -> tuple[SharedCatalogCore, list[Any]]:
    sent: list[Any] = []
    core = SharedCatalogCore(
        CatalogSettings(heartbeat_interval=0.5, liveness=3, grace=10.0, catalog_id=name),
        clock.seconds,
        lambda *_: None,
        lambda *_: None,
        refresh=5.0,
    )
    core.current = True
    bucket.watchers.append(core)
    return core, sent


def flush(core: SharedCatalogCore, bucket: Bucket, sent: list[Any]) -> int:
    """Store what the core asks, answer it; the writes made."""
    writes = core.take_writes()
    for write in writes:
        revision = bucket.put(write)
        reply = (
            core.stored_ok(write, revision)
            if revision is not None
            else core.store_failed(write, "changed")
        )
        if reply is not None:
            sent.append(reply)
    return len(writes)


def register(core: SharedCatalogCore, name: str, heartbeat: float = 1) -> list[list[bytes]]:
    body = {
        "name": name, "address": "127.0.0.1", "port": 7000, "function": "f",
        "heartbeat": heartbeat,
    }  # fmt: skip
    frames = codec.encode(codec.REGISTER, 0.0, [codec.json_frame(body)])
    return core.on_message(b"peer-" + name.encode(), frames)


def info(core: SharedCatalogCore) -> dict[str, Any]:
    [reply] = core.on_message(b"asker", codec.encode(codec.INFO_REQUEST, 0.0, [b""]))
    return codec.json_object(reply[-1])


def test_approved_once_stored_and_heard_beats_cost_a_write_per_refresh() -> None:
    clock, bucket = Clock(), Bucket()
    one, sent_one = instance(clock, bucket, "one")
    two, _ = instance(clock, bucket, "two")
    assert register(one, "sensor") == []  # nothing before the bucket stored it
    assert flush(one, bucket, sent_one) == 1
    assert sent_one[0][2] == codec.APPROVED
    assert info(two)["sensor"]["active"] is True
    writes = 0
    for _ in range(60):  # a minute of beats every second, heard by one
        clock.advance(1.0)
        one.on_udp_heartbeat(codec.encode_udp_heartbeat("sensor", clock.seconds()), "127.0.0.1")
        one.tick()
        two.tick()
        writes += flush(one, bucket, sent_one) + flush(two, bucket, [])
    assert writes == 12  # one per refresh (5 s), none from the instance that does not hear it
    assert info(two)["sensor"]["active"] is True
    # Silent: the holder expires it after 3 beats; written once, seen at the other.
    for _ in range(8):
        clock.advance(0.5)
        one.tick()
        two.tick()
        flush(one, bucket, sent_one)
        flush(two, bucket, [])
    assert "sensor" not in info(two) and two.entries["sensor"].active is False
    assert bucket.refused == 0


def test_a_dead_holder_s_service_expires_at_the_others_by_compare_and_set_once() -> None:
    clock, bucket = Clock(), Bucket()
    one, sent_one = instance(clock, bucket, "one")
    two, _ = instance(clock, bucket, "two")
    three, _ = instance(clock, bucket, "three")
    register(one, "sensor")
    flush(one, bucket, sent_one)
    bucket.watchers.remove(one)  # the holder dies
    expired_at = None
    for step in range(40):
        clock.advance(0.5)
        for core in (two, three):
            core.tick()
        flush(two, bucket, [])
        flush(three, bucket, [])
        if expired_at is None and not two.entries["sensor"].active:
            expired_at = step * 0.5
    # Later than the holder would (3 s): two refreshes and 7 of the catalog's intervals later.
    assert expired_at is not None and expired_at >= 3 + 2 * 5.0 + 7 * 0.5 - 0.5
    assert bucket.refused == 1  # both judged it; the second's compare-and-set lost
    assert not three.entries["sensor"].active


def test_a_service_that_moves_when_its_holder_dies_is_never_seen_expired() -> None:
    # The worst case, at the intervals test_dbp_cluster runs (0.2 s, a 1 s refresh): the
    # holder dies just before it would have written again (its last write a refresh old),
    # the service moves at the client's bound (2 x liveness catalog intervals of silence,
    # judged at its next tick) and its registration at the next instance takes most of a
    # refresh to be stored (a loaded machine). The other instance lists it active throughout.
    clock, bucket = Clock(), Bucket()
    one, two = (
        SharedCatalogCore(
            CatalogSettings(heartbeat_interval=0.2, liveness=3, grace=10.0, catalog_id=name),
            clock.seconds, lambda *_: None, lambda *_: None, refresh=1.0,
        )
        for name in ("one", "two")
    )  # fmt: skip
    for core in (one, two):
        core.current = True
        bucket.watchers.append(core)
    sent: list[Any] = []
    register(one, "sensor", heartbeat=0.2)
    flush(one, bucket, sent)
    last_write = 0.0
    while True:  # beats every 0.2 s, heard by one, which writes once a refresh
        clock.advance(0.2)
        one.on_udp_heartbeat(codec.encode_udp_heartbeat("sensor", clock.seconds()), "127.0.0.1")
        for core in (one, two):
            core.tick()
        if flush(one, bucket, sent):
            last_write = clock.seconds()
        flush(two, bucket, [])
        if last_write > 2.0 and clock.seconds() >= last_write + 0.8:
            break  # its next beat would be written: one dies now
    bucket.watchers.remove(one)
    died = clock.seconds()
    stored_at = died + (2 * 3 + 1) * 0.2 + 0.9
    while clock.seconds() < stored_at:
        clock.advance(0.05)
        two.tick()
        flush(two, bucket, [])
        listed = info(two).get("sensor", {})
        assert listed.get("active") is True, f"not listed {clock.seconds() - died:.2f} s after"
    register(two, "sensor", heartbeat=0.2)
    flush(two, bucket, sent)
    assert sent[-1][2] == codec.APPROVED and info(two)["sensor"]["active"] is True
    assert two.entries["sensor"].holder == "two"


def test_a_view_not_current_answers_no_list_and_a_new_watch_forgets_what_it_did_not_send() -> None:
    clock, bucket = Clock(), Bucket()
    one, sent_one = instance(clock, bucket, "one")
    two, _ = instance(clock, bucket, "two")
    register(one, "gone")
    flush(one, bucket, sent_one)
    two.current = False
    assert info(two) == {"Error": NOT_CURRENT, "unavailable": True}
    # Deleted while two was away: its new watch does not send it.
    bucket.watchers.remove(two)
    bucket.put(Write("gone", None, None))
    two.replay_started()
    two.replay_done()
    two.current = True
    assert info(two) == {}
