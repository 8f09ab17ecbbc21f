"""The rows of a Parquet sink as Spark reads it: ``python -m tests.spark.sink_rows DIR
COLUMN...`` prints each row's columns as a JSON list, one a line. Spark honours the sink's
``_spark_metadata`` (files of batches that failed are no rows), which a plain Parquet reader
would not. A local session on loopback (bus.spark.pipeline's)."""

from __future__ import annotations

import json
import sys

from bus.spark.pipeline import build_session


def main(path: str, columns: list[str]) -> None:
    spark = build_session("local[1]", 1)
    spark.sparkContext.setLogLevel("ERROR")
    try:
        for row in spark.read.parquet(path).select(*columns).toLocalIterator():
            print(json.dumps(list(row), separators=(",", ":")))
    finally:
        spark.stop()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:])
