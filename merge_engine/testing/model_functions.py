"""One small fold per aggregate function, written from docs/core-contract.md.

Every fold has the signature `fold(column, stored, written, inputs, merge_state) -> value`:
`stored` is the cell's current value, `written` its written bit, `inputs` the values of the put's
rows for this key in batch order (already checked against the column type), and `merge_state`
says the inputs are partial states (MERGE_STATE mode). string_agg folds tokens instead: `stored`
is the cell's token list and the result is one. Integer and decimal sums, products and counts
check every running value against the type (the range rule); the caller range-checks and
normalises the result once more.
"""

from __future__ import annotations

import decimal
from typing import Any, Callable

from aggfuncs import AggFunction
from merge_engine.testing.model_states import fold_sum_map
from merge_engine.testing.spec import ColumnSpec
from merge_engine.testing.values import (EXACT, check_range, is_decimal, is_float, order_key,
                                         round_float32)
from tally.errors import InvalidInputError

Fold = Callable[[ColumnSpec, Any, bool, list, bool], Any]


def _present(stored: Any, inputs: list) -> list:
    """The null rule: the stored value (if any) then every non-null input, in order."""
    return [v for v in [stored, *inputs] if v is not None]


def _left_fold(step: Callable[[Any, Any], Any], values: list, col: ColumnSpec | None = None) -> Any:
    """A strict left fold; None when there is nothing to fold (null with null gives null).
    With `col`, every running value must fit the column's type (the range rule)."""
    if not values:
        return None
    acc = values[0]
    for v in values[1:]:
        acc = step(acc, v)
        if col is not None:
            check_range(col.name, col.type, acc)
    return acc


def fold_sum(col: ColumnSpec, stored, written, inputs, merge_state):
    if is_float(col.type):
        if col.type.bit_width == 32:
            return _left_fold(lambda a, b: round_float32(a + b), _present(stored, inputs))
        return _left_fold(lambda a, b: a + b, _present(stored, inputs))
    if is_decimal(col.type):
        return _left_fold(lambda a, b: EXACT.add(a, b), _present(stored, inputs), col)
    # Integers: exact Python ints, each running total checked.
    return _left_fold(lambda a, b: a + b, _present(stored, inputs), col)


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

        return _left_fold(times, _present(stored, inputs), col)
    return _left_fold(lambda a, b: a * b, _present(stored, inputs), col)


def fold_count(col: ColumnSpec, stored, written, inputs, merge_state):
    base = stored if stored is not None else 0
    # MERGE_STATE inputs are partial counts (a null adds 0); AGGREGATE counts each non-null.
    steps = [v if merge_state else 1 for v in inputs if v is not None]
    return _left_fold(lambda a, b: a + b, [base, *steps], col)


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


def self_overlapping(delimiter: str) -> bool:
    """Whether some proper prefix of the delimiter is also its suffix ("::", "aba"): then a
    joined string does not tell its tokens apart, and the cell keeps them (`_tokens`)."""
    return any(delimiter.startswith(delimiter[len(delimiter) - k:]) for k in range(1, len(delimiter)))


def tokens_of(col: ColumnSpec, value) -> list | None:
    """The tokens of a string_agg input or image: a string cut at each delimiter (left to
    right), or a token list as given. None (a null, or no tokens) contributes nothing."""
    if value is None:
        return None
    if isinstance(value, str):
        return value.split(col.delimiter)
    for token in value:
        if token is None or col.delimiter in token:
            raise InvalidInputError(f"Column '{col.name}' cannot take the token {token!r}")
    return list(value) or None


def fold_string_agg(col: ColumnSpec, stored, written, inputs, merge_state):
    """Tokens: the stored tokens then each input's; distinct keeps first occurrences."""
    pieces = [t for t in (tokens_of(col, v) for v in inputs) if t is not None]
    if not pieces:
        return stored  # nothing to add: x with null gives x, untouched
    tokens = [*(stored or []), *(t for piece in pieces for t in piece)]
    if not col.distinct:
        return tokens
    kept: list[str] = []
    for token in tokens:
        if token not in kept:
            kept.append(token)
    return kept


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


def _bitmap_class(col: ColumnSpec):
    from pyroaring import BitMap, BitMap64

    return BitMap if col.function is AggFunction.RBM32 else BitMap64


def bitmap_input(col: ColumnSpec, value):
    """A bitmap input: bytes as given, or an integer id as the bytes of {id}."""
    if isinstance(value, int) and not isinstance(value, bool):
        bits = 32 if col.function is AggFunction.RBM32 else 64
        if not 0 <= value < 2**bits:
            raise InvalidInputError(f"Column '{col.name}' takes ids in [0, 2**{bits}), got {value}")
        return bitmap_bytes(col, {value})
    return value


