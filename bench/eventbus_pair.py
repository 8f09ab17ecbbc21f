"""Event BUS primary/backup pair: delivered rate with sync replication, and takeover time.

Throughput: the raw pyzmq publisher and subscriber of ``eventbus_throughput.py`` (200k
events, 6 frames, 100-byte payload) against (a) one server alone (the baseline, same run)
and (b) the primary of a pair (``--ha-role primary``, sync replication: every event is
broadcast only once the backup stored it). Runs alternate; medians are reported.

Takeover: a pair at the default 1 s heartbeat and 1 s failover timeout, 1000 events in
it; ``kill -9`` of the active; a raw client that turns to the backup as soon as the
active's heartbeat has been missing for one heartbeat (a SYNCSTART to the backup every
100 ms from then on, as a subscriber with a 1 s heartbeat timeout would). Measured: from
the kill to the first heartbeat of the new active on its PUB socket, and to the answer
(SYNCEND) of the client's SYNCSTART.

    python bench/eventbus_pair.py [--events 200000] [--repeat 3] [--takeovers 3]
"""

from __future__ import annotations

import argparse
import signal
import sys
import time
from pathlib import Path
from typing import Any

import zmq
from _common import (
    BusServer,
    Cleanup,
    CpuAccount,
    add_common_arguments,
    fmt_rate,
    free_ports,
    machine,
    median,
    noise_line,
    server_prefix,
    summary,
    terminate_on_sigterm,
    wait_for_quiet,
    wait_until,
    workdir,
)

TARGET_RATIO = 0.7
TARGET_TAKEOVER = 2.0
HEARTBEAT = b"$heartbeat"


def pair_servers(
    stack: Cleanup,
    root: Path,
    prefix: list[str],
    extra: list[str] = (),  # type: ignore[assignment]
) -> tuple[BusServer, BusServer]:
    ports = [free_ports(4), free_ports(4)]
    while abs(ports[0] - ports[1]) < 4:
        ports[1] = free_ports(4)
    servers = []
    for index, role in enumerate(("primary", "backup")):
        other = ports[1 - index]
        server = BusServer(
            root / role,
            prefix=prefix if role == "primary" else (),
            port=ports[index],
            extra=[
                "--ha-role", role, "--ha-peer", f"127.0.0.1:{other + 3}", "--http-port", "0",
                *extra,
            ],
        )  # fmt: skip
        servers.append(stack.server(server))
    primary, backup = servers

    def formed() -> bool:
        a, b = primary.status().get("ha") or {}, backup.status().get("ha") or {}
        return bool(a.get("state") == "active" and a.get("paired") and b.get("in_sync"))

    wait_until(formed, 60, "the pair to form")
    return primary, backup


def throughput_once(
    kind: str, events: int, root: Path, prefix: list[str], wait_idle: float
) -> dict[str, Any]:
    wait_for_quiet(wait_idle)
    account = CpuAccount()
    with Cleanup() as stack:
        if kind == "pair":
            server, _ = pair_servers(stack, root, prefix)
        else:
            server = stack.server(BusServer(root / "alone", prefix=prefix))
        subscriber = stack.worker("subscribe", server.publisher, events)
        subscriber.wait_ready()
        publisher = stack.worker("publish", server.collector, events)
        publisher.wait_ready()
        publisher.go()
        publisher.result()
        received = subscriber.result()
    return {
        "kind": kind,
        "rate": received["rate"],
        "lost": received["lost"],
        "gaps": received["gaps"],
        "foreign_cores": account.stop(),
    }


