"""The Spark side of the bus: a journal of the PUB feed and a PySpark data source over it.

Importing this package is cheap: it imports neither PySpark nor the Twisted reactor.
:mod:`bus.spark.journal` needs pyarrow; :mod:`bus.spark.source`, :mod:`bus.spark.payload`
and :mod:`bus.spark.pipeline` need PySpark (the ``spark`` extra).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pyspark.sql import Column, SparkSession

FORMAT = "eventbus"


def register(spark: SparkSession) -> None:
    """Make ``spark.read.format("eventbus")`` and ``spark.readStream.format("eventbus")``
    available in this session."""
    from bus.spark.source import EventBusDataSource

    spark.dataSource.register(EventBusDataSource)


def decode_payload(payload: Column | str, schema: Any) -> Column:
    """The msgpack ``payload`` column decoded into Spark values; see
    :func:`bus.spark.payload.decode_payload`."""
    from bus.spark.payload import decode_payload as decode

    return decode(payload, schema)
