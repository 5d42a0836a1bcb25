"""top_k on a real tablet: raw items and images, exact counts below the sketch's capacity,
DataSketches' bounds beyond it, canonical bytes, parameters, bad input, refused retractions,
undo, reads as estimates, and every write path against the reference model."""

from __future__ import annotations

import random
from collections import Counter

import datasketches as ds
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from aggfuncs import AggFunction as F, build_hll_sketch, build_top_k_sketch, top_k_items
from merge_engine import MergeMode, Schema, TableDescriptor
from merge_engine.kv.tablet import KvTablet
from merge_engine.testing.harness import TabletHarness
from merge_engine.testing.profiles import examples, load_profile
from merge_engine.testing.strategies import single_column_specs, table_specs, write_sequences
from recovery import undo_bucket
from tally.errors import InvalidAggFunctionError, InvalidInputError, RetractionError

load_profile()

AGG = {"table.merge-engine": "aggregation", "table.delete.behavior": "allow"}


def top_k_table(path, **params):
    schema = (Schema.builder().column("k", pa.int64())
              .agg_column("t", pa.binary(), "top_k", **params).primary_key("k").build())
    return KvTablet.open(str(path), TableDescriptor(schema, properties=AGG))


def counts_of(image) -> dict:
    """Every item a stored sketch holds, with its estimate and bounds."""
    sketch = ds.frequent_strings_sketch.deserialize(image)
    found = sketch.get_frequent_items(ds.frequent_items_error_type.NO_FALSE_NEGATIVES)
    return {item: (estimate, lower, upper) for item, estimate, lower, upper in found}


def test_raw_strings_integers_and_images_count_into_one_sketch(tmp_path):
    with top_k_table(tmp_path, k=3) as t:
        t.put([{"k": 1, "t": v} for v in ["a", "b", "a", 7, None]])
        t.put([{"k": 1, "t": build_top_k_sketch(["7", "c", "a"])}])
        t.put(pa.table({"k": [1, 1], "t": pa.array([7, 8], pa.int32())}))  # integer column
        image = t.lookup({"k": 1})["t"]
        # 7 and "7" are one item: integers count as their decimal strings.
        assert top_k_items(image, 3) == [
            {"item": "7", "estimate": 3, "lower_bound": 3, "upper_bound": 3},
            {"item": "a", "estimate": 3, "lower_bound": 3, "upper_bound": 3},
            {"item": "8", "estimate": 1, "lower_bound": 1, "upper_bound": 1}]
        assert len(top_k_items(image, 10)) == 5


def test_a_null_leaves_the_image_byte_for_byte_and_logs_nothing(tmp_path):
    with top_k_table(tmp_path) as t:
        t.put([{"k": 1, "t": "a"}])
        before, end = t.lookup({"k": 1}), t.log_end_offset
        t.put([{"k": 1, "t": None}])
        assert t.lookup({"k": 1}) == before and t.log_end_offset == end


@settings(max_examples=examples(40), deadline=None)
@given(items=st.lists(st.sampled_from([str(i) for i in range(24)]), min_size=1, max_size=200),
       lg=st.sampled_from([5, 6]), seed=st.integers(0, 99))
def test_below_capacity_the_counts_are_exact_in_any_grouping(items, lg, seed):
    """24 distinct items fit 0.75 * 2^5: every estimate is the exact count, its bounds equal
    it, and any split into images merged in any order stores the same bytes."""
    schema = (Schema.builder().column("k", pa.int64())
              .agg_column("t", pa.binary(), "top_k", lg_max_map_size=lg).primary_key("k").build())
    agg = schema.aggregators(True)[1]
    rng = random.Random(seed)
    cuts = sorted(rng.sample(range(1, len(items)), min(len(items) - 1, rng.randint(0, 12))))
    images = [build_top_k_sketch(items[a:b], lg) for a, b in zip([0, *cuts], [*cuts, len(items)])]
    whole = agg.merge([agg.load(i) for i in images])
    rng.shuffle(images)
    cut = rng.randint(0, len(images))
    left, right = (agg.merge([agg.load(i) for i in part]) for part in (images[:cut], images[cut:]))
    assert agg.merge([agg.load(right), agg.load(left)]) == whole == build_top_k_sketch(items, lg)
    exact = Counter(items)
    assert counts_of(whole) == {item: (n, n, n) for item, n in exact.items()}


