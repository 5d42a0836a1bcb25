"""`fields.*` options given for an existing table must agree with it (they cannot change it)."""

from __future__ import annotations

import pyarrow as pa
import pytest

import tally
from merge_engine.table.connector_options import check_against_table
from tally.errors import InvalidOptionError

SCHEMA = (tally.Schema.builder()
          .column("product", pa.string())
          .agg_column("Revenue", pa.int64(), tally.AggFunction.SUM)
          .agg_column("tags", pa.string(), tally.AggFunction.STRING_AGG, delimiter=";")
          .column("status", pa.string())            # last_value_ignore_nulls by default
          .primary_key("product").build())


@pytest.mark.parametrize("options", [
    {},
    {"fields.revenue.agg": "SUM"},                    # Spark lower-cases keys
    {"fields.tags.agg": "listagg", "fields.tags.listagg.delimiter": ";"},  # an alias
    {"fields.status.agg": "last-value-ignore-nulls"},
    {"fields.tags.max-cell-bytes": "1000", "table.merge-engine": "aggregation"},
])
def test_agreeing_options_pass(options):
    check_against_table(SCHEMA, options, "shop.totals")


@pytest.mark.parametrize("options, words", [
    ({"fields.revenue.agg": "max"},
     ["'fields.revenue.agg' asks for max", "column 'Revenue'", "aggregates with sum",
      "'shop.totals'"]),
    ({"fields.status.agg": "sum"}, ["asks for sum", "aggregates with last_value_ignore_nulls"]),
    ({"fields.revenue.string_agg.delimiter": "|"}, ["asks for string_agg", "with sum"]),
    ({"fields.product.agg": "sum"}, ["primary-key column 'product'"]),
    ({"fields.price.agg": "sum"}, ["'fields.price.agg' names no column"]),
    ({"fields.revenue.agg": "bogus"}, ["bogus"]),
])
def test_contradicting_options_name_both_functions(options, words):
    with pytest.raises(tally.errors.TallyError) as caught:
        check_against_table(SCHEMA, options, "shop.totals")
    for word in words:
        assert word in str(caught.value)
    if "bogus" not in options.get("fields.revenue.agg", ""):
        assert isinstance(caught.value, InvalidOptionError)
