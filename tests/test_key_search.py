"""Positions of keys in a sorted index (merge_engine.kv.key_search, compiled for uint64 keys)
against numpy's searchsorted: keys sorted (a put's, which gallop from the previous one), in
any order, repeated, absent, below and above every indexed key."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from merge_engine.kv.key_search import search_sorted
from merge_engine.testing.profiles import examples

key_values = st.one_of(st.integers(0, 40), st.integers(0, 2**64 - 1),
                       st.sampled_from([0, 2**64 - 1, 1 << 63]))


@settings(max_examples=examples(400))
@given(st.lists(key_values, max_size=200), st.lists(key_values, max_size=200), st.booleans())
def test_positions_equal_numpys_searchsorted(indexed, wanted, sort_wanted):
    index = np.sort(np.array(indexed, dtype=np.uint64))
    keys = np.array(sorted(wanted) if sort_wanted else wanted, dtype=np.uint64)
    got = search_sorted(index, keys)
    assert got.dtype == np.int64
    assert got.tolist() == np.searchsorted(index, keys).tolist()


def test_a_put_sized_search():
    rng = np.random.default_rng(9)
    index = np.unique(rng.integers(0, 2**63, 100_000).astype(np.uint64))
    keys = np.sort(np.concatenate([rng.choice(index, 60_000),
                                   rng.integers(0, 2**63, 3_000).astype(np.uint64)]))
    assert (search_sorted(index, keys) == np.searchsorted(index, keys)).all()


def test_other_types_are_refused_not_converted():
    with pytest.raises(TypeError, match="uint64"):
        search_sorted(np.arange(5, dtype=np.int64), np.arange(3, dtype=np.uint64))
    with pytest.raises(ValueError, match="1-D"):
        search_sorted(np.zeros((2, 2), dtype=np.uint64), np.zeros(2, dtype=np.uint64))
