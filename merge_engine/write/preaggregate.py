"""Client-side folding: many rows per key into few partial states (MERGE_STATE input), or, for
OVERWRITE writes, into each key's latest row.

A writer that holds a batch's rows (a Spark task owns a whole bucket) folds them here with the
very aggregators the tablet uses, so a MERGE_STATE put of the result equals an AGGREGATE put of
the rows, with less to send and fewer RocksDB writes.

Each run of a key's rows (see `merge_engine.write.runs`) folds into one '+U' state, and every retraction
is sent as its own '-U' state, in order, so the tablet applies exactly the sequence the rows
describe (+x then -x for a key changes nothing), with the same result and the same overflow
verdicts however the rows were split into tasks. Sum and product states carry their contribution
counts (`_contributions`), so a retraction later in the stream still knows when a cell is empty.
A string_agg column that keeps tokens apart sends them as token lists.
"""

from __future__ import annotations

from functools import partial

import numpy as np
import pyarrow as pa

from aggfuncs import Segments
from aggfuncs.arg_select import check_orderings, with_ordering
from merge_engine.table.descriptor import TableDescriptor
from merge_engine.table.hidden_columns import CHANGE_TYPE, CONTRIBUTIONS
from merge_engine.table.modes import MergeMode
from merge_engine.write.folds import column_states, fold_states, row_contributions
from merge_engine.write.input import checked_states, prepare_write
from merge_engine.write.keys import encode_keys, group_keys
from merge_engine.write.runs import exact_runs
from merge_engine.write.state import contribution_lists


def preaggregate(rows, descriptor: TableDescriptor, target_columns=None,
                 mode: MergeMode = MergeMode.AGGREGATE, order: np.ndarray | None = None,
                 checked: bool = False) -> pa.Table:
    """Partial states of `rows`, in key order (a key's states in row order): send the result
    with MergeMode.MERGE_STATE and the same target columns.

    `mode` says what the rows are: raw values (AGGREGATE) or partial states (MERGE_STATE).
    `order` is an optional permutation of the rows, e.g. sorted by a sequence column.
    `checked`: `rows` are partial states this process folded from a write it validated
    already (an Arrow table of the result's columns), taken without checking them again.
    """
    schema = descriptor.schema
    aggregators = schema.aggregators(descriptor.is_aggregation)
    write = checked_states(rows, schema, target_columns) if checked else \
        prepare_write(rows, schema, aggregators, target_columns, allow_retractions=True)
    targets = [i for i, t in enumerate(write.target) if t]
    names = [schema.names[i] for i in targets]
    if write.rows == 0:
        return pa.schema([pa.field(schema.names[i], aggregators[i].state_type)
                          for i in targets]).empty_table()
    permutation = np.arange(write.rows) if order is None else np.asarray(order, dtype=np.int64)
    taken = pa.array(permutation, type=pa.int64())
    _, key_groups, _ = group_keys([c.take(taken) for c in write.key_columns(schema)])
    signs = np.ones(write.rows, dtype=np.int8) if write.signs is None else write.signs[permutation]
    ordered = {name: write.columns[name].take(taken) for name in names}
    value_targets = [(i, aggregators[i]) for i in targets
                     if schema.names[i] not in schema.primary_key]
    check_orderings([agg for _, agg in value_targets], ordered)
    attach = partial(with_ordering, columns=ordered, aggregators=aggregators)
    states = {i: s for i, _, s in column_states(value_targets, ordered, mode, attach)}
    values_of = [(aggregators[i], states[i]) for i, _ in value_targets]
    if descriptor.orders_by_sequence:
        # Each row carries its own sequence, which a folded run could not: one run per row.
        by_key = np.argsort(key_groups, kind="stable")
        run_ids = np.empty(write.rows, dtype=np.int64)
        run_ids[by_key] = np.arange(write.rows)
        runs = Segments(run_ids, write.rows, by_key)
    else:
        runs = exact_runs(key_groups, signs, values_of)
    firsts = runs.order[runs.starts]  # every run holds at least one row
    counted = [i for i, agg in enumerate(aggregators)
               if descriptor.is_aggregation and agg.counts_contributions]
    counts = np.zeros((runs.count, len(schema.names)), dtype=np.int64)
    columns = []
    for i in targets:
        if schema.names[i] in schema.primary_key:
            columns.append(ordered[schema.names[i]].take(pa.array(firsts, type=pa.int64())))
            continue
        columns.append(fold_states(aggregators[i], states[i], np.ones(write.rows, dtype=bool),
                                   runs))
        if i in counted:
            given = None if write.contributions is None else \
                [write.contributions[r] for r in permutation]
            each = row_contributions(given, counted.index(i), states[i])
            counts[:, i] = np.bincount(runs.group_ids, weights=each,
                                       minlength=runs.count).astype(np.int64)
    table = pa.Table.from_arrays(columns, names=names)
    change = np.where(signs[firsts] < 0, "-U", "+U")
    table = table.append_column(CHANGE_TYPE, pa.array(change, type=pa.string()))
    if any(write.target[i] for i in counted):
        table = table.append_column(CONTRIBUTIONS, contribution_lists(counts, counted))
    return table


def latest_rows(rows, descriptor: TableDescriptor, target_columns,
                order: np.ndarray) -> pa.Table:
    """OVERWRITE folding: each key's last row in `order`, its values cast to the columns'
    input types, so a value that does not fit its column fails here, on the client, naming
    the column (as folding does for the other modes)."""
    schema = descriptor.schema
    aggregators = schema.aggregators(descriptor.is_aggregation)
    write = prepare_write(rows, schema, aggregators, target_columns, allow_unwritten=True)
    columns = {}
    for agg in aggregators:
        if agg.column in write.columns:
            values = write.columns[agg.column]
            columns[agg.column] = values if agg.column in schema.primary_key \
                else agg.cast_input(values)
    return last_per_key(pa.table(columns), schema.primary_key, order)


def last_per_key(rows: pa.Table, key_columns, order: np.ndarray) -> pa.Table:
    """The last row of each key in `order`, in the order those last rows appear."""
    ordered = rows.take(pa.array(order, type=pa.int64()))
    keys = pa.array(encode_keys([ordered.column(k).combine_chunks() for k in key_columns]),
                    type=pa.binary())
    codes = keys.dictionary_encode().indices.to_numpy(zero_copy_only=False)
    last = np.full(int(codes.max()) + 1 if len(codes) else 0, -1, dtype=np.int64)
    last[codes] = np.arange(len(codes))
    return ordered.take(pa.array(np.sort(last), type=pa.int64()))

