"""End-to-end delay of the Spark path: publisher -> bus -> bridge -> journal -> PySpark.

A paced raw pyzmq publisher process (a DEALER) sends RATE events/s, each stamped with
its own ISO-8601 time at the moment it is sent. They go through the bus (``twistd -n
eventbus``), the standalone bridge (``twistd -n spark-bridge``) and its journal into a
PySpark streaming query (``local[2]``, the ``eventbus`` source registered with
``bus.spark.register``, a ``processingTime`` trigger) whose ``foreachBatch`` collects
each micro-batch to the driver; the delay of a row is the wall-clock time at which its
batch was in the driver's hands minus the event's ``timestamp`` column.

First a warm-up phase (its own topic, not measured) runs until Spark has processed a
few batches (Python workers started, code generated); then SECONDS of measured events.
Every measured event must reach Spark exactly once.

Baseline, same run, same events: a raw pyzmq SUB process (RCVHWM 0) on the bus's PUB
port timing each event's arrival against the same stamp: the bus's delivery delay alone.

Also, to show where the time goes: the bridge's ``received_at`` column (publish ->
bridge), the moment the journal first listed each sequence (sampled every 10 ms by
``JournalReader.latest_sequence()``: publish -> readable by Spark), and Spark's own
per-batch durations from the query progress.

    python bench/spark_latency.py [--rate 5000] [--seconds 30] [--trigger-ms 100]
"""

from __future__ import annotations

import argparse
import bisect
import itertools
import json
import os
import sys
import threading
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from _common import (
    BusServer,
    Cleanup,
    Worker,
    _children,
    add_common_arguments,
    machine,
    machine_busy_seconds,
    median,
    server_prefix,
    summary,
    terminate_on_sigterm,
    wait_for_quiet,
    wait_until,
    workdir,
)
from _workers import HEARTBEAT, PRODUCER, ZERO_SEQUENCE, _uuid_format, payload
from spark_bridge import STATS_INTERVAL, BridgeProcess, Sampler

TARGET_P50 = 1.0
WARMUP_TOPIC = b"/bench/warmup/"
MEASURED_TOPIC = b"/bench/latency/"


def percentiles(values: list[float], points: tuple[int, ...] = (50, 90, 99)) -> dict[str, float]:
    """Nearest-rank percentiles (and the max) of ``values``, in seconds."""
    if not values:
        return {**{f"p{p}": float("nan") for p in points}, "max": float("nan")}
    ordered = sorted(values)
    last = len(ordered) - 1
    found = {f"p{p}": ordered[min(last, round(p / 100 * last))] for p in points}
    found["max"] = ordered[-1]
    return found


def fmt_ms(stats: dict[str, float]) -> str:
    return ", ".join(f"{name} {value * 1000:,.0f} ms" for name, value in stats.items())


def stamp(now: float) -> bytes:
    """ISO-8601 UTC with microseconds, the way a producer stamps an event."""
    return datetime.fromtimestamp(now, UTC).isoformat().encode()


# -- raw pyzmq roles of this file (run as ``spark_latency.py ROLE ...`` by ``Worker``) ------


def role_publish_paced(endpoint: str, rate: float, measured: int) -> None:
    """A DEALER sending ``rate`` events/s, each stamped when sent: warm-up events (their
    own topic) from ``GO`` until ``MEASURE`` arrives on stdin, then ``measured`` events."""
    import zmq

    context = zmq.Context()
    dealer = context.socket(zmq.DEALER)
    dealer.sndhwm = 1000
    dealer.linger = -1
    dealer.connect(endpoint)
    uuid_format = _uuid_format()
    measure = threading.Event()

    def read_stdin() -> None:
        for line in sys.stdin:
            if line.strip() == "MEASURE":
                measure.set()
        measure.set()  # the benchmark went away: finish quickly

    print("READY", flush=True)
    if sys.stdin.readline().strip() != "GO":
        return
    threading.Thread(target=read_stdin, daemon=True).start()
    more = zmq.SNDMORE
    send = dealer.send
    clock = time.time
    n = warmups = sent = 0
    topic = WARMUP_TOPIC
    started = phase_start = clock()
    phase_sent = 0
    measured_start = 0.0
    worst_behind = 0.0
    while sent < measured:
        now = clock()
        if topic is WARMUP_TOPIC and measure.is_set():
            topic, phase_start, phase_sent, measured_start = MEASURED_TOPIC, now, 0, now
        due = int((now - phase_start) * rate) + 1 - phase_sent
        if due <= 0:
            time.sleep(min(0.001, (phase_sent - (now - phase_start) * rate) / rate))
            continue
        worst_behind = max(worst_behind, due / rate)
        for _ in range(due):
            send(topic, more)
            send(ZERO_SEQUENCE, more)
            send(PRODUCER, more)
            send(stamp(clock()), more)
            send(uuid_format % n, more)
            send(payload(n))
            n += 1
            phase_sent += 1
            if topic is MEASURED_TOPIC:
                sent += 1
                if sent >= measured:
                    break
            else:
                warmups += 1
    ended = clock()
    dealer.close()
    context.term()
    print(
        json.dumps(
            {
                "warmups": warmups,
                "sent": sent,
                "t_started": started,
                "t_measured": measured_start,
                "t_ended": ended,
                "measured_rate": sent / max(ended - measured_start, 1e-9),
                "worst_behind_s": worst_behind,
            }
        ),
        flush=True,
    )


