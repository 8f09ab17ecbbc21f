"""The product as a user installs it: the sdist and the wheel that ``make test`` built
(``BUS_DIST``), the wheel installed into two venvs outside the checkout, one with every extra
(``BUS_WHEEL_VENV``) and one bare (``BUS_BARE_VENV``, what ``pip install bus`` gives).

Every command runs from a test's own directory with the checkout off ``sys.path``
(``PYTHONSAFEPATH``, no ``PYTHONPATH``), and the tests check that ``bus`` comes from the venv.
Without the variables (``pytest`` run by hand) these tests are skipped, unless
``BUS_INSTALLED_TESTS=required`` (CI), where that is a failure.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import urllib.request
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent
_VARIABLES = ("BUS_DIST", "BUS_WHEEL_VENV", "BUS_BARE_VENV")
_missing = [name for name in _VARIABLES if not os.environ.get(name)]
if _missing and os.environ.get("BUS_INSTALLED_TESTS") == "required":
    raise RuntimeError(f"BUS_INSTALLED_TESTS=required but {', '.join(_missing)} unset (make test)")

#: Marks a module whose tests need the built artifacts.
needs_artifacts = pytest.mark.skipif(
    bool(_missing), reason="the installed product's tests run under make test (BUS_DIST ...)"
)

DIST = Path(os.environ.get("BUS_DIST", "dist"))
FULL = Path(os.environ.get("BUS_WHEEL_VENV", "/nonexistent"))
BARE = Path(os.environ.get("BUS_BARE_VENV", "/nonexistent"))
# A child's own defaults: none of the options a test's environment may carry.
_PREFIXES = ("EVENTBUS_", "SPARK_BRIDGE_", "MC0_", "DBP_", "ZRE_", "EMQP_", "PYTHON", "BUS_")


def artifact(suffix: str) -> Path:
    """The one file in ``DIST`` ending in ``suffix`` (``.whl``, ``.tar.gz``)."""
    found = sorted(DIST.glob(f"*{suffix}"))
    assert len(found) == 1, f"one {suffix} expected in {DIST}, found {found}"
    return found[0]


def environment(venv: Path, **extra: str) -> dict[str, str]:
    """The environment of a user of ``venv``: its ``bin`` first on ``PATH`` (nats-server,
    the CLIs), the checkout nowhere on ``sys.path``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(_PREFIXES)}
    env.update(
        PATH=f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}",
        PYTHONSAFEPATH="1",
        PYTHONUNBUFFERED="1",
        VIRTUAL_ENV=str(venv),
        **extra,
    )
    return env


def run(
    venv: Path, *argv: str, cwd: Path, timeout: float = 120, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """``argv[0]`` from ``venv``'s ``bin`` run to its end. ``timeout`` only catches a hang:
    every command here ends by itself (its own ``--timeout``, or at once)."""
    command = [str(venv / "bin" / argv[0]), *argv[1:]]
    return subprocess.run(
        command,
        cwd=cwd,
        env=env or environment(venv),
        capture_output=True,
        text=True,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
    )


def ok(result: subprocess.CompletedProcess[str]) -> str:
    """The standard output of a command that must have succeeded."""
    assert result.returncode == 0, (
        f"{result.args} ended {result.returncode}:\n{result.stdout}\n{result.stderr}"
    )
    return result.stdout


class Child:
    """A long-running command of ``venv`` (a server, ``tail``, ``bus-cluster``), its output in
    a file that the test reads while it runs (a pipe could fill up and block it)."""

    def __init__(
        self, venv: Path, *argv: str, cwd: Path, env: dict[str, str] | None = None
    ) -> None:
        self.log_path = cwd / f"{Path(argv[0]).name}-{os.getpid()}-{id(self)}.log"
        self._log = open(self.log_path, "wb")
        self.process = subprocess.Popen(
            [str(venv / "bin" / argv[0]), *argv[1:]],
            cwd=cwd,
            env=env or environment(venv),
            stdout=self._log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )

    def output(self) -> str:
        return self.log_path.read_text(errors="replace")

    def alive(self) -> bool:
        """True while it runs; a child that ended says so, with its output."""
        code = self.process.poll()
        if code is not None:
            raise AssertionError(f"{self.process.args} ended {code}:\n{self.output()}")
        return True

    def stop(self, sig: int = signal.SIGTERM) -> int:
        """Signal it and wait for it to end (bounded only to catch a hang)."""
        if self.process.poll() is None:
            self.process.send_signal(sig)
        try:
            return self.process.wait(timeout=120)
        finally:
            if self.process.poll() is None:
                self.process.kill()
                self.process.wait()
            self._log.close()


def http_get(port: int, path: str) -> tuple[int, str, bytes]:
    """Status, content type and body of ``GET path`` on 127.0.0.1:``port``."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=30) as response:
        return response.status, response.headers.get("Content-Type", ""), response.read()


def status(port: int) -> dict[str, Any]:
    """The product's ``/status``, or ``{}`` while its HTTP port is not open yet."""
    try:
        return dict(json.loads(http_get(port, "/status")[2]))
    except OSError:
        return {}
