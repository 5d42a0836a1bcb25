"""Sketch images in and out of Python: build one from values, read an estimate, a quantile or
a rank from one. These are what a client reads a sketch column with (and what Spark's own
`hll_sketch_estimate`, `theta_sketch_estimate` and `kll_sketch_get_quantile_*` compute)."""

from __future__ import annotations

from typing import Iterable

import pyarrow as pa

from aggfuncs.functions import AggFunction
from aggfuncs.sketches import HllSketchAggregator, KllSketchAggregator, ThetaSketchAggregator
from aggfuncs.sketches import kll_load
from aggfuncs.top_k import LG_MAX_MAP_SIZE, TopKAggregator
from tally.errors import InvalidAggFunctionError


def build_sketch(function: AggFunction | str, values: Iterable, params: dict | None = None) -> bytes:
    """The image a column of `function` (hll_sketch, theta_sketch, kll_sketch or top_k) with these
    parameters (as a schema gives them) makes of raw `values` (nulls skipped)."""
    function = AggFunction.parse(function)
    if function not in _AGGREGATORS:
        raise InvalidAggFunctionError(f"'{function.value}' is not a sketch function")
    agg = _AGGREGATORS[function]("value", pa.binary(), params)
    return agg.sketch_of([v for v in values if v is not None])


def build_hll_sketch(values: Iterable, lg_k: int = 12, target_type: str = "HLL_4") -> bytes:
    """The hll_sketch image of `values` (integers, floats or strings; nulls skipped)."""
    agg = HllSketchAggregator("value", pa.binary(), {"lg-k": lg_k, "target-type": target_type})
    return agg.sketch_of([v for v in values if v is not None])


def build_theta_sketch(values: Iterable, lg_k: int = 12) -> bytes:
    """The theta_sketch image of `values` (integers, floats or strings; nulls skipped)."""
    agg = ThetaSketchAggregator("value", pa.binary(), {"lg-k": lg_k})
    return agg.sketch_of([v for v in values if v is not None])


def build_kll_sketch(values: Iterable, k: int = 200, items: str = "double") -> bytes:
    """The kll_sketch image of numeric `values` (nulls skipped); `items` double, float, bigint."""
    agg = KllSketchAggregator("value", pa.binary(), {"k": k, "items": items})
    raw = [v for v in values if v is not None]
    cast = pa.array(raw).cast(agg.raw_type(pa.float64()), safe=True).to_pylist() if raw else []
    return agg.sketch_of(cast)


def hll_sketch_estimate(data: bytes | None) -> int | None:
    """The distinct count an hll_sketch image estimates, rounded as Spark's
    `hll_sketch_estimate` rounds it (None for None)."""
    if data is None:
        return None
    agg = HllSketchAggregator("value", pa.binary())
    return round(agg.load(data).get_estimate())


def theta_sketch_estimate(data: bytes | None) -> int | None:
    """The distinct count a theta_sketch image estimates, rounded as Spark's
    `theta_sketch_estimate` rounds it (None for None)."""
    if data is None:
        return None
    agg = ThetaSketchAggregator("value", pa.binary())
    return round(agg.load(data).get_estimate())


def build_top_k_sketch(values: Iterable, lg_max_map_size: int = 10) -> bytes:
    """The top_k image of `values` (strings, or integers as their decimal strings; nulls
    skipped)."""
    agg = TopKAggregator("value", pa.binary(), {LG_MAX_MAP_SIZE: lg_max_map_size})
    return agg.sketch_of([v for v in values if v is not None])


def top_k_items(data: bytes | None, k: int = 10) -> list[dict] | None:
    """The `k` most frequent items of a top_k image, highest estimate first (ties by item),
    each `{item, estimate, lower_bound, upper_bound}`: the true count lies within the bounds
    (None for None)."""
    return TopKAggregator("value", pa.binary(), {"k": k}).top_items(data)


def _kll(data: bytes, items: str):
    agg = KllSketchAggregator("value", pa.binary(), {"items": items})
    return agg.load(data)


def kll_sketch_quantile(data: bytes | None, rank: float, items: str = "double"):
    """The value at normalized `rank` (0..1) of a kll_sketch image, by inclusive ranks (Spark's
    and DataSketches Java's default; the Python package's default is exclusive); None for None
    or an empty sketch."""
    if data is None:
        return None
    sketch = _kll(data, items.upper())
    if sketch.is_empty():
        return None
    # DataSketches Java (Spark) puts the exact min and max at ranks 0 and 1 of its sorted view;
    # the C++ library behind the Python package answers from retained items only.
    if rank <= 0:
        return sketch.get_min_value()
    if rank >= 1:
        return sketch.get_max_value()
    return sketch.get_quantile(float(rank), True)


def kll_sketch_rank(data: bytes | None, value, items: str = "double") -> float | None:
    """The normalized rank (0..1) of `value` in a kll_sketch image (inclusive: the fraction of
    items <= value); None for None or an empty sketch."""
    if data is None:
        return None
    sketch = _kll(data, items.upper())
    return None if sketch.is_empty() else sketch.get_rank(value, True)


_AGGREGATORS = {cls.function: cls for cls in
                (HllSketchAggregator, ThetaSketchAggregator, KllSketchAggregator, TopKAggregator)}
SKETCH_FUNCTIONS = tuple(_AGGREGATORS)

__all__ = ["SKETCH_FUNCTIONS", "build_hll_sketch", "build_sketch", "build_kll_sketch", "build_theta_sketch",
           "hll_sketch_estimate", "kll_load", "kll_sketch_quantile", "kll_sketch_rank",
           "theta_sketch_estimate", "build_top_k_sketch", "top_k_items"]
