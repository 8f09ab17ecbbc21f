"""The service manager of tests/test_cluster_roll.py's nats-servers, as an operator's
commands would be on real hosts: ``bus-cluster roll --stop 'python -m tests.roll_service
stop DIR {name}' --start '... start DIR {name}'``.

    python -m tests.roll_service stop DIR NAME   # lame-duck mode, returns once it exited
    python -m tests.roll_service start DIR NAME  # starts it again, in a session of its own

DIR is the :class:`bus.nats.servers.NatsCluster`'s directory: NAME's config, log and pid
file are in ``DIR/NAME``. A server started here is no child of the test: the test ends it
through its pid file.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

from bus.nats.servers import nats_server_binary

BOUND = 120.0


def gone(pid: int) -> bool:
    """Process ``pid`` ended (one not reaped yet, a zombie, counts as ended)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat.rpartition(")")[2].split()[0] in ("Z", "X")


def stop(home: Path) -> None:
    pid = int((home / "nats.pid").read_text().split()[0])
    # As an operator does it: the binary signals the process its pid file names.
    subprocess.run(
        [nats_server_binary(), "--signal", f"ldm={home / 'nats.pid'}"], check=True, timeout=30
    )
    deadline = time.monotonic() + BOUND
    while not gone(pid):
        if time.monotonic() > deadline:
            raise SystemExit(f"nats-server {pid} did not exit within {BOUND:g} s")
        time.sleep(0.05)


def start(home: Path) -> None:
    with (home / "nats.log").open("ab") as log:
        subprocess.Popen(
            [nats_server_binary(), "-c", str(home / "nats.conf")],
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def main() -> None:
    command, directory, name = sys.argv[1:4]
    home = Path(directory) / name
    if command == "stop":
        stop(home)
    elif command == "start":
        start(home)
    else:
        raise SystemExit(f"unknown command {command}")


if __name__ == "__main__":
    main()
