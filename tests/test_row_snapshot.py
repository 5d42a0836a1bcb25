"""A bucket's snapshot reads its rows as of one offset, whatever is written, deleted or flushed
after it was taken; it reads buffered and stored rows alike; a closing tablet releases it.

Real RocksDB. The reference is a plain-Python model of the table (a dict of key -> row) taken
at the moment of the snapshot.
"""

from __future__ import annotations

import shutil
import tempfile

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from aggfuncs import AggFunction
from merge_engine import Schema, TableDescriptor
from merge_engine.kv.tablet import KvTablet
from tally.errors import InvalidInputError, StorageError

SCHEMA = (Schema.builder().column("k", pa.string()).column("n", pa.int32())
          .agg_column("total", pa.int64(), AggFunction.SUM)
          .agg_column("tags", pa.string(), AggFunction.STRING_AGG)
          .primary_key("k", "n").build())
KEYS = [("a", 1), ("a", 2), ("b", 1), ("", 0), ("b\x00c", 7), ("z", -3)]


def open_tablet(path, buffer_size: int = 64 << 20) -> KvTablet:
    props = {"table.merge-engine": "aggregation", "table.delete.behavior": "allow",
             "table.kv.buffer-size": str(buffer_size)}
    return KvTablet.open(str(path), TableDescriptor(SCHEMA, properties=props))


def rows_of(batches) -> dict:
    table = pa.Table.from_batches(batches) if batches else None
    return {} if table is None else {(r["k"], r["n"]): r for r in table.to_pylist()}


class Model:
    def __init__(self) -> None:
        self.rows: dict = {}

    def put(self, rows) -> None:
        for r in rows:
            key = (r["k"], r["n"])
            old = self.rows.get(key)
            if old is None:
                self.rows[key] = dict(r)
            else:
                old["total"] += r["total"]
                old["tags"] = f"{old['tags']},{r['tags']}"

    def delete(self, keys) -> None:
        for key in keys:
            self.rows.pop(key, None)


op = st.one_of(
    st.tuples(st.just("put"), st.lists(st.tuples(st.sampled_from(KEYS), st.integers(-5, 5),
                                                  st.sampled_from("xyz")), min_size=1, max_size=6)),
    st.tuples(st.just("delete"), st.lists(st.sampled_from(KEYS), min_size=1, max_size=3)),
    st.tuples(st.just("flush"), st.none()),
)


def apply(tablet: KvTablet, model: Model | None, step) -> None:
    kind, arg = step
    if kind == "put":
        rows = [{"k": k, "n": n, "total": t, "tags": tag} for (k, n), t, tag in arg]
        tablet.put(rows)
        if model is not None:
            model.put(rows)
    elif kind == "delete":
        tablet.delete([{"k": k, "n": n} for k, n in arg])
        if model is not None:
            model.delete(arg)
    else:
        tablet.flush()


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(before=st.lists(op, max_size=8), after=st.lists(op, max_size=8),
       buffer_size=st.sampled_from([1, 64 << 20]), batch_size=st.integers(1, 4))
def test_snapshot_reads_the_rows_of_its_offset(before, after, buffer_size, batch_size):
    """Property: the snapshot's rows equal the model's rows when it was taken, after any later
    puts, deletes and flushes (buffer_size 1 flushes on every write), in batches of at most
    `batch_size` rows."""
    path = tempfile.mkdtemp()
    try:
        tablet = open_tablet(path, buffer_size)
        model = Model()
        for step in before:
            apply(tablet, model, step)
        offset = tablet.log_end_offset
        snapshot = tablet.snapshot()
        expected = {k: dict(v) for k, v in model.rows.items()}
        for step in after:
            apply(tablet, None, step)
        batches = list(snapshot.batches(batch_size=batch_size))
        assert all(b.num_rows <= batch_size for b in batches)
        assert snapshot.offset == offset
        assert rows_of(batches) == expected
        tablet.close()
    finally:
        shutil.rmtree(path, ignore_errors=True)


def test_projection_and_unwritten(tmp_path):
    tablet = open_tablet(tmp_path / "t")
    tablet.put([{"k": "a", "n": 1, "total": 3}], target_columns=["k", "n", "total"])
    tablet.put([{"k": "b", "n": 1, "total": 1, "tags": "x"}])
    batches = list(tablet.snapshot().batches(columns=["tags", "k"], unwritten=True))
    table = pa.Table.from_batches(batches)
    assert table.column_names == ["tags", "k", "_unwritten"]
    assert sorted(table.to_pylist(), key=lambda r: r["k"]) == [
        {"tags": None, "k": "a", "_unwritten": ["tags"]},
        {"tags": "x", "k": "b", "_unwritten": []}]
    assert list(tablet.snapshot().batches())[0].schema.names == ["k", "n", "total", "tags"]
    with pytest.raises(InvalidInputError, match="unknown column"):
        list(tablet.snapshot().batches(columns=["nope"]))
    tablet.close()


def test_lookup_many_is_aligned_with_its_keys(tmp_path):
    tablet = open_tablet(tmp_path / "t")
    tablet.put([{"k": "a", "n": 1, "total": 3, "tags": "x"}])
    tablet.flush()
    tablet.put([{"k": "b", "n": 2, "total": 4, "tags": "y"}])  # buffered
    rows, found = tablet.lookup_many([{"k": "b", "n": 2}, {"k": "q", "n": 0}, {"k": "a", "n": 1},
                                      {"k": "b", "n": 2}])
    assert found.tolist() == [True, False, True, True]
    values = rows.to_pylist()
    assert [values[i]["total"] for i in (0, 2, 3)] == [4, 3, 4]
    tablet.close()


def test_close_releases_an_unfinished_snapshot(tmp_path):
    """A snapshot left half read must not keep RocksDB open: the tablet closes, reopens, and
    the snapshot then refuses to read instead of touching a closed database."""
    tablet = open_tablet(tmp_path / "t")
    tablet.put([{"k": f"k{i}", "n": i, "total": i} for i in range(50)])
    tablet.flush()
    snapshot = tablet.snapshot()
    batches = snapshot.batches(batch_size=10)
    next(batches)
    tablet.close()
    with pytest.raises(StorageError, match="closed"):
        list(batches)
    reopened = open_tablet(tmp_path / "t")
    assert reopened.to_arrow().num_rows == 50
    reopened.close()
