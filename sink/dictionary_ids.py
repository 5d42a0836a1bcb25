"""Spark writes of string ids into bitmap columns, through a dictionary table.

The sink option `dictionary.<column> = <db>.<table>` names the dictionary (a table made by
`admin.create_dictionary`) whose ids a DataFrame's string (or binary) column becomes before its
rows feed the rbm32 or rbm64 column of that name. The planning checks it once on the driver
(`dictionary_columns`); the rows are mapped where they are first read, batch by batch, by
`map_ids` (on the executors, or on the driver for the driver delivery): each batch's distinct
values are sent once, through `Table.ids`, which assigns ids to the absent ones. Nulls stay
null (a bitmap's null rule: no contribution).

Exactly once: the dictionary is insert-if-absent, so a replayed epoch maps the same strings to
the same ids and writes the same bitmaps. Ids assigned for an epoch that is then refused or
undone stay assigned (unused ids, never another key's).
"""

from __future__ import annotations

import dataclasses

import pyarrow as pa
import pyarrow.compute as pc

from aggfuncs import AggFunction
from merge_engine.table.dictionary import dictionary_spec
from sink import remote
from sink.types import spark_to_arrow
from tally.errors import InvalidInputError, InvalidOptionError, NotFoundError, SchemaError

OPTION_PREFIX = "dictionary."
BITMAPS = (AggFunction.RBM32, AggFunction.RBM64)


@dataclasses.dataclass(frozen=True)
class DictionaryColumn:
    """One column mapped through a dictionary (picklable: shipped to every task)."""

    column: str            # the bitmap column, as the batches the write reads name it
    dictionary: str        # '<db>.<table>'
    dictionary_id: int     # its table id: a dictionary dropped and made again is refused
    id_type: pa.DataType
    url: str
    token: str | None = dataclasses.field(default=None, repr=False)  # never in logs
    tls: object = None


def _match(name: str, candidates) -> str | None:
    if name in candidates:
        return name
    folded = [c for c in candidates if c.lower() == name.lower()]
    return folded[0] if len(folded) == 1 else None


def dictionary_columns(conn, options, info, df_schema) -> tuple[tuple[DictionaryColumn, ...],
                                                               frozenset[str]]:
    """The checked `dictionary.*` options of a write of `df_schema` into table `info`: the
    columns to map, and the DataFrame columns whose types were checked here (against their
    dictionaries) instead of against the table. InvalidOptionError naming the option for a
    column that is no DataFrame column or no bitmap column, a table that is no dictionary, or
    a dictionary whose ids the bitmap cannot hold; InvalidInputError for a column of another
    type than the dictionary's keys."""
    schema = info.descriptor.schema
    fields = {f.name: f for f in df_schema.fields}
    mapped, checked = [], set()
    for column, name in options.dictionaries:
        option = f"{OPTION_PREFIX}{column}"
        df_name = _match(column, list(fields))
        table_column = _match(df_name, schema.names) if df_name is not None else None
        if table_column is None:
            raise InvalidOptionError(
                f"Option '{option}' names '{column}', which is not a DataFrame column written "
                f"to a column of table '{info.name}' (DataFrame columns: {list(fields)})")
        agg = schema.column(table_column).agg
        if agg not in BITMAPS:
            raise InvalidOptionError(
                f"Option '{option}': column '{table_column}' of table '{info.name}' is "
                f"{agg.value if agg else 'a key or plain column'}; a dictionary feeds rbm32 "
                f"and rbm64 columns only")
        try:
            dictionary = conn.admin.describe_table(name)
        except NotFoundError:
            raise NotFoundError(f"Option '{option}' names the dictionary '{name}', which does "
                                f"not exist; create it with admin.create_dictionary") from None
        try:
            spec = dictionary_spec(dictionary.descriptor, f"table '{name}' (option '{option}')")
        except SchemaError as e:
            raise InvalidOptionError(str(e)) from None
        if not spec.feeds(agg):
            raise InvalidOptionError(
                f"Option '{option}': dictionary '{name}' assigns {spec.id_type} ids (up to "
                f"{spec.limit}), which the {agg.value} column '{table_column}' cannot hold; "
                f"use an int32 dictionary or an rbm64 column")
        given = spark_to_arrow(fields[df_name].dataType)
        if given != spec.key_type and not (pa.types.is_large_string(given)
                                           and pa.types.is_string(spec.key_type)):
            raise InvalidInputError(
                f"DataFrame column '{df_name}' has type {given}, but dictionary '{name}' (option "
                f"'{option}') maps {spec.key_type} keys; cast it first")
        mapped.append(DictionaryColumn(table_column, name, int(dictionary.table_id),
                                       spec.id_arrow_type, options.url, options.token,
                                       options.tls))
        checked.add(df_name)
    return tuple(mapped), frozenset(checked)


def map_ids(columns: tuple[DictionaryColumn, ...], batch: pa.RecordBatch,
            label: str) -> pa.RecordBatch:
    """`batch` with each mapped column's values replaced by their dictionary ids."""
    for mapped in columns:
        index = batch.schema.get_field_index(mapped.column)
        if index < 0:
            continue  # not written by this write (a partial write's other columns)
        try:
            ids = _ids(mapped, batch.column(index))
        except InvalidInputError as e:
            raise InvalidInputError(f"{label}: column '{mapped.column}' through dictionary "
                                    f"{mapped.dictionary}: {e}; nothing of the batch was "
                                    f"written") from None
        batch = batch.set_column(index, pa.field(mapped.column, mapped.id_type), ids)
    return batch


def _ids(mapped: DictionaryColumn, values: pa.Array) -> pa.Array:
    if values.null_count == len(values):
        return pa.nulls(len(values), mapped.id_type)
    from tally.client.table import Table

    conn = remote.shared_connection(mapped.url, mapped.token, mapped.tls)
    distinct = pc.unique(values.drop_null())
    found = Table(conn, mapped.dictionary, mapped.dictionary_id).ids(distinct)
    return found.take(pc.index_in(values, value_set=distinct))
