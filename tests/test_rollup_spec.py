"""Rollup definitions: parsing, validation against the source, the derived table, projection.

The property: a source's rows projected onto a rollup and folded by a real bucket of the rollup
table equal the rows grouped by the rollup's key in plain Python (sum, count, count(*), max,
min, last_value; every time unit), and a rebuild from the source's stored rows in MERGE_STATE
mode (a backfill) equals them too.
"""

from __future__ import annotations

import datetime
import tempfile

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from aggfuncs import AggFunction
from merge_engine import MergeMode, Schema, TableDescriptor
from merge_engine.kv.tablet import KvTablet
from merge_engine.table.rollups import TIME_UNITS, RollupSpec
from tally.errors import InvalidAggFunctionError, InvalidInputError, InvalidOptionError

AGGREGATION = {"table.merge-engine": "aggregation"}


def source_schema(clicks_type=pa.int64()):
    return (Schema.builder().column("product", pa.string()).column("region", pa.string())
            .column("ts", pa.timestamp("us")).agg_column("clicks", clicks_type, "sum")
            .agg_column("n", pa.int64(), "count").agg_column("top", pa.int64(), "max")
            .agg_column("low", pa.int64(), "min")
            .agg_column("user", pa.binary(), "hll_sketch")
            .agg_column("status", pa.string(), "last_value")
            .column("day", pa.date32())
            .primary_key("product", "region", "ts").build())


SOURCE = source_schema()


def define(keys, columns, start="from-now"):
    return RollupSpec.define("db.r", "db.events", keys, columns, start).bind(SOURCE)


# --- parsing --------------------------------------------------------------------------------


def test_keys_parse_with_names_and_time_units():
    spec = define(["product", "region AS area", "date_trunc('hour', ts) AS hour",
                   "DATE_TRUNC( 'Week' , ts )"], {"c": "sum(clicks)"})
    assert [(k.name, k.source, k.unit) for k in spec.keys] == [
        ("product", "product", None), ("area", "region", None), ("hour", "ts", "hour"),
        ("ts_week", "ts", "week")]
    by_dict = define({"p": "product", "h": "date_trunc('hour', ts)"}, {"c": "sum(clicks)"})
    assert [(k.name, k.source, k.unit) for k in by_dict.keys] == [("p", "product", None),
                                                                  ("h", "ts", "hour")]


def test_columns_parse_functions_params_and_count_star():
    spec = define(["product"], {"c": "sum(clicks)", "rows": "count(*)", "u": "hll_sketch(user)",
                                "s": "string_agg(status, delimiter=';', distinct=true)",
                                "t": ("max", "top", {}), "l": "LAST_VALUE(status)"})
    got = {c.name: (c.function, c.source, c.params) for c in spec.columns}
    assert got == {"c": (AggFunction.SUM, "clicks", {}), "rows": (AggFunction.COUNT, None, {}),
                   "u": (AggFunction.HLL_SKETCH, "user", {}),
                   "s": (AggFunction.STRING_AGG, "status", {"delimiter": ";",
                                                           "distinct": "true"}),
                   "t": (AggFunction.MAX, "top", {}), "l": (AggFunction.LAST_VALUE, "status", {})}
    assert RollupSpec.from_json(spec.to_json()) == spec


@pytest.mark.parametrize("keys, columns, error, words", [
    (["date_trunc('fortnight', ts) AS f"], {"c": "sum(clicks)"}, InvalidInputError,
     ["fortnight", "second, minute, hour"]),
    (["product + 1"], {"c": "sum(clicks)"}, InvalidInputError, ["product + 1"]),
    (["product"], {"c": "avg_of(clicks)"}, InvalidAggFunctionError, ["'c'", "avg_of"]),
    (["product"], {"c": "sum(*)"}, InvalidInputError, ["'c'", "only count takes *"]),
    (["product"], {"c": "sum"}, InvalidInputError, ["'c'", "sum"]),
    (["product"], {"product": "sum(clicks)"}, InvalidInputError, ["'product'", "twice"]),
    (["product"], {}, InvalidInputError, ["at least one aggregate column"]),
    (["product"], {"c": "sum(clicks, nosuch=1)"}, InvalidAggFunctionError, ["nosuch", "'c'"]),
])
def test_bad_definitions_are_refused_naming_the_expression(keys, columns, error, words):
    with pytest.raises(error) as raised:
        define(keys, columns)
    for word in words:
        assert word in str(raised.value)