def role_subscribe_timed(endpoint: str, measured: int, idle_timeout: float = 20.0) -> None:
    """A SUB (RCVHWM 0) timing each measured event's arrival against its stamp."""
    import zmq

    context = zmq.Context()
    sub = context.socket(zmq.SUB)
    sub.rcvhwm = 0
    sub.linger = 0
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    sub.connect(endpoint)
    sub.rcvtimeo = 30_000
    sub.recv_multipart()  # a first message (the heartbeat): the subscription is live
    print("READY", flush=True)
    recv = sub.recv
    clock = time.time
    parse = datetime.fromisoformat
    delays: list[float] = []
    sequences: list[int] = []
    warmups = 0
    sub.rcvtimeo = 300_000  # until the measured events start
    while len(delays) < measured:
        try:
            topic = recv()
            if topic == HEARTBEAT:
                recv(), recv()
                continue
            sequence, _, timestamp, _, _ = recv(), recv(), recv(), recv(), recv()
        except zmq.Again:
            break
        arrived = clock()
        if topic == MEASURED_TOPIC:
            delays.append(arrived - parse(timestamp.decode()).timestamp())
            sequences.append(int.from_bytes(sequence, "big"))
            sub.rcvtimeo = int(idle_timeout * 1000)
        else:
            warmups += 1
    sub.close()
    context.term()
    contiguous = sequences == list(range(sequences[0], sequences[0] + len(sequences)))
    print(
        json.dumps(
            {
                "received": len(delays),
                "warmups": warmups,
                "first_sequence": sequences[0] if sequences else None,
                "contiguous": bool(sequences) and contiguous,
                "delay": percentiles(delays),
            }
        ),
        flush=True,
    )


ROLES = {"publish-paced": role_publish_paced, "subscribe-timed": role_subscribe_timed}


def start_role(stack: Cleanup, role: str, *args: object) -> Worker:
    """A :class:`_common.Worker` running one of this file's roles."""
    worker = Worker(role, *args, script=Path(__file__).resolve())
    stack.callback(worker.stop)
    return worker


class TreeCpuAccount:
    """Cores kept busy by processes *outside* this benchmark's process tree while it runs.

    ``_common.CpuAccount`` needs every process of the run to be known (or reaped) when
    it stops; Spark starts and reaps Python workers of its own all along, so here the
    whole tree is read instead: utime + stime + cutime + cstime of this process and every
    descendant (a reaped grandchild's CPU lands in its parent's cutime/cstime)."""

    def __init__(self) -> None:
        self._start = self._tree()
        self._busy = machine_busy_seconds()
        self._wall = time.monotonic()

    @staticmethod
    def _tree() -> float:
        ticks = os.sysconf("SC_CLK_TCK")
        total = 0.0
        pending = [os.getpid()]
        while pending:
            pid = pending.pop()
            try:
                with open(f"/proc/{pid}/stat") as stat:
                    fields = stat.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            total += sum(int(f) for f in fields[11:15]) / ticks
            pending.extend(_children(pid))
        return total

    def stop(self) -> float:
        wall = max(time.monotonic() - self._wall, 1e-9)
        busy = machine_busy_seconds() - self._busy
        own = self._tree() - self._start
        return max(busy - own, 0.0) / wall


