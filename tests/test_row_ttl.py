"""Row TTL (`table.kv.row-ttl`) against its reference model (merge_engine.testing.ttl_model).

Random sequences of puts, deletes, clock moves, sweeps, crashes (RocksDB keeps its committed
batches, the row buffer is lost), reopens and undos to earlier baselines run on a real KvTablet
with an injected clock and on the model; after each step the visible rows, lookups, a snapshot
scan and the changelog replayed by a consumer agree with the model. No sleeps: the clock is a
number the test moves.
"""

from __future__ import annotations

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from merge_engine import Schema, TableDescriptor
from merge_engine.kv.tablet import KvTablet
from merge_engine.table.hidden_columns import CHANGE_TYPE, EXPIRED, OFFSET, WRITTEN_MS
from merge_engine.testing.model import ReferenceTable
from merge_engine.testing.ttl_model import ExpiringTable
from recovery.bucket_undo import undo_bucket
from tally.errors import InvalidOptionError

TTL_MS = 10_000
KEYS = range(3)
SCHEMA = (Schema.builder().column("k", pa.int64())
          .agg_column("total", pa.int64(), "sum")
          .agg_column("top", pa.int64(), "max")
          .agg_column("last", pa.string(), "last_value")
          .primary_key("k").build())
PROPERTIES = {"table.merge-engine": "aggregation", "table.delete.behavior": "allow",
              "table.kv.row-ttl": "10s"}


class Clock:
    def __init__(self, ms: int = 1_000_000):
        self.ms = ms

    def __call__(self) -> float:
        return self.ms / 1000


def crash(tablet: KvTablet) -> None:
    """What kill -9 leaves behind: RocksDB's committed write batches, not the row buffer."""
    tablet._guard.closed = True
    tablet._store.close()


rows = st.lists(st.fixed_dictionaries({
    "k": st.sampled_from(KEYS), "total": st.integers(-3, 3), "top": st.integers(-3, 3),
    "last": st.sampled_from(["a", "b", None])}), min_size=1, max_size=4)
ops = st.lists(st.one_of(
    st.tuples(st.just("put"), rows),
    st.tuples(st.just("put"), rows),
    st.tuples(st.just("delete"), st.lists(st.sampled_from(KEYS), min_size=1, max_size=2)),
    st.tuples(st.just("advance"), st.sampled_from([0, 1, 3_000, 9_999, 10_000, 10_001, 25_000])),
    st.tuples(st.just("advance"), st.sampled_from([3_000, 6_000, 9_999])),
    st.tuples(st.just("sweep")),
    st.tuples(st.just("read_all")),
    st.tuples(st.just("crash")),
    st.tuples(st.just("reopen")),
    st.tuples(st.just("baseline")),
    st.tuples(st.just("undo")),
), min_size=1, max_size=30)


def consumer_view(tablet: KvTablet, now_ms: int) -> list[dict]:
    """What a changelog consumer knows: the replayed rows whose last image is within the TTL
    at `now_ms` (the -D of an expired row may not be written yet)."""
    records = tablet.changelog()
    last_time = {}
    for rec in records.select(["k", CHANGE_TYPE, WRITTEN_MS]).to_pylist():
        last_time[rec["k"]] = None if rec[CHANGE_TYPE] == "-D" else rec[WRITTEN_MS]
    replayed = ReferenceTable(SCHEMA, PROPERTIES).replay(records).rows()
    return [r for r in replayed if last_time[r["k"]] is not None
            and now_ms < last_time[r["k"]] + TTL_MS]


def check(tablet: KvTablet, model: ExpiringTable, clock: Clock) -> None:
    """Every read but to_arrow, which flushes the row buffer (a crash would lose nothing)."""
    expected = model.rows()
    scanned = [r for b in tablet.snapshot().batches() for r in b.to_pylist()]
    assert sorted(scanned, key=lambda r: r["k"]) == expected
    for k in KEYS:
        assert tablet.lookup({"k": k}) == model.lookup({"k": k})
    found, present = tablet.lookup_many([{"k": k} for k in KEYS])
    live = {r["k"] for r in expected}
    assert present.tolist() == [k in live for k in KEYS]
    assert consumer_view(tablet, clock.ms) == expected


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ops=ops)
def test_row_ttl_matches_the_model(tmp_path_factory, ops):
    path = tmp_path_factory.mktemp("ttl")
    descriptor = TableDescriptor(SCHEMA, properties=PROPERTIES)
    clock = Clock()
    model = ExpiringTable(descriptor, TTL_MS, clock.ms)
    tablet = KvTablet.open(path, descriptor, clock=clock)
    baseline = None  # (offset, model copy)
    try:
        for op in ops:
            kind = op[0]
            if kind == "put":
                tablet.put(op[1])
                model.put(op[1])
            elif kind == "delete":
                keys = [{"k": k} for k in op[1]]
                tablet.delete(keys)
                model.delete(keys)
            elif kind == "advance":
                clock.ms += op[1]
                model.advance(op[1])
            elif kind == "sweep":
                tablet.expire_rows()
            elif kind == "read_all":
                assert tablet.to_arrow().to_pylist() == model.rows()
            elif kind in ("crash", "reopen"):
                crash(tablet) if kind == "crash" else tablet.close()
                tablet = KvTablet.open(path, descriptor, clock=clock)
            elif kind == "baseline":
                baseline = (tablet.log_end_offset, model.baseline())
            elif kind == "undo" and baseline is not None:
                undo_bucket(tablet, baseline[0])
                model.undo_to(baseline[1])
            check(tablet, model, clock)
    finally:
        tablet.close()


