"""A partial owner's undo (and any partial delete) keeps other writers' written bits and values.

Writer A owns column `a`; writer B owns value-selection columns. A row is removed only when no
other writer ever wrote it: a null B wrote is B's data (first_value keeps it as its first
value), so the row stays and B's next write is judged as it would have been without A.
"""

from __future__ import annotations

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from aggfuncs import AggFunction as F
from merge_engine.kv.tablet import KvTablet
from merge_engine.testing import ColumnSpec, ReferenceTable, TableSpec
from merge_engine.testing.profiles import examples, load_profile
from recovery import undo_bucket

load_profile()

B_FUNCTIONS = {"f": F.FIRST_VALUE, "fi": F.FIRST_VALUE_IGNORE_NULLS, "lv": F.LAST_VALUE, "n": F.COUNT}
A = ["k", "a"]
SPEC = TableSpec(
    (ColumnSpec("k", pa.int64(), nullable=False), ColumnSpec("a", pa.int64(), F.SUM),
     *(ColumnSpec(name, pa.int64() if fn is F.COUNT else pa.string(), fn)
       for name, fn in B_FUNCTIONS.items())),
    ("k",), {"table.merge-engine": "aggregation", "table.delete.behavior": "allow"},
)


def states(tablet) -> dict:
    """Per key: (visible row, written value columns), rebuilt by a strict replay of the
    changelog, which also checks that the changelog describes a consistent history."""
    replayed = ReferenceTable(SPEC).replay(tablet.changelog())
    kv = tablet.to_arrow().to_pylist()
    assert replayed.rows() == kv, "the replay of the changelog differs from KV"
    values = {c.name for c in SPEC.value_columns}
    return {s.values["k"]: (s.values, values - s.unwritten) for s in replayed.states()}


def b_part(state) -> tuple:
    row, written = state
    return {c: row[c] for c in B_FUNCTIONS}, written & set(B_FUNCTIONS)


@pytest.mark.parametrize("column", ["f", "fi", "lv"])
def test_owner_undo_of_its_insert_keeps_a_null_another_writer_wrote(tmp_path, column):
    with KvTablet.open(str(tmp_path), SPEC.descriptor()) as t:
        t.put([{"k": 1, "a": 5}], target_columns=A)  # A creates the row: +I
        t.put([{"k": 1, column: None}], target_columns=["k", column])  # B writes null
        before_undo, end = states(t), t.log_end_offset
        undo_bucket(t, 0, target_columns=A)
        records = t.changelog(end).to_pylist()
        assert [r["_change_type"] for r in records] == ["-U", "+U"]  # kept, not -D
        assert set(records[1]["_unwritten"]) == {"a"} | (set(B_FUNCTIONS) - {column})
        assert t.lookup({"k": 1}) == {"k": 1, "a": None, "f": None, "fi": None, "lv": None, "n": 0}

        # Undoing the undo restores A's column, written bit included, and back again.
        after_undo, undone = states(t), t.log_end_offset
        undo_bucket(t, end, target_columns=A)
        assert states(t) == before_undo
        undo_bucket(t, undone, target_columns=A)
        assert states(t) == after_undo

        t.put([{"k": 1, column: "x"}], target_columns=["k", column])
        expected = None if column == "f" else "x"  # the written null stays first_value's first
        assert t.lookup({"k": 1})[column] == expected


def test_owner_undo_removes_a_row_no_other_writer_wrote(tmp_path):
    with KvTablet.open(str(tmp_path), SPEC.descriptor()) as t:
        t.put([{"k": 1, "a": 5}, {"k": 2, "a": 6}], target_columns=A)
        t.put([{"k": 2, "n": None}], target_columns=["k", "n"])  # count written: 0, not empty
        end = t.log_end_offset
        undo_bucket(t, 0, target_columns=A)
        records = t.changelog(end).to_pylist()
        assert [(r["_change_type"], r["k"]) for r in records] == [("-D", 1), ("-U", 2), ("+U", 2)]
        assert t.lookup({"k": 1}) is None and t.lookup({"k": 2})["n"] == 0
        states(t)


