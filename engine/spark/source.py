"""The `oncelog` data source: the schema, and which reader or writer each query gets.

Spark builds these objects on the driver (in its Python planning workers), so this is
where the root is resolved: an absolute path, checked, with its id (readers) or created
whole (writers) before any task runs.
"""

from __future__ import annotations

import sys

from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    DataSourceStreamWriter,
    DataSourceWriter,
)
from pyspark.sql.types import StructType

from oncelog.spark.arrow_batches import DDL
from oncelog.spark.options import SOURCE_NAME, OptionError, read_options, write_options
from oncelog.spark.planning import plan_read_root
from oncelog.spark.readers import OncelogBatchReader, OncelogFilteringReader, OncelogStreamReader
from oncelog.spark.writers import OncelogBatchWriter, OncelogStreamWriter, check_input_schema

# DDL as Spark prints it (tests check the two agree).
SCHEMA_STRING = (
    "struct<key:binary,value:binary,topic:string,partition:int,offset:bigint,timestamp:timestamp,"
    "timestampType:int,headers:array<struct<key:string,value:binary>>,producerId:bigint,"
    "producerEpoch:smallint,sequence:int>"
)


class OncelogDataSource(DataSource):
    @classmethod
    def name(cls) -> str:
        return SOURCE_NAME

    def schema(self) -> str:
        return DDL

    def _check_read_schema(self, schema: StructType) -> None:
        # Compared as text: parsing DDL needs the JVM, which planning workers do not have.
        if schema.simpleString() != SCHEMA_STRING:
            raise OptionError(f"the oncelog source's schema is fixed ({DDL}); do not pass .schema(...)")

    def reader(self, schema: StructType) -> DataSourceReader:
        self._check_read_schema(schema)
        options = plan_read_root(read_options(self.options))
        if _filter_pushdown_disabled():
            return OncelogBatchReader(options)
        return OncelogFilteringReader(options)

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        self._check_read_schema(schema)
        return OncelogStreamReader(plan_read_root(read_options(self.options, streaming=True)))

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        if overwrite:
            raise OptionError('a log is append-only: use .mode("append")')
        check_input_schema(schema)
        return OncelogBatchWriter(write_options(self.options))

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:
        if overwrite:
            raise OptionError('a log is append-only: use outputMode("append")')
        check_input_schema(schema)
        return OncelogStreamWriter(write_options(self.options))


def _filter_pushdown_disabled() -> bool:
    """Whether Spark asked for this reader with spark.sql.python.filterPushdown.enabled off.

    Spark (4.1+) refuses a reader that implements pushFilters when the conf is off
    (DATA_SOURCE_PUSHDOWN_DISABLED), and tells the source nothing about the conf. Its
    planning worker (pyspark.sql.worker.plan_data_source_read) holds the conf in the
    local `enable_pushdown` of the frame calling reader(); with the conf on, another
    worker calls reader(), without that local. So: off only where that frame says so;
    anywhere else the filtering reader is the right one. `register(spark,
    filter_pushdown=True)` turns the conf on.
    """
    caller = sys._getframe(2)  # reader() is frame 1
    return caller.f_locals.get("enable_pushdown") is False
