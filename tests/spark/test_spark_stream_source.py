"""The ``eventbus`` source over a JetStream-backed bus (option ``nats``), against a real
nats-server: batch and streaming reads, offsets as the stream's sequences, subject
filters, data loss after the stream's retention, and the same rows as the journal
source for the same events. The stream is filled as a front-end fills it (the body and
subjects of :mod:`bus.eventbus.stream_read`); tests/spark/test_spark_cluster.py reads one
that front-end processes filled."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from bus.eventbus import subjects
from bus.eventbus.codec import Event
from bus.nats.servers import NatsCluster
from bus.spark.options import SourceOptions
from bus.spark.source import EventBusStreamReader
from bus.spark.synthetic import events, expected_counts
from tests.ports import nats_cluster

pytest.importorskip("nats")
pytestmark = pytest.mark.spark


@pytest.fixture(scope="module")
def nats(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NatsCluster]:
    node = nats_cluster(tmp_path_factory.mktemp("nats"), size=1)
    node.start()
    yield node
    node.stop()


def fill(
    url: str, batch: Sequence[Event], stream: str = "EVENTBUS", max_msgs: int = -1
) -> list[int]:
    """Append events as a front-end does; the stream's sequences they got."""
    import nats as nats_py
    from nats.js.api import StreamConfig
    from nats.js.errors import NotFoundError

    from bus.eventbus.stream_read import encode

    async def go() -> list[int]:
        nc = await nats_py.connect(url)
        js = nc.jetstream()
        try:
            await js.stream_info(stream)
        except NotFoundError:
            prefix = stream.lower()
            await js.add_stream(
                StreamConfig(name=stream, subjects=[f"{prefix}.>"], max_msgs=max_msgs)
            )
        prefix = (await js.stream_info(stream)).config.subjects[0][:-2]
        sequences: list[int] = []
        for start in range(0, len(batch), 2000):
            futures = [
                await js.publish_async(
                    subjects.subject(prefix, e.topic),
                    encode((e.topic, e.producer, e.timestamp, e.uuid, e.data)),
                    headers={"Nats-Msg-Id": e.uuid.decode()},
                )
                for e in batch[start : start + 2000]
            ]
            sequences += [int(ack.seq) for ack in await asyncio.gather(*futures)]
        await nc.close()
        return sequences

    return asyncio.run(go())


@pytest.fixture(scope="module")
def filled(nats: NatsCluster) -> str:
    """Stream ``BIG`` (prefix ``big``) with 20,000 synthetic events at sequences 1..20000."""
    assert fill(nats.urls[0], list(events(1, 20_000)), stream="BIG") == list(range(1, 20_001))
    return nats.urls[0]


def read(spark: Any, url: str, stream: str = "BIG", **options: str) -> Any:
    reader = (
        spark.read.format("eventbus")
        .option("nats", url)
        .option("stream", stream)
        .option("subjectPrefix", stream.lower())
    )
    for key, value in options.items():
        reader = reader.option(key, value)
    return reader.load()


def topic_counts(frame: Any) -> dict[str, int]:
    return {row["topic"]: row["count"] for row in frame.groupBy("topic").count().collect()}


def test_a_batch_read_holds_every_event_with_the_journal_sources_columns(
    spark: Any, filled: str
) -> None:
    frame = read(spark, filled, minPartitions="4")
    assert frame.rdd.getNumPartitions() == 4
    assert topic_counts(frame) == dict(expected_counts(1, 20_000))
    rows = frame.orderBy("seq").limit(3).collect()
    first = next(iter(events(1, 1)))
    assert [r["seq"] for r in rows] == [1, 2, 3]
    assert rows[0]["topic"] == first.topic.decode()
    assert rows[0]["event_id"] == first.uuid.decode()
    assert rows[0]["payload"] == first.data
    assert rows[0]["producer"] == first.producer.decode()
    assert rows[0]["timestamp"] is not None and rows[0]["received_at"] is not None


def test_offsets_and_subscribe_are_the_streams_sequences_and_subject_filters(
    spark: Any, filled: str
) -> None:
    between = read(spark, filled, startingOffsets='{"seq": 100}', endingOffsets='{"seq": 250}')
    assert [r["seq"] for r in between.orderBy("seq").select("seq").collect()] == list(
        range(101, 251)
    )
    some = read(spark, filled, subscribe="/orders/, /users/login")
    wanted = ("/orders/", "/users/login")
    assert topic_counts(some) == {
        t: n for t, n in expected_counts(1, 20_000).items() if t.startswith(wanted)
    }
    with pytest.raises(Exception, match="beyond stream BIG's latest sequence 20000"):
        read(spark, filled, endingOffsets='{"seq": 20001}').count()


def test_a_streaming_query_lands_every_event_once_in_micro_batches(
    spark: Any, nats: NatsCluster, workdir: Path
) -> None:
    url = nats.urls[0]

    def land(**options: str) -> Any:
        reader = (
            spark.readStream.format("eventbus")
            .option("nats", url)
            .option("stream", "LIVE")
            .option("subjectPrefix", "live")
        )
        for key, value in options.items():
            reader = reader.option(key, value)
        query = (
            reader.load()
            .writeStream.format("parquet")
            .option("path", str(workdir / "data"))
            .option("checkpointLocation", str(workdir / "checkpoint"))
            .trigger(availableNow=True)
            .start()
        )
        query.awaitTermination(120)
        return query

    fill(url, list(events(1, 3000)), stream="LIVE")
    query = land(startingOffsets="earliest", maxEventsPerTrigger="1000")
    sizes = [p["numInputRows"] for p in query.recentProgress if p["numInputRows"]]
    assert sizes == [1000, 1000, 1000]
    # More events, the same checkpoint: only the new ones, once.
    fill(url, list(events(3001, 500)), stream="LIVE")
    land()
    landed = sorted(r["seq"] for r in spark.read.parquet(str(workdir / "data")).collect())
    assert landed == list(range(1, 3501))


