"""Every function's result is independent of how the same rows fall into puts and tasks.

The same AGGREGATE rows go to fresh tablets as one put, one row per put, random splits into
puts, and random task splits pre-aggregated with `preaggregate` (each task's states sent as a
MERGE_STATE put, or all tasks' states folded once more, as the Spark sink's funnel does). Every
way must end in the reference model's table for the rows as one put, hidden state included
(written bits, contribution counts, string_agg tokens), and be rejected whenever the model
rejects the rows (the range rule judges every running total, so verdicts do not depend on
batching either).
"""

from __future__ import annotations

import tempfile
from decimal import Decimal

import pyarrow as pa
import pytest
from hypothesis import example, given, settings, strategies as st

from aggfuncs import AggFunction as F
from merge_engine import MergeMode
from merge_engine.kv.tablet import KvTablet
from merge_engine.testing import ColumnSpec, ReferenceTable, TableSpec
from merge_engine.testing.profiles import examples, load_profile
from merge_engine.testing.strategies import FUNCTION_TYPES, rows, target_columns, value_columns
from merge_engine.write.preaggregate import preaggregate
from tally.errors import TallyError

load_profile()

AGG = {"table.merge-engine": "aggregation"}
# Delimiters from few characters, and strings from the same ones: tokens often hold delimiter
# characters, and most delimiters overlap themselves.
DELIMITER_CHARACTERS = ":a|,"
STRINGS = st.text(st.sampled_from(DELIMITER_CHARACTERS + "b "), max_size=5)
STRING_AGG_DISTINCT = "string_agg-distinct-any-delimiter"


def string_agg_distinct_columns(name: str) -> st.SearchStrategy[ColumnSpec]:
    delimiters = st.text(st.sampled_from(DELIMITER_CHARACTERS), min_size=2, max_size=3)
    return delimiters.map(lambda d: ColumnSpec(name, pa.string(), F.STRING_AGG,
                                               {"delimiter": d, "distinct": True}))


@st.composite
def cases(draw, function):
    """A table whose first value column uses `function` (plus up to two random ones), one
    write's rows (possibly a partial write), and how to split them."""
    first = draw(string_agg_distinct_columns("v0") if function == STRING_AGG_DISTINCT
                 else value_columns("v0", [function]))
    others = draw(st.lists(st.sampled_from(list(FUNCTION_TYPES)), max_size=2))
    columns = [first] + [draw(value_columns(f"v{i + 1}", [f])) for i, f in enumerate(others)]
    spec = TableSpec((ColumnSpec("k", pa.int64(), nullable=False), *columns), ("k",), AGG)
    targets = draw(target_columns(spec))
    drawn = draw(rows(spec, targets, "AGGREGATE", max_size=10))
    if function == STRING_AGG_DISTINCT:
        strings = st.none() | STRINGS
        drawn = [{**r, "v0": draw(strings)} if "v0" in r else r for r in drawn]
    cuts = st.lists(st.booleans(), min_size=len(drawn) - 1, max_size=len(drawn) - 1)
    return spec, targets, drawn, draw(cuts), draw(cuts), draw(st.booleans())


def split(rows: list, cuts: list) -> list[list]:
    """`rows` cut after every position where `cuts` is true."""
    parts, current = [], []
    for row, cut in zip(rows, cuts + [False]):
        current.append(row)
        if cut:
            parts.append(current)
            current = []
    return parts + [current]


def ways(spec, targets, drawn, put_cuts, task_cuts, combine):
    """Each way of writing the rows: its name, and a function writing them into a tablet that
    returns the errors of the rejected puts."""
    descriptor = spec.descriptor()

    def puts(batches, mode=MergeMode.AGGREGATE):
        def write(tablet):
            return [e for e in (_put(tablet, rows, mode, targets) for rows in batches) if e]
        return write

    def tasks(tablet):
        try:  # pre-aggregation judges inputs as the tablet would
            states = [preaggregate(part, descriptor, targets) for part in split(drawn, task_cuts)]
            if combine:
                states = [preaggregate(pa.concat_tables(states), descriptor, targets,
                                       MergeMode.MERGE_STATE)]
        except TallyError as exc:
            return [exc]
        return puts(states, MergeMode.MERGE_STATE)(tablet)

    yield "one put", puts([drawn])
    yield "one row per put", puts([[r] for r in drawn])
    yield "random puts", puts(split(drawn, put_cuts))
    yield "tasks folded again" if combine else "task states", tasks


