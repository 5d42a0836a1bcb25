"""The reference model's cells whose state is more than their value: avg (a sum and a count,
shown as their mean) and arg_max / arg_min (the selected value and its ordering value, taken
from the row's `by` column). The state is kept as the cell's hidden tokens (contract: images
carry it as `_tokens`); `values` holds what readers see.

Also sum_map, whose state is its value: per map key the sum, zero sums dropped.
"""

from __future__ import annotations

import decimal
from typing import Any

import pyarrow as pa

from aggfuncs import AggFunction
from merge_engine.testing.values import EXACT, check_range, order_key, round_float32
from tally.errors import AggregateOverflowError, InvalidInputError

ARG_SELECT = (AggFunction.ARG_MAX, AggFunction.ARG_MIN)
STATEFUL = (AggFunction.AVG,) + ARG_SELECT


def by_column(spec, name: str) -> str:
    return str(spec.column(name).params.get("by")).strip()


def check_orderings(spec, function_of, targets: list[str], key_names: list[str]) -> None:
    """A write that targets an arg_max/arg_min column must carry its `by` column (refused as
    a whole, before any key is folded)."""
    for name in targets:
        if name not in key_names and function_of(name) in ARG_SELECT and \
                by_column(spec, name) not in targets:
            raise InvalidInputError(f"A write to column '{name}' must carry column "
                                    f"'{by_column(spec, name)}'")


def fold_stateful(spec, function: AggFunction, name: str, rows: list[dict], key_values: dict,
                  overwrite: bool, values: dict, tokens: dict) -> None:
    """Fold one avg / arg_max / arg_min cell; `values` and `tokens` are the row's, updated in
    place (tokens: `(sum, count)` or `(value, by)`, None when the cell is empty)."""
    column = spec.column(name)
    if function is AggFunction.AVG:
        inputs = [r.get(name) for r in rows]
        state = None if overwrite else tokens[name]
        for x in (inputs[-1:] if overwrite else inputs):
            if x is not None:
                state = _avg_step(column, state, x)
        tokens[name], values[name] = state, _mean(column, state)
        return
    by = by_column(spec, name)
    # The null rule: a row with a null value or ordering value contributes nothing.
    orders = [key_values[by] if by in key_values else row.get(by) for row in rows]
    candidates = [(order, position, row.get(name))
                  for position, (row, order) in enumerate(zip(rows, orders))
                  if order is not None and row.get(name) is not None]
    if overwrite:
        value, order = rows[-1].get(name), orders[-1]
        state = None if order is None or value is None else (value, order)
    else:
        if tokens[name] is not None:
            candidates.insert(0, (tokens[name][1], -1, tokens[name][0]))
        if not candidates:
            return
        # The largest (smallest) ordering value, the earliest on a tie.
        if function is AggFunction.ARG_MAX:
            order, _, value = max(candidates, key=lambda c: (order_key(c[0]), -c[1]))
        else:
            order, _, value = min(candidates, key=lambda c: (order_key(c[0]), c[1]))
        state = (value, order)
    tokens[name] = state
    values[name] = None if state is None else state[0]


def _avg_step(column, state, x) -> tuple:
    total, count = state or (None, 0)
    if pa.types.is_decimal(column.type):
        total = EXACT.add(total if total is not None else decimal.Decimal(0), x)
        if total.copy_abs() >= decimal.Decimal(10).scaleb(38 - column.type.scale - 1):
            raise AggregateOverflowError(f"The sum of avg column '{column.name}' overflows")
        total = check_range(column.name, pa.decimal128(38, column.type.scale), total)
    else:
        total = float(x) if total is None else total + x
    return total, count + 1


def _mean(column, state) -> Any:
    if state is None:
        return None
    total, count = state
    if pa.types.is_decimal(column.type):
        quantum = decimal.Decimal(1).scaleb(-column.type.scale)
        return EXACT.divide(total, decimal.Decimal(count)).quantize(
            quantum, rounding=decimal.ROUND_HALF_UP, context=EXACT)
    mean = total / count
    return round_float32(mean) if column.type.bit_width == 32 else mean


def fold_sum_map(col, stored, written, inputs, merge_state):
    """Each input's entries added to their key's sum (a null value adds nothing); every
    running sum of a key in V's range (integers, decimals) or V's precision (float32); keys
    with a zero sum dropped, keys sorted, a map without entries null."""
    if all(not v for v in inputs):
        return stored  # null or empty maps bring nothing: untouched
    kind = col.type.item_type
    held = dict(stored or [])
    for entries in inputs:
        for key, value in entries or ():
            if value is None:
                continue
            if pa.types.is_floating(kind):
                total = held.get(key, 0.0) + value
                total = round_float32(total) if kind.bit_width == 32 else total
            elif pa.types.is_decimal(kind):
                total = check_range(col.name, kind,
                                    EXACT.add(held.get(key, decimal.Decimal(0)), value))
            else:
                total = check_range(col.name, kind, held.get(key, 0) + value)
            held[key] = total
            if total == 0:
                del held[key]
    return sorted(held.items(), key=lambda entry: entry[0]) or None
