"""Sequence groups (`fields.<seq>.sequence-group`): each group's first/last value columns follow
the group's own sequence, through a real KvTablet.

- Model: tables with 1-3 groups (now and then a column in no group, ordered by a table-wide
  sequence field or by arrival), partial writers of one group whose sequences arrive out of
  order, full rows, deletes, reopens, every mode, against the reference model.
- Crash: one group's writer is undone since a baseline (its columns only) while the other
  writers' writes stay; the undone writer's retry then meets the sequences it met before.
- Pre-aggregation equals the raw rows; two writers by hand; bad options and writes.
"""

from __future__ import annotations

import copy
import tempfile

import pyarrow as pa
import pytest
from hypothesis import given, settings, strategies as st

from aggfuncs import AggFunction as F
from merge_engine import MergeMode, Schema, TableDescriptor
from merge_engine.kv.tablet import KvTablet
from merge_engine.table.sequence_groups import check_groups_against_table, missing_sequence
from merge_engine.testing import ReferenceTable
from merge_engine.testing.harness import TabletHarness
from merge_engine.testing.ops import Put, Reopen
from merge_engine.testing.profiles import examples, load_profile
from merge_engine.testing.records import records_from_arrow
from merge_engine.testing.sequence_group_strategies import sequence_group_specs
from merge_engine.testing.strategies import rows as drawn_rows, write_sequences
from merge_engine.testing.values import same_row
from merge_engine.write.preaggregate import preaggregate
from recovery import undo_bucket
from tally.errors import InvalidInputError, InvalidOptionError, TallyError

load_profile()

AGG = {"table.merge-engine": "aggregation"}
GROUPS = {**AGG, "fields.sa.sequence-group": "a_last,a_first,a_sum",
          "fields.sb.sequence-group": "b_last,b_seen"}
A = ["k", "sa", "a_last", "a_first", "a_sum"]
B = ["k", "sb", "b_last", "b_seen"]


def schema() -> Schema:
    return (Schema.builder().column("k", pa.int64())
            .column("sa", pa.int64())
            .agg_column("a_last", pa.string(), F.LAST_VALUE)
            .agg_column("a_first", pa.string(), F.FIRST_VALUE)
            .agg_column("a_sum", pa.int64(), F.SUM)
            .column("sb", pa.timestamp("us"))
            .column("b_last", pa.string())  # last_value_ignore_nulls
            .agg_column("b_seen", pa.int64(), F.COUNT)
            .agg_column("free", pa.int64(), F.MAX)
            .primary_key("k").build())


def descriptor(properties=None) -> TableDescriptor:
    return TableDescriptor(schema(), properties={**GROUPS, **(properties or {})})


def rows_of(tablet) -> list[dict]:
    return tablet.to_arrow().to_pylist()


def same_rows(actual: list[dict], expected: list[dict]) -> bool:
    return len(actual) == len(expected) and all(same_row(a, e) for a, e in zip(actual, expected))


# --- against the model ------------------------------------------------------------------------


@settings(max_examples=examples(80))
@given(data=st.data())
def test_tables_with_sequence_groups_equal_the_model(data):
    spec = data.draw(sequence_group_specs(), label="spec")
    ops = data.draw(write_sequences(spec, max_size=10), label="ops")
    with tempfile.TemporaryDirectory() as d, TabletHarness(spec, d) as h:
        h.run(ops)