def bitmap_bytes(col: ColumnSpec, ids) -> bytes:
    """The canonical (run-optimised) bytes of a set of ids."""
    bitmap = _bitmap_class(col)(sorted(ids))
    bitmap.run_optimize()
    return bitmap.serialize()


def fold_bitmap(col: ColumnSpec, stored, written, inputs, merge_state):
    present = [v for v in inputs if v is not None]
    if not present:
        return stored  # the null rule: untouched, byte for byte
    ids: set = set()
    for data in [stored, *present]:
        if data is not None:
            try:
                ids |= set(_bitmap_class(col).deserialize(data))
            except (ValueError, TypeError):
                raise InvalidInputError(f"Column '{col.name}' got bytes that are not a bitmap") from None
    return bitmap_bytes(col, ids)


# --- sketches: DataSketches images, merged by the datasketches package ---------------------

_KLL_ITEMS = {"double": ("kll_doubles_sketch", "d"), "float": ("kll_floats_sketch", "f"),
              "bigint": ("kll_items_sketch", "q")}


def _param(col: ColumnSpec, name: str, default):
    for key in (name, name.replace("-", "_")):
        if key in col.params:
            return col.params[key]
    return default


def _kll_items(col: ColumnSpec) -> str:
    return str(_param(col, "items", "double")).strip().lower()


def _new_sketch(col: ColumnSpec):
    """An empty sketch of the column's kind and parameters."""
    import datasketches as ds

    if col.function is AggFunction.HLL_SKETCH:
        return ds.hll_sketch(int(_param(col, "lg-k", 12)),
                             getattr(ds.tgt_hll_type, str(_param(col, "target-type", "HLL_4")).upper()))
    if col.function is AggFunction.THETA_SKETCH:
        return ds.update_theta_sketch(int(_param(col, "lg-k", 12)))
    return getattr(ds, _KLL_ITEMS[_kll_items(col)][0])(int(_param(col, "k", 200)))


def _read_sketch(col: ColumnSpec, data: bytes):
    import datasketches as ds

    try:
        if col.function is AggFunction.HLL_SKETCH:
            return ds.hll_sketch.deserialize(data)
        if col.function is AggFunction.THETA_SKETCH:
            return ds.compact_theta_sketch.deserialize(data)
        items = _kll_items(col)
        if items == "bigint":
            return ds.kll_items_sketch.deserialize(data, ds.PyLongsSerDe())
        return getattr(ds, _KLL_ITEMS[items][0]).deserialize(data)
    except (ValueError, RuntimeError, TypeError, IndexError, OverflowError):
        raise InvalidInputError(f"Column '{col.name}' got bytes that are not its sketch") from None


def _sketch_image(col: ColumnSpec, sketches: list) -> bytes:
    """The canonical image of the merge of `sketches` (contract: a DataSketches union, or a
    KLL merge, of everything, stored in the canonical layout)."""
    import datasketches as ds

    from aggfuncs.sketch_images import canonical_hll, canonical_kll

    if col.function is AggFunction.HLL_SKETCH:
        union = ds.hll_union(int(_param(col, "lg-k", 12)))
        for sketch in sketches:
            union.update(sketch)
        target = getattr(ds.tgt_hll_type, str(_param(col, "target-type", "HLL_4")).upper())
        return canonical_hll(union.get_result(target).serialize_compact())
    if col.function is AggFunction.THETA_SKETCH:
        union = ds.theta_union(int(_param(col, "lg-k", 12)))
        for sketch in sketches:
            union.update(sketch.compact() if hasattr(sketch, "compact") else sketch)
        return union.get_result().serialize(True)
    merged = _new_sketch(col)
    for sketch in sketches:
        merged.merge(sketch)
    items = _kll_items(col)
    data = merged.serialize(ds.PyLongsSerDe()) if items == "bigint" else merged.serialize()
    return canonical_kll(data, _KLL_ITEMS[items][1])


def _as_sketch(col: ColumnSpec, value):
    """An input as a sketch: images read, a raw value as the sketch of that one value."""
    if isinstance(value, (bytes, bytearray)):
        return _read_sketch(col, bytes(value))
    sketch = _new_sketch(col)
    sketch.update(value)
    return sketch


def sketch_input(col: ColumnSpec, value):
    """A sketch column input: images as given, a raw value as the image of its sketch."""
    if value is None or isinstance(value, (bytes, bytearray)):
        return value
    return _sketch_image(col, [_as_sketch(col, value)])


