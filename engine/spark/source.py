"""The `oncelog` data source: the schema, and which reader or writer each query gets."""

from __future__ import annotations

from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    DataSourceStreamWriter,
    DataSourceWriter,
)
from pyspark.sql.types import StructType

from oncelog.spark import SOURCE_NAME
from oncelog.spark.arrow_batches import DDL
from oncelog.spark.options import OptionError, read_options, write_options
from oncelog.spark.readers import OncelogBatchReader, OncelogStreamReader
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
        return OncelogBatchReader(read_options(self.options))

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        self._check_read_schema(schema)
        return OncelogStreamReader(read_options(self.options, streaming=True))

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