def takeover_once(root: Path, prefix: list[str], wait_idle: float) -> dict[str, float]:
    wait_for_quiet(wait_idle)
    context = zmq.Context()
    try:
        with Cleanup() as stack:
            primary, backup = pair_servers(stack, root, prefix, ["--stats-interval", "0.2s"])
            publisher = stack.worker("publish", primary.collector, 1000)
            publisher.wait_ready()
            publisher.go()
            publisher.result()
            wait_until(lambda: (backup.status().get("ha") or {}).get("behind") == 0
                       and backup.status()["sequence"] == 1000, 30, "replicated")  # fmt: skip
            watch = context.socket(zmq.SUB)
            watch.linger = 0
            watch.setsockopt(zmq.SUBSCRIBE, HEARTBEAT)
            watch.connect(primary.publisher)
            watch.connect(backup.publisher)
            watch.rcvtimeo = 5000
            watch.recv_multipart()  # the active beats: we hear it
            client = context.socket(zmq.DEALER)
            client.linger = 0
            client.connect(backup.snapshot)
            assert primary.proc is not None
            primary.proc.send_signal(signal.SIGKILL)
            killed = time.monotonic()
            last_beat = killed
            knocking = False
            beat_at = answer_at = 0.0
            poller = zmq.Poller()
            poller.register(watch, zmq.POLLIN)
            poller.register(client, zmq.POLLIN)
            next_knock = 0.0
            while time.monotonic() - killed < 30 and not (beat_at and answer_at):
                now = time.monotonic()
                if not knocking and now - last_beat >= 1.0:
                    knocking = True
                if knocking and not answer_at and now >= next_knock:
                    client.send_multipart([b"SYNCSTART", b"", (1000).to_bytes(8, "big")])
                    next_knock = now + 0.1
                for sock, _ in poller.poll(10):
                    frames = sock.recv_multipart()
                    if sock is watch and not beat_at:
                        beat_at = time.monotonic()
                    elif sock is client and frames[0] == b"SYNCEND" and not answer_at:
                        answer_at = time.monotonic()
            watch.close()
            client.close()
            time.sleep(0.3)  # one status.json write (every 0.2 s) after the takeover
            status = backup.status()["ha"]
            return {
                "heartbeat_s": beat_at - killed if beat_at else float("inf"),
                "answer_s": answer_at - killed if answer_at else float("inf"),
                "state": status["state"],
                "reason": status["changes"][-1]["reason"] if status["changes"] else "",
            }
    finally:
        context.term()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--events", type=int, default=200_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--takeovers", type=int, default=3)
    parser.add_argument("--only", choices=("throughput", "takeover"), default=None)
    add_common_arguments(parser)
    args = parser.parse_args()
    terminate_on_sigterm()
    info = machine()
    prefix = server_prefix(args.server_prefix)
    verdict = True
    with workdir("bus-bench-pair-", args.keep) as root:
        if args.only in (None, "throughput"):
            runs: dict[str, list[dict[str, Any]]] = {"alone": [], "pair": []}
            for index in range(args.repeat):
                for kind in ("alone", "pair"):
                    run = throughput_once(
                        kind, args.events, root / f"{kind}-{index}", prefix, args.wait_idle
                    )
                    runs[kind].append(run)
                    print(
                        f"{kind:<6} {fmt_rate(run['rate'])} ev/s delivered, lost {run['lost']}, "
                        f"gaps {run['gaps']}; other processes {run['foreign_cores']:.2f} cores",
                        file=sys.stderr,
                    )
            pair_rate = median([r["rate"] for r in runs["pair"]])
            alone_rate = median([r["rate"] for r in runs["alone"]])
            ratio = pair_rate / alone_rate
            ok = ratio >= TARGET_RATIO and all(r["lost"] == 0 for r in runs["pair"])
            verdict = verdict and ok
            summary(
                "Event BUS pair, sync replication",
                info,
                f"{fmt_rate(pair_rate)} events/s delivered by the primary of a pair, lost "
                f"{sum(r['lost'] for r in runs['pair'])}",
                f"one server alone, same run: {fmt_rate(alone_rate)} events/s",
                f"{ratio:.2f}",
                f">= {TARGET_RATIO} x a single server, none lost",
                ok,
                [noise_line(runs["alone"] + runs["pair"])],
                args.json,
                {"runs": runs},
            )
        if args.only in (None, "takeover"):
            takeovers = [
                takeover_once(root / f"takeover-{i}", prefix, args.wait_idle)
                for i in range(args.takeovers)
            ]
            for run in takeovers:
                print(
                    f"takeover: first heartbeat {run['heartbeat_s']:.2f}s, SYNCEND "
                    f"{run['answer_s']:.2f}s after kill -9 ({run['state']}: {run['reason']})",
                    file=sys.stderr,
                )
            worst = max(r["answer_s"] for r in takeovers)
            ok = worst < TARGET_TAKEOVER and all(r["state"] == "active" for r in takeovers)
            verdict = verdict and ok
            summary(
                "Event BUS pair takeover at a 1 s heartbeat",
                info,
                "kill -9 -> first heartbeat of the new active: "
                + ", ".join(f"{r['heartbeat_s']:.2f}" for r in takeovers)
                + " s; -> answer to a client's SYNCSTART: "
                + ", ".join(f"{r['answer_s']:.2f}" for r in takeovers)
                + " s",
                "the failover timeout (1 s) the rules wait by design",
                f"worst {worst:.2f} s",
                f"< {TARGET_TAKEOVER} s",
                ok,
            )
    return 0 if verdict else 1


if __name__ == "__main__":
    sys.exit(main())
