"""The Spark side of the bus: a journal of the PUB feed and a PySpark data source over it.

Importing this package is cheap: it imports neither PySpark nor the Twisted reactor.
:mod:`bus.spark.journal` needs pyarrow; :mod:`bus.spark.source`, :mod:`bus.spark.payload`
and :mod:`bus.spark.pipeline` need PySpark (the ``spark`` extra).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import warnings
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pyspark.sql import Column, SparkSession

FORMAT = "eventbus"


def register(spark: SparkSession) -> None:
    """Make ``spark.read.format("eventbus")`` and ``spark.readStream.format("eventbus")``
    available in this session.

    The source's Python workers need pyarrow and this package. When the interpreter Spark
    starts workers with (``PYSPARK_PYTHON``, else ``python3`` on PATH) cannot import them,
    this source's workers run this interpreter instead, and one warning says so; the
    session's other Python code keeps its interpreter."""
    from bus.spark.source import EventBusDataSource

    context = _classic_context(spark)
    worker = getattr(context, "pythonExec", None)
    if context is None or not worker or _has_what_workers_need(worker):
        spark.dataSource.register(EventBusDataSource)
        return
    warnings.warn(
        f"Spark starts Python workers with {worker!r} (PYSPARK_PYTHON="
        f"{os.environ.get('PYSPARK_PYTHON', 'unset')}), which cannot import pyarrow and bus: "
        f"the eventbus source's workers run {sys.executable} instead; set PYSPARK_PYTHON to "
        "that before creating the session to silence this",
        stacklevel=2,
    )
    # A registered source carries the interpreter its workers run (read at registration).
    context.pythonExec = sys.executable
    try:
        spark.dataSource.register(EventBusDataSource)
    finally:
        context.pythonExec = worker


def _classic_context(spark: SparkSession) -> Any:
    """The session's SparkContext (None for a Spark Connect session, which has none)."""
    try:
        return spark.sparkContext
    except Exception:
        return None


def _has_what_workers_need(interpreter: str) -> bool:
    # Not resolved through symlinks: a venv's python links to the base interpreter.
    if os.path.abspath(shutil.which(interpreter) or interpreter) == sys.executable:
        return True
    try:
        probe = subprocess.run(
            [interpreter, "-c", "import pyarrow, bus.spark.source"],
            capture_output=True,
            timeout=60,
        )
    except (OSError, subprocess.TimeoutExpired):
        return False
    return probe.returncode == 0


def decode_payload(payload: Column | str, schema: Any) -> Column:
    """The msgpack ``payload`` column decoded into Spark values; see
    :func:`bus.spark.payload.decode_payload`."""
    from bus.spark.payload import decode_payload as decode

    return decode(payload, schema)