@st.composite
def group_writer_histories(draw):
    """A table of 2-3 groups, each written by its own partial writer (all of its group's
    columns and its sequence), interleaved, with reopens: (spec, writers' targets, writes
    before the baseline, writes after it), a write being (writer, Put) or None for a reopen."""
    spec = draw(sequence_group_specs(min_groups=2))
    targets = [tuple(n for n in spec.names if n in ("k", *sequence, *members))
               for sequence, members in spec.sequence_groups]

    def writes(max_size):
        ops = []
        for _ in range(draw(st.integers(0, max_size))):
            if draw(st.integers(0, 7)) == 0:
                ops.append(None)
                continue
            writer = draw(st.integers(0, len(targets) - 1))
            mode = draw(st.sampled_from(["AGGREGATE", "MERGE_STATE"]))
            rows = draw(drawn_rows(spec, targets[writer], mode, max_size=4))
            if draw(st.integers(0, 7)):  # mostly writes that carry their sequence
                rows = [r for r in rows if all(r[c] is not None for c in targets[writer]
                                               if c in spec.sequence_columns)]
            if not rows:
                continue
            ops.append((writer, Put(tuple(rows), mode, targets[writer],
                                    arrow=draw(st.integers(0, 3)) == 0)))
        return ops

    return spec, targets, writes(6), writes(8)


def _apply(h: TabletHarness, op) -> bool:
    return h.apply(Reopen() if op is None else op[1])


@settings(max_examples=examples(40))
@given(history=group_writer_histories())
def test_a_crashed_writer_is_undone_without_touching_the_other_groups(history):
    spec, targets, before, after = history
    with tempfile.TemporaryDirectory() as d, TabletHarness(spec, d) as h:
        for op in before:
            _apply(h, op)
        baseline = h.tablet.log_end_offset
        expected = copy.deepcopy(h.model)
        crashed = []  # writer 0's accepted writes since the baseline: what its undo takes back
        for op in after:
            accepted = _apply(h, op)
            if op is not None and accepted:
                if op[0] == 0:
                    crashed.append(op[1])
                else:
                    op[1].apply(expected)
        undo_bucket(h.tablet, baseline, target_columns=targets[0])
        _check_same_states(h.tablet, expected, spec)
        # The restored cells kept their sequences, so the crashed writer's retry (after a
        # restart) ends where the model says.
        h.reopen()
        for put in crashed:
            outcomes = [_outcome(lambda: put.apply(
                            h.tablet, MergeMode[put.mode],
                            convert=spec.arrow_rows if put.arrow else None)),
                        _outcome(lambda: put.apply(expected))]
            assert outcomes[0] == outcomes[1], (put, outcomes)
        _check_same_states(h.tablet, expected, spec)


def _outcome(call) -> str:
    try:
        call()
    except TallyError as exc:
        return type(exc).__name__
    return "ok"


def _check_same_states(tablet, expected: ReferenceTable, spec) -> None:
    """The tablet's rows, and their states (written bits, sequences) as its changelog shows
    them, are the model's."""
    assert same_rows(rows_of(tablet), expected.rows())
    states = ReferenceTable(spec).replay(records_from_arrow(tablet.changelog(), spec.names)).states()
    assert len(states) == len(expected.states())
    for got, want in zip(states, expected.states()):
        assert got.same_as(want), (got, want)


@settings(max_examples=examples(40))
@given(data=st.data())
def test_preaggregated_group_writes_equal_the_rows(data):
    spec = data.draw(sequence_group_specs(functions=(F.LAST_VALUE, F.LAST_VALUE_IGNORE_NULLS,
                                                      F.FIRST_VALUE, F.FIRST_VALUE_IGNORE_NULLS,
                                                      None, F.SUM, F.COUNT)), label="spec")
    sequence, members = data.draw(st.sampled_from(spec.sequence_groups), label="group")
    targets = [n for n in spec.names if n in ("k", *sequence, *members)]
    rows = data.draw(drawn_rows(spec, targets, max_size=8), label="rows")
    rows = [r for r in rows if all(r[s] is not None for s in sequence)]
    d = spec.descriptor()
    with tempfile.TemporaryDirectory() as a, tempfile.TemporaryDirectory() as b, \
            KvTablet.open(a, d) as raw, KvTablet.open(b, d) as folded:
        outcomes = [_outcome(lambda: raw.put(rows, target_columns=targets)),
                    _outcome(lambda: folded.put(preaggregate(rows, d, targets),
                                                MergeMode.MERGE_STATE, target_columns=targets))]
        model = ReferenceTable(spec)
        outcomes.append(_outcome(lambda: model.put(rows, target_columns=targets)))
        assert outcomes[0] == outcomes[1] == outcomes[2]  # an overflow is one for all
        assert same_rows(rows_of(folded), rows_of(raw))
        assert same_rows(rows_of(raw), model.rows())


