"""Retraction: taking back a contribution exactly, per function, through KvTablet."""

from decimal import Decimal

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, assume, given, settings, strategies as st

from merge_engine import MergeMode, Schema, TableDescriptor
from merge_engine.kv.tablet import KvTablet
from merge_engine.write.preaggregate import preaggregate
from recovery import undo_bucket
from tally.errors import RetractionError
from tests.tablet_helpers import one_column_tablet

SETTINGS = settings(max_examples=60, deadline=None,
                    suppress_health_check=[HealthCheck.function_scoped_fixture])

# Invertible functions (applying x then retracting x gives the prior state) and their inputs.
INVERTIBLE = {
    "sum-int": ("sum", pa.int64(), {}, st.integers(-10**6, 10**6) | st.none()),
    "sum-decimal": ("sum", pa.decimal128(12, 2), {},
                    st.decimals(-1000, 1000, places=2, allow_nan=False, allow_infinity=False) | st.none()),
    "count": ("count", pa.int64(), {}, st.text(max_size=2) | st.none()),
    "product-int": ("product", pa.int64(), {}, st.integers(-9, 9).filter(bool) | st.none()),
    "array_agg": ("array_agg", pa.list_(pa.int64()), {}, st.integers(0, 3) | st.lists(st.integers(0, 3), min_size=1, max_size=3) | st.none()),
    "string_agg": ("string_agg", pa.string(), {"delimiter": ";"}, st.sampled_from(["a", "b", "a;b", ""]) | st.none()),
    "avg-decimal": ("avg", pa.decimal128(12, 2), {},
                    st.decimals(-1000, 1000, places=2, allow_nan=False, allow_infinity=False) | st.none()),
    "sum_map": ("sum_map", pa.map_(pa.string(), pa.int64()), {},
                st.lists(st.tuples(st.sampled_from("ab"), st.integers(-5, 5)), max_size=3) | st.none()),
}


def put(tablet, value, change="+I"):
    tablet.put([{"k": 1, "v": value, "_change_type": change}])


def value(tablet, fn):
    """The key's value; an absent key reads as the empty state (rows are kept when empty)."""
    row = tablet.lookup({"k": 1})
    return row["v"] if row else (0 if fn == "count" else None)


@pytest.mark.parametrize("case", sorted(INVERTIBLE))
def test_apply_then_retract_returns_the_prior_state(tmp_path_factory, case):
    fn, arrow_type, params, values = INVERTIBLE[case]

    @SETTINGS
    @given(prior=st.lists(values, max_size=4), x=values)
    def check(prior, x):
        with one_column_tablet(tmp_path_factory.mktemp(case), fn, arrow_type, **params) as t:
            for v in prior:
                put(t, v)
            before = value(t, fn)
            put(t, x)
            put(t, x, "-D")
            assert value(t, fn) == before
            # And in one write: +x then -x for a key changes nothing at all.
            end = t.log_end_offset
            t.put([{"k": 1, "v": x, "_change_type": "+U"}, {"k": 1, "v": x, "_change_type": "-U"}])
            assert value(t, fn) == before
            assert t.log_end_offset == end or before in (None, 0)

    check()


def test_per_function_rules(tmp_path):
    cases = [
        ("sum", pa.int64(), [(5, "+I"), (3, "+I"), (5, "-D")], 3),
        ("sum", pa.int64(), [(5, "+I"), (5, "-D")], None),  # no contributions left: empty
        ("sum", pa.int64(), [(0, "+I")], 0),
        ("count", pa.int64(), [("a", "+I"), ("b", "+I"), ("a", "-U")], 1),
        ("product", pa.int64(), [(6, "+I"), (4, "+I"), (3, "-D")], 8),
        ("array_agg", pa.list_(pa.int64()), [(1, "+I"), (2, "+I"), (1, "+I"), (1, "-U")], [1, 2]),
        ("string_agg", pa.string(), [("a", "+I"), ("b", "+I"), ("a", "-U")], "b"),
        ("last_value", pa.string(), [("a", "+I"), ("b", "+I"), ("a", "-U")], "b"),
        ("last_value", pa.string(), [("a", "+I"), ("b", "+I"), ("b", "-U")], None),
        ("last_value_ignore_nulls", pa.string(), [("a", "+I"), ("a", "-D")], None),
    ]
    for n, (fn, arrow_type, ops, expected) in enumerate(cases):
        for per_put in (False, True):
            with one_column_tablet(tmp_path / f"{n}-{per_put}", fn, arrow_type) as t:
                rows = [{"k": 1, "v": v, "_change_type": c} for v, c in ops]
                for batch in ([[r] for r in rows] if per_put else [rows]):
                    t.put(batch)
                assert t.lookup({"k": 1})["v"] == expected, (fn, ops, per_put)


