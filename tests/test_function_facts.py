"""What each function is, read from its aggregator class, agrees with what it does.

Recovery, the Spark sink and the table descriptor read these facts from the class; here each
fact is held against the function's behaviour on real values: a replay-idempotent function
folds a replayed batch to the state it had, an estimated one is a sketch read as an estimate,
a value-selecting one picks an input, its input rules are what the engine takes.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, strategies as st

from aggfuncs import (AGGREGATORS, AggFunction, aggregator_class, bitmap_ids, hll_sketch_estimate,
                      kll_sketch_quantile, make_aggregator, theta_sketch_estimate, top_k_items)
from aggfuncs.segments import Segments
from aggfuncs.arg_select import ArgSelectAggregator
from aggfuncs.sketches import SketchAggregator
from merge_engine import MergeMode, Schema, TableDescriptor
from merge_engine.testing.profiles import load_profile
from merge_engine.write.input import prepare_write
from recovery import undo_can_be_skipped
from sink.types import widens
from tally.errors import InvalidOptionError

load_profile()

# A column type each function takes.
TYPES = {
    AggFunction.STRING_AGG: pa.string(),
    AggFunction.ARRAY_AGG: pa.list_(pa.int64()),
    AggFunction.BOOL_AND: pa.bool_(),
    AggFunction.BOOL_OR: pa.bool_(),
    AggFunction.RBM32: pa.binary(),
    AggFunction.RBM64: pa.binary(),
    AggFunction.HLL_SKETCH: pa.binary(),
    AggFunction.THETA_SKETCH: pa.binary(),
    AggFunction.KLL_SKETCH: pa.binary(),
    AggFunction.MERGE_MAP: pa.map_(pa.string(), pa.int64()),
    AggFunction.AVG: pa.float64(),
    AggFunction.SUM_MAP: pa.map_(pa.string(), pa.int64()),
    AggFunction.TOP_K: pa.binary(),
    AggFunction.NESTED_UPDATE: pa.list_(pa.struct([("id", pa.int64()), ("v", pa.string())])),
}
# Parameters a function needs: arg_max/arg_min are ordered by an int64 column 'o'.
PARAMS = {AggFunction.ARG_MAX: {"by": "o"}, AggFunction.ARG_MIN: {"by": "o"},
          AggFunction.NESTED_UPDATE: {"nested-key": "id"}}
FUNCTIONS = list(AggFunction)
# Raw inputs of the functions that take no integers (the others take [1, None, 2]).
SAMPLES = {
    AggFunction.STRING_AGG: pa.array(["a", None, "b"]),
    AggFunction.BOOL_AND: pa.array([True, None, False]),
    AggFunction.BOOL_OR: pa.array([True, None, False]),
    AggFunction.MERGE_MAP: pa.array([[("a", 1)], None, [("b", 2)]],
                                    type=pa.map_(pa.string(), pa.int64())),
    AggFunction.SUM_MAP: pa.array([[("a", 1)], None, [("b", 2)]],
                                  type=pa.map_(pa.string(), pa.int64())),
    AggFunction.NESTED_UPDATE: pa.array([[{"id": 1, "v": "a"}], None, [{"id": 1, "v": "b"}]],
                                        type=pa.list_(pa.struct([("id", pa.int64()),
                                                                 ("v", pa.string())]))),
}
ESTIMATES = {AggFunction.HLL_SKETCH: hll_sketch_estimate,
             AggFunction.THETA_SKETCH: theta_sketch_estimate,
             AggFunction.KLL_SKETCH: lambda image: kll_sketch_quantile(image, 1.0),
             # The items a read of the top 1000 finds: each of range(100) once.
             AggFunction.TOP_K: lambda image: len(top_k_items(image, 1000))}


def column_type(function: AggFunction) -> pa.DataType:
    return TYPES.get(function, pa.int64())


def aggregator(function: AggFunction):
    agg = make_aggregator(function, "c", column_type(function), PARAMS.get(function))
    return agg.bind(pa.int64()) if isinstance(agg, ArgSelectAggregator) else agg


def with_inputs(agg, values: pa.Array) -> pa.Array:
    """Raw values as the merger hands them to the function: an arg_max/arg_min column's
    with each row's ordering value attached (here the value itself, as int64 where it is one)."""
    if not isinstance(agg, ArgSelectAggregator):
        return values
    order = values if pa.types.is_integer(values.type) else pa.array(range(len(values)))
    return agg.attach(values, order.cast(pa.int64()))


def values_of(function: AggFunction):
    """Raw input values for a function whose facts are checked on real values."""
    if column_type(function) == pa.bool_():
        return st.lists(st.none() | st.booleans(), min_size=1, max_size=12)
    return st.lists(st.none() | st.integers(-1000, 1000), min_size=1, max_size=12)


