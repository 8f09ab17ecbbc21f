"""The Spark tests' reaper (tests/spark/reaper.py): signals reach the command through it,
and never once it has reaped the command (its pid may then be another process's)."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

from tests.spark.helpers import wait_for
from tests.spark.reaper import children

REAPER = Path(__file__).parent / "spark" / "reaper.py"


def started(tmp_path: Path, script: str) -> tuple[subprocess.Popen[bytes], int]:
    pid_file = tmp_path / "command.pid"
    reaper = subprocess.Popen([sys.executable, str(REAPER), str(pid_file), "/bin/sh", "-c", script])
    wait_for(pid_file.exists, timeout=30, what="the command's pid")
    return reaper, int(pid_file.read_text())


def catches(pid: int, sig: int) -> bool:
    status = Path(f"/proc/{pid}/status").read_text()
    mask = next(line for line in status.splitlines() if line.startswith("SigCgt:")).split()[1]
    return bool(int(mask, 16) >> (sig - 1) & 1)


def test_sigterm_goes_on_to_the_command_and_its_status_comes_back(tmp_path: Path) -> None:
    reaper, _ = started(tmp_path, "exec sleep 60")
    wait_for(lambda: catches(reaper.pid, signal.SIGTERM), timeout=30, what="its handler")
    reaper.send_signal(signal.SIGTERM)
    assert reaper.wait(timeout=30) == 128 + signal.SIGTERM


def test_once_the_command_is_reaped_sigterm_names_nobody_and_sigusr1_ends_the_orphans(
    tmp_path: Path,
) -> None:
    """The command exits and leaves an orphan of its own session (as PySpark's daemon does),
    which the reaper takes in: SIGTERM then signals nothing (the reaper and the orphan stay),
    SIGUSR1 kills the orphan, and the reaper exits with the command's status."""
    reaper, command = started(tmp_path, "setsid sleep 60 & exit 3")
    wait_for(lambda: catches(reaper.pid, signal.SIGUSR1), timeout=30, what="its handler")
    # The command reaped, the orphan the reaper's child.
    wait_for(lambda: not Path(f"/proc/{command}").exists(), timeout=30, what="the command gone")
    wait_for(lambda: len(children(reaper.pid)) == 1, timeout=30, what="the orphan taken in")
    reaper.send_signal(signal.SIGTERM)
    time.sleep(0.5)  # what it would have done, it would have done by now
    assert reaper.poll() is None and len(children(reaper.pid)) == 1
    reaper.send_signal(signal.SIGUSR1)
    assert reaper.wait(timeout=30) == 3


def test_children_lists_this_process_children() -> None:
    child = subprocess.Popen(["sleep", "30"])
    try:
        assert child.pid in children()
    finally:
        child.kill()
        child.wait()
    assert child.pid not in children()
