"""Fixtures for the Spark side: one local SparkSession for the whole test session.

Starting a session costs 4-9 s here, so every Spark test shares it. Nothing here
imports the Twisted reactor.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest


@pytest.fixture
def workdir() -> Iterator[Path]:
    """A scratch directory removed after the test (pytest's tmp_path keeps old runs)."""
    path = Path(tempfile.mkdtemp(prefix="bus-spark-test-"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope="session")
def jvm_scratch() -> Iterator[Path]:
    """Where JVMs started by the tests (ours and the pipeline subprocesses) put their temp
    files: Spark leaves some in /tmp even on a clean stop, and more when SIGKILLed."""
    path = Path(tempfile.mkdtemp(prefix="bus-spark-jvm-"))
    saved = {name: os.environ.get(name) for name in ("JAVA_TOOL_OPTIONS", "SPARK_LOCAL_DIRS")}
    options = saved["JAVA_TOOL_OPTIONS"]
    os.environ["JAVA_TOOL_OPTIONS"] = f"{options or ''} -Djava.io.tmpdir={path}".strip()
    os.environ["SPARK_LOCAL_DIRS"] = str(path)
    try:
        yield path
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope="session")
def spark(jvm_scratch: Path) -> Iterator[Any]:
    # Workers must run this interpreter, the one with bus and pyarrow installed.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")  # also for pipeline subprocesses
    from pyspark.sql import SparkSession

    from bus.spark import register

    session = (
        SparkSession.builder.master("local[2]")
        .appName("bus-spark-tests")
        # Loopback only: the tests never use the machine's real interfaces.
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.sql.session.timeZone", "UTC")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    register(session)
    try:
        yield session
    finally:
        for query in session.streams.active:
            query.stop()
        session.stop()
