"""mc0 broker throughput through CURVE, in the spirit of mc0d's torture tool.

Acknowledged commands: CLIENTS (50) CURVE clients, in two raw pyzmq processes, each
CONNECT, then send COUNT (1000) NOOPs with an ID in lockstep, each waiting for the OK with
the same ID. Measured: acknowledged commands/s (first send to last OK, all clients), and
missing or mismatched acks (must be zero).

Fan-out: SUBSCRIBERS (100) CURVE clients, in two processes, SUB one topic; one client PUTs
PUTS messages (100-byte body) with IDs, at most 50 awaiting their OK. Measured: MESSAGEs/s
delivered (first to last received over all subscribers) and MESSAGEs missing.

Baseline, same run: a raw pyzmq CURVE ROUTER (``_mc0_workers.py echo``) doing the least of
the same work, with the same clients. Runs alternate baseline/server ``--repeat`` times;
medians are reported.

Against the real broker (``--mc0d DIR``: the ``bin`` directory of an mc0d built from source,
see bench/README.md), ``--mc0d-rounds`` rounds, each: mc0d's own torture tool
(``mc0torture``: 50 threads, each its own context and CURVE key, CONNECT then 1000 NOOPs
with an ID in lockstep) against mc0d and against ours, then the fan-out above with
``--mc0d-subscribers`` (50) subscribers and one publisher against each; the order of the
two brokers alternates from round to round. Both brokers get the same key pair (mc0d's
secret-key file, which ``--server-cert`` also reads); mc0d logs at WARN (its default
configuration logs a line per message at INFO). mc0torture connects to
tcp://127.0.0.1:61616 (fixed in its source), so that port must be free.

Brokers on NATS (``--cluster``, or ``--cluster-only``; issue 47): the fan-out again, with
``--subscribers`` subscribers and one publisher (at most 50 PUTs awaiting their OK), through
two brokers of one topic space over one nats-server (``--nats-without-tls``): the
publisher and half the subscribers at one broker, the other half at the other (each PUT
crosses NATS once, to be handed to the other half there), against one broker alone with
all of them, in the same run, alternating. Measured: MESSAGEs/s delivered, PUTs
acknowledged/s (a PUT's OK now waits for the NATS server's word), and the CPU per MESSAGE
delivered of every process (the brokers, the nats-server, the subscribers' and the
publisher's processes).

    python bench/mc0_throughput.py [--clients 50] [--count 1000] [--subscribers 100]
                                   [--puts 5000] [--repeat 3]
                                   [--mc0d DIR [--mc0d-rounds 3] [--mc0d-subscribers 50]
                                    [--mc0d-only]]
                                   [--cluster | --cluster-only]
"""

from __future__ import annotations

import argparse
import re
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from _common import (
    HOST,
    Cleanup,
    CpuAccount,
    Figure,
    TwistdProcess,
    Worker,
    add_common_arguments,
    cpu_of,
    cpu_seconds,
    fmt_rate,
    free_ports,
    machine,
    median,
    noise_line,
    server_prefix,
    stop_process,
    summary,
    terminate_on_sigterm,
    wait_for_quiet,
    wait_until,
    workdir,
)
from _common import _die_with_parent as die_with_parent
from _common import _free as port_is_free

HERE = Path(__file__).resolve().parent
MC0_WORKERS = HERE / "_mc0_workers.py"
TARGET_ACKS = 20_000
TARGET_FANOUT = 50_000
TOPIC = "mcollective.bench"
#: Where mc0torture connects (fixed in its source), and what it reads the key from.
TORTURE_PORT = 61616
TORTURE_KEY_FILE = "middleware.public"
#: log4cxx's basic layout ("%r [%t] %p %c %x - %m": milliseconds since the start first).
_TORTURE_LINE = re.compile(r"^(\d+) .* sent and acked (\d+) messages in ([0-9.e+-]+)")


