"""Worker threads for disk work (SQLite checkpoints, journal writes), kept off the reactor.

A pool made here has one daemon thread: work stays in order, and a thread stuck in a
system call (a dying disk) never keeps the process from exiting once its service has
given up waiting for it.
"""

from __future__ import annotations

import threading
from typing import Any

from twisted.python.threadpool import ThreadPool


class _DaemonThread(threading.Thread):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, daemon=True, **kwargs)


def worker_pool(name: str, threads: int = 1) -> ThreadPool:
    """A pool of ``threads`` daemon threads (one by default: work stays in order);
    ``start()`` it, ``stop()`` it once its work is done (stop joins the threads)."""
    pool = ThreadPool(minthreads=min(1, threads), maxthreads=threads, name=name)
    pool.threadFactory = _DaemonThread
    return pool
