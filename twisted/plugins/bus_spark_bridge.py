# Names the ServiceMaker only; bus.spark.tap (and pyarrow) load when the command runs.
from twisted.application.service import ServiceMaker

spark_bridge = ServiceMaker(
    "Spark bridge",
    "bus.spark.tap",
    "Journal an Event BUS feed into Parquet segments for PySpark",
    "spark-bridge",
)