def Mc0Worker(role: str, *args: object) -> Worker:
    """A ``_mc0_workers.py ROLE`` process (the same READY/GO/JSON protocol as Worker)."""
    return Worker(role, *args, script=MC0_WORKERS)


@dataclass
class Mc0Server(TwistdProcess):
    """``twistd -n mc0`` on 127.0.0.1 with its key pair under ``workdir``."""

    workdir: Path
    prefix: list[str] = field(default_factory=list)
    proc: subprocess.Popen[bytes] | None = None
    port: int = 0
    #: The server's secret key in a file (mc0d's format); None: the pair kept in keys/.
    secret_file: Path | None = None
    #: More of ``twistd mc0``'s options (``--nats ...``).
    extra: list[str] = field(default_factory=list)
    label = "mc0"

    def __post_init__(self) -> None:
        self.log_path = self.workdir / "twistd.log"
        self.stdout_path = self.workdir / "stdout.txt"
        self.port = self.port or free_ports(1)

    @property
    def endpoint(self) -> str:
        return f"tcp://127.0.0.1:{self.port}"

    def start(self) -> Mc0Server:
        args = ["mc0", "--port", str(self.port), "--data-dir", str(self.workdir / "keys")]
        if self.secret_file is not None:
            args += ["--server-cert", str(self.secret_file)]
        self._spawn(self._twistd_argv([*args, *self.extra]), "MC0_")
        kept = self.workdir / "keys" / "server.key"
        wait_until(
            lambda: (
                (self.secret_file is not None or kept.exists()) and "started mc0" in self.log_tail()
            ),
            60,
            "twistd mc0 to start",
            self.check_alive,
        )
        return self

    @property
    def public_key(self) -> str:
        import zmq.auth

        public, _ = zmq.auth.load_certificate(str(self.workdir / "keys" / "server.key"))
        return str(public.decode())


@dataclass
class Mc0d:
    """The real broker, built from source: ``mc0d`` in ``bin_dir``, on 127.0.0.1:``port``,
    with the secret key in ``keys``, logging at WARN to a file in ``workdir``."""

    bin_dir: Path
    workdir: Path
    keys: KeyFiles
    port: int = 0
    proc: subprocess.Popen[bytes] | None = None

    def __post_init__(self) -> None:
        self.port = self.port or free_ports(1)

    @property
    def endpoint(self) -> str:
        return f"tcp://127.0.0.1:{self.port}"

    def start(self) -> Mc0d:
        self.workdir.mkdir(parents=True, exist_ok=True)
        config = self.workdir / "log4cxx.properties"
        config.write_text(
            "log4j.rootLogger=WARN, out\n"
            "log4j.appender.out=org.apache.log4j.ConsoleAppender\n"
            "log4j.appender.out.layout=org.apache.log4j.PatternLayout\n"
            "log4j.appender.out.layout.ConversionPattern=%d %p %c - %m%n\n"
        )
        self.proc = subprocess.Popen(
            [
                str(self.bin_dir / "mc0d"), "--bind", HOST, "--port", str(self.port),
                "--curve-private-key", str(self.keys.secret_file), "--logger-config", str(config),
            ],
            stdin=subprocess.DEVNULL,
            stdout=open(self.workdir / "mc0d.log", "wb"),  # noqa: SIM115
            stderr=subprocess.STDOUT,
            preexec_fn=die_with_parent,
        )  # fmt: skip

        def listening() -> bool:
            try:
                socket.create_connection((HOST, self.port), timeout=0.2).close()
            except OSError:
                return False
            return True

        wait_until(listening, 30, "mc0d to listen", self._check_alive)
        return self

    def _check_alive(self) -> None:
        assert self.proc is not None
        if self.proc.poll() is not None:
            log = (self.workdir / "mc0d.log").read_text(errors="replace")[-2000:]
            raise RuntimeError(f"mc0d exited ({self.proc.returncode}):\n{log}")

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def stop(self) -> None:
        if self.proc is not None:
            stop_process(self.proc)
            self.proc = None


