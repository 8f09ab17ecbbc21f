"""``bus.spark.register`` on a session whose Python workers run an interpreter without pyarrow."""

from __future__ import annotations

import stat
import sys
from pathlib import Path
from typing import Any

import pytest

from bus.spark import register
from bus.spark.source import EventBusDataSource
from bus.spark.synthetic import write_journal

pytestmark = pytest.mark.spark


def test_workers_run_this_interpreter_when_sparks_python_lacks_pyarrow(
    spark: Any, workdir: Path
) -> None:
    # Like python3 on PATH outside the venv: it runs, but has neither pyarrow nor bus.
    bare = workdir / "python3"
    bare.write_text(f'#!/bin/sh\nexec "{sys.executable}" -S "$@"\n')
    bare.chmod(bare.stat().st_mode | stat.S_IEXEC)
    journal = workdir / "journal"
    write_journal(journal, 500)
    context = spark.sparkContext
    saved = context.pythonExec
    context.pythonExec = str(bare)
    try:
        # The failure users met: registered as is, the workers cannot even start the source.
        spark.dataSource.register(EventBusDataSource)
        with pytest.raises(Exception, match=r"(?i)module|python|worker"):
            spark.read.format("eventbus").option("path", str(journal)).load().count()
        with pytest.warns(UserWarning, match="cannot import pyarrow"):
            register(spark)
        rows = spark.read.format("eventbus").option("path", str(journal)).load()
        assert rows.count() == 500
        assert context.pythonExec == str(bare)  # the session's own setting is left alone
    finally:
        context.pythonExec = saved
        register(spark)
