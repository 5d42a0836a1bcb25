"""The write plan: the table a DataFrame goes to, checked against it before anything is written.

Built once on the driver from the sink options and the DataFrame's schema: resolves (or, with
`create-table`, creates) the table, maps DataFrame columns to table columns, and refuses a
missing key, unknown columns and wrong types with messages that name the column. The resulting
`WritePlan` is small and picklable: Spark ships it to every task.
"""

from __future__ import annotations

import dataclasses

import pyarrow as pa

from merge_engine import MergeMode, TableDescriptor
from merge_engine.table.connector_options import check_against_table
from merge_engine.table.sequence_groups import check_groups_against_table, missing_sequence
from sink.options import SinkOptions
from sink.owner import lock_columns
from sink.types import accepts, spark_to_arrow
from tally.errors import InvalidInputError, InvalidOptionError, NotFoundError, SchemaError

BUCKET_COLUMN = "__tally_bucket"
ORDER_COLUMN = "__tally_order"
# A row's partition name, computed where the row is bucketed and carried to its bucket writer.
PARTITION_COLUMN = "__tally_partition"
# The sequence column's values, when the sequence column is not also written to the table.
HIDDEN_SEQUENCE_COLUMN = "__tally_sequence"


@dataclasses.dataclass(frozen=True)
class WritePlan:
    """Everything a task needs to write its bucket (picklable)."""

    table: str
    table_id: int
    descriptor_json: str
    bucket_count: int
    input_columns: tuple[str, ...]     # DataFrame columns read, in order
    table_columns: tuple[str, ...]     # the table column each input column feeds (same order)
    target_columns: tuple[str, ...]    # table columns written, key included, schema order
    lock_columns: tuple[str, ...]      # non-key targets: the column lock's set
    key_columns: tuple[str, ...]
    bucket_key: tuple[str, ...]
    partitioned: bool
    mode: MergeMode
    sequence_column: str | None        # DataFrame column ordering rows of a key, or None
    # Every DataFrame column, in order: when they are the input columns under their table
    # names already, the write reads the DataFrame as it is (no select to build and plan).
    dataframe_columns: tuple[str, ...] = ()
    # Columns whose values are mapped to ids through a dictionary (sink.dictionary_ids).
    dictionaries: tuple = ()

    @property
    def full_row(self) -> bool:
        return len(self.target_columns) == len(self.descriptor.schema.columns)

    @property
    def renames(self) -> bool:
        """Whether the write must select its columns under other names (or fewer of them)."""
        return not (self.dataframe_columns == self.input_columns == self.table_columns)

    @property
    def descriptor(self) -> TableDescriptor:
        cached = self.__dict__.get("_descriptor")
        if cached is None:
            cached = TableDescriptor.from_json(self.descriptor_json)
            object.__setattr__(self, "_descriptor", cached)
        return cached

    @property
    def writer_target(self) -> list[str] | None:
        """The writer's target_columns: None for full rows (then every column is sent)."""
        return None if self.full_row else list(self.target_columns)

    def key_types(self) -> dict[str, pa.DataType]:
        arrow = self.descriptor.schema.to_arrow()
        return {k: arrow.field(k).type for k in self.key_columns}

    def __getstate__(self):
        state = dict(self.__dict__)
        state.pop("_descriptor", None)
        return state


def _match(name: str, candidates: list[str]) -> str | None:
    if name in candidates:
        return name
    folded = [c for c in candidates if c.lower() == name.lower()]
    return folded[0] if len(folded) == 1 else None


def _arrow_fields(df_schema) -> dict[str, pa.DataType]:
    fields = {}
    for f in df_schema.fields:
        try:
            fields[f.name] = spark_to_arrow(f.dataType)
        except Exception as e:  # noqa: BLE001 - pyspark raises its own error types here
            raise InvalidInputError(
                f"DataFrame column '{f.name}' has type {f.dataType.simpleString()}, which Tally "
                f"cannot store: {e}") from None
    return fields


