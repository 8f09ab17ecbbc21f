"""How a Twisted process should drive nats-py (asyncio): measured, same run.

Three ways publish the same events to a JetStream stream (acknowledged, with a
``Nats-Msg-Id``, in batches as the collector reads them) and then read them back with an
ordered consumer:

- ``asyncio``: nats-py alone on asyncio, no Twisted (the baseline);
- ``thread``: the default Twisted reactor; nats-py on its own asyncio loop in a thread,
  one hop each way per batch (``run_coroutine_threadsafe`` / ``callFromThread``);
- ``asyncioreactor``: Twisted's asyncio reactor for the whole process, nats-py on it.

It prints events/s for each and the ratio to the baseline. Each way runs in its own
process (a reactor is chosen once per process) against one fresh nats-server (R1).

    python bench/nats_loop.py [--events 50000] [--batch 500]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

PAYLOAD = b"x" * 120


async def _publish(url: str, stream: str, events: int, batch: int) -> tuple[Any, Any]:
    import nats

    client = await nats.connect(url)
    js = client.jetstream()
    return client, js


async def _batch(js: Any, subject: str, count: int) -> int:
    acks = await asyncio.gather(
        *(
            js.publish(subject, PAYLOAD, headers={"Nats-Msg-Id": str(uuid.uuid4())})
            for _ in range(count)
        )
    )
    return int(acks[-1].seq)


async def _replay(js: Any, subject: str, events: int) -> float:
    started = time.perf_counter()
    seen = 0
    done = asyncio.get_running_loop().create_future()

    async def got(message: Any) -> None:
        nonlocal seen
        seen += 1
        if seen == events and not done.done():
            done.set_result(None)

    sub = await js.subscribe(subject, cb=got, ordered_consumer=True)
    await done
    await sub.unsubscribe()
    return time.perf_counter() - started


async def _setup(url: str, stream: str) -> None:
    import nats

    client = await nats.connect(url)
    js = client.jetstream()
    await js.add_stream(name=stream, subjects=[f"{stream}.>"])
    await client.close()


def run_asyncio(url: str, stream: str, events: int, batch: int) -> dict[str, float]:
    async def main() -> dict[str, float]:
        client, js = await _publish(url, stream, events, batch)
        subject = f"{stream}.a"
        started = time.perf_counter()
        for _ in range(events // batch):
            await _batch(js, subject, batch)
        publish = time.perf_counter() - started
        replay = await _replay(js, subject, events)
        await client.close()
        return {"publish": events / publish, "replay": events / replay}

    return asyncio.run(main())


def _drive(call: Any, url: str, stream: str, events: int, batch: int) -> dict[str, float]:
    """The same publish and replay, from the installed Twisted reactor, each coroutine
    run through ``call`` (coroutine -> Deferred)."""
    from twisted.internet import defer
    from twisted.internet import reactor as installed

    reactor: Any = installed
    figures: dict[str, float] = {}

    @defer.inlineCallbacks
    def main() -> Any:
        try:
            client, js = yield call(_publish(url, stream, events, batch))
            subject = f"{stream}.a"
            started = time.perf_counter()
            for _ in range(events // batch):
                yield call(_batch(js, subject, batch))
            figures["publish"] = events / (time.perf_counter() - started)
            replay = yield call(_replay(js, subject, events))
            figures["replay"] = events / replay
            yield call(client.close())
        finally:
            reactor.stop()

    reactor.callWhenRunning(main)
    reactor.run()
    return figures


def run_thread(url: str, stream: str, events: int, batch: int) -> dict[str, float]:
    """The product's way when this was measured: an asyncio loop on a thread of its own
    (bench/_asyncloop.py) beside the default reactor."""
    from _asyncloop import AsyncioThread
    from twisted.internet import reactor

    loop = AsyncioThread(reactor, "nats-bench")
    loop.start()
    try:
        return _drive(loop.call, url, stream, events, batch)
    finally:
        loop.stop()


def run_asyncioreactor(url: str, stream: str, events: int, batch: int) -> dict[str, float]:
    from twisted.internet import asyncioreactor

    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    asyncioreactor.install(loop)
    from twisted.internet import defer

    def call(coroutine: Any) -> defer.Deferred[Any]:
        return defer.Deferred.fromFuture(asyncio.ensure_future(coroutine))

    return _drive(call, url, stream, events, batch)


WAYS = {"asyncio": run_asyncio, "thread": run_thread, "asyncioreactor": run_asyncioreactor}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=50_000)
    parser.add_argument("--batch", type=int, default=500)
    parser.add_argument("--way", choices=sorted(WAYS), help=argparse.SUPPRESS)
    parser.add_argument("--url", help=argparse.SUPPRESS)
    parser.add_argument("--stream", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.way:  # one way, in this process
        print(json.dumps(WAYS[args.way](args.url, args.stream, args.events, args.batch)))
        return
    from bus.nats.servers import NatsCluster

    with tempfile.TemporaryDirectory() as directory:
        cluster = NatsCluster(Path(directory), size=1)
        cluster.start()
        try:
            results = {}
            for index, way in enumerate(["asyncio", "thread", "asyncioreactor"]):
                stream = f"BENCH{index}"
                asyncio.run(_setup(cluster.urls[0], stream))
                out = subprocess.run(
                    [
                        sys.executable,
                        __file__,
                        "--way",
                        way,
                        "--url",
                        cluster.urls[0],
                        "--stream",
                        stream,
                        "--events",
                        str(args.events),
                        "--batch",
                        str(args.batch),
                    ],
                    check=True,
                    capture_output=True,
                    text=True,
                ).stdout
                results[way] = json.loads(out.strip().splitlines()[-1])
        finally:
            cluster.stop()
    base = results["asyncio"]
    print(f"{args.events} events of {len(PAYLOAD)} bytes, batches of {args.batch}, R1 stream")
    for way, figures in results.items():
        print(
            f"{way:15} publish {figures['publish']:9.0f}/s ({figures['publish'] / base['publish']:.2f}x)"
            f"   replay {figures['replay']:9.0f}/s ({figures['replay'] / base['replay']:.2f}x)"
        )


if __name__ == "__main__":
    main()