def test_what_retention_removed_is_data_loss_naming_the_sequences(
    spark: Any, nats: NatsCluster
) -> None:
    url = nats.urls[0]
    fill(url, list(events(1, 300)), stream="SHORT", max_msgs=100)  # keeps 201..300
    with pytest.raises(Exception, match=r"sequences 11\.\.200 are no longer in stream SHORT"):
        read(spark, url, "SHORT", startingOffsets='{"seq": 10}').count()
    kept = read(spark, url, "SHORT", startingOffsets='{"seq": 10}', failOnDataLoss="false")
    assert sorted(r["seq"] for r in kept.select("seq").collect()) == list(range(201, 301))
    assert read(spark, url, "SHORT").count() == 100  # earliest: what the stream holds


def test_min_events_per_trigger_waits_up_to_max_trigger_delay(nats: NatsCluster) -> None:
    from pyspark.sql.streaming.datasource import ReadAllAvailable

    url = nats.urls[0]
    fill(url, list(events(1, 50)), stream="SLOW")
    now = [100.0]
    options = {
        "nats": url, "stream": "SLOW", "subjectPrefix": "slow", "startingOffsets": "earliest",
        "minEventsPerTrigger": "100", "maxTriggerDelay": "30s",
    }  # fmt: skip
    reader = EventBusStreamReader(SourceOptions.parse(options, streaming=True), lambda: now[0])
    try:
        start = reader.initialOffset()
        assert start == {"seq": 0}
        assert reader.latestOffset(start, ReadAllAvailable()) == {"seq": 0}  # 50 < 100
        now[0] += 29
        assert reader.latestOffset(start, ReadAllAvailable()) == {"seq": 0}
        now[0] += 2  # 31 s after the start: what there is
        assert reader.latestOffset(start, ReadAllAvailable()) == {"seq": 50}
        fill(url, list(events(51, 100)), stream="SLOW")
        assert reader.latestOffset({"seq": 50}, ReadAllAvailable()) == {"seq": 150}
    finally:
        reader.stop()


def test_a_stream_behind_a_password_is_read_with_it_from_a_file_never_shown(
    spark: Any, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """``natsUser`` and ``natsPasswordFile``: the driver and the executors read the file;
    the password is in no option, no plan, no log line."""
    import secrets

    password = "pw-" + secrets.token_hex(8)
    server = nats_cluster(
        tmp_path / "nats",
        size=1,
        extra=f'authorization {{ users: [ {{ user: reader, password: "{password}" }} ] }}',
    )
    server.start()
    try:
        url = server.urls[0]
        fill(url.replace("nats://", f"nats://reader:{password}@"), list(events(1, 500)), "PW")
        secret = tmp_path / "password"
        secret.write_text(password + "\n")
        with caplog.at_level("DEBUG"):
            frame = read(spark, url, "PW", natsUser="reader", natsPasswordFile=str(secret))
            assert frame.count() == 500
            plan = frame._jdf.queryExecution().toString()
        assert password not in plan and password not in caplog.text
        options = SourceOptions.parse(
            {"nats": url, "natsUser": "reader", "natsPasswordFile": str(secret)}, streaming=False
        )
        assert password not in repr(options)
        without = read(spark, url, "PW")
        with pytest.raises(Exception, match="Authorization Violation") as refused:
            without.count()
        assert password not in str(refused.value)
    finally:
        server.stop()


def test_options_name_one_log_and_refuse_nonsense() -> None:
    from bus.spark.options import OptionError

    with pytest.raises(OptionError, match=r'"path" .* or "nats"'):
        SourceOptions.parse({}, streaming=True)
    with pytest.raises(OptionError, match="not both"):
        SourceOptions.parse({"path": "/j", "nats": "nats://h:4222"}, streaming=True)
    with pytest.raises(OptionError, match="maxTriggerDelay goes with minEventsPerTrigger"):
        SourceOptions.parse({"nats": "nats://h:4222", "maxTriggerDelay": "5s"}, streaming=True)
    parsed = SourceOptions.parse(
        {"nats": "nats://a:4222, nats://b:4222", "maxEventsPerTrigger": "10"}, streaming=True
    )
    assert parsed.stream is not None and parsed.stream.servers == (
        "nats://a:4222",
        "nats://b:4222",
    )
    assert parsed.max_offsets_per_trigger == 10
    assert parsed.stream.retry_timeout == 60.0
    for given, seconds in (("90s", 90.0), ("2m", 120.0), ("0", 0.0)):
        options = {"nats": "nats://a:4222", "natsRetryTimeout": given}
        stream = SourceOptions.parse(options, streaming=True).stream
        assert stream is not None and stream.retry_timeout == seconds
    with pytest.raises(OptionError, match="natsRetryTimeout must be a duration"):
        SourceOptions.parse({"nats": "nats://a:4222", "natsRetryTimeout": "soon"}, streaming=True)


def test_an_executor_reading_the_stream_imports_nothing_of_twisted() -> None:
    import subprocess
    import sys

    code = (
        "import sys\n"
        "from bus.spark.options import StreamOptions\n"
        "from bus.spark.stream_source import StreamAccess, _settings\n"
        "import bus.eventbus.stream_read\n"
        "_settings(StreamOptions(('nats://127.0.0.1:1',)))\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] == 'twisted'))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
