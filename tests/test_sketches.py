"""hll_sketch, theta_sketch, kll_sketch on a real tablet: inputs, parameters, mismatches,
canonical bytes, refused retractions, undo, and every write path against the reference model."""

from __future__ import annotations

import random

import datasketches as ds
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from aggfuncs import (AggFunction as F, build_hll_sketch, build_kll_sketch, build_sketch,
                      build_theta_sketch, hll_sketch_estimate, kll_sketch_quantile, kll_sketch_rank,
                      theta_sketch_estimate)
from merge_engine import MergeMode, Schema, TableDescriptor
from merge_engine.kv.tablet import KvTablet
from merge_engine.testing import ColumnSpec, TableSpec
from merge_engine.testing.harness import TabletHarness
from merge_engine.testing.profiles import examples, load_profile
from merge_engine.testing.strategies import single_column_specs, table_specs, write_sequences
from recovery import undo_bucket
from tally.errors import InvalidAggFunctionError, InvalidInputError, RetractionError

load_profile()

AGG = {"table.merge-engine": "aggregation", "table.delete.behavior": "allow"}
SKETCHES = (F.HLL_SKETCH, F.THETA_SKETCH, F.KLL_SKETCH)


def sketch_table(path, **params_by_column):
    builder = Schema.builder().column("k", pa.int64())
    columns = {"h": ("hll_sketch", {}), "t": ("theta_sketch", {}), "q": ("kll_sketch", {}),
               "qi": ("kll_sketch", {"items": "bigint"})}
    for name, (function, params) in columns.items():
        builder = builder.agg_column(name, pa.binary(), function,
                                     **{**params, **params_by_column.get(name, {})})
    return KvTablet.open(str(path), TableDescriptor(builder.primary_key("k").build(), properties=AGG))


def test_raw_values_and_images_merge_into_one_sketch(tmp_path):
    with sketch_table(tmp_path) as t:
        t.put([{"k": 1, "h": v, "t": v, "q": v, "qi": v} for v in range(100)])  # each row adds itself
        t.put([{"k": 1, "h": build_hll_sketch(range(50, 150)), "t": build_theta_sketch(range(50, 150)),
                "q": build_kll_sketch(range(100, 200)),
                "qi": build_kll_sketch(range(100, 150), items="bigint")}])
        t.put(pa.table({"k": [1, 1], "h": ["a", "a"], "t": ["a", None]}), target_columns=["k", "h", "t"])
        row = t.lookup({"k": 1})
        assert hll_sketch_estimate(row["h"]) == 151 and theta_sketch_estimate(row["t"]) == 151
        assert kll_sketch_quantile(row["q"], 0.0) == 0.0 and kll_sketch_quantile(row["q"], 1.0) == 199.0
        assert kll_sketch_rank(row["qi"], 99, items="bigint") == 100 / 150  # exact below k items
        assert isinstance(kll_sketch_quantile(row["qi"], 0.5, items="bigint"), int)


def test_a_null_leaves_the_image_byte_for_byte_and_logs_nothing(tmp_path):
    with sketch_table(tmp_path) as t:
        t.put([{"k": 1, "h": 5, "t": 5, "q": 5.5, "qi": 5}])
        before, end = t.lookup({"k": 1}), t.log_end_offset
        t.put([{"k": 1, "h": None, "t": None, "q": None, "qi": None}])
        assert t.lookup({"k": 1}) == before and t.log_end_offset == end


def test_a_write_that_adds_nothing_new_changes_no_byte(tmp_path):
    # Canonical images: the same content gives the same bytes, so no changelog entry.
    with sketch_table(tmp_path) as t:
        t.put([{"k": 1, "h": v, "t": v} for v in range(3000)], target_columns=["k", "h", "t"])
        before, end = t.lookup({"k": 1}), t.log_end_offset
        t.put([{"k": 1, "h": build_hll_sketch(range(10)), "t": 7}], target_columns=["k", "h", "t"])
        assert t.lookup({"k": 1}) == before and t.log_end_offset == end


@settings(max_examples=examples(40), deadline=None)
@given(values=st.lists(st.integers(0, 5000), min_size=1, max_size=300),
       function=st.sampled_from(SKETCHES), lg_k=st.sampled_from([5, 8, 12]), seed=st.integers(0, 99))
