"""A replicated stream for tests that kill nats-servers under a reader: made as the
front-ends make theirs, filled as they fill it (through nats-py, a client independent of
the product's), its leader moved to the server a test means to kill."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Sequence
from typing import Any

from bus.eventbus import subjects
from bus.eventbus.codec import Event
from bus.nats.servers import NatsCluster


def make_stream(
    urls: Sequence[str], name: str = "EVENTBUS", replicas: int = 3, **config: Any
) -> None:
    """Stream ``name`` (subjects ``<name lowercased>.>``, more of its ``config`` as
    nats-py names it), once the cluster elected its meta leader."""
    import nats as nats_py
    from nats.js.api import StreamConfig

    async def go() -> None:
        nc = await nats_py.connect(servers=list(urls))
        try:
            js = nc.jetstream()
            made = StreamConfig(
                name=name, subjects=[f"{name.lower()}.>"], num_replicas=replicas, **config
            )
            deadline = time.monotonic() + 60
            while True:
                try:
                    await js.add_stream(made)
                    return
                except Exception:
                    if time.monotonic() > deadline:
                        raise
                    await asyncio.sleep(0.2)
        finally:
            await nc.close()

    asyncio.run(go())


def publish(
    urls: Sequence[str], batch: Sequence[Event], prefix: str = "eventbus", stream: str = "EVENTBUS"
) -> None:
    """Append events as a front-end does (its body, its subjects, the uuid as
    ``Nats-Msg-Id``), in order, each at the stream sequence its ``sequence`` names (the
    batch contiguous, its first right after what ``stream`` holds): through an election,
    the stream stores each event once, in order. Each message says the sequence it must
    follow (``Nats-Expected-Last-Sequence``), as a front-end's batches do, so that none sent
    after one the stream lost is stored before it; after a failure, the events above what
    the stream holds are sent again."""
    import nats as nats_py

    from bus.eventbus.stream_read import encode

    async def go() -> None:
        nc = await nats_py.connect(
            servers=list(urls), reconnect_time_wait=0.1, max_reconnect_attempts=-1
        )
        js = nc.jetstream(timeout=5)
        first = batch[0].sequence if batch else 0
        position = 0  # batch[:position] is stored
        deadline = time.monotonic() + 120
        while position < len(batch):
            chunk = batch[position : position + 1000]
            try:
                futures = [
                    await js.publish_async(
                        subjects.subject(prefix, e.topic),
                        encode((e.topic, e.producer, e.timestamp, e.uuid, e.data)),
                        headers={
                            "Nats-Msg-Id": e.uuid.decode(),
                            "Nats-Expected-Last-Sequence": str(e.sequence - 1),
                        },
                    )
                    for e in chunk
                ]
                acks = await asyncio.wait_for(asyncio.gather(*futures, return_exceptions=True), 10)
                failed = next((a for a in acks if isinstance(a, BaseException)), None)
                if failed is not None:
                    raise failed
                position += len(chunk)
                deadline = time.monotonic() + 120
            except Exception:
                if time.monotonic() > deadline:
                    raise
                await asyncio.sleep(0.2)
                try:  # on from what the stream holds (some of the chunk may be in it)
                    held = (await js.stream_info(stream)).state.last_seq
                except Exception:
                    continue  # asked again after the next try
                position = min(max(position, held - first + 1), len(batch))
        await nc.close()

    asyncio.run(go())


def stream_info(url: str, name: str) -> dict[str, Any]:
    from bus.nats import jsapi
    from bus.nats.blocking import Connection

    with Connection([url]) as connection:
        return jsapi.answer(connection.request(jsapi.stream_info(name), b"").payload)


def lead(cluster: NatsCluster, node: str, name: str = "EVENTBUS") -> None:
    """Move the stream's leadership to ``node`` (killing it then makes the cluster elect
    another: the slow case)."""
    from bus.nats.blocking import Connection

    preferred = json.dumps({"placement": {"preferred": node}}).encode()
    deadline = time.monotonic() + 60
    while (stream_info(cluster.urls[0], name).get("cluster") or {}).get("leader") != node:
        if time.monotonic() > deadline:
            raise AssertionError(f"{node} did not become stream {name}'s leader")
        with Connection(cluster.urls) as connection:
            connection.request(f"$JS.API.STREAM.LEADER.STEPDOWN.{name}", preferred, timeout=10)
        time.sleep(0.2)  # polled: the new leader is known a moment after it answered


def leaders(
    urls: Sequence[str],
    streams: Sequence[str] = (),
    consumers: Sequence[tuple[str, str]] = (),
    within: float = 30.0,
) -> dict[str, str]:
    """The server leading each of ``streams`` and ``consumers`` (``(stream, name)``), as
    JetStream's API says (``cluster.leader`` of STREAM.INFO and CONSUMER.INFO), keyed
    ``stream NAME`` and ``consumer STREAM/NAME``; one with no leader yet (an election under
    way) or unanswered is asked again, for up to ``within`` seconds."""
    from bus.nats import jsapi
    from bus.nats.blocking import Connection

    asks = {f"stream {name}": jsapi.stream_info(name) for name in streams}
    asks.update({f"consumer {s}/{c}": f"{jsapi.API}.CONSUMER.INFO.{s}.{c}" for s, c in consumers})
    found: dict[str, str] = {}
    deadline = time.monotonic() + within
    with Connection(urls) as connection:
        while True:
            for key, subject in asks.items():
                if key in found:
                    continue
                try:
                    info = jsapi.answer(connection.request(subject, b"", timeout=5).payload)
                except (TimeoutError, jsapi.JetStreamError):
                    continue
                leader = (info.get("cluster") or {}).get("leader")
                if leader:
                    found[key] = leader
            if len(found) == len(asks):
                return found
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"no leader within {within}s: {sorted(set(asks) - set(found))}"
                )
            time.sleep(0.2)  # an election takes seconds: asked again five times a second