def descriptor_for(options: SinkOptions, df_schema) -> TableDescriptor:
    """The descriptor `create-table` would create from the options and the DataFrame."""
    fields = _arrow_fields(df_schema)
    names = [n for n in fields if n != options.sequence_column]
    if not options.primary_key:
        raise InvalidOptionError(
            "create-table needs the option 'primary-key' (comma-separated key columns)")
    resolved = {}
    for key in options.primary_key + options.partition_key:
        match = _match(key, names)
        if match is None:
            raise InvalidInputError(
                f"Key column '{key}' is missing from the DataFrame (columns: {names})")
        resolved[key] = match
    table_options = {}
    for key, value in options.table_options:
        if key.startswith("fields."):
            body = key[len("fields."):]
            column = next((n for n in sorted(names, key=len, reverse=True)
                           if body.lower().startswith(n.lower() + ".")), None)
            if column is not None:
                key = f"fields.{column}{body[len(column):]}"
        table_options[key] = value
    table_options.setdefault("table.merge-engine", "aggregation")
    if options.bucket_num is not None:
        table_options["bucket.num"] = str(options.bucket_num)
    arrow = pa.schema([pa.field(n, fields[n]) for n in names])
    return TableDescriptor.from_options(
        arrow, primary_key=[resolved[k] for k in options.primary_key],
        partition_key=[resolved[k] for k in options.partition_key], options=table_options)


def resolve_table(conn, options: SinkOptions, df_schema):
    """The table's TableInfo, creating it first when `create-table` is set and it is missing.

    An existing table whose schema differs from what the options describe is an error.
    """
    admin = conn.admin
    try:
        info = admin.describe_table(options.table)
    except NotFoundError:
        if not options.create_table:
            raise NotFoundError(
                f"Table '{options.table}' does not exist; create it first or set the sink "
                "option 'create-table' = 'true' (with 'primary-key' and fields.<col>.agg)") from None
        wanted = descriptor_for(options, df_schema)
        admin.create_database(options.database, ignore_if_exists=True)
        admin.create_table(options.table, wanted, ignore_if_exists=True)
        info = admin.describe_table(options.table)
        _check_same(options.table, wanted, info.descriptor, options.bucket_num)
        return info
    check_against_table(info.descriptor.schema, dict(options.table_options), options.table)
    check_groups_against_table(info.descriptor, dict(options.table_options), options.table)
    if options.create_table and (options.primary_key or options.table_options
                                 or options.bucket_num):
        _check_same(options.table, descriptor_for(options, df_schema), info.descriptor,
                    options.bucket_num)
    return info


def _check_same(table: str, wanted: TableDescriptor, existing: TableDescriptor,
                bucket_num: int | None) -> None:
    if wanted.schema != existing.schema:
        raise SchemaError(
            f"Table '{table}' already exists with a different schema: it has "
            f"{existing.schema!r}, the sink options describe {wanted.schema!r}")
    if bucket_num is not None and bucket_num != existing.bucket_count:
        raise SchemaError(
            f"Table '{table}' already exists with {existing.bucket_count} buckets, the sink "
            f"option 'bucket.num' says {bucket_num}")


