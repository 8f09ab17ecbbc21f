"""``eventbus-cli import-log``: a SQLite server's log into a new JetStream stream, every
sequence kept, through real processes.

A SQLite ``twistd -n eventbus`` with retention (the newest 120 events, the latest per
topic) takes events; ``eventbus-cli tail --cursor`` follows it, then is stopped; more
events come, retention leaves a leading gap and holes inside; the server is stopped and
its log imported into a real nats-server. A front-end on the stream serves the old
server's store id and the same snapshot; the subscriber, started again on the front-end
with its cursor, gets exactly what the log holds above its cursor, then the front-end's
new events: no hole, no repeat. An import is refused while the server runs and into a
stream that holds events; an import interrupted by Ctrl-C leaves the stream marked (a
front-end refuses it) and ``--resume`` finishes it."""

from __future__ import annotations

import itertools
import json
import signal
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
import pytest_twisted
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from twisted.internet import defer, reactor, task

from bus.eventbus import codec
from bus.eventbus.codec import SnapshotEnd
from bus.eventbus.config import JetStreamSettings
from bus.eventbus.store import EventStore, LogExport, Retention
from bus.nats.servers import NatsCluster
from bus.testing import RawPeer, wait_until
from tests.jetstream_helpers import stream_info
from tests.ports import free_ports
from tests.processes import CommandProcess, ServerProcess, ended, reported

pytest.importorskip("nats")

RETENTION = ("--retention-latest-per-topic", "--retention-max-count", "120")


class Cli(CommandProcess):
    """eventbus-cli in a child process."""

    program = "eventbus-cli"


def cli(cleanup: list[Any], *args: str) -> Cli:
    """eventbus-cli ``args`` in a child process, closed after the test."""
    made = Cli(*args)
    cleanup.append(made)
    return made


def topic(i: int) -> str:
    """Even events share ten topics (compaction leaves holes), odd ones have their own."""
    return f"/t/{i % 10}/" if i % 2 == 0 else f"/u/{i}/"


def snapshot(address: str) -> defer.Deferred[list[tuple[Any, ...]]]:
    """Every event the server at ``address`` holds, read with a raw SYNCSTART."""
    peer = RawPeer.dealer(f"tcp://{address}")
    peer.send([codec.SYNCSTART, b"", codec.SEQUENCE.pack(0)])

    def ended() -> bool:
        return bool(peer.messages) and peer.messages[-1][0] == codec.SYNCEND

    def read(_: object) -> list[tuple[Any, ...]]:
        replies = [codec.parse_snapshot_reply(m) for m in peer.messages]
        return [tuple(e) for e in replies if not isinstance(e, SnapshotEnd)]

    waited = wait_until(ended, timeout=60, what=f"a snapshot from {address}")
    return waited.addCallback(read).addBoth(lambda result: (peer.close(), result)[1])


def settled(events: list[tuple[Any, ...]]) -> bool:
    """Retention has done its work: at most 120 events, one per topic."""
    topics = [event[0] for event in events]
    return len(events) <= 120 and len(set(topics)) == len(topics)


def cli_events(cli: Cli) -> list[dict[str, Any]]:
    return [json.loads(line) for line in cli.out.splitlines() if line.startswith("{")]


