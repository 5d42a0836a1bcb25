"""The reference model against hand-computed cases from docs/core-contract.md.

The model is the oracle of the property tests, so it gets its own checks: every case here is
worked out by hand from the contract (and the Fluss reference where the contract follows it).
"""

from __future__ import annotations

import math
from decimal import Decimal

import pyarrow as pa
import pytest

from aggfuncs import AggFunction as F
from merge_engine.testing import ColumnSpec, ReferenceTable, TableSpec, same_value
from tally.errors import AggregateOverflowError, DeleteDisabledError, InvalidInputError

AGG = {"table.merge-engine": "aggregation"}


def table(*columns: ColumnSpec, properties=None, key_type=pa.int64()) -> ReferenceTable:
    spec = TableSpec((ColumnSpec("k", key_type, nullable=False), *columns), ("k",), AGG if properties is None else properties)
    return ReferenceTable(spec)


def one(function, arrow_type, *writes, mode="AGGREGATE", **params):
    """The value of column v for key 1 after putting each value of `writes` as its own put."""
    m = table(ColumnSpec("v", arrow_type, function, params))
    for value in writes:
        m.put([{"k": 1, "v": value}], mode=mode)
    return m.lookup({"k": 1})["v"]


def folded(function, arrow_type, values, mode="AGGREGATE", **params):
    """The value after one put holding every value of `values` for key 1."""
    m = table(ColumnSpec("v", arrow_type, function, params))
    m.put([{"k": 1, "v": v} for v in values], mode=mode)
    return m.lookup({"k": 1})["v"]


# --- numbers ---------------------------------------------------------------------------------


def test_integer_overflow_is_judged_on_every_running_total():
    # Row by row, 127 + 1 leaves int8; so it does in one put (the verdict cannot depend on
    # how rows fall into puts).
    assert folded(F.SUM, pa.int8(), [127, -1, 1]) == 127
    with pytest.raises(AggregateOverflowError):
        folded(F.SUM, pa.int8(), [127, 1, -1])
    with pytest.raises(AggregateOverflowError):
        folded(F.PRODUCT, pa.int32(), [65536, 65536, 0])
    with pytest.raises(AggregateOverflowError):
        folded(F.SUM, pa.int64(), [2**63 - 1, 1, -2])
    with pytest.raises(AggregateOverflowError):
        folded(F.COUNT, pa.int64(), [2**63 - 1, 1, None], mode="MERGE_STATE")


def test_overflow_rejects_the_whole_write_and_leaves_no_trace():
    m = table(ColumnSpec("v", pa.int8(), F.SUM))
    m.put([{"k": 1, "v": 100}])
    with pytest.raises(AggregateOverflowError):
        m.put([{"k": 2, "v": 5}, {"k": 1, "v": 100}])
    assert m.rows() == [{"k": 1, "v": 100}] and m.log_end_offset == 1


def test_floats_fold_left_to_right_from_the_stored_value():
    # (1e16 + 1) + 1 == 1e16 in doubles, while 1e16 + (1 + 1) would be 1e16 + 2.
    m = table(ColumnSpec("v", pa.float64(), F.SUM))
    m.put([{"k": 1, "v": 1e16}])
    m.put([{"k": 1, "v": 1.0}, {"k": 1, "v": 1.0}])
    assert m.lookup({"k": 1})["v"] == 1e16
    assert folded(F.PRODUCT, pa.float64(), [0.9, 0.8]) == 0.7200000000000001
    assert folded(F.SUM, pa.float64(), [0.1, 0.2]) == 0.30000000000000004


def test_float32_rounds_every_step():
    assert folded(F.SUM, pa.float32(), [16777216.0, 1.0, 1.0]) == 16777216.0
    assert folded(F.PRODUCT, pa.float32(), [3.4e38, 10.0]) == math.inf


def test_first_write_keeps_negative_zero_and_nan_is_a_value():
    assert same_value(folded(F.SUM, pa.float64(), [-0.0]), -0.0)
    assert same_value(folded(F.SUM, pa.float64(), [-0.0, 0.0]), 0.0)
    assert math.isnan(folded(F.SUM, pa.float64(), [math.inf, -math.inf]))


