"""eventmq's PUBLISH service (``emqp-pubsub``): publications/s through one service, and
across two services over NATS (``--nats``), in the same run.

* *Baseline* (the one-service figure): a publisher (raw pyzmq DEALER, blocking sends:
  libzmq's HWM pushes back) sends N PUBLISH (16 topics, 100-byte messages) to one
  ``twistd -n emqp-pubsub``; a subscriber process (raw pyzmq SUB of everything) counts them
  at the same service.
* *Measured*: the same publisher at service A, the subscriber at service B; A and B share one
  nats-server (``--nats``). Publications/s at the subscriber, first to last, and how many
  arrived (core NATS and a PUB drop what a slow reader cannot take: counted, not hidden).

CPU per publication of every process (the services, the nats-server; /proc) is printed.

    python bench/emqp_pubsub.py [--messages 100000] [--alone]

``--alone``: the one service only (what ``bench/ab.py`` compares with revisions before
``--nats``).
"""

from __future__ import annotations

import argparse
import subprocess
from pathlib import Path
from typing import Any

import _common as common
import zmq
from _common import PYTHON, Figure, cpu_seconds

SUBSCRIBER = r"""
import sys, time, zmq
ctx = zmq.Context(); sub = ctx.socket(zmq.SUB); sub.rcvhwm = 0
sub.subscribe(b""); sub.connect(sys.argv[1]); wanted = int(sys.argv[2])
poller = zmq.Poller(); poller.register(sub, zmq.POLLIN)
while not poller.poll(100):  # the warm-up publications say the subscription is in place
    pass
sub.recv_multipart(); print("joined", flush=True)
count, first, last = 0, 0.0, 0.0
while count < wanted and poller.poll(5000):
    topic = sub.recv_multipart()[0]
    if topic == b"warm":
        continue
    last = time.perf_counter(); first = first or last; count += 1
print(f"{count} {last - first}", flush=True)
"""


def service(tmp: Path, name: str, nats: str = "") -> tuple[subprocess.Popen[bytes], int]:
    """``twistd -n emqp-pubsub`` on free ports, once it serves: the process, its first port."""
    port = common.free_ports(2)
    args = [
        "emqp-pubsub", "--incoming-port", str(port), "--outgoing-port", str(port + 1),
        "--subscriber-hwm", "1000000", "--stats-interval", "0",
        *(["--nats", nats] if nats else []),
    ]  # fmt: skip
    ready = "the servers take" if nats else "eMQP PUBLISH service: publishers"
    return common.started_twistd(tmp, name, args, ready), port


def run(publish_port: int, subscribe_port: int, count: int, pids: list[int]) -> dict[str, Any]:
    """The load: publications/s at the subscriber, how many arrived, CPU per publication."""
    subscriber = subprocess.Popen(
        [PYTHON, "-c", SUBSCRIBER, f"tcp://127.0.0.1:{subscribe_port}", str(count)],
        stdout=subprocess.PIPE,
        text=True,
    )
    context = zmq.Context()
    dealer = context.socket(zmq.DEALER)
    dealer.connect(f"tcp://127.0.0.1:{publish_port}")
    assert subscriber.stdout is not None
    import select

    while not select.select([subscriber.stdout], [], [], 0.1)[0]:
        dealer.send_multipart([b"", b"eMQP/1.0", b"PUBLISH", b"w", b"warm", b"0"])
    subscriber.stdout.readline()  # joined
    message = b'"' + b"x" * 98 + b'"'
    topics = [f"topic.{n}".encode() for n in range(16)]
    cpu = sum(cpu_seconds(pid) for pid in pids)
    for n in range(count):
        dealer.send_multipart([b"", b"eMQP/1.0", b"PUBLISH", b"m", topics[n % 16], message])
    received, elapsed = subscriber.stdout.readline().split()
    used = sum(cpu_seconds(pid) for pid in pids) - cpu
    subscriber.wait(30)
    dealer.close(linger=0)
    context.term()
    return {
        "per_s": int(received) / max(float(elapsed), 1e-9),
        "received": int(received),
        "cpu_us": used / count * 1e6,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=100_000)
    parser.add_argument("--json", default=None)
    parser.add_argument("--alone", action="store_true", help="the one service only")
    args = parser.parse_args()
    info = common.machine()
    with common.temporary_directory("emqp-pubsub-bench-") as tmp:
        alone, port = service(tmp, "alone")
        try:
            one = run(port, port + 1, args.messages, [alone.pid])
        finally:
            common.stop_process(alone)
        if args.alone:
            common.summary(
                "eMQP PUBLISH service",
                info,
                measured=f"one service: {one['per_s']:,.0f}/s, {one['received']:,} arrived; "
                f"CPU {one['cpu_us']:.1f} us a publication",
                baseline="none (--alone)",
                ratio="-",
                target="nothing lost",
                verdict=one["received"] == args.messages,
                json_path=args.json,
                record={"one": one},
                figures={
                    "one_per_s": Figure(one["per_s"], "/s"),
                    "one_cpu_us": Figure(one["cpu_us"], "us", better="lower"),
                },
            )
            return 0
        from bus.nats.servers import NatsCluster

        nats = NatsCluster(tmp / "nats", size=1)
        nats.start()
        started: list[subprocess.Popen[bytes]] = []
        try:
            a, port_a = service(tmp, "a", nats.urls[0])
            started.append(a)
            b, port_b = service(tmp, "b", nats.urls[0])
            started.append(b)
            node = nats.nodes[0].process
            assert node is not None
            two = run(port_a, port_b + 1, args.messages, [a.pid, b.pid, node.pid])
        finally:
            for process in started:
                common.stop_process(process)
            nats.stop()
    ratio = two["per_s"] / one["per_s"]
    common.summary(
        "eMQP PUBLISH service across brokers",
        info,
        measured=(
            f"publisher at A, subscriber at B over NATS: {two['per_s']:,.0f}/s, "
            f"{two['received']:,} of {args.messages:,} arrived; CPU {two['cpu_us']:.1f} us a "
            "publication (A, B and the nats-server)"
        ),
        baseline=(
            f"one service: {one['per_s']:,.0f}/s, {one['received']:,} arrived; CPU "
            f"{one['cpu_us']:.1f} us a publication"
        ),
        ratio=f"{ratio:.2f} x the one service's publications/s",
        target="across brokers at least 0.5 x one service, nothing lost at this rate",
        verdict=ratio >= 0.5 and two["received"] == args.messages,
        json_path=args.json,
        record={"one": one, "two": two},
        figures={
            "one_per_s": Figure(one["per_s"], "/s"),
            "cluster_per_s": Figure(two["per_s"], "/s"),
            "cluster_cpu_us": Figure(two["cpu_us"], "us", better="lower"),
        },
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
