"""What runs where the jobs run: inside an :class:`bus.emqp.worker.EmqpWorker`'s job
processes (or its threads), so nothing here imports Twisted or ZeroMQ and a job process
stays light.

* :func:`run_callable`: a body ``["run", {"path": ..., "callable": ..., ...}]``, as the
  original client's ``defer_job`` sends it.
* :class:`JobHooks`: eventmq's per-process hooks (``SUBPROCESS_SETUP_FUNC``,
  ``JOB_ENTRY_FUNC``, ``JOB_EXIT_FUNC``), named by dotted paths and resolved in the process
  that runs the jobs.
"""

from __future__ import annotations

import functools
import importlib
import logging
import os
import select
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

Handler = Callable[[Any], Any]

# A job process has no Twisted log observer: its few lines go to stderr through the
# standard library's last-resort handler, like any library's warnings.
_log = logging.getLogger("bus.emqp.worker")


def run_callable(params: dict[str, Any]) -> Any:
    """The original's ``run`` subcommand: import ``path`` (``pkg.mod`` or ``pkg.mod:Class``),
    instantiate the class if one is named, call ``callable`` with ``args``/``kwargs``; a
    ``path`` of ``pkg.mod:function`` without ``callable`` names the function itself."""
    if not isinstance(params, dict):
        raise TypeError("run wants an object with path and callable")
    module_name, _, after = str(params["path"]).partition(":")
    target: Any = importlib.import_module(module_name)
    if "callable" in params:
        if after:  # pkg.mod:Class, the original's form for a method
            cls = getattr(target, after)
            target = cls(*params.get("class_args") or (), **params.get("class_kwargs") or {})
        name = str(params["callable"])
    else:  # pkg.mod:function
        name = after
    function = getattr(target, name)
    return function(*params.get("args") or (), **params.get("kwargs") or {})


@functools.cache
def resolve_callable(name: str) -> Callable[[], Any]:
    """A hook named ``pkg.mod.function``, ``pkg.mod:function`` or, as eventmq also allows,
    ``pkg.mod:Class.method`` (the class is instantiated without arguments). Cached: a hook
    is imported once per process."""
    if ":" in name:
        module_name, _, attributes = name.partition(":")
    else:
        module_name, _, attributes = name.rpartition(".")
    if not module_name or not attributes:
        raise ValueError(f"{name!r} names no callable (write pkg.mod.function)")
    target: Any = importlib.import_module(module_name)
    *owners, last = attributes.split(".")
    for owner in owners:
        target = getattr(target, owner)
        if isinstance(target, type):
            target = target()
    function = getattr(target, last)
    if not callable(function):
        raise TypeError(f"{name} is not callable")
    return function  # type: ignore[no-any-return]


@dataclass(frozen=True, slots=True)
class JobHooks:
    """Dotted names of callables without arguments ("" for none): ``setup`` once in each
    process that runs jobs, ``entry`` before and ``exit`` after every job (``exit`` also
    after a job that raised)."""

    setup: str = ""
    entry: str = ""
    exit: str = ""


NO_HOOKS = JobHooks()


def run_setup(hooks: JobHooks) -> None:
    """Call the process's setup hook, if it has one (once per job process)."""
    if hooks.setup:
        resolve_callable(hooks.setup)()


def exit_when_gone(pid: int) -> None:
    """End this process as soon as process ``pid`` (the worker) has ended. A job process
    is a child of the fork server, not of the worker, and its pool's pipes never close
    (it holds both ends): without this, a worker killed by ``kill -9`` leaves its job
    processes, and through them the fork server and the resource tracker, running."""
    try:
        pidfd = os.pidfd_open(pid)
    except ProcessLookupError:
        os._exit(1)
    except OSError:  # no pidfd (Linux before 5.3): ask every second
        while True:
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                os._exit(1)
            except PermissionError:
                pass
            time.sleep(1)
    select.select([pidfd], [], [])  # readable once the process has ended
    os._exit(1)


def start_job_process(hooks: JobHooks, worker_pid: int = 0) -> None:
    """A job process's initializer. It ignores SIGINT: a Ctrl-C in a terminal reaches the
    whole process group, and the worker, not the terminal, decides when its jobs end. It
    ends itself when the worker ends (``worker_pid``), even in the middle of a job. A
    setup that fails is logged and the process serves anyway, as eventmq's do."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if worker_pid:
        threading.Thread(
            target=exit_when_gone, args=(worker_pid,), name="worker-watch", daemon=True
        ).start()
    try:
        run_setup(hooks)
    except Exception:
        _log.exception("emqp-worker: setup %s failed in a job process", hooks.setup)


def run_job(hooks: JobHooks, handler: Handler, params: Any) -> Any:
    """One job, between the entry and exit hooks."""
    if hooks.entry:
        resolve_callable(hooks.entry)()
    try:
        return handler(params)
    finally:
        if hooks.exit:
            resolve_callable(hooks.exit)()


def nothing() -> None:
    """Submitted to start a job process before its first job."""


__all__ = [
    "NO_HOOKS",
    "Handler",
    "JobHooks",
    "exit_when_gone",
    "nothing",
    "resolve_callable",
    "run_callable",
    "run_job",
    "run_setup",
    "start_job_process",
]
