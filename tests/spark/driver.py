"""The pipeline as users run it, a driver process: started, SIGKILLed mid-stream, and
resumed from its checkpoint."""

from __future__ import annotations

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
        #: The driver's start time (/proc), which with its pid names it alone.
        self._started = _started(self.pid)

    def _pid(self) -> str:
        return self.pid_file.read_text() if self.pid_file.exists() else ""

    def running(self) -> bool:
        """The driver has not ended (its pid still names it: its start time is the one it
        had, and it is no zombie; once the reaper reaped it, the pid may be anyone's)."""
        return self.reaper.poll() is None and _started(self.pid) == self._started

    def terminate(self) -> None:
        """SIGTERM to the driver, through the reaper (which knows whether it reaped it)."""
        if self.reaper.poll() is None:
            self.reaper.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        """SIGKILL the driver's process group (driver and JVM) and what else the reaper
        holds, through the reaper, and wait for it."""
        if self.reaper.poll() is None:
            self.reaper.send_signal(signal.SIGUSR1)
        self.reaper.wait(timeout=60)

    def wait(self, timeout: float) -> int:
        try:
            return self.reaper.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise


def _started(pid: int) -> int | None:
    """When process ``pid`` started (clock ticks after boot); None when there is none, or a
    zombie."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return None if fields[0] == "Z" else int(fields[19])


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
