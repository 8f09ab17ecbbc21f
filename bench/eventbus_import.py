"""``eventbus-cli import-log``: how fast a server's SQLite log goes into a new JetStream
stream, every sequence kept.

A log of ``--events`` events (100-byte data, 16 topics, written by the server's own
store) with holes (every 1000th sequence deleted, as compaction leaves them) and a gap at
its start is made once in a temporary directory; nats-server processes (one, or three
clustered with ``--replicas 3``) on 127.0.0.1, fresh for the run.

*Measured*: the import, ``eventbus-cli import-log --data-dir DIR --nats URLS`` in a
process of its own, wall time from its start to its end (reading the log, the size checks,
making the stream, every sequence stored and acknowledged, the placeholders purged, the
limits set), and its rate (the log's sequences a second). CPU per sequence of the import
process and of the nats-servers.
*Baseline*: the same events appended the way a front-end appends what its collector took
(:class:`bus.nats.publish.Publisher`, batches of 1,000, one in flight, as
``bus.eventbus.jetstream`` does), into another stream on the same servers, in this
process; its rate and the CPU per event of this process and of the nats-servers.
Import and baseline alternate ``--repeat`` times; each writes a stream of its own, deleted
after it.

    python bench/eventbus_import.py [--events 1000000] [--replicas 1] [--repeat 2]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

from _common import (
    PYTHON,
    CpuAccount,
    Figure,
    add_common_arguments,
    cpu_of,
    cpu_seconds,
    fmt_rate,
    machine,
    median,
    summary,
    terminate_on_sigterm,
    wait_for_quiet,
    workdir,
)

from bus.nats.servers import NatsCluster

CLI = str(Path(PYTHON).with_name("eventbus-cli"))
#: The import is to be no slower than front-ends appending the same events.
TARGET_RATIO = 1.0


def make_log(directory: Path, count: int) -> tuple[int, int, int]:
    """The log: ``count`` sequences, holes every 1000th, the first 10 gone. (held,
    first, last)."""
    from bus.eventbus.store import EventStore

    store = EventStore(directory)
    payload = b"\x82\xa1n\x01\xa3pad" + b"x" * 92
    for start in range(0, count, 5000):
        batch = [
            (f"/bench/{i % 16}/".encode(), b"bench", b"2026-11-28T10:00:00.000Z",
             str(uuid.uuid4()).encode(), payload)
            for i in range(start, min(start + 5000, count))
        ]  # fmt: skip
        store.append_fields(batch, time.time())
    store._delete_sequences([s for s in range(1, count + 1) if s % 1000 == 500 or s <= 10])
    held, first, last = store.count(), store.first_sequence() or 0, store.last_sequence
    store.close()
    return held, first, last


def delete_stream(urls: list[str], name: str) -> None:
    from bus.nats import jsapi
    from bus.nats.blocking import Connection

    with Connection(urls) as connection:
        jsapi.answer(connection.request(f"{jsapi.API}.STREAM.DELETE.{name}", b"", 30).payload)


def run_import(log_dir: Path, urls: list[str], stream: str, nats_pids: list[int]) -> dict[str, Any]:
    """``eventbus-cli import-log`` in a process of its own; its figures."""
    servers_before = cpu_of(nats_pids)
    started = time.monotonic()
    process = subprocess.Popen(
        [CLI, "import-log", "--data-dir", str(log_dir), "--nats", ",".join(urls),
         "--nats-stream", stream, "--nats-subject-prefix", stream.lower()],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    own = 0.0
    while process.poll() is None:
        with contextlib.suppress(OSError, IndexError):
            own = cpu_seconds(process.pid)  # read until it ends: then /proc has it no more
        time.sleep(0.05)
    wall = time.monotonic() - started
    out, err = process.communicate()
    if process.returncode != 0:
        raise SystemExit(f"import failed ({process.returncode}): {err}")
    done = json.loads(out.splitlines()[-1])
    return {
        "wall": wall,
        "sequences": done["events"] + done["holes"],
        "events": done["events"],
        "import_own_rate": done["rate"],
        "client_cpu": own,
        "servers_cpu": cpu_of(nats_pids) - servers_before,
    }


def run_baseline(
    log_dir: Path, urls: list[str], stream: str, nats_pids: list[int]
) -> dict[str, Any]:
    """The log's events appended as a front-end appends them, in this process."""
    import resource

    from bus.eventbus.config import JetStreamSettings
    from bus.eventbus.jetstream import stream_config
    from bus.eventbus.store import LogExport, Retention
    from bus.eventbus.stream_read import Subjects, encode
    from bus.nats.admin import StreamAdmin
    from bus.nats.blocking import Connection
    from bus.nats.publish import Publisher

    settings = JetStreamSettings(tuple(urls), stream=stream, subject_prefix=stream.lower())
    log = LogExport(log_dir)
    subject = Subjects(settings.subject_prefix)
    connection = Connection(urls, timeout=30)
    try:
        StreamAdmin(connection, stream).create(stream_config(settings, Retention()))
        publisher = Publisher(connection, atomic=len(urls) > 1)  # as front-ends append
        usage = resource.getrusage(resource.RUSAGE_SELF)
        before = usage.ru_utime + usage.ru_stime
        servers_before = cpu_of(nats_pids)
        started = time.monotonic()
        after, events = 0, 0
        while rows := log.rows(after, 5000):
            for at in range(0, len(rows), 1000):
                items = [(subject(r[1]), r[4], encode(r[1:6])) for r in rows[at : at + 1000]]
                publisher.publish(items, 30.0)
                events += len(items)
            after = rows[-1][0]
        wall = time.monotonic() - started
        usage = resource.getrusage(resource.RUSAGE_SELF)
        return {
            "wall": wall,
            "events": events,
            "client_cpu": usage.ru_utime + usage.ru_stime - before,
            "servers_cpu": cpu_of(nats_pids) - servers_before,
        }
    finally:
        connection.close()
        log.close()


