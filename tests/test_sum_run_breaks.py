"""Where pre-aggregation cuts an exact sum's runs: the vectorized cut equals a row-by-row model.

The model is the greedy rule written plainly, one row at a time with Python numbers: a run
folds while its running sum (from its last cut) stays between 0 and itself and fits the type.
"""

import decimal

import numpy as np
import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from aggfuncs import Segments
from aggfuncs.numeric import decimal_limit, integer_bounds, sum_run_breaks


def model_breaks(values: list, group_ids: list[int], arrow_type: pa.DataType) -> list[bool]:
    """A run that folds whole is left alone; any other is cut greedily from its first row.
    Decimal, uint64 and integer runs whose magnitudes sum to 2**62 or more are always cut
    greedily (their whole-run check would need more than int64)."""
    if pa.types.is_decimal(arrow_type):
        limit = decimal_limit(arrow_type)
        fits = lambda t: abs(t) < limit  # noqa: E731
    else:
        floor, ceiling = integer_bounds(arrow_type)
        fits = lambda t: floor <= t <= ceiling  # noqa: E731
    exact = pa.types.is_decimal(arrow_type) or arrow_type == pa.uint64()
    values = [0 if v is None else v for v in values]
    rows_of: dict[int, list[int]] = {}
    for i, g in enumerate(group_ids):
        rows_of.setdefault(g, []).append(i)
    breaks = [False] * len(values)
    with decimal.localcontext() as ctx:
        ctx.prec = 100
        for rows in rows_of.values():
            sums = [sum(values[i] for i in rows[:n + 1]) for n in range(len(rows))]
            total = sums[-1]
            whole = (not exact and sum(abs(values[i]) for i in rows) < 2**62
                     and all(min(total, 0) <= s <= max(total, 0) for s in sums) and fits(total))
            if whole:
                continue
            total = low = high = 0
            for n, i in enumerate(rows):
                t = total + values[i]
                if n and (high > max(t, 0) or low < min(t, 0) or not fits(t)):
                    breaks[i] = True
                    t, low, high = values[i], 0, 0
                total, low, high = t, min(low, t), max(high, t)
    return breaks


def check(values, group_ids, arrow_type):
    array = pa.array(values, type=arrow_type)
    runs = Segments(np.asarray(group_ids, dtype=np.int64), max(group_ids, default=-1) + 1)
    got = sum_run_breaks(array, runs, arrow_type).tolist()
    assert got == model_breaks(values, group_ids, arrow_type)


INT_TYPES = {pa.int8(): 2**7, pa.int16(): 2**15, pa.int32(): 2**31, pa.int64(): 2**63}


@settings(max_examples=150, deadline=None)
@given(data=st.data(), arrow_type=st.sampled_from(list(INT_TYPES)),
       groups=st.integers(1, 6), long_group=st.booleans())
def test_integer_cuts_equal_the_row_by_row_model(data, arrow_type, groups, long_group):
    limit = INT_TYPES[arrow_type]
    scale = data.draw(st.sampled_from([10, limit // 2, limit - 1]))
    size = data.draw(st.integers(0, 90 if long_group else 30))
    values = data.draw(st.lists(st.none() | st.integers(max(-scale, -limit), min(scale, limit - 1)),
                                min_size=size, max_size=size))
    group_ids = data.draw(st.lists(st.integers(0, groups - 1), min_size=size, max_size=size))
    check(values, group_ids, arrow_type)


@settings(max_examples=100, deadline=None)
@given(values=st.lists(st.none() | st.integers(0, 2**64 - 1), max_size=30),
       data=st.data())
def test_uint64_cuts_equal_the_model(values, data):
    group_ids = data.draw(st.lists(st.integers(0, 2), min_size=len(values),
                                   max_size=len(values)))
    check(values, group_ids, pa.uint64())


@settings(max_examples=100, deadline=None)
@given(values=st.lists(st.none() | st.decimals(-999, 999, places=1, allow_nan=False,
                                               allow_infinity=False), max_size=30),
       data=st.data())
def test_decimal_cuts_equal_the_model(values, data):
    group_ids = data.draw(st.lists(st.integers(0, 2), min_size=len(values),
                                   max_size=len(values)))
    check(values, group_ids, pa.decimal128(4, 1))


def test_mixed_signs_over_many_keys_cut_like_the_model():
    """The shape that made the row-by-row cut slow: many keys, values of both signs."""
    rng = np.random.default_rng(3)
    values = rng.integers(-100, 1000, 20_000).tolist()
    group_ids = rng.integers(0, 2_000, 20_000).tolist()
    group_ids[:200] = [0] * 200  # one run longer than the ranked steps handle
    check(values, group_ids, pa.int64())
    check(values, group_ids, pa.int16())