def test_merges_give_the_same_bytes_in_any_grouping_and_order(values, function, lg_k, seed):
    """Associativity and commutativity of the stored state: any split of the values into
    sketches, merged in any order and any grouping, stores the same image (KLL: while it is in
    exact mode; its compactions draw random bits)."""
    params = {"k": 400} if function is F.KLL_SKETCH else {"lg-k": lg_k}
    if function is F.KLL_SKETCH:
        values = values[:400]
    agg = TableSpec((ColumnSpec("k", pa.int64(), nullable=False), ColumnSpec("v", pa.binary(), function, params)),
                    ("k",), AGG).schema().aggregators(True)[1]
    rng = random.Random(seed)
    cuts = sorted(rng.sample(range(1, len(values)), min(len(values) - 1, rng.randint(0, 12))))
    chunks = [values[a:b] for a, b in zip([0, *cuts], [*cuts, len(values)])]
    images = [build_sketch(function, c, params) for c in chunks]
    whole = agg.merge([agg.load(i) for i in images])
    rng.shuffle(images)
    cut = rng.randint(0, len(images))
    left = agg.merge([agg.load(i) for i in images[:cut]])
    right = agg.merge([agg.load(i) for i in images[cut:]])
    assert agg.merge([agg.load(right), agg.load(left)]) == whole
    assert build_sketch(function, values, params) == whole


def test_parameters_by_builder_and_by_options(tmp_path):
    schema = pa.schema([("k", pa.int64()), ("h", pa.binary()), ("q", pa.binary())])
    options = {**AGG, "fields.h.agg": "hll_sketch", "fields.h.hll_sketch.lg_k": "10",
               "fields.h.hll_sketch.target-type": "hll_8",
               "fields.q.agg": "kll_sketch", "fields.q.kll_sketch.k": "64",
               "fields.q.kll_sketch.items": "bigint"}
    d = TableDescriptor.from_options(schema, ["k"], options=options)
    assert d.schema.column("h").params == {"lg-k": 10, "target-type": "HLL_8"}
    with KvTablet.open(str(tmp_path), d) as t:
        t.put([{"k": 1, "h": 1, "q": 1}])
        image = t.lookup({"k": 1})
        assert ds.hll_sketch.deserialize(image["h"]).lg_config_k == 10
        assert ds.hll_sketch.deserialize(image["h"]).tgt_type == ds.tgt_hll_type.HLL_8
        assert ds.kll_items_sketch.deserialize(image["q"], ds.PyLongsSerDe()).k == 64


@pytest.mark.parametrize("function, params, message", [
    ("hll_sketch", {"lg_k": 3}, r"'lg-k' must be an integer in \[4, 21\]"),
    ("hll_sketch", {"target_type": "HLL_5"}, r"'target-type' must be one of"),
    ("theta_sketch", {"lg_k": "x"}, r"'lg-k' must be an integer in \[5, 26\]"),
    ("kll_sketch", {"k": 7}, r"'k' must be an integer in \[8, 65535\]"),
    ("kll_sketch", {"items": "long"}, r"'items' must be one of \['DOUBLE', 'FLOAT', 'BIGINT'\]"),
    ("kll_sketch", {"delimiter": ","}, r"Parameter 'delimiter' is not supported .* 'kll_sketch'"),
])
def test_bad_parameters_are_refused_by_name(function, params, message):
    with pytest.raises(InvalidAggFunctionError, match=message):
        Schema.builder().column("k", pa.int64()).agg_column("v", pa.binary(), function, **params) \
            .primary_key("k").build()


def test_sketches_need_a_binary_column():
    with pytest.raises(InvalidAggFunctionError, match=r"theta_sketch column 'v' must be one of \[binary"):
        Schema.builder().column("k", pa.int64()).agg_column("v", pa.int64(), "theta_sketch") \
            .primary_key("k").build()


def test_bad_input_is_refused_naming_the_column_and_nothing_is_applied(tmp_path):
    with sketch_table(tmp_path) as t:
        t.put([{"k": 1, "h": 1}], target_columns=["k", "h"])
        end = t.log_end_offset
        with pytest.raises(InvalidInputError, match=r"Column 'h' \(hll_sketch\) got 7 bytes that are not an HLL"):
            t.put([{"k": 2, "h": 2}, {"k": 1, "h": b"garbage"}], target_columns=["k", "h"])
        with pytest.raises(InvalidInputError, match=r"Column 't' \(theta_sketch\) got .* not a compact theta"):
            t.put([{"k": 2, "t": build_hll_sketch([1])}], target_columns=["k", "t"])
        with pytest.raises(InvalidInputError, match=r"Column 'q' \(kll_sketch\) takes sketch images"):
            t.put([{"k": 2, "q": "text"}], target_columns=["k", "q"])
        with pytest.raises(InvalidInputError, match=r"Column 'h' \(hll_sketch\) got .* not an HLL"):
            t.put([{"k": 2, "h": b"\x00" * 8}], target_columns=["k", "h"], mode=MergeMode.OVERWRITE)
        assert t.log_end_offset == end and t.lookup({"k": 2}) is None