def test_decimal_product_rounds_half_up_after_every_multiplication():
    d = pa.decimal128(10, 2)
    assert folded(F.PRODUCT, d, [Decimal("2.50"), Decimal("4.00")]) == Decimal("10.00")
    assert folded(F.PRODUCT, d, [Decimal("0.05"), Decimal("0.05")]) == Decimal("0.00")
    assert folded(F.PRODUCT, d, [Decimal("1.25"), Decimal("1.01")]) == Decimal("1.26")
    assert folded(F.PRODUCT, d, [Decimal("0.50"), Decimal("0.01")]) == Decimal("0.01")
    assert folded(F.PRODUCT, d, [Decimal("1.05"), Decimal("1.05")]) == Decimal("1.10")
    assert folded(F.PRODUCT, d, [Decimal("-0.50"), Decimal("0.01")]) == Decimal("-0.01")
    # Rounded per step: 1.05 * 1.05 = 1.10 (not 1.1025), then * 1.05 = 1.155 -> 1.16.
    assert folded(F.PRODUCT, d, [Decimal("1.05")] * 3) == Decimal("1.16")
    with pytest.raises(AggregateOverflowError):
        folded(F.PRODUCT, d, [Decimal("99999999.99"), Decimal("10.00")])


def test_decimal_sum_checks_the_precision():
    d = pa.decimal128(5, 2)
    assert folded(F.SUM, d, [Decimal("999.99"), Decimal("-0.01"), Decimal("0.01")]) == Decimal("999.99")
    with pytest.raises(AggregateOverflowError):
        folded(F.SUM, d, [Decimal("999.99"), Decimal("0.01"), Decimal("-0.01")])
    with pytest.raises(InvalidInputError):
        folded(F.SUM, d, [Decimal("1.001")])  # more digits than the scale: not storable


def test_max_min_total_order():
    f = pa.float64()
    assert math.isnan(folded(F.MAX, f, [1.0, math.nan, math.inf]))
    assert folded(F.MIN, f, [math.nan, 1.0, math.inf]) == 1.0
    assert same_value(folded(F.MAX, f, [-0.0, 0.0]), 0.0)
    assert same_value(folded(F.MAX, f, [0.0, -0.0]), 0.0)
    assert same_value(folded(F.MIN, f, [0.0, -0.0]), -0.0)
    # Code point order: U+FFFF < U+1F600 (UTF-16 code units would order them the other way).
    assert folded(F.MAX, pa.string(), ["\uffff", "\U0001F600", "z"]) == "\U0001F600"
    assert folded(F.MIN, pa.string(), ["a", "", "b"]) == ""
    assert folded(F.MAX, pa.binary(), [b"\x7f", b"\xff", b"\xff\x00"]) == b"\xff\x00"
    assert folded(F.MAX, pa.int64(), [None, -5, None]) == -5


# --- count, value selection, bools -----------------------------------------------------------


def test_count_in_every_mode():
    assert folded(F.COUNT, pa.int64(), [7, None, 0]) == 2
    assert folded(F.COUNT, pa.int64(), [None]) == 0
    assert one(F.COUNT, pa.int64(), 3, None, 4, mode="MERGE_STATE") == 7
    assert one(F.COUNT, pa.int64(), 3, None, mode="OVERWRITE") == 0
    with pytest.raises(AggregateOverflowError):
        folded(F.COUNT, pa.int64(), [2**63 - 1, 1], mode="MERGE_STATE")


def test_count_of_a_new_key_from_a_partial_write_is_zero():
    m = table(ColumnSpec("v", pa.int64(), F.SUM), ColumnSpec("c", pa.int64(), F.COUNT))
    m.put([{"k": 1, "v": 5}], target_columns=["k", "v"])
    assert m.lookup({"k": 1}) == {"k": 1, "v": 5, "c": 0}
    assert m.changelog[0].unwritten == {"c"}


def test_first_value_keeps_a_null_written_first():
    i = pa.int64()
    assert one(F.FIRST_VALUE, i, None, 5) is None
    assert one(F.FIRST_VALUE_IGNORE_NULLS, i, None, 5, 6) == 5
    assert folded(F.FIRST_VALUE, i, [None, 5]) is None
    assert one(F.LAST_VALUE, i, 5, None) is None
    assert one(F.LAST_VALUE_IGNORE_NULLS, i, 5, None) == 5
    assert folded(F.LAST_VALUE, i, [5, None, 6]) == 6


