"""KvTablet: modes, partial writes, deletes, offsets, idempotent writers, atomicity."""

import pyarrow as pa
import pytest

from aggfuncs import AggFunction
from merge_engine import MergeMode, Schema, TableDescriptor
from merge_engine.kv.tablet import KvTablet
from tally.errors import DeleteDisabledError, InvalidInputError, OffsetOutOfRangeError, StorageError


def schema():
    return (
        Schema.builder()
        .column("id", pa.string())
        .agg_column("total", pa.int64(), AggFunction.SUM)
        .agg_column("n", pa.int64(), AggFunction.COUNT)
        .agg_column("first", pa.string(), AggFunction.FIRST_VALUE)
        .column("status", pa.string())
        .primary_key("id")
        .build()
    )


def open_tablet(path, delete="allow", engine="aggregation", **props):
    properties = {"table.delete.behavior": delete, **props}
    if engine:
        properties["table.merge-engine"] = engine
    s = schema() if engine else Schema.builder().column("id", pa.string()).column("total", pa.int64()).column("status", pa.string()).primary_key("id").build()
    return KvTablet.open(str(path), TableDescriptor(s, properties=properties))


def rows(t):
    return {r["id"]: r for r in t.to_arrow().to_pylist()}


def test_offsets_count_records_and_noop_writes_consume_none(tmp_path):
    with open_tablet(tmp_path) as t:
        assert t.put([{"id": "a", "total": 1}, {"id": "b", "total": 2}]) == 2  # two +I
        assert t.put([{"id": "a", "total": 5}]) == 4  # -U, +U
        # No-ops: a count with a null input, a first_value already written (as null: the full-row
        # writes above wrote it). A sum of 0 is not one: it adds a contribution, which
        # retraction needs to know about.
        assert t.put([{"id": "a", "n": None, "first": "x"}], target_columns=["id", "n", "first"]) == 4
        assert t.put([{"id": "a", "total": 0}], target_columns=["id", "total"]) == 6
        log = t.changelog()
        assert log.column("_offset").to_pylist() == [0, 1, 2, 3, 4, 5]
        assert log.column("_change_type").to_pylist() == ["+I", "+I", "-U", "+U", "-U", "+U"]
        assert t.changelog(2, 3).column("total").to_pylist() == [1]


def test_several_rows_of_one_key_fold_in_batch_order_into_one_entry(tmp_path):
    with open_tablet(tmp_path) as t:
        t.put([{"id": "a", "total": 1, "first": None, "status": "x"},
               {"id": "a", "total": 2, "first": "late", "status": "y"}])
        assert t.changelog().num_rows == 1
        # "n" is missing from both dicts: a null input, which count does not count.
        assert rows(t)["a"] == {"id": "a", "total": 3, "n": 0, "first": None, "status": "y"}


def test_partial_write_keeps_other_columns_and_first_insert_leaves_them_empty(tmp_path):
    with open_tablet(tmp_path) as t:
        t.put([{"id": "a", "total": 4}], target_columns=["id", "total"])
        assert rows(t)["a"] == {"id": "a", "total": 4, "n": 0, "first": None, "status": None}
        # first_value was never targeted, so the first write to it counts, even after others.
        t.put([{"id": "a", "first": "f", "status": "s"}], target_columns=["id", "first", "status"])
        t.put([{"id": "a", "first": "g"}], target_columns=["id", "first"])
        assert rows(t)["a"] == {"id": "a", "total": 4, "n": 0, "first": "f", "status": "s"}
        assert t.changelog(0, 1).column("_unwritten").to_pylist() == [["n", "first", "status"]]


def test_target_columns_must_include_the_key(tmp_path):
    with open_tablet(tmp_path) as t:
        with pytest.raises(InvalidInputError, match=r"must contain the primary key columns \['id'\]"):
            t.put([{"total": 1}], target_columns=["total"])
        with pytest.raises(InvalidInputError, match="not among the target columns"):
            t.put([{"id": "a", "total": 1, "status": "x"}], target_columns=["id", "total"])
        with pytest.raises(InvalidInputError, match="Unknown target column 'nope'"):
            t.put([{"id": "a"}], target_columns=["id", "nope"])


def test_merge_state_adds_partial_counts_and_overwrite_replaces(tmp_path):
    with open_tablet(tmp_path) as t:
        t.put([{"id": "a", "total": 1, "n": "x"}], target_columns=["id", "total", "n"])
        t.put([{"id": "a", "total": 10, "n": 5}, {"id": "a", "total": 1, "n": None}],
              mode=MergeMode.MERGE_STATE, target_columns=["id", "total", "n"])
        assert rows(t)["a"]["total"] == 12 and rows(t)["a"]["n"] == 6
        t.put([{"id": "a", "total": 7, "n": None}, {"id": "a", "total": 3, "n": 2}],
              mode="overwrite", target_columns=["id", "total", "n"])
        assert (rows(t)["a"]["total"], rows(t)["a"]["n"]) == (3, 2)
        t.put([{"id": "a", "total": 1}], target_columns=["id", "total"])  # aggregates on top
        assert rows(t)["a"]["total"] == 4


