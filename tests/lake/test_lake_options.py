"""The lake's table options and column types: refused when defined, naming the option or the
column, never in a tiering round later; and changed on a live table only where allowed."""

from __future__ import annotations

import decimal

import pyarrow as pa
import pytest

from merge_engine import Schema, TableDescriptor
from merge_engine.table.lake_options import lake_schema, lake_type
from tally.errors import InvalidOptionError


def descriptor(column_type=pa.int64(), **options):
    schema = Schema.builder().column("k", pa.string()).column("v", column_type) \
        .primary_key("k").build()
    return TableDescriptor(schema, properties=options)


@pytest.mark.parametrize("options, message", [
    ({"table.datalake.enabled": "yes"}, "expected true or false"),
    ({"table.datalake.format": "iceberg"}, "Iceberg is not supported yet"),
    ({"table.datalake.format": "paimon"}, "supported: delta"),
    ({"table.datalake.freshness": "soon"}, "table.datalake.freshness"),
    ({"table.datalake.freshness": "0s"}, "positive duration"),
    ({"table.log.retention.ignore-lake": "maybe"}, "table.log.retention.ignore-lake"),
    ({"table.datalake.typo": "x"}, "Unknown table option 'table.datalake.typo'"),
])
def test_bad_lake_options_are_refused_naming_the_option(options, message):
    with pytest.raises(InvalidOptionError, match=message):
        descriptor(**options)


@pytest.mark.parametrize("column_type, why", [
    (pa.time64("us"), "no time-of-day type"),
    (pa.timestamp("ns"), "microseconds"),
    (pa.decimal256(40, 2), "38 digits"),
    (pa.list_(pa.time32("s")), "no time-of-day type"),
])
def test_columns_delta_cannot_hold_exactly_refuse_the_lake(column_type, why):
    with pytest.raises(InvalidOptionError, match=f"column 'v' has type .*{why}"):
        descriptor(column_type, **{"table.datalake.enabled": "true"})
    descriptor(column_type)  # without the lake the table is fine


@pytest.mark.parametrize("column_type, values", [
    (pa.uint8(), [0, 255]), (pa.uint16(), [0, 65535]), (pa.uint32(), [0, 2**32 - 1]),
    (pa.uint64(), [0, 2**64 - 1]), (pa.float16(), [1.5, None]),
    (pa.timestamp("s", tz="Europe/Paris"), [0, 1_700_000_000]),
    (pa.timestamp("ms"), [0, 1_700_000_000_123]), (pa.large_string(), ["a", "é" * 3]),
    (pa.binary(3), [b"abc", b"xyz"]), (pa.list_(pa.uint32()), [[1, 2**32 - 1], []]),
    (pa.map_(pa.string(), pa.uint16()), [[("a", 65535)], []]),
])
def test_widened_types_hold_every_value_exactly(column_type, values):
    widened = lake_type("v", column_type)
    original = pa.array(values, column_type)
    there = original.cast(widened)
    assert there.cast(column_type).equals(original)
    descriptor(column_type, **{"table.datalake.enabled": "true"})


def test_the_lake_schema_keeps_names_and_nullability():
    schema = pa.schema([pa.field("k", pa.string(), nullable=False),
                        pa.field("n", pa.uint64())])
    lake = lake_schema(schema)
    assert lake.names == ["k", "n"] and not lake.field("k").nullable
    assert lake.field("n").type == pa.decimal128(20, 0)
    assert pa.array([2**64 - 1], pa.uint64()).cast(lake.field("n").type)[0].as_py() == \
        decimal.Decimal(2**64 - 1)


def test_lake_options_change_on_a_live_table_and_nothing_else_does(lake_conn, lake_table_name):
    schema = Schema.builder().column("k", pa.string()).column("t", pa.time64("us")) \
        .column("v", pa.int64()).primary_key("k").build()
    lake_conn.admin.create_table(lake_table_name, TableDescriptor(schema))
    before = lake_conn.admin.describe_table(lake_table_name).descriptor.to_json()
    with pytest.raises(InvalidOptionError, match="column 't' has type time64"):
        lake_conn.admin.set_table_options(lake_table_name, {"table.datalake.enabled": "true"})
    with pytest.raises(InvalidOptionError, match="cannot be changed on a live table"):
        lake_conn.admin.set_table_options(lake_table_name, {"table.log.retention.ms": "5"})
    assert lake_conn.admin.describe_table(lake_table_name).descriptor.to_json() == before
    changed = lake_conn.admin.set_table_options(lake_table_name,
                                                {"table.datalake.freshness": "5s"})
    assert changed == {"table.datalake.freshness": "5s"}
    assert lake_conn.admin.set_table_options(
        lake_table_name, {"table.datalake.freshness": None}) == {}
