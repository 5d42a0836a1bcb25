"""One small fold per aggregate function, written from docs/core-contract.md.

Every fold has the signature `fold(column, stored, written, inputs, merge_state) -> value`:
`stored` is the cell's current value, `written` its written bit, `inputs` the values of the put's
rows for this key in batch order (already checked against the column type), and `merge_state`
says the inputs are partial states (MERGE_STATE mode). Results are not yet range-checked: the
contract judges overflow on each key's folded result, which the caller does once per key.
"""

from __future__ import annotations

import decimal
from typing import Any, Callable

from aggfuncs import AggFunction
from merge_engine.testing.spec import ColumnSpec
from merge_engine.testing.values import EXACT, is_decimal, is_float, order_key, round_float32

Fold = Callable[[ColumnSpec, Any, bool, list, bool], Any]


def _present(stored: Any, inputs: list) -> list:
    """The null rule: the stored value (if any) then every non-null input, in order."""
    return [v for v in [stored, *inputs] if v is not None]


def _left_fold(step: Callable[[Any, Any], Any], values: list) -> Any:
    """A strict left fold; None when there is nothing to fold (null with null gives null)."""
    if not values:
        return None
    acc = values[0]
    for v in values[1:]:
        acc = step(acc, v)
    return acc


def fold_sum(col: ColumnSpec, stored, written, inputs, merge_state):
    if is_float(col.type):
        if col.type.bit_width == 32:
            return _left_fold(lambda a, b: round_float32(a + b), _present(stored, inputs))
        return _left_fold(lambda a, b: a + b, _present(stored, inputs))
    if is_decimal(col.type):
        return _left_fold(lambda a, b: EXACT.add(a, b), _present(stored, inputs))
    # Integers: exact Python ints; the caller rejects a result outside the type.
    return _left_fold(lambda a, b: a + b, _present(stored, inputs))


def fold_product(col: ColumnSpec, stored, written, inputs, merge_state):
    if is_float(col.type):
        if col.type.bit_width == 32:
            return _left_fold(lambda a, b: round_float32(a * b), _present(stored, inputs))
        return _left_fold(lambda a, b: a * b, _present(stored, inputs))
    if is_decimal(col.type):
        quantum = decimal.Decimal(1).scaleb(-col.type.scale)

        def times(a, b):
            # HALF_UP to the column's scale after every multiplication (contract).
            return EXACT.multiply(a, b).quantize(quantum, rounding=decimal.ROUND_HALF_UP, context=EXACT)

        return _left_fold(times, _present(stored, inputs))
    return _left_fold(lambda a, b: a * b, _present(stored, inputs))


def fold_count(col: ColumnSpec, stored, written, inputs, merge_state):
    base = stored if stored is not None else 0
    if merge_state:
        # Inputs are partial counts: added, a null adds 0.
        return base + sum(v for v in inputs if v is not None)
    # AGGREGATE: one per targeted row whose input is non-null.
    return base + sum(1 for v in inputs if v is not None)


def fold_max(col: ColumnSpec, stored, written, inputs, merge_state):
    # Ties keep the accumulator (only NaN payloads could tell, and the strategies draw one NaN).
    return _left_fold(lambda a, b: b if order_key(b) > order_key(a) else a, _present(stored, inputs))


def fold_min(col: ColumnSpec, stored, written, inputs, merge_state):
    return _left_fold(lambda a, b: b if order_key(b) < order_key(a) else a, _present(stored, inputs))


def fold_last_value(col: ColumnSpec, stored, written, inputs, merge_state):
    # The last written value, null included.
    return inputs[-1] if inputs else stored


def fold_last_value_ignore_nulls(col: ColumnSpec, stored, written, inputs, merge_state):
    non_null = [v for v in inputs if v is not None]
    return non_null[-1] if non_null else stored


def fold_first_value(col: ColumnSpec, stored, written, inputs, merge_state):
    # The first written value even if null: only an unwritten cell takes an input.
    if written or not inputs:
        return stored
    return inputs[0]


def fold_first_value_ignore_nulls(col: ColumnSpec, stored, written, inputs, merge_state):
    if stored is not None:
        return stored
    non_null = [v for v in inputs if v is not None]
    return non_null[0] if non_null else None


def fold_string_agg(col: ColumnSpec, stored, written, inputs, merge_state):
    present = _present(stored, inputs)
    if not present:
        return None
    delimiter = col.delimiter
    if not col.distinct:
        return delimiter.join(present)
    if not [v for v in inputs if v is not None]:
        return stored  # nothing to add: x with null gives x, untouched
    tokens: list[str] = []
    for piece in present:
        for token in piece.split(delimiter):
            if token not in tokens:
                tokens.append(token)
    return delimiter.join(tokens)


def fold_array_agg(col: ColumnSpec, stored, written, inputs, merge_state):
    # An empty list holds no element: like a null, it contributes nothing (contract).
    inputs = [None if isinstance(v, list) and not v else v for v in inputs]
    if all(v is None for v in inputs):
        return stored
    elements: list = list(stored) if stored is not None else []
    for v in inputs:
        if v is None:
            continue
        # A list<T> input is concatenated, a T input appended.
        if isinstance(v, list):
            elements.extend(v)
        else:
            elements.append(v)
    if not col.distinct:
        return elements
    kept: list = []
    for e in elements:
        if not any(_same_element(e, k) for k in kept):
            kept.append(e)
    return kept


def _same_element(a, b) -> bool:
    if a is None or b is None:
        return a is None and b is None
    return a == b


def fold_bool_and(col: ColumnSpec, stored, written, inputs, merge_state):
    return _left_fold(lambda a, b: a and b, _present(stored, inputs))


def fold_bool_or(col: ColumnSpec, stored, written, inputs, merge_state):
    return _left_fold(lambda a, b: a or b, _present(stored, inputs))


FOLDS: dict[AggFunction, Fold] = {
    AggFunction.SUM: fold_sum,
    AggFunction.PRODUCT: fold_product,
    AggFunction.COUNT: fold_count,
    AggFunction.MAX: fold_max,
    AggFunction.MIN: fold_min,
    AggFunction.LAST_VALUE: fold_last_value,
    AggFunction.LAST_VALUE_IGNORE_NULLS: fold_last_value_ignore_nulls,
    AggFunction.FIRST_VALUE: fold_first_value,
    AggFunction.FIRST_VALUE_IGNORE_NULLS: fold_first_value_ignore_nulls,
    AggFunction.STRING_AGG: fold_string_agg,
    AggFunction.ARRAY_AGG: fold_array_agg,
    AggFunction.BOOL_AND: fold_bool_and,
    AggFunction.BOOL_OR: fold_bool_or,
}


def empty_value(function: AggFunction | None) -> Any:
    """The state of a cell no write has targeted: null, or 0 for count."""
    return 0 if function is AggFunction.COUNT else None


def is_empty(function: AggFunction | None, value: Any) -> bool:
    """Whether a value is the empty state (null, or count 0): what a partial delete tests."""
    if function is AggFunction.COUNT:
        return value is None or value == 0
    return value is None
