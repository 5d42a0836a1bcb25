"""The expressions of a rollup's definition: its keys and its aggregate columns, parsed.

A key is a source column (`product`, `product AS p`) or a time bucket of one
(`date_trunc('hour', ts) AS hour`; without a name, `ts_hour`). An aggregate column is a
function over a source column with optional parameters (`sum(clicks)`, `hll_sketch(user)`,
`string_agg(tag, delimiter=';', distinct=true)`), or `count(*)`, which counts source rows.
"""

from __future__ import annotations

import dataclasses
import re

from aggfuncs import AggFunction
from tally.errors import InvalidAggFunctionError, InvalidInputError

TIME_UNITS = ("second", "minute", "hour", "day", "week", "month", "year")

_NAME = r"[A-Za-z_][A-Za-z0-9_]*"
_PLAIN_KEY = re.compile(rf"\s*({_NAME})\s*(?:\s[Aa][Ss]\s+({_NAME})\s*)?")
_TIME_KEY = re.compile(
    rf"\s*date_trunc\s*\(\s*'([^']*)'\s*,\s*({_NAME})\s*\)\s*(?:[Aa][Ss]\s+({_NAME})\s*)?",
    re.IGNORECASE)
_CALL = re.compile(rf"\s*({_NAME})\s*\((.*)\)\s*", re.DOTALL)
_PARAM = re.compile(rf"\s*({_NAME}(?:[-.]{_NAME})*)\s*=\s*('(?:[^']*)'|[^,]+?)\s*(?:,|$)")


@dataclasses.dataclass(frozen=True)
class RollupKey:
    """A key column of a rollup: source column `source`, or its time bucket of `unit`."""

    name: str
    source: str
    unit: str | None = None

    @property
    def expression(self) -> str:
        if self.unit is None:
            return self.source if self.name == self.source else f"{self.source} AS {self.name}"
        return f"date_trunc('{self.unit}', {self.source}) AS {self.name}"


@dataclasses.dataclass(frozen=True)
class RollupColumn:
    """An aggregate column of a rollup: `function` over source column `source` (None: count(*),
    which counts the source rows)."""

    name: str
    function: AggFunction
    source: str | None
    params: dict = dataclasses.field(default_factory=dict)

    @property
    def expression(self) -> str:
        args = [self.source or "*"] + [f"{k}={v!r}" for k, v in sorted(self.params.items())]
        return f"{self.function.value}({', '.join(args)})"

    def __hash__(self) -> int:
        return hash((self.name, self.function, self.source, tuple(sorted(self.params.items()))))


def parse_key(expression, name: str | None = None) -> RollupKey:
    """A key from its text; `name` (a dict's key) wins over an AS in the text."""
    if isinstance(expression, RollupKey):
        return expression if name is None else dataclasses.replace(expression, name=name)
    if not isinstance(expression, str) or not expression.strip():
        raise InvalidInputError(f"a rollup key is a column name or \"date_trunc('<unit>', "
                                f"<column>) AS <name>\", not {expression!r}")
    timed = _TIME_KEY.fullmatch(expression)
    if timed:
        unit, source, alias = timed.group(1).strip().lower(), timed.group(2), timed.group(3)
        if unit not in TIME_UNITS:
            raise InvalidInputError(
                f"rollup key {expression.strip()!r}: unknown time unit '{timed.group(1)}'; the "
                f"units are {', '.join(TIME_UNITS)}")
        return RollupKey(name or alias or f"{source}_{unit}", source, unit)
    plain = _PLAIN_KEY.fullmatch(expression)
    if plain:
        return RollupKey(name or plain.group(2) or plain.group(1), plain.group(1))
    raise InvalidInputError(
        f"rollup key {expression.strip()!r} is not a column name, '<column> AS <name>' or "
        "\"date_trunc('<unit>', <column>) AS <name>\"")


def parse_column(name: str, expression) -> RollupColumn:
    """An aggregate column from `function(column, param=value, ...)`, `count(*)`, or a tuple
    (function, source column or None, params)."""
    if not isinstance(name, str) or not re.fullmatch(_NAME, name):
        raise InvalidInputError(f"rollup column name {name!r} must be letters, digits and '_'")
    if isinstance(expression, RollupColumn):
        return dataclasses.replace(expression, name=name)
    if isinstance(expression, (tuple, list)):
        if not 2 <= len(expression) <= 3:
            raise InvalidInputError(f"rollup column '{name}': a tuple is (function, source "
                                    f"column, params), not {expression!r}")
        function, source, *rest = expression
        params = dict(rest[0]) if rest and rest[0] else {}
        return _column(name, function, source, params, f"{expression!r}")
    if not isinstance(expression, str):
        raise InvalidInputError(f"rollup column '{name}': {expression!r} is not an expression "
                                "such as 'sum(clicks)' or 'count(*)'")
    call = _CALL.fullmatch(expression)
    if not call:
        raise InvalidInputError(f"rollup column '{name}': {expression.strip()!r} is not "
                                "'<function>(<column>[, <parameter>=<value>...])' or 'count(*)'")
    function, inner = call.group(1), call.group(2)
    source, _, rest = inner.partition(",")
    source = source.strip()
    if source != "*" and not re.fullmatch(_NAME, source):
        raise InvalidInputError(f"rollup column '{name}': {expression.strip()!r} needs a source "
                                "column name (or * for count(*)) as its first argument")
    return _column(name, function, None if source == "*" else source, _params(name, rest),
                   expression.strip())


def _column(name, function, source, params, text) -> RollupColumn:
    try:
        agg = AggFunction.parse(function, name)
    except InvalidAggFunctionError as e:
        raise InvalidAggFunctionError(f"rollup column '{name}' = {text}: {e}") from None
    if source is None and agg is not AggFunction.COUNT:
        raise InvalidInputError(f"rollup column '{name}' = {text}: only count takes * (it "
                                f"counts source rows); {agg.value} needs a source column")
    if source is not None and not isinstance(source, str):
        raise InvalidInputError(f"rollup column '{name}' = {text}: the source column must be "
                                f"a name, not {source!r}")
    return RollupColumn(name, agg, source, dict(params))


def _params(name: str, text: str) -> dict:
    params: dict = {}
    rest = text.strip()
    while rest:
        found = _PARAM.match(rest)
        if not found:
            raise InvalidInputError(f"rollup column '{name}': cannot read the parameters "
                                    f"{text.strip()!r}; write them as name=value, ...")
        key, value = found.group(1), found.group(2).strip()
        params[key] = value[1:-1] if value.startswith("'") else value
        rest = rest[found.end():].strip()
    return params
