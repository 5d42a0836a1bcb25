"""A large write is merged a slice of whole keys at a time (merge_engine.write.slices): the
result must not depend on the slicing. Two real tablets take the same writes, one merging
them whole and one a few rows at a time; they must accept and refuse the same writes, and end
with the same rows and the same changelog, record for record."""

from __future__ import annotations

import pyarrow as pa
from hypothesis import given, settings, strategies as st

from merge_engine import MergeMode, Schema, TableDescriptor
from merge_engine.kv.tablet import KvTablet
from tally.errors import InvalidInputError, TallyError


def descriptor(**params) -> TableDescriptor:
    schema = (Schema.builder().column("k", pa.int64())
              .agg_column("s", pa.int64(), "sum")
              .agg_column("t", pa.string(), "string_agg", delimiter="::")
              .agg_column("a", pa.list_(pa.int64()), "array_agg", **params)
              .agg_column("l", pa.string(), "last_value_ignore_nulls")
              .primary_key("k").build())
    return TableDescriptor(schema, properties={"table.merge-engine": "aggregation"})


rows = st.fixed_dictionaries({
    "k": st.integers(0, 12),
    "s": st.one_of(st.none(), st.integers(-5, 5)),
    "t": st.one_of(st.none(), st.sampled_from(["x", "y", "x::z", ""])),
    "a": st.one_of(st.none(), st.lists(st.integers(0, 3), max_size=3)),
    "l": st.one_of(st.none(), st.sampled_from(["p", "q"])),
    "_change_type": st.sampled_from(["+I", "+I", "+I", "-U"]),
})
writes = st.lists(st.tuples(st.sampled_from([MergeMode.AGGREGATE, MergeMode.OVERWRITE]),
                            st.lists(rows, min_size=1, max_size=40)), min_size=1, max_size=6)


def apply(tablet: KvTablet, mode: MergeMode, batch: list[dict]):
    if mode is MergeMode.OVERWRITE:
        batch = [{k: v for k, v in r.items() if k != "_change_type"} for r in batch]
    try:
        return tablet.put(batch, mode=mode)
    except InvalidInputError:
        # A write with two faults (say a bad retraction on one key, an over-long cell on
        # another) reports the first one merged, and slicing changes which that is; both are
        # refusals of the whole write, and the equal state afterwards shows nothing applied.
        return "refused: bad input"
    except TallyError as e:
        return type(e).__name__


@settings(max_examples=120, deadline=None)
@given(writes=writes, slice_rows=st.integers(1, 7), max_elements=st.sampled_from([0, 6]))
def test_slicing_a_write_changes_nothing(tmp_path_factory, writes, slice_rows, max_elements):
    base = tmp_path_factory.mktemp("slices")
    d = descriptor(**({"max-elements": max_elements} if max_elements else {}))
    with KvTablet.open(str(base / "whole"), d) as whole, \
            KvTablet.open(str(base / "sliced"), d) as sliced:
        sliced.slice_rows = slice_rows
        for mode, batch in writes:
            assert apply(whole, mode, batch) == apply(sliced, mode, batch)
        assert whole.to_arrow().equals(sliced.to_arrow())
        assert whole.log_end_offset == sliced.log_end_offset
        assert whole.changelog().equals(sliced.changelog())
