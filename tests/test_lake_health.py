"""The retention alert's rule (tally.server.coordinator.lake_health), case by case: the cluster tests show
it end to end; these pin the wording and the edges (exactly at the bound, no retention, a lake
that never committed, partitions, lag in seconds)."""

from __future__ import annotations

from types import SimpleNamespace

from tally.server.coordinator.lake_health import LakeWatch, lag_records, retention_alert

OFFSETS, MS = "table.log.retention.offsets", "table.log.retention.ms"
HELD = "retention keeps them, past what the table allows"
DROPS = "retention drops them at its next pass (table.log.retention.ignore-lake)"


def test_no_retention_no_alert():
    assert retention_alert({}, False, {(None, 0): (0, 10**6)}, None, 10**6) is None


def test_untiered_records_over_retention_offsets():
    ends = {(None, 0): (0, 15), (None, 1): (0, 30)}
    lake = {(None, 0): 5, (None, 1): 20}
    assert retention_alert({OFFSETS: "10"}, False, ends, lake, 0) is None  # exactly 10: kept
    lake[(None, 1)] = 12
    assert retention_alert({OFFSETS: "10"}, False, ends, lake, 0) == (
        f"bucket 1: 18 records not in the lake, more than {OFFSETS} = 10: {HELD}")
    assert retention_alert({OFFSETS: "10"}, True, ends, lake, 0) == (
        f"bucket 1: 18 records not in the lake, more than {OFFSETS} = 10: {DROPS}")


def test_a_lake_that_never_committed_lags_from_offset_0():
    ends = {("2024-01-01", 0): (0, 11)}
    assert retention_alert({OFFSETS: "10"}, False, ends, None, 0) == (
        f"partition '2024-01-01' bucket 0: 11 records not in the lake, more than {OFFSETS} = 10:"
        f" {HELD}")


def test_lagging_longer_than_retention_ms():
    ends, lake = {(None, 0): (0, 3)}, {(None, 0): 1}
    assert retention_alert({MS: "60000"}, False, ends, lake, 59.0) is None
    assert retention_alert({MS: "60000"}, False, ends, lake, 61.0) == (
        f"the lake lags 61 s (2 records not in it), longer than {MS} = 60000: {HELD}")
    # nothing to copy: an idle lake is never behind, however old its last commit
    assert retention_alert({MS: "60000"}, False, {(None, 0): (0, 1)}, lake, 10**6) is None


def test_retention_that_dropped_untiered_records_says_so_first():
    ends, lake = {(None, 0): (40, 50)}, {(None, 0): 30}
    assert retention_alert({OFFSETS: "10", MS: "1"}, True, ends, lake, 100) == (
        "bucket 0: retention dropped offsets 30 to 40 before the lake copied them "
        "(table.log.retention.ignore-lake): the next round copies the whole table")


def test_lag_seconds_count_from_the_last_time_the_lake_held_everything():
    now = [1000.0]
    watch = LakeWatch(lambda: now[0])
    record = SimpleNamespace(table_id=7, created_at=100.0)
    ends = {(None, 0): (0, 5)}
    # never committed: behind since the table was created
    assert watch.assess(record, {}, False, {}, None, ends).lag_seconds == 900.0
    health = watch.assess(record, {}, False, {"committed_at": 990.0}, {(None, 0): 5}, ends)
    assert health.lag_seconds == 0 and health.total_lag == 0
    now[0] = 1030.0  # new records since: behind since it was last seen holding everything
    ends = {(None, 0): (0, 9)}
    assert watch.assess(record, {}, False, {"committed_at": 990.0}, {(None, 0): 5},
                        ends).lag_seconds == 30.0
    assert lag_records(ends, {(None, 0): 5}) == {(None, 0): 4}
    watch.forget(7)
    assert watch.lag_seconds(record, {"committed_at": 990.0}) == 40.0
