"""Run a command and reap every process it leaves behind: ``reaper.py PIDFILE CMD...``.

A Spark driver killed with SIGKILL orphans its JVM and PySpark's worker daemon (which
puts itself in its own process group). In a container whose init does not reap, they
would stay zombies. This wrapper is a child subreaper (Linux ``PR_SET_CHILD_SUBREAPER``):
the orphans become its children, and it exits once it has reaped them all, with the
command's exit status. The command runs in its own session (its pid is written to PIDFILE).

A test signals the wrapper, never the command's pid: the wrapper reaps the command, and once
it has, that pid may be another process's (CI had a test's SIGTERM end another test's
server that way). SIGTERM is passed on to the command while it is not reaped; SIGUSR1
SIGKILLs the command's group while the command is not reaped, and every child the wrapper has
not reaped yet (orphans it took in).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import sys

PR_SET_CHILD_SUBREAPER = 36


def children(parent: int | None = None) -> list[int]:
    """The processes whose parent is ``parent`` (this one by default; not reaped yet: their
    pids are theirs)."""
    me = str(os.getpid() if parent is None else parent)
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as stat:
                    fields = stat.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if fields[1] == me:
                found.append(int(entry))
    return found


def main(pid_file: str, command: list[str]) -> int:
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    pid = os.posix_spawn(command[0], command, os.environ, setsid=True)
    command_reaped = False

    def stop(signum: int, frame: object) -> None:
        if not command_reaped:
            os.kill(pid, signal.SIGTERM)

    def kill(signum: int, frame: object) -> None:
        if not command_reaped:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGKILL)
        for child in children():
            with contextlib.suppress(ProcessLookupError):
                os.kill(child, signal.SIGKILL)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGUSR1, kill)
    with open(pid_file + ".tmp", "w") as handle:
        handle.write(str(pid))
    os.rename(pid_file + ".tmp", pid_file)
    status = 1
    while True:
        try:
            # Seen first, reaped after: the handlers stop naming the command before its pid
            # can be anyone else's.
            ended = os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOWAIT)
        except ChildProcessError:
            return status
        if ended is None:
            continue
        if ended.si_pid == pid:
            command_reaped = True
        _, code = os.waitpid(ended.si_pid, 0)
        if ended.si_pid == pid:
            status = os.waitstatus_to_exitcode(code)
            status = 128 - status if status < 0 else status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2:]))
