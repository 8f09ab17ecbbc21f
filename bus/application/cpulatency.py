"""Holding the CPUs' wake-up latency low while the product runs (Linux PM QoS).

Between two messages an idle CPU drops into an idle state, and waking it for the next
one costs more than a broker's whole pass: measured on a 2-core VM, a pyzmq round trip
over loopback TCP took 150 us, and 68 us with the CPUs held at 0 us. Linux lets a
process ask for a bound on that latency by writing it to ``/dev/cpu_dma_latency``; the
kernel keeps it while the file stays open and drops it when it is closed (or the process
dies). This is what tuned's ``latency-performance`` profile does for the whole machine.

The price: CPUs that would have slept poll instead (power, and on a VM CPU time the host
cannot give to others). It is off unless asked for (``--cpu-latency-us``).
"""

from __future__ import annotations

import os
import struct

from twisted.application.service import Service
from twisted.logger import Logger

from bus.errors import StartupError

log = Logger(namespace="bus.application.cpulatency")

DEVICE = "/dev/cpu_dma_latency"


def current(path: str = DEVICE) -> int:
    """The latency bound the kernel applies now (the lowest of all requests), in us."""
    with open(path, "rb") as device:
        value: int = struct.unpack("<i", device.read(4))[0]
    return value


class CpuLatencyService(Service):
    """Holds one PM QoS request of ``microseconds`` from start to stop."""

    name = "cpu-latency"

    def __init__(self, microseconds: int, path: str = DEVICE) -> None:
        if microseconds < 0:
            raise ValueError("the CPU latency bound cannot be negative")
        self.microseconds = microseconds
        self.path = path
        self._fd: int | None = None

    def startService(self) -> None:
        try:
            fd = os.open(self.path, os.O_WRONLY)
        except OSError as error:
            raise StartupError(
                "cpu-latency-us",
                f"cannot ask for it through {self.path}: {error.strerror} (it takes write "
                "access to that file, usually root)",
            ) from None
        try:
            os.write(fd, struct.pack("<i", self.microseconds))
        except OSError as error:
            os.close(fd)
            raise StartupError(
                "cpu-latency-us", f"{self.path} refused it: {error.strerror}"
            ) from None
        self._fd = fd
        Service.startService(self)
        log.info(
            "holding the CPUs' wake-up latency at {us} us (PM QoS) while running",
            us=self.microseconds,
        )

    def stopService(self) -> None:
        Service.stopService(self)
        if self._fd is not None:
            os.close(self._fd)  # the kernel drops the request with the file
            self._fd = None
