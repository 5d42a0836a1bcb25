"""Puts of one row per key: the merger's fast path against the plain-Python reference model.

When every key of a write has exactly one input row, a column whose aggregator says its fold of
one state onto an unfilled cell is that state (`Aggregator.folds_one_as_state`: sum, max, min,
last non-null, string_agg without distinct or tokens) takes the states as they are instead of
folding. These properties drive a real KvTablet and the model (TabletHarness: rows, lookups,
offsets, the changelog record by record, its replay) with such writes, over tables that mix
those functions with every other, nulls, partial writes and keys that exist already, so the
fast path and the fold meet on the same keys.
"""

from __future__ import annotations

import dataclasses

import numpy as np
from hypothesis import event, given, settings
from hypothesis import strategies as st

from aggfuncs import AggFunction as F
from merge_engine.mergers.aggregate import AggregateRowMerger
from merge_engine.testing import TableSpec
from merge_engine.testing.harness import TabletHarness
from merge_engine.testing.ops import Put
from merge_engine.testing.profiles import examples, load_profile
from merge_engine.testing.strategies import puts, table_specs
from tests.tablet_helpers import ingest_spec

load_profile()

FAST = (F.SUM, F.MAX, F.MIN, F.LAST_VALUE_IGNORE_NULLS, F.STRING_AGG)
# The fast functions drawn often, the others now and then beside them.
MIXED = FAST * 3 + (F.COUNT, F.PRODUCT, F.LAST_VALUE, F.FIRST_VALUE,
                    F.FIRST_VALUE_IGNORE_NULLS, F.ARRAY_AGG, F.BOOL_OR)


def one_row_per_key(put: Put, spec: TableSpec) -> Put:
    """`put` with only the first row of each key."""
    seen, kept = set(), []
    for row in put.rows:
        key = tuple(repr(row[k]) for k in spec.primary_key)
        if key not in seen:
            seen.add(key)
            kept.append(row)
    return dataclasses.replace(put, rows=tuple(kept))


@st.composite
def one_row_writes(draw, spec: TableSpec) -> list[Put]:
    writes = draw(st.lists(puts(spec, ["AGGREGATE", "MERGE_STATE"]), min_size=1, max_size=8))
    return [one_row_per_key(w, spec) for w in writes]


@settings(max_examples=examples(80))
@given(data=st.data(), spec=table_specs(aggregation=True, functions=MIXED))
def test_one_row_per_key_puts_match_the_model(tmp_path_factory, data, spec):
    writes = data.draw(one_row_writes(spec), label="writes")
    with TabletHarness(spec, tmp_path_factory.mktemp("t")) as harness:
        for write in writes:
            accepted = harness.apply(write)
            event(f"{write.mode}: {'accepted' if accepted else 'rejected'}")


@settings(max_examples=examples(40))
@given(data=st.data(), spec=table_specs(aggregation=True, functions=FAST, min_value_columns=2))
def test_new_keys_then_existing_keys_match_the_model(tmp_path_factory, data, spec):
    """New keys (every cell unfilled: the fast path for each fast column), then the same keys
    again (filled cells: the fold), then a partial write that leaves columns unfilled on
    existing keys before they are filled by one row each."""
    writes = data.draw(one_row_writes(spec), label="writes")
    with TabletHarness(spec, tmp_path_factory.mktemp("t")) as harness:
        for write in writes + writes:
            harness.apply(write)


def test_the_ingest_shape_takes_the_fast_path_and_matches_the_model(tmp_path):
    """The ingest benchmark's columns, one row per new key with nulls in every column."""
    spec = ingest_spec()
    rng = np.random.default_rng(7)
    ids = rng.permutation(200).tolist()
    rows = [{"id": i, "qty": None if i % 7 == 0 else int(rng.integers(-5, 5)),
             "price": None if i % 5 == 0 else float(rng.random()),
             "tag": None if i % 3 == 0 else f"t{i}", "status": None if i % 2 else "paid"}
            for i in ids]
    with TabletHarness(spec, tmp_path) as harness:
        harness.apply(Put(tuple(rows[:100]), arrow=True))
        harness.apply(Put(tuple(rows[100:])))
        harness.apply(Put(tuple(rows[:50])))  # existing keys, one row each: the fold


def test_one_row_each_is_told_apart_from_repeated_keys():
    assert AggregateRowMerger._one_row_each(np.array([0, 1, 2]), 3, 3) is True
    placed = AggregateRowMerger._one_row_each(np.array([2, 0, 1]), 3, 3)
    assert placed.to_pylist() == [1, 2, 0]  # key g's row
    assert AggregateRowMerger._one_row_each(np.array([0, 1, 1]), 2, 3) is None
