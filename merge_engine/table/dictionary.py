"""Dictionary tables: string (or binary) keys mapped to dense integer ids for bitmap columns.

A dictionary is an ordinary aggregation table of two columns, the key `key` and `id`
(`first_value`, so a write that reaches a key again, a replay included, never changes its id),
marked by the table option DICTIONARY_OPTION, whose value is the id type: `int32` (ids in
[0, 2^32 - 1], what an rbm32 column takes, stored as uint32) or `int64` (ids in [0, 2^63 - 1],
for rbm64). Ids are assigned by each bucket's leader, never written by clients: bucket b of n
gives its k-th new key the id k * n + b, so ids are dense within the bucket balance.
"""

from __future__ import annotations

import dataclasses

import pyarrow as pa

from aggfuncs import AggFunction
from merge_engine.table.descriptor import TableDescriptor
from merge_engine.table.schema import Schema
from tally.errors import SchemaError

# Not under `table.`: the table options' list is the engine's, and a dictionary is an ordinary
# table to it; this option only tells the tablet server and the clients what it holds.
DICTIONARY_OPTION = "dictionary.id-type"
KEY_COLUMN = "key"
ID_COLUMN = "id"

ID_TYPES = {"int32": pa.uint32(), "int64": pa.int64()}
ID_LIMITS = {"int32": (1 << 32) - 1, "int64": (1 << 63) - 1}
# The bitmap functions an id type can feed: rbm32 takes ids below 2^32 only.
FEEDS = {"int32": (AggFunction.RBM32, AggFunction.RBM64), "int64": (AggFunction.RBM64,)}
KEY_TYPES = {"string": pa.string(), "binary": pa.binary()}


@dataclasses.dataclass(frozen=True)
class DictionarySpec:
    """What a dictionary table is: its id type and the Arrow types of its two columns."""

    id_type: str
    key_type: pa.DataType
    bucket_count: int

    @property
    def id_arrow_type(self) -> pa.DataType:
        return ID_TYPES[self.id_type]

    @property
    def limit(self) -> int:
        """The largest id the dictionary may assign."""
        return ID_LIMITS[self.id_type]

    def feeds(self, function: AggFunction) -> bool:
        return function in FEEDS[self.id_type]

    def id_of(self, sequence, bucket: int):
        """The id of a bucket's `sequence`-th key (numbers or numpy arrays)."""
        return sequence * self.bucket_count + bucket

    def next_sequence(self, max_id: int | None, bucket: int) -> int:
        """The bucket's next sequence after the ids it holds (`max_id`: the largest, or None)."""
        return 0 if max_id is None else (max_id - bucket) // self.bucket_count + 1


def _check_id_type(id_type) -> str:
    if id_type not in ID_TYPES:
        raise SchemaError(f"A dictionary's id type is one of {sorted(ID_TYPES)}, not {id_type!r}")
    return id_type


def dictionary_descriptor(id_type: str = "int32", buckets: int = 1, key_type: str = "string",
                          options: dict | None = None) -> TableDescriptor:
    """The descriptor of a dictionary table (see the module docstring); `options`: other
    table options (`table.replication.factor`, retention, ...)."""
    _check_id_type(id_type)
    if key_type not in KEY_TYPES:
        raise SchemaError(f"A dictionary's key type is one of {sorted(KEY_TYPES)}, not "
                          f"{key_type!r}")
    schema = (Schema.builder().column(KEY_COLUMN, KEY_TYPES[key_type], nullable=False)
              .agg_column(ID_COLUMN, ID_TYPES[id_type], AggFunction.FIRST_VALUE)
              .primary_key(KEY_COLUMN).build())
    descriptor = TableDescriptor(schema, bucket_count=buckets,
                                 properties={**(options or {}),
                                             "table.merge-engine": "aggregation",
                                             DICTIONARY_OPTION: id_type})
    dictionary_spec(descriptor, "the dictionary")  # an option may unmake it (a row TTL)
    return descriptor


def is_dictionary(descriptor: TableDescriptor) -> bool:
    return DICTIONARY_OPTION in descriptor.properties


def dictionary_spec(descriptor: TableDescriptor, name: str = "the table") -> DictionarySpec:
    """The dictionary `descriptor` describes; SchemaError naming `name` when it is no
    dictionary, or is marked as one but is not shaped like one."""
    id_type = descriptor.properties.get(DICTIONARY_OPTION)
    if id_type is None:
        raise SchemaError(f"{name} is not a dictionary table (it has no option "
                          f"'{DICTIONARY_OPTION}'); create one with admin.create_dictionary")
    schema = descriptor.schema
    problem = None
    if id_type not in ID_TYPES:
        problem = f"its option '{DICTIONARY_OPTION}' is {id_type!r}, not one of {sorted(ID_TYPES)}"
    elif schema.names != [KEY_COLUMN, ID_COLUMN] or list(schema.primary_key) != [KEY_COLUMN]:
        problem = (f"its columns are {schema.names} with the key {list(schema.primary_key)}, not "
                   f"['{KEY_COLUMN}', '{ID_COLUMN}'] keyed by '{KEY_COLUMN}'")
    elif schema.partition_key:
        problem = "it is partitioned"
    elif schema.column(KEY_COLUMN).type not in KEY_TYPES.values():
        problem = f"its key has type {schema.column(KEY_COLUMN).type}, not string or binary"
    elif (schema.column(ID_COLUMN).type != ID_TYPES[id_type]
          or schema.column(ID_COLUMN).agg is not AggFunction.FIRST_VALUE
          or not descriptor.is_aggregation):
        problem = (f"its id column must be {ID_TYPES[id_type]} with first_value in an "
                   f"aggregation table")
    elif descriptor.row_ttl_ms is not None:
        problem = "it has a row TTL (an expired key would give its id away again)"
    if problem:
        raise SchemaError(f"{name} is marked as a dictionary but {problem}")
    return DictionarySpec(id_type, schema.column(KEY_COLUMN).type, descriptor.bucket_count)
