"""Run a command and reap every process it leaves behind: ``reaper.py PIDFILE CMD...``.

A Spark driver killed with SIGKILL orphans its JVM and PySpark's worker daemon (which
puts itself in its own process group). In a container whose init does not reap, they
would stay zombies. This wrapper is a child subreaper (Linux ``PR_SET_CHILD_SUBREAPER``):
the orphans become its children, and it exits once it has reaped them all, with the
command's exit status. The command runs in its own session, so a test can SIGKILL the
command's group (its pid is written to PIDFILE) without killing the wrapper.
"""

from __future__ import annotations

import ctypes
import os
import sys

PR_SET_CHILD_SUBREAPER = 36


def main(pid_file: str, command: list[str]) -> int:
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    pid = os.posix_spawn(command[0], command, os.environ, setsid=True)
    with open(pid_file + ".tmp", "w") as handle:
        handle.write(str(pid))
    os.rename(pid_file + ".tmp", pid_file)
    status = 1
    while True:
        try:
            reaped, code = os.wait()
        except ChildProcessError:
            return status
        if reaped == pid:
            status = os.waitstatus_to_exitcode(code)
            status = 128 - status if status < 0 else status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2:]))
