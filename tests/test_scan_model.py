"""A scan returns the rows of the reference model as of its snapshot, as a multiset.

Buffered rows come run by run (a run's live rows as they are), not in key order, so the scan is
compared with the plain-Python model (merge_engine.testing.ReferenceTable) as a multiset of rows,
hidden `_unwritten` column included, across puts (whole rows and some columns only), deletes,
flushes, tiny buffers that flush on every write, reopens (the buffer replayed from the
changelog), a snapshot taken before further writes, and snapshots read while another thread
writes. Real RocksDB.
"""

from __future__ import annotations

import shutil
import tempfile
import threading
from collections import Counter

import pyarrow as pa
from hypothesis import HealthCheck, given, settings, strategies as st

from aggfuncs import AggFunction
from merge_engine import Schema, TableDescriptor
from merge_engine.kv.tablet import KvTablet
from merge_engine.table.hidden_columns import UNWRITTEN
from merge_engine.testing import ReferenceTable, records_from_arrow


def schema(key_type: pa.DataType) -> Schema:
    return (Schema.builder().column("k", key_type)
            .agg_column("total", pa.int64(), AggFunction.SUM)
            .agg_column("last", pa.string(), AggFunction.LAST_VALUE)
            .agg_column("top", pa.int32(), AggFunction.MAX)
            .primary_key("k").build())


KEY_TYPES = {"int": (pa.int64(), lambda i: i * 7 - 20), "string": (pa.string(), lambda i: "k" * i)}
PROPS = {"table.merge-engine": "aggregation", "table.delete.behavior": "allow"}
VALUE_COLUMNS = ["total", "last", "top"]

keys = st.integers(0, 11)
row = st.tuples(keys, st.integers(-3, 3), st.sampled_from(["x", "y", ""]), st.integers(0, 9))
put = st.tuples(st.just("put"), st.lists(row, min_size=1, max_size=12))
write = st.one_of(
    put,
    st.tuples(st.just("partial"), st.lists(row, min_size=1, max_size=6),
              st.sets(st.sampled_from(VALUE_COLUMNS), min_size=1)),
    st.tuples(st.just("delete"), st.lists(keys, min_size=1, max_size=4)),
    st.tuples(st.just("flush")),
)
# a tablet's close releases its snapshots, so reopens come only before one is taken
# (one_of draws each branch alike: puts, which make the row buffer's runs, weigh more)
op = st.one_of(write, put, st.tuples(st.just("reopen"), st.sampled_from(["1", "64mb"])))


class Run:
    """The tablet and the model, fed the same operations."""

    def __init__(self, path: str, key_type: str, buffer_size: str) -> None:
        self.path, (arrow_type, self.key_of) = path, KEY_TYPES[key_type]
        self.descriptor = lambda size: TableDescriptor(
            schema(arrow_type), properties={**PROPS, "table.kv.buffer-size": size})
        self.tablet = KvTablet.open(path, self.descriptor(buffer_size))
        self.model = ReferenceTable(schema(arrow_type), PROPS)

    def rows(self, items) -> list[dict]:
        return [{"k": self.key_of(k), "total": t, "last": s, "top": m} for k, t, s, m in items]

    def apply(self, step) -> None:
        kind = step[0]
        if kind == "put":
            self.tablet.put(self.rows(step[1]))
            self.model.put(self.rows(step[1]))
        elif kind == "partial":
            targets = sorted(step[2])
            rows = [{c: r[c] for c in ["k", *targets]} for r in self.rows(step[1])]
            self.tablet.put(rows, target_columns=["k", *targets])
            self.model.put(rows, target_columns=["k", *targets])
        elif kind == "delete":
            gone = [{"k": self.key_of(k)} for k in step[1]]
            self.tablet.delete(gone)
            self.model.delete(gone)
        elif kind == "flush":
            self.tablet.flush()
        else:
            self.tablet.close()
            self.tablet = KvTablet.open(self.path, self.descriptor(step[1]))

    def expected(self) -> Counter:
        return expected_of(self.model)


def expected_of(model: ReferenceTable) -> Counter:
    return Counter(_canonical({**s.values, UNWRITTEN: sorted(s.unwritten)})
                   for s in model.states())


def _canonical(row: dict) -> tuple:
    return tuple(sorted((name, tuple(sorted(v)) if name == UNWRITTEN else v)
                        for name, v in row.items()))


def scanned(batches) -> Counter:
    rows = pa.Table.from_batches(batches).to_pylist() if batches else []
    return Counter(_canonical(r) for r in rows)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(key_type=st.sampled_from(sorted(KEY_TYPES)), buffer_size=st.sampled_from(["1", "64mb", "64mb"]),
       before=st.lists(op, max_size=10), after=st.lists(write, max_size=6),
       batch_size=st.integers(1, 8))
def test_a_scan_holds_the_models_rows_as_of_its_snapshot(key_type, buffer_size, before, after,
                                                         batch_size):
    """Property: every row of the model when the snapshot was taken, once each, with its
    `_unwritten` columns, whatever is written, deleted, flushed afterwards; batches of at most
    `batch_size` rows; later scans of the same tablet, before and after a reopen, agree too."""
    path = tempfile.mkdtemp()
    try:
        run = Run(path, key_type, buffer_size)
        for step in before:
            run.apply(step)
        snapshot = run.tablet.snapshot()
        expected = run.expected()
        for step in after:
            run.apply(step)
        batches = list(snapshot.batches(batch_size=batch_size, unwritten=True))
        assert all(b.num_rows <= batch_size for b in batches)
        assert scanned(batches) == expected
        for step in [None, ("reopen", buffer_size)]:  # as written, then flushed by the close
            if step is not None:
                run.apply(step)
            again = list(run.tablet.snapshot().batches(batch_size=batch_size, unwritten=True))
            assert scanned(again) == run.expected()
        run.tablet.close()
    finally:
        shutil.rmtree(path, ignore_errors=True)


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(key_type=st.sampled_from(sorted(KEY_TYPES)), buffer_size=st.sampled_from(["1", "64mb"]),
       writes=st.lists(write, min_size=1, max_size=30), scans=st.integers(1, 6))
def test_scans_beside_writes_hold_the_rows_of_their_offset(key_type, buffer_size, writes,
                                                             scans):
    """Property: snapshots taken and read while another thread puts, deletes and flushes each
    hold the rows of the changelog below their offset (the model replaying it), once each."""
    path = tempfile.mkdtemp()
    try:
        run = Run(path, key_type, buffer_size)
        writer = threading.Thread(target=lambda: [run.apply(step) for step in writes])
        seen = []
        writer.start()
        try:
            while len(seen) < scans or writer.is_alive() and len(seen) < 200:
                snapshot = run.tablet.snapshot()
                batches = list(snapshot.batches(batch_size=3, unwritten=True))
                seen.append((snapshot.offset, scanned(batches)))
        finally:
            writer.join()
        records = records_from_arrow(run.tablet.changelog(), run.model.names)
        for offset, rows in seen:
            replayed = ReferenceTable(run.model.spec)
            replayed.replay([r for r in records if r.offset < offset])
            assert rows == expected_of(replayed), f"the scan at offset {offset}"
        run.tablet.close()
    finally:
        shutil.rmtree(path, ignore_errors=True)
