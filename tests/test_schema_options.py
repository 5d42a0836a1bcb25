"""Schema builder, JSON round trips, TableDescriptor properties and connector options."""

import pyarrow as pa
import pytest

from aggfuncs import AggFunction
from merge_engine import Schema, TableDescriptor
from merge_engine.table.modes import DeleteBehavior
from tally.errors import InvalidAggFunctionError, InvalidOptionError, SchemaError

AGG = {"table.merge-engine": "aggregation"}


def orders_schema():
    return (
        Schema.builder()
        .column("id", pa.int64())
        .column("day", pa.date32())
        .agg_column("qty", pa.int64(), AggFunction.SUM)
        .agg_column("tags", pa.string(), AggFunction.LISTAGG, delimiter=";", distinct="true")
        .agg_column("ids", pa.list_(pa.int32()), "array-agg")
        .agg_column("price", pa.decimal128(10, 2), AggFunction.MAX)
        .column("status", pa.string())
        .primary_key("id", "day")
        .partition_key("day")
        .build()
    )


def test_builder_assigns_stable_ids_and_keys_are_not_null():
    s = orders_schema()
    assert [c.id for c in s.columns] == list(range(7))
    assert not s.column("id").nullable and not s.column("day").nullable
    assert s.column("qty").nullable
    assert s.column("tags").agg is AggFunction.STRING_AGG
    assert s.column("tags").params == {"delimiter": ";", "distinct": True}
    assert AggFunction.LISTAGG is AggFunction.STRING_AGG


def test_schema_and_descriptor_round_trip_through_json():
    s = orders_schema()
    assert Schema.from_json(s.to_json()) == s
    d = TableDescriptor(s, bucket_count=4, properties=AGG)
    back = TableDescriptor.from_json(d.to_json())
    assert back == d and back.bucket_count == 4 and back.schema.column("ids").type == pa.list_(pa.int32())


def test_function_on_primary_key_is_rejected():
    with pytest.raises(SchemaError, match="primary key column 'id'"):
        Schema.builder().agg_column("id", pa.int64(), "sum").primary_key("id").build()


@pytest.mark.parametrize(
    "fn, arrow_type, params, message",
    [
        ("sum", pa.string(), {}, r"sum column 'c' must be one of \[.*\] but was string"),
        ("bool_and", pa.int32(), {}, "bool_and column 'c'"),
        ("max", pa.bool_(), {}, "max column 'c'"),
        ("count", pa.int32(), {}, "count column 'c'"),
        ("array_agg", pa.int64(), {}, "array_agg column 'c'"),
        ("sum", pa.int64(), {"x": 1}, "Parameter 'x' is not supported for aggregation function 'sum'"),
        ("string_agg", pa.string(), {"delimiter": ""}, "Parameter 'delimiter'.*non-empty"),
        ("string_agg", pa.string(), {"distinct": "maybe"}, "Parameter 'distinct' must be true or false"),
        ("median", pa.int64(), {}, "Unknown aggregation function for column 'c'.*Supported functions: arg_max, arg_min, array_agg, avg"),
    ],
)
def test_bad_functions_name_the_column_and_problem(fn, arrow_type, params, message):
    with pytest.raises(InvalidAggFunctionError, match=message):
        Schema.builder().column("k", pa.int64()).agg_column("c", arrow_type, fn, **params).primary_key("k").build()


def test_function_names_are_case_insensitive_and_dash_equals_underscore():
    assert AggFunction.parse(" Last-Value-Ignore-Nulls ") is AggFunction.LAST_VALUE_IGNORE_NULLS
    assert AggFunction.parse("LISTAGG") is AggFunction.STRING_AGG


def test_descriptor_defaults_follow_the_engine():
    agg = TableDescriptor(orders_schema(), properties=AGG)
    assert agg.delete_behavior is DeleteBehavior.IGNORE and agg.column_lock_enabled
    plain = TableDescriptor(Schema.builder().column("k", pa.int64()).primary_key("k").build())
    assert plain.delete_behavior is DeleteBehavior.ALLOW and not plain.column_lock_enabled
    off = TableDescriptor(orders_schema(), properties={**AGG, "table.column-lock.enabled": "false"})
    assert not off.column_lock_enabled


@pytest.mark.parametrize(
    "kwargs, error, message",
    [
        ({"properties": {}}, SchemaError, "only supported for aggregation merge engine tables, but column 'qty'"),
        ({"properties": {**AGG, "table.bogus": "1"}}, InvalidOptionError, "Unknown table option 'table.bogus'"),
        ({"properties": {**AGG, "table.changelog.image": "WAL"}}, InvalidOptionError, "FULL"),
        ({"properties": {**AGG, "table.delete.behavior": "sometimes"}}, InvalidOptionError, "table.delete.behavior"),
        ({"properties": {"table.merge-engine": "first_row"}}, InvalidOptionError, "table.merge-engine"),
        ({"properties": {**AGG, "bucket.num": "3"}, "bucket_count": 4}, InvalidOptionError, "disagree"),
        ({"properties": {**AGG, "bucket.num": "many"}}, InvalidOptionError, "bucket.num"),
    ],
)
def test_descriptor_rejections(kwargs, error, message):
    with pytest.raises(error, match=message):
        TableDescriptor(orders_schema(), **kwargs)


def test_aggregation_needs_a_primary_key():
    s = Schema.builder().column("a", pa.int64()).build()
    with pytest.raises(SchemaError, match="primary key"):
        TableDescriptor(s, properties=AGG)


def test_bucket_num_option_sets_the_bucket_count_and_is_not_kept():
    d = TableDescriptor(orders_schema(), properties={**AGG, "bucket.num": "8"})
    assert d.bucket_count == 8 and "bucket.num" not in d.properties


def test_from_options_translates_field_options_into_the_schema():
    arrow = pa.schema([("id", pa.int64()), ("total", pa.int64()), ("tags", pa.string()), ("note", pa.string())])
    d = TableDescriptor.from_options(
        arrow,
        primary_key=["id"],
        options={
            "table.merge-engine": "aggregation",
            "fields.total.agg": "SUM",
            "fields.tags.agg": "listagg",
            "fields.tags.listagg.delimiter": ";",
            "fields.tags.string_agg.distinct": "true",
            "bucket.num": "2",
        },
    )
    assert d.schema.column("total").agg is AggFunction.SUM
    assert d.schema.column("tags").params == {"delimiter": ";", "distinct": True}
    assert d.schema.column("note").agg is None
    assert d.bucket_count == 2
    assert not any(k.startswith("fields.") for k in d.properties)


@pytest.mark.parametrize(
    "options, message",
    [
        ({"fields.nope.agg": "sum"}, "names no column"),
        ({"fields.total.agg": "sum", "fields.total.max.x": "1"}, "names function 'max'"),
        ({"fields.total.sum.x": "1"}, "has no 'fields.total.agg'"),
        ({"fields.total.agg": "sum", "fields.total.sum.x": "1"}, "Parameter 'x' is not supported"),
        ({"fields.total.aggregate": "sum"}, "is not understood"),
    ],
)
def test_from_options_rejections(options, message):
    arrow = pa.schema([("id", pa.int64()), ("total", pa.int64())])
    with pytest.raises((InvalidOptionError, InvalidAggFunctionError), match=message):
        TableDescriptor.from_options(arrow, ["id"], options={"table.merge-engine": "aggregation", **options})
