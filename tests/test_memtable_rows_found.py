"""Rows in RocksDB's memtable are never hidden from a put's proof that its keys are new (the
filter of stored keys, then the multi-get behind BucketRows.current).

The proof went through a whole-key bloom filter in the memtable until the bucket's own filter
of stored keys (StoredKeys) took its place; either answers "absent" only for keys it never saw,
and a false "absent" for a stored key would make a put start that key from an empty row and
lose its aggregate. A buffer size of "0" sends every put's rows to RocksDB's memtable at once,
so each later put's keys are looked up there; puts of stored and new keys, deletes, re-puts,
flushes and reopens (the memtable replayed from the write-ahead log) are compared with the
reference model after every step. The stored-key model test drives every other path.
"""

from __future__ import annotations

import tempfile

import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from aggfuncs import AggFunction as F
from merge_engine.testing import ColumnSpec, Delete, Put, TableSpec
from merge_engine.testing.harness import TabletHarness
from merge_engine.testing.ops import Reopen
from merge_engine.testing.profiles import examples, load_profile

load_profile()

SPEC = TableSpec((ColumnSpec("k", pa.int64(), nullable=False),
                  ColumnSpec("total", pa.int64(), F.SUM),
                  ColumnSpec("seen", pa.int64(), F.COUNT)),
                 ("k",), {"table.merge-engine": "aggregation", "table.kv.buffer-size": "0",
                          "table.delete.behavior": "allow"})

KEYS = st.integers(-(1 << 40), 1 << 40) | st.integers(0, 40)  # spread out, and colliding


def _put(keys: list[int]) -> Put:
    return Put(tuple({"k": k, "total": k % 7, "seen": 1} for k in keys))


@settings(max_examples=examples(80), deadline=None)
@given(steps=st.lists(st.one_of(
    st.tuples(st.just("put"), st.lists(KEYS, min_size=1, max_size=60)),
    st.tuples(st.just("delete"), st.lists(KEYS, min_size=1, max_size=10)),
    st.tuples(st.just("reopen"), st.just([]))), min_size=1, max_size=12))
def test_stored_keys_are_never_proven_absent(steps):
    with tempfile.TemporaryDirectory() as directory, TabletHarness(SPEC, directory) as harness:
        for kind, keys in steps:
            if kind == "put":
                harness.apply(_put(keys))
            elif kind == "delete":
                harness.apply(Delete(tuple({"k": k} for k in keys)))
            else:
                harness.apply(Reopen())
        # every key ever written once more: a hidden stored row would restart its sum
        written = sorted({k for kind, keys in steps if kind == "put" for k in keys})
        harness.apply(_put(written))
