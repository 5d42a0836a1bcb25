"""`spark.read.format("tally").option("snapshot", "lake" | "union")`: a table read from its
lake copy, with no Delta jars: the tasks read the Delta table's Parquet files themselves
(deltalake and pyarrow), one Spark partition per file of the snapshot's version.

    spark.read.format("tally").option("url", url).option("table", "db.t")
        .option("snapshot", "union").load()

`lake` reads the Delta table at the version the coordinator knows of, cast back to the table's
own column types (the same rows as tally.lake.read_lake). `union` adds every change since: the
driver reads the lake snapshot and each bucket's changelog from the lake's offsets to its end
offsets once, and folds it to the net change per key (small: one image per changed key). Each
file's partition then drops the changed keys from its rows, and one more partition emits the
newest images of the changed keys that still exist (the same rows as tally.lake.read_union).
The net changes travel inside the InputPartitions, which Spark pickles to the tasks.

A file's rows of a partition dropped since the snapshot are left out of a union (a live read
no longer has them); a lake read shows the Delta table as it is.
"""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql.datasource import DataSourceReader, InputPartition
from pyspark.sql.types import StructType

from sink.batch_reader import UNION, ReadPlan, estimated_columns
from sink.types import spark_to_arrow
from tally.errors import InvalidOptionError


class LakeFilePartition(InputPartition):
    """One Parquet file of the lake snapshot and, for a union, the keys to leave out of it."""

    def __init__(self, index: int, fragment, dataset_schema: pa.Schema,
                 changed_keys: pa.Table | None, partitions: frozenset | None) -> None:
        super().__init__(index)
        self.fragment = fragment          # a pyarrow ParquetFileFragment (it pickles)
        self.dataset_schema = dataset_schema
        self.changed_keys = changed_keys  # None for a lake read
        self.partitions = partitions      # the table's partitions now (union reads)


class LakeChangesPartition(InputPartition):
    """The newest images of the keys changed since the snapshot that still exist."""

    def __init__(self, index: int, rows: pa.Table) -> None:
        super().__init__(index)
        self.rows = rows


class LakeBatchReader(DataSourceReader):
    """Plans on the driver (the snapshot, its files and for a union the net changes); each
    task reads one file, or emits the changed rows."""

    def __init__(self, plan: ReadPlan | dict, schema: StructType) -> None:
        from sink import remote
        from tally.client.scan_filter import ScanFilter
        from tally.errors import InvalidInputError

        plan = plan if isinstance(plan, ReadPlan) else ReadPlan.of(plan)
        self.options = plan.options
        conn = remote.shared_connection(self.options.url, self.options.token, self.options.tls)
        routing = plan.meta.routing
        table_schema = routing.arrow_schema
        self.columns = [f.name for f in schema.fields]
        unknown = [c for c in self.columns if c not in table_schema.names]
        if unknown or not self.columns:
            raise InvalidOptionError(
                f"The schema given to read {self.options.table} names column(s) {unknown} the "
                f"table does not have (it has {table_schema.names})" if unknown else
                f"The schema given to read {self.options.table} names none of its columns")
        try:
            self.filter = ScanFilter.parse(self.options.filter, table_schema)
        except InvalidInputError as e:
            raise InvalidOptionError(f"Option 'filter': {e}") from None
        self.primary_key = list(routing.primary_key)
        self.partition_key = list(routing.partition_key)
        # the key leaves the changed rows out of a file; the filter's columns filter the rows
        read = [*self.columns, *self.primary_key, *self.filter.columns]
        self.read_schema = pa.schema([table_schema.field(c) for c in dict.fromkeys(read)])
        self.output_schema = pa.schema([pa.field(f.name, spark_to_arrow(f.dataType),
                                                 f.nullable) for f in schema.fields])
        self.estimated = estimated_columns(plan)
        self._partitions = self._plan(conn, routing)

    def _plan(self, conn, routing) -> list[InputPartition]:
        from tally.lake import lake_reads

        if self.options.snapshot == UNION:
            plan = lake_reads.union_plan(conn, self.options.table)
            snapshot, keys, partitions = plan.snapshot, plan.changed_keys, plan.partitions
            changed = [LakeChangesPartition(0, plan.live_images.select(
                self.read_schema.names))]
        else:
            snapshot = lake_reads.lake_snapshot(conn, self.options.table)
            keys, partitions, changed = None, None, []
        dataset = lake_reads.lake_dataset(snapshot)
        fragments = dataset.get_fragments(filter=self._pruning(dataset.schema))
        files = [LakeFilePartition(i, fragment, dataset.schema, keys, partitions)
                 for i, fragment in enumerate(fragments, start=len(changed))]
        return changed + files or [LakeChangesPartition(0, self.read_schema.empty_table())]

    def _pruning(self, lake_schema: pa.Schema):
        """The filter as a pyarrow expression on the lake's columns: the files whose partition
        values or statistics rule out every value it accepts are not read at all."""
        from merge_engine.table.lake_options import lake_type

        expression = None
        for column, accepted in self.filter.values.items():
            if column not in lake_schema.names:
                continue
            try:
                values = accepted.cast(lake_type(column, accepted.type))
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
                continue  # not prunable: the rows are filtered all the same
            term = pc.field(column).isin(values)
            expression = term if expression is None else expression & term
        return expression

    def partitions(self):
        return self._partitions

    def __getstate__(self):
        # the planned partitions go to their own tasks, not to every task with the reader
        return {k: v for k, v in self.__dict__.items() if k != "_partitions"}

    def read(self, partition):
        if isinstance(partition, LakeFilePartition):
            rows = self._file_rows(partition)
        else:
            rows = partition.rows
        rows = pa.Table.from_batches([self.filter.apply(b) for b in rows.to_batches()],
                                     schema=rows.schema)
        schema = self.output_schema
        for batch in rows.to_batches(max_chunksize=self.options.batch_size):
            if batch.num_rows:
                yield pa.RecordBatch.from_arrays(
                    [(self.estimated[f.name].of(batch.column(f.name))
                      if f.name in self.estimated else batch.column(f.name)).cast(f.type)
                     for f in schema], schema=schema)

    def _file_rows(self, partition: LakeFilePartition) -> pa.Table:
        from tally.lake import lake_reads

        present = [c for c in self.read_schema.names if c in partition.dataset_schema.names]
        rows = lake_reads.tally_rows(
            partition.fragment.to_table(schema=partition.dataset_schema, columns=present),
            self.read_schema)
        if partition.changed_keys is None:
            return rows
        rows = lake_reads.live_partitions_only(rows, self.partition_key, partition.partitions)
        return lake_reads.without_keys(rows, partition.changed_keys, self.primary_key)