def test_another_seed_is_refused_as_datasketches_refuses_it(tmp_path):
    other = ds.update_theta_sketch(12, 1.0, 42)
    other.update(1)
    with sketch_table(tmp_path) as t:
        with pytest.raises(InvalidInputError, match="Column 't' .*theta"):
            t.put([{"k": 1, "t": other.compact().serialize()}], target_columns=["k", "t"])


@pytest.mark.parametrize("column", ["h", "t", "q"])
def test_retraction_is_refused_naming_the_function(tmp_path, column):
    function = {"h": "hll_sketch", "t": "theta_sketch", "q": "kll_sketch"}[column]
    with sketch_table(tmp_path) as t:
        t.put([{"k": 1, column: 1}], target_columns=["k", column])
        with pytest.raises(RetractionError, match=rf"Column '{column}' \({function}\) cannot take back"):
            t.put([{"k": 1, column: 1, "_change_type": "-U"}], target_columns=["k", column])


def test_ignore_retract_skips_retractions(tmp_path):
    with sketch_table(tmp_path, h={"ignore_retract": True}) as t:
        t.put([{"k": 1, "h": 1}, {"k": 1, "h": 2, "_change_type": "-D"}], target_columns=["k", "h"])
        assert hll_sketch_estimate(t.lookup({"k": 1})["h"]) == 1


def test_mismatched_parameters_follow_datasketches(tmp_path):
    with sketch_table(tmp_path, t={"lg_k": 5}) as t:
        # HLL: a union keeps the smaller lg_k of what it merges.
        t.put([{"k": 1, "h": build_hll_sketch(range(100), lg_k=12)}], target_columns=["k", "h"])
        t.put([{"k": 1, "h": build_hll_sketch(range(100, 200), lg_k=8)}], target_columns=["k", "h"])
        image = ds.hll_sketch.deserialize(t.lookup({"k": 1})["h"])
        assert image.lg_config_k == 8 and 150 < image.get_estimate() < 250
        # Theta: a larger sketch is cut down to the column's nominal entries (2^5).
        t.put([{"k": 1, "t": build_theta_sketch(range(1000), lg_k=12)}], target_columns=["k", "t"])
        theta = ds.compact_theta_sketch.deserialize(t.lookup({"k": 1})["t"])
        assert theta.num_retained <= 32 and theta.is_estimation_mode()
        # KLL: the merge keeps the stored k; its error follows the smallest k it met.
        t.put([{"k": 1, "q": build_kll_sketch(range(1000), k=16)}], target_columns=["k", "q"])
        kll = ds.kll_doubles_sketch.deserialize(t.lookup({"k": 1})["q"])
        assert kll.k == 200 and kll.n == 1000
        assert kll.normalized_rank_error(False) == ds.kll_doubles_sketch.get_normalized_rank_error(16, False)


def test_undo_writes_the_before_images_back(tmp_path):
    with sketch_table(tmp_path) as t:
        t.put([{"k": 1, "h": v, "t": v, "q": v, "qi": v} for v in range(10)])
        baseline, before = t.log_end_offset, t.lookup({"k": 1})
        t.put([{"k": 1, "h": v, "t": v, "q": v, "qi": v} for v in range(10, 500)])
        t.put([{"k": 2, "h": 1}], target_columns=["k", "h"])
        assert t.lookup({"k": 1}) != before
        undo_bucket(t, baseline)
        assert t.lookup({"k": 1}) == before and t.lookup({"k": 2}) is None


@settings(max_examples=examples(60), deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(data=st.data())
def test_every_mode_against_the_reference_model(tmp_path_factory, data):
    """AGGREGATE, MERGE_STATE and OVERWRITE puts, deletes and reopens on tables of sketch
    columns: the tablet and the model agree on rows, images and the changelog."""
    spec = data.draw(table_specs(aggregation=True, functions=SKETCHES, max_value_columns=3))
    with TabletHarness(spec, tmp_path_factory.mktemp("sketch")) as h:
        for op in data.draw(write_sequences(spec)):
            h.apply(op)


@settings(max_examples=examples(30), deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(data=st.data())
def test_one_column_sequences_against_the_reference_model(tmp_path_factory, data):
    function = data.draw(st.sampled_from(SKETCHES))
    spec = data.draw(single_column_specs(function))
    with TabletHarness(spec, tmp_path_factory.mktemp("one")) as h:
        for op in data.draw(write_sequences(spec)):
            h.apply(op)