def test_expiry_shows_as_its_own_minus_d_and_undo_does_not_bring_it_back(tmp_path):
    clock = Clock()
    descriptor = TableDescriptor(SCHEMA, properties=PROPERTIES)
    with KvTablet.open(tmp_path, descriptor, clock=clock) as tablet:
        tablet.put([{"k": 1, "total": 5, "top": 5, "last": "a"}])
        start = tablet.log_end_offset
        clock.ms += TTL_MS
        assert tablet.lookup({"k": 1}) is None
        assert tablet.expire_rows() == 1
        assert tablet.expire_rows() == 0
        tablet.put([{"k": 1, "total": 1, "top": 1, "last": "b"}])
        records = tablet.changelog(start).select([OFFSET, CHANGE_TYPE, "total", EXPIRED])
        assert records.to_pylist() == [
            {OFFSET: 1, CHANGE_TYPE: "-D", "total": 5, EXPIRED: True},
            {OFFSET: 2, CHANGE_TYPE: "+I", "total": 1, EXPIRED: False}]
        undo_bucket(tablet, start)  # the expiry is not undone; the new insert is
        assert tablet.to_arrow().num_rows == 0


def test_undo_restores_an_image_with_its_own_write_time(tmp_path):
    """The undone write refreshed the key; without it the key would have expired: undo must
    not bring it back alive (a restore stamped "now" would)."""
    clock = Clock()
    descriptor = TableDescriptor(SCHEMA, properties=PROPERTIES)
    with KvTablet.open(tmp_path, descriptor, clock=clock) as tablet:
        tablet.put([{"k": 1, "total": 5, "top": 5, "last": "a"}, {"k": 2, "total": 1, "top": 1,
                                                                  "last": "x"}])
        clock.ms += 3_000
        tablet.put([{"k": 2, "total": 1, "top": 1, "last": "x"}])  # k2 written at +3s
        baseline = tablet.log_end_offset
        clock.ms += 3_000
        tablet.put([{"k": 1, "total": 1, "top": 9, "last": "b"},
                    {"k": 2, "total": 1, "top": 1, "last": "y"}])
        clock.ms += 5_000  # k1's baseline image (written at 0) is expired, k2's (+3s) is not
        undo_bucket(tablet, baseline)
        assert tablet.to_arrow().to_pylist() == [{"k": 2, "total": 2, "top": 1, "last": "x"}]
        clock.ms += 2_000  # k2 expires when it would have without the undone write
        assert tablet.to_arrow().num_rows == 0


def test_a_write_after_expiry_starts_the_row_anew_and_logs_the_expiry_first(tmp_path):
    clock = Clock()
    descriptor = TableDescriptor(SCHEMA, properties=PROPERTIES)
    with KvTablet.open(tmp_path, descriptor, clock=clock) as tablet:
        tablet.put([{"k": 1, "total": 5, "top": 5, "last": "a"}])
        clock.ms += TTL_MS - 1
        tablet.put([{"k": 1, "total": 0, "top": 0, "last": "a"}])  # refreshes, values kept
        clock.ms += TTL_MS - 1
        assert tablet.lookup({"k": 1}) == {"k": 1, "total": 5, "top": 5, "last": "a"}
        clock.ms += 1
        tablet.put([{"k": 1, "total": 2, "top": 1, "last": None}])
        assert tablet.lookup({"k": 1}) == {"k": 1, "total": 2, "top": 1, "last": None}
        kinds = tablet.changelog().select([CHANGE_TYPE, EXPIRED]).to_pylist()
        assert kinds == [{CHANGE_TYPE: "+I", EXPIRED: False}, {CHANGE_TYPE: "-U", EXPIRED: False},
                         {CHANGE_TYPE: "+U", EXPIRED: False}, {CHANGE_TYPE: "-D", EXPIRED: True},
                         {CHANGE_TYPE: "+I", EXPIRED: False}]


@pytest.mark.parametrize("value, ms", [("10s", 10_000), ("15min", 900_000), ("2h", 7_200_000),
                                       ("7d", 604_800_000), ("86400000", 86_400_000),
                                       ("250 ms", 250)])
def test_row_ttl_option_takes_durations(value, ms):
    props = dict(PROPERTIES, **{"table.kv.row-ttl": value})
    assert TableDescriptor(SCHEMA, properties=props).row_ttl_ms == ms


@pytest.mark.parametrize("value", ["0", "soon", "-5s", "1 week", "1.5h"])
def test_bad_row_ttl_is_refused_naming_the_option(value):
    props = dict(PROPERTIES, **{"table.kv.row-ttl": value})
    with pytest.raises(InvalidOptionError, match="table.kv.row-ttl"):
        TableDescriptor(SCHEMA, properties=props)
