"""``bus-cluster``: try the Event BUS on a JetStream cluster on this machine (``make cluster``),
and restart a cluster's servers one at a time without an election (``roll``).

Without a command, starts three nats-server processes (one cluster, JetStream on, all on
127.0.0.1) and two Event BUS front-ends (``twistd -n eventbus --store jetstream``) in front
of one stream with three replicas, prints where everything is, starts again any of them
that ends (as a service manager would), and stops it all on Ctrl-C (or SIGTERM). The data
stays under ``--dir`` for the next start.

    bus-cluster [--dir cluster-data] [--port 5556] [--nats-port 4222] [--front-ends 2]
                [--nats-route-port 6222] [--http-port 8642]
                [--with mc0,dbp,emqp,emqp-pubsub [--with-port 5656]]

Front-end N (from 0) serves ports ``PORT + 3 N`` .. ``+2`` and ``/status`` on ``HTTP-PORT + N``.
``--with`` composes the other protocols into each front-end's process, each on the same NATS
cluster (mc0's brokers and eMQP's PUBLISH services sharing their topics over core NATS
subjects, eMQP's brokers on its stream, DBP's instances on its bucket): front-end N's serve
the ports ``WITH-PORT + 8 N`` .. ``+6`` (:data:`WITH_PORTS`; 0: free ones), each said once it
serves.

The commands (:mod:`bus.nats.roll` has the procedure), against the cluster that
``bus-cluster`` runs in ``--dir``, or any cluster given its URLs (``--nats``) and how to
stop and start its servers and front-ends::

    bus-cluster roll [--dir DIR | --nats URLS --stop CMD --start CMD] [--server NAME ...]
                     [--front-end STATUS-URL ... --front-end-stop CMD --front-end-start CMD]
    bus-cluster step-down NAME [--nats URLS]      # every leader off NAME, waited for
    bus-cluster wait-current NAME [--nats URLS]   # NAME's replicas current, waited for
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import ssl
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Sequence
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any

from bus.nats import handshake
from bus.nats.blocking import Connection, connector
from bus.nats.credentials import Credentials, CredentialsError, shown
from bus.nats.handshake import ConnectError
from bus.nats.roll import (
    DEFAULT_TIMEOUT,
    Commands,
    Control,
    FrontEnd,
    JetStreamApi,
    Roll,
    RollError,
    Server,
    check_template,
)
from bus.nats.servers import NatsCluster, NatsServerMissing, nats_server_binary
from bus.nats.settings import NatsSettings
from bus.util.cliargs import (
    CliParser,
    Progress,
    add_version,
    directory,
    duration,
    fail,
    interruptible,
    made,
    parse,
    whole_number,
)

if TYPE_CHECKING:
    from psutil import Process

#: What ``bus-cluster`` writes in ``--dir`` while it runs: its processes, for ``roll``.
STATE_FILE = "cluster.json"
#: The nats-servers' lame-duck timings: the front-ends' connections leave at the INFO that
#: says lame duck, so the grace period before the server closes its clients only delays its
#: exit (nats-server's defaults: 10 s, then clients closed over 2 minutes). 30 s is the
#: least lame-duck duration nats-server takes.
LAME_DUCK = 'lame_duck_duration: "30s"\nlame_duck_grace_period: "2s"\n'

#: What ``--with`` composes beside the Event BUS, each port's offset from front-end N's first
#: (``WITH-PORT + 8 N``): mc0's broker; DBP's catalog (its ROUTER and UDP heartbeats); eMQP's
#: worker, client and admin ports; eMQP's PUBLISH service's publishers and subscribers.
WITH_PORTS: dict[str, dict[str, int]] = {
    "mc0": {"port": 0},
    "dbp": {"port": 1},
    "emqp": {"worker-port": 2, "client-port": 3, "admin-port": 4},
    "emqp-pubsub": {"incoming-port": 5, "outgoing-port": 6},
}
#: The ports ``--with`` takes from ``--with-port`` for each front-end.
WITH_STRIDE = 8


def _protocols(text: str) -> list[str]:
    """``--with``'s value: services of :data:`WITH_PORTS`, comma-separated, each once."""
    wanted = [name.strip() for name in text.split(",") if name.strip()]
    unknown = [name for name in wanted if name not in WITH_PORTS]
    if unknown or not wanted:
        raise argparse.ArgumentTypeError(
            f"{', '.join(unknown) or 'nothing'}: name any of {', '.join(WITH_PORTS)}"
        )
    return list(dict.fromkeys(wanted))


