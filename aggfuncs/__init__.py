"""Aggregate functions over Arrow data: the AggFunction enum and one aggregator per function.

`make_aggregator(function, column, arrow_type, params)` validates the type and parameters and
returns the aggregator a RowMerger folds a column with; `aggregator_class(function)` is its
class, where every fact about the function is kept.
"""

from __future__ import annotations

import pyarrow as pa

from aggfuncs.arg_select import ArgMaxAggregator, ArgMinAggregator
from aggfuncs.array_agg import ArrayAggAggregator
from aggfuncs.avg import AvgAggregator
from aggfuncs.base import Aggregator
from aggfuncs.bitmap import Rbm32Aggregator, Rbm64Aggregator, bitmap_ids, build_bitmap
from aggfuncs.bool_agg import BoolAndAggregator, BoolOrAggregator
from aggfuncs.count import CountAggregator
from aggfuncs.first_value import FirstValueAggregator, FirstValueIgnoreNullsAggregator
from aggfuncs.functions import DEFAULT_FUNCTION, AggFunction, supported_names
from aggfuncs.last_value import LastValueAggregator, LastValueIgnoreNullsAggregator
from aggfuncs.max import MaxAggregator
from aggfuncs.merge_map import MergeMapAggregator
from aggfuncs.min import MinAggregator
from aggfuncs.nested_update import NestedUpdateAggregator
from aggfuncs.product import ProductAggregator
from aggfuncs.segments import Segments
from aggfuncs.sketch_values import (SKETCH_FUNCTIONS, build_hll_sketch, build_kll_sketch,
                                    build_sketch, build_theta_sketch, hll_sketch_estimate,
                                    kll_sketch_quantile, kll_sketch_rank, theta_sketch_estimate)
from aggfuncs.sketch_values import build_top_k_sketch, top_k_items
from aggfuncs.sketches import HllSketchAggregator, KllSketchAggregator, ThetaSketchAggregator
from aggfuncs.string_agg import StringAggAggregator
from aggfuncs.sum import SumAggregator
from aggfuncs.sum_map import SumMapAggregator
from aggfuncs.top_k import TopKAggregator

AGGREGATORS: dict[AggFunction, type[Aggregator]] = {
    cls.function: cls
    for cls in (
        SumAggregator,
        ProductAggregator,
        CountAggregator,
        MaxAggregator,
        MinAggregator,
        LastValueAggregator,
        LastValueIgnoreNullsAggregator,
        FirstValueAggregator,
        FirstValueIgnoreNullsAggregator,
        StringAggAggregator,
        ArrayAggAggregator,
        BoolAndAggregator,
        BoolOrAggregator,
        Rbm32Aggregator,
        Rbm64Aggregator,
        HllSketchAggregator,
        ThetaSketchAggregator,
        KllSketchAggregator,
        MergeMapAggregator,
        AvgAggregator,
        SumMapAggregator,
        ArgMaxAggregator,
        ArgMinAggregator,
        TopKAggregator,
        NestedUpdateAggregator,
    )
}


def aggregator_class(function: AggFunction | str) -> type[Aggregator]:
    """The class of a function's aggregators: what the function is (replay-idempotent,
    estimated, value selection, its input rules) is read from it, never from the enum."""
    return AGGREGATORS[AggFunction.parse(function)]


def make_aggregator(
    function: AggFunction | str, column: str, arrow_type: pa.DataType, params: dict | None = None
) -> Aggregator:
    """The aggregator for `column`, its type and parameters checked."""
    function = AggFunction.parse(function, column)
    return aggregator_class(function)(column, arrow_type, params)


__all__ = [
    "AGGREGATORS",
    "DEFAULT_FUNCTION",
    "AggFunction",
    "Aggregator",
    "Segments",
    "aggregator_class",
    "SKETCH_FUNCTIONS",
    "bitmap_ids",
    "build_bitmap",
    "build_hll_sketch",
    "build_kll_sketch",
    "build_sketch",
    "build_theta_sketch",
    "hll_sketch_estimate",
    "kll_sketch_quantile",
    "kll_sketch_rank",
    "make_aggregator",
    "supported_names",
    "theta_sketch_estimate",
    "build_top_k_sketch",
    "top_k_items",
]
