"""Hand-picked write sequences through the TabletHarness: the tricky cases of the contract and
the cases the model had to decide (docs/core-contract.md, "Model decisions").

Random search finds these only by luck; here each one runs every time, engine against model.
"""

from __future__ import annotations

import math
import tempfile
from decimal import Decimal

import pyarrow as pa
import pytest

from aggfuncs import AggFunction as F
from merge_engine.testing import ColumnSpec, Delete, Put, Reopen, TableSpec, TabletHarness

ALLOW = {"table.merge-engine": "aggregation", "table.delete.behavior": "allow"}


def spec(*columns, properties=ALLOW, key=pa.int64()):
    return TableSpec((ColumnSpec("k", key, nullable=False), *columns), ("k",), properties)


def put(*rows, mode="AGGREGATE", targets=None, writer=None, arrow=False):
    return Put(tuple(rows), mode, None if targets is None else tuple(targets), writer, arrow)


def delete(*keys, mode="AGGREGATE", targets=None, writer=None):
    return Delete(tuple({"k": k} for k in keys), mode, None if targets is None else tuple(targets), writer)


V = ColumnSpec
CASES = {
    "int8 sum overflows on any running total, also inside one put": (
        spec(V("v", pa.int8(), F.SUM)),
        [put({"k": 1, "v": 127}, {"k": 1, "v": 1}, {"k": 1, "v": -1}), put({"k": 1, "v": 1}),
         put({"k": 1, "v": -1}, {"k": 2, "v": -128})],
    ),
    "int64 product overflow rejects the whole put": (
        spec(V("v", pa.int64(), F.PRODUCT)),
        [put({"k": 1, "v": 2**62}), put({"k": 2, "v": 3}, {"k": 1, "v": 2}), put({"k": 1, "v": -2})],
    ),
    "float sum is a left fold from the stored value": (
        spec(V("v", pa.float64(), F.SUM)),
        # Left to right: (1e16 + 1) + 1 == 1e16, then + 4; summing the inputs first gives 1e16 + 6.
        [put({"k": 1, "v": 1e16}), put({"k": 1, "v": 1.0}, {"k": 1, "v": 1.0}, {"k": 1, "v": 4.0}),
         put({"k": 2, "v": -0.0}), put({"k": 2, "v": None}), put({"k": 3, "v": math.inf}, {"k": 3, "v": -math.inf})],
    ),
    "float32 sum rounds every step": (
        spec(V("v", pa.float32(), F.SUM)),
        [put({"k": 1, "v": 16777216.0}, {"k": 1, "v": 1.0}, {"k": 1, "v": 1.0}), put({"k": 1, "v": 3.0e38}, {"k": 1, "v": 3.0e38})],
    ),
    "decimal product rounds half up per step": (
        spec(V("v", pa.decimal128(10, 2), F.PRODUCT)),
        [put(*({"k": 1, "v": Decimal("1.05")} for _ in range(3))),
         put({"k": 2, "v": Decimal("-0.50")}, {"k": 2, "v": Decimal("0.01")}),
         put({"k": 3, "v": Decimal("99999999.99")}, {"k": 3, "v": Decimal("10.00")})],
    ),
    "max/min: NaN on top, -0.0 below 0.0": (
        spec(V("hi", pa.float64(), F.MAX), V("lo", pa.float64(), F.MIN)),
        [put({"k": 1, "hi": -0.0, "lo": 0.0}), put({"k": 1, "hi": 0.0, "lo": -0.0}),
         put({"k": 1, "hi": math.nan, "lo": math.nan}), put({"k": 1, "hi": math.inf, "lo": -math.inf})],
    ),
    "string max by code point, binary by bytes": (
        spec(V("s", pa.string(), F.MAX), V("b", pa.binary(), F.MIN)),
        [put({"k": 1, "s": "\uffff", "b": b"\xff"}), put({"k": 1, "s": "\U0001F600", "b": b"\x00\xff"}),
         put({"k": 1, "s": "", "b": b""})],
    ),
    "first_value keeps a null written first": (
        spec(V("f", pa.int64(), F.FIRST_VALUE), V("g", pa.int64(), F.FIRST_VALUE_IGNORE_NULLS),
             V("l", pa.int64(), F.LAST_VALUE)),
        [put({"k": 1, "f": None, "g": None, "l": 1}), put({"k": 1, "f": 5, "g": 5, "l": None}),
         put({"k": 2, "g": 1}, targets=["k", "g"]), put({"k": 2, "f": None, "l": 2}, {"k": 2, "f": 3, "l": 3}, targets=["k", "f", "l"])],
    ),
    "first_value takes the first write after a partial delete reset it": (
        spec(V("f", pa.int64(), F.FIRST_VALUE), V("c", pa.int64(), F.COUNT)),
        [put({"k": 1, "f": 1, "c": 1}), delete(1, targets=["k", "f"]), put({"k": 1, "f": 2, "c": 1})],
    ),
    "string_agg keeps empty strings": (
        spec(V("s", pa.string(), F.STRING_AGG)),
        [put({"k": 1, "s": ""}), put({"k": 1, "s": ""}), put({"k": 1, "s": None}, {"k": 1, "s": "a"})],
    ),
    "string_agg distinct also within one input and on the first write": (
        spec(V("s", pa.string(), F.STRING_AGG, {"distinct": "true", "delimiter": ";"})),
        [put({"k": 1, "s": "a;a;b"}), put({"k": 1, "s": "b;c"}, {"k": 1, "s": "c;;a"}), put({"k": 1, "s": ""})],
    ),
    "distinct string_agg/array_agg after an OVERWRITE stored duplicates": (
        spec(V("s", pa.string(), F.STRING_AGG, {"distinct": True}),
             V("a", pa.list_(pa.int64()), F.ARRAY_AGG, {"distinct": True})),
        [put({"k": 1, "s": "a,a", "a": [None, None, 1, 1]}, mode="OVERWRITE"), put({"k": 1, "s": None, "a": None}),
         put({"k": 1, "s": "b", "a": [2]})],
    ),
    "array_agg appends elements, concatenates lists, keeps null elements": (
        spec(V("a", pa.list_(pa.int64()), F.ARRAY_AGG)),
        [put({"k": 1, "a": 1}, {"k": 1, "a": 2}), put({"k": 1, "a": [None, 3]}), put({"k": 2, "a": [4]}),
         put({"k": 3, "a": None})],
    ),
    "array_agg: an empty list is a value and null inputs keep it": (
        spec(V("a", pa.list_(pa.int64()), F.ARRAY_AGG)),
        [put({"k": 1, "a": []}), put({"k": 1, "a": None}), put({"k": 2, "a": []}, mode="OVERWRITE"),
         put({"k": 2, "a": None}), put({"k": 2, "a": [1]})],
    ),
    "decimal product: only the folded result is checked against the precision": (
        spec(V("v", pa.decimal128(10, 2), F.PRODUCT)),
        [put(*({"k": 1, "v": Decimal("99999999.99")} for _ in range(4))),
         put(*({"k": 2, "v": Decimal("99999999.99")} for _ in range(4)), {"k": 2, "v": Decimal("0.00")})],
    ),
    "array_agg distinct keeps first occurrences, also on the first write": (
        spec(V("a", pa.list_(pa.string()), F.ARRAY_AGG, {"distinct": "true"})),
        [put({"k": 1, "a": ["x", "x", None, None]}), put({"k": 1, "a": ["y", "x"]}, mode="MERGE_STATE"),
         put({"k": 1, "a": "z"}, {"k": 1, "a": "y"})],
    ),
    "count in every mode": (
        spec(V("c", pa.int64(), F.COUNT), V("s", pa.int64(), F.SUM)),
        [put({"k": 1, "c": 7, "s": 1}, {"k": 1, "c": None, "s": 1}), put({"k": 1, "c": 5}, mode="MERGE_STATE", targets=["k", "c"]),
         put({"k": 1, "c": None, "s": None}, mode="OVERWRITE"), put({"k": 2, "c": 2**63 - 1}, {"k": 2, "c": 1}, mode="MERGE_STATE")],
    ),
    "a put that leaves values and written bits alone writes nothing": (
        spec(V("s", pa.int64(), F.SUM), V("p", pa.int64(), F.PRODUCT), V("m", pa.float64(), F.MAX)),
        [put({"k": 1, "s": 5, "p": 5, "m": 5.0}), put({"k": 1, "s": 0, "p": 1, "m": 1.0}),
         put({"k": 1, "s": None, "p": None, "m": -0.0})],
    ),
    "a written bit alone changes the row": (
        spec(V("a", pa.int64(), F.SUM), V("b", pa.string(), F.MAX)),
        [put({"k": 1, "a": 1}, targets=["k", "a"]), put({"k": 1, "b": None}, targets=["k", "b"]),
         put({"k": 1, "b": None}, targets=["k", "b"])],
    ),
    "overwrite takes the last row and restores unwritten columns": (
        spec(V("a", pa.int64(), F.SUM), V("f", pa.int64(), F.FIRST_VALUE)),
        [put({"k": 1, "a": 1, "f": 1}), put({"k": 1, "a": 5, "f": 6}, {"k": 1, "a": 2, "f": None, "_unwritten": ["f"]}, mode="OVERWRITE"),
         put({"k": 1, "a": 1, "f": 9}), Reopen(), put({"k": 1, "f": 10}, targets=["k", "f"])],
    ),
    "partial delete removes only rows left empty": (
        spec(V("a", pa.int64(), F.SUM), V("c", pa.int64(), F.COUNT), V("s", pa.string(), F.LAST_VALUE)),
        [put({"k": 1, "a": 1, "c": 1, "s": None}, {"k": 2, "a": 2, "c": None, "s": None}, {"k": 3, "a": 3, "c": None, "s": "x"}),
         delete(3, 2, 1, 4, targets=["k", "a"]), delete(3, targets=["k", "a"]), delete(1, 1)],
    ),
    "delete behaviors: ignore, and OVERWRITE deletes always apply": (
        spec(V("a", pa.int64(), F.SUM), properties={"table.merge-engine": "aggregation"}),
        [put({"k": 1, "a": 1}), delete(1), delete(1, mode="MERGE_STATE"), delete(1, mode="OVERWRITE"), delete(1, mode="OVERWRITE")],
    ),
    "delete behavior disable rejects the delete": (
        spec(V("a", pa.int64(), F.SUM), properties={"table.merge-engine": "aggregation", "table.delete.behavior": "disable"}),
        [put({"k": 1, "a": 1}), delete(1), delete(2), delete(1, targets=["k", "a"], mode="OVERWRITE")],
    ),
    "default engine: every put overwrites": (
        spec(V("a", pa.int64()), V("s", pa.string()), properties={}),
        [put({"k": 1, "a": 1, "s": "x"}, {"k": 1, "a": None, "s": "y"}), put({"k": 1, "a": 3}, mode="MERGE_STATE", targets=["k", "a"]),
         delete(1, targets=["k", "s"]), delete(1, targets=["k", "a"])],
    ),
    "idempotent writer: retries apply nothing and return the recorded offset": (
        spec(V("a", pa.int64(), F.SUM)),
        [put({"k": 1, "a": 1}, writer=("w", 1)), put({"k": 2, "a": 1}), put({"k": 1, "a": 1}, writer=("w", 1)),
         Reopen(), put({"k": 1, "a": 1}, writer=("w", 0)), delete(1, writer=("w", 1)), put({"k": 1, "a": 1}, writer=("w", 2)),
         put({"k": 1, "a": 3}, writer=("v", 5)), Reopen(), put({"k": 1, "a": 7}, writer=("v", 5))],
    ),
    "a rejected write does not record the writer's sequence": (
        spec(V("a", pa.int8(), F.SUM)),
        [put({"k": 1, "a": 100}), put({"k": 1, "a": 100}, writer=("w", 1)), put({"k": 1, "a": 1}, writer=("w", 1))],
    ),
    "empty puts and deletes apply nothing but record the writer": (
        spec(V("a", pa.int64(), F.SUM)),
        [put(), put(writer=("w", 1)), Delete((), "AGGREGATE"), put(arrow=True), Reopen(),
         put({"k": 1, "a": 1}, writer=("w", 1)), put({"k": 1, "a": 1}, writer=("w", 2))],
    ),
    "Arrow input: element-typed array_agg column, _unwritten column": (
        spec(V("a", pa.list_(pa.int64()), F.ARRAY_AGG), V("f", pa.string(), F.FIRST_VALUE)),
        [put({"k": 1, "a": 1, "f": None}, {"k": 1, "a": None, "f": "x"}, arrow=True),
         put({"k": 1, "a": [2, None]}, mode="MERGE_STATE", targets=["k", "a"], arrow=True),
         put({"k": 1, "a": None, "f": None, "_unwritten": ["f"]}, mode="OVERWRITE", arrow=True),
         put({"k": 1, "f": "y"}, targets=["k", "f"], arrow=True)],
    ),
    "changelog entries of one write are in primary-key order": (
        spec(V("a", pa.int64(), F.SUM)),
        [put({"k": 3, "a": 1}, {"k": 1, "a": 1}, {"k": 3, "a": 1}, {"k": 2, "a": 1}),
         put({"k": 2, "a": 1}, {"k": 1, "a": 1}, {"k": 3, "a": 2}), delete(2, 1)],
    ),
    "string keys are ordered by code point": (
        spec(V("a", pa.int64(), F.SUM), key=pa.string()),
        [put({"k": k, "a": 1}) for k in ["b", "\U0001F600", "", "\uffff", "a\x00", "ab", "a"]],
    ),
    "int keys order numerically across the sign": (
        spec(V("a", pa.int64(), F.SUM)),
        [put({"k": k, "a": 1}) for k in [0, -1, 2**63 - 1, -(2**63), 255, -256, 1]],
    ),
}


@pytest.mark.parametrize("name", list(CASES))
def test_engine_matches_model(name):
    table, ops = CASES[name]
    with tempfile.TemporaryDirectory() as directory, TabletHarness(table, directory) as harness:
        harness.run(ops)
