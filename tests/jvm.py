"""The options every JVM the tests start runs with.

Those JVMs (the Spark session, pipelines, a Spark cluster's master and workers) run for
seconds to minutes on small data: C2's compilations and a parallel collector's threads are
most of what they spend there. C1 alone and the serial collector halve the Spark tests'
CPU (tests/spark/test_spark_source.py: 87 -> 44 CPU-seconds) on a machine whose two cores
the suite keeps busy. The product's pipelines keep the JVM's defaults: they run for days.
"""

from __future__ import annotations

from pathlib import Path

TEST_JVM_OPTIONS = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"


def java_tool_options(tmpdir: Path) -> str:
    """``JAVA_TOOL_OPTIONS`` for a JVM whose temporary files go to ``tmpdir``."""
    return f"{TEST_JVM_OPTIONS} -Djava.io.tmpdir={tmpdir}"
