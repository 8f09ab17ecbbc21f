"""The event log's operations a pair needs: events at given sequences, cutting the tail,
stepping over sequences, taking another log's identity, finding event ids."""

from __future__ import annotations

from pathlib import Path

import msgpack
import pytest

from bus.eventbus.codec import EventFields
from bus.eventbus.pair import join_marks
from bus.eventbus.store import EventStore


def fields(n: int) -> EventFields:
    uuid = b"00000000-0000-4000-8000-%012d" % n
    return (b"/t/", b"p", b"2026-01-01T00:00:00Z", uuid, msgpack.packb(n))


def test_events_at_given_sequences_keep_them_and_refuse_going_back(tmp_path: Path) -> None:
    store = EventStore(tmp_path)
    store.append_at([(3, fields(3)), (4, fields(4)), (9, fields(9))], 1.0)
    assert [e.sequence for e in store.read(0)] == [3, 4, 9]
    assert store.last_sequence == 9
    with pytest.raises(ValueError):
        store.append_at([(9, fields(10))], 1.0)
    with pytest.raises(ValueError):
        store.append_at([(12, fields(12)), (11, fields(11))], 1.0)
    assert store.last_sequence == 9 and store.count() == 3
    # The next assigned sequence follows.
    assert store.append_fields([fields(10)], 2.0) == 10
    store.close()


def test_truncating_the_tail_survives_a_reopen(tmp_path: Path) -> None:
    store = EventStore(tmp_path)
    store.append_fields([fields(n) for n in range(1, 11)], 1.0)
    assert store.truncate_after(6) == 4
    assert store.truncate_after(8) == 0  # nothing above 8 any more
    assert store.last_sequence == 6
    assert store.append_fields([fields(99)], 2.0) == 7
    store.close()
    again = EventStore(tmp_path)
    assert again.last_sequence == 7
    assert [e.value() for e in again.read(0)] == [1, 2, 3, 4, 5, 6, 99]
    again.close()


def test_skipping_sequences_survives_a_reopen(tmp_path: Path) -> None:
    store = EventStore(tmp_path)
    store.append_fields([fields(1)], 1.0)
    store.skip_to(100)
    store.skip_to(50)  # never backwards
    assert store.last_sequence == 100
    store.close()
    again = EventStore(tmp_path)
    assert again.last_sequence == 100
    assert again.append_fields([fields(2)], 1.0) == 101
    again.close()


def test_an_empty_log_takes_another_identity_a_full_one_does_not(tmp_path: Path) -> None:
    store = EventStore(tmp_path / "a")
    store.adopt_store_id("0f0f0f0f-0000-4000-8000-000000000000")
    store.close()
    again = EventStore(tmp_path / "a")
    assert again.store_id == "0f0f0f0f-0000-4000-8000-000000000000"
    again.append_fields([fields(1)], 1.0)
    with pytest.raises(ValueError):
        again.adopt_store_id("another")
    again.close()


def test_event_ids_by_sequence_and_by_presence(tmp_path: Path) -> None:
    store = EventStore(tmp_path)
    store.append_fields([fields(n) for n in range(1, 1201)], 1.0)
    found = store.event_ids([1, 600, 1200, 5000])
    assert found == {1: fields(1)[3], 600: fields(600)[3], 1200: fields(1200)[3]}
    wanted = [fields(n)[3] for n in (5, 700, 1100)] + [b"missing"]
    assert store.ids_present(600, wanted) == {fields(700)[3], fields(1100)[3]}
    store.set_meta("ha_term", "7")
    assert store.meta("ha_term") == "7"
    store.close()


def test_join_marks_go_back_in_powers_of_two() -> None:
    assert join_marks(0) == []
    assert join_marks(1) == [1]
    assert join_marks(20) == [20, 19, 18, 16, 12, 4]
    assert len(join_marks(10**9)) <= 48
