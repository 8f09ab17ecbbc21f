"""Job functions named by ``["run", {"path": "tests.emqp_interop.jobs", ...}]`` bodies."""

import os
import sys
import time


def add(a, b):
    return a + b


def record(path, text, seconds=0):
    """Append ``text`` and this process's id to ``path`` (after ``seconds``), return ``text``."""
    if seconds:
        time.sleep(seconds)
    with open(path, "a") as out:
        out.write(f"{text} {os.getpid()}\n")
    return text


def begin_then_record(started, path, text, seconds=0):
    """Append ``text`` to ``started`` at once (the job runs), then as :func:`record` does."""
    with open(started, "a") as out:
        out.write(f"{text} {os.getpid()}\n")
    return record(path, text, seconds)


class Greeter:
    def __init__(self, greeting):
        self.greeting = greeting

    def greet(self, name):
        return f"{self.greeting}, {name}"


def slow_the_first_time(marker, text):
    """The first call (no ``marker`` file yet) creates it and hangs; later calls return."""
    if not os.path.exists(marker):
        with open(marker, "w") as out:
            out.write(str(os.getpid()))
        time.sleep(120)
    return text


def stamp(path):
    """Append the time of this run to ``path`` (scheduled jobs record when they ran)."""
    with open(path, "a") as out:
        out.write(f"{time.time()!r} {os.getpid()}\n")
    return True


def fail(text):
    raise ValueError(text)


def dispatched_msgid():
    """The msgid of the request this job runs for, or ``-``. eventmq gives a job only its
    arguments; its worker process's main loop (``MultiprocessWorker.run``, eventmq/worker.py)
    holds the msgid in a local while the job runs in the process's job thread. A schedule's
    runs share their arguments and differ by msgid (one per run, the same at every broker)."""
    for frame in sys._current_frames().values():
        while frame is not None:
            code = frame.f_code
            if (
                code.co_name == "run"
                and code.co_filename.endswith(os.path.join("eventmq", "worker.py"))
                and "msgid" in frame.f_locals
            ):
                return frame.f_locals["msgid"] or "-"
            frame = frame.f_back
    return "-"


def nemesis_run(token, seconds=0):
    """Append ``start TOKEN PID TIME MSGID`` to the file $NEMESIS_RUNS (each host's job
    manager is given its own), work ``seconds``, then append ``end TOKEN PID TIME MSGID``;
    return ``token``."""
    path = os.environ["NEMESIS_RUNS"]
    msgid = dispatched_msgid()
    with open(path, "a") as out:
        out.write(f"start {token} {os.getpid()} {time.time()!r} {msgid}\n")
    if seconds:
        time.sleep(seconds)
    with open(path, "a") as out:
        out.write(f"end {token} {os.getpid()} {time.time()!r} {msgid}\n")
    return token
