"""The changelog retention policy (merge_engine/kv/log_retention.py) on one KvTablet: what the
retention options allow, the lock floor and `table.log.retention.ignore-locks`."""

import time

import pyarrow as pa

from merge_engine import Schema, TableDescriptor
from merge_engine.kv.log_retention import enforce_retention, has_retention, retention_offset
from merge_engine.kv.tablet import KvTablet

SCHEMA = (Schema.builder().column("k", pa.int64()).agg_column("v", pa.int64(), "sum")
          .primary_key("k").build())


def descriptor(**options) -> TableDescriptor:
    return TableDescriptor(SCHEMA, properties={"table.merge-engine": "aggregation", **options})


def write_batches(tablet: KvTablet, count: int) -> None:
    """`count` stored batches of two records each (+I), written at distinct milliseconds."""
    for i in range(count):
        tablet.put([{"k": 2 * i, "v": 1}, {"k": 2 * i + 1, "v": 1}])
        time.sleep(0.005)


def test_no_retention_options_keep_the_whole_log(tmp_path):
    d = descriptor()
    assert not has_retention(d)
    with KvTablet.open(str(tmp_path), d) as t:
        write_batches(t, 3)
        assert retention_offset(t) == 0
        assert enforce_retention(t) == 0 and t.log_start_offset == 0


def test_log_entry_spans_cover_the_log(tmp_path):
    with KvTablet.open(str(tmp_path), descriptor()) as t:
        write_batches(t, 3)
        spans = t.log_entry_spans()
        assert [(first, end) for first, end, _ in spans] == [(0, 2), (2, 4), (4, 6)]
        assert spans[0][2] < spans[1][2] < spans[2][2]
        assert t.truncate_log(3) == 3  # the straddling batch stays, the first goes
        assert [(first, end) for first, end, _ in t.log_entry_spans()] == [(2, 4), (4, 6)]


def test_retention_by_offsets_keeps_the_most_recent_records(tmp_path):
    d = descriptor(**{"table.log.retention.offsets": "3"})
    assert has_retention(d)
    with KvTablet.open(str(tmp_path), d) as t:
        write_batches(t, 3)
        assert retention_offset(t) == 3
        assert enforce_retention(t) == 3 and t.log_start_offset == 3
        assert enforce_retention(t) == 3  # nothing more to cut


def test_retention_by_age_drops_whole_batches_older_than_the_limit(tmp_path):
    max_age = 60_000
    d = descriptor(**{"table.log.retention.ms": str(max_age)})
    assert has_retention(d)
    with KvTablet.open(str(tmp_path), d) as t:
        write_batches(t, 3)
        written = [w for _, _, w in t.log_entry_spans()]
        assert retention_offset(t, now_ms=written[0] + max_age) == 0  # not older than the limit
        assert retention_offset(t, now_ms=written[1] + max_age) == 2  # the first batch is
        assert retention_offset(t, now_ms=written[2] + max_age + 1) == 6
        assert enforce_retention(t, now_ms=written[1] + max_age) == 2
        assert t.changelog().column("_offset").to_pylist() == [2, 3, 4, 5]


def test_the_lock_floor_caps_retention_unless_ignore_locks(tmp_path):
    d = descriptor(**{"table.log.retention.offsets": "1"})
    with KvTablet.open(str(tmp_path / "held"), d) as t:
        write_batches(t, 3)
        assert enforce_retention(t, floor=2) == 2
        assert enforce_retention(t, floor=0) == 2  # never moves back
        assert enforce_retention(t) == 5
    d = descriptor(**{"table.log.retention.offsets": "1",
                      "table.log.retention.ignore-locks": "true"})
    with KvTablet.open(str(tmp_path / "ignored"), d) as t:
        write_batches(t, 3)
        assert enforce_retention(t, floor=2) == 5