def _template(text: str) -> str:
    try:
        return check_template(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def parser() -> argparse.ArgumentParser:
    """``bus-cluster``'s command line."""
    # No abbreviations: the commands' --nats would read as one of the program's --nats-port
    # and --nats-route-port (argparse matches the program's options over the whole line).
    parser = CliParser(prog="bus-cluster", description=__doc__.splitlines()[0], allow_abbrev=False)
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
    parser.add_argument(
        "--with",
        dest="protocols",
        type=_protocols,
        default=[],
        metavar="SERVICES",
        help="also run these in each front-end's process, on the same NATS cluster: any of "
        "mc0, dbp, emqp, emqp-pubsub (comma-separated)",
    )
    parser.add_argument(
        "--with-port",
        type=whole_number(0, 65535 - WITH_STRIDE * 9),
        default=5656,
        help="the first port of --with's services (front-end N's from PORT + 8 N; 0: free ones)",
    )
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    roll = commands.add_parser(
        "roll",
        help="restart every nats-server, then every front-end, one at a time, without an election",
        description="Restart a cluster's nats-servers one at a time (its leaders stepped down, "
        "lame-duck mode, started again, its replicas current again), then its front-ends.",
    )
    _cluster_options(roll)
    roll.add_argument(
        "--server",
        dest="servers",
        action="append",
        metavar="NAME",
        help="restart this server (repeat: in this order; default: every one, in --nats order)",
    )
    roll.add_argument(
        "--stop",
        type=_template,
        help="with --nats: the command that stops a server in lame-duck mode and returns once "
        "it exited, e.g. 'ssh {host} sudo systemctl stop nats-server' ({name} {url} {host} {port})",
    )
    roll.add_argument("--start", type=_template, help="with --nats: the command that starts it")
    roll.add_argument(
        "--front-end",
        dest="front_ends",
        action="append",
        metavar="STATUS-URL",
        help="a front-end to restart after the servers, e.g. http://h1:8642/status (repeat)",
    )
    roll.add_argument(
        "--front-end-stop",
        type=_template,
        help="the command that stops a front-end (SIGTERM) and returns once it exited "
        "({url} {host} {port}: its /status's)",
    )
    roll.add_argument("--front-end-start", type=_template, help="the command that starts it")
    roll.add_argument(
        "--http-token-file", type=Path, help="file of the front-ends' /status bearer token"
    )
    roll.add_argument("--no-servers", action="store_true", help="restart the front-ends only")
    roll.add_argument("--no-front-ends", action="store_true", help="restart the nats-servers only")
    for name, what in (
        ("step-down", "move every stream and consumer leadership off one server, and wait"),
        (
            "wait-current",
            "wait until one server's replicas of every stream and consumer are current",
        ),
    ):
        command = commands.add_parser(name, help=what, description=what[0].upper() + what[1:] + ".")
        _cluster_options(command)
        command.add_argument("server", metavar="NAME", help="the server's name (its server_name)")
    return parser


def _cluster_options(command: argparse.ArgumentParser) -> None:
    """Which cluster, and how to reach it: ``--dir`` of a running ``bus-cluster``, or
    ``--nats`` with the credentials front-ends take."""
    command.add_argument(
        "--dir",
        type=directory,
        default=argparse.SUPPRESS,  # the program's --dir, given before the command, stays
        help="the directory of a running bus-cluster (default cluster-data), unless --nats",
    )
    command.add_argument(
        "--nats", help="the cluster's servers, nats://HOST:PORT[,nats://...], every one of them"
    )
    command.add_argument(
        "--nats-user", help="the NATS user (its password from --nats-password-file)"
    )
    command.add_argument("--nats-password-file", help="a file holding the NATS user's password")
    command.add_argument("--nats-token-file", help="a file holding the NATS token")
    command.add_argument("--nats-nkey", help="a NATS user's NKEY seed file")
    command.add_argument("--nats-creds", help="a NATS credentials file (user JWT and seed)")
    command.add_argument("--nats-tls-ca", type=Path, help="the CA that signed the servers")
    command.add_argument("--nats-tls-cert", type=Path, help="this client's TLS certificate")
    command.add_argument("--nats-tls-key", type=Path, help="its private key")
    command.add_argument(
        "--timeout",
        type=duration,
        default=DEFAULT_TIMEOUT,
        help="how long each step may take (a replica catching up: minutes), e.g. 5m",
    )


def front_end_command(
    urls: list[str],
    port: int,
    http_port: int,
    data_dir: Path,
    pid_file: Path | None = None,
    protocols: Sequence[str] = (),
    with_port: int = 0,
) -> list[str]:
    """The ``twistd`` command of one Event BUS front-end on the cluster's stream (three
    replicas); with ``protocols``, those composed beside it on the same cluster, their ports
    from ``with_port`` (:data:`WITH_PORTS`), their data under ``data_dir``."""
    more: list[str] = []
    joined = ",".join(urls)
    for name in protocols:
        more += [f"--{name}-nats", joined]
        more += [f"--{name}-{option}={with_port + offset if with_port else 0}"
                 for option, offset in WITH_PORTS[name].items()]  # fmt: skip
        if name != "emqp-pubsub":  # the one that keeps nothing
            more += [f"--{name}-data-dir", str(data_dir / name)]
        if name in ("emqp", "dbp"):  # a stream, a bucket: three replicas, as the Event BUS's
            more += [f"--{name}-nats-replicas", "3"]
        if name == "emqp":
            more += ["--emqp-store", "jetstream"]
        if name == "mc0":  # CURVE (the broker's key pair in its data directory) on 127.0.0.1
            more += ["--mc0-nats-without-tls"]
    return [
        str(Path(sys.executable).parent / "twistd"),
        "-n",
        f"--pidfile={pid_file or ''}",
        "eventbus",
        "--services",
        ",".join(["eventbus", *protocols]),
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
        *more,
    ]


#: How long a front-end may take to connect to the servers and open its ports.
SERVE_BOUND = 120.0


def on_the_cluster(status: dict[str, Any], protocols: Sequence[str] = ()) -> bool:
    """Whether a front-end's ``/status`` says it and each of ``protocols`` beside it are on
    the cluster: the Event BUS's and eMQP's streams connected, mc0's and eMQP pub/sub's links
    up, DBP's view of its bucket current."""
    services = status.get("services") or {}

    def section(name: str, key: str) -> dict[str, Any]:
        return dict((services.get(name) or {}).get(key) or {})

    checks = {
        "eventbus": lambda: section("eventbus", "jetstream").get("connected"),
        "emqp": lambda: section("emqp", "jetstream").get("connected"),
        "mc0": lambda: section("mc0", "cluster").get("connected"),
        "emqp-pubsub": lambda: section("emqp-pubsub", "cluster").get("connected"),
        "dbp": lambda: section("dbp", "shared").get("current"),
    }
    return all(checks[name]() for name in ("eventbus", *protocols))


def wait_serving(
    process: subprocess.Popen[bytes],
    http_port: int,
    stopped: Callable[[], bool],
    protocols: Sequence[str] = (),
) -> str | None:
    """Wait until the front-end's ``/status`` says its stream is connected, and each of
    ``protocols`` is on the cluster (:func:`on_the_cluster`; its ports are bound by then: the
    HTTP port starts after the services); what went wrong, or None."""
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
        if on_the_cluster(status, protocols):
            return None
        time.sleep(0.2)
    return None if stopped() else f"did not serve within {SERVE_BOUND:.0f} s"


class _FrontEndProcess:
    """One front-end the demo runs: its command, process and ``/status`` port."""

    def __init__(self, index: int, command: list[str], http_port: int, home: Path) -> None:
        self.index, self.command, self.http_port, self.home = index, command, http_port, home
        self.pid_file = home / "twistd.pid"
        self.process: subprocess.Popen[bytes] | None = None
        #: Whether it served once: one that ends before it ever did is a mistake to show,
        #: not to start again.
        self.served = False

    def start(self) -> None:
        with (self.home / "twistd.log").open("ab") as out:
            self.process = subprocess.Popen(self.command, stdout=out, stderr=subprocess.STDOUT)


@interruptible("bus-cluster")
def main(argv: list[str] | None = None) -> int:
    """Run ``bus-cluster``: without a command, start the servers and the front-ends, wait
    for a signal, stop them all (SIGTERM ends it with status 0, Ctrl-C with one line saying
    what it stopped and 130); with one, run it against a cluster."""
    args = parse(parser(), argv)
    if args.command is None:
        return demo(args)
    if args.command == "roll":
        _check_roll(args)
    return operate(args, _how_to_connect(args))


def _check_roll(args: argparse.Namespace) -> None:
    """What ``roll`` needs beside a cluster of its own: how to stop and start each kind of
    process it restarts (a cluster that ``bus-cluster`` runs is its own)."""
    prog = "bus-cluster roll"
    if not args.nats:
        given = [o for o in ("stop", "start", "front_end_stop", "front_end_start", "front_ends")
                 if getattr(args, o)]  # fmt: skip
        if given:
            option = "--" + given[0].replace("_", "-")
            fail(prog, f"{option} is for a cluster named with --nats", 2)
        return
    if not args.no_servers and not (args.stop and args.start):
        fail(prog, "--nats needs --stop and --start: how its servers stop and start", 2)
    wanted = args.front_ends and not args.no_front_ends
    if wanted and not (args.front_end_stop and args.front_end_start):
        fail(prog, "--front-end needs --front-end-stop and --front-end-start", 2)


def demo(args: argparse.Namespace) -> int:
    """The cluster on this machine (``bus-cluster`` without a command)."""
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
    front_ends: list[_FrontEndProcess] = []
    state = directory / STATE_FILE
    try:
        nats_server_binary()  # before anything is made
        if made(directory):
            print(f"made {directory}")
        cluster = NatsCluster(
            directory / "nats",
            size=3,
            client_ports=range(args.nats_port, args.nats_port + 3),
            route_ports=range(args.nats_route_port, args.nats_route_port + 3),
            extra=LAME_DUCK,
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
            with_port = args.with_port + WITH_STRIDE * index if args.with_port else 0
            command = front_end_command(
                cluster.urls, port, http, home, home / "twistd.pid", args.protocols, with_port
            )
            end = _FrontEndProcess(index, command, http, home)
            end.start()
            front_ends.append(end)
            print(
                f"front-end {index + 1}: snapshot tcp://127.0.0.1:{port}, publisher "
                f"{port + 1}, collector {port + 2}; http://127.0.0.1:{http}/status "
                f"(log {home / 'twistd.log'})"
            )

        for end in front_ends:
            if terminated or progress.interrupted:
                break
            progress.now(
                f"waiting for front-end {end.index + 1} to serve", "the front-ends started"
            )
            assert end.process is not None
            problem = wait_serving(end.process, end.http_port, lambda: terminated, args.protocols)
            if problem:
                fail("bus-cluster", f"front-end {end.index + 1} {problem}: see its log")
            end.served = True
            for line in _endpoints(end.http_port, args.protocols):
                print(f"front-end {end.index + 1}'s {line}", flush=True)
        progress.now("serving", "the NATS servers and the front-ends started")
        _write_state(state, cluster, front_ends)
        if not (terminated or progress.interrupted):
            print("ready; Ctrl-C stops everything", flush=True)
        while not (terminated or progress.interrupted):
            _start_again(cluster, front_ends)
            time.sleep(0.2)
    except NatsServerMissing as error:
        fail("bus-cluster", error)
    except OSError as error:  # the directory, a server that did not start
        why = error.strerror or str(error)
        fail("bus-cluster", f"{error.filename}: {why}" if error.filename else why)
    finally:
        state.unlink(missing_ok=True)
        for end in front_ends:
            if end.process is not None and end.process.poll() is None:
                end.process.terminate()
        for end in front_ends:
            if end.process is None:
                continue
            try:
                end.process.wait(15)
            except subprocess.TimeoutExpired:
                end.process.kill()
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


def _start_again(cluster: NatsCluster, front_ends: list[_FrontEndProcess]) -> None:
    """A process that ended is started again (a roll stops them one at a time; a killed one
    comes back too), said in one line each; a front-end that ends before it ever served
    ends the demo (its log says why)."""
    for node in cluster.nodes:
        if node.process is not None and node.process.poll() is not None:
            print(
                f"nats-server {node.name} ended (status {node.process.returncode}); starting it again"
            )
            cluster.start(node, timeout=30)
    for end in front_ends:
        assert end.process is not None
        if end.process.poll() is None:
            if not end.served:
                end.served = _says_connected(end.http_port)
            continue
        if not end.served:
            fail(
                "bus-cluster",
                f"front-end {end.index + 1} ended (status {end.process.returncode}) before it served: see its log",
            )
        print(
            f"front-end {end.index + 1} ended (status {end.process.returncode}); starting it again",
            flush=True,
        )
        end.served = False
        end.start()


def _endpoints(http_port: int, protocols: Sequence[str]) -> list[str]:
    """Where each of ``protocols`` composed into a front-end serves, as its ``/status`` says."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{http_port}/status", timeout=5) as answer:
            services = json.load(answer).get("services") or {}
    except (OSError, ValueError) as error:
        return [f"services: /status unread ({error})"] if protocols else []
    lines = []
    for name in protocols:
        status = services.get(name) or {}
        if name == "mc0":
            where = f"broker {status.get('endpoint')} (key {status.get('server_public_key')})"
        elif name == "dbp":
            where = f"catalog {status.get('endpoint')} (UDP heartbeats on {status.get('udp_port')})"
        else:
            endpoints = status.get("endpoints") or {}
            where = ", ".join(f"{port} {endpoint}" for port, endpoint in endpoints.items())
        lines.append(f"{name}: {where}")
    return lines


def _says_connected(http_port: int) -> bool:
    return FrontEnd(f"http://127.0.0.1:{http_port}/status").serving()


def _write_state(path: Path, cluster: NatsCluster, front_ends: list[_FrontEndProcess]) -> None:
    """What ``roll`` reads: this process, the servers (name, URL, pid file), the front-ends
    (``/status`` URL, pid file)."""
    state = {
        "pid": os.getpid(),
        "servers": [
            {"name": node.name, "url": node.url, "pid_file": str(node.pid_file)}
            for node in cluster.nodes
        ],
        "front_ends": [
            {"status": f"http://127.0.0.1:{end.http_port}/status", "pid_file": str(end.pid_file)}
            for end in front_ends
        ],
    }
    temporary = path.with_suffix(".tmp")
    temporary.write_text(json.dumps(state, indent=1) + "\n")
    temporary.replace(path)


# -- the commands -----------------------------------------------------------------------------


def _how_to_connect(args: argparse.Namespace) -> Callable[[Sequence[str]], Connection]:
    """What connects to the first of some servers that admits it, with the options'
    credentials and TLS (each checked now: a missing file is one line, before anything)."""
    try:
        credentials = Credentials.from_options(
            user=args.nats_user,
            password_file=args.nats_password_file,
            token_file=args.nats_token_file,
            nkey=args.nats_nkey,
            creds=args.nats_creds,
        )
        if credentials.given:
            credentials.check()
    except CredentialsError as error:
        fail(f"bus-cluster {args.command}", error, 2)
    servers = tuple(u.strip() for u in (args.nats or "").split(",") if u.strip())
    prog = f"bus-cluster {args.command}"
    try:
        settings = NatsSettings(
            servers=servers or ("nats://127.0.0.1:4222",),
            credentials=credentials,
            tls_ca=args.nats_tls_ca,
            tls_cert=args.nats_tls_cert,
            tls_key=args.nats_tls_key,
        )
        for url in settings.servers:
            handshake.server(url)  # a URL that names no server is said now
        connect = connector(settings, "bus-cluster")  # reads the TLS files now
    except (ValueError, ConnectError, CredentialsError) as error:
        fail(prog, f"--nats: {error}", 2)
    except (OSError, ssl.SSLError) as error:
        fail(prog, f"TLS: {error.strerror or error if isinstance(error, OSError) else error}")
    args.nats_servers = list(settings.servers) if servers else []
    return connect


class DemoControl:
    """How ``roll`` stops and starts what ``bus-cluster`` runs in a directory: a signal to
    the process (SIGUSR2 to a nats-server: lame-duck mode, as ``nats-server --signal ldm``
    sends it; SIGTERM to a front-end), then its end waited for; ``bus-cluster`` starts it
    again by itself."""

    def __init__(self, state: dict[str, Any], timeout: float) -> None:
        self.pid_files = {s["url"]: Path(s["pid_file"]) for s in state["servers"]}
        self.pid_files.update({f["status"]: Path(f["pid_file"]) for f in state["front_ends"]})
        self.timeout = timeout
        self._stopped: dict[str, int] = {}

    def _key(self, what: Server | FrontEnd) -> str:
        return what.url if isinstance(what, Server) else what.status_url

    def stop(self, what: Server | FrontEnd) -> None:
        """Signal it, and wait until it exited."""
        import psutil

        path = self.pid_files[self._key(what)]
        process = _owner(path)
        with contextlib.suppress(psutil.NoSuchProcess):  # it ended by itself meanwhile
            # psutil signals only the process it looked at, never one that took its pid.
            process.send_signal(signal.SIGUSR2 if isinstance(what, Server) else signal.SIGTERM)
        self._stopped[self._key(what)] = process.pid
        deadline = time.monotonic() + self.timeout
        while not _ended(process):
            if time.monotonic() > deadline:
                raise RollError(f"process {process.pid} did not exit within {self.timeout:g} s")
            time.sleep(0.1)

    def start(self, what: Server | FrontEnd) -> None:
        """Nothing to do: ``bus-cluster`` starts what ended; wait for its new process."""
        path = self.pid_files[self._key(what)]
        old = self._stopped.get(self._key(what))
        deadline = time.monotonic() + self.timeout
        while True:
            try:
                pid = int(path.read_text().split()[0])
            except (OSError, ValueError, IndexError):
                pid = None
            if pid is not None and pid != old and _alive(pid):
                return
            if time.monotonic() > deadline:
                raise RollError(f"bus-cluster did not start {path.parent.name} again")
            time.sleep(0.1)


#: How much earlier than a process's start its pid file may look written (the file
#: system's clock and the start time psutil derives from the boot time differ a little).
PID_FILE_SLACK = 1.0


def _owner(path: Path) -> Process:
    """The process named by the pid file ``path``, if it is the one that wrote it.

    A process writes its pid file after it starts. One that started after the file was
    written took the pid of a process that ended without removing its file: signalling
    it would stop a stranger."""
    import psutil

    try:
        pid = int(path.read_text().split()[0])
        written = path.stat().st_mtime
    except (OSError, ValueError, IndexError) as error:
        raise RollError(f"{path}: no process id to signal ({error})") from None
    try:
        process = psutil.Process(pid)
        started = process.create_time()
    except psutil.NoSuchProcess:
        raise RollError(f"{path}: process {pid} does not run (a stale pid file)") from None
    if started > written + PID_FILE_SLACK:
        raise RollError(
            f"{path}: process {pid} started after this file was written: the file is "
            "stale and that process is another's, so it is not signalled"
        )
    return process


def _ended(process: Process) -> bool:
    """Whether ``process`` ended: gone, its pid another's, or a zombie (not waited for by its
    parent, whose business that is; psutil's own wait would wait for that too)."""
    import psutil

    try:
        return not process.is_running() or process.status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def _alive(pid: int) -> bool:
    """Whether process ``pid`` runs (one that ended and is not reaped yet does not)."""
    import psutil

    if pid <= 0:  # no pid written (psutil would name the kernel's pid 0)
        return False
    try:
        return not _ended(psutil.Process(pid))
    except psutil.NoSuchProcess:
        return False


def _demo_state(args: argparse.Namespace) -> dict[str, Any]:
    """The state of the ``bus-cluster`` running in ``--dir``, or one line saying there is none."""
    directory = Path(getattr(args, "dir", "cluster-data")).resolve()
    path = directory / STATE_FILE
    try:
        state: dict[str, Any] = json.loads(path.read_text())
    except (OSError, ValueError):
        state = {}
    if not state or not _alive(int(state.get("pid") or 0)):
        fail(
            f"bus-cluster {args.command}",
            f"no bus-cluster runs in {directory} (start one, or name a cluster with --nats)",
        )
    return state


def operate(args: argparse.Namespace, connect: Callable[[Sequence[str]], Connection]) -> int:
    """Run ``roll``, ``step-down`` or ``wait-current``: progress on stdout, a failure in
    one line (status 1), Ctrl-C in one line saying what was done (status 130)."""
    prog = f"bus-cluster {args.command}"
    demo_state = None if args.nats_servers else _demo_state(args)
    urls = args.nats_servers or [s["url"] for s in demo_state["servers"]]  # type: ignore[index]
    progress = Progress(prog, "connecting", "nothing done")
    api = JetStreamApi(urls, connect)
    roll = Roll(
        api, say=lambda line: print(line, flush=True), timeout=args.timeout, doing=progress.now
    )
    progress.did(lambda: "; ".join(roll.done) or "nothing done")
    try:
        api.check()
        if args.command == "step-down":
            roll.holding(args.server)
            roll.step_down(args.server)
        elif args.command == "wait-current":
            roll.wait_current(args.server, roll.holding(args.server))
        else:
            _roll(args, roll, urls, connect, demo_state)
    except KeyboardInterrupt:
        progress.end()
    except RollError as error:
        fail(prog, error)
    finally:
        api.close()
    return 0


def _roll(
    args: argparse.Namespace,
    roll: Roll,
    urls: list[str],
    connect: Callable[[Sequence[str]], Connection],
    demo_state: dict[str, Any] | None,
) -> None:
    prog = "bus-cluster roll"
    token = None
    if args.http_token_file is not None:
        try:
            token = args.http_token_file.read_text().strip()
        except OSError as error:
            fail(prog, f"--http-token-file {args.http_token_file}: {error.strerror or error}")
    if demo_state is not None:
        control: Control = DemoControl(demo_state, args.timeout)
        front_control: Control = control
        front_ends = [FrontEnd(f["status"], token) for f in demo_state["front_ends"]]
    else:
        front_ends = [FrontEnd(url, token) for url in args.front_ends or ()]
        control = Commands(args.stop or "", args.start or "")
        front_control = Commands(args.front_end_stop or "", args.front_end_start or "")
    began = time.monotonic()
    servers: list[Server] = []
    if not args.no_servers:
        known = [roll.name_of(url, connect) for url in urls]
        by_name = {server.name: server for server in known}
        chosen = args.servers or [server.name for server in known]
        unknown = [name for name in chosen if name not in by_name]
        if unknown:
            fail(prog, f"no server named {', '.join(unknown)} among {', '.join(by_name)}", 2)
        servers = [by_name[name] for name in chosen]
        print(f"servers: {', '.join(f'{s.name} ({shown(s.url)})' for s in known)}", flush=True)
        for server in servers:
            roll.restart(server, control)
    if front_ends and not args.no_front_ends:
        for front_end in front_ends:
            roll.restart_front_end(
                front_end, front_control, [o for o in front_ends if o is not front_end]
            )
    print(
        f"restarted {len(servers)} server(s) and "
        f"{0 if args.no_front_ends else len(front_ends)} front-end(s) in {time.monotonic() - began:.1f} s",
        flush=True,
    )


if __name__ == "__main__":
    sys.exit(main())