def build_plan(info, options: SinkOptions, df_schema, mapped=frozenset()) -> WritePlan:
    """Check the DataFrame against the table and describe the write (see module docstring).
    `mapped`: DataFrame columns whose types were checked against their dictionaries."""
    descriptor = info.descriptor
    schema = descriptor.schema
    fields = _arrow_fields(df_schema)
    df_names = list(fields)
    sequence = None
    if options.sequence_column is not None:
        sequence = _match(options.sequence_column, df_names)
        if sequence is None:
            raise InvalidInputError(
                f"sequence-column '{options.sequence_column}' is not a DataFrame column "
                f"(columns: {df_names})")
        t = fields[sequence]
        if not (pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_decimal(t)
                or pa.types.is_temporal(t) or pa.types.is_string(t)):
            raise InvalidInputError(
                f"sequence-column '{sequence}' has type {t}; it must be a number, a date or "
                "timestamp, or a string")
    table_names = schema.names
    mapping: dict[str, str] = {}
    for name in df_names:
        if name == sequence:
            continue
        column = _match(name, table_names)
        if column is None:
            raise InvalidInputError(
                f"DataFrame column '{name}' is not a column of table '{info.name}' "
                f"(its columns: {table_names}); drop or rename it before writing")
        mapping[name] = column
    if sequence is not None and _match(sequence, table_names) is not None:
        mapping[sequence] = _match(sequence, table_names)
    written = set(mapping.values())
    if options.columns is not None:
        chosen = []
        for c in options.columns:
            column = _match(c, table_names)
            if column is None:
                raise InvalidOptionError(
                    f"Option 'columns' names '{c}', which is not a column of table "
                    f"'{info.name}' (its columns: {table_names})")
            chosen.append(column)
        targets = set(chosen) | set(schema.primary_key)
        missing = sorted(targets - written)
        if missing:
            raise InvalidInputError(
                f"The DataFrame lacks column(s) {missing} listed in 'columns' (or in the "
                f"primary key {list(schema.primary_key)}) of table '{info.name}'")
        extra = sorted(c for c in written - targets if c != mapping.get(sequence))
        if extra:
            raise InvalidInputError(
                f"DataFrame column(s) {extra} are not among the target columns {sorted(targets)}"
                "; add them to 'columns' or drop them")
        mapping = {k: v for k, v in mapping.items() if v in targets}
    else:
        missing = [k for k in schema.primary_key if k not in written]
        if missing:
            raise InvalidInputError(
                f"The DataFrame lacks the primary-key column(s) {missing} of table "
                f"'{info.name}'; every write needs the whole key")
        targets = written
    if not (targets - set(schema.primary_key)):
        raise InvalidInputError(
            f"The DataFrame writes only key columns of table '{info.name}'; add value columns")
    aggregation = descriptor.is_aggregation
    for df_name, column_name in mapping.items():
        if df_name in mapped:
            continue
        column = schema.column(column_name)
        is_key = column_name in schema.primary_key
        if not accepts(column, is_key, fields[df_name], options.merge_mode, aggregation):
            fn = (column.agg.value if column.agg else "last_value_ignore_nulls") \
                if aggregation and not is_key else "value"
            raise InvalidInputError(
                f"DataFrame column '{df_name}' has type {fields[df_name]}, which cannot feed "
                f"column '{column_name}' ({fn}, type {column.type}) of table '{info.name}'; "
                "cast it first")
    target_columns = tuple(n for n in table_names if n in targets)
    missing = missing_sequence(descriptor.sequence_groups, target_columns)
    if missing:  # refused here, on the driver, before a lock is taken or a task runs
        raise InvalidInputError(f"The write to table '{info.name}' is refused: {missing}")
    routing = info_routing(info)
    return WritePlan(
        table=info.name, table_id=int(info.table_id), descriptor_json=descriptor.to_json(),
        bucket_count=descriptor.bucket_count,
        input_columns=tuple(mapping), table_columns=tuple(mapping.values()),
        target_columns=target_columns,
        lock_columns=tuple(lock_columns(schema, None if len(target_columns) == len(table_names)
                                        else target_columns)),
        key_columns=tuple(schema.primary_key), bucket_key=routing[0], partitioned=routing[1],
        mode=options.merge_mode, sequence_column=sequence,
        dataframe_columns=tuple(f.name for f in df_schema.fields))


def plan_write(conn, options: SinkOptions, df_schema) -> WritePlan:
    """resolve_table, then build_plan: the checked plan of writing `df_schema` by `options`."""
    info = resolve_table(conn, options, df_schema)
    if not options.dictionaries:
        return build_plan(info, options, df_schema)
    from sink.dictionary_ids import dictionary_columns

    columns, mapped = dictionary_columns(conn, options, info, df_schema)
    return dataclasses.replace(build_plan(info, options, df_schema, mapped),
                               dictionaries=columns)


def info_routing(info) -> tuple[tuple[str, ...], bool]:
    """(bucket key, partitioned) as the client's routing defines them."""
    schema = info.descriptor.schema
    pk, part = tuple(schema.primary_key), tuple(schema.partition_key)
    return tuple(c for c in pk if c not in part) or pk, bool(part)
