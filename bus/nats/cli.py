"""``bus-cluster``: try the Event BUS on a JetStream cluster on this machine (``make cluster``).

Starts three nats-server processes (one cluster, JetStream on, all on 127.0.0.1) and two
Event BUS front-ends (``twistd -n eventbus --store jetstream``) in front of one stream with
three replicas, prints where everything is, and stops it all on Ctrl-C (or SIGTERM). The
data stays under ``--dir`` for the next start.

    bus-cluster [--dir cluster-data] [--port 5556] [--nats-port 4222] [--front-ends 2]
                [--nats-route-port 6222] [--http-port 8642]

Front-end N (from 0) serves ports ``PORT + 3 N`` .. ``+2`` and ``/status`` on ``HTTP-PORT + N``.
"""

from __future__ import annotations

import argparse
import json
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from types import FrameType

from bus.nats.servers import NatsCluster, NatsServerMissing, nats_server_binary
from bus.util.cliargs import (
    CliParser,
    Progress,
    add_version,
    directory,
    fail,
    interruptible,
    made,
    whole_number,
)


def parser() -> argparse.ArgumentParser:
    """``bus-cluster``'s command line."""
    parser = CliParser(prog="bus-cluster", description=__doc__.splitlines()[0])
    add_version(parser)
    # Each is the first of a run of ports: front-end N uses PORT + 3 N .. + 2 (N up to 8).
    first_port = whole_number(1, 65535 - 3 * 9)
    parser.add_argument(
        "--dir",
        type=directory,
        default="cluster-data",
        help="where the servers keep data (made if its parent exists)",
    )
    parser.add_argument("--port", type=first_port, default=5556, help="the first front-end's port")
    parser.add_argument("--http-port", type=first_port, default=8642, help="the first /status port")
    parser.add_argument(
        "--nats-port", type=first_port, default=4222, help="the first NATS server's port"
    )
    parser.add_argument(
        "--nats-route-port",
        type=first_port,
        default=6222,
        help="the first NATS server's route port",
    )
    parser.add_argument(
        "--front-ends", type=whole_number(1, 9), default=2, help="how many (1 to 9)"
    )
    return parser


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    """``bus-cluster``'s arguments."""
    return parser().parse_args(argv)


def front_end_command(urls: list[str], port: int, http_port: int, data_dir: Path) -> list[str]:
    """The ``twistd`` command of one Event BUS front-end on the cluster's stream (three
    replicas)."""
    return [
        str(Path(sys.executable).parent / "twistd"),
        "-n",
        "--pidfile=",
        "eventbus",
        "--services",
        "eventbus",
        "--store",
        "jetstream",
        "--nats",
        ",".join(urls),
        "--nats-replicas",
        "3",
        "--port",
        str(port),
        "--http-port",
        str(http_port),
        "--data-dir",
        str(data_dir),
    ]


#: How long a front-end may take to connect to the servers and open its ports.
SERVE_BOUND = 120.0


def wait_serving(
    process: subprocess.Popen[bytes], http_port: int, stopped: Callable[[], bool]
) -> str | None:
    """Wait until the front-end's ``/status`` says its stream is connected (its ports are
    bound by then: the HTTP port starts after the service); what went wrong, or None."""
    deadline = time.monotonic() + SERVE_BOUND
    url = f"http://127.0.0.1:{http_port}/status"
    while time.monotonic() < deadline and not stopped():
        if process.poll() is not None:
            return f"ended (status {process.returncode})"
        try:
            with urllib.request.urlopen(url, timeout=2) as answer:
                status = json.load(answer)
        except (OSError, ValueError):
            status = {}
        jetstream = (status.get("services", {}).get("eventbus") or {}).get("jetstream") or {}
        if jetstream.get("connected"):
            return None
        time.sleep(0.2)
    return None if stopped() else f"did not serve within {SERVE_BOUND:.0f} s"


@interruptible("bus-cluster")
def main(argv: list[str] | None = None) -> int:
    """Run ``bus-cluster``: start the servers and the front-ends, wait for a signal, stop them
    all; SIGTERM ends it with status 0, Ctrl-C with one line saying what it stopped and 130."""
    args = parse(argv)
    directory = args.dir.resolve()
    progress = Progress("bus-cluster", "starting the NATS servers", "nothing started")
    terminated = False

    def terminate(signum: int, frame: FrameType | None) -> None:
        nonlocal terminated
        terminated = True

    signal.signal(signal.SIGTERM, terminate)
    # Ctrl-C only says so: what was started is stopped below, not left behind.
    progress.catch()
    cluster = None
    front_ends: list[subprocess.Popen[bytes]] = []
    try:
        nats_server_binary()  # before anything is made
        if made(directory):
            print(f"made {directory}")
        cluster = NatsCluster(
            directory / "nats",
            size=3,
            client_ports=range(args.nats_port, args.nats_port + 3),
            route_ports=range(args.nats_route_port, args.nats_route_port + 3),
        )
        cluster.start()
        print(f"NATS cluster: {', '.join(cluster.urls)} (logs in {directory / 'nats'})")
        for index in range(args.front_ends):
            if terminated or progress.interrupted:
                break
            progress.now(f"starting front-end {index + 1}", "the NATS servers started")
            port, http = args.port + 3 * index, args.http_port + index
            home = directory / f"front-end-{index + 1}"
            home.mkdir(exist_ok=True)
            with (home / "twistd.log").open("ab") as out:
                front_ends.append(
                    subprocess.Popen(
                        front_end_command(cluster.urls, port, http, home),
                        stdout=out,
                        stderr=subprocess.STDOUT,
                    )
                )
            print(
                f"front-end {index + 1}: snapshot tcp://127.0.0.1:{port}, publisher "
                f"{port + 1}, collector {port + 2}; http://127.0.0.1:{http}/status "
                f"(log {home / 'twistd.log'})"
            )
        for index, process in enumerate(front_ends):
            if terminated or progress.interrupted:
                break
            progress.now(f"waiting for front-end {index + 1} to serve", "the front-ends started")
            problem = wait_serving(process, args.http_port + index, lambda: terminated)
            if problem:
                fail("bus-cluster", f"front-end {index + 1} {problem}: see its log")
        progress.now("serving", "the NATS servers and the front-ends started")
        if not (terminated or progress.interrupted):
            print("ready; Ctrl-C stops everything", flush=True)
        while not (terminated or progress.interrupted):
            for process in front_ends:
                if process.poll() is not None:
                    print(f"a front-end ended (status {process.returncode}): see its log")
                    terminated = True
            time.sleep(0.2)
    except NatsServerMissing as error:
        fail("bus-cluster", error)
    except OSError as error:  # the directory, a server that did not start
        why = error.strerror or str(error)
        fail("bus-cluster", f"{error.filename}: {why}" if error.filename else why)
    finally:
        for process in front_ends:
            if process.poll() is None:
                process.terminate()
        for process in front_ends:
            try:
                process.wait(15)
            except subprocess.TimeoutExpired:
                process.kill()
        if cluster is not None:
            cluster.stop()
    if progress.interrupted:
        servers = "the 3 NATS servers" if cluster is not None else "nothing"
        progress.did(
            f"stopped {len(front_ends)} front-end(s) and {servers}; the data stays in {directory}"
        )
        progress.end()
    print("stopped")
    return 0


if __name__ == "__main__":
    sys.exit(main())
