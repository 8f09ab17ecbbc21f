"""The options every JVM the tests start runs with, and the Spark settings of every Spark
application they start.

Those JVMs (the Spark session, pipelines, a Spark cluster's master and workers) run for
seconds to minutes on small data: C2's compilations and a parallel collector's threads are
most of what they spend there. C1 alone and the serial collector halve the Spark tests'
CPU (tests/spark/test_spark_source.py: 87 -> 44 CPU-seconds) on a machine whose two cores
the suite keeps busy. The product's pipelines keep the JVM's defaults: they run for days.
"""

from __future__ import annotations

import sys
from pathlib import Path

#: The options the archive is built with (tests/jvm_archive.py).
BASE_JVM_OPTIONS = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"
#: The classes of Spark's jars, mapped rather than parsed (tests/jvm_archive.py: half a
#: JVM's start-up CPU again), where ``make test`` built it for this venv.
CLASS_ARCHIVE = Path(sys.prefix) / "spark-classes.jsa"
TEST_JVM_OPTIONS = BASE_JVM_OPTIONS + (
    f" -XX:SharedArchiveFile={CLASS_ARCHIVE} -Xlog:cds*=off" if CLASS_ARCHIVE.exists() else ""
)

#: Settings of every Spark application the tests start (a pipeline's driver, a sink's
#: reader, a cluster's driver): no web UI nobody looks at (a Jetty server and the listeners
#: that keep its pages, every batch) and no console progress bar. Given as spark-submit's
#: ``--conf`` (:func:`spark_submit_args`), not a ``SPARK_CONF_DIR``: that directory goes on
#: the JVM's class path, and a class path other than the archive's turns the archive off
#: (nor can the archive be built with a non-empty directory on it). A setting the
#: application gives itself still wins.
SPARK_TEST_DEFAULTS = {"spark.ui.enabled": "false", "spark.ui.showConsoleProgress": "false"}


def java_tool_options(tmpdir: Path) -> str:
    """``JAVA_TOOL_OPTIONS`` for a JVM whose temporary files go to ``tmpdir``."""
    return f"{TEST_JVM_OPTIONS} -Djava.io.tmpdir={tmpdir}"


def spark_submit_args(settings: dict[str, str] | None = None, driver_options: str = "") -> str:
    """``PYSPARK_SUBMIT_ARGS`` for an application started through pyspark: the settings of
    :data:`SPARK_TEST_DEFAULTS` and ``settings``, and the driver JVM's own options."""
    merged = {**SPARK_TEST_DEFAULTS, **(settings or {})}
    args = [f"--conf {name}={value}" for name, value in merged.items()]
    if driver_options:
        args.append(f'--driver-java-options "{driver_options}"')
    return " ".join([*args, "pyspark-shell"])
