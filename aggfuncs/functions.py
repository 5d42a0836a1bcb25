"""The AggFunction enum: the names users write in schemas and options."""

from __future__ import annotations

import enum

from tally.errors import InvalidAggFunctionError


class AggFunction(enum.Enum):
    """An aggregate function a column merges with.

    `LISTAGG` is an alias member of `STRING_AGG` (same value, same behaviour): both names parse.
    """

    SUM = "sum"
    PRODUCT = "product"
    COUNT = "count"
    MAX = "max"
    MIN = "min"
    LAST_VALUE = "last_value"
    LAST_VALUE_IGNORE_NULLS = "last_value_ignore_nulls"
    FIRST_VALUE = "first_value"
    FIRST_VALUE_IGNORE_NULLS = "first_value_ignore_nulls"
    STRING_AGG = "string_agg"
    LISTAGG = "string_agg"
    ARRAY_AGG = "array_agg"
    BOOL_AND = "bool_and"
    BOOL_OR = "bool_or"
    RBM32 = "rbm32"
    RBM64 = "rbm64"
    HLL_SKETCH = "hll_sketch"
    THETA_SKETCH = "theta_sketch"
    KLL_SKETCH = "kll_sketch"
    MERGE_MAP = "merge_map"
    AVG = "avg"
    SUM_MAP = "sum_map"
    ARG_MAX = "arg_max"
    ARG_MIN = "arg_min"
    TOP_K = "top_k"
    NESTED_UPDATE = "nested_update"

    @classmethod
    def parse(cls, name: "str | AggFunction", column: str | None = None) -> "AggFunction":
        """Resolve a function name: case-insensitive, '-' equals '_', surrounding blanks ignored."""
        if isinstance(name, AggFunction):
            return name
        where = f" for column '{column}'" if column else ""
        if not isinstance(name, str) or not name.strip():
            raise InvalidAggFunctionError(f"Empty aggregation function name{where}")
        key = name.strip().replace("-", "_").upper()
        try:
            return cls[key]
        except KeyError:
            raise InvalidAggFunctionError(
                f"Unknown aggregation function{where}: '{name}'. "
                f"Supported functions: {', '.join(supported_names())}"
            ) from None


DEFAULT_FUNCTION = AggFunction.LAST_VALUE_IGNORE_NULLS


def supported_names() -> list[str]:
    """Every accepted function name, aliases included, sorted."""
    return sorted(name.lower() for name in AggFunction.__members__)
