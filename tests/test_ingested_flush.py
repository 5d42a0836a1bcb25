"""Flushes that reach RocksDB as an ingested table file (large flushes, BucketRows.ingest_rows)
give the same tablet as write batches: against the reference model, after reopen, on a
follower that applies the leader's changelog, and after a crash between the file's ingestion
and the commit of the applied offset (tests/test_tablet_flush_crash.py covers that one).

Flushes only ingest from `ingest_rows` keys up (262,144), so these tests lower it: to one key
(every flush with a row ingests a file, including ones of deletes only) or to 65,536.
"""

from __future__ import annotations

import contextlib
import dataclasses
import tempfile

from hypothesis import given, settings
from hypothesis import strategies as st

import pyarrow as pa

from aggfuncs import AggFunction as F
from merge_engine import KvTablet
from merge_engine.descriptor import KV_BUFFER_SIZE
from merge_engine.rows import BucketRows
from merge_engine.testing.harness import TabletHarness
from merge_engine.testing.ops import Reopen
from merge_engine.testing.profiles import examples, load_profile
from merge_engine.testing.strategies import deletes, puts, table_specs
from merge_engine.testing.values import same_row
from tests.tablet_helpers import one_column_tablet

load_profile()


@contextlib.contextmanager
def ingest_every_flush(keys: int = 1):
    """Every flush of `keys` or more keys of this process's tablets ingests a file while
    inside."""
    saved = BucketRows.ingest_rows
    BucketRows.ingest_rows = keys
    try:
        yield
    finally:
        BucketRows.ingest_rows = saved


def table_files(tablet: KvTablet) -> int:
    """Table files in the bucket's RocksDB (ingested ones among them)."""
    db = tablet._store.db
    return sum(int(db.property_value(f"rocksdb.num-files-at-level{level}") or 0)
               for level in range(7))


@settings(max_examples=examples(60), deadline=None)
@given(spec=table_specs(), buffer=st.sampled_from(["0", "1kb", "64mb"]), data=st.data())
def test_ingested_flushes_match_the_model_and_a_follower(spec, buffer, data):
    """Puts, deletes, flushes and reopens with a buffer that flushes at every write ("0"),
    every few writes, or only at close; the harness compares every step with the model."""
    spec = dataclasses.replace(spec, properties={**spec.properties, KV_BUFFER_SIZE: buffer})
    with ingest_every_flush(), tempfile.TemporaryDirectory() as directory:
        with TabletHarness(spec, f"{directory}/leader") as harness:
            for _ in range(data.draw(st.integers(1, 10), label="steps")):
                step = data.draw(st.sampled_from(["put", "put", "delete", "flush", "reopen"]),
                                 label="step")
                if step == "put":
                    harness.apply(data.draw(puts(spec), label="put"))
                elif step == "delete":
                    harness.apply(data.draw(deletes(spec), label="delete"))
                elif step == "flush":
                    harness.tablet.flush()
                    harness.check()
                else:
                    harness.apply(Reopen())
            leader = harness.tablet
            expected = leader.to_arrow().to_pylist()
            with KvTablet.open(f"{directory}/follower", spec.descriptor()) as follower:
                while entries := leader.replication_entries(follower.log_end_offset, 4096):
                    follower.apply_replicated(entries)
                    follower.flush()
                got = follower.to_arrow().to_pylist()
            assert len(got) == len(expected)
            assert all(same_row(g, e) for g, e in zip(got, expected)), "follower differs"


def test_a_large_flush_ingests_one_file_of_puts_and_deletes(tmp_path):
    """From 65,536 keys up, a flush of 100,000 new keys is one ingested file; the next
    flush's file holds 50,000 new keys with the deletes of 25,000 stored ones between them.
    Reads find every row before, during (the buffer) and after each flush."""
    n = 100_000
    allow = {"table.delete.behavior": "allow"}
    with ingest_every_flush(65536), \
            one_column_tablet(tmp_path / "t", F.SUM, pa.int64(), allow) as tablet:
        before = table_files(tablet)
        even = pa.record_batch([pa.array(range(0, 2 * n, 2), pa.int64()),
                                pa.array([1] * n, pa.int64())], names=["k", "v"])
        tablet.put(even)
        assert tablet.lookup({"k": 2}) == {"k": 2, "v": 1}
        tablet.flush()
        assert table_files(tablet) == before + 1
        assert tablet.lookup({"k": 2}) == {"k": 2, "v": 1}
        assert tablet.lookup({"k": 1}) is None
        tablet.delete(pa.record_batch([pa.array(range(0, 2 * n, 8), pa.int64())], names=["k"]))
        odd = pa.record_batch([pa.array(range(1, 2 * n, 4), pa.int64()),
                               pa.array([2] * (n // 2), pa.int64())], names=["k", "v"])
        tablet.put(odd)
        tablet.flush()
        assert table_files(tablet) <= before + 2  # the second file (RocksDB may compact)
        assert tablet.lookup({"k": 0}) is None
        assert tablet.lookup({"k": 2}) == {"k": 2, "v": 1}
        assert tablet.lookup({"k": 1}) == {"k": 1, "v": 2}
        rows = tablet.to_arrow()
    expected = sorted([k for k in range(0, 2 * n, 2) if k % 8] + list(range(1, 2 * n, 4)))
    assert rows.column("k").to_pylist() == expected
    with one_column_tablet(tmp_path / "t", F.SUM, pa.int64(), allow) as reopened:
        assert reopened.to_arrow().equals(rows)