# --- by hand ----------------------------------------------------------------------------------


def test_two_writers_each_follow_their_own_groups_sequence(tmp_path):
    import datetime

    at = datetime.datetime.fromisoformat
    with KvTablet.open(str(tmp_path), descriptor()) as t:
        t.put([{"k": 1, "sa": 20, "a_last": "a20", "a_first": "a20", "a_sum": 1}], target_columns=A)
        t.put([{"k": 1, "sb": at("2026-01-01 10:00"), "b_last": "b10", "b_seen": 1}],
              target_columns=B)
        # Older writes of both groups arrive late; B's is older than A's latest but newer than
        # anything B wrote: each group is judged by its own sequence alone.
        t.put([{"k": 1, "sa": 10, "a_last": "a10", "a_first": "a10", "a_sum": 1}], target_columns=A)
        t.put([{"k": 1, "sb": at("2026-01-01 11:00"), "b_last": "b11", "b_seen": 1},
               {"k": 1, "sb": at("2026-01-01 09:00"), "b_last": "b09", "b_seen": 1}],
              target_columns=B)
        assert rows_of(t) == [{"k": 1, "sa": 20, "a_last": "a20", "a_first": "a10", "a_sum": 2,
                               "sb": at("2026-01-01 11:00"), "b_last": "b11", "b_seen": 3,
                               "free": None}]
        # A column in no group needs no sequence, and orders by arrival.
        t.put([{"k": 1, "free": 7}], target_columns=["k", "free"])
        assert t.lookup({"k": 1})["free"] == 7
        sequences = t.changelog().to_pylist()[-1]["_sequences"]
        assert sequences["a_first"] == {"value": "a10", "sequence": {"sa": 10}}
        assert sequences["b_last"] == {"value": "b11", "sequence": {"sb": at("2026-01-01 11:00")}}


def test_groups_and_the_table_wide_field_order_their_own_columns(tmp_path):
    s = (Schema.builder().column("k", pa.int64()).column("ts", pa.int64())
         .column("sa", pa.int64()).agg_column("a", pa.string(), F.LAST_VALUE)
         .agg_column("other", pa.string(), F.LAST_VALUE).agg_column("n", pa.int64(), F.SUM)
         .primary_key("k").build())
    d = TableDescriptor(s, properties={**AGG, "table.sequence-field": "ts",
                                       "fields.sa.sequence-group": "a"})
    with KvTablet.open(str(tmp_path), d) as t:
        t.put([{"k": 1, "ts": 5, "sa": 1, "a": "a1", "other": "o5"}],
              target_columns=["k", "ts", "sa", "a", "other"])
        t.put([{"k": 1, "ts": 1, "sa": 9, "a": "a9", "other": "o1"}],
              target_columns=["k", "ts", "sa", "a", "other"])
        t.put([{"k": 1, "n": 3}], target_columns=["k", "n"])  # in no group, no function to order
        assert rows_of(t) == [{"k": 1, "ts": 5, "sa": 9, "a": "a9", "other": "o5", "n": 3}]
        # A write of the group needs the group's sequence only, not the table-wide one.
        t.put([{"k": 1, "sa": 10, "a": "a10"}], target_columns=["k", "sa", "a"])
        assert t.lookup({"k": 1})["a"] == "a10"
        with pytest.raises(InvalidInputError, match="'ts'"):
            t.put([{"k": 1, "sa": 11, "other": "x"}], target_columns=["k", "sa", "other"])