def main() -> None:
    terminate_on_sigterm()
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--replicas", type=int, choices=(1, 3), default=1)
    parser.add_argument("--repeat", type=int, default=2)
    add_common_arguments(parser)
    args = parser.parse_args()
    info = machine()
    imports: list[dict[str, Any]] = []
    baselines: list[dict[str, Any]] = []
    noise: list[float] = []
    with workdir("bench-import-", args.keep) as root:
        print(f"making a log of {args.events:,} sequences ...", flush=True)
        held, first, last = make_log(root / "log", args.events)
        print(f"log: {held:,} events, sequences {first:,} to {last:,}", flush=True)
        cluster = NatsCluster(root / "nats", size=args.replicas)
        cluster.start()
        try:
            pids = [node.process.pid for node in cluster.nodes if node.process is not None]
            for run in range(args.repeat):
                wait_for_quiet(args.wait_idle)
                account = CpuAccount(pids)
                imported = run_import(root / "log", cluster.urls, f"IMPORT{run}", pids)
                noise.append(account.stop())
                delete_stream(cluster.urls, f"IMPORT{run}")
                print(
                    f"import {run + 1}: {imported['sequences']:,} sequences in "
                    f"{imported['wall']:.1f} s ({imported['sequences'] / imported['wall']:,.0f}/s)",
                    flush=True,
                )
                imports.append(imported)
                wait_for_quiet(args.wait_idle)
                account = CpuAccount(pids)
                base = run_baseline(root / "log", cluster.urls, f"BASE{run}", pids)
                noise.append(account.stop())
                delete_stream(cluster.urls, f"BASE{run}")
                print(
                    f"baseline {run + 1}: {base['events']:,} events in {base['wall']:.1f} s "
                    f"({base['events'] / base['wall']:,.0f}/s)",
                    flush=True,
                )
                baselines.append(base)
        finally:
            cluster.stop()
    rate = median([r["sequences"] / r["wall"] for r in imports])
    base_rate = median([r["events"] / r["wall"] for r in baselines])
    per = lambda runs, key, unit: median([r[key] / r[unit] * 1e6 for r in runs])  # noqa: E731
    ratio = rate / base_rate
    summary(
        f"eventbus_import (R{args.replicas}, {args.events:,} sequences)",
        info,
        f"import {fmt_rate(rate)} sequences/s, {median([r['wall'] for r in imports]):.1f} s for "
        f"the log (runs: {', '.join(fmt_rate(r['sequences'] / r['wall']) for r in imports)}); "
        f"CPU per sequence: import process {per(imports, 'client_cpu', 'sequences'):.1f} us, "
        f"nats-servers {per(imports, 'servers_cpu', 'sequences'):.1f} us",
        f"front-end appends {fmt_rate(base_rate)} events/s (runs: "
        f"{', '.join(fmt_rate(r['events'] / r['wall']) for r in baselines)}); CPU per event: "
        f"appender {per(baselines, 'client_cpu', 'events'):.1f} us, nats-servers "
        f"{per(baselines, 'servers_cpu', 'events'):.1f} us",
        f"{ratio:.2f} x",
        f"import >= {TARGET_RATIO:g} x the front-end's appends",
        ratio >= TARGET_RATIO,
        details=[("noise", ", ".join(f"{n:.2f}" for n in noise) + " cores of other work")],
        json_path=args.json,
        record={"imports": imports, "baselines": baselines},
        figures={
            "import_rate": Figure(rate, "sequences/s"),
            "ratio": Figure(ratio, "x"),
        },
    )


if __name__ == "__main__":
    sys.exit(main())
