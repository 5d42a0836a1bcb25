"""A bucket's prefix lookup returns the reference model's rows under the prefix, in key order.

Random tables of two or three key columns (integers of two widths, text, binary), fed random
puts (whole rows and some columns only), deletes, flushes, reopens and moves of the row TTL's
clock, on buffers that hold everything or flush on every write; then prefixes of every length
(the first column, the first two, the whole key), of values present and absent, are compared
with the plain-Python model (merge_engine.testing) filtered by the prefix, hidden `_unwritten`
column included. A prefix read pinned before more writes holds the rows as of then, and prefix
reads beside a writing thread hold the rows of the changelog below their offsets. Bad
prefixes are refused with InvalidInputError naming the columns. Real RocksDB.
"""

from __future__ import annotations

import shutil
import tempfile
import threading

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from aggfuncs import AggFunction
from merge_engine import Schema, TableDescriptor
from merge_engine.kv.tablet import KvTablet
from merge_engine.table.hidden_columns import UNWRITTEN
from merge_engine.testing import ReferenceTable, records_from_arrow
from merge_engine.testing.ttl_model import ExpiringTable
from tally.errors import InvalidInputError

# a key column: its Arrow type and the value of a small integer drawn for it
KEY_KINDS = {
    "int64": (pa.int64(), lambda i: i * 5 - 7),
    "int16": (pa.int16(), lambda i: 3 - i),
    "string": (pa.string(), lambda i: "u" * i),  # "" and "uu" hold a prefix of each other
    "binary": (pa.binary(), lambda i: bytes([0] * i)),  # NUL bytes, escaped in the key
}
VALUE_COLUMNS = ["total", "last", "top"]
TTL_MS = 10_000


class Clock:
    def __init__(self) -> None:
        self.ms = 1_000_000

    def __call__(self) -> float:
        return self.ms / 1000


def schema(kinds: list[str]) -> Schema:
    builder = Schema.builder()
    for i, kind in enumerate(kinds):
        builder = builder.column(f"k{i}", KEY_KINDS[kind][0])
    return (builder.agg_column("total", pa.int64(), AggFunction.SUM)
            .agg_column("last", pa.string(), AggFunction.LAST_VALUE)
            .agg_column("top", pa.int32(), AggFunction.MAX)
            .primary_key(*[f"k{i}" for i in range(len(kinds))]).build())


small = st.integers(0, 3)
key = st.tuples(small, small, small)
row = st.tuples(key, st.integers(-3, 3), st.sampled_from(["x", "y", None]), st.integers(0, 9))
write = st.one_of(
    st.tuples(st.just("put"), st.lists(row, min_size=1, max_size=10)),
    st.tuples(st.just("put"), st.lists(row, min_size=1, max_size=10)),
    st.tuples(st.just("partial"), st.lists(row, min_size=1, max_size=5),
              st.sets(st.sampled_from(VALUE_COLUMNS), min_size=1)),
    st.tuples(st.just("delete"), st.lists(key, min_size=1, max_size=4)),
    st.tuples(st.just("flush")),
    st.tuples(st.just("advance"), st.sampled_from([1, 4_000, 9_999, 10_000])),
)
op = st.one_of(write, st.tuples(st.just("reopen")))