def test_first_value_of_an_unwritten_column_takes_the_first_write():
    m = table(ColumnSpec("a", pa.int64(), F.SUM), ColumnSpec("f", pa.int64(), F.FIRST_VALUE))
    m.put([{"k": 1, "a": 1}], target_columns=["k", "a"])
    m.put([{"k": 1, "f": 9}, {"k": 1, "f": 10}], target_columns=["k", "f"])
    assert m.lookup({"k": 1}) == {"k": 1, "a": 1, "f": 9}


def test_bool_functions_follow_the_null_rule():
    b = pa.bool_()
    assert folded(F.BOOL_AND, b, [None, True]) is True
    assert folded(F.BOOL_AND, b, [True, False, True]) is False
    assert folded(F.BOOL_OR, b, [None, False]) is False
    assert folded(F.BOOL_OR, b, [None, None]) is None


# --- string_agg and array_agg ----------------------------------------------------------------


def test_string_agg_keeps_empty_strings():
    s = pa.string()
    assert one(F.STRING_AGG, s, "", "a") == ",a"
    assert one(F.STRING_AGG, s, "a", "") == "a,"
    assert one(F.STRING_AGG, s, "", "") == ","
    assert folded(F.STRING_AGG, s, ["x", None, "y"], delimiter=";") == "x;y"
    assert folded(F.LISTAGG, s, [None, None]) is None


def test_string_agg_distinct_splits_stored_value_and_inputs():
    s = pa.string()
    assert folded(F.STRING_AGG, s, ["a,a,b"], distinct=True) == "a,b"
    assert one(F.STRING_AGG, s, "a,b", "b,c,a", "", distinct="true") == "a,b,c,"
    assert one(F.STRING_AGG, s, "a", "a", distinct="false") == "a,a"
    assert one(F.STRING_AGG, s, "x||y", "y||z", delimiter="||", distinct=True) == "x||y||z"


def test_array_agg_appends_elements_and_concatenates_lists():
    li = pa.list_(pa.int64())
    assert folded(F.ARRAY_AGG, li, [1, [2, None], None, []]) == [1, 2, None]
    assert folded(F.ARRAY_AGG, li, [[]]) is None  # no elements: the empty state
    assert folded(F.ARRAY_AGG, li, [[1, 1, None], 2, [None, 1, 3]], distinct=True) == [1, None, 2, 3]
    assert one(F.ARRAY_AGG, li, 5, [5], mode="MERGE_STATE") == [5, 5]


# --- row state, changelog, deletes -----------------------------------------------------------


def test_one_changelog_entry_per_key_per_put_in_primary_key_order():
    m = table(ColumnSpec("v", pa.int64(), F.SUM))
    assert m.put([{"k": 2, "v": 1}, {"k": 1, "v": 1}, {"k": 2, "v": 1}]) == 2
    assert [(r.offset, r.change_type, r.image["k"], r.image["v"]) for r in m.changelog] == [
        (0, "+I", 1, 1), (1, "+I", 2, 2)]
    assert m.put([{"k": 1, "v": None}, {"k": 2, "v": 3}]) == 4  # key 1 unchanged: no entry
    assert [(r.change_type, r.image) for r in m.changelog[2:]] == [
        ("-U", {"k": 2, "v": 2}), ("+U", {"k": 2, "v": 5})]


def test_a_written_bit_alone_is_a_change():
    m = table(ColumnSpec("a", pa.int64(), F.SUM), ColumnSpec("b", pa.int64(), F.MAX))
    m.put([{"k": 1, "a": 1}], target_columns=["k", "a"])
    assert m.put([{"k": 1, "b": None}], target_columns=["k", "b"]) == 3
    assert m.changelog[1].unwritten == {"b"} and m.changelog[2].unwritten == frozenset()
    assert m.put([{"k": 1, "b": None}], target_columns=["k", "b"]) == 3


def test_no_op_writes_consume_no_offset():
    m = table(ColumnSpec("v", pa.float64(), F.MAX))
    m.put([{"k": 1, "v": math.nan}])
    assert m.put([{"k": 1, "v": 1.0}]) == 1  # NaN is the max: nothing changes
    m2 = table(ColumnSpec("v", pa.float64(), F.MAX))
    m2.put([{"k": 1, "v": 0.0}])
    assert m2.put([{"k": 1, "v": -0.0}]) == 1
    m3 = table(ColumnSpec("v", pa.float64(), F.MIN))
    m3.put([{"k": 1, "v": 0.0}])
    assert m3.put([{"k": 1, "v": -0.0}]) == 3  # -0.0 < 0.0 and bitwise different


