"""Client-side folding: many rows per key into one partial state per key (MERGE_STATE input).

A writer that holds a batch's rows (a Spark task owns a whole bucket) folds them here with the
very aggregators the tablet uses, so a MERGE_STATE put of the result equals an AGGREGATE put of
the rows, with less to send and fewer RocksDB writes.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from aggfuncs import Segments
from merge_engine.descriptor import TableDescriptor
from merge_engine.input import prepare_write
from merge_engine.keys import encode_keys
from merge_engine.modes import MergeMode


def preaggregate(rows, descriptor: TableDescriptor, target_columns=None,
                 mode: MergeMode = MergeMode.AGGREGATE, order: np.ndarray | None = None) -> pa.Table:
    """One row per key: each target column folded in row order (or in `order`, a permutation
    of the rows, e.g. sorted by a sequence column). Send the result with MergeMode.MERGE_STATE.

    `mode` says what the rows are: raw values (AGGREGATE) or partial states (MERGE_STATE).
    """
    schema = descriptor.schema
    aggregators = schema.aggregators(descriptor.is_aggregation)
    write = prepare_write(rows, schema, aggregators, target_columns)
    if write.rows == 0:
        names = [n for n, t in zip(schema.names, write.target) if t]
        return schema.to_arrow().empty_table().select(names)
    permutation = np.arange(write.rows) if order is None else np.asarray(order, dtype=np.int64)
    taken = pa.array(permutation, type=pa.int64())
    keys = pa.array(encode_keys([c.take(taken) for c in write.key_columns(schema)]), type=pa.binary())
    encoded = keys.dictionary_encode()
    group_ids = encoded.indices.to_numpy(zero_copy_only=False).astype(np.int64)
    segments = Segments(group_ids, len(encoded.dictionary))
    firsts = np.empty(segments.count, dtype=np.int64)
    firsts[group_ids[::-1]] = np.arange(len(group_ids) - 1, -1, -1)
    firsts = pa.array(firsts, type=pa.int64())
    columns, names = [], []
    for agg, column, targeted in zip(aggregators, schema.columns, write.target):
        if not targeted:
            continue
        values = write.columns[column.name].take(taken)
        if column.name in schema.primary_key:
            columns.append(values.take(firsts))
        else:
            values = agg.cast_input(values)
            states = agg.to_state(values) if mode is MergeMode.AGGREGATE else agg.from_merge_state(values)
            columns.append(agg.fold(states, np.ones(len(states), dtype=bool), segments))
        names.append(column.name)
    return pa.Table.from_arrays(columns, names=names)