@pytest.mark.parametrize("row, targets, message", [
    ({"k": 1, "a_sum": 1}, ["k", "a_sum"],
     r"'a_sum' \(sum\) follows the sequence \['sa'\] of 'fields.sa.sequence-group'.*carry column 'sa'"),
    ({"k": 1, "sa": None, "a_last": "x"}, ["k", "sa", "a_last"],
     r"Sequence column 'sa' \(of 'fields.sa.sequence-group'\) is null"),
    ({"k": 1, "b_last": "x", "sa": 1}, ["k", "sa", "b_last"], "carry column 'sb'"),
])
def test_a_write_without_its_groups_sequence_is_refused_and_nothing_applied(
        tmp_path, row, targets, message):
    with KvTablet.open(str(tmp_path), descriptor()) as t:
        t.put([{"k": 2, "sa": 1, "a_sum": 5}], target_columns=["k", "sa", "a_sum"])
        before, end = rows_of(t), t.log_end_offset
        good = {"k": 3, "sa": 1, "a_sum": 1, "a_last": "x", "b_last": "y"}
        with pytest.raises(InvalidInputError, match=message):
            # with another key's row: refused with the rest
            t.put([{c: good.get(c) for c in targets}, row], target_columns=targets)
        assert rows_of(t) == before and t.log_end_offset == end


def test_undo_restores_a_groups_cells_and_their_sequences(tmp_path):
    with KvTablet.open(str(tmp_path), descriptor()) as t:
        t.put([{"k": 1, "sa": 5, "a_last": "a5", "a_first": "a5", "a_sum": 1}], target_columns=A)
        baseline, expected = t.log_end_offset, rows_of(t)
        t.put([{"k": 1, "sa": 9, "a_last": "a9", "a_first": "a9", "a_sum": 1}], target_columns=A)
        undo_bucket(t, baseline, target_columns=A)
        assert rows_of(t) == expected
        # The restored a_last still has sequence 5: a write at 7 replaces it.
        t.put([{"k": 1, "sa": 7, "a_last": "a7", "a_first": "a7", "a_sum": 1}], target_columns=A)
        assert t.lookup({"k": 1})["a_last"] == "a7" and t.lookup({"k": 1})["a_first"] == "a5"


def test_sequence_groups_from_connector_options_and_json():
    arrow = schema().to_arrow()
    d = TableDescriptor.from_options(arrow, ["k"], options={
        **AGG, "fields.sa,sb.sequence-group": "a_last,b_last", "fields.a_last.agg": "last_value"})
    (group,) = d.sequence_groups
    assert (group.sequence, group.columns) == (("sa", "sb"), ("a_last", "b_last"))
    assert TableDescriptor.from_json(d.to_json()).sequence_groups == d.sequence_groups
    # Spark lower-cases option keys: the names resolve to the schema's spelling.
    upper = pa.schema([("k", pa.int64()), ("Seq", pa.int64()), ("V", pa.string())])
    d = TableDescriptor.from_options(upper, ["k"], options={**AGG, "fields.seq.sequence-group": "V"})
    assert d.sequence_groups[0].sequence == ("Seq",)