def test_overwrite_takes_the_last_row_and_honours_unwritten():
    m = table(ColumnSpec("v", pa.int64(), F.SUM), ColumnSpec("c", pa.int64(), F.COUNT))
    m.put([{"k": 1, "v": 5, "c": 1}])
    m.put([{"k": 1, "v": 1, "c": 7}, {"k": 1, "v": 2, "c": None, "_unwritten": ["c"]}], mode="OVERWRITE")
    assert m.lookup({"k": 1}) == {"k": 1, "v": 2, "c": 0}
    assert m.state({"k": 1}).unwritten == {"c"}


def test_default_engine_treats_puts_as_overwrite_and_allows_deletes():
    m = table(ColumnSpec("v", pa.int64()), properties={})
    m.put([{"k": 1, "v": 5}, {"k": 1, "v": None}])
    assert m.lookup({"k": 1}) == {"k": 1, "v": None}
    m.delete([{"k": 1}])
    assert m.rows() == []


def test_delete_behaviors():
    for behavior, expected_rows in (("ignore", 1), ("allow", 0)):
        m = table(ColumnSpec("v", pa.int64(), F.SUM), properties={**AGG, "table.delete.behavior": behavior})
        m.put([{"k": 1, "v": 1}])
        assert m.delete([{"k": 1}]) == (1 if behavior == "ignore" else 2)
        assert len(m) == expected_rows
    m = table(ColumnSpec("v", pa.int64(), F.SUM))  # aggregation default: ignore
    m.put([{"k": 1, "v": 1}])
    assert m.delete([{"k": 1}]) == 1 and len(m) == 1
    m = table(ColumnSpec("v", pa.int64(), F.SUM), properties={**AGG, "table.delete.behavior": "disable"})
    m.put([{"k": 1, "v": 1}])
    with pytest.raises(DeleteDisabledError):
        m.delete([{"k": 1}])
    assert m.delete([{"k": 1}], mode="OVERWRITE") == 2 and len(m) == 0


def test_partial_delete_resets_targets_and_removes_only_untouched_rows():
    props = {**AGG, "table.delete.behavior": "allow"}
    m = table(ColumnSpec("a", pa.int64(), F.SUM), ColumnSpec("c", pa.int64(), F.COUNT), properties=props)
    m.put([{"k": 1, "a": 4, "c": 1}, {"k": 2, "a": 5, "c": None}])
    m.put([{"k": 3, "a": 6}], target_columns=["k", "a"])
    m.delete([{"k": 3}, {"k": 2}, {"k": 1}], target_columns=["k", "a"])  # entries in key order
    # key 1 keeps c = 1; key 2's c is 0 but was written, so the row stays too (-U/+U); key 3's
    # c was never written: the row left is a key no write touched, and it goes (-D, old image).
    assert [(r.change_type, r.image) for r in m.changelog[3:]] == [
        ("-U", {"k": 1, "a": 4, "c": 1}), ("+U", {"k": 1, "a": None, "c": 1}),
        ("-U", {"k": 2, "a": 5, "c": 0}), ("+U", {"k": 2, "a": None, "c": 0}),
        ("-D", {"k": 3, "a": 6, "c": 0})]
    assert m.changelog[4].unwritten == {"a"} and m.changelog[7].unwritten == {"c"}


def test_partial_delete_keeps_a_row_another_writer_wrote_null():
    props = {**AGG, "table.delete.behavior": "allow"}
    for function in (F.FIRST_VALUE, F.FIRST_VALUE_IGNORE_NULLS, F.LAST_VALUE):
        m = table(ColumnSpec("a", pa.int64(), F.SUM), ColumnSpec("f", pa.int64(), function),
                  properties=props)
        m.put([{"k": 1, "a": 4}], target_columns=["k", "a"])
        m.put([{"k": 1, "f": None}], target_columns=["k", "f"])
        m.delete([{"k": 1}], target_columns=["k", "a"], mode="OVERWRITE")
        assert m.state({"k": 1}).unwritten == {"a"}, function
        m.put([{"k": 1, "f": 7}], target_columns=["k", "f"])
        assert m.lookup({"k": 1})["f"] == (None if function is F.FIRST_VALUE else 7), function


