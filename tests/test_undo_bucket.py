"""undo_bucket on a real KvTablet: change-type rules, partial writers, idempotence."""

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from aggfuncs import AggFunction
from merge_engine import MergeMode, Schema, TableDescriptor
from merge_engine.kv.log_retention import enforce_retention, retention_offset
from merge_engine.kv.tablet import KvTablet
from recovery import undo_bucket
from tally.errors import RecoveryError

A = ["k", "a_sum", "a_list"]  # writer A's target columns (with the key)
B = ["k", "b_sum", "b_last"]  # writer B's


def open_tablet(path):
    s = (
        Schema.builder()
        .column("k", pa.int64())
        .agg_column("a_sum", pa.int64(), AggFunction.SUM)
        .agg_column("a_list", pa.list_(pa.int64()), AggFunction.ARRAY_AGG)
        .agg_column("b_sum", pa.int64(), AggFunction.SUM)
        .agg_column("b_last", pa.string(), AggFunction.FIRST_VALUE)
        .primary_key("k")
        .build()
    )
    d = TableDescriptor(s, properties={"table.merge-engine": "aggregation", "table.delete.behavior": "allow"})
    return KvTablet.open(str(path), d)


def rows(t):
    return {r["k"]: r for r in t.to_arrow().to_pylist()}


def written(t):
    """Per present key, the value columns any write has targeted (from its latest image)."""
    latest = {r["k"]: r for r in t.changelog().to_pylist()}
    values = {"a_sum", "a_list", "b_sum", "b_last"}
    return {k: values - set(r["_unwritten"]) for k, r in latest.items() if r["_change_type"] != "-D"}


def test_first_change_rules(tmp_path):
    with open_tablet(tmp_path) as t:
        t.put([{"k": 1, "a_sum": 1}, {"k": 2, "a_sum": 2}, {"k": 3, "a_sum": 3}], target_columns=["k", "a_sum"])
        baseline, before = t.log_end_offset, rows(t)
        t.put([{"k": 1, "a_sum": 10}, {"k": 4, "a_sum": 4}], target_columns=["k", "a_sum"])  # -U/+U and +I
        t.put([{"k": 1, "a_sum": 100}], target_columns=["k", "a_sum"])  # later changes of 1
        t.delete([{"k": 2}])  # -D
        t.put([{"k": 2, "a_sum": 7}], target_columns=["k", "a_sum"])  # re-insert after -D
        result = undo_bucket(t, baseline)
        assert rows(t) == before
        assert (result.keys_restored, result.keys_deleted) == (2, 1)
        # Idempotent: undo again from the same baseline changes nothing, writes no changelog.
        end = t.log_end_offset
        undo_bucket(t, baseline)
        assert rows(t) == before and t.log_end_offset == end


def test_empty_and_noop_ranges(tmp_path):
    with open_tablet(tmp_path) as t:
        t.put([{"k": 1, "a_sum": 1}])
        r = undo_bucket(t, t.log_end_offset)
        assert r.records_scanned == 0 and r.keys_touched == 0
        assert undo_bucket(t, 0, end=0).records_scanned == 0


def test_refusals_change_nothing(tmp_path):
    with open_tablet(tmp_path) as t:
        t.put([{"k": 1, "a_sum": 1}])
        with pytest.raises(RecoveryError, match="changelog ends at 1"):
            undo_bucket(t, 5)
        with pytest.raises(RecoveryError, match="include the primary key"):
            undo_bucket(t, 0, target_columns=["a_sum"])
        assert rows(t)[1]["a_sum"] == 1


ops = st.lists(
    st.tuples(
        st.sampled_from(["A", "B", "A-delete"]),
        st.lists(st.tuples(st.integers(0, 6), st.integers(-5, 5) | st.none()), min_size=1, max_size=4),
    ),
    max_size=8,
)


def apply(t, writer, batch):
    if writer == "A":
        t.put([{"k": k, "a_sum": v, "a_list": v} for k, v in batch], target_columns=A)
    elif writer == "B":
        t.put([{"k": k, "b_sum": v, "b_last": None if v is None else str(v)} for k, v in batch], target_columns=B)
    else:
        t.delete([{"k": k} for k, _ in batch], target_columns=A)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(before=ops, after=ops, crash_after=st.integers(0, 3))
def test_partial_undo_restores_own_columns_and_keeps_others(tmp_path_factory, before, after, crash_after):
    path = tmp_path_factory.mktemp("undo")
    with open_tablet(path) as t:
        for writer, batch in before:
            apply(t, writer, batch)
        baseline, at_baseline = t.log_end_offset, rows(t)
        for writer, batch in after:
            apply(t, writer, batch)
        end, current, bits = t.log_end_offset, rows(t), written(t)

        # A crashed undo: only part of the range undone, then more writes by B, then undo again.
        if crash_after and end > baseline:
            undo_bucket(t, baseline, end=min(end, baseline + crash_after), target_columns=A)
            apply(t, "B", [(0, 1)])
            current, bits = rows(t), written(t)
        undo_bucket(t, baseline, target_columns=A)

        got = rows(t)
        for k in set(at_baseline) | set(current):
            base, now = at_baseline.get(k), current.get(k)
            expect_a = {c: base[c] for c in A} if base else {"k": k, "a_sum": None, "a_list": None}
            expect_b = {c: now[c] for c in B} if now else None
            # A row is removed only when B never wrote it (a written null is B's data too).
            if base is None and not bits.get(k, set()) & {"b_sum", "b_last"}:
                assert k not in got, (k, got.get(k))
                continue
            assert k in got
            assert {c: got[k][c] for c in A} == expect_a
            if expect_b is not None:
                assert {c: got[k][c] for c in B} == expect_b


def test_truncation_and_retention_refuse_undo_below_the_log_start(tmp_path):
    s = Schema.builder().column("k", pa.int64()).agg_column("v", pa.int64(), "sum").primary_key("k").build()
    d = TableDescriptor(s, properties={"table.merge-engine": "aggregation", "table.log.retention.offsets": "3"})
    with KvTablet.open(str(tmp_path), d) as t:
        for i in range(4):
            t.put([{"k": i % 2, "v": 1}])  # offsets: +I, +I, -U +U, -U +U -> end 6
        assert t.log_end_offset == 6 and retention_offset(t) == 3
        assert enforce_retention(t, floor=2) == 2  # a live lock still needs offset 2
        assert t.log_start_offset == 2
        assert t.changelog(2).column("_offset").to_pylist() == [2, 3, 4, 5]
        assert enforce_retention(t) == 3
        with pytest.raises(RecoveryError, match="now starts at 3"):
            undo_bucket(t, 2)
        assert t.truncate_log(1) == 3  # never moves back
        t.close()
        t2 = KvTablet.open(str(tmp_path), d)
        assert t2.log_start_offset == 3 and t2.changelog().num_rows == 3
        t2.close()
