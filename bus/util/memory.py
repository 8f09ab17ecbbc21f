"""Handing freed memory back to the operating system.

glibc's allocator keeps memory freed in the middle of its heaps (and in the arenas of
other threads, such as libzmq's I/O thread) for later use: after a burst of large
allocations, e.g. full ZeroMQ pipes of clients that left, the process's RSS stays at
its peak. ``malloc_trim(0)`` returns those free pages. Elsewhere (musl, macOS) this
does nothing.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import sys
from typing import Any

_trim: Any = None
_looked_up = False


def _malloc_trim() -> Any:
    global _trim, _looked_up
    if not _looked_up:
        _looked_up = True
        if sys.platform.startswith("linux"):
            try:
                libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
                function = libc.malloc_trim
            except (OSError, AttributeError):
                function = None
            if function is not None:
                function.argtypes = [ctypes.c_size_t]
                function.restype = ctypes.c_int
            _trim = function
    return _trim


def release_free_memory() -> bool:
    """Return free heap memory to the system; True if the allocator could do it."""
    trim = _malloc_trim()
    if trim is None:
        return False
    return bool(trim(0))


class MemoryRelease:
    """Hands free memory back a little later, at most once per ``delay``: after peers left
    (their ZeroMQ pipes are freed in libzmq's I/O thread, a moment after we hear of it) or
    after a burst of held messages was dropped. Many such events cost one trim."""

    def __init__(self, reactor: Any, delay: float = 5.0) -> None:
        self.reactor = reactor
        self.delay = delay
        self._call: Any = None
        self._stopped = False
        self.releases = 0

    def soon(self) -> None:
        """Hand free memory back ``delay`` seconds from now, unless a hand-back is already due."""
        if self._call is None and not self._stopped:
            self._call = self.reactor.callLater(self.delay, self._release)

    @property
    def pending(self) -> bool:
        """A hand-back is due (something freed since the last one has not been handed back)."""
        return self._call is not None

    def _release(self) -> None:
        self._call = None
        self.releases += 1
        release_free_memory()

    def stop(self) -> None:
        """Cancel a pending hand-back; later calls of :meth:`soon` do nothing."""
        self._stopped = True
        if self._call is not None and self._call.active():
            self._call.cancel()
        self._call = None


def freeze_startup_objects() -> None:
    """Move every object alive now out of the cyclic garbage collector's sight.

    A running server's oldest generation is mostly what startup made (modules, classes,
    Twisted and zmq internals): a full collection that scans them took 15 ms, often the
    bus's largest latency at 2k events/s (bench/eventbus_latency.py). Frozen, they are
    never scanned again; objects made later are collected as before."""
    import gc

    gc.collect()
    gc.freeze()
