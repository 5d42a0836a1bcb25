"""Client-side folding: a MERGE_STATE put of preaggregate(rows) equals an AGGREGATE put of rows."""

import decimal

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from aggfuncs import AggFunction
from merge_engine import MergeMode, Schema, TableDescriptor
from merge_engine.kv.tablet import KvTablet
from merge_engine.write.preaggregate import latest_rows, preaggregate
from tally.errors import InvalidInputError

SCHEMA = (
    Schema.builder()
    .column("k", pa.int32())
    .agg_column("s", pa.int64(), AggFunction.SUM)
    .agg_column("n", pa.int64(), AggFunction.COUNT)
    .agg_column("mx", pa.float64(), AggFunction.MAX)
    .agg_column("fv", pa.string(), AggFunction.FIRST_VALUE)
    .agg_column("lv", pa.string(), AggFunction.LAST_VALUE)
    .agg_column("tags", pa.string(), AggFunction.STRING_AGG, distinct=True)
    .agg_column("ids", pa.list_(pa.int64()), AggFunction.ARRAY_AGG)
    .agg_column("b", pa.bool_(), AggFunction.BOOL_AND)
    .primary_key("k")
    .build()
)
DESC = TableDescriptor(SCHEMA, properties={"table.merge-engine": "aggregation"})

maybe = lambda s: st.none() | s
row = st.fixed_dictionaries({
    "k": st.integers(0, 4),
    "s": maybe(st.integers(-10, 10)),
    "n": maybe(st.text(max_size=2)),
    "mx": maybe(st.floats(allow_nan=True, width=64)),
    "fv": maybe(st.sampled_from(["a", "b", ""])),
    "lv": maybe(st.sampled_from(["x", "y"])),
    "tags": maybe(st.sampled_from(["a", "a,b", "c", ""])),
    "ids": maybe(st.integers(0, 3)),
    "b": maybe(st.booleans()),
})


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(batches=st.lists(st.lists(row, max_size=8), min_size=1, max_size=4),
       partial=st.booleans())
def test_merge_state_of_preaggregated_rows_equals_aggregate(tmp_path_factory, batches, partial):
    targets = ["k", "s", "fv", "tags"] if partial else None
    with KvTablet.open(str(tmp_path_factory.mktemp("a")), DESC) as plain, \
            KvTablet.open(str(tmp_path_factory.mktemp("b")), DESC) as folded:
        for batch in batches:
            rows = [{c: r[c] for c in targets} for r in batch] if targets else batch
            plain.put(rows, target_columns=targets)
            folded.put(preaggregate(rows, DESC, targets), mode=MergeMode.MERGE_STATE, target_columns=targets)
        assert _rows(plain) == _rows(folded)


@settings(max_examples=80, deadline=None)
@given(batches=st.lists(st.lists(row, max_size=8), min_size=1, max_size=4),
       partial=st.booleans(), retract=st.lists(st.booleans(), max_size=4))
def test_states_combined_unchecked_equal_states_combined_checked(batches, partial, retract):
    """A Spark task combines its first stage's parts without checking them again: the result is
    the same as with every check (the states were validated when they were made)."""
    targets = ["k", "s", "n", "fv", "tags"] if partial else None
    parts = []
    for batch, retracting in zip(batches, retract + [False] * len(batches)):
        rows = [{c: r[c] for c in targets} for r in batch] if targets else batch
        if retracting:
            rows = [{**r, "_change_type": "-U"} for r in rows]
        parts.append(preaggregate(rows, DESC, targets))
    states = pa.concat_tables(parts, promote_options="default")
    checked = preaggregate(states, DESC, targets, MergeMode.MERGE_STATE)
    unchecked = preaggregate(states, DESC, targets, MergeMode.MERGE_STATE, checked=True)
    assert repr(unchecked.to_pylist()) == repr(checked.to_pylist())  # NaN == NaN by repr
    assert unchecked.schema == checked.schema


def _rows(t):
    # NaN != NaN: compare floats by repr.
    return [{k: repr(v) if isinstance(v, float) else v for k, v in r.items()} for r in t.to_arrow().to_pylist()]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(batches=st.lists(st.lists(row, max_size=8), min_size=1, max_size=4),
       reverse=st.booleans())
def test_overwrite_of_latest_rows_equals_overwrite_of_all_rows(tmp_path_factory, batches,
                                                               reverse):
    """OVERWRITE folding keeps each key's last row in the given order; writing those rows
    equals writing every row in that order."""
    targets = ["k", "s", "fv", "lv", "mx"]
    with KvTablet.open(str(tmp_path_factory.mktemp("a")), DESC) as plain, \
            KvTablet.open(str(tmp_path_factory.mktemp("b")), DESC) as folded:
        for batch in batches:
            rows = [{c: r[c] for c in targets} for r in batch]
            order = list(range(len(rows)))[::-1] if reverse else list(range(len(rows)))
            plain.put([rows[i] for i in order], mode=MergeMode.OVERWRITE, target_columns=targets)
            arrow = pa.Table.from_pylist(rows, schema=pa.schema(
                [SCHEMA.to_arrow().field(c) for c in targets]))
            latest = latest_rows(arrow, DESC, targets, np.array(order, dtype=np.int64))
            assert latest.num_rows == len({r["k"] for r in rows})
            folded.put(latest, mode=MergeMode.OVERWRITE, target_columns=targets)
        assert _rows(plain) == _rows(folded)


def test_latest_rows_cast_to_the_columns_or_name_the_one_that_does_not_fit():
    schema = (Schema.builder().column("k", pa.int64()).column("d", pa.decimal128(5, 2))
              .primary_key("k").build())
    descriptor = TableDescriptor(schema)
    rows = pa.table({"k": pa.array([1, 1, 2], pa.int32()),
                     "d": pa.array([decimal.Decimal("1.50"), decimal.Decimal("2.25"),
                                    decimal.Decimal("3.00")], pa.decimal128(10, 2))})
    latest = latest_rows(rows, descriptor, ["k", "d"], np.arange(3))
    assert latest.schema.types == schema.to_arrow().types
    assert latest.to_pylist() == [{"k": 1, "d": decimal.Decimal("2.25")},
                                  {"k": 2, "d": decimal.Decimal("3.00")}]
    too_wide = rows.set_column(1, "d", pa.array([decimal.Decimal("12345678.90")] * 3,
                                                 pa.decimal128(10, 2)))
    with pytest.raises(InvalidInputError, match="Column 'd'"):
        latest_rows(too_wide, descriptor, ["k", "d"], np.arange(3))
