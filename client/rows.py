"""Turning what a caller writes into the Arrow table a tablet server receives.

The engine's own `prepare_write` validates the rows (unknown columns, target columns without
the key, values that do not fit a column, null keys) on the client, before anything is sent, so
a bad call raises at once and no bucket sees any of it. Python rows become Arrow exactly as the
engine converts them in-process, so a write means the same through the client as in a tablet.
"""

from __future__ import annotations

import pyarrow as pa

UNWRITTEN = "_unwritten"


def write_table(meta, rows, target_columns, mode, keys_only: bool = False) -> pa.Table:
    """The validated Arrow rows of one upsert (or, with `keys_only`, the keys of a delete)."""
    from merge_engine import MergeMode
    from merge_engine.input import prepare_write

    descriptor = meta.descriptor
    schema = descriptor.schema
    aggregators = _aggregators(meta)
    write = prepare_write(rows, schema, aggregators, target_columns,
                          allow_unwritten=MergeMode.parse(mode) == MergeMode.OVERWRITE,
                          keys_only=keys_only)
    columns = {name: write.columns[name] for name in schema.names if name in write.columns}
    if write.unwritten is not None:
        columns[UNWRITTEN] = pa.array([list(u) for u in write.unwritten],
                                      pa.list_(pa.string()))
    return pa.table(columns) if columns else pa.table({})


def _aggregators(meta):
    cached = getattr(meta, "_aggregators", None)
    if cached is None:
        descriptor = meta.descriptor
        cached = descriptor.schema.aggregators(descriptor.is_aggregation)
        meta._aggregators = cached
    return cached
