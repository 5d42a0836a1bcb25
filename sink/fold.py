"""Folding an epoch's rows per key: a bucket's rows, an input partition's rows where Spark
read them (a folded part), and several parts into one row per key.

`fold_rows` folds with the table's own aggregators (merge_engine.write.preaggregate) in a
deterministic order: by the sequence column when there is one, then by input position, so a
replay folds identically. Folding where the rows are read sends one row per key and run instead
of every row: the data source's tasks return their parts to its commit process (sink.funnel),
the task delivery's first stage sends them through its shuffle (sink.job). `combine` folds the
parts' states again, in input-partition order, into what one fold of all the rows gives: sums
stay exact (a state carries its contribution count; a run's overflow verdict is the same
however the rows were split), retractions stay in order. With a sequence column a part ships
its rows as they are (states of order-sensitive functions cannot be merged across parts by
sequence) and `combine` folds them all at once, by sequence then position.
"""

from __future__ import annotations

import dataclasses
import io

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from merge_engine import MergeMode
from merge_engine.write.preaggregate import last_per_key, latest_rows, preaggregate
from sink.plan import HIDDEN_SEQUENCE_COLUMN, ORDER_COLUMN, WritePlan


def order_of(data: pa.Table, plan: WritePlan) -> np.ndarray:
    """The fold order: by the sequence column (ascending, nulls first) when there is one, then
    by input position (input partition, row within it), so a replay folds identically."""
    names = [ORDER_COLUMN]
    if plan.sequence_column is not None:
        names.insert(0, sequence_name(plan))
    try:  # pyarrow >= 25 takes the null placement per key
        keys = [(name, "ascending", "at_start") for name in names]
        return pc.sort_indices(data, sort_keys=keys).to_numpy()
    except (TypeError, ValueError, pa.ArrowInvalid):
        keys = [(name, "ascending") for name in names]
        return pc.sort_indices(data, sort_keys=keys, null_placement="at_start").to_numpy()


def sequence_name(plan: WritePlan) -> str:
    if plan.sequence_column in plan.input_columns:
        return plan.table_columns[plan.input_columns.index(plan.sequence_column)]
    return HIDDEN_SEQUENCE_COLUMN


def fold_rows(data: pa.Table, plan: WritePlan) -> tuple[pa.Table, MergeMode]:
    """One row per key, and the mode to send it in."""
    order = order_of(data, plan)
    rows = data.select(list(plan.target_columns))
    if plan.mode is MergeMode.OVERWRITE:
        return latest_rows(rows, plan.descriptor, list(plan.target_columns), order), \
            MergeMode.OVERWRITE
    folded = preaggregate(rows, plan.descriptor, list(plan.target_columns), plan.mode, order)
    return folded, MergeMode.MERGE_STATE


@dataclasses.dataclass
class FoldedPart:
    """The rows of one input partition, or of a chunk of one, folded (picklable: travels
    inside a data source's WriterCommitMessage, or as Arrow IPC through a shuffle)."""

    partition: int          # orders the parts: an input partition id, or a chunk's position
    rows: int
    payload: bytes          # Arrow IPC stream: folded states, or ordered raw rows (sequence)
    folded: bool
    query_id: str | None = None
    # The table partition of every row of the part, when the part holds one partition's rows
    # (TallySink's first stage names each row once and sends each partition's part apart).
    table_partition: str | None = None


def to_ipc(table: pa.Table) -> bytes:
    sink = io.BytesIO()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return sink.getvalue()


def from_ipc(payload) -> pa.Table:
    """A part's rows from its payload (bytes, or an Arrow buffer of a shuffled row)."""
    return pa.ipc.open_stream(payload).read_all()


def fold_part(data: pa.Table, plan: WritePlan, partition: int, query_id: str | None) -> FoldedPart:
    """A part's rows folded per key (in input order), or, with a sequence column, its rows as
    they are: states of order-sensitive functions cannot be merged across parts by sequence."""
    if plan.sequence_column is not None:
        keep = list(plan.target_columns) + [sequence_name(plan), ORDER_COLUMN]
        return FoldedPart(partition, data.num_rows, to_ipc(data.select(list(dict.fromkeys(keep)))),
                          False, query_id)
    folded, _ = fold_rows(data, plan)
    return FoldedPart(partition, data.num_rows, to_ipc(folded), True, query_id)


def combine_by_partition(parts: list[FoldedPart],
                         plan: WritePlan) -> tuple[dict[str | None, pa.Table], MergeMode]:
    """`combine` of each table partition's parts: {partition name: its rows, one per key}. A
    key lives in one partition, so this is one combine of every part, split by partition,
    without naming the folded rows' partitions again."""
    groups: dict[str | None, list[FoldedPart]] = {}
    for part in parts:
        groups.setdefault(part.table_partition, []).append(part)
    folded, mode = {}, MergeMode.MERGE_STATE
    for name in sorted(groups, key=lambda n: (n is not None, n or "")):
        rows, combined = combine(groups[name], plan)
        if rows is not None:
            mode = combined
            if rows.num_rows:
                folded[name] = rows
    return folded, mode


def combine(parts: list[FoldedPart], plan: WritePlan) -> tuple[pa.Table | None, MergeMode]:
    """All parts folded into one row per key, in part order (deterministic)."""
    parts = sorted((p for p in parts if p is not None and p.rows), key=lambda p: p.partition)
    if not parts:
        return None, MergeMode.MERGE_STATE
    tables = [from_ipc(p.payload) for p in parts]
    if not parts[0].folded:
        data = pa.concat_tables(tables, promote_options="default")
        return fold_rows(data, plan)
    states = pa.concat_tables(tables, promote_options="default")
    if plan.mode is MergeMode.OVERWRITE:
        order = np.arange(states.num_rows)
        return last_per_key(states, plan.key_columns, order), MergeMode.OVERWRITE
    # the parts are this job's own first-stage states, validated there: not checked again
    return preaggregate(states, plan.descriptor, list(plan.target_columns),
                        MergeMode.MERGE_STATE, checked=True), MergeMode.MERGE_STATE