@dataclass
class KeyFiles:
    """One server key pair for both brokers: the secret key alone in a file (mc0d's format,
    also read by ``--server-cert``) and the public key in mc0torture's file."""

    root: Path

    def __post_init__(self) -> None:
        import zmq

        self.root.mkdir(parents=True, exist_ok=True)
        public, secret = zmq.curve_keypair()
        self.public = public.decode()
        self.secret_file = self.root / "server.secret"
        self.secret_file.write_text(secret.decode() + "\n")
        self.secret_file.chmod(0o600)
        (self.root / TORTURE_KEY_FILE).write_text(self.public + "\n")


def start_broker(
    kind: str, stack: Cleanup, root: Path, prefix: list[str], mc0d: Path | None = None
) -> tuple[str, str, int]:
    """(endpoint, server public key, pid) of the broker under test, of the baseline, or
    (``kind`` "mc0d") of the real broker built in ``mc0d``."""
    if kind == "mc0d":
        assert mc0d is not None
        real = Mc0d(mc0d, root, KeyFiles(root / "keys"))
        stack.callback(real.stop)
        real.start()
        return real.endpoint, real.keys.public, real.pid
    if kind == "server":
        server = Mc0Server(root, prefix)
        stack.callback(server.stop)
        server.start()
        return server.endpoint, server.public_key, server.pid
    import zmq

    public, secret = zmq.curve_keypair()
    endpoint = f"tcp://127.0.0.1:{free_ports(1)}"
    echo = Mc0Worker("echo", endpoint, secret.decode())
    stack.callback(echo.stop)
    echo.wait_ready()
    return endpoint, public.decode(), echo.proc.pid


