"""oncelog as a PySpark data source (Spark >= 4.0 Python Data Source API).

    import oncelog.spark
    oncelog.spark.register(spark)
    df = spark.read.format("oncelog").option("topic", "orders").load("/data/oncelog")
    df.write.format("oncelog").mode("append").option("topic", "orders").option("writeId", "run-7").save(root)

Needs the `spark` extra (pyspark, pyarrow). Importing this package does not import
pyspark; `register` does.
"""

from __future__ import annotations

from typing import Any

from oncelog.spark.options import SOURCE_NAME as SOURCE_NAME

# Spark passes a Python source's filters only with this on (off by default in Spark 4.1-4.3).
FILTER_PUSHDOWN_CONF = "spark.sql.python.filterPushdown.enabled"


def register(spark: Any, *, filter_pushdown: bool = False) -> None:
    """Register the `oncelog` format with this SparkSession (again after a restart).

    `filter_pushdown=True` turns on the session's Python filter pushdown
    (FILTER_PUSHDOWN_CONF), so that filters on partition, offset and timestamp narrow
    what is read. It is off by default because Spark 4.1-4.3 keep the plan of a
    relation's last pushdown and reuse it for its other scans: `df.filter("partition =
    1").count()` then `df.count()` counts partition 1 only, and so does a union or a
    view of one DataFrame. With it on, scan each loaded DataFrame once (README, Spark).
    """
    from oncelog.spark.source import OncelogDataSource

    spark.dataSource.register(OncelogDataSource)
    if filter_pushdown:
        spark.conf.set(FILTER_PUSHDOWN_CONF, "true")