@settings(max_examples=examples(25), deadline=None)
@given(seed=st.integers(0, 10_000), lg=st.sampled_from([3, 4, 6]), skew=st.sampled_from([1.0, 1.5]))
def test_past_capacity_every_count_lies_within_the_sketch_bounds(tmp_path_factory, seed, lg, skew):
    """Many more distinct items than the sketch holds, written in puts of raw items and images:
    for every item, lower bound <= true count <= upper bound; the bounds lie at most
    epsilon * (total weight) apart; no item more frequent than that is missed; the top k are
    the highest estimates."""
    rng = random.Random(seed)
    # Heavy hitters (Pareto-distributed) among many items seen a few times each.
    stream = [str(int(rng.paretovariate(skew))) if rng.random() < 0.7 else f"u{rng.randrange(2000)}"
              for _ in range(3000)]
    exact = Counter(stream)
    assert len(exact) > 0.75 * 2 ** lg  # past the exact mode
    with top_k_table(tmp_path_factory.mktemp("bounds"), k=5, lg_max_map_size=lg) as t:
        for start in range(0, len(stream), 500):
            chunk = stream[start:start + 500]
            if start % 1000:
                t.put([{"k": 1, "t": build_top_k_sketch(chunk, lg)}], mode=MergeMode.MERGE_STATE)
            else:
                t.put([{"k": 1, "t": item} for item in chunk])
        image = t.lookup({"k": 1})["t"]
    sketch = ds.frequent_strings_sketch.deserialize(image)
    assert sketch.total_weight == len(stream)
    epsilon = ds.frequent_strings_sketch.get_epsilon_for_lg_size(lg)
    assert 0 < sketch.get_upper_bound("no such item") <= epsilon * len(stream)
    held = counts_of(image)
    for item, true_count in exact.items():
        assert sketch.get_lower_bound(item) <= true_count <= sketch.get_upper_bound(item)
        assert sketch.get_upper_bound(item) - sketch.get_lower_bound(item) <= epsilon * len(stream)
        if true_count > epsilon * len(stream):
            assert item in held
    top = top_k_items(image, 5)
    assert [entry["estimate"] for entry in top] == sorted(e for e, _, _ in held.values())[::-1][:5]


def test_parameters_by_builder_and_by_options(tmp_path):
    options = {**AGG, "fields.t.agg": "top_k", "fields.t.top_k.k": "2",
               "fields.t.top_k.lg-max-map-size": "4"}
    d = TableDescriptor.from_options(pa.schema([("k", pa.int64()), ("t", pa.binary())]), ["k"],
                                     options=options)
    assert d.schema.column("t").params == {"k": 2, "lg-max-map-size": 4}
    assert TableDescriptor.from_json(d.to_json()) == d
    with KvTablet.open(str(tmp_path), d) as t:
        t.put([{"k": 1, "t": v} for v in "abcabcc"])
        image = t.lookup({"k": 1})["t"]
    assert image[3] == 4  # lg max map size in the preamble
    assert [e["item"] for e in top_k_items(image, 2)] == ["c", "a"]


@pytest.mark.parametrize("params, message", [
    ({"k": 0}, r"'k' must be an integer in \[1, 65535\]"),
    ({"k": "ten"}, r"'k' must be an integer in \[1, 65535\]"),
    ({"lg_max_map_size": 2}, r"'lg-max-map-size' must be an integer in \[3, 21\]"),
    ({"lg_k": 10}, r"Parameter 'lg_k' is not supported .* 'top_k'"),
])
def test_bad_parameters_are_refused_by_name(params, message):
    with pytest.raises(InvalidAggFunctionError, match=message):
        Schema.builder().column("k", pa.int64()).agg_column("v", pa.binary(), "top_k", **params) \
            .primary_key("k").build()


def test_top_k_needs_a_binary_column():
    with pytest.raises(InvalidAggFunctionError, match=r"top_k column 'v' must be one of \[binary"):
        Schema.builder().column("k", pa.int64()).agg_column("v", pa.string(), "top_k") \
            .primary_key("k").build()


