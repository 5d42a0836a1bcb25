"""Client-side folding: many rows per key into few partial states (MERGE_STATE input).

A writer that holds a batch's rows (a Spark task owns a whole bucket) folds them here with the
very aggregators the tablet uses, so a MERGE_STATE put of the result equals an AGGREGATE put of
the rows, with less to send and fewer RocksDB writes.

Retractions (rows with a `_change_type` of -U/-D) are never lost: each consecutive run of a
key's contributing rows folds into one '+U' state, and every retraction is sent as its own '-U'
state, in order, so the tablet applies exactly the sequence the rows describe (+x then -x for a
key changes nothing). Sum and product states carry their contribution counts
(`_contributions`), so a retraction later in the stream still knows when a cell is empty.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from aggfuncs import Segments
from aggfuncs.base import valid_mask
from merge_engine.changelog import contribution_lists
from merge_engine.descriptor import TableDescriptor
from merge_engine.input import CHANGE_TYPE, CONTRIBUTIONS, prepare_write
from merge_engine.keys import group_keys
from merge_engine.modes import MergeMode


def _runs(group_ids: np.ndarray, signs: np.ndarray) -> np.ndarray:
    """A group id per row: one per run of a key's contributing rows, one per retraction."""
    order = np.argsort(group_ids, kind="stable")
    key, sign = group_ids[order], signs[order]
    new_run = np.ones(len(order), dtype=bool)
    new_run[1:] = (key[1:] != key[:-1]) | (sign[1:] < 0) | (sign[:-1] < 0)
    runs = np.empty(len(order), dtype=np.int64)
    runs[order] = np.cumsum(new_run) - 1
    return runs


def preaggregate(rows, descriptor: TableDescriptor, target_columns=None,
                 mode: MergeMode = MergeMode.AGGREGATE, order: np.ndarray | None = None) -> pa.Table:
    """Partial states of `rows`, in key order (a key's states in row order): send the result
    with MergeMode.MERGE_STATE and the same target columns.

    `mode` says what the rows are: raw values (AGGREGATE) or partial states (MERGE_STATE).
    `order` is an optional permutation of the rows, e.g. sorted by a sequence column.
    """
    schema = descriptor.schema
    aggregators = schema.aggregators(descriptor.is_aggregation)
    write = prepare_write(rows, schema, aggregators, target_columns, allow_retractions=True)
    names = [n for n, t in zip(schema.names, write.target) if t]
    if write.rows == 0:
        return schema.to_arrow().empty_table().select(names)
    permutation = np.arange(write.rows) if order is None else np.asarray(order, dtype=np.int64)
    taken = pa.array(permutation, type=pa.int64())
    _, key_groups, _ = group_keys([c.take(taken) for c in write.key_columns(schema)])
    signs = np.ones(write.rows, dtype=np.int8) if write.signs is None else write.signs[permutation]
    run_ids = _runs(key_groups, signs)
    segments = Segments(run_ids, int(run_ids.max()) + 1)
    firsts = np.empty(segments.count, dtype=np.int64)
    firsts[run_ids[::-1]] = np.arange(len(run_ids) - 1, -1, -1)
    first_rows = pa.array(firsts, type=pa.int64())
    columns = []
    counted = [i for i, agg in enumerate(aggregators)
               if descriptor.is_aggregation and agg.counts_contributions]
    counts = np.zeros((segments.count, len(schema.names)), dtype=np.int64)
    for i, (agg, column) in enumerate(zip(aggregators, schema.columns)):
        if not write.target[i]:
            continue
        values = write.columns[column.name].take(taken)
        if column.name in schema.primary_key:
            columns.append(values.take(first_rows))
            continue
        values = agg.cast_input(values)
        states = agg.to_state(values) if mode is MergeMode.AGGREGATE else agg.from_merge_state(values)
        columns.append(agg.fold(states, np.ones(len(states), dtype=bool), segments))
        if i in counted:
            counts[:, i] = np.bincount(run_ids, weights=_contributions(write, counted, i, states,
                                                                       permutation),
                                       minlength=segments.count).astype(np.int64)
    table = pa.Table.from_arrays(columns, names=names)
    change = np.where(signs[firsts] < 0, "-U", "+U")
    table = table.append_column(CHANGE_TYPE, pa.array(change, type=pa.string()))
    if any(write.target[i] for i in counted):
        table = table.append_column(CONTRIBUTIONS, contribution_lists(counts, counted))
    return table


def _contributions(write, counted, i, states, permutation) -> np.ndarray:
    """How many contributions each row brings to counted column i (partial states may say)."""
    if write.contributions is None:
        return valid_mask(states).astype(np.int64)
    slot = counted.index(i)
    given = [write.contributions[r] for r in permutation]
    return np.array([1 if c is None else int(c[slot]) for c in given], dtype=np.int64)