def fold_sketch(col: ColumnSpec, stored, written, inputs, merge_state):
    present = [v for v in inputs if v is not None]
    if not present:
        return stored  # the null rule: untouched, byte for byte
    sketches = [_as_sketch(col, v) for v in [stored, *present] if v is not None]
    return _sketch_image(col, sketches)


def fold_bool_and(col: ColumnSpec, stored, written, inputs, merge_state):
    return _left_fold(lambda a, b: a and b, _present(stored, inputs))


def fold_bool_or(col: ColumnSpec, stored, written, inputs, merge_state):
    return _left_fold(lambda a, b: a or b, _present(stored, inputs))


def fold_merge_map(col: ColumnSpec, stored, written, inputs, merge_state):
    """Each input's entries in order: k -> v sets k, k -> null removes it. Keys sorted; a map
    left without entries is null. (The stored map never holds a deletion: it is settled.)"""
    if all(not v for v in inputs):
        return stored  # null or empty maps bring nothing: untouched
    held = dict(stored or [])
    for entries in inputs:
        for key, value in entries or ():
            if value is None:
                held.pop(key, None)
            else:
                held[key] = value
    return sorted(held.items(), key=lambda entry: entry[0]) or None


# --- top_k: an exact counter, shown as the frequent-items image of its counts ----------------


def top_k_counts(col: ColumnSpec, data: bytes) -> dict:
    """item -> count of a top_k image (exact: the strategies keep sketches below capacity)."""
    import datasketches as ds

    try:
        sketch = ds.frequent_strings_sketch.deserialize(bytes(data))
    except (ValueError, RuntimeError, TypeError, IndexError, OverflowError):
        raise InvalidInputError(f"Column '{col.name}' got bytes that are not its sketch") from None
    found = sketch.get_frequent_items(ds.frequent_items_error_type.NO_FALSE_NEGATIVES)
    return {item: estimate for item, estimate, _, _ in found}


def top_k_image(col: ColumnSpec, counts: dict) -> bytes:
    """The canonical image of a sketch holding exactly `counts` (items sorted by UTF-8 bytes)."""
    import datasketches as ds

    from aggfuncs.sketch_images import canonical_frequent_items

    sketch = ds.frequent_strings_sketch(int(_param(col, "lg-max-map-size", 10)))
    for item in sorted(counts, key=lambda text: text.encode()):
        sketch.update(item, counts[item])
    return canonical_frequent_items(sketch.serialize())


def fold_top_k(col: ColumnSpec, stored, written, inputs, merge_state):
    present = [v for v in inputs if v is not None]
    if not present:
        return stored  # the null rule: untouched, byte for byte
    counts: dict = {}
    for data in [stored, *present]:
        for item, count in (top_k_counts(col, data) if data is not None else {}).items():
            counts[item] = counts.get(item, 0) + count
    return top_k_image(col, counts)


def fold_nested_update(col: ColumnSpec, stored, written, inputs, merge_state):
    """Elements upserted by their nested key in order (a key keeps its first place), null
    elements skipped; an input without elements brings nothing; at most count-limit kept."""
    keys = [f.strip() for f in str(_param(col, "nested-key", "")).split(",")]
    arrays = [[e for e in v if e is not None] for v in inputs if v]
    if not any(arrays):
        return stored  # untouched, as given
    held: dict = {}
    for element in [e for e in (stored or []) if e is not None] + [e for a in arrays for e in a]:
        held[tuple(element[k] for k in keys)] = element
    limit = int(_param(col, "count-limit", 0))
    kept = list(held.values())
    return (kept[:limit] if limit else kept) or None


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
    AggFunction.RBM32: fold_bitmap,
    AggFunction.RBM64: fold_bitmap,
    AggFunction.HLL_SKETCH: fold_sketch,
    AggFunction.THETA_SKETCH: fold_sketch,
    AggFunction.KLL_SKETCH: fold_sketch,
    AggFunction.MERGE_MAP: fold_merge_map,
    AggFunction.SUM_MAP: fold_sum_map,
    AggFunction.TOP_K: fold_top_k,
    AggFunction.NESTED_UPDATE: fold_nested_update,
}


def empty_value(function: AggFunction | None) -> Any:
    """The state of a cell no write has targeted: null, or 0 for count."""
    return 0 if function is AggFunction.COUNT else None


def is_empty(function: AggFunction | None, value: Any) -> bool:
    """Whether a value is the empty state (null, or count 0): what a partial delete tests."""
    if function is AggFunction.COUNT:
        return value is None or value == 0
    return value is None