@pytest.mark.parametrize("properties, message", [
    ({"fields.nope.sequence-group": "a_last"}, "sequence column 'nope' is not a column"),
    ({"fields.k.sequence-group": "a_last"}, "primary key"),
    ({"fields.f.sequence-group": "a_last"}, "double"),
    ({"fields.a_sum.sequence-group": "a_last"}, "takes no function"),
    ({"fields.sa.sequence-group": "nope"}, "'nope' is not a column"),
    ({"fields.sa.sequence-group": "k"}, "primary key"),
    ({"fields.sa.sequence-group": "sa"}, "own sequence column"),
    ({"fields.sa.sequence-group": "a_last,a_last"}, "distinct"),
    ({"fields.sa.sequence-group": ""}, "distinct names"),
    ({"fields.sa.sequence-group": "a_last", "fields.sb.sequence-group": "a_last"},
     "'a_last' is already in the group of 'fields.sa.sequence-group'"),
    ({"fields.sa.sequence-group": "a_last", "fields.sb.sequence-group": "sa"},
     "already in the group"),
    ({"fields.sa,sa.sequence-group": "a_last"}, "distinct"),
    ({"fields.sa.sequence-group": "a_last", "table.sequence-field": "sa"},
     "'sa' is a column of 'table.sequence-field'"),
    ({"fields.sa.sequence-group": "b_last", "table.sequence-field": "b_last"},
     "'b_last' is a column of 'table.sequence-field'"),
])
def test_bad_sequence_groups_are_refused(properties, message):
    s = (Schema.builder().column("k", pa.int64()).column("sa", pa.int64())
         .column("sb", pa.int64()).column("f", pa.float64())
         .agg_column("a_last", pa.string(), F.LAST_VALUE).column("b_last", pa.string())
         .agg_column("a_sum", pa.int64(), F.SUM).primary_key("k").build())
    with pytest.raises(InvalidOptionError, match=message):
        TableDescriptor(s, properties={**AGG, **properties})


def test_a_sequence_group_needs_the_aggregation_engine():
    with pytest.raises(InvalidOptionError, match="fields.sa.sequence-group.*aggregation tables"):
        TableDescriptor(Schema.builder().column("k", pa.int64()).column("sa", pa.int64())
                        .column("v", pa.string()).primary_key("k").build(),
                        properties={"fields.sa.sequence-group": "v"})


def test_a_writer_asking_for_groups_the_table_lacks_is_refused():
    d = descriptor()
    # The table's own groups, in any case and column order, pass (Spark lower-cases keys).
    check_groups_against_table(d, {"FIELDS.SA.SEQUENCE-GROUP": "a_sum,a_first,a_last",
                                   "fields.a_last.agg": "last_value"}, "t")
    for options in ({"fields.sa.sequence-group": "a_last"},
                    {"fields.sb.sequence-group": "b_last,b_seen,free"}):
        with pytest.raises(InvalidOptionError, match="does not have"):
            check_groups_against_table(d, options, "t")
    assert missing_sequence(d.sequence_groups, ["k", "free", "sa"]) is None
    assert "'sb'" in missing_sequence(d.sequence_groups, ["k", "sa", "a_last", "b_seen"])


def test_the_model_by_hand():
    """The oracle on its own: two groups, one of them with a second sequence column."""
    from merge_engine.testing import ColumnSpec, TableSpec

    spec = TableSpec((ColumnSpec("k", pa.int64(), nullable=False), ColumnSpec("s", pa.int64()),
                      ColumnSpec("t", pa.string()), ColumnSpec("v", pa.string(), F.FIRST_VALUE),
                      ColumnSpec("n", pa.int64(), F.SUM), ColumnSpec("u", pa.int64()),
                      ColumnSpec("w", pa.string())), ("k",),
                     {**AGG, "fields.s,t.sequence-group": "v,n", "fields.u.sequence-group": "w"})
    m = ReferenceTable(spec)
    m.put([{"k": 1, "s": 2, "t": "b", "v": "2b", "n": 1}], target_columns=["k", "s", "t", "v", "n"])
    m.put([{"k": 1, "s": 2, "t": "a", "v": "2a", "n": 1}], target_columns=["k", "s", "t", "v", "n"])
    m.put([{"k": 1, "u": 1, "w": "w1"}, {"k": 1, "u": 0, "w": "w0"}], target_columns=["k", "u", "w"])
    assert m.rows() == [{"k": 1, "s": 2, "t": "b", "v": "2a", "n": 2, "u": 1, "w": "w1"}]
    with pytest.raises(InvalidInputError):
        m.put([{"k": 1, "s": 3, "n": 1}], target_columns=["k", "s", "n"])  # lacks t
