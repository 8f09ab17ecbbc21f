"""The ``eventbus`` source over a replicated stream (R3, three real nats-servers) rides
through the loss of a server: the first listed nats-server is killed (kill -9) while an
``availableNow`` query and while a streaming query read, the two others holding the
quorum. Both queries go on through another server and land every published event in
their Parquet sink exactly once."""

from __future__ import annotations

import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from bus.nats.servers import NatsCluster
from bus.spark.synthetic import events
from tests.jetstream_helpers import lead, make_stream, publish
from tests.ports import nats_cluster

from .helpers import end_seq, wait_for

pytest.importorskip("nats")
pytestmark = pytest.mark.spark


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[NatsCluster]:
    """Three nats-servers and stream EVENTBUS (R3), as front-ends would make it, led by
    n1: its loss makes the cluster elect a leader (4-9 s), the case that takes longest."""
    nodes = nats_cluster(tmp_path / "nats", size=3)
    nodes.start()
    try:
        make_stream(nodes.urls)
        lead(nodes, "n1")
        yield nodes
    finally:
        nodes.stop()


def landed(spark: Any, path: Path) -> list[tuple[int, str]]:
    rows = spark.read.parquet(str(path)).select("seq", "event_id").collect()
    return sorted((r["seq"], r["event_id"]) for r in rows)


def exactly(first: int, count: int) -> list[tuple[int, str]]:
    """What the sink must hold: each event once, at the sequence it was appended at."""
    return [(e.sequence, e.uuid.decode()) for e in events(first, count)]


def reader(spark: Any, cluster: NatsCluster) -> Any:
    return (
        spark.readStream.format("eventbus")
        .option("nats", ",".join(cluster.urls))  # n1, the one killed, first
        .option("startingOffsets", "earliest")
        .option("maxEventsPerTrigger", "1000")
        .option("minPartitions", "2")
    )


def kill_first_once_a_batch_landed(cluster: NatsCluster, query: Any) -> int:
    """Kill n1, the stream's leader, once the query reported a batch (the cluster
    elects another leader); how many batches the query had reported."""
    wait_for(
        lambda: any(p["numInputRows"] for p in query.recentProgress) or not query.isActive,
        timeout=120,
        what="a first micro-batch",
    )
    assert query.isActive, query.exception()
    done = len(query.recentProgress)
    cluster.kill(cluster.nodes[0], signal.SIGKILL)
    return done


def into_parquet(events: Any, workdir: Path, **trigger: Any) -> Any:
    """A query landing ``events`` in WORKDIR/data (checkpoint WORKDIR/checkpoint)."""
    return (
        events.writeStream.format("parquet")
        .option("path", str(workdir / "data"))
        .option("checkpointLocation", str(workdir / "checkpoint"))
        .trigger(**trigger)
        .start()
    )


def test_an_available_now_query_reads_on_when_the_first_server_is_killed(
    spark: Any, cluster: NatsCluster, workdir: Path
) -> None:
    publish(cluster.urls, list(events(1, 6000)))
    query = into_parquet(reader(spark, cluster).load(), workdir, availableNow=True)
    before = kill_first_once_a_batch_landed(cluster, query)
    query.awaitTermination(300)  # raises what ended the query
    assert not query.isActive
    assert before < 6, "the kill came while the query had batches to read"
    assert end_seq(query) == 6000
    assert landed(spark, workdir / "data") == exactly(1, 6000)


def test_a_streaming_query_reads_on_when_the_first_server_is_killed(
    spark: Any, cluster: NatsCluster, workdir: Path
) -> None:
    publish(cluster.urls, list(events(1, 3000)))
    query = into_parquet(reader(spark, cluster).load(), workdir, processingTime="200 milliseconds")
    try:
        kill_first_once_a_batch_landed(cluster, query)
        # Published while the cluster elects anew, through the servers left.
        publish(cluster.urls[1:], list(events(3001, 2000)))

        def caught_up() -> bool:
            if not query.isActive:
                raise AssertionError(f"the query ended: {query.exception()}")
            return end_seq(query) == 5000

        wait_for(caught_up, timeout=300, what="the query at sequence 5000")
    finally:
        query.stop()
    assert landed(spark, workdir / "data") == exactly(1, 5000)
