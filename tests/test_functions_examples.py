"""Each function's documented behaviour on concrete inputs, in one put and across puts."""

import math
from decimal import Decimal

import pyarrow as pa
import pytest

from tally.errors import AggregateOverflowError, InvalidInputError
from tests.tablet_helpers import fold

D = pa.decimal128(10, 2)

CASES = [
    ("sum", pa.int64(), [1, None, 2, 3], {}, 6),
    ("sum", pa.int64(), [None, None], {}, None),
    ("sum", pa.float64(), [0.1, 0.2], {}, 0.1 + 0.2),
    ("sum", pa.float64(), [1.0, math.inf], {}, math.inf),
    ("sum", D, [Decimal("999.99"), Decimal("0.01")], {}, Decimal("1000.00")),
    ("product", D, [Decimal("2.50"), Decimal("4.00")], {}, Decimal("10.00")),
    ("product", D, [Decimal("0.05"), Decimal("0.05")], {}, Decimal("0.00")),
    ("product", D, [Decimal("1.25"), Decimal("1.01")], {}, Decimal("1.26")),
    ("product", D, [Decimal("1.05"), Decimal("1.05")], {}, Decimal("1.10")),
    ("product", pa.int32(), [3, None, -4], {}, -12),
    ("count", pa.int64(), ["a", None, "b"], {}, 2),
    ("count", pa.int64(), [None], {}, 0),
    ("max", pa.float64(), [1.0, math.nan, 2.0], {}, "nan"),
    ("min", pa.float64(), [1.0, math.nan, -2.0], {}, -2.0),
    ("max", pa.string(), ["b", "a", "é", None], {}, "é"),
    ("min", pa.binary(), [b"b", b"a\x00", b"a"], {}, b"a"),
    ("last_value", pa.string(), ["a", None], {}, None),
    ("last_value_ignore_nulls", pa.string(), ["a", None], {}, "a"),
    ("first_value", pa.string(), [None, "a"], {}, None),
    ("first_value_ignore_nulls", pa.string(), [None, "a", "b"], {}, "a"),
    ("string_agg", pa.string(), ["a", None, "", "b"], {}, "a,,b"),
    ("listagg", pa.string(), ["a", "b"], {"delimiter": ";"}, "a;b"),
    ("string_agg", pa.string(), ["a,b,a", "b,c"], {"distinct": True}, "a,b,c"),
    ("array_agg", pa.list_(pa.int64()), [1, [2, None], None, 3], {}, [1, 2, None, 3]),
    ("array_agg", pa.list_(pa.string()), ["x", ["y", "x"], "z", "y"], {"distinct": "true"}, ["x", "y", "z"]),
    ("bool_and", pa.bool_(), [None, True, False], {}, False),
    ("bool_or", pa.bool_(), [None, False], {}, False),
    ("bool_or", pa.bool_(), [None, None], {}, None),
    ("avg", pa.float64(), [1, None, 2, 4], {}, 7 / 3),
    ("avg", D, [Decimal("1.00"), 2, Decimal("2.00")], {}, Decimal("1.67")),
    ("avg", pa.float64(), [None], {}, None),
    ("sum_map", pa.map_(pa.string(), pa.int64()), [{"a": 1, "b": 2}, {"a": -1, "b": 3}], {},
     [("b", 5)]),
    ("sum_map", pa.map_(pa.string(), pa.int64()), [{"a": 1}, {"a": -1}], {}, None),
    ("arg_max", pa.string(), ["x", None, "y"], {"by": "k"}, "x"),  # one key: ties, earliest
    ("arg_min", pa.string(), [None, "y", "z"], {"by": "k"}, "y"),
]


def _same(got, want):
    if want == "nan":
        return isinstance(got, float) and math.isnan(got)
    return got == want and type(got) is type(want)


@pytest.mark.parametrize("fn, arrow_type, values, params, expected", CASES)
@pytest.mark.parametrize("per_put", [False, True], ids=["one-put", "put-each"])
def test_function_examples(tmp_path, fn, arrow_type, values, params, expected, per_put):
    got = fold(tmp_path, fn, arrow_type, values, per_put=per_put, **params)
    assert _same(got, expected), (got, expected)


@pytest.mark.parametrize(
    "fn, arrow_type, values",
    [
        ("sum", pa.int8(), [127, 1]),
        ("sum", pa.int64(), [2**63 - 1, 1]),
        ("sum", pa.int64(), [-(2**63), -1]),
        ("product", pa.int32(), [65536, 65536]),
        ("sum", D, [Decimal("99999999.99"), Decimal("0.01")]),
        ("product", D, [Decimal("99999999.99"), Decimal("10.00")]),
        ("sum_map", pa.map_(pa.string(), pa.int8()), [{"a": 100}, {"a": 28}]),
    ],
)
@pytest.mark.parametrize("per_put", [False, True], ids=["one-put", "put-each"])
def test_overflow_rejects_the_write(tmp_path, fn, arrow_type, values, per_put):
    with pytest.raises(AggregateOverflowError, match="overflows"):
        fold(tmp_path, fn, arrow_type, values, per_put=per_put)


def test_overflow_leaves_no_trace(tmp_path):
    from tests.tablet_helpers import one_column_tablet

    with one_column_tablet(tmp_path, "sum", pa.int16()) as t:
        t.put([{"k": 1, "v": 30000}])
        end, before = t.log_end_offset, t.to_arrow()
        with pytest.raises(AggregateOverflowError, match="sum column 'v' overflows int16"):
            t.put([{"k": 2, "v": 5}, {"k": 1, "v": 30000}])
        assert t.log_end_offset == end and t.to_arrow().equals(before)
        assert t.lookup({"k": 2}) is None


def test_wrong_type_input_names_the_column(tmp_path):
    with pytest.raises(InvalidInputError, match="Column 'v'"):
        fold(tmp_path, "sum", pa.int64(), ["seven"])
