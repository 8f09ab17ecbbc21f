"""Bus -> bridge -> journal -> PySpark, for real: events published on a running bus are
counted exactly by Spark, through a lossy PUB feed and a bridge restart mid-stream."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import pytest_twisted

from bus.eventbus.client import EventBusPublisher
from bus.spark.bridge import SparkBridgeService
from bus.spark.config import BridgeConfig
from bus.spark.journal import JournalReader
from bus.testing import start_bus, wait_until

pytestmark = pytest.mark.spark

TOTAL = 30_000  # six bursts of 5000, each more than the PUB queue holds
TOPICS = ["/orders/eu/", "/orders/us/", "/users/", "/metrics/cpu/", "/metrics/disk/"]


def latest(directory: Path) -> int:
    return (JournalReader(directory).latest_sequence() or 0) if directory.exists() else 0


@pytest_twisted.inlineCallbacks
def test_bus_events_reach_spark_exactly_once(spark: Any, workdir: Path) -> Any:
    # A small PUB queue makes ZeroMQ drop broadcasts under this load: the bridge must heal
    # the holes from the bus's log, and a restart in the middle must neither lose nor repeat.
    server = start_bus(workdir / "bus", publish_hwm=500)
    journal = workdir / "journal"
    address = f"127.0.0.1:{server.port}"

    def bridge() -> SparkBridgeService:
        service = SparkBridgeService(
            [address], BridgeConfig(journal_dir=journal, roll_seconds=0.05)
        )
        service.startService()
        return service

    publisher = EventBusPublisher(address, producer_id="e2e")
    expected: Counter[str] = Counter()
    running = bridge()
    healed = 0
    try:
        for i in range(TOTAL):
            topic = TOPICS[(i * 7 + i // 3) % len(TOPICS)]
            expected[topic] += 1
            publisher.publish(topic, {"i": i, "topic": topic})
            if i % 5000 == 4999:
                yield publisher.flush()
            if i == TOTAL // 2:
                yield wait_until(lambda: latest(journal) > 0, timeout=60)
                healed += running.subscriber.core.stats.healed_events
                yield running.stopService()
                running = bridge()
        yield publisher.flush()
        yield wait_until(lambda: latest(journal) >= TOTAL, timeout=120, what="journal complete")
        healed += running.subscriber.core.stats.healed_events
    finally:
        yield running.stopService()
        publisher.close()
        yield server.stopService()
    assert healed > 0, "no broadcast was lost: healing was not exercised"

    frame = spark.read.format("eventbus").option("path", str(journal)).load()
    counted = {row["topic"]: row["count"] for row in frame.groupBy("topic").count().collect()}
    assert counted == dict(expected)
    assert frame.select("seq").distinct().count() == TOTAL

    # The same through a streaming query that stops once it has read everything.
    stream = (
        spark.readStream.format("eventbus")
        .option("path", str(journal))
        .option("startingOffsets", "earliest")
        .option("maxOffsetsPerTrigger", "12000")
        .load()
        .groupBy("topic")
        .count()
        .writeStream.outputMode("complete")
        .format("memory")
        .queryName("e2e_counts")
        .option("checkpointLocation", str(workdir / "checkpoint"))
        .trigger(availableNow=True)
        .start()
    )
    stream.awaitTermination(timeout=180)
    assert not stream.isActive
    streamed = {row["topic"]: row["count"] for row in spark.table("e2e_counts").collect()}
    assert streamed == dict(expected)
