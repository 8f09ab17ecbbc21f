"""Importing the product's modules does no work: no entry point read, no tap imported, no
signal handler set (in a fresh interpreter, as twistd and the tools import them)."""

from __future__ import annotations

import subprocess
import sys

CHECK = """
import signal, sys
before = signal.getsignal(signal.SIGINT)
import bus.application.services, bus.tap, bus.emqp.cli, bus.eventbus.cli
assert bus.application.services._declared.cache_info().currsize == 0, "entry points read at import"
assert bus.tap.loaded.cache_info().currsize == 0, "taps loaded at import"
assert "echo_service.tap" not in sys.modules, "a third-party tap imported at import"
assert signal.getsignal(signal.SIGINT) is before, "a SIGINT handler set at import"
options = bus.tap.Options  # what twistd reads: made now, once
assert bus.tap.loaded.cache_info().currsize == 1 and bus.tap.Options is options
assert "echo" in bus.tap.service_order()
print("ok")
"""


def test_importing_does_no_work_and_asking_does_it_once() -> None:
    done = subprocess.run([sys.executable, "-c", CHECK], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ok"
