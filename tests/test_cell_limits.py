"""Cell bounds of string_agg and array_agg columns (aggfuncs.cell_limits), on real tablets.

A write that would make a cell pass its column's `max-cell-bytes` or `max-elements` is refused
with an InvalidInputError naming the column and the option, and nothing of it is applied (rows,
changelog and offsets as before); a write that stays within them lands as without bounds.
"""

from __future__ import annotations

import pyarrow as pa
import pytest
from hypothesis import given, settings, strategies as st

from aggfuncs.cell_limits import DEFAULT_MAX_CELL_BYTES
from merge_engine import MergeMode, Schema, TableDescriptor
from merge_engine.kv.tablet import KvTablet
from tally.errors import InvalidAggFunctionError, InvalidInputError, InvalidOptionError

DELIMITERS = [",", "::"]  # "::" overlaps itself: its states keep the tokens apart


def tablet(path, **columns) -> KvTablet:
    builder = Schema.builder().column("k", pa.int64())
    builder.agg_column("t", pa.string(), "string_agg", **columns.get("t", {}))
    builder.agg_column("a", pa.list_(pa.utf8()), "array_agg", **columns.get("a", {}))
    schema = builder.primary_key("k").build()
    return KvTablet.open(str(path), TableDescriptor(
        schema, properties={"table.merge-engine": "aggregation"}))


def snapshot(t: KvTablet):
    return t.to_arrow(), t.changelog(), t.log_end_offset


tokens = st.text(alphabet="abcé", min_size=0, max_size=6)
writes = st.lists(st.lists(st.tuples(st.integers(0, 3), tokens), min_size=1, max_size=6),
                  min_size=1, max_size=8)


@settings(max_examples=60, deadline=None)
@given(writes=writes, limit=st.integers(1, 40), delimiter=st.sampled_from(DELIMITERS),
       distinct=st.booleans(), mode=st.sampled_from([MergeMode.AGGREGATE, MergeMode.OVERWRITE]))
def test_string_agg_cells_stay_within_max_cell_bytes(tmp_path_factory, writes, limit,
                                                      delimiter, distinct, mode):
    path = tmp_path_factory.mktemp("cells")
    params = {"delimiter": delimiter, "distinct": distinct, "max-cell-bytes": limit}
    with tablet(path / "bounded", t=params) as bounded, \
            tablet(path / "free", t={**params, "max-cell-bytes": 0}) as free:
        for batch in writes:
            rows = [{"k": k, "t": v} for k, v in batch]
            before = snapshot(bounded)
            free.put(rows, mode=mode, target_columns=["k", "t"])
            cells = {r["k"]: r["t"] for r in free.to_arrow().to_pylist()}
            widest = max(len((cells.get(k) or "").encode()) for k, _ in batch)
            if widest > limit:
                with pytest.raises(InvalidInputError, match=r"Column 't' \(string_agg\).*"
                                   r"fields\.t\.max-cell-bytes"):
                    bounded.put(rows, mode=mode, target_columns=["k", "t"])
                after = snapshot(bounded)
                assert after[0].equals(before[0]) and after[1].equals(before[1])
                assert after[2] == before[2]
                return  # the two tablets now differ by the refused write
            bounded.put(rows, mode=mode, target_columns=["k", "t"])
            assert bounded.to_arrow().equals(free.to_arrow())


@settings(max_examples=60, deadline=None)
@given(writes=writes, max_elements=st.integers(1, 8), max_bytes=st.integers(1, 30))
def test_array_agg_cells_stay_within_max_elements_and_bytes(tmp_path_factory, writes,
                                                            max_elements, max_bytes):
    path = tmp_path_factory.mktemp("cells")
    params = {"max-elements": max_elements, "max_cell_bytes": max_bytes}
    with tablet(path / "bounded", a=params) as bounded, \
            tablet(path / "free", a={"max-cell-bytes": 0}) as free:
        for batch in writes:
            rows = [{"k": k, "a": [v]} for k, v in batch]
            before = snapshot(bounded)
            free.put(rows, target_columns=["k", "a"])
            cells = {r["k"]: r["a"] or [] for r in free.to_arrow().to_pylist()}
            touched = [cells[k] for k, _ in batch]
            too_many = max(map(len, touched)) > max_elements
            too_big = max(sum(len(s.encode()) for s in cell) for cell in touched) > max_bytes
            if too_many or too_big:
                option = "max-elements" if too_many else "max-cell-bytes"
                with pytest.raises(InvalidInputError, match=rf"Column 'a' \(array_agg\).*"
                                   rf"fields\.a\.{option}"):
                    bounded.put(rows, target_columns=["k", "a"])
                after = snapshot(bounded)
                assert after[0].equals(before[0]) and after[1].equals(before[1])
                assert after[2] == before[2]
                return
            bounded.put(rows, target_columns=["k", "a"])
            assert bounded.to_arrow().equals(free.to_arrow())


def test_the_default_bound_and_the_options_that_change_it(tmp_path):
    with tablet(tmp_path / "default") as t:
        assert t.aggregators[1].params["max-cell-bytes"] == DEFAULT_MAX_CELL_BYTES == 16 << 20
        big = "x" * (9 << 20)
        t.put([{"k": 1, "t": big}])
        before = snapshot(t)
        with pytest.raises(InvalidInputError, match="over the column's max-cell-bytes of "
                                                    f"{16 << 20:,}"):
            t.put([{"k": 1, "t": big}])
        assert snapshot(t)[2] == before[2]
    arrow = pa.schema([("k", pa.int64()), ("t", pa.string()), ("a", pa.list_(pa.int64()))])
    d = TableDescriptor.from_options(arrow, ["k"], options={
        "table.merge-engine": "aggregation", "fields.t.agg": "listagg",
        "fields.t.max-cell-bytes": "1kb", "fields.a.agg": "array_agg",
        "fields.a.array_agg.max-elements": "10", "fields.a.max-cell-bytes": "0"})
    assert d.schema.column("t").params == {"max-cell-bytes": 1024}
    assert d.schema.column("a").params == {"max-elements": 10, "max-cell-bytes": 0}
    assert TableDescriptor.from_json(d.to_json()).schema.column("t").params == \
        {"max-cell-bytes": 1024}
    for options, message in [({"fields.t.max-cell-bytes": "lots"}, "max-cell-bytes"),
                             ({"fields.a.max-elements": "-1"}, "max-elements"),
                             ({"fields.t.max-elements": "3"}, "not supported"),
                             ({"fields.t.max-size": "3"}, "is not understood")]:
        with pytest.raises((InvalidAggFunctionError, InvalidOptionError), match=message):
            TableDescriptor.from_options(arrow, ["k"], options={
                "table.merge-engine": "aggregation", "fields.t.agg": "listagg",
                "fields.a.agg": "array_agg", **options})
