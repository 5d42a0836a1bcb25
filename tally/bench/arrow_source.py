"""A Spark Python data source that only hands over Arrow batches: the least any Python data
source read can cost (tally.bench.spark_read measures it beside Tally's read).

    spark.dataSource.register(ParquetArrowSource)
    spark.read.format("bench-arrow").option("files", "a.parquet,b.parquet").load()

One Spark partition per file, or runs of neighbouring files in `partitions` Spark partitions
(as Tally's read groups buckets); a task reads its files with pyarrow and yields their batches
as they are, so what is timed is Spark's part of a Python data source read (a Python worker per
task, the Arrow hand-off to the JVM, rows out of it) and pyarrow's reading of a local file.
"""

from __future__ import annotations

import pyarrow.parquet as pq
from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition


class _FileReader(DataSourceReader):
    def __init__(self, files: list[str], partitions: int | None, batch_size: int) -> None:
        self.files = files
        self.partition_count = partitions
        self.batch_size = batch_size

    def partitions(self):
        from sink.batch_reader import grouped

        return [InputPartition(run) for run in grouped(self.files, self.partition_count)]

    def read(self, partition: InputPartition):
        for path in partition.value:
            yield from pq.read_table(path).to_batches(max_chunksize=self.batch_size)


class ParquetArrowSource(DataSource):
    """Options: `files` (comma-separated Parquet files of one schema), `partitions`,
    `batch-size`."""

    @classmethod
    def name(cls) -> str:
        return "bench-arrow"

    def _files(self) -> list[str]:
        return [f for f in str(self.options["files"]).split(",") if f]

    def schema(self):
        from pyspark.sql.pandas.types import from_arrow_schema

        return from_arrow_schema(pq.read_schema(self._files()[0]))

    def reader(self, schema):
        partitions = self.options.get("partitions")
        return _FileReader(self._files(), None if partitions is None else int(partitions),
                           int(self.options.get("batch-size", 65536)))