def test_a_bad_start_is_an_option_error():
    with pytest.raises(InvalidOptionError, match="backfill, from-now"):
        RollupSpec.define("db.r", "db.e", ["product"], {"c": "sum(clicks)"}, start="later")


# --- validation against the source and the derived table -----------------------------------


@pytest.mark.parametrize("keys, columns, error, words", [
    (["nosuch"], {"c": "sum(clicks)"}, InvalidInputError, ["nosuch", "product"]),
    (["product"], {"c": "sum(nosuch)"}, InvalidInputError, ["sum(nosuch)", "'nosuch'"]),
    (["date_trunc('hour', product) AS h"], {"c": "sum(clicks)"}, InvalidInputError,
     ["'product'", "timestamp or date"]),
    (["date_trunc('hour', day) AS h"], {"c": "sum(clicks)"}, InvalidInputError,
     ["'day'", "day, week, month, year"]),
    (["product"], {"c": "sum(status)"}, InvalidAggFunctionError, ["'c'", "sum(status)", "string"]),
    (["product"], {"c": "bool_and(clicks)"}, InvalidAggFunctionError, ["'c'", "int64"]),
])
def test_a_definition_the_source_cannot_feed_is_refused(keys, columns, error, words):
    spec = RollupSpec.define("db.r", "db.events", keys, columns, "from-now")
    with pytest.raises(error) as raised:
        spec.descriptor(SOURCE)
    for word in words:
        assert word in str(raised.value)


def test_the_rollup_table_takes_its_types_from_the_source_and_the_functions():
    source = source_schema(clicks_type=pa.int32())
    spec = RollupSpec.define("db.r", "db.events", [
        "product", "date_trunc('day', ts) AS d", "date_trunc('month', day) AS m"],
        {"c": "sum(clicks)", "rows": "count(*)", "statuses": "count(status)",
         "u": "hll_sketch(user)", "users": "hll_sketch(region)", "ids": "rbm64(top)",
         "list": "array_agg(status)", "last": "last_value(status)"}, "from-now")
    descriptor = spec.descriptor(source, bucket_count=3, options={"table.kv.sync": "true"})
    types = {c.name: c.type for c in descriptor.schema.columns}
    assert types == {"product": pa.string(), "d": pa.timestamp("us"), "m": pa.date32(),
                     "c": pa.int32(), "rows": pa.int64(), "statuses": pa.int64(),
                     "u": pa.binary(), "users": pa.binary(), "ids": pa.binary(),
                     "list": pa.list_(pa.string()), "last": pa.string()}
    assert descriptor.schema.primary_key == ("product", "d", "m")
    assert descriptor.bucket_count == 3 and descriptor.is_aggregation
    assert descriptor.properties["table.kv.sync"] == "true"
    with pytest.raises(InvalidOptionError, match="aggregation table"):
        spec.descriptor(source, options={"table.merge-engine": "last-write"})


def test_fed_columns_need_every_key_source():
    spec = RollupSpec.define("db.r", "db.events", ["region", "status"],
                             {"c": "sum(clicks)", "rows": "count(*)", "t": "max(top)"},
                             "from-now").bind(SOURCE)
    assert spec.fed_columns(["status", "top"]) == ["rows", "t"]  # region: the source's key
    with pytest.raises(InvalidInputError, match="lacks column 'status'"):
        spec.fed_columns(["clicks"])
    unbound = RollupSpec.define("db.r", "db.events", ["region"], {"c": "sum(clicks)"})
    with pytest.raises(InvalidInputError, match="'region'"):
        unbound.fed_columns(["clicks"])


def test_which_write_modes_feed_a_rollup():
    same = define(["product"], {"c": "sum(clicks)", "t": "max(top)"})
    same.check_mode(MergeMode.AGGREGATE, SOURCE)
    same.check_mode(MergeMode.MERGE_STATE, SOURCE)
    with pytest.raises(InvalidInputError, match="OVERWRITE"):
        same.check_mode(MergeMode.OVERWRITE, SOURCE)
    other = define(["product"], {"c": "max(clicks)"})
    with pytest.raises(InvalidInputError, match="'c' = max\\(clicks\\).*function sum"):
        other.check_mode("merge_state", SOURCE)
    rows = define(["product"], {"rows": "count(*)", "c": "sum(clicks)"})
    with pytest.raises(InvalidInputError, match="'rows'"):
        rows.check_mode(MergeMode.MERGE_STATE, SOURCE)
    with pytest.raises(InvalidInputError, match="delete"):
        same.check_delete()