def run_acks(kind: str, args: argparse.Namespace, root: Path, prefix: list[str]) -> dict[str, Any]:
    wait_for_quiet(args.wait_idle)
    account = CpuAccount()
    with Cleanup() as stack:
        endpoint, key, pid = start_broker(kind, stack, root, prefix)
        halves = [args.clients // 2, args.clients - args.clients // 2]
        workers = [Mc0Worker("acker", endpoint, key, n, args.count) for n in halves if n]
        for worker in workers:
            stack.callback(worker.stop)
            worker.wait_ready()
        cpu_before = cpu_seconds(pid)
        for worker in workers:
            worker.go()
        results = [worker.result() for worker in workers]
        cpu = cpu_seconds(pid) - cpu_before
    acks = sum(r["acks"] for r in results)
    elapsed = max(r["end"] for r in results) - min(r["start"] for r in results)
    return {
        "kind": kind,
        "rate": acks / max(elapsed, 1e-9),
        "acks": acks,
        "missing": sum(r["missing"] for r in results),
        "mismatched": sum(r["mismatched"] for r in results),
        "cpu_us_per_ack": cpu / max(acks, 1) * 1e6,
        "foreign_cores": account.stop(),
    }


def run_fanout(
    kind: str,
    args: argparse.Namespace,
    root: Path,
    prefix: list[str],
    subscriber_count: int | None = None,
) -> dict[str, Any]:
    wait_for_quiet(args.wait_idle)
    account = CpuAccount()
    count = subscriber_count or args.subscribers
    with Cleanup() as stack:
        endpoint, key, pid = start_broker(kind, stack, root, prefix, args.mc0d)
        halves = [count // 2, count - count // 2]
        subscribers = [
            Mc0Worker("subscribers", endpoint, key, n, TOPIC, args.puts) for n in halves if n
        ]
        for worker in subscribers:
            stack.callback(worker.stop)
            worker.wait_ready()
        putter = Mc0Worker("putter", endpoint, key, TOPIC, args.puts, 50, 100)
        stack.callback(putter.stop)
        putter.wait_ready()
        cpu_before = cpu_seconds(pid)
        putter.go()
        put = putter.result()
        results = [worker.result() for worker in subscribers]
        cpu = cpu_seconds(pid) - cpu_before
    received = sum(r["received"] for r in results)
    elapsed = max(r["last"] for r in results) - min(r["first"] for r in results)
    expected = args.puts * count
    return {
        "kind": kind,
        "rate": received / max(elapsed, 1e-9),
        "received": received,
        "missing": expected - received,
        "bad": sum(r["bad"] for r in results),
        "put_acks": put["acks"],
        "cpu_us_per_message": cpu / max(received, 1) * 1e6,
        "foreign_cores": account.stop(),
    }


def run_torture(
    kind: str, args: argparse.Namespace, root: Path, prefix: list[str]
) -> dict[str, Any]:
    """mc0d's own torture tool against ``kind`` ("mc0d" or "server") on port 61616: the
    acknowledged NOOPs per second over all its clients, from the first client's first
    NOOP to the last client's last OK (from its log's timings)."""
    assert args.mc0d is not None
    wait_for_quiet(args.wait_idle)
    if not port_is_free(TORTURE_PORT):
        raise SystemExit(f"mc0torture needs 127.0.0.1:{TORTURE_PORT}, which is in use")
    keys = KeyFiles(root / "keys")
    account = CpuAccount()
    with Cleanup() as stack:
        broker: Mc0d | Mc0Server
        if kind == "mc0d":
            broker = Mc0d(args.mc0d, root, keys, port=TORTURE_PORT)
        else:
            broker = Mc0Server(root, prefix, port=TORTURE_PORT, secret_file=keys.secret_file)
        stack.callback(broker.stop)
        broker.start()
        settle(broker.pid)
        cpu_before = cpu_seconds(broker.pid)
        started = time.monotonic()
        done = subprocess.run(
            [str(args.mc0d / "mc0torture")],
            cwd=keys.root,
            capture_output=True,
            text=True,
            timeout=600,
            preexec_fn=die_with_parent,
        )
        wall = time.monotonic() - started
        cpu = cpu_seconds(broker.pid) - cpu_before
    spans = []
    for line in done.stdout.splitlines():
        match = _TORTURE_LINE.match(line)
        if match:
            end = int(match.group(1)) / 1000
            spans.append((end - float(match.group(3)), end, int(match.group(2))))
    acks = sum(span[2] for span in spans)
    if done.returncode != 0 or len(spans) != 50:
        (root / "mc0torture.log").write_text(done.stdout + done.stderr)
    elapsed = max(s[1] for s in spans) - min(s[0] for s in spans) if spans else 0.0
    return {
        "kind": kind,
        "rate": acks / elapsed if elapsed > 0 else 0.0,
        "acks": acks,
        "clients_done": len(spans),
        "returncode": done.returncode,
        "wall_s": wall,
        "cpu_us_per_ack": cpu / max(acks, 1) * 1e6,
        "foreign_cores": account.stop(),
    }


def settle(pid: int, limit: float = 5.0) -> None:
    """Wait (up to ``limit`` s) until the process spent under 5 ms of CPU in 100 ms: what a
    broker does as it starts (imports, a first garbage collection) is not measured."""
    deadline = time.monotonic() + limit
    before = cpu_seconds(pid)
    while time.monotonic() < deadline:
        time.sleep(0.1)
        now = cpu_seconds(pid)
        if now - before < 0.005:
            return
        before = now


def mc0d_rounds(args: argparse.Namespace, root: Path, prefix: list[str]) -> dict[str, Any]:
    """``--mc0d-rounds`` rounds of mc0torture and of the fan-out, mc0d and ours in turn."""
    rounds: list[dict[str, Any]] = []
    for index in range(args.mc0d_rounds):
        order = ("mc0d", "server") if index % 2 == 0 else ("server", "mc0d")
        done: dict[str, Any] = {"torture": {}, "fanout": {}}
        for kind in order:
            run = run_torture(kind, args, root / f"torture-{kind}-{index}", prefix)
            done["torture"][kind] = run
            print(f"round {index + 1} torture {describe(run, 'acks/s')}", file=sys.stderr)
        for kind in order:
            run = run_fanout(
                kind, args, root / f"fanout50-{kind}-{index}", prefix, args.mc0d_subscribers
            )
            done["fanout"][kind] = run
            print(f"round {index + 1} fan-out {describe(run, 'MESSAGEs/s')}", file=sys.stderr)
        for test in ("torture", "fanout"):
            pair = done[test]
            pair["ratio"] = pair["server"]["rate"] / max(pair["mc0d"]["rate"], 1e-9)
        print(f"round {index + 1}: ours / mc0d: torture {done['torture']['ratio']:.2f}, "
              f"fan-out {done['fanout']['ratio']:.2f}", file=sys.stderr)  # fmt: skip
        rounds.append(done)
    return {"rounds": rounds}


def run_cluster(
    kind: str, args: argparse.Namespace, root: Path, prefix: list[str], nats: Any
) -> dict[str, Any]:
    """The fan-out through one broker alone (``kind`` "one") or two brokers over NATS
    ("two": the publisher and half the subscribers at the first, half at the second)."""
    wait_for_quiet(args.wait_idle)
    keys = KeyFiles(root / "keys")
    count = args.subscribers
    with Cleanup() as stack:
        extra = ["--nats", nats.urls[0], "--nats-without-tls"] if kind == "two" else []
        brokers = []
        for index in range(2 if kind == "two" else 1):
            broker = Mc0Server(
                root / f"broker-{index}", prefix, secret_file=keys.secret_file, extra=extra
            )
            stack.callback(broker.stop)
            broker.start()
            brokers.append(broker)
        homes = [brokers[0], brokers[-1]]  # the two halves' brokers (the same one alone)
        halves = [count // 2, count - count // 2]
        subscribers = [
            Mc0Worker("subscribers", home.endpoint, keys.public, n, TOPIC, args.puts)
            for home, n in zip(homes, halves, strict=True)
            if n
        ]
        for worker in subscribers:
            stack.callback(worker.stop)
            worker.wait_ready()
        putter = Mc0Worker("putter", brokers[0].endpoint, keys.public, TOPIC, args.puts, 50, 100)
        stack.callback(putter.stop)
        putter.wait_ready()
        for broker in brokers:
            settle(broker.pid)
        processes = {
            **{f"broker {i}": b.pid for i, b in enumerate(brokers)},
            **({"nats-server": nats.nodes[0].process.pid} if kind == "two" else {}),
            "subscribers": 0,
            "publisher": putter.proc.pid,
        }
        workers = [w.proc.pid for w in subscribers]
        account = CpuAccount([p for p in processes.values() if p] + workers)
        before = {name: cpu_seconds(pid) for name, pid in processes.items() if pid}
        before["subscribers"] = sum(cpu_seconds(pid) for pid in workers)
        putter.go()
        put = putter.result()
        results = [worker.result() for worker in subscribers]
        after = {name: cpu_of([pid]) for name, pid in processes.items() if pid}
        after["subscribers"] = cpu_of(workers)
        foreign = account.stop()
    received = sum(r["received"] for r in results)
    elapsed = max(r["last"] for r in results) - min(r["first"] for r in results)
    cpu = {name: (after[name] - before[name]) / max(received, 1) * 1e6 for name in before}
    return {
        "kind": kind,
        "rate": received / max(elapsed, 1e-9),
        "received": received,
        "missing": args.puts * count - received,
        "bad": sum(r["bad"] for r in results),
        "puts_per_s": put["acks"] / max(put["end"] - put["start"], 1e-9),
        "put_acks": put["acks"],
        "cpu_us_per_message": {name: round(us, 2) for name, us in cpu.items()},
        "cpu_us_per_message_all": round(sum(cpu.values()), 2),
        "foreign_cores": foreign,
    }


def cluster_runs(args: argparse.Namespace, root: Path, prefix: list[str]) -> dict[str, Any]:
    """``--repeat`` pairs of the fan-out, one broker and two over NATS in turn."""
    from bus.nats.servers import NatsCluster

    nats = NatsCluster(root / "nats", size=1)
    runs: dict[str, list[dict[str, Any]]] = {"one": [], "two": []}
    try:
        nats.start()
        for index in range(args.repeat):
            order = ("one", "two") if index % 2 == 0 else ("two", "one")
            for kind in order:
                run = run_cluster(kind, args, root / f"cluster-{kind}-{index}", prefix, nats)
                runs[kind].append(run)
                print(describe(run, "MESSAGEs/s"), file=sys.stderr)
    finally:
        nats.stop()
    return runs


def report_cluster(
    args: argparse.Namespace,
    info: dict[str, Any],
    runs: dict[str, list[dict[str, Any]]],
    figures: dict[str, Figure],
) -> None:
    """Two brokers over NATS against one alone: medians, ratios, every process's CPU per
    MESSAGE. With ``--cluster-only`` its own SUMMARY; else lines before the main one."""
    rate = {kind: median([r["rate"] for r in rs]) for kind, rs in runs.items()}
    puts = {kind: median([r["puts_per_s"] for r in rs]) for kind, rs in runs.items()}
    cpu = {kind: median([r["cpu_us_per_message_all"] for r in rs]) for kind, rs in runs.items()}
    figures["cluster_fanout_vs_one"] = Figure(rate["two"] / rate["one"], "x one broker")
    figures["cluster_puts_vs_one"] = Figure(puts["two"] / puts["one"], "x one broker")
    figures["cluster_cpu_per_message"] = Figure(cpu["two"], "us", "lower")
    complete = all(r["missing"] == 0 and r["bad"] == 0 for rs in runs.values() for r in rs)

    def shares(kind: str) -> str:
        names = runs[kind][0]["cpu_us_per_message"]
        return ", ".join(
            f"{name} {median([r['cpu_us_per_message'][name] for r in runs[kind]]):.2f}"
            for name in names
        )

    measured = (
        f"two brokers over NATS: {fmt_rate(rate['two'])} MESSAGEs/s delivered, "
        f"{fmt_rate(puts['two'])} PUTs/s acknowledged ({args.puts} PUTs, "
        f"{args.subscribers} subscribers, half at each broker); CPU per MESSAGE "
        f"{cpu['two']:.2f} us ({shares('two')})"
    )
    baseline = (
        f"one broker: {fmt_rate(rate['one'])} MESSAGEs/s, {fmt_rate(puts['one'])} PUTs/s; "
        f"CPU per MESSAGE {cpu['one']:.2f} us ({shares('one')})"
    )
    ratio = (
        f"MESSAGEs/s {rate['two'] / rate['one']:.2f}, PUTs/s {puts['two'] / puts['one']:.2f}, "
        f"CPU per MESSAGE {cpu['two'] / cpu['one']:.2f} (two over NATS / one)"
    )
    if not args.cluster_only:
        for label, text in (("cluster", measured), ("one", baseline), ("ratio", ratio)):
            print(f"{label:<9}: {text}")
        return
    summary(
        "mc0 brokers over NATS",
        info,
        measured=measured,
        baseline=baseline + " (same run, alternating)",
        ratio=ratio,
        target="every MESSAGE delivered, once (the rates are measured, not targeted)",
        verdict=complete,
        details=[noise_line([r for rs in runs.values() for r in rs])],
        json_path=args.json,
        record={"cluster": runs},
        figures=figures,
    )


def describe(run: dict[str, Any], unit: str) -> str:
    extra = ", ".join(
        f"{k} {v:.2f}" if isinstance(v, float) else f"{k} {v}"
        for k, v in run.items()
        if k not in ("kind", "rate")
    )
    return f"{run['kind']:<8} {fmt_rate(run['rate']):>9} {unit}; {extra}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", type=int, default=50)
    parser.add_argument("--count", type=int, default=1000)
    parser.add_argument("--subscribers", type=int, default=100)
    parser.add_argument("--puts", type=int, default=5000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument(
        "--mc0d",
        type=Path,
        help="the bin directory of an mc0d built from source (mc0d, mc0torture)",
    )
    parser.add_argument("--mc0d-rounds", type=int, default=3)
    parser.add_argument("--mc0d-subscribers", type=int, default=50)
    parser.add_argument(
        "--mc0d-only", action="store_true", help="only the rounds against mc0d (with --mc0d)"
    )
    parser.add_argument(
        "--cluster", action="store_true", help="also two brokers over NATS against one"
    )
    parser.add_argument(
        "--cluster-only", action="store_true", help="only two brokers over NATS against one"
    )
    add_common_arguments(parser)
    args = parser.parse_args()
    if args.mc0d is not None:
        args.mc0d = args.mc0d.resolve()
        missing = [n for n in ("mc0d", "mc0torture") if not (args.mc0d / n).is_file()]
        if missing:
            parser.error(f"--mc0d {args.mc0d}: no {' or '.join(missing)} there")
    elif args.mc0d_only:
        parser.error("--mc0d-only needs --mc0d")
    terminate_on_sigterm()
    info = machine()
    prefix = server_prefix(args.server_prefix)
    if args.mc0d_only:
        with workdir("mc0-bench-", args.keep) as root:
            against = mc0d_rounds(args, root, prefix)
        report_mc0d(args, info, against, {})
        return
    if args.cluster_only:
        with workdir("mc0-bench-", args.keep) as root:
            clustered = cluster_runs(args, root, prefix)
        report_cluster(args, info, clustered, {})
        return
    runs: dict[str, dict[str, list[dict[str, Any]]]] = {
        "acks": {"baseline": [], "server": []},
        "fanout": {"baseline": [], "server": []},
    }
    with workdir("mc0-bench-", args.keep) as root:
        for index in range(args.repeat):
            for kind in ("baseline", "server"):
                run = run_acks(kind, args, root / f"acks-{kind}-{index}", prefix)
                runs["acks"][kind].append(run)
                print(describe(run, "acks/s"), file=sys.stderr)
                run = run_fanout(kind, args, root / f"fanout-{kind}-{index}", prefix)
                runs["fanout"][kind].append(run)
                print(describe(run, "MESSAGEs/s"), file=sys.stderr)
        against = mc0d_rounds(args, root, prefix) if args.mc0d is not None else None
        clustered = cluster_runs(args, root, prefix) if args.cluster else None
    acks = {kind: median([r["rate"] for r in rs]) for kind, rs in runs["acks"].items()}
    fanout = {kind: median([r["rate"] for r in rs]) for kind, rs in runs["fanout"].items()}
    server_runs = runs["acks"]["server"] + runs["fanout"]["server"]
    clean = all(r["missing"] == 0 and r.get("mismatched", 0) == 0 for r in server_runs)
    verdict = acks["server"] >= TARGET_ACKS and fanout["server"] >= TARGET_FANOUT and clean
    all_runs = [*runs["acks"]["baseline"], *runs["fanout"]["baseline"], *server_runs]
    figures = {
        "acks": Figure(acks["server"], "acks/s"),
        "acks_vs_raw": Figure(acks["server"] / acks["baseline"], "x raw"),
        "fanout": Figure(fanout["server"], "messages/s"),
        "fanout_vs_raw": Figure(fanout["server"] / fanout["baseline"], "x raw"),
    }
    if against is not None:
        report_mc0d(args, info, against, figures)
    if clustered is not None:
        report_cluster(args, info, clustered, figures)
    summary(
        "mc0 CURVE throughput",
        info,
        measured=f"{fmt_rate(acks['server'])} acknowledged commands/s "
        f"({args.clients} clients x {args.count} NOOPs); {fmt_rate(fanout['server'])} "
        f"MESSAGEs/s delivered ({args.puts} PUTs x {args.subscribers} subscribers)",
        baseline=f"raw pyzmq CURVE ROUTER: {fmt_rate(acks['baseline'])} acks/s; "
        f"{fmt_rate(fanout['baseline'])} MESSAGEs/s",
        ratio=f"acks {acks['server'] / acks['baseline']:.2f}; "
        f"fan-out {fanout['server'] / fanout['baseline']:.2f}",
        target=f">= {fmt_rate(TARGET_ACKS)} acks/s, >= {fmt_rate(TARGET_FANOUT)} MESSAGEs/s, "
        "zero missing or mismatched acks and messages",
        verdict=verdict,
        details=[
            ("missing", "none" if clean else "SOME ACKS OR MESSAGES MISSING (see runs)"),
            noise_line(all_runs),
        ],
        json_path=args.json,
        record={"runs": runs, "mc0d": against, "cluster": clustered},
        figures=figures,
    )


def report_mc0d(
    args: argparse.Namespace,
    info: dict[str, Any],
    against: dict[str, Any],
    figures: dict[str, Figure],
) -> None:
    """The rounds against mc0d: every round's ratio (the target holds in each), and their
    median as figures. With ``--mc0d-only`` its own SUMMARY; else lines printed before the
    main one, whose figures it adds to."""
    rounds = against["rounds"]
    torture = [r["torture"]["ratio"] for r in rounds]
    fanout = [r["fanout"]["ratio"] for r in rounds]
    complete = all(
        r["torture"][k]["acks"] == 50_000 and r["torture"][k]["returncode"] == 0
        for r in rounds
        for k in ("mc0d", "server")
    ) and all(r["fanout"][k]["missing"] == 0 for r in rounds for k in ("mc0d", "server"))
    figures["torture_vs_mc0d"] = Figure(median(torture), "x mc0d")
    figures["fanout_vs_mc0d"] = Figure(median(fanout), "x mc0d")
    measured = (
        "mc0torture (50 CURVE clients x 1000 acknowledged NOOPs): ours "
        + ", ".join(fmt_rate(r["torture"]["server"]["rate"]) for r in rounds)
        + " acks/s; fan-out (1 publisher, "
        f"{args.mc0d_subscribers} subscribers, {args.puts} PUTs): ours "
        + ", ".join(fmt_rate(r["fanout"]["server"]["rate"]) for r in rounds)
        + " MESSAGEs/s"
    )
    baseline = (
        "mc0d: "
        + ", ".join(fmt_rate(r["torture"]["mc0d"]["rate"]) for r in rounds)
        + " acks/s; "
        + ", ".join(fmt_rate(r["fanout"]["mc0d"]["rate"]) for r in rounds)
        + " MESSAGEs/s"
    )
    ratio = (
        "torture " + ", ".join(f"{x:.2f}" for x in torture)
        + "; fan-out " + ", ".join(f"{x:.2f}" for x in fanout) + " (ours / mc0d, round by round)"
    )  # fmt: skip
    verdict = min(torture) >= 1.0 and complete
    if not args.mc0d_only:
        for label, text in (("vs mc0d", measured), ("mc0d", baseline), ("ratio", ratio)):
            print(f"{label:<9}: {text}")
        return
    runs = [r[t][k] for r in rounds for t in ("torture", "fanout") for k in ("mc0d", "server")]
    summary(
        "mc0 against mc0d",
        info,
        measured=measured,
        baseline=baseline + " (same rounds, alternating)",
        ratio=ratio,
        target=">= 1.0 x mc0d's torture rate in every round; every ack and MESSAGE delivered",
        verdict=verdict,
        details=[noise_line(runs)],
        json_path=args.json,
        record={"mc0d": against},
        figures=figures,
    )


if __name__ == "__main__":
    main()