def states_of(agg, values: list) -> pa.Array:
    return agg.to_state(with_inputs(agg, agg.cast_input(pa.array(values, type=agg.type))))


def fold_onto(agg, stored: pa.Array, stored_written: bool, batch: pa.Array) -> pa.Array:
    """The one cell `stored` after `batch` is folded onto it (all of the batch written)."""
    states = pa.concat_arrays([stored, batch.cast(stored.type)])
    written = np.concatenate([[stored_written], np.ones(len(batch), dtype=bool)])
    return agg.fold(states, written, Segments(np.zeros(len(states), dtype=np.int64), 1))


# --- the registry ------------------------------------------------------------------------------


@pytest.mark.parametrize("function", FUNCTIONS, ids=lambda f: f.value)
def test_every_function_has_its_class(function):
    cls = aggregator_class(function)
    assert cls.function is function and AGGREGATORS[function] is cls
    assert type(aggregator(function)) is cls
    assert aggregator_class(function.value.upper()) is cls


@pytest.mark.parametrize("function", FUNCTIONS, ids=lambda f: f.value)
def test_the_state_type_is_what_folds_make(function):
    agg = aggregator(function)
    assert agg.empty(3).type == agg.state_type
    inputs = SAMPLES.get(function, pa.array([1, None, 2]))
    folded = fold_onto(agg, agg.empty(1), False,
                       agg.to_state(with_inputs(agg, agg.cast_input(inputs))))
    assert folded.type == agg.state_type


# --- replay ------------------------------------------------------------------------------------

IDEMPOTENT = [f for f in FUNCTIONS if aggregator_class(f).replay_idempotent]


@pytest.mark.parametrize("function", IDEMPOTENT, ids=lambda f: f.value)
@given(data=st.data())
def test_a_replayed_batch_leaves_the_state_as_it_was(function, data):
    agg = aggregator(function)
    earlier = data.draw(values_of(function))
    batch = states_of(agg, data.draw(values_of(function)))
    stored = fold_onto(agg, agg.empty(1), False, states_of(agg, earlier))
    once = fold_onto(agg, stored, True, batch)
    assert fold_onto(agg, once, True, batch).to_pylist() == once.to_pylist()


def test_idempotence_is_not_assumed_of_a_sum():
    agg = aggregator(AggFunction.SUM)
    once = fold_onto(agg, agg.empty(1), False, states_of(agg, [5]))
    assert fold_onto(agg, once, True, states_of(agg, [5])).to_pylist() != once.to_pylist()
    assert not aggregator_class(AggFunction.SUM).replay_idempotent


@pytest.mark.parametrize("function", FUNCTIONS, ids=lambda f: f.value)
def test_recovery_skips_undo_exactly_for_replay_idempotent_columns(function):
    schema = (Schema.builder().column("k", pa.int64()).agg_column("o", pa.int64(), "max")
              .agg_column("c", column_type(function), function, **PARAMS.get(function, {}))
              .primary_key("k").build())
    skipped = undo_can_be_skipped(schema, None, writer_deletes=False)
    assert (skipped is not None) == (function in IDEMPOTENT)
    assert undo_can_be_skipped(schema, None, writer_deletes=True) is None


# --- estimates ---------------------------------------------------------------------------------


@pytest.mark.parametrize("function", FUNCTIONS, ids=lambda f: f.value)
def test_estimated_functions_are_the_sketches(function):
    assert aggregator_class(function).estimated == issubclass(aggregator_class(function),
                                                              SketchAggregator)
    assert aggregator(function).estimated == aggregator_class(function).estimated


@pytest.mark.parametrize("function", [f for f in FUNCTIONS if aggregator_class(f).estimated],
                         ids=lambda f: f.value)
def test_an_estimated_state_reads_as_an_estimate(function):
    agg = aggregator(function)
    folded = fold_onto(agg, agg.empty(1), False, agg.to_state(pa.array(range(100))))
    estimate = ESTIMATES[function](folded[0].as_py())
    assert estimate == pytest.approx(100 if function is not AggFunction.KLL_SKETCH else 99,
                                     rel=0.05)


# --- value selection and sequence fields --------------------------------------------------------

SELECTING = [f for f in FUNCTIONS if aggregator_class(f).selects_value]


@pytest.mark.parametrize("function", SELECTING, ids=lambda f: f.value)
@given(data=st.data())
def test_a_selecting_function_picks_a_written_value(function, data):
    agg = aggregator(function)
    values = data.draw(values_of(function))
    folded = fold_onto(agg, agg.empty(1), False, states_of(agg, values)).to_pylist()[0]
    assert folded is None or folded in values
    if agg.keeps_latest and values[-1] is not None:
        assert folded == values[-1]


