"""KvTablet.undo_writes against a plain-Python model: one writer's writes taken back exactly.

A writer W and other writers (full rows, or other columns of the same keys) write a bucket in
any interleaving, with deletes; W's offset ranges are recorded as a flush would. Taking W's
ranges back must leave what the others' writes alone would have made, unless another writer
changed one of W's keys' W-columns after W first changed it: then nothing may change at all.
A crash (reopen) between the writes and the undo changes nothing of that, and the undo, retried
with the same writer sequence, is applied once.
"""

from __future__ import annotations

import pyarrow as pa
from hypothesis import HealthCheck, given, settings, strategies as st

from aggfuncs import AggFunction
from merge_engine import MergeMode, Schema, TableDescriptor  # noqa: F401
from merge_engine.kv.tablet import KvTablet

W_COLUMNS = ["k", "w_sum", "w_list"]
OTHER_COLUMNS = ["k", "o_sum"]


def open_tablet(path):
    schema = (Schema.builder().column("k", pa.int64())
              .agg_column("w_sum", pa.int64(), AggFunction.SUM)
              .agg_column("w_list", pa.list_(pa.int64()), AggFunction.ARRAY_AGG)
              .agg_column("o_sum", pa.int64(), AggFunction.SUM)
              .primary_key("k").build())
    return KvTablet.open(str(path), TableDescriptor(schema, properties={
        "table.merge-engine": "aggregation", "table.delete.behavior": "allow"}))


def rows(tablet) -> dict:
    return {r["k"]: r for r in tablet.to_arrow().to_pylist()}


keys = st.lists(st.integers(0, 5), min_size=1, max_size=4, unique=True)
# (who, what, keys, amount): W writes its columns; "other" writes o_sum of the same keys (never
# W's columns); "full" writes every column; "delete" removes whole rows
steps = st.lists(st.tuples(st.sampled_from(["w", "w", "other", "full", "delete"]), keys,
                           st.integers(1, 9)), min_size=1, max_size=10)


def apply(tablet, who, ks, amount, writer):
    if who == "w":
        return tablet.put([{"k": k, "w_sum": amount, "w_list": [amount]} for k in ks],
                          target_columns=W_COLUMNS, writer=writer)
    if who == "other":
        return tablet.put([{"k": k, "o_sum": amount} for k in ks], target_columns=OTHER_COLUMNS)
    if who == "full":
        return tablet.put([{"k": k, "w_sum": amount, "w_list": [amount], "o_sum": amount}
                           for k in ks])
    return tablet.delete([{"k": k} for k in ks])


def conflicted(history: list) -> bool:
    """Whether a non-W write changed W's columns of a key after W's first write to it (the
    model of the conflict rule: `other` writes only o_sum, so it never conflicts)."""
    touched = set()
    for who, ks, _ in history:
        if who == "w":
            touched |= set(ks)
        elif who in ("full", "delete") and touched & set(ks):
            return True
    return False


@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
@given(before=steps, during=steps, crash=st.booleans())
def test_undo_leaves_what_the_others_alone_made(tmp_path_factory, before, during, crash):
    base = tmp_path_factory.mktemp("undo")
    real = open_tablet(base / "real")
    with open_tablet(base / "model") as model:
        for who, ks, amount in before:  # history before the flush: in both
            apply(real, who, ks, amount, None)
            apply(model, who, ks, amount, None)
        ranges, sequence = [], 0
        for who, ks, amount in during:
            start = real.log_end_offset
            sequence += 1
            end = apply(real, who, ks, amount, ("W", sequence) if who == "w" else None)
            if who == "w":
                ranges.append((start, end))
            else:
                apply(model, who, ks, amount, None)  # the model never sees W's writes
        if crash:
            real.close()
            real = open_tablet(base / "real")
        try:
            check_undo(real, model, during, ranges, sequence)
        finally:
            real.close()


def check_undo(real, model, during, ranges, sequence) -> None:
    if not ranges:
        return
    held = rows(real)
    end, undo = real.undo_writes(ranges, W_COLUMNS, ("W", sequence + 1))
    if conflicted(during):
        assert undo.conflicts and rows(real) == held, "a conflicted undo changed rows"
        assert end == real.log_end_offset
        return
    assert not undo.conflicts
    assert _values(rows(real)) == _values(rows(model))
    again_end, _ = real.undo_writes(ranges, W_COLUMNS, ("W", sequence + 1))
    assert again_end == end and _values(rows(real)) == _values(rows(model))


def _values(table: dict) -> dict:
    """Rows as the user reads them; a key whose every column is back to unwritten counts as
    absent (a partial writer's insert undone resets its columns, as recovery does)."""
    shown = {}
    for k, r in table.items():
        values = {c: r[c] for c in ("w_sum", "w_list", "o_sum")}
        if any(v not in (None, []) for v in values.values()):
            shown[k] = values
    return shown


def test_undo_outside_the_log_is_refused_and_changes_nothing(tmp_path):
    with open_tablet(tmp_path / "t") as tablet:
        end = apply(tablet, "w", [1], 3, ("W", 1))
        held = rows(tablet)
        try:
            tablet.undo_writes([(0, end + 5)], W_COLUMNS, ("W", 2))
        except Exception as e:  # noqa: BLE001 - the class is asserted below
            assert type(e).__name__ == "OffsetOutOfRangeError", e
        else:
            raise AssertionError("an undo past the log end was accepted")
        assert rows(tablet) == held


def test_a_full_row_writers_insert_is_deleted_and_an_overwrite_restored(tmp_path):
    with open_tablet(tmp_path / "t") as tablet:
        tablet.put([{"k": 1, "w_sum": 5, "w_list": [5], "o_sum": 1}])
        start = tablet.log_end_offset
        end = tablet.put([{"k": 1, "w_sum": 2, "w_list": [2], "o_sum": 2},
                          {"k": 2, "w_sum": 7, "w_list": [7], "o_sum": 7}], writer=("W", 1))
        start2 = tablet.log_end_offset
        end2 = tablet.put([{"k": 1, "w_sum": 10, "w_list": [10], "o_sum": 0}],
                          mode=MergeMode.OVERWRITE, writer=("W", 2))
        _, undo = tablet.undo_writes([(start, end), (start2, end2)], None, ("W", 3))
        assert not undo.conflicts
        assert rows(tablet) == {1: {"k": 1, "w_sum": 5, "w_list": [5], "o_sum": 1}}