def _put(tablet, rows, mode, targets) -> TallyError | None:
    try:
        tablet.put(rows, mode=mode, target_columns=targets)
    except TallyError as exc:
        return exc
    return None


def check(spec, targets, drawn, put_cuts, task_cuts, combine):
    model = ReferenceTable(spec)
    try:
        model.put(drawn, target_columns=targets)
        accepted = True
    except TallyError:
        accepted = False
    for name, write in ways(spec, targets, drawn, put_cuts, task_cuts, combine):
        with tempfile.TemporaryDirectory() as d, KvTablet.open(d, spec.descriptor()) as tablet:
            rejected = write(tablet)
            where = f"{name}: {spec.columns} rows {drawn}"
            if not accepted:
                assert rejected, f"{where}: accepted rows the model rejects"
                continue
            assert not rejected, f"{where}: rejected {rejected[0]!r}"
            got = ReferenceTable(spec).replay(tablet.changelog()).states()
            want = model.states()
            assert len(got) == len(want) and all(g.same_as(w) for g, w in zip(got, want)), (
                f"{where}:\n  expected {want}\n  actual   {got}")


FUNCTIONS = list(FUNCTION_TYPES) + [STRING_AGG_DISTINCT]


@pytest.mark.parametrize("function", FUNCTIONS, ids=lambda f: getattr(f, "value", str(f)))
@settings(max_examples=examples(25))
@given(data=st.data())
def test_results_do_not_depend_on_batching(function, data):
    check(*data.draw(cases(function), label="case"))


def _case(column, values, put_cuts=None, task_cuts=None, combine=False):
    spec = TableSpec((ColumnSpec("k", pa.int64(), nullable=False), column), ("k",), AGG)
    drawn = [{"k": 1, "v0": v} for v in values]
    none = [False] * (len(drawn) - 1)
    return spec, None, drawn, put_cuts or none, task_cuts or none, combine


DISTINCT = ColumnSpec("v0", pa.string(), F.STRING_AGG, {"delimiter": "::", "distinct": True})
KNOWN = {
    "distinct tokens ending in the delimiter": _case(DISTINCT, ["a:", "", ""], task_cuts=[True, True]),
    "distinct tokens cut two ways": _case(DISTINCT, ["a:::", "a:", ""], [True, False], combine=True),
    "string_agg || kept apart": _case(ColumnSpec("v0", pa.string(), F.STRING_AGG, {"delimiter": "||"}),
                                      ["a|", "", "|b"], [True, True]),
    "int8 running total": _case(ColumnSpec("v0", pa.int8(), F.SUM), [127, 1, -1], [True, True]),
    "int8 partial beyond the type": _case(ColumnSpec("v0", pa.int8(), F.SUM), [-100, 100, 100],
                                          task_cuts=[True, False]),
    "int8 partial hides a step": _case(ColumnSpec("v0", pa.int8(), F.SUM), [28, 100, -100],
                                       task_cuts=[True, False]),
    "float sum left fold": _case(ColumnSpec("v0", pa.float64(), F.SUM), [1e16, 1.0, 1.0],
                                 task_cuts=[True, False]),
    "decimal product rounding": _case(ColumnSpec("v0", pa.decimal128(10, 2), F.PRODUCT),
                                      [Decimal("0.05"), Decimal("0.05"), Decimal("100.00")],
                                      task_cuts=[True, False]),
    "int32 product running": _case(ColumnSpec("v0", pa.int32(), F.PRODUCT), [65536, 65536, 0]),
    "bitmap ids": _case(ColumnSpec("v0", pa.binary(), F.RBM32), [3, None, 5], task_cuts=[True, False]),
}


@pytest.mark.parametrize("name", sorted(KNOWN))
def test_known_batching_faults(name):
    check(*KNOWN[name])


# --- retractions --------------------------------------------------------------------------------