def test_overwrite_restores_unwritten_bits(tmp_path):
    with open_tablet(tmp_path) as t:
        t.put([{"id": "a", "first": "x"}], target_columns=["id", "first"])
        t.put([{"id": "a", "first": None, "_unwritten": ["first"]}], mode=MergeMode.OVERWRITE,
              target_columns=["id", "first"])
        t.put([{"id": "a", "first": "y"}], target_columns=["id", "first"])
        assert rows(t)["a"]["first"] == "y"


def test_delete_behaviours(tmp_path):
    with open_tablet(tmp_path / "ignore", delete="ignore") as t:
        t.put([{"id": "a", "total": 1}])
        assert t.delete([{"id": "a"}]) == 1 and "a" in rows(t)
        assert t.delete([{"id": "a"}], mode=MergeMode.OVERWRITE) == 2 and rows(t) == {}
    with open_tablet(tmp_path / "disable", delete="disable") as t:
        t.put([{"id": "a", "total": 1}])
        with pytest.raises(DeleteDisabledError, match="disable"):
            t.delete([{"id": "a"}])
        assert t.log_end_offset == 1 and "a" in rows(t)


def test_partial_delete_removes_the_row_only_when_other_columns_are_empty(tmp_path):
    with open_tablet(tmp_path) as t:
        t.put([{"id": "a", "total": 1, "status": "s"}], target_columns=["id", "total", "status"])
        t.put([{"id": "b", "total": 2}], target_columns=["id", "total"])
        t.delete([{"id": "a"}, {"id": "b"}, {"id": "zz"}], target_columns=["id", "total"])
        assert rows(t) == {"a": {"id": "a", "total": None, "n": 0, "first": None, "status": "s"}}
        assert t.changelog(2).column("_change_type").to_pylist() == ["-U", "+U", "-D"]


def test_default_engine_is_last_write_wins(tmp_path):
    with open_tablet(tmp_path, engine=None) as t:
        t.put([{"id": "a", "total": 1, "status": "x"}, {"id": "a", "total": 2, "status": None}])
        assert rows(t)["a"] == {"id": "a", "total": 2, "status": None}
        t.delete([{"id": "a"}])
        assert rows(t) == {}


def test_rejected_write_leaves_no_trace(tmp_path):
    with open_tablet(tmp_path) as t:
        t.put([{"id": "a", "total": 1}])
        before, end = t.to_arrow(), t.log_end_offset
        bad = [
            [{"id": "b", "total": 1}, {"id": None, "total": 2}],
            [{"id": "b", "total": 1}, {"id": "c", "total": "many"}],
            [{"id": "b", "total": 1, "bogus": 3}],
            pa.table({"id": ["b"], "total": [1]}),  # full-row Arrow write lacking columns
        ]
        for batch in bad:
            with pytest.raises(InvalidInputError):
                t.put(batch)
        assert t.to_arrow().equals(before) and t.log_end_offset == end


def test_idempotent_writer_survives_reopen(tmp_path):
    t = open_tablet(tmp_path)
    assert t.put([{"id": "a", "total": 1}], writer=("w1", 1)) == 1
    assert t.put([{"id": "a", "total": 1}], writer=("w1", 2)) == 3
    t.close()
    t = open_tablet(tmp_path)
    assert t.put([{"id": "a", "total": 1}], writer=("w1", 2)) == 3  # a retry: applies nothing
    assert t.put([{"id": "a", "total": 1}], writer=("w1", 1)) == 3
    assert t.delete([{"id": "a"}], writer=("w1", 2)) == 3
    assert rows(t)["a"]["total"] == 2
    assert t.put([{"id": "a", "total": 1}], writer=("w2", 1)) == 5
    t.close()


def test_changelog_range_errors_and_reopen_with_other_schema(tmp_path):
    t = open_tablet(tmp_path)
    t.put([{"id": "a", "total": 1}])
    with pytest.raises(OffsetOutOfRangeError, match=r"\[0, 5\)"):
        t.changelog(0, 5)
    with pytest.raises(OffsetOutOfRangeError):
        t.changelog(2)
    assert t.changelog(1).num_rows == 0
    t.close()
    with pytest.raises(StorageError, match="closed"):
        t.lookup({"id": "a"})
    with pytest.raises(StorageError, match="another schema"):
        open_tablet(tmp_path, engine=None)


def test_rows_come_back_in_key_order_with_composite_keys(tmp_path):
    s = (Schema.builder().column("region", pa.string()).column("day", pa.int32())
         .agg_column("v", pa.int64(), "sum").primary_key("region", "day").build())
    with KvTablet.open(str(tmp_path), TableDescriptor(s, properties={"table.merge-engine": "aggregation"})) as t:
        keys = [("b", 2), ("a", 10), ("a", -3), ("a\x00", 1), ("", 5), ("b", -1)]
        t.put([{"region": r, "day": d, "v": 1} for r, d in keys])
        got = [(r["region"], r["day"]) for r in t.to_arrow().to_pylist()]
        assert got == sorted(keys)
        assert t.lookup({"region": "a\x00", "day": 1})["v"] == 1
        assert t.lookup({"region": "a", "day": 1}) is None