@pytest.mark.parametrize("keys, columns, words", [
    (["status"], {"c": "sum(clicks)"}, ["'status'", "primary-key"]),
    (["product"], {"rows": "count(*)"}, ["'rows'", "count"]),
    (["product"], {"s": "last_value(status)"}, ["'s'", "order"]),
    (["product"], {"c": "max(clicks)"}, ["'c'", "function sum"]),
    (["region"], {"c": "max(product)"}, ["'c'", "primary-key"]),
])
def test_a_backfill_that_could_not_be_exact_is_refused(keys, columns, words):
    spec = define(keys, columns)
    with pytest.raises(InvalidInputError) as raised:
        spec.check_backfill(SOURCE)
    assert "from-now" in str(raised.value)
    for word in words:
        assert word in str(raised.value)


def test_weeks_start_on_monday_and_zones_bucket_in_local_time():
    zoned = (Schema.builder().column("k", pa.string())
             .column("ts", pa.timestamp("us", tz="America/New_York"))
             .agg_column("c", pa.int64(), "sum").primary_key("k", "ts").build())
    spec = RollupSpec.define("db.r", "db.e", ["date_trunc('week', ts) AS w",
                                              "date_trunc('day', ts) AS d"],
                             {"c": "sum(c)"}).bind(zoned)
    utc = datetime.timezone.utc
    at = datetime.datetime(2026, 1, 8, 3, 30, tzinfo=utc)  # Thursday 22:30 on the 7th in New York
    rows = pa.table({"k": ["a"], "ts": pa.array([at], pa.timestamp("us", tz="America/New_York")),
                     "c": [1]})
    out = spec.project(rows).to_pylist()[0]
    assert out["w"].astimezone(utc) == datetime.datetime(2026, 1, 5, 5, 0, tzinfo=utc)
    assert out["d"].astimezone(utc) == datetime.datetime(2026, 1, 7, 5, 0, tzinfo=utc)


# --- the property: project + fold equals grouping in plain Python ----------------------------


def truncate(value: datetime.datetime, unit: str) -> datetime.datetime:
    if unit == "second":
        return value.replace(microsecond=0)
    if unit == "minute":
        return value.replace(second=0, microsecond=0)
    if unit == "hour":
        return value.replace(minute=0, second=0, microsecond=0)
    day = value.replace(hour=0, minute=0, second=0, microsecond=0)
    if unit == "day":
        return day
    if unit == "week":
        return day - datetime.timedelta(days=day.weekday())
    if unit == "month":
        return day.replace(day=1)
    return day.replace(month=1, day=1)


FUNCTIONS = {"sum": "clicks", "count": "n", "max": "top", "min": "low", "last_value": "status"}


def reference(spec: RollupSpec, rows: list[dict]) -> dict:
    """The rollup in plain Python: rows grouped by its key, each function folded in order."""
    groups: dict = {}
    for row in rows:
        key = tuple(truncate(row[k.source], k.unit) if k.unit else row[k.source]
                    for k in spec.keys)
        groups.setdefault(key, []).append(row)
    out = {}
    for key, members in groups.items():
        values = {}
        for c in spec.columns:
            given = [1 for _ in members] if c.source is None else [m[c.source] for m in members]
            present = [v for v in given if v is not None]
            if c.function is AggFunction.SUM:
                values[c.name] = sum(present) if present else None
            elif c.function is AggFunction.COUNT:
                values[c.name] = len(present)
            elif c.function is AggFunction.MAX:
                values[c.name] = max(present) if present else None
            elif c.function is AggFunction.MIN:
                values[c.name] = min(present) if present else None
            else:
                values[c.name] = given[-1]
        out[key] = values
    return out


def stored(bucket, spec: RollupSpec) -> dict:
    names = [k.name for k in spec.keys]
    return {tuple(r[n] for n in names): {c.name: r[c.name] for c in spec.columns}
            for r in bucket.to_arrow().to_pylist()}


START = datetime.datetime(2025, 12, 27, 22, 0)
times = st.integers(0, 10 * 24 * 3600 - 1).map(lambda s: START + datetime.timedelta(seconds=s))
events = st.lists(st.fixed_dictionaries({
    "product": st.sampled_from(["kayak", "tent"]), "region": st.sampled_from(["eu", "us"]),
    "ts": times, "clicks": st.none() | st.integers(-50, 50), "n": st.none() | st.just(1),
    "top": st.none() | st.integers(-9, 9), "low": st.none() | st.integers(-9, 9),
    "status": st.none() | st.sampled_from(["new", "paid", "sent"])}), min_size=1, max_size=30)
