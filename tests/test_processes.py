"""The harness that runs command-line tools in child processes (:mod:`tests.processes`):
what a test reads of a child's output while the child runs is what the child wrote, in
its order, however the reads and the child's writes interleave."""

from __future__ import annotations

import signal
import sys
from pathlib import Path

from tests.processes import CommandProcess, exit_status, wait_for

#: Writes a line, then another once SIGUSR1 comes (blocked first: one sent early waits).
TWO_LINES = """
import signal, sys
signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGUSR1})
sys.stdout.write('{"seq": 182, "topic": "/u/181/"}\\n'); sys.stdout.flush()
signal.sigwait({signal.SIGUSR1})
sys.stdout.write('{"seq": 196, "topic": "/u/195/"}\\n'); sys.stdout.flush()
"""


class Python(CommandProcess):
    """The venv's Python in a child process."""

    program = Path(sys.executable).name


def test_a_line_written_while_the_test_reads_goes_after_the_others() -> None:
    # A read of ``out`` positions the test's handle of the output file at its start,
    # then reads. The child's handle is a copy of it: a line the child wrote between the
    # two once landed where the handle pointed, over the first line (eventbus-cli tail's
    # output then showed 196 first, 182 never).
    child = Python("-c", TWO_LINES)
    try:
        wait_for(lambda: child.out, timeout=120, what="the child's first line")
        child.stdout.seek(0)  # where a read leaves the handle before it reads on
        child.process.send_signal(signal.SIGUSR1)
        assert exit_status(child.process) == 0, child.err
        assert [line["seq"] for line in child.lines()] == [182, 196], child.out
    finally:
        child.close()
