"""Job functions named by ``["run", {"path": "tests.emqp_interop.jobs", ...}]`` bodies."""

import os
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


def nemesis_run(token, seconds=0):
    """Append ``start TOKEN PID TIME`` to the file $NEMESIS_RUNS (each host's job manager is
    given its own), work ``seconds``, then append ``end TOKEN PID TIME``; return ``token``."""
    path = os.environ["NEMESIS_RUNS"]
    with open(path, "a") as out:
        out.write(f"start {token} {os.getpid()} {time.time()!r}\n")
    if seconds:
        time.sleep(seconds)
    with open(path, "a") as out:
        out.write(f"end {token} {os.getpid()} {time.time()!r}\n")
    return token