definitions = st.tuples(
    st.lists(st.sampled_from(["product", "region"]), unique=True, max_size=2),
    st.none() | st.sampled_from(TIME_UNITS),
    st.lists(st.sampled_from(sorted(FUNCTIONS) + ["count(*)"]), unique=True, min_size=1))


def rollup_of(definition) -> RollupSpec:
    columns_, unit, functions = definition
    keys = list(columns_) + ([f"date_trunc('{unit}', ts) AS bucket"] if unit else [])
    if not keys:
        keys = ["region"]
    columns = {("rows" if f == "count(*)" else f"c_{f}"):
               (f if f == "count(*)" else f"{f}({FUNCTIONS[f]})") for f in functions}
    return RollupSpec.define("db.r", "db.events", keys, columns, "from-now")


def one_key_rows(rows: list[dict]) -> list[dict]:
    """The events with distinct source keys (a source key written twice merges in the source)."""
    seen, out = set(), []
    for row in rows:
        key = (row["product"], row["region"], row["ts"])
        if key not in seen:
            seen.add(key)
            out.append(row)
    return out


@settings(max_examples=60, deadline=None)
@given(events, definitions, st.integers(1, 4))
def test_a_projection_folded_by_the_rollup_equals_grouping_the_rows(rows, definition, batches):
    source = source_schema()
    spec = rollup_of(definition).bind(source)
    rollup = spec.descriptor(source)
    arrow = pa.Table.from_pylist(rows, schema=pa.schema(
        [f for f in source.to_arrow() if f.name in rows[0]]))
    with tempfile.TemporaryDirectory() as path, KvTablet.open(path, rollup) as bucket:
        step = -(-len(rows) // batches)
        for start in range(0, len(rows), step):
            bucket.put(spec.project(arrow.slice(start, step)))
        assert stored(bucket, spec) == reference(spec, rows)


@settings(max_examples=40, deadline=None)
@given(events, definitions)
def test_a_rebuild_from_the_sources_rows_equals_the_rollup(rows, definition):
    """A backfill's way: the source's stored rows, projected, merged as states."""
    columns_, unit, functions = definition
    functions = [f for f in functions if f in ("sum", "count", "max", "min")] or ["sum"]
    source = source_schema()
    spec = rollup_of((columns_, unit, functions)).bind(source)
    spec.check_backfill(source)
    rows = one_key_rows(rows)
    table = TableDescriptor(source, properties=AGGREGATION)
    with tempfile.TemporaryDirectory() as a, tempfile.TemporaryDirectory() as b, \
            KvTablet.open(a, table) as events_bucket, \
            KvTablet.open(b, spec.descriptor(source)) as rollup_bucket:
        names = [f.name for f in source.to_arrow() if f.name in rows[0]]
        events_bucket.put(pa.Table.from_pylist(rows, schema=pa.schema(
            [source.to_arrow().field(n) for n in names])), target_columns=names)
        scanned = events_bucket.to_arrow()
        rollup_bucket.put(spec.project(scanned, [c.name for c in spec.columns]),
                          mode=MergeMode.MERGE_STATE)
        assert stored(rollup_bucket, spec) == reference(spec, rows)


def test_a_retraction_passes_through_and_is_taken_back():
    spec = define(["product"], {"c": "sum(clicks)", "rows": "count(*)"})
    rollup = spec.descriptor(SOURCE)
    at = datetime.datetime(2026, 1, 1, 10)
    rows = pa.table({"product": ["kayak", "kayak"], "region": ["eu", "us"],
                     "ts": pa.array([at, at], pa.timestamp("us")), "clicks": [5, 7]})
    retraction = rows.slice(0, 1).append_column("_change_type", pa.array(["-U"]))
    projected = spec.project(retraction)
    assert projected.column_names == ["product", "c", "rows", "_change_type"]
    with tempfile.TemporaryDirectory() as path, KvTablet.open(path, rollup) as bucket:
        bucket.put(spec.project(rows))
        bucket.put(projected)
        assert bucket.lookup({"product": "kayak"}) == {"product": "kayak", "c": 7, "rows": 1}