RETRACTABLE = [
    ColumnSpec("v0", pa.int8(), F.SUM), ColumnSpec("v0", pa.int64(), F.SUM),
    ColumnSpec("v0", pa.float64(), F.SUM), ColumnSpec("v0", pa.decimal128(5, 2), F.SUM),
    ColumnSpec("v0", pa.int64(), F.COUNT), ColumnSpec("v0", pa.int16(), F.PRODUCT),
    ColumnSpec("v0", pa.list_(pa.int64()), F.ARRAY_AGG, {"distinct": True}),
    ColumnSpec("v0", pa.list_(pa.int64()), F.ARRAY_AGG),
    ColumnSpec("v0", pa.string(), F.LAST_VALUE), ColumnSpec("v0", pa.string(), F.LAST_VALUE_IGNORE_NULLS),
]


@st.composite
def retraction_cases(draw):
    """One column, and a CDC-like stream: -D rows take back a value an earlier row brought."""
    if draw(st.booleans()):
        column = draw(st.sampled_from(RETRACTABLE))
    else:
        delimiter = draw(st.text(st.sampled_from(DELIMITER_CHARACTERS), min_size=1, max_size=3))
        column = ColumnSpec("v0", pa.string(), F.STRING_AGG,
                            {"delimiter": delimiter, "distinct": draw(st.booleans())})
    values = {
        F.SUM: st.integers(-120, 120), F.COUNT: st.integers(0, 3), F.PRODUCT: st.integers(-4, 4),
        F.ARRAY_AGG: st.integers(0, 3), F.STRING_AGG: STRINGS,
    }.get(column.function, st.sampled_from(["x", "y"]))
    held: dict[int, list] = {}
    drawn = []
    for _ in range(draw(st.integers(1, 10))):
        k = draw(st.integers(1, 2))
        if held.get(k) and draw(st.integers(0, 2)) == 0:
            value = held[k].pop(draw(st.integers(0, len(held[k]) - 1)))
            change = "-D"
        else:
            value, change = draw(st.none() | values), "+I"
            if value is not None:
                held.setdefault(k, []).append(value)
        if pa.types.is_decimal(column.type) and value is not None:
            value = Decimal(value) / 100
        drawn.append({"k": k, "v0": value, "_change_type": change})
    cuts = st.lists(st.booleans(), min_size=len(drawn) - 1, max_size=len(drawn) - 1)
    spec = TableSpec((ColumnSpec("k", pa.int64(), nullable=False), column), ("k",), AGG)
    return spec, drawn, draw(cuts), draw(cuts), draw(st.booleans())


def _stream(column, *rows):
    spec = TableSpec((ColumnSpec("k", pa.int64(), nullable=False), column), ("k",), AGG)
    drawn = [{"k": 1, "v0": v, "_change_type": c} for v, c in rows]
    none = [False] * (len(drawn) - 1)
    return spec, drawn, none, none, False


@settings(max_examples=examples(60))
@given(case=retraction_cases())
@example(case=_stream(ColumnSpec("v0", pa.string(), F.STRING_AGG, {"delimiter": "::"}),
                      ("a:", "+I"), ("", "+I"), ("", "-D")))
@example(case=_stream(ColumnSpec("v0", pa.int8(), F.SUM), (100, "+I"), (100, "+I"), (100, "-D")))
def test_retractions_do_not_depend_on_batching(case):
    spec, drawn, put_cuts, task_cuts, combine = case
    outcomes = {}
    for name, write in ways(spec, None, drawn, put_cuts, task_cuts, combine):
        with tempfile.TemporaryDirectory() as d, KvTablet.open(d, spec.descriptor()) as tablet:
            rejected = write(tablet)
            outcomes[name] = (bool(rejected),
                              None if rejected else ReferenceTable(spec).replay(tablet.changelog()).states())
    reference = outcomes.pop("one row per put")
    for name, (rejected, states) in outcomes.items():
        assert rejected == reference[0], f"{name}: rejected {rejected}, row by row {reference[0]}"
        if not rejected:
            assert len(states) == len(reference[1]) and all(
                a.same_as(b) for a, b in zip(states, reference[1])), (
                f"{name}:\n  row by row {reference[1]}\n  this way   {states}")
