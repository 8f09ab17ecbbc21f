"""Pieces of the nemesis tests (tests/test_eventbus_nemesis.py, tests/test_emqp_nemesis.py):
an Event BUS front-end on a host of its own, the faults' windows, and a Spark query on a
host reading the front-ends' stream, with the check of its sink.

Checkers return what they counted and the anomalies they found (one line each), so that a
run reports every anomaly it found, not the first alone.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.jvm import java_tool_options
from tests.netns import Hosts, HostService
from tests.processes import START_BOUND
from tests.spark.driver import Driver, landed_seq
from tests.spark.helpers import SPARKS_OWN_GUESS

BIN = Path(sys.executable).parent
PORT = 7000  # every host is a namespace of its own: fixed ports clash with nothing


class FrontEnd(HostService):
    """One Event BUS front-end (``--store jetstream``) on its host, restartable."""

    def __init__(self, hosts: Hosts, name: str, nats_urls: str, root: Path) -> None:
        self.address = f"{hosts.addresses[name]}:{PORT}"
        self.nats_urls = nats_urls
        argv = [
            str(BIN / "twistd"), "-n", "--pidfile=", "eventbus", "--services", "eventbus",
            "--bind", hosts.addresses[name], "--port", str(PORT), "--data-dir",
            str(root / name), "--store", "jetstream", "--nats", nats_urls,
            "--nats-replicas", "3", "--stats-interval", "0.5s", "--heartbeat-interval", "0.25s",
        ]  # fmt: skip
        super().__init__(hosts, name, root, argv, {"EVENTBUS_HTTP_PORT": "0"})

    def broadcast(self) -> int:
        """The last sequence this front-end has broadcast (its status.json)."""
        return int(self.status().get("jetstream", {}).get("broadcast", 0))

    def stream_led(self) -> bool:
        """Its stream is made and led (its status.json names the stream's leader)."""
        return bool((self.status().get("jetstream") or {}).get("leader"))


@dataclass
class Window:
    """A fault from its start to its heal (for a process killed: to its serving again)."""

    kind: str
    host: str
    start: float
    end: float = 0.0
    #: Seconds after ``end`` in which the fault may still show: an election it set off.
    settle: float = 0.0
    #: It reaches every host's work (a NATS server lost), not only its own host's.
    everywhere: bool = False

    @property
    def settled(self) -> float:
        return self.end + self.settle


# -- a Spark query on a host ------------------------------------------------------------------

#: A query the pipeline started again (bus.spark.pipeline.run_queries), and why.
_RESTART = re.compile(r"^query (\S+) failed \((.*)\): started again", re.M)


class SparkQuery:
    """``python -m bus.spark.pipeline`` on a host: a streaming query of the Event BUS's
    stream through the bus's Spark source (every NATS server listed, ``natsRetryTimeout``),
    local mode, landing every event in a Parquet sink with a checkpoint."""

    def __init__(self, hosts: Hosts, name: str, nats_urls: str, root: Path) -> None:
        self.root = root / "spark"
        self.root.mkdir(parents=True, exist_ok=True)
        self.log = self.root / "pipeline.log"
        scratch = self.root / "jvm"
        scratch.mkdir(exist_ok=True)
        self.env = {
            **os.environ,
            "PYSPARK_PYTHON": sys.executable,
            "JAVA_TOOL_OPTIONS": java_tool_options(scratch),
            "SPARK_LOCAL_DIRS": str(scratch),
            "SPARK_LOCAL_IP": "127.0.0.1",  # local mode talks to itself on the host's loopback
            "PYTHONUNBUFFERED": "1",
        }
        self.args = [
            "--nats", nats_urls, "--nats-retry-timeout", "60s", "--master", "local[2]",
            "--output", str(self.root / "out"), "--checkpoint", str(self.root / "checkpoint"),
            "--no-counts", "--starting-offsets", "earliest", "--trigger-seconds", "2",
            "--max-offsets-per-trigger", "1000", "--min-partitions", "2",
        ]  # fmt: skip
        self.prefix = hosts.prefix(name)
        self.driver: Driver | None = None

    def start(self) -> None:
        self.driver = Driver(self.args, self.log, prefix=self.prefix, env=self.env)

    def text(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def started(self) -> bool:
        """Its query runs (the pipeline says so as Spark starts it); raises once the
        pipeline ended."""
        self.landed()
        return "[events] started" in self.text()

    def landed(self) -> int:
        """The highest sequence a finished micro-batch landed (0: none yet); raises once
        the pipeline ended."""
        if self.driver is not None and not self.driver.running():
            raise AssertionError(f"the Spark pipeline ended: {self.text()[-3000:]}")
        return landed_seq(self.text())

    def restarts(self) -> list[str]:
        """Why the pipeline started its query again, each time."""
        return [reason for _, reason in _RESTART.findall(self.text())]

    @staticmethod
    def own_guess(reason: str) -> bool:
        """A failure for Spark's own start-up guess on a busy machine, not the source's."""
        return re.search(SPARKS_OWN_GUESS, reason) is not None

    def stop(self) -> int:
        """SIGTERM: the pipeline stops its query and exits; its status."""
        if self.driver is None:
            return 0
        self.driver.terminate()
        return self.driver.wait(timeout=START_BOUND)

    def kill(self) -> None:
        if self.driver is not None and self.driver.running():
            self.driver.kill()

    def sink(self) -> list[tuple[int, str]]:
        """(seq, event_id) of every row the sink holds, as Spark reads it."""
        if not any((self.root / "out" / "events").glob("**/*.parquet")):
            raise AssertionError(
                f"the Spark pipeline landed nothing (its restarts: {self.restarts()}); its log: "
                f"{self.text()[-3000:]}"
            )
        done = subprocess.run(
            [sys.executable, "-m", "tests.spark.sink_rows", str(self.root / "out" / "events"),
             "seq", "event_id"],
            capture_output=True, text=True, env=self.env, timeout=START_BOUND * 2, check=False,
        )  # fmt: skip
        if done.returncode != 0:
            raise AssertionError(f"the sink could not be read: {done.stderr[-3000:]}")
        rows = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("[")]
        return [(int(seq), str(event_id)) for seq, event_id in rows]


def check_sink(
    rows: list[tuple[int, str]], confirmed: list[dict[str, Any]], sent: int, publisher: int = 0
) -> tuple[dict[str, int], list[str]]:
    """A sink exact: every event confirmed to the publisher once, at the sequence it was
    confirmed with; no sequence and no event twice; the sequences 1 to the last without a
    hole; nothing the publisher did not send (tests/nemesis_clients.py names its events
    ``{publisher:08x}-0000-4000-8000-{number:012x}``)."""
    anomalies: list[str] = []
    seqs = Counter(seq for seq, _ in rows)
    ids = Counter(event_id for _, event_id in rows)
    twice = sorted(seq for seq, n in seqs.items() if n > 1)
    if twice:
        anomalies.append(f"sink: {len(twice)} sequences more than once: {twice[:10]}")
    again = sorted(event_id for event_id, n in ids.items() if n > 1)
    if again:
        anomalies.append(f"sink: {len(again)} events more than once: {again[:5]}")
    last = max(seqs, default=0)
    holes = sorted(set(range(1, last + 1)) - set(seqs))
    if holes:
        anomalies.append(f"sink: {len(holes)} sequences missing below {last}: {holes[:10]}")
    where = {event_id: seq for seq, event_id in rows}
    lost = [r for r in confirmed if where.get(r["uuid"]) != r["seq"]]
    if lost:
        anomalies.append(
            f"sink: {len(lost)} of {len(confirmed)} confirmed events not there at their "
            f"sequence: {[(r['uuid'], r['seq'], where.get(r['uuid'])) for r in lost[:5]]}"
        )
    named = re.compile(f"{publisher:08x}-0000-4000-8000-([0-9a-f]{{12}})")

    def sent_by_it(event_id: str) -> bool:
        match = named.fullmatch(event_id)
        return match is not None and int(match[1], 16) < sent

    foreign = [event_id for event_id in ids if not sent_by_it(event_id)]
    if foreign:
        anomalies.append(f"sink: {len(foreign)} events the publisher never sent: {foreign[:5]}")
    counts = {"rows": len(rows), "last": last, "confirmed": len(confirmed), "sent": sent}
    return counts, anomalies
