"""What CURVE costs, same run: Event BUS delivery and eMQP's pipelined rate with CURVE on
against plain text, and what a new connection costs the server (handshake and ZAP).

* Event BUS: eventbus_throughput's run (a raw pyzmq publisher -> COLLECTOR -> store -> PUB
  -> a raw pyzmq subscriber, 6-frame events), the server plain, then with --server-cert and
  --client-certs (an allow-list of ALLOWED keys, every message checked against its key's
  rights), the generators then CURVE clients; alternating --repeat times.
* eMQP: emqp_broker's pipelined mode (C load generators, 4 workers, 1,000 outstanding), the
  broker plain, with --emqp-server-cert and --emqp-client-certs (the allow-list), and with
  the bench key's queues written in its certificate (every message checked); beside it the
  raw pyzmq relay plain and as a CURVE server, which tells how much of the loss is
  libzmq's encryption of every frame on these two cores, whatever the broker does.
* New connections: CONNECTIONS DEALERs, one after the other, connect to the collector,
  complete the handshake and close: the server's CPU per connection, plain, CURVE with any
  key (ZAP allow-any), and CURVE with the allow-list.

The load generators pay for their own encryption on the same two cores: the figures are
what a deployment on one machine sees.

    python bench/curve_cost.py [--repeat 3] [--events 200000] [--jobs 30000]
                               [--connections 2000]
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import emqp_broker
import eventbus_throughput
import zmq
import zmq.auth
from _common import (
    BusServer,
    Cleanup,
    Figure,
    add_common_arguments,
    cpu_seconds,
    fmt_rate,
    machine,
    median,
    noise_line,
    summary,
    terminate_on_sigterm,
    wait_for_quiet,
    workdir,
)
from _curve import ENV, SERVER_ENV

TARGET_RATIO = 0.7
ALLOWED = 1000


class Keys:
    """The server's key pair, the load generators' key pair, and an allow-list holding the
    generators' public key among ALLOWED keys."""

    def __init__(self, root: Path) -> None:
        root.mkdir(parents=True, exist_ok=True)
        _public, self.server_cert = zmq.auth.create_certificates(str(root), "server")
        self.allowed = root / "allowed"
        self.allowed.mkdir()
        _client_public, client_secret = zmq.auth.create_certificates(str(self.allowed), "bench")
        for number in range(ALLOWED - 1):
            zmq.auth.create_certificates(str(self.allowed), f"other-{number}")
        server_public, server_secret = zmq.auth.load_certificate(self.server_cert)
        assert server_secret is not None
        self.server_secret = server_secret.decode("ascii")
        public, secret = zmq.auth.load_certificate(client_secret)
        assert secret is not None
        for path in self.allowed.glob("*.key_secret"):
            path.unlink()  # an allow-list holds public certificates only
        self.client_env = b" ".join((server_public, public, secret)).decode("ascii")
        # The same list where the bench key's certificate names its queues (eMQP then
        # checks every message against them).
        from bus.transport.certs import set_metadata

        self.allowed_queues = root / "allowed-queues"
        shutil.copytree(self.allowed, self.allowed_queues)
        set_metadata(self.allowed_queues / "bench.key", {"queues": "default"})

    def options(self, prefix: str = "", allow_list: str | None = "keys") -> list[str]:
        """``allow_list``: None (any key), "keys" (the list, no rights written) or
        "queues" (the bench key's certificate names its queues)."""
        options = [f"--{prefix}server-cert", str(self.server_cert)]
        if allow_list is not None:
            folder = self.allowed_queues if allow_list == "queues" else self.allowed
            options += [f"--{prefix}client-certs", str(folder)]
        return options


@contextmanager
def generators_over_curve(keys: Keys | None) -> Iterator[None]:
    """Load generators started inside speak CURVE with the bench's key (None: plain)."""
    if keys is None:
        yield
        return
    os.environ[ENV] = keys.client_env
    os.environ[SERVER_ENV] = keys.server_secret  # for a raw baseline's server sockets
    try:
        yield
    finally:
        del os.environ[ENV], os.environ[SERVER_ENV]