# -- the Spark side -----------------------------------------------------------------------------


class BatchLog:
    """What ``foreachBatch`` saw: per batch its id, rows and when it ran; per measured
    row its sequence, stamp, bridge receipt and the moment the batch reached the driver."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.batches: list[dict[str, Any]] = []
        self.rows: dict[int, tuple[float, float, float]] = {}  # seq -> (stamp, received, seen)
        self.duplicates = 0
        self.warmup_rows = 0

    def __call__(self, frame: Any, batch_id: int) -> None:
        from pyspark.sql import functions as F

        called = time.time()
        table = frame.select(
            "seq",
            "topic",
            F.unix_micros("timestamp").alias("stamp_us"),
            F.unix_micros("received_at").alias("received_us"),
        ).toArrow()
        seen = time.time()
        seqs = table.column("seq").to_pylist()
        topics = table.column("topic").to_pylist()
        stamps = table.column("stamp_us").to_pylist()
        received = table.column("received_us").to_pylist()
        measured_topic = MEASURED_TOPIC.decode()
        with self.lock:
            measured = 0
            for seq, topic, stamp_us, received_us in zip(
                seqs, topics, stamps, received, strict=True
            ):
                if topic != measured_topic:
                    self.warmup_rows += 1
                    continue
                if seq in self.rows:
                    self.duplicates += 1
                    continue
                self.rows[seq] = (stamp_us / 1e6, received_us / 1e6, seen)
                measured += 1
            self.batches.append(
                {
                    "batch": batch_id,
                    "rows": len(seqs),
                    "measured": measured,
                    "called": called,
                    "collected": seen,
                    "lowest": min(seqs) if seqs else None,
                    "highest": max(seqs) if seqs else None,
                }
            )

    def data_batches(self) -> int:
        with self.lock:
            return sum(1 for b in self.batches if b["rows"])

    def measured(self) -> int:
        with self.lock:
            return len(self.rows)


def start_spark(scratch: Path, master: str) -> Any:
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    scratch.mkdir(parents=True, exist_ok=True)
    # Spark's and the JVM's temp files go to the scratch directory (removed at the end).
    # (-XX:-UsePerfData: no /tmp/hsperfdata_<user> entry either.)
    os.environ["JAVA_TOOL_OPTIONS"] = f"-Djava.io.tmpdir={scratch} -XX:-UsePerfData"
    os.environ["SPARK_LOCAL_DIRS"] = str(scratch)
    os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"  # loopback only, and no hostname warning
    from pyspark.sql import SparkSession

    from bus.spark import register

    spark = (
        SparkSession.builder.master(master)
        .appName("bench-spark-latency")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.sql.streaming.numRecentProgressUpdates", "10000")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.driver.host", "127.0.0.1")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    register(spark)
    return spark


def spark_durations(progress: list[dict[str, Any]], first_batch: int) -> dict[str, float]:
    """Median of each of Spark's per-batch durations (ms) over batches with rows from
    ``first_batch`` on."""
    found: dict[str, list[float]] = {}
    for entry in progress:
        if entry.get("batchId", -1) < first_batch or not entry.get("numInputRows"):
            continue
        for name, value in entry.get("durationMs", {}).items():
            found.setdefault(name, []).append(float(value))
    return {name: median(values) for name, values in sorted(found.items())}


# -- the run ----------------------------------------------------------------------------------


def run(args: argparse.Namespace, root: Path) -> dict[str, Any]:
    measured = int(args.rate * args.seconds)
    log = BatchLog()
    result: dict[str, Any] = {"measured_events": measured}
    stream = args.log == "stream"
    with Cleanup() as stack:
        extra: tuple[str, ...] = ()
        url = ""
        if stream:
            # The bus's log in a JetStream stream, read by the source itself: no bridge.
            from bus.nats.servers import NatsCluster

            nats = NatsCluster(root / "nats", size=1)
            stack.callback(nats.stop)
            nats.start()
            url = nats.urls[0]
            extra = ("--store", "jetstream", "--nats", url, "--http-port", "0")
        server = stack.server(
            BusServer(
                root / "bus",
                stats_interval=STATS_INTERVAL,
                prefix=server_prefix(args.server_prefix),
                extra=extra,
            )
        )
        bridge: BridgeProcess | None = None
        journal = root / "journal"
        if not stream:
            bridge = BridgeProcess(root / "bridge", server.port, server_prefix(args.bridge_prefix))
            stack.callback(bridge.stop)
            bridge.start()
            journal = bridge.journal_dir
        subscriber = start_role(stack, "subscribe-timed", server.publisher, measured)
        subscriber.wait_ready()

        print("starting Spark ...", file=sys.stderr, flush=True)
        spark = start_spark(root / "spark-tmp", args.master)
        stack.callback(spark.stop)
        journal.mkdir(parents=True, exist_ok=True)  # the source needs the directory
        source = spark.readStream.format("eventbus")
        source = source.option("nats", url) if stream else source.option("path", str(journal))
        query = (
            source.option("startingOffsets", "earliest")
            .load()
            .writeStream.foreachBatch(log)
            .option("checkpointLocation", str(root / "checkpoint"))
            .trigger(processingTime=f"{args.trigger_ms} milliseconds")
            .start()
        )
        stack.callback(query.stop)

        publisher = start_role(stack, "publish-paced", server.collector, args.rate, measured)
        publisher.wait_ready()
        sampler = Sampler(server, journal)
        if not stream:
            sampler.start()
            stack.callback(sampler.stop)
        wait_for_quiet(args.wait_idle)
        print("warming up ...", file=sys.stderr, flush=True)
        publisher.go()
        warm_deadline = time.monotonic() + args.warmup_timeout
        wait_until(
            lambda: log.data_batches() >= args.warmup_batches or time.monotonic() > warm_deadline,
            args.warmup_timeout + 10,
            "Spark warm-up batches",
            _check(query, bridge),
            0.05,
        )
        result["warmup_batches"] = log.data_batches()
        first_measured_batch = len(log.batches)
        print(f"measuring {measured:,} events ...", file=sys.stderr, flush=True)
        account = TreeCpuAccount()
        assert publisher.proc.stdin is not None
        publisher.proc.stdin.write("MEASURE\n")
        publisher.proc.stdin.flush()
        sent = publisher.result(timeout=args.seconds * 3 + 60)
        baseline = subscriber.result(timeout=60)
        wait_until(
            lambda: log.measured() >= sent["sent"],
            60,
            f"{sent['sent']} measured events in Spark",
            _check(query, bridge),
            0.05,
        )
        result["foreign_cores"] = account.stop()
        if not stream:
            sampler.stop()
        progress = list(query.recentProgress)
        query.stop()
        result.update(
            sent=sent,
            baseline=baseline,
            spark_durations_ms=spark_durations(progress, first_measured_batch),
            bridge_warnings=bridge.warnings() if bridge is not None else [],
            bus_status=server.status(),
        )
    # Every process is stopped: work out the delays.
    rows = log.rows
    seqs = sorted(rows)
    journal_seqs = [s[2] for s in sampler.samples]
    journal_times = [s[0] for s in sampler.samples]
    # The sampler's clock is monotonic; rows are in wall-clock time: one offset maps them.
    offset = time.time() - time.monotonic()
    spark_delay, bridge_delay, journal_delay = [], [], []
    for seq in seqs:
        stamp_s, received_s, seen_s = rows[seq]
        spark_delay.append(seen_s - stamp_s)
        bridge_delay.append(received_s - stamp_s)
        index = bisect.bisect_left(journal_seqs, seq)
        if index < len(journal_seqs):
            journal_delay.append(journal_times[index] + offset - stamp_s)
    batches = [b for b in log.batches[first_measured_batch:] if b["measured"]]
    gaps_between = [b["called"] - a["collected"] for a, b in itertools.pairwise(batches)]
    result.update(
        spark=percentiles(spark_delay),
        bridge=percentiles(bridge_delay),
        journal=percentiles(journal_delay),
        spark_rows=len(rows),
        duplicates=log.duplicates,
        contiguous=seqs == list(range(seqs[0], seqs[0] + len(seqs))) if seqs else False,
        batches=len(batches),
        rows_per_batch=median([b["measured"] for b in batches]),
        collect_ms=median([(b["collected"] - b["called"]) * 1000 for b in batches]),
        batch_interval_ms=median(
            [(b["called"] - a["called"]) * 1000 for a, b in itertools.pairwise(batches)]
        ),
        idle_between_ms=median([g * 1000 for g in gaps_between]),
    )
    return result


def _check(query: Any, bridge: BridgeProcess | None) -> Any:
    def check() -> None:
        if bridge is not None:
            bridge.check_alive()
        error = query.exception()
        if error is not None:
            raise RuntimeError(f"streaming query failed: {error}")

    return check


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] in ROLES:
        role, *rest = sys.argv[1:]
        function: Any = ROLES[role]
        if role == "publish-paced":
            function(rest[0], float(rest[1]), int(rest[2]))
        else:
            function(rest[0], int(rest[1]))
        return 0
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rate", type=float, default=5000, help="events/s (default 5000)")
    parser.add_argument("--seconds", type=float, default=30, help="measured seconds (30)")
    parser.add_argument("--trigger-ms", type=int, default=100, help="processingTime (100 ms)")
    parser.add_argument("--master", default="local[2]")
    parser.add_argument(
        "--log",
        choices=("journal", "stream"),
        default="journal",
        help="journal: the SQLite bus, the bridge and its journal (default); stream: a "
        "front-end whose log is a JetStream stream (one nats-server), read by the source",
    )
    parser.add_argument(
        "--warmup-batches", type=int, default=5, help="Spark batches with rows before measuring"
    )
    parser.add_argument("--warmup-timeout", type=float, default=60)
    parser.add_argument(
        "--bridge-prefix", default="", help="wrap the bridge command (a profiler), like the bus's"
    )
    add_common_arguments(parser)
    args = parser.parse_args()
    terminate_on_sigterm()
    info = machine()
    with workdir("spark-latency-bench-", args.keep) as root:
        result = run(args, root)

    spark, base = result["spark"], result["baseline"]["delay"]
    sent = result["sent"]
    complete = (
        result["spark_rows"] == sent["sent"] == result["measured_events"]
        and result["duplicates"] == 0
        and result["contiguous"]
    )
    ratio = spark["p50"] / base["p50"] if base["p50"] > 0 else float("nan")
    verdict = spark["p50"] < TARGET_P50 and complete
    durations = result["spark_durations_ms"]
    summary(
        "spark_latency",
        info,
        measured=(
            f"publish -> Spark foreachBatch ({args.log}): {fmt_ms(spark)} over {result['spark_rows']:,} events "
            f"({'each exactly once' if complete else 'INCOMPLETE or duplicated'})"
        ),
        baseline=(
            f"publish -> raw pyzmq SUB: {fmt_ms(base)} over {result['baseline']['received']:,} "
            "events (the same ones)"
        ),
        ratio=f"{ratio:,.0f}x (Spark p50 / raw SUB p50)",
        target=f"p50 < {TARGET_P50:.0f} s, every event once",
        verdict=verdict,
        details=[
            (
                "load",
                f"{sent['sent']:,} events at {sent['measured_rate']:,.0f} events/s for "
                f"{args.seconds:.0f} s after {sent['warmups']:,} warm-up events "
                f"({result['warmup_batches']} Spark batches); {args.master}, processingTime "
                f"{args.trigger_ms} ms",
            ),
            *(
                [("publish->stored", f"stream received_at - stamp: {fmt_ms(result['bridge'])}")]
                if args.log == "stream"
                else [
                    ("publish->bridge", f"bridge received_at - stamp: {fmt_ms(result['bridge'])}"),
                    (
                        "publish->journal",
                        "first listed by JournalReader (sampled every 10 ms): "
                        f"{fmt_ms(result['journal'])}",
                    ),
                ]
            ),
            (
                "Spark batches",
                f"{result['batches']} with measured rows, median {result['rows_per_batch']:,.0f} "
                f"rows, one every {result['batch_interval_ms']:,.0f} ms; collect "
                f"{result['collect_ms']:,.0f} ms; between batches "
                f"{result['idle_between_ms']:,.0f} ms",
            ),
            (
                "Spark durations",
                "median ms per batch: " + ", ".join(f"{k} {v:,.0f}" for k, v in durations.items()),
            ),
            ("noise", f"other processes kept {result['foreign_cores']:.2f} cores busy (measured)"),
        ],
        json_path=args.json,
        record={"result": result},
    )
    return 0 if verdict else 1


if __name__ == "__main__":
    sys.exit(main())