@pytest_twisted.inlineCallbacks
def test_a_cursor_from_the_sqlite_server_resumes_at_a_front_end_of_the_imported_stream(
    nats_server: NatsCluster, tmp_path: Path, cleanup: list[Any]
) -> Any:
    from bus.eventbus.confirmed import ConfirmedPublisher

    old_dir, cursor = tmp_path / "old", tmp_path / "cursor"
    old = ServerProcess(
        old_dir, "--services", "eventbus", *RETENTION, "--retention-interval", "0.2s",
        port=free_ports(3),
    )  # fmt: skip
    front = publisher = None
    try:
        yield reported(old.ready, what="the SQLite server")
        address = old.address
        store_id = old.status()["store_id"]
        publisher = ConfirmedPublisher(address, "import-test", resend=False)
        publisher.startService()
        first = yield defer.gatherResults([publisher.publish(topic(i), i) for i in range(150)])
        assert first == list(range(1, 151))

        # A subscriber follows the server, and stops: its cursor names the log and a place.
        tail = cli(cleanup, "tail", "--server", address, "--cursor", str(cursor))
        yield reported(
            lambda: any(e["seq"] == 150 for e in cli_events(tail)), tail.process,
            what="the subscriber at 150",
        )  # fmt: skip
        yield reported(
            lambda: cursor.exists() and len(cursor.read_text().split()) == 2, tail.process,
            what="the cursor naming the log (once a heartbeat did)",
        )  # fmt: skip
        tail.process.send_signal(signal.SIGINT)
        assert (yield tail.ended()) == 130, tail.err
        at, named = cursor.read_text().split()
        assert (int(at), named) == (150, store_id)

        second = yield defer.gatherResults(
            [publisher.publish(topic(i), i) for i in range(150, 300)]
        )
        assert second == list(range(151, 301))
        yield publisher.stopService()
        publisher = None
        # Retention's passes (every 0.2 s) are done when the log holds what they keep.
        deadline = time.monotonic() + 60
        while not settled(held := (yield snapshot(address))):
            assert time.monotonic() < deadline, f"retention left {len(held)} events"
            yield task.deferLater(reactor, 0.2, lambda: None)
        sequences = [event[1] for event in held]
        assert sequences[0] > 1  # a gap at the start
        assert sequences[-1] == 300
        assert len(sequences) < sequences[-1] - sequences[0] + 1  # holes inside
        assert any(s > 150 for s in set(range(151, 301)) - set(sequences))  # some past the cursor

        # While the server runs, its log is not imported.
        busy = cli(cleanup, "import-log", "--data-dir", str(old_dir), "--nats", nats_server.urls[0])
        assert (yield busy.ended()) == 1
        assert "open in another process" in busy.err and "Traceback" not in busy.err

        ground = cli(cleanup, "snapshot", "--server", address)
        assert (yield ground.ended()) == 0, ground.err
        truth = cli_events(ground)
        assert [e["seq"] for e in truth] == sequences
        assert old.stop() in (0, -signal.SIGTERM)

        # The import: the limits from the server's status.json (as it last ran).
        imported = cli(
            cleanup, "import-log", "--data-dir", str(old_dir), "--nats", nats_server.urls[0]
        )
        assert (yield imported.ended()) == 0, imported.err
        [done] = imported.lines()
        assert done["store_id"] == store_id
        assert (done["first_sequence"], done["last_sequence"]) == (sequences[0], 300)
        assert done["events"] == done["held"] == len(sequences)
        assert done["atomic_batches"] is False  # one replica: a message at a time
        assert done["holes"] == 300 - sequences[0] + 1 - len(sequences)
        assert "--retention-max-count 120 --retention-latest-per-topic" in imported.err
        info = stream_info(nats_server.urls[0], "EVENTBUS")
        assert info["state"]["first_seq"] == sequences[0] and info["state"]["last_seq"] == 300
        assert info["config"]["max_msgs"] == 120 and info["config"]["max_msgs_per_subject"] == 1

        again = cli(
            cleanup, "import-log", "--data-dir", str(old_dir), "--nats", nats_server.urls[0]
        )
        assert (yield again.ended()) == 1
        assert "already holds events" in again.err and "Traceback" not in again.err

        front = ServerProcess(
            tmp_path / "front", "--services", "eventbus", "--store", "jetstream",
            "--nats", nats_server.urls[0], *RETENTION, port=free_ports(3),
        )  # fmt: skip
        yield reported(front.ready, what="the front-end")
        assert front.status()["store_id"] == store_id
        served = cli(cleanup, "snapshot", "--server", front.address)
        assert (yield served.ended()) == 0, served.err
        assert cli_events(served) == truth

        # The subscriber resumes at the front-end from its cursor.
        resumed = cli(cleanup, "tail", "--server", front.address, "--cursor", str(cursor))
        above = [e for e in truth if e["seq"] > 150]
        try:
            yield reported(
                lambda: len(cli_events(resumed)) >= len(above), resumed.process,
                what="the subscriber's catch-up",
            )  # fmt: skip
        except Exception as error:
            got = [e["seq"] for e in cli_events(resumed)]
            want = [e["seq"] for e in above]
            raise AssertionError(
                f"{error}: the subscriber printed {got}, owed {want}; it said: {resumed.err}; "
                f"the front-end's log: {front.output()[-4000:]}"
            ) from None
        new = cli(cleanup, "publish", "--server", front.address, "/after/import/", '"new"')
        assert (yield new.ended()) == 0, new.err
        assert new.lines()[0]["seq"] == 301
        yield reported(
            lambda: any(e["seq"] == 301 for e in cli_events(resumed)), resumed.process,
            what="the new event at the subscriber",
        )  # fmt: skip
        resumed.process.send_signal(signal.SIGINT)
        assert (yield resumed.ended()) == 130, resumed.err
        got = cli_events(resumed)
        assert got[: len(above)] == above
        assert [e["seq"] for e in got] == [e["seq"] for e in above] + [301]
        assert cursor.read_text().split() == ["301", store_id]
    finally:
        if publisher is not None:
            yield publisher.stopService()
        if front is not None:
            front.stop()
        if old.process.poll() is None:
            old.stop()


