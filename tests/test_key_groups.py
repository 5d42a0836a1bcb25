"""The grouping of a write's keys of up to 8 bytes (merge_engine.write.key_groups, a stable radix sort
of uint64 keys) against numpy's np.unique: the distinct keys in order, each row's group and
each group's least row, for keys that differ in any digit, in none, or only in the top one."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings, strategies as st

from merge_engine.testing.profiles import examples
from merge_engine.write.key_groups import group_sorted

TOP = 1 << 63
key_values = st.one_of(
    st.integers(0, 3),  # few keys: long groups
    st.integers(0, 2**64 - 1),  # any digit
    st.sampled_from([0, 2**64 - 1, TOP, TOP - 1, 2047, 2048]),  # digit edges
    st.integers(0, 2**20 - 1).map(lambda v: v << 44),  # only the high digits differ
)


@settings(max_examples=examples(400))
@given(st.lists(key_values, max_size=300))
def test_groups_equal_numpys_unique(values):
    keys = np.array(values, dtype=np.uint64)
    distinct, group_ids, firsts = group_sorted(keys)
    expected, first_rows, inverse = np.unique(keys, return_index=True, return_inverse=True)
    assert distinct.dtype == np.uint64 and group_ids.dtype == np.int64
    assert distinct.tolist() == expected.tolist()
    assert group_ids.tolist() == inverse.ravel().tolist()
    assert firsts.tolist() == first_rows.tolist()
    assert keys.tolist() == [int(v) for v in values]  # the caller's keys are left as they were


def test_a_put_sized_batch_of_repeated_keys():
    rng = np.random.default_rng(5)
    keys = rng.integers(0, 60_000, 100_000).astype(np.uint64) * np.uint64(0x9E3779B97F4A7C15)
    distinct, group_ids, firsts = group_sorted(keys)
    expected, first_rows, inverse = np.unique(keys, return_index=True, return_inverse=True)
    assert np.array_equal(distinct, expected) and np.array_equal(firsts, first_rows)
    assert np.array_equal(group_ids, inverse.ravel())