@pytest.mark.parametrize("function", FUNCTIONS, ids=lambda f: f.value)
def test_a_sequence_field_orders_exactly_the_selecting_functions(function):
    schema = (Schema.builder().column("k", pa.int64()).column("ts", pa.int64())
              .agg_column("c", column_type(function), function, **PARAMS.get(function, {}))
              .column("o", pa.int64()).primary_key("k").build())
    properties = {"table.merge-engine": "aggregation", "table.sequence-field": "ts"}
    column = TableDescriptor(schema, properties=properties).aggregators()[2]
    assert column.sequenced == aggregator_class(function).selects_value
    assert column.replay_idempotent == aggregator_class(function).replay_idempotent


@pytest.mark.parametrize("function", FUNCTIONS, ids=lambda f: f.value)
def test_a_sequence_column_declares_only_a_latest_value_function(function):
    schema = (Schema.builder().column("k", pa.int64()).column("o", pa.int64())
              .agg_column("ts", column_type(function), function, **PARAMS.get(function, {}))
              .primary_key("k").build())
    properties = {"table.merge-engine": "aggregation", "table.sequence-field": "ts"}
    if aggregator_class(function).keeps_latest:
        assert TableDescriptor(schema, properties=properties).sequence_fields == ("ts",)
    else:
        with pytest.raises(InvalidOptionError):
            TableDescriptor(schema, properties=properties)


# --- input rules -------------------------------------------------------------------------------

SOURCES = {
    pa.int32(): [1, None, 2],
    pa.int64(): [3, None, 4],
    pa.float64(): [1.5, None],
    pa.string(): ["a", None, "b"],
    pa.bool_(): [True, None],
    pa.list_(pa.int64()): [[1, 2], None],
    pa.null(): [None, None],
}


@pytest.mark.parametrize("function", FUNCTIONS, ids=lambda f: f.value)
@pytest.mark.parametrize("mode", [MergeMode.AGGREGATE, MergeMode.MERGE_STATE],
                         ids=lambda m: m.name)
def test_a_type_the_function_takes_up_front_is_one_the_engine_takes(function, mode):
    agg = aggregator(function)
    for source, values in SOURCES.items():
        if agg.takes_type(source, widens, states=mode is MergeMode.MERGE_STATE):
            inputs = with_inputs(agg, agg.cast_input(pa.array(values, type=source)))
            states = agg.to_state(inputs) if mode is MergeMode.AGGREGATE \
                else agg.from_merge_state(inputs)
            assert len(states) == len(values)


def python_write(function: AggFunction, values: list, **params):
    schema = (Schema.builder().column("k", pa.int64())
              .agg_column("c", column_type(function), function, **params)
              .primary_key("k").build())
    aggregators = schema.aggregators(True)
    write = prepare_write([{"k": i, "c": v} for i, v in enumerate(values)], schema, aggregators)
    agg = aggregators[1]
    return agg, fold_onto(agg, agg.empty(1), False, agg.to_state(write.columns["c"]))


def test_count_counts_python_values_no_column_type_holds():
    _, folded = python_write(AggFunction.COUNT, [{"x": 1}, None, "text", object()])
    assert folded.to_pylist() == [3]


@pytest.mark.parametrize("function", [AggFunction.RBM32, AggFunction.RBM64],
                         ids=lambda f: f.value)
def test_a_bitmap_column_takes_python_ids(function):
    _, folded = python_write(function, [7, None, 3, 7])
    assert bitmap_ids(folded[0].as_py(), 32 if function is AggFunction.RBM32 else 64) == [3, 7]


@pytest.mark.parametrize("function", [f for f in FUNCTIONS if aggregator_class(f).estimated],
                         ids=lambda f: f.value)
def test_a_sketch_column_takes_python_raw_values(function):
    _, folded = python_write(function, list(range(100)))
    assert ESTIMATES[function](folded[0].as_py()) == pytest.approx(
        100 if function is not AggFunction.KLL_SKETCH else 99, rel=0.05)


def test_a_string_agg_column_takes_python_token_lists():
    agg, folded = python_write(AggFunction.STRING_AGG, [["a", "b"], "c;d", None],
                               delimiter=";")
    assert agg.values(folded).to_pylist() == ["a;b;c;d"]


def test_an_array_agg_column_takes_single_python_elements():
    _, folded = python_write(AggFunction.ARRAY_AGG, [1, [2, 3], None])
    assert folded.to_pylist() == [[1, 2, 3]]