def large_log(directory: Path, count: int) -> LogExport:
    """A log of ``count`` events with holes (every 1000th sequence compacted away) and a
    gap at its start, written by the server's own store."""
    store = EventStore(directory)
    for start in range(0, count, 1000):
        batch = [
            (b"/bulk/%d/" % (i % 50), b"bulk", b"2026-11-28T10:00:00Z",
             str(uuid.uuid4()).encode(), b"x" * 100)
            for i in range(start, start + 1000)
        ]  # fmt: skip
        store.append_fields(batch, time.time())
    store._delete_sequences([s for s in range(1, count + 1) if s % 1000 == 7 or s < 5])
    store.close()
    return LogExport(directory)


@pytest_twisted.inlineCallbacks
def test_an_interrupted_import_leaves_the_stream_refused_and_resume_finishes_it(
    nats_server: NatsCluster, tmp_path: Path, cleanup: list[Any]
) -> Any:
    data = tmp_path / "bus"
    log = large_log(data, 150_000)
    expected = (log.count, log.first_sequence, log.last_sequence)
    log.close()
    url = nats_server.urls[0]
    importing = cli(cleanup, "import-log", "--data-dir", str(data), "--nats", url)

    def written() -> bool:
        try:
            return int(stream_info(url, "EVENTBUS")["state"]["last_seq"]) > 1000
        except Exception:  # not made yet
            return False

    yield reported(written, importing.process, what="the import under way")
    importing.process.send_signal(signal.SIGINT)
    assert (yield importing.ended()) == 130, importing.err
    said = [text for text in importing.err.splitlines() if "interrupted after" in text]
    assert len(said) == 1, importing.err
    [line] = said
    assert line.startswith("eventbus-cli import-log: interrupted after ")
    assert "--resume goes on" in line and "Traceback" not in importing.err
    state = stream_info(url, "EVENTBUS")
    stopped_at = int(state["state"]["last_seq"])
    assert stopped_at < expected[2]
    assert "bus_importing" in state["config"]["metadata"]

    # A front-end does not serve a stream half imported.
    refused = ServerProcess(
        tmp_path / "front", "--services", "eventbus", "--store", "jetstream", "--nats", url,
        port=free_ports(3),
    )  # fmt: skip
    code = yield ended(refused.process, 0, "the refused front-end")
    refused.log.close()
    assert code != 0
    assert "is being imported into" in refused.output()
    # Nor does the same import go on without being asked to.
    plain = cli(cleanup, "import-log", "--data-dir", str(data), "--nats", url)
    assert (yield plain.ended()) == 1 and "--resume goes on" in plain.err

    resumed = cli(cleanup, "import-log", "--data-dir", str(data), "--nats", url, "--resume")
    assert (yield resumed.ended()) == 0, resumed.err
    [done] = resumed.lines()
    assert done["resumed"] is True and done["held"] == expected[0]
    assert done["events"] + done["holes"] == expected[2] - stopped_at
    info = stream_info(url, "EVENTBUS")
    assert (info["state"]["messages"], info["state"]["first_seq"], info["state"]["last_seq"]) == (
        expected
    )
    assert "bus_importing" not in info["config"]["metadata"]


