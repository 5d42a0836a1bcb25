"""Turning what a caller writes into the Arrow table a tablet server receives.

The engine's own `prepare_write` validates the rows (unknown columns, target columns without
the key, values that do not fit a column, null keys) on the client, before anything is sent, so
a bad call raises at once and no bucket sees any of it. Python rows become Arrow exactly as the
engine converts them in-process, so a write means the same through the client as in a tablet.
"""

from __future__ import annotations

import pyarrow as pa


def write_table(meta, rows, target_columns, mode, keys_only: bool = False,
                retract: bool = False) -> pa.Table:
    """The validated Arrow rows of one upsert (or, with `keys_only`, the keys of a delete).

    With `retract`, every row takes back its contribution (sent with a `_change_type` of -U).
    """
    from merge_engine import MergeMode
    from merge_engine.table.hidden_columns import CHANGE_TYPE, CONTRIBUTIONS, UNWRITTEN, WRITTEN_MS
    from merge_engine.write.input import prepare_write

    descriptor = meta.descriptor
    schema = descriptor.schema
    aggregators = meta.aggregators
    overwrite = MergeMode.parse(mode) == MergeMode.OVERWRITE
    write = prepare_write(rows, schema, aggregators, target_columns, allow_unwritten=overwrite,
                          keys_only=keys_only, allow_retractions=not overwrite)
    columns = {name: write.columns[name] for name in schema.names if name in write.columns}
    if write.unwritten is not None:
        columns[UNWRITTEN] = pa.array([list(u) for u in write.unwritten],
                                      pa.list_(pa.string()))
    if write.contributions is not None:
        columns[CONTRIBUTIONS] = pa.array(write.contributions, pa.list_(pa.int64()))
    if write.written_ms is not None:  # undo restoring images of a table with a row TTL
        columns[WRITTEN_MS] = pa.array(write.written_ms, pa.int64())
    if retract or write.signs is not None:
        signs = write.signs if write.signs is not None else [1] * write.rows
        columns[CHANGE_TYPE] = pa.array(["-U" if retract or s < 0 else "+U" for s in signs],
                                        pa.string())
    return pa.table(columns) if columns else pa.table({})