def test_bad_input_is_refused_naming_the_column_and_nothing_is_applied(tmp_path):
    with top_k_table(tmp_path) as t:
        t.put([{"k": 1, "t": "a"}])
        end, before = t.log_end_offset, t.to_arrow()
        with pytest.raises(InvalidInputError, match=r"Column 't' \(top_k\) got 7 bytes that are not a frequent"):
            t.put([{"k": 2, "t": "b"}, {"k": 1, "t": b"garbage"}])
        with pytest.raises(InvalidInputError, match=r"Column 't' \(top_k\) got .* not a frequent"):
            t.put([{"k": 2, "t": build_hll_sketch([1])}], mode=MergeMode.MERGE_STATE)
        with pytest.raises(InvalidInputError, match=r"Column 't' \(top_k\) takes sketch images"):
            t.put([{"k": 2, "t": "b"}, {"k": 1, "t": 1.5}])
        with pytest.raises(InvalidInputError, match=r"Column 't' \(top_k\) got .* not a frequent"):
            t.put([{"k": 2, "t": b"\x00" * 8}], mode=MergeMode.OVERWRITE)
        assert t.log_end_offset == end and t.to_arrow().equals(before)


def test_retraction_is_refused_unless_ignored(tmp_path):
    with top_k_table(tmp_path) as t:
        t.put([{"k": 1, "t": "a"}])
        with pytest.raises(RetractionError, match=r"Column 't' \(top_k\) cannot take back"):
            t.put([{"k": 1, "t": "a", "_change_type": "-U"}])
    with top_k_table(tmp_path / "ignoring", ignore_retract=True) as t:
        t.put([{"k": 1, "t": "a"}, {"k": 1, "t": "a", "_change_type": "-D"}, {"k": 1, "t": "b"}])
        assert counts_of(t.lookup({"k": 1})["t"]) == {"a": (1, 1, 1), "b": (1, 1, 1)}


def test_undo_writes_the_before_images_back(tmp_path):
    with top_k_table(tmp_path, lg_max_map_size=3) as t:
        t.put([{"k": 1, "t": v} for v in "aab"])
        baseline, before = t.log_end_offset, t.lookup({"k": 1})
        t.put([{"k": 1, "t": str(v)} for v in range(100)])  # past the exact mode
        t.put([{"k": 2, "t": "x"}])
        undo_bucket(t, baseline)
        assert t.lookup({"k": 1}) == before and t.lookup({"k": 2}) is None


def test_a_read_of_estimates_gives_the_top_items():
    from sink.batch_reader import SketchEstimate

    estimate = SketchEstimate(F.TOP_K, top=2)
    images = pa.array([build_top_k_sketch(["b", "a", "b", "c", "c", "c"]), None])
    assert estimate.of(images).to_pylist() == [
        [{"item": "c", "estimate": 3, "lower_bound": 3, "upper_bound": 3},
         {"item": "b", "estimate": 2, "lower_bound": 2, "upper_bound": 2}], None]
    assert estimate.arrow_type == pa.list_(pa.struct([
        ("item", pa.string()), ("estimate", pa.int64()), ("lower_bound", pa.int64()),
        ("upper_bound", pa.int64())]))


@settings(max_examples=examples(60), deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(data=st.data())
def test_every_mode_against_the_reference_model(tmp_path_factory, data):
    """AGGREGATE, MERGE_STATE and OVERWRITE puts, deletes and reopens on tables with top_k
    columns (and others): the tablet and the model's exact counter agree byte for byte."""
    spec = data.draw(table_specs(aggregation=True, functions=(F.TOP_K, F.TOP_K, F.SUM),
                                 max_value_columns=3))
    with TabletHarness(spec, tmp_path_factory.mktemp("top_k")) as h:
        for op in data.draw(write_sequences(spec)):
            h.apply(op)


@settings(max_examples=examples(30), deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(data=st.data())
def test_one_column_sequences_against_the_reference_model(tmp_path_factory, data):
    spec = data.draw(single_column_specs(F.TOP_K))
    with TabletHarness(spec, tmp_path_factory.mktemp("one")) as h:
        for op in data.draw(write_sequences(spec)):
            h.apply(op)
