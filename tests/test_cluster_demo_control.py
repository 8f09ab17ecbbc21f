"""How ``bus-cluster roll`` stops a process of the cluster ``bus-cluster`` runs: by the pid
in its pid file, signalled only if that process is the one that wrote the file. A pid file
left behind by a process that ended may name another process by then (pids are reused):
that one is never signalled."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from bus.nats.cli import PID_FILE_SLACK, DemoControl
from bus.nats.roll import FrontEnd, RollError

STATUS = "http://127.0.0.1:1/status"


@pytest.fixture
def sleeper() -> Iterator[subprocess.Popen[bytes]]:
    process = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    try:
        yield process
    finally:
        process.kill()
        process.wait()


def control(pid_file: Path) -> DemoControl:
    state = {"servers": [], "front_ends": [{"status": STATUS, "pid_file": str(pid_file)}]}
    return DemoControl(state, timeout=30)


def test_the_process_that_wrote_its_pid_file_is_signalled_and_waited_for(
    tmp_path: Path, sleeper: subprocess.Popen[bytes]
) -> None:
    pid_file = tmp_path / "front-end.pid"
    pid_file.write_text(f"{sleeper.pid}\n")
    control(pid_file).stop(FrontEnd(STATUS))
    assert sleeper.wait(timeout=5) == -15  # SIGTERM, and stop() returned once it ended


def test_a_stale_pid_file_naming_a_newer_process_signals_nothing(
    tmp_path: Path, sleeper: subprocess.Popen[bytes]
) -> None:
    pid_file = tmp_path / "front-end.pid"
    pid_file.write_text(f"{sleeper.pid}\n")
    # Written before that process started: left by one that ended, whose pid it took.
    written = time.time() - 10 * PID_FILE_SLACK - 60
    os.utime(pid_file, (written, written))
    with pytest.raises(RollError, match="stale"):
        control(pid_file).stop(FrontEnd(STATUS))
    assert sleeper.poll() is None  # not signalled


def test_a_pid_file_naming_no_process_says_so(tmp_path: Path) -> None:
    ended = subprocess.Popen([sys.executable, "-c", "pass"])
    ended.wait()
    pid_file = tmp_path / "front-end.pid"
    pid_file.write_text(f"{ended.pid}\n")
    with pytest.raises(RollError, match=r"does not run|stale"):
        control(pid_file).stop(FrontEnd(STATUS))