class Run:
    """The tablet and the model (the row-TTL model, with a TTL or one no test reaches), fed
    the same operations."""

    def __init__(self, path: str, kinds: list[str], buffer_size: str, ttl: bool) -> None:
        self.path, self.kinds = path, kinds
        self.names = [f"k{i}" for i in range(len(kinds))]
        props = {"table.merge-engine": "aggregation", "table.delete.behavior": "allow",
                 "table.kv.buffer-size": buffer_size}
        if ttl:
            props["table.kv.row-ttl"] = "10s"
        self.descriptor = TableDescriptor(schema(kinds), properties=props)
        self.clock = Clock()
        self.ttl = ttl
        self.model = ExpiringTable(self.descriptor, TTL_MS if ttl else 1 << 60, self.clock.ms)
        self.tablet = KvTablet.open(path, self.descriptor, clock=self.clock)

    def key(self, drawn) -> dict:
        return {n: KEY_KINDS[k][1](v) for n, k, v in zip(self.names, self.kinds, drawn)}

    def rows(self, items) -> list[dict]:
        return [{**self.key(k), "total": t, "last": s, "top": m} for k, t, s, m in items]

    def apply(self, step) -> None:
        kind = step[0]
        if kind == "put":
            self.tablet.put(self.rows(step[1]))
            self.model.put(self.rows(step[1]))
        elif kind == "partial":
            targets = self.names + sorted(step[2])
            rows = [{c: r[c] for c in targets} for r in self.rows(step[1])]
            self.tablet.put(rows, target_columns=targets)
            self.model.put(rows, target_columns=targets)
        elif kind == "delete":
            keys = [self.key(k) for k in step[1]]
            self.tablet.delete(keys)
            self.model.delete(keys)
        elif kind == "flush":
            self.tablet.flush()
        elif kind == "advance":
            self.clock.ms += step[1]
            self.model.advance(step[1])
        else:
            self.tablet.close()
            self.tablet = KvTablet.open(self.path, self.descriptor, clock=self.clock)

    def expected(self, prefix: dict) -> list[dict]:
        """The model's rows under `prefix`, in key order, with `_unwritten`."""
        self.model.rows()  # forgets the expired keys
        return [{**s.values, UNWRITTEN: sorted(s.unwritten)} for s in self.model.table.states()
                if all(s.values[c] == v for c, v in prefix.items())]


def prefixes(run: Run, drawn: list[tuple[int, tuple]]) -> list[dict]:
    return [dict(list(run.key(k).items())[:length]) for length, k in drawn]


def found(rows: pa.Table) -> list[dict]:
    return [{**r, UNWRITTEN: sorted(r[UNWRITTEN])} for r in rows.to_pylist()]


kinds_of = st.lists(st.sampled_from(sorted(KEY_KINDS)), min_size=2, max_size=3)
asked = st.lists(st.tuples(st.integers(1, 3), key), min_size=1, max_size=6)


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(kinds=kinds_of, buffer_size=st.sampled_from(["1", "64mb", "64mb"]),
       ttl=st.booleans(), before=st.lists(op, max_size=12), after=st.lists(write, max_size=5),
       asked=asked, batch_size=st.integers(1, 6))
def test_prefix_lookups_hold_the_models_rows_under_the_prefix(kinds, buffer_size, ttl, before,
                                                              after, asked, batch_size):
    """Property: every row of the model whose leading key columns equal the prefix, once, in
    key order, with its unwritten columns, past-TTL rows left out; batches of at most
    `batch_size` rows; a prefix read pinned before later writes reads as of then."""
    path = tempfile.mkdtemp()
    try:
        run = Run(path, kinds, buffer_size, ttl)
        for step in before:
            run.apply(step)
        wanted = prefixes(run, asked)
        pinned = run.tablet.prefix_rows(wanted[0])
        pinned_expected = run.expected(wanted[0])
        for step in after:
            if step[0] != "advance":  # the pinned read judged the TTL when it was made
                run.apply(step)
        batches = list(pinned.batches(batch_size=batch_size, unwritten=True))
        assert all(b.num_rows <= batch_size for b in batches)
        assert found(pa.Table.from_batches(batches, schema=batches[0].schema)
                     if batches else _empty(run)) == pinned_expected
        for prefix in wanted:
            rows = run.tablet.lookup_prefix(prefix, unwritten=True)
            assert found(rows) == run.expected(prefix), prefix
        # many prefixes of one length at once: their rows, each once, in key order
        for length in {len(p) for p in wanted}:
            group = [p for p in wanted if len(p) == length]
            many = run.tablet.lookup_prefix(group, unwritten=True)
            expected = {tuple(r[n] for n in run.names): r
                        for p in group for r in run.expected(p)}
            assert found(many) == [expected[k] for k in sorted(expected)]
        run.tablet.close()
    finally:
        shutil.rmtree(path, ignore_errors=True)


def _empty(run: Run) -> pa.Table:
    return run.tablet.lookup_prefix({"k0": KEY_KINDS[run.kinds[0]][1](99)}, unwritten=True)


