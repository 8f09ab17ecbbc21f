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

from .helpers import SPARKS_OWN_GUESS


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """A Spark test that failed only for Spark's own start-up guess (SPARKS_OWN_GUESS: a
    busy machine's Python worker slow to connect back) is run again (twice at most, whole:
    fixtures and all); any other failure stands. The pipeline does the same for its
    queries (--max-restarts)."""
    for item in items:
        if item.get_closest_marker("spark") is not None:
            item.add_marker(pytest.mark.flaky(reruns=2, only_rerun=[SPARKS_OWN_GUESS]))


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