def bus_runs(args: Any, root: Path, keys: Keys) -> dict[str, list[dict[str, Any]]]:
    runs: dict[str, list[dict[str, Any]]] = {"plain": [], "curve": []}
    for index in range(args.repeat):
        for kind in ("plain", "curve"):
            extra = keys.options() if kind == "curve" else []
            with generators_over_curve(keys if kind == "curve" else None):
                run = eventbus_throughput.run_once(
                    "server", args.events, root / kind, index, [], args.wait_idle, extra=extra
                )
            runs[kind].append(run)
            print(f"bus {index + 1}/{args.repeat} {kind:<5} {fmt_rate(run['rate'])} ev/s, "
                  f"lost {run['lost']}, server CPU {run['cpu_us_per_event']:.1f} us/event, "
                  f"publisher {run['publisher_cpu_us_per_event']:.1f}, subscriber "
                  f"{run['subscriber_cpu_us_per_event']:.1f}", flush=True)  # fmt: skip
    return runs


#: eMQP's modes: (target, broker's allow-list, CURVE on): the raw relay and the broker,
#: plain and over CURVE; the broker with the allow-list ("keys"), and with the bench key's
#: queues written in its certificate ("queues": every message checked against them).
EMQP_MODES: dict[str, tuple[str, str | None, bool]] = {
    "relay-plain": ("relay", None, False),
    "relay-curve": ("relay", None, True),
    "plain": ("broker", None, False),
    "curve": ("broker", "keys", True),
    "curve-queues": ("broker", "queues", True),
}


def broker_runs(args: Any, root: Path, keys: Keys) -> dict[str, list[dict[str, Any]]]:
    runs: dict[str, list[dict[str, Any]]] = {mode: [] for mode in EMQP_MODES}
    root.mkdir(parents=True, exist_ok=True)
    program = emqp_broker.build_c_peers(root)
    for index in range(args.repeat):
        for mode, (target, allow_list, curve_on) in EMQP_MODES.items():
            broker_option = (
                keys.options("emqp-", allow_list) if target == "broker" and curve_on else []
            )
            options = argparse.Namespace(
                server_prefix="",
                cpu_latency_us=None,
                broker_option=broker_option,
                program=program,
                jobs=args.jobs,
                wait_idle=args.wait_idle,
            )
            with generators_over_curve(keys if curve_on else None):
                results = emqp_broker.run_target(target, root / mode, index, options)
            run = results["pipelined"]
            runs[mode].append(run)
            print(f"eMQP {index + 1}/{args.repeat} {mode:<13} {fmt_rate(run['rate'])} jobs/s "
                  f"pipelined, CPU us/job {run['cpu_us_per_job']}", flush=True)  # fmt: skip
    return runs


def connection_runs(args: Any, root: Path, keys: Keys) -> dict[str, list[dict[str, Any]]]:
    modes: dict[str, tuple[list[str], Keys | None]] = {
        "plain": ([], None),
        "curve": (keys.options(allow_list=None), keys),
        "curve-allow-list": (keys.options(), keys),
    }
    runs: dict[str, list[dict[str, Any]]] = {mode: [] for mode in modes}
    for index in range(args.repeat):
        for mode, (extra, client_keys) in modes.items():
            wait_for_quiet(args.wait_idle)
            with Cleanup() as stack, generators_over_curve(client_keys):
                server = stack.server(BusServer(root / f"churn-{mode}-{index}", extra=tuple(extra)))
                churn = stack.worker("connect-churn", server.collector, args.connections)
                churn.wait_ready()
                before = cpu_seconds(server.pid)
                churn.go()
                result = churn.result()
                spent = cpu_seconds(server.pid) - before
                status = server.status()
            run = {
                "rate": result["rate"],
                "failed": result["failed"],
                "server_us_per_connection": spent / args.connections * 1e6,
                "accepted_by_zap": (status.get("curve") or {}).get("accepted", 0),
            }
            runs[mode].append(run)
            print(f"connections {index + 1}/{args.repeat} {mode:<16} "
                  f"{run['rate']:,.0f}/s, server {run['server_us_per_connection']:.0f} us each, "
                  f"{run['failed']} failed", flush=True)  # fmt: skip
    return runs


