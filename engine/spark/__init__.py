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

SOURCE_NAME = "oncelog"


def register(spark: Any) -> None:
    """Register the `oncelog` format with this SparkSession (again after a restart)."""
    from oncelog.spark.source import OncelogDataSource

    spark.dataSource.register(OncelogDataSource)
