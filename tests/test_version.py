"""One version, written in ``bus/__init__.py``: setup.cfg reads it, every command-line tool
prints it with ``--version``, ``/status`` carries it and ``/metrics`` has ``bus_build_info``;
CHANGELOG.md has its section."""

from __future__ import annotations

import configparser
import json
import os
import platform
import re
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

import bus
from bus.zre.cli import former_spelling
from tests.ports import free_port
from tests.processes import TWISTD, TwistdProcess, wait_for

BIN = Path(sys.executable).parent
ROOT = Path(__file__).resolve().parent.parent


def console_scripts() -> list[str]:
    """The console scripts setup.cfg declares: a new one is checked without being listed."""
    config = configparser.ConfigParser()
    config.read(ROOT / "setup.cfg")
    declared = config["options.entry_points"]["console_scripts"]
    return [line.partition("=")[0].strip() for line in declared.splitlines() if line.strip()]


def test_setuptools_reads_the_version_without_importing_bus() -> None:
    # sys.modules["bus"] = None: an import of bus fails, so the version was read statically.
    code = (
        "import sys; sys.modules['bus'] = None\n"
        "from setuptools.config.setupcfg import read_configuration\n"
        "print(read_configuration('setup.cfg')['metadata']['version'])"
    )
    run = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=60
    )
    assert (run.returncode, run.stdout.strip()) == (0, bus.__version__), run.stderr


def test_the_changelog_has_this_versions_section() -> None:
    changelog = (ROOT / "CHANGELOG.md").read_text()
    assert re.search(
        rf"^## \[{re.escape(bus.__version__)}\] - \d{{4}}-\d{{2}}-\d{{2}}$", changelog, re.M
    )


@pytest.mark.parametrize("script", console_scripts())
def test_every_console_script_prints_the_version(script: str) -> None:
    program = BIN / script
    assert program.exists(), f"{script} is not installed: pip install -e . (make .venv/.test-deps)"
    run = subprocess.run([str(program), "--version"], capture_output=True, text=True, timeout=60)
    assert (run.returncode, run.stdout, run.stderr) == (
        0,
        f"{script} (bus) {bus.__version__}\n",
        "",
    )


@pytest.mark.parametrize(
    ("command", "name"),
    [
        ([sys.executable, "-m", "bus.spark.pipeline"], "python -m bus.spark.pipeline"),
        ([TWISTD, "-n", "eventbus"], "twistd eventbus"),
        ([TWISTD, "-n", "spark-bridge"], "twistd spark-bridge"),
    ],
)
def test_the_pipeline_and_the_plugins_print_the_version(command: list[str], name: str) -> None:
    run = subprocess.run([*command, "--version"], capture_output=True, text=True, timeout=60)
    assert (run.returncode, run.stdout, run.stderr) == (0, f"{name} (bus) {bus.__version__}\n", "")


def test_zre_pings_former_version_option_still_chooses_the_protocol() -> None:
    assert former_spelling(["--version", "1", "--name", "n"]) == [
        "--zre-version",
        "1",
        "--name",
        "n",
    ]
    assert former_spelling(["--version=2"]) == ["--zre-version=2"]
    assert former_spelling(["--version"]) == ["--version"]
    assert former_spelling(["--version", "--name", "n"]) == ["--version", "--name", "n"]


def test_status_and_metrics_carry_the_version(tmp_path: Path) -> None:
    http = free_port()
    command = [
        TWISTD, "-n", "--pidfile=", "eventbus", "--services", "eventbus", "--port", "0",
        "--http-port", str(http), "--data-dir", str(tmp_path / "data"),
    ]  # fmt: skip
    env = {k: v for k, v in os.environ.items() if not k.startswith("EVENTBUS_")}
    server = TwistdProcess(command, tmp_path / "twistd.log", env)

    def get(path: str) -> str:
        assert server.process.poll() is None, server.output()
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{http}{path}", timeout=5) as answer:
                return str(answer.read().decode())
        except OSError:
            return ""

    try:
        status = json.loads(wait_for(lambda: get("/status"), what="/status"))
        assert status["version"] == bus.__version__
        metrics = get("/metrics")
    finally:
        server.stop()
    labels = f'python="{platform.python_version()}",version="{bus.__version__}"'
    assert f"bus_build_info{{{labels}}} 1.0" in metrics.splitlines(), metrics
