"""Small helpers for tests that build one-column aggregation tablets."""

import pyarrow as pa

from aggfuncs import AggFunction as F
from merge_engine import Schema, TableDescriptor
from merge_engine.kv.tablet import KvTablet
from merge_engine.testing import ColumnSpec, TableSpec
from merge_engine.testing.spec import MERGE_ENGINE


def ingest_spec() -> TableSpec:
    """The ingest benchmark's table: a key, a sum, a max, a string_agg and a last non-null."""
    return TableSpec((ColumnSpec("id", pa.int64(), nullable=False),
                      ColumnSpec("qty", pa.int64(), F.SUM),
                      ColumnSpec("price", pa.float64(), F.MAX),
                      ColumnSpec("tag", pa.string(), F.STRING_AGG, {"delimiter": ","}),
                      ColumnSpec("status", pa.string(), F.LAST_VALUE_IGNORE_NULLS)),
                     ("id",), {MERGE_ENGINE: "aggregation"})


def one_column_tablet(path, fn, arrow_type, properties=None, **params):
    schema = (
        Schema.builder().column("k", pa.int64()).agg_column("v", arrow_type, fn, **params).primary_key("k").build()
    )
    props = {"table.merge-engine": "aggregation", **(properties or {})}
    return KvTablet.open(str(path), TableDescriptor(schema, properties=props))


def fold(path, fn, arrow_type, values, per_put=False, **params):
    """Write `values` for key 1 (in one put, or one put each) and return the stored value."""
    with one_column_tablet(path, fn, arrow_type, **params) as tablet:
        if per_put:
            for v in values:
                tablet.put([{"k": 1, "v": v}])
        else:
            tablet.put([{"k": 1, "v": v} for v in values])
        row = tablet.lookup({"k": 1})
        return row["v"] if row else "absent"
