"""The changelog: Arrow record batches of +I, -U, +U and -D records with full row images.

One offset per record. One put appends at most one batch (one entry per key per put: +I for a
new key, -U/+U for a changed one, -D for a removed one), stored as an Arrow IPC stream in the
same RocksDB write batch as the offsets. The stored batch is leaner than what readers get: the
change type is an int8 code and offsets are implied by the batch's first offset (its RocksDB
key); `deserialize` restores the `_offset` and `_change_type` columns.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from merge_engine.input import CONTRIBUTIONS, UNWRITTEN
from merge_engine.state import StateBatch

OFFSET = "_offset"
CHANGE_TYPE = "_change_type"

INSERT, UPDATE_BEFORE, UPDATE_AFTER, DELETE = "+I", "-U", "+U", "-D"

# What happened to each key of a write.
UNCHANGED, INSERTED, UPDATED, REMOVED = 0, 1, 2, 3

CHANGE_CODE = "_change"  # stored form of the change type: an index into CHANGE_TYPES
CHANGE_TYPES = pa.array([INSERT, UPDATE_BEFORE, UPDATE_AFTER, DELETE], type=pa.string())


def changelog_schema(arrow_schema: pa.Schema) -> pa.Schema:
    """The schema readers see."""
    fields = [pa.field(OFFSET, pa.int64(), nullable=False),
              pa.field(CHANGE_TYPE, pa.string(), nullable=False)]
    return pa.schema(fields + _image_fields(arrow_schema))


def stored_schema(arrow_schema: pa.Schema) -> pa.Schema:
    """The schema of a stored batch."""
    return pa.schema([pa.field(CHANGE_CODE, pa.int8(), nullable=False)]
                     + _image_fields(arrow_schema))


def _image_fields(arrow_schema: pa.Schema) -> list[pa.Field]:
    fields = [pa.field(f.name, f.type) for f in arrow_schema]
    fields.append(pa.field(UNWRITTEN, pa.list_(pa.string())))
    fields.append(pa.field(CONTRIBUTIONS, pa.list_(pa.int64())))
    return fields


def build_records(schema: pa.Schema, value_positions: list[int], counted: list[int],
                  before: StateBatch, after: StateBatch, outcome: np.ndarray) -> pa.Table | None:
    """The changelog records of one write in stored form, or None when nothing changed.

    `before` and `after` hold one row per key (aligned); `outcome` says per key whether it was
    inserted, updated, removed or left unchanged. Records follow the keys' order.
    """
    counts = np.select([outcome == INSERTED, outcome == UPDATED, outcome == REMOVED], [1, 2, 1], 0)
    total = int(counts.sum())
    if total == 0:
        return None
    m = len(before)
    key = np.repeat(np.arange(m), counts)
    first = np.concatenate([[True], key[1:] != key[:-1]])
    kind = outcome[key]
    # Rows of concat(before, after): before images at g, after images at m + g.
    take_after = (kind == INSERTED) | ((kind == UPDATED) & ~first)
    index = np.where(take_after, m + key, key)
    change = np.where(kind == INSERTED, 0, np.where(kind == REMOVED, 3, np.where(first, 1, 2)))
    images = StateBatch.concat(before, after).take(index)
    arrays = [pa.array(change.astype(np.int8))] + images.columns
    arrays.append(_unwritten_lists(images.written, value_positions, schema.names))
    arrays.append(contribution_lists(images.counts(), counted))
    return pa.Table.from_arrays(arrays, schema=stored_schema(schema))


def contribution_lists(counts: np.ndarray, counted: list[int]) -> pa.Array:
    """Per row, the contribution counts of the counted (sum, product) columns, in schema order."""
    n = len(counts)
    flat = counts[:, counted].ravel() if counted else np.zeros(0, dtype=np.int64)
    offsets = np.arange(n + 1, dtype=np.int32) * len(counted)
    return pa.ListArray.from_arrays(pa.array(offsets), pa.array(flat, type=pa.int64()))


def _unwritten_lists(written: np.ndarray, value_positions: list[int], names: list[str]):
    if not value_positions:
        return pa.array([[] for _ in range(len(written))], type=pa.list_(pa.string()))
    missing = ~written[:, value_positions]
    counts = missing.sum(axis=1)
    offsets = np.concatenate([[0], np.cumsum(counts)]).astype(np.int32)
    value_names = np.array([names[p] for p in value_positions], dtype=object)
    flat = value_names[np.nonzero(missing)[1]]
    return pa.ListArray.from_arrays(pa.array(offsets), pa.array(flat.tolist(), type=pa.string()))


def serialize(records: pa.Table) -> bytes:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, records.schema) as writer:
        writer.write_table(records)
    return sink.getvalue().to_pybytes()


def deserialize(data: bytes, first_offset: int) -> pa.Table:
    """A stored batch as readers see it, its first record at `first_offset`."""
    stored = pa.ipc.open_stream(pa.py_buffer(data)).read_all()
    n = stored.num_rows
    codes = stored.column(CHANGE_CODE).combine_chunks()
    return stored.drop_columns([CHANGE_CODE]) \
        .add_column(0, pa.field(CHANGE_TYPE, pa.string(), nullable=False), [CHANGE_TYPES.take(codes)]) \
        .add_column(0, pa.field(OFFSET, pa.int64(), nullable=False),
                    [pa.array(np.arange(first_offset, first_offset + n, dtype=np.int64))])


def state_from_records(records: pa.Table, names: list[str], value_positions: list[int],
                       counted: list[int]) -> StateBatch:
    """Row images of changelog records as a StateBatch (written bits and counts restored)."""
    columns = [records.column(n).combine_chunks() for n in names]
    written = np.ones((records.num_rows, len(names)), dtype=bool)
    unwritten = records.column(UNWRITTEN).to_pylist()
    position = {names[p]: p for p in value_positions}
    for row, missing in enumerate(unwritten):
        for name in missing or ():
            written[row, position[name]] = False
    counts = np.zeros(written.shape, dtype=np.int64)
    if counted and records.num_rows:
        flat = records.column(CONTRIBUTIONS).combine_chunks().flatten().to_numpy()
        counts[:, counted] = flat.reshape(records.num_rows, len(counted))
    return StateBatch(columns, written, counts)