def test_user_partial_delete_follows_the_same_rule(tmp_path):
    with KvTablet.open(str(tmp_path), SPEC.descriptor()) as t:
        t.put([{"k": 1, "a": 5, "f": None}, {"k": 2, "a": 6}], target_columns=["k", "a", "f"])
        t.put([{"k": 3, "a": 7}], target_columns=A)
        t.delete([{"k": 1}, {"k": 3}], target_columns=A)  # AGGREGATE mode, behavior allow
        assert t.lookup({"k": 1}) == {"k": 1, "a": None, "f": None, "fi": None, "lv": None, "n": 0}
        assert t.lookup({"k": 3}) is None
        t.put([{"k": 1, "f": "late"}], target_columns=["k", "f"])
        assert t.lookup({"k": 1})["f"] is None
        states(t)


keys = st.integers(0, 3)
b_values = st.none() | st.sampled_from(["x", "y", ""])
writes = st.one_of(
    st.tuples(st.just("A"), st.lists(st.tuples(keys, st.integers(-3, 3) | st.none()), min_size=1, max_size=3)),
    st.tuples(st.just("A-delete"), st.lists(keys, min_size=1, max_size=2)),
    st.tuples(st.sampled_from(sorted(B_FUNCTIONS)), st.lists(st.tuples(keys, b_values), min_size=1, max_size=3)),
)


def apply(t, write) -> None:
    kind, items = write
    if kind == "A":
        t.put([{"k": k, "a": v} for k, v in items], target_columns=A)
    elif kind == "A-delete":
        t.delete([{"k": k} for k in items], target_columns=A)
    else:
        t.put([{"k": k, kind: v} for k, v in items], target_columns=["k", kind])


@settings(max_examples=examples(60), suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(before=st.lists(writes, max_size=5), after=st.lists(writes, max_size=6),
       later=st.lists(writes.filter(lambda w: w[0] in B_FUNCTIONS), max_size=3))
def test_undo_of_a_partial_owner_never_changes_another_writers_columns(
        tmp_path_factory, before, after, later):
    undone = KvTablet.open(str(tmp_path_factory.mktemp("undone")), SPEC.descriptor())
    control = KvTablet.open(str(tmp_path_factory.mktemp("control")), SPEC.descriptor())
    with undone, control:
        for write in before:
            apply(undone, write)
            apply(control, write)
        baseline, at_baseline = undone.log_end_offset, states(undone)
        for write in after:
            apply(undone, write)
            apply(control, write)
        end, at_end = undone.log_end_offset, states(undone)
        undo_bucket(undone, baseline, target_columns=A)
        got = states(undone)
        for k in set(at_baseline) | set(at_end):
            if k not in got:  # removed: A's row at the baseline was absent, B never wrote it
                assert k not in at_baseline and not b_part(at_end[k])[1]
                continue
            row, written = got[k]
            base = at_baseline.get(k)
            assert (row["a"], "a" in written) == ((base[0]["a"], "a" in base[1]) if base else (None, False))
            assert b_part(got[k]) == (b_part(at_end[k]) if k in at_end else ({c: None for c in B_FUNCTIONS} | {"n": 0}, set()))

        # Undoing the undo gives back A's columns as they were before it.
        mark = undone.log_end_offset
        undo_bucket(undone, end, target_columns=A)
        assert states(undone) == at_end
        undo_bucket(undone, mark, target_columns=A)
        assert states(undone) == got

        # B's next writes land as if A had never written: B's columns match the control's.
        for write in later:
            apply(undone, write)
            apply(control, write)
        final, reference = states(undone), states(control)
        for k in set(final) | set(reference):
            expected = b_part(reference[k]) if k in reference else None
            actual = b_part(final[k]) if k in final else None
            if expected is None or actual is None:  # only rows B never wrote may be absent
                assert not (expected or actual or (None, set()))[1]
            else:
                assert actual == expected, k
