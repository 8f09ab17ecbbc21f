"""Instructions per event of the Event BUS collector's own work, counted by valgrind.

On a shared 2-core machine every CPU-time figure moves with what else runs (other work
doubled them on some days); the number of instructions a piece of code executes does not.
Each stage runs the server's own code in one process under ``valgrind --tool=cachegrind``
(instruction counts only, no cache simulation), once with BATCHES batches of 512 PUBs and
once with none; the difference over the events is the stage's instructions per event:

* ``parse``: ``codec.PubParser.parse_batch`` (the collector's checks; known topics,
  producer and timestamp, as in a steady stream);
* ``store``: ``EventStore.append_fields`` of the accepted fields (a WAL database in a
  temporary directory, one transaction a batch);
* ``broadcast``: ``codec.broadcast_messages`` (the BROADCAST frames' lists);
* ``all``: the three in turn, as ``_on_collected`` does;
* ``append``: a JetStream front-end's own work per event on the way to the stream (not in
  ``all``): each event's message (``stream_read.Appends``: subject, uuid, body) and the
  atomic batch's HPUB commands (``jsapi.batch_publishes``); its socket and the
  acknowledgement are not in it;
* ``feed``: the way back, the stream's messages as the log's rows
  (``stream_read.decoded_rows``, as the feed and the snapshots read them) and the
  front-end's broadcasts of them (``StreamCore.committed``).

The sockets' work (the transport's C helper and libzmq) is not in it: ``eventbus_throughput``
measures the whole server. Instructions are not time (a cache miss costs more than an add),
but a change that removes instructions removes their time on any machine, and the count is
the same on a busy machine as on a quiet one: ``bench/ab.py --runs 1`` resolves a few
percent. Baseline, same run: the stages with ``BUS_NATIVE_PUBS=0 BUS_NATIVE_ROWS=0
BUS_NATIVE_NATS=0`` (the Python code alone, where a compiled helper exists).

    python bench/eventbus_instructions.py [--batches 20] [--stages parse,store,broadcast,all,append]
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path
from typing import Any

from _common import HERE, cachegrind_instructions, instruction_args, instruction_summary, machine

BATCH = 512
STAGES = ("parse", "store", "broadcast", "all", "append", "feed")
PYTHON_ONLY = {"BUS_NATIVE_PUBS": "0", "BUS_NATIVE_ROWS": "0", "BUS_NATIVE_NATS": "0"}


def stage(name: str, batches: int) -> None:
    """Run ``name`` on ``batches`` batches in this process (under valgrind, from main())."""
    sys.path.insert(0, str(HERE))
    from _workers import _uuid_format, pubs

    from bus.eventbus import codec
    from bus.eventbus.store import EventStore

    batch = [[b"id-12345", *frames] for frames in pubs(0, BATCH, _uuid_format())]
    parser = codec.PubParser()
    accepted, _ = parser.parse_batch([list(m) for m in batch])  # what a stream repeats: known
    if name in ("append", "feed"):
        front_end(name, batches, accepted)
        return
    with tempfile.TemporaryDirectory(prefix="eventbus-instructions-") as directory:
        store = EventStore(Path(directory) / "store")
        first = 1
        for _ in range(batches):
            if name in ("parse", "all"):
                accepted, _ = parser.parse_batch(batch)
            if name in ("store", "all"):
                first = store.append_fields(accepted, 1.0)
            if name in ("broadcast", "all"):
                codec.broadcast_messages(first, accepted, codec.SequenceEncoding.BINARY)
        store.close()


def front_end(name: str, batches: int, accepted: list[Any]) -> None:
    """The ``append`` or ``feed`` stage (imported here: a revision before them has neither,
    and ``bench/ab.py`` runs this script on it for the other stages)."""
    from twisted.logger import Logger

    from bus.eventbus.stream_core import StreamCore
    from bus.eventbus.stream_read import Appends, decoded_rows, encode
    from bus.nats import jsapi
    from bus.nats.ranged import Batch

    appends = Appends("eventbus")
    appends(accepted)  # the topics' subjects known, as in a steady stream
    stored = Batch(
        list(range(1, len(accepted) + 1)), [b""] * len(accepted),
        [encode(fields) for fields in accepted], [0] * len(accepted),
    )  # fmt: skip
    topics = [fields[0] for fields in accepted]
    core = StreamCore(released=0, max_data_bytes=1 << 20, clock=lambda: 0.0, logger=Logger())
    for _ in range(batches):
        if name == "append":
            jsapi.batch_publishes(appends(accepted), b"0123456789ab-7", b"_INBOX.x.7")
        else:
            core.released = 0
            core.committed(decoded_rows(stored, topics))
            core.broadcasts.clear()


def instructions(name: str, batches: int, env: dict[str, str]) -> int:
    """Instructions valgrind counted for this script's ``stage`` run of ``name``."""
    return cachegrind_instructions(__file__, name, batches, env)


def per_event(name: str, batches: int, env: dict[str, str]) -> float:
    return (instructions(name, batches, env) - instructions(name, 0, env)) / (batches * BATCH)


def main() -> int:
    args = instruction_args(__doc__.split("\n\n")[0], STAGES, stage)
    if args is None:
        return 0
    info = machine()
    stages = [s for s in args.stages.split(",") if s]
    counted: dict[str, dict[str, float]] = {}
    for name in stages:
        counted[name] = {
            "code": per_event(name, args.batches, {}),
            "python": per_event(name, args.batches, PYTHON_ONLY),
        }
        print(
            f"{name:<9} {counted[name]['code']:>9,.0f} instructions/event "
            f"(Python alone {counted[name]['python']:,.0f})",
            flush=True,
        )
    main_stage = "all" if "all" in counted else stages[-1]
    code, python = counted[main_stage]["code"], counted[main_stage]["python"]
    instruction_summary(
        "eventbus_instructions", info, args, counted, main_stage, "event",
        baseline="the same stages in Python alone (BUS_NATIVE_PUBS=0 BUS_NATIVE_ROWS=0 "
        f"BUS_NATIVE_NATS=0): {main_stage} {python:,.0f}",
        ratio=f"{code / python:.2f} (with the compiled helpers / Python alone)",
        details=[("events", f"{args.batches} batches of {BATCH} per stage, valgrind cachegrind")],
    )  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