def test_a_prefix_lookup_reads_a_range_not_the_bucket(tmp_path):
    """The rows of other prefixes are never stepped over: a bucket of 20,000 stored rows
    answers a prefix of 3 with its RocksDB iterator positioned on them (counted by wrapping
    the iterator the read was given)."""
    descriptor = TableDescriptor(schema(["int64", "int64"]),
                                 properties={"table.merge-engine": "aggregation"})
    with KvTablet.open(str(tmp_path), descriptor) as tablet:
        tablet.put([{"k0": u, "k1": d, "total": 1, "last": "x", "top": 1}
                    for u in range(1000) for d in range(20)])
        tablet.flush()
        rows = tablet.prefix_rows({"k0": 500})
        counted = _Counting(rows._items)
        rows._items = counted
        table = rows.to_table(columns=["k0", "k1"])
        assert table.to_pylist() == [{"k0": 500, "k1": d} for d in range(20)]
        assert counted.steps <= 21  # the prefix's rows and the first key past them


class _Counting:
    def __init__(self, iterator) -> None:
        self.iterator, self.steps = iterator, 0

    def seek(self, key):
        self.iterator.seek(key)

    def valid(self):
        return self.iterator.valid()

    def key(self):
        self.steps += 1
        return self.iterator.key()

    def value(self):
        return self.iterator.value()

    def next(self):
        self.iterator.next()


@pytest.mark.parametrize("prefix, says", [
    ({"k1": 1}, "the leading key columns are required (it lacks ['k0'])"),
    ({"k0": 1, "k2": 1}, "lacks ['k1']"),
    ({"nope": 1}, "unknown column(s) ['nope']"),
    ({"k0": 1, "total": 1}, "column(s) ['total']"),
    ({"k0": 1.5}, "'k0'"),
    ({"k0": "seven"}, "'k0'"),
    ({"k0": None}, "['k0']"),
    ({}, "at least its first primary-key column 'k0'"),
    ([{"k0": 1}, {"k0": 2, "k1": 3}], "different columns"),
    ("k0=1", "not str"),
])
def test_bad_prefixes_are_refused_naming_the_columns(tmp_path, prefix, says):
    descriptor = TableDescriptor(schema(["int64", "string", "int16"]),
                                 properties={"table.merge-engine": "aggregation"})
    with KvTablet.open(str(tmp_path), descriptor) as tablet:
        tablet.put([{"k0": 1, "k1": "a", "k2": 1, "total": 1, "last": "x", "top": 1}])
        with pytest.raises(InvalidInputError) as refused:
            tablet.lookup_prefix(prefix)
        assert says in str(refused.value)


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(kinds=kinds_of, buffer_size=st.sampled_from(["1", "64mb"]),
       writes=st.lists(write.filter(lambda s: s[0] != "advance"), min_size=1, max_size=25),
       asked=asked)
def test_prefix_reads_beside_writes_hold_the_rows_of_their_offset(kinds, buffer_size, writes,
                                                                   asked):
    """Property: prefix reads pinned and read while another thread puts, deletes and flushes
    each hold the rows under the prefix of the changelog below their offset (the model
    replaying it), in key order."""
    path = tempfile.mkdtemp()
    try:
        run = Run(path, kinds, buffer_size, ttl=False)
        wanted = prefixes(run, asked)
        writer = threading.Thread(target=lambda: [run.apply(step) for step in writes])
        seen = []
        writer.start()
        try:
            while len(seen) < len(wanted) or writer.is_alive() and len(seen) < 200:
                prefix = wanted[len(seen) % len(wanted)]
                rows = run.tablet.prefix_rows(prefix)
                batches = list(rows.batches(batch_size=2, unwritten=True))
                table = pa.Table.from_batches(batches) if batches else None
                seen.append((rows.offset, prefix, [] if table is None else found(table)))
        finally:
            writer.join()
        records = records_from_arrow(run.tablet.changelog(), run.model.table.names)
        for offset, prefix, rows in seen:
            replayed = ReferenceTable(run.model.table.spec)
            replayed.replay([r for r in records if r.offset < offset])
            assert rows == [{**s.values, UNWRITTEN: sorted(s.unwritten)} for s in replayed.states()
                            if all(s.values[c] == v for c, v in prefix.items())], offset
        run.tablet.close()
    finally:
        shutil.rmtree(path, ignore_errors=True)