# -- the sequence mapping, through a real nats-server ------------------------------------------


#: Each example's stream and subjects are its own (two streams cannot share subjects).
_STREAMS = itertools.count(1)


@st.composite
def logs(draw: Any) -> tuple[list[int], int]:
    """Held sequences (sorted, any holes, any start) and the last assigned (at or above)."""
    held = sorted(draw(st.sets(st.integers(1, 400), max_size=60)))
    last = draw(st.integers(held[-1] if held else 0, (held[-1] if held else 0) + 30))
    return held, last


@settings(
    max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(shape=logs())
def test_any_log_keeps_its_sequences_in_the_stream(
    nats_server: NatsCluster, tmp_path_factory: Any, shape: tuple[list[int], int]
) -> None:
    from bus.eventbus.migrate import LogImport
    from bus.eventbus.stream_read import RangeReader

    held, last = shape
    n = next(_STREAMS)
    directory = tmp_path_factory.mktemp("log")
    store = EventStore(directory)
    top = max(held[-1] if held else 0, last)
    rows = [(s, (b"/k/%d/" % (s % 7), b"p", b"t", b"u-%d" % (s % 5), b"d%d" % s)) for s in held]
    store.append_at(rows, time.time())  # a uuid repeats: SQLite keeps each copy
    store.skip_to(top)
    store.close()
    log = LogExport(directory)
    stream = JetStreamSettings(
        tuple(nats_server.urls), stream=f"S{n}", subject_prefix=f"p{n}", ack_timeout=10.0
    )
    try:
        done = LogImport(log, stream, Retention()).run()
    finally:
        log.close()
    first = held[0] if held else top + 1
    assert (done.first_sequence, done.last_sequence, done.held) == (first, top, len(held))
    state = stream_info(nats_server.urls[0], stream.stream)["state"]
    assert (state["first_seq"], state["last_seq"], state["messages"]) == (first, top, len(held))
    if held:
        reader = RangeReader(stream, 0, top).open()
        got = []
        try:
            while batch := reader.next_events(1000):
                got += batch.rows()
        finally:
            reader.close()
        assert got == [(s, *fields) for s, fields in rows]


def test_another_writer_during_the_import_ends_it(nats_server: NatsCluster, tmp_path: Path) -> None:
    from bus.eventbus.migrate import ImportRefused, LogImport
    from bus.nats.blocking import Connection

    log = large_log(tmp_path / "bus", 20_000)
    stream = JetStreamSettings(tuple(nats_server.urls), ack_timeout=10.0)
    other = Connection(nats_server.urls)
    wrote: list[int] = []

    def stored(sequence: int) -> None:
        # A front-end appending to the stream (one that ignored the import's mark).
        if sequence > 2000 and not wrote:
            answer = other.request("eventbus.~.someone.~", b"\x94\xc4\x00\xc4\x00\xc4\x00\xc4\x00")
            wrote.append(int(json.loads(answer.payload)["seq"]))

    try:
        with pytest.raises(ImportRefused) as refused:
            LogImport(log, stream, Retention(), stored=stored).run()
    finally:
        log.close()
        other.close()
    assert wrote
    assert f"holds at sequence {wrote[0]} eventbus.~.someone.~" in str(refused.value)
    assert "another writer appended to it" in str(refused.value)
    info = stream_info(nats_server.urls[0], "EVENTBUS")
    assert "bus_importing" in info["config"]["metadata"]  # never served as the log


def test_an_import_whose_connection_is_lost_part_way_finishes_on_a_new_one(
    nats_server: NatsCluster, tmp_path: Path
) -> None:
    """The import's connection goes down while it writes (as when the stream had no
    leader yet and the import dropped it): the import connects again, goes on from what
    the stream holds and finishes on the new connection (the first one, closed, once
    ended a whole import with "not connected")."""
    from bus.eventbus.migrate import LogImport

    log = large_log(tmp_path / "bus", 20_000)
    rows = log.rows(0, 30_000)
    stream = JetStreamSettings(tuple(nats_server.urls), stream="LOST", subject_prefix="lost")
    said: list[str] = []
    cut: list[int] = []
    job: LogImport

    def stored(sequence: int) -> None:
        if sequence > 2000 and not cut and job._connection is not None:
            cut.append(sequence)
            job._connection.shutdown()  # the socket goes down under the writer

    job = LogImport(log, stream, Retention(), stored=stored, say=said.append)
    try:
        done = job.run()
    finally:
        log.close()
    assert cut and any("going on from what it holds" in line for line in said), said
    assert not done.interrupted and done.held == len(rows)
    info = stream_info(nats_server.urls[0], "LOST")
    assert "bus_importing" not in (info["config"].get("metadata") or {})  # finished
    assert (info["state"]["first_seq"], info["state"]["last_seq"]) == (rows[0][0], rows[-1][0])
    assert info["state"]["messages"] == len(rows)


@settings(max_examples=300, deadline=None)
@given(
    held=st.sets(st.integers(1, 200), max_size=80),
    beyond=st.integers(0, 20),
    after=st.integers(0, 220),
    chunk=st.integers(1, 9),
)
def test_placements_give_each_sequence_once_with_the_logs_event_or_a_hole(
    held: set[int], beyond: int, after: int, chunk: int
) -> None:
    """The mapping alone, as a stream would take it (each message the next sequence),
    read in chunks of any size: after the placeholders are purged, the stream holds the
    log's events above ``after`` at their sequences, and its last is the log's last."""
    from bus.eventbus.migrate import placements

    rows = [(s, b"/t/", b"p", b"ts", b"u%d" % s, b"d") for s in sorted(held)]
    last = max(held, default=0) + beyond

    def read(above: int, limit: int) -> list[tuple[Any, ...]]:
        return [row for row in rows if row[0] > above][:limit]

    stream: dict[int, Any] = {}
    last_seq = after
    for sequence, row in placements(read, after, last, chunk):
        assert sequence == last_seq + 1  # stored right after the one before
        last_seq = sequence
        stream[sequence] = row
    purged = {s: row for s, row in stream.items() if row is not None}
    assert last_seq == max(last, after)
    assert purged == {row[0]: row for row in rows if after < row[0] <= last}


@pytest_twisted.inlineCallbacks
def test_an_import_into_a_replicated_stream_goes_in_atomic_batches(
    tmp_path: Path, cleanup: list[Any]
) -> Any:
    from bus.eventbus.stream_read import RangeReader
    from tests.ports import nats_cluster

    cluster = nats_cluster(tmp_path / "nats", size=3)
    cluster.start()
    try:
        log = large_log(tmp_path / "bus", 5000)
        rows = log.rows(0, 10_000)
        last = log.last_sequence
        log.close()
        urls = ",".join(cluster.urls)
        imported = cli(
            cleanup, "import-log", "--data-dir", str(tmp_path / "bus"), "--nats", urls,
            "--nats-replicas", "3", "--retention-max-count", "100000",
        )  # fmt: skip
        assert (yield imported.ended()) == 0, imported.err
        assert imported.lines()[0]["atomic_batches"] is True  # as front-ends append there
        info = stream_info(cluster.urls[0], "EVENTBUS")
        assert info["config"]["num_replicas"] == 3 and info["config"]["max_msgs"] == 100_000
        assert (info["state"]["first_seq"], info["state"]["last_seq"]) == (rows[0][0], last)
        stream = JetStreamSettings(tuple(cluster.urls), replicas=3)
        reader = RangeReader(stream, 0, last).open()
        got = []
        try:
            while batch := reader.next_events(1000):
                got += batch.rows()
        finally:
            reader.close()
        if got != rows:  # said in a few lines, not as two lists of 5000 rows
            owed, given = [row[0] for row in rows], [row[0] for row in got]
            wrong = [(a, b) for a, b in zip(got, rows, strict=False) if a != b][:3]
            raise AssertionError(
                f"the reader gave {len(got)} rows for {len(rows)}: missing "
                f"{sorted(set(owed) - set(given))[:20]}, not owed "
                f"{sorted(set(given) - set(owed))[:20]}, first differing {wrong}; it left "
                f"out {reader.skipped} messages naming no topic, its replica was behind "
                f"{reader.take_behind()} times"
            )
    finally:
        cluster.stop()