@pytest.mark.parametrize("fn, arrow_type, ops, message", [
    ("max", pa.int64(), [(5, "+I"), (5, "-D")], "ignore-retract"),
    ("first_value", pa.string(), [("a", "+I"), ("a", "-U")], "cannot take back"),
    ("product", pa.int64(), [(6, "+I"), (0, "-D")], "cannot retract 0"),
    ("product", pa.int64(), [(6, "+I"), (4, "-D")], "not divisible"),
    ("product", pa.decimal128(10, 2), [(Decimal("1.00"), "+I"), (Decimal("3.00"), "-D")], "not exact"),
    ("array_agg", pa.list_(pa.int64()), [(1, "+I"), (2, "-D")], "no such contribution"),
    ("sum", pa.int64(), [(1, "-D")], "more contributions than the key holds"),
    ("avg", pa.decimal128(10, 2), [(Decimal(1), "-D")], "more contributions than the key holds"),
])
def test_impossible_retractions_are_rejected_and_leave_no_trace(tmp_path, fn, arrow_type, ops, message):
    with one_column_tablet(tmp_path, fn, arrow_type) as t:
        first, rest = ops[0], ops[1:]
        if first[1] == "+I":
            t.put([{"k": 1, "v": first[0]}])
        else:
            rest = ops
        before, end = t.to_arrow(), t.log_end_offset
        with pytest.raises(RetractionError, match=message):
            t.put([{"k": 2, "v": first[0]}] + [{"k": 1, "v": v, "_change_type": c} for v, c in rest])
        assert t.to_arrow().equals(before) and t.log_end_offset == end


def test_ignore_retract_skips_retractions_for_that_column(tmp_path):
    s = (Schema.builder().column("k", pa.int64()).agg_column("hi", pa.int64(), "max", ignore_retract=True)
         .agg_column("total", pa.int64(), "sum").primary_key("k").build())
    d = TableDescriptor(s, properties={"table.merge-engine": "aggregation"})
    with KvTablet.open(str(tmp_path), d) as t:
        t.put([{"k": 1, "hi": 9, "total": 9}, {"k": 1, "hi": 4, "total": 4}])
        t.put([{"k": 1, "hi": 9, "total": 9, "_change_type": "-D"}])
        assert t.lookup({"k": 1}) == {"k": 1, "hi": 9, "total": 4}


def test_retraction_is_not_a_delete_and_remove_on_empty_removes(tmp_path):
    s = (Schema.builder().column("k", pa.int64()).agg_column("total", pa.int64(), "sum")
         .agg_column("n", pa.int64(), "count").agg_column("ids", pa.list_(pa.int64()), "array_agg")
         .primary_key("k").build())
    for remove, expected in (("false", {"k": 1, "total": None, "n": 0, "ids": None}), ("true", None)):
        d = TableDescriptor(s, properties={"table.merge-engine": "aggregation",
                                           "table.agg.remove-record-on-empty": remove})
        with KvTablet.open(str(tmp_path / remove), d) as t:
            t.put([{"k": 1, "total": 5, "n": 1, "ids": 7}])
            t.put([{"k": 1, "total": 5, "n": 1, "ids": 7, "_change_type": "-D"}])
            assert t.lookup({"k": 1}) == expected
            if remove == "true":
                assert t.changelog().column("_change_type").to_pylist() == ["+I", "-D"]


OPS = st.lists(st.tuples(st.integers(0, 3), st.integers(-3, 3), st.sampled_from(["+I", "+I", "-D"])),
               max_size=10)


def schema_all():
    return (Schema.builder().column("k", pa.int64()).agg_column("s", pa.int64(), "sum")
            .agg_column("n", pa.int64(), "count").agg_column("ids", pa.list_(pa.int64()), "array_agg")
            .agg_column("tags", pa.string(), "string_agg").agg_column("lv", pa.int64(), "last_value")
            .agg_column("mean", pa.decimal128(12, 2), "avg")
            .agg_column("per", pa.map_(pa.string(), pa.int64()), "sum_map")
            .primary_key("k").build())


def valid_sequence(ops):
    """Keep only retractions that match an earlier contribution (as a CDC stream would)."""
    held, out = {}, []
    for k, v, c in ops:
        if c == "-D":
            if not held.get(k):
                continue
            v = held[k].pop()
        else:
            held.setdefault(k, []).append(v)
        out.append({"k": k, "s": v, "n": v, "ids": v, "tags": str(v), "lv": v, "mean": v,
                    "per": [("a", v), (str(v), 1)], "_change_type": c})
    return out


@SETTINGS
@given(batches=st.lists(OPS, min_size=1, max_size=3))
def test_preaggregated_retractions_equal_the_raw_rows(tmp_path_factory, batches):
    d = TableDescriptor(schema_all(), properties={"table.merge-engine": "aggregation"})
    rows = valid_sequence([op for b in batches for op in b])
    assume(rows)
    with KvTablet.open(str(tmp_path_factory.mktemp("raw")), d) as raw, \
            KvTablet.open(str(tmp_path_factory.mktemp("folded")), d) as folded:
        for start in range(0, len(rows), 4):
            chunk = rows[start:start + 4]
            raw.put(chunk)
            folded.put(preaggregate(chunk, d), mode=MergeMode.MERGE_STATE)
        assert raw.to_arrow().equals(folded.to_arrow())


@SETTINGS
@given(before=OPS, after=OPS)
def test_undo_restores_states_with_retractions_in_the_range(tmp_path_factory, before, after):
    d = TableDescriptor(schema_all(), properties={"table.merge-engine": "aggregation"})
    rows = valid_sequence(before + after)
    cut = len(valid_sequence(before))
    with KvTablet.open(str(tmp_path_factory.mktemp("undo")), d) as t:
        if rows[:cut]:
            t.put(rows[:cut])
        baseline, state = t.log_end_offset, t.to_arrow()
        for r in rows[cut:]:
            t.put([r])
        undo_bucket(t, baseline)
        assert t.to_arrow().equals(state)
        # The restored counts are exact: the rest of the stream applies as if never undone.
        for r in rows[cut:]:
            t.put([r])
