"""The pipeline as users run it, a driver process: started, SIGKILLed mid-stream, and
resumed from its checkpoint."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

from .helpers import wait_for

REAPER = Path(__file__).with_name("reaper.py")
#: A batch of the landing query the pipeline reports on its console once it is committed
#: (bus.spark.pipeline.progress_line): its id, rows and the sequence it ends at.
PROGRESS = re.compile(r"^\[events\] batch (\d+): (\d+) rows .*?, at seq (\d+)", re.M)


def landed_seq(console: str) -> int:
    """The highest sequence a committed batch landed, from a pipeline's console (0: none)."""
    return max((int(m[2]) for m in PROGRESS.findall(console)), default=0)


def batch_files(directory: Path) -> int:
    return sum(1 for p in directory.glob("*") if p.name.isdigit()) if directory.exists() else 0


class Driver:
    """``python -m bus.spark.pipeline`` under ``reaper.py``, which reaps whatever the
    driver leaves behind (its JVM, PySpark's daemon) even when it is SIGKILLed. ``prefix``
    runs it elsewhere (``ip netns exec NS``: a host of tests/netns.py), ``env`` in that
    environment."""

    def __init__(
        self,
        args: list[str],
        log: Path,
        prefix: Sequence[str] = (),
        env: dict[str, str] | None = None,
    ) -> None:
        self.pid_file = log.with_name(f"driver-{os.urandom(4).hex()}.pid")
        command = [sys.executable, "-m", "bus.spark.pipeline", *args]
        with open(log, "ab") as handle:
            self.reaper = subprocess.Popen(
                [*prefix, sys.executable, str(REAPER), str(self.pid_file), *command],
                stdout=handle,
                stderr=subprocess.STDOUT,
                cwd=log.parent,
                env=env,
            )
        self.pid = int(wait_for(self._pid, timeout=30, what="the driver to start"))

    def _pid(self) -> str:
        return self.pid_file.read_text() if self.pid_file.exists() else ""

    def running(self) -> bool:
        try:
            os.kill(self.pid, 0)  # the reaper has not reaped it yet
        except ProcessLookupError:
            return False
        return self.reaper.poll() is None and not _zombie(self.pid)

    def kill(self) -> None:
        """SIGKILL the driver's process group (driver and JVM) and wait for the reaper."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.pid, signal.SIGKILL)
        self.reaper.wait(timeout=60)

    def wait(self, timeout: float) -> int:
        try:
            return self.reaper.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise


def _zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except (FileNotFoundError, IndexError):
        return True


def run_killed_then_resumed(
    args: list[str], log: Path, commits: Path, offsets: Path, batches: int
) -> None:
    """Run the pipeline streaming until two batches are committed, SIGKILL it with the
    third in flight (of the ``batches`` its journal makes), then to the end with
    ``--available-now``."""
    driver = Driver([*args, "--trigger-seconds", "0"], log)
    try:
        wait_for(
            lambda: batch_files(commits) >= 2 or not driver.running(),
            timeout=180,
            what="two committed batches",
        )
        assert driver.running(), log.read_text()[-3000:]
        # Kill while a planned batch is in flight, so the restart must replay it.
        wait_for(lambda: batch_files(offsets) > batch_files(commits), timeout=60, interval=0.01)
    finally:
        driver.kill()
    assert batch_files(commits) < batches, "the first run finished before the kill"

    resumed = Driver([*args, "--available-now"], log)
    assert resumed.wait(timeout=240) == 0, log.read_text()[-3000:]