def test_string_agg_keeps_tokens_apart_when_the_delimiter_overlaps_itself():
    s = pa.string()
    # "a:" and "" join to "a:::", which also cuts into "a" and ":"; the cell keeps its tokens.
    assert one(F.STRING_AGG, s, "a:", "", "", delimiter="::", distinct=True) == "a:::"
    assert folded(F.STRING_AGG, s, ["a:", "", ""], delimiter="::", distinct=True) == "a:::"
    assert folded(F.STRING_AGG, s, ["a:::"], delimiter="::", distinct=True) == "a:::"
    m = table(ColumnSpec("v", s, F.STRING_AGG, {"delimiter": "::", "distinct": True}))
    m.put([{"k": 1, "v": "a:"}])
    m.put([{"k": 1, "v": "a:::"}])  # tokens "a" and ":" are new
    assert m.lookup({"k": 1})["v"] == "a:::a:::" and m.changelog[-1].tokens == (("a:", "a", ":"),)
    m.put([{"k": 1, "v": ["b", ""]}], mode="MERGE_STATE")  # a token list is a state
    assert m.state({"k": 1}).tokens == (("a:", "a", ":", "b", ""),)
    with pytest.raises(InvalidInputError):
        m.put([{"k": 1, "v": ["x::y"]}], mode="MERGE_STATE")  # no cut gives this token


def test_bad_writes_raise_and_leave_no_trace():
    m = table(ColumnSpec("v", pa.int64(), F.SUM))
    with pytest.raises(InvalidInputError):
        m.put([{"k": None, "v": 1}])
    with pytest.raises(InvalidInputError):
        m.put([{"k": 1, "v": 1, "zzz": 2}])
    with pytest.raises(InvalidInputError):
        m.put([{"k": 1, "v": 1}], target_columns=["v"])
    with pytest.raises(InvalidInputError):
        m.put([{"k": 1, "v": "x"}])
    assert len(m) == 0 and m.log_end_offset == 0


def test_writer_retries_apply_nothing_and_return_the_recorded_offset():
    m = table(ColumnSpec("v", pa.int64(), F.SUM))
    assert m.put([{"k": 1, "v": 1}], writer=("w", 1)) == 1
    assert m.put([{"k": 2, "v": 1}]) == 2
    assert m.put([{"k": 1, "v": 1}], writer=("w", 1)) == 1
    assert m.put([{"k": 1, "v": 1}], writer=("w", 0)) == 1
    assert m.lookup({"k": 1})["v"] == 1
    assert m.put([{"k": 1, "v": 1}], writer=("w", 2)) == 4


def test_rows_are_ordered_by_key_and_replay_rebuilds_the_state():
    m = table(ColumnSpec("v", pa.string(), F.STRING_AGG), ColumnSpec("f", pa.int64(), F.FIRST_VALUE),
              key_type=pa.string(), properties={**AGG, "table.delete.behavior": "allow"})
    m.put([{"k": k, "v": k} for k in ["b", "\U0001F600", "", "\uffff", "a\x00", "a"]], target_columns=["k", "v"])
    m.delete([{"k": "b"}])
    m.put([{"k": "a", "v": "x", "f": None}])
    assert [r["k"] for r in m.rows()] == ["", "a", "a\x00", "\uffff", "\U0001F600"]
    replayed = ReferenceTable(m.spec).replay(m.changelog)
    assert [(s.values, s.unwritten) for s in replayed.states()] == [(s.values, s.unwritten) for s in m.states()]
    # The replay keeps written bits: first_value of "a" stays null when 7 arrives.
    replayed.put([{"k": "a", "f": 7}], target_columns=["k", "f"])
    assert replayed.lookup({"k": "a"})["f"] is None


def test_strict_replay_rejects_an_inconsistent_changelog():
    m = table(ColumnSpec("v", pa.int64(), F.SUM))
    m.put([{"k": 1, "v": 1}])
    m.put([{"k": 1, "v": 1}])
    broken = [m.changelog[0], m.changelog[2]]  # -U missing is fine, but a wrong -U is not
    ReferenceTable(m.spec).replay(broken)
    bad = [m.changelog[0], m.changelog[2], m.changelog[1]]
    with pytest.raises(AssertionError):
        ReferenceTable(m.spec).replay(bad)