def _median(runs: Sequence[dict[str, Any]], key: str) -> float:
    return median([run[key] for run in runs])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--events", type=int, default=200_000)
    parser.add_argument("--jobs", type=int, default=30_000)
    parser.add_argument("--connections", type=int, default=2_000)
    parser.add_argument(
        "--only", choices=("bus", "emqp", "connections"), help="measure one of the three"
    )
    add_common_arguments(parser)
    args = parser.parse_args()
    terminate_on_sigterm()
    info = machine()
    with workdir("curve-cost-", args.keep) as root:
        keys = Keys(root / "keys")
        bus = bus_runs(args, root / "bus", keys) if args.only in (None, "bus") else None
        broker = broker_runs(args, root / "emqp", keys) if args.only in (None, "emqp") else None
        churn = (
            connection_runs(args, root / "churn", keys)
            if args.only in (None, "connections")
            else None
        )

    figures: dict[str, Figure] = {}
    measured, baseline, ratios = [], [], []
    verdict = True
    all_runs: list[dict[str, Any]] = []
    if bus is not None:
        curve, plain = _median(bus["curve"], "rate"), _median(bus["plain"], "rate")
        lost = sum(r["lost"] for r in bus["curve"] + bus["plain"])
        measured.append(f"Event BUS over CURVE {fmt_rate(curve)} events/s delivered")
        baseline.append(f"plain {fmt_rate(plain)} events/s")
        ratios.append(f"bus {curve / plain:.2f}")
        verdict &= curve / plain >= TARGET_RATIO and lost == 0
        figures["bus_curve"] = Figure(curve, "events/s")
        figures["bus_curve_vs_plain"] = Figure(curve / plain, "x plain")
        all_runs += bus["curve"] + bus["plain"]
    if broker is not None:
        rate = {mode: _median(runs, "rate") for mode, runs in broker.items()}
        curve, plain = rate["curve"], rate["plain"]
        relay = rate["relay-curve"] / rate["relay-plain"]
        measured.append(
            f"eMQP over CURVE {fmt_rate(curve)} jobs/s pipelined "
            f"({fmt_rate(rate['curve-queues'])} with every message checked against its "
            "key's queues)"
        )
        baseline.append(
            f"plain {fmt_rate(plain)} jobs/s; the raw relay {fmt_rate(rate['relay-plain'])} "
            f"plain, {fmt_rate(rate['relay-curve'])} over CURVE"
        )
        ratios.append(
            f"eMQP {curve / plain:.2f} ({rate['curve-queues'] / plain:.2f} with queues; "
            f"the raw relay keeps {relay:.2f})"
        )
        verdict &= curve / plain >= TARGET_RATIO
        figures["emqp_curve"] = Figure(curve, "jobs/s")
        figures["emqp_curve_vs_plain"] = Figure(curve / plain, "x plain")
        figures["emqp_relay_curve_vs_plain"] = Figure(relay, "x plain")
        pairs = [
            c["rate"] / p["rate"] for c, p in zip(broker["curve"], broker["plain"], strict=True)
        ]
        measured.append(
            "eMQP run by run (curve / plain, back to back): "
            + ", ".join(f"{ratio:.2f}" for ratio in pairs)
        )
        all_runs += [run for runs in broker.values() for run in runs]
    if churn is not None:
        cost = {mode: _median(runs, "server_us_per_connection") for mode, runs in churn.items()}
        failed = sum(r["failed"] for runs in churn.values() for r in runs)
        measured.append(
            f"a new connection costs the server {cost['curve']:.0f} us over CURVE, "
            f"{cost['curve-allow-list']:.0f} us with a {ALLOWED}-key allow-list"
        )
        baseline.append(f"{cost['plain']:.0f} us plain")
        ratios.append(
            f"CURVE and ZAP add {cost['curve-allow-list'] - cost['plain']:.0f} us per connection"
        )
        verdict &= failed == 0
        figures["connection_curve_us"] = Figure(cost["curve-allow-list"], "us", better="lower")
    summary(
        "what CURVE costs",
        info,
        measured="; ".join(measured),
        baseline="; ".join(baseline) + " (same run, same generators without CURVE)",
        ratio="; ".join(ratios) + " (CURVE / plain)",
        target=f"Event BUS and eMQP over CURVE >= {TARGET_RATIO} x plain; no refused handshake",
        verdict=verdict,
        details=[noise_line(all_runs)] if all_runs else [],
        json_path=args.json,
        record={"bus": bus, "emqp": broker, "connections": churn},
        figures=figures,
    )
    return 0 if verdict else 1


if __name__ == "__main__":
    sys.exit(main())
