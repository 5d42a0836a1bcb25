"""Hypothesis strategies for Tally tables: schemas (as TableSpecs), rows and write sequences.

Values lean towards the cases that break aggregates: integer type boundaries, NaN, -0.0,
infinities, empty strings, delimiters inside strings, code points beyond the BMP, nulls. Key
spaces are small so that rows of one put, and puts over time, hit the same keys.
"""

from __future__ import annotations

import datetime
import decimal
import math
from typing import Iterable

import pyarrow as pa
from hypothesis import strategies as st

from aggfuncs import AggFunction as F, build_bitmap, build_sketch, build_top_k_sketch
from merge_engine.table.descriptor import KV_BUFFER_SIZE
from merge_engine.table.hidden_columns import UNWRITTEN
from merge_engine.testing.model_functions import empty_value
from merge_engine.testing.ops import Delete, Put, Reopen
from merge_engine.testing.spec import (DELETE_BEHAVIOR, MERGE_ENGINE, SEQUENCE_FIELD, SEQUENCED,
                                       ColumnSpec, TableSpec)
from merge_engine.testing.values import int_range, make_decimal, round_float32

MODES = ("AGGREGATE", "MERGE_STATE", "OVERWRITE")
INT_TYPES = (pa.int8(), pa.int16(), pa.int32(), pa.int64())
FLOAT_TYPES = (pa.float32(), pa.float64())
DECIMAL_TYPES = (pa.decimal128(5, 2), pa.decimal128(10, 2), pa.decimal128(18, 0), pa.decimal128(38, 6))
ORDERED_TYPES = (pa.string(), pa.binary(), pa.date32(), pa.timestamp("us"))
SELECTION_TYPES = (pa.int64(), pa.float64(), pa.string(), pa.bool_(), pa.decimal128(10, 2),
                   pa.date32(), pa.list_(pa.int64()))
LIST_TYPES = (pa.list_(pa.int64()), pa.list_(pa.string()))
MAP_TYPES = (pa.map_(pa.string(), pa.int64()), pa.map_(pa.int64(), pa.string()))
# int8 sums overflow within a few writes; float sums fold left to right.
SUM_MAP_TYPES = (pa.map_(pa.string(), pa.int64()), pa.map_(pa.int64(), pa.float64()),
                 pa.map_(pa.string(), pa.int8()), pa.map_(pa.string(), pa.decimal128(10, 2)))
# Functions whose value columns an arg_max/arg_min column may be ordered by: their inputs
# are plain values of the column's type in every mode.
ORDERING_FUNCTIONS = (None, F.LAST_VALUE, F.LAST_VALUE_IGNORE_NULLS, F.FIRST_VALUE,
                      F.FIRST_VALUE_IGNORE_NULLS, F.MAX, F.MIN, F.SUM)
ORDERING_TYPES = INT_TYPES + FLOAT_TYPES + DECIMAL_TYPES + ORDERED_TYPES
# Both have the fields `id` and `sub`, so every drawn nested-key fits either type.
NESTED_TYPES = (pa.list_(pa.struct([("id", pa.int64()), ("sub", pa.string()), ("v", pa.int64())])),
                pa.list_(pa.struct([("id", pa.string()), ("sub", pa.int64()), ("v", pa.string())])))

# Every supported (function, type) pair the strategies draw from. None: a column without a
# function (last_value_ignore_nulls on aggregation tables).
FUNCTION_TYPES: dict[F | None, tuple[pa.DataType, ...]] = {
    F.SUM: INT_TYPES + FLOAT_TYPES + DECIMAL_TYPES,
    F.PRODUCT: INT_TYPES + FLOAT_TYPES + DECIMAL_TYPES,
    F.COUNT: (pa.int64(),),
    F.MAX: INT_TYPES + FLOAT_TYPES + DECIMAL_TYPES + ORDERED_TYPES,
    F.MIN: INT_TYPES + FLOAT_TYPES + DECIMAL_TYPES + ORDERED_TYPES,
    F.LAST_VALUE: SELECTION_TYPES,
    F.LAST_VALUE_IGNORE_NULLS: SELECTION_TYPES,
    F.FIRST_VALUE: SELECTION_TYPES,
    F.FIRST_VALUE_IGNORE_NULLS: SELECTION_TYPES,
    F.STRING_AGG: (pa.string(),),
    F.ARRAY_AGG: LIST_TYPES,
    F.BOOL_AND: (pa.bool_(),),
    F.BOOL_OR: (pa.bool_(),),
    F.RBM32: (pa.binary(),),
    F.RBM64: (pa.binary(),),
    F.HLL_SKETCH: (pa.binary(),),
    F.THETA_SKETCH: (pa.binary(),),
    F.KLL_SKETCH: (pa.binary(),),
    F.MERGE_MAP: MAP_TYPES,
    F.AVG: FLOAT_TYPES + DECIMAL_TYPES,
    F.SUM_MAP: SUM_MAP_TYPES,
    F.ARG_MAX: SELECTION_TYPES,
    F.ARG_MIN: SELECTION_TYPES,
    F.TOP_K: (pa.binary(),),
    F.NESTED_UPDATE: NESTED_TYPES,
    None: SELECTION_TYPES,
}
FUNCTIONS = tuple(FUNCTION_TYPES)
# Self-overlapping delimiters ("::", "||", "a:a") are the ones a joined string cannot cut back
# into its tokens; "ab" is a multi-character one that can.
DELIMITERS = (",", ";", "|", ", ", "::", "||", "ab", "a:a")
# Strings that stress concatenation, splitting and code-point order (U+FFFF sorts below
# U+1F600 by code point but not in UTF-16).
STRING_ALPHABET = st.sampled_from(["a", "b", ",", ";", "|", ":", " ", "é", "\uffff", "\U0001F600", "\x00"])
STRING_KEYS = ("", "a", "ab", "b", "a\x00", "é", "\uffff", "\U0001F600")
INT_KEYS = st.one_of(st.integers(-1, 4), st.sampled_from([-(2**63), 2**63 - 1, -256, 255]))

# --- values ----------------------------------------------------------------------------------


def _ints(arrow_type: pa.DataType) -> st.SearchStrategy[int]:
    low, high = int_range(arrow_type)
    small = st.integers(-3, 3)
    edges = st.sampled_from([low, high, low + 1, high - 1, -1, 1])
    return st.one_of(small, small, edges, st.integers(low, high))


def _floats(arrow_type: pa.DataType) -> st.SearchStrategy[float]:
    width = arrow_type.bit_width
    special = st.sampled_from([0.0, -0.0, math.inf, -math.inf, math.nan, 0.1, 0.2, 1e16, 1.0, -1.0])
    # One canonical NaN only: max/min ties between NaN payloads are not part of the contract.
    floats = st.floats(allow_nan=False, width=width)
    strategy = st.one_of(special, st.integers(-3, 3).map(float), floats)
    return strategy.map(round_float32) if width == 32 else strategy


def _decimals(arrow_type: pa.DataType) -> st.SearchStrategy[decimal.Decimal]:
    p, s = arrow_type.precision, arrow_type.scale
    top = 10**p - 1
    # Drawn as unscaled integers: st.decimals rounds wide values in the default 28-digit context.
    unscaled = st.one_of(
        st.integers(-300, 300).map(lambda i: i * 10 ** max(s - 2, 0) // 10 ** max(2 - s, 0)),
        st.sampled_from([top, -top, 1, -1]),
        st.integers(-top, top),
    )
    return unscaled.map(lambda u: make_decimal(u, s))


def values_of(arrow_type: pa.DataType, nulls: bool = True) -> st.SearchStrategy:
    """Non-key values of an Arrow type, as `to_pylist()` gives them (nulls included)."""
    if arrow_type in INT_TYPES:
        base = _ints(arrow_type)
    elif pa.types.is_unsigned_integer(arrow_type):
        high = (1 << arrow_type.bit_width) - 1
        base = st.one_of(st.integers(0, 3), st.sampled_from([high, high - 1]),
                         st.integers(0, high))
    elif pa.types.is_floating(arrow_type):
        base = _floats(arrow_type)
    elif pa.types.is_decimal(arrow_type):
        base = _decimals(arrow_type)
    elif pa.types.is_string(arrow_type):
        base = st.text(STRING_ALPHABET, max_size=4)
    elif pa.types.is_binary(arrow_type):
        base = st.binary(max_size=3)
    elif pa.types.is_boolean(arrow_type):
        base = st.booleans()
    elif pa.types.is_date32(arrow_type):
        base = st.dates(min_value=datetime.date(1, 1, 1))
    elif pa.types.is_timestamp(arrow_type):
        base = st.datetimes(min_value=datetime.datetime(1, 1, 1))
    elif pa.types.is_list(arrow_type):
        base = st.lists(values_of(arrow_type.value_type), max_size=3)
    elif pa.types.is_map(arrow_type):
        # Few keys, so that maps overwrite and delete each other's entries; a null deletes.
        keys = st.sampled_from(["", "a", "b", "\U0001F600"]) if pa.types.is_string(arrow_type.key_type) \
            else st.integers(-2, 2)
        base = st.lists(st.tuples(keys, values_of(arrow_type.item_type)), max_size=3)
    else:
        raise ValueError(f"no strategy for {arrow_type}")
    return st.one_of(st.none(), base) if nulls else base


def key_values(arrow_type: pa.DataType) -> st.SearchStrategy:
    """Primary-key values from a small space, so that keys collide."""
    if pa.types.is_string(arrow_type):
        return st.sampled_from(STRING_KEYS)
    return INT_KEYS


def token_lists(delimiter: str) -> st.SearchStrategy[list]:
    """string_agg token lists: pieces that no cut by `delimiter` would split further."""
    token = st.text(STRING_ALPHABET, max_size=3).filter(lambda t: delimiter not in t)
    return st.lists(token, max_size=3)


def bitmaps(function: F) -> st.SearchStrategy[bytes]:
    """Canonical bitmap bytes of a few small (and, for rbm64, some huge) ids."""
    ids = st.integers(0, 40) | (st.just(2**40) if function is F.RBM64 else st.just(2**31))
    return st.sets(ids, max_size=4).map(lambda s: build_bitmap(s, 32 if function is F.RBM32 else 64))


SKETCHES = (F.HLL_SKETCH, F.THETA_SKETCH, F.KLL_SKETCH)


def sketch_values(column: ColumnSpec) -> st.SearchStrategy:
    """Images of sketches of up to two small values (built with the column's parameters), or
    raw values (each adds itself). Few values per write keep a KLL sketch in exact mode, where
    its bytes do not depend on random compactions (contract: docs/functions.md)."""
    raw = st.integers(0, 40)
    if column.function is not F.KLL_SKETCH:
        raw = raw | st.sampled_from(["a", "é", "", "\U0001F600"])
    images = st.lists(raw, max_size=2).map(
        lambda vs: build_sketch(column.function, vs, dict(column.params)))
    return st.one_of(st.none(), images, raw)


# Six items: at most what the smallest drawn top_k sketch (lg-max-map-size 3) counts exactly.
TOP_K_ITEMS = ("a", "é", "", "\U0001F600", "7", "x")


def top_k_values(column: ColumnSpec) -> st.SearchStrategy:
    """Images of sketches of up to three items (built with the column's parameters). The
    items fit every drawn sketch, which so stays exact, as the model's counter is. (Raw items
    are tested on their own: the model takes images only.)"""
    lg = column.params.get("lg-max-map-size", column.params.get("lg_max_map_size", 10))
    images = st.lists(st.sampled_from(TOP_K_ITEMS), max_size=3).map(
        lambda items: build_top_k_sketch(items, int(lg)))
    return st.one_of(st.none(), images)


def nested_arrays(arrow_type: pa.DataType) -> st.SearchStrategy:
    """nested_update arrays: elements from a few keys (so that they replace each other), now
    and then a null element; null and empty arrays too."""
    struct = arrow_type.value_type
    small = {pa.int64(): st.integers(0, 2), pa.string(): st.sampled_from(["", "a", "\U0001F600"])}
    element = st.fixed_dictionaries({
        "id": small[struct.field("id").type], "sub": small[struct.field("sub").type],
        "v": st.one_of(st.none(), small[struct.field("v").type])})
    return st.one_of(st.none(), st.lists(st.one_of(element, element, st.none()), max_size=3))


def input_values(column: ColumnSpec, function: F | None, mode: str, scalar: bool = False) -> st.SearchStrategy:
    """What a write sends for a value column in a mode.

    count takes partial counts in MERGE_STATE (mostly small, sometimes huge); array_agg takes
    single elements when `scalar` (AGGREGATE/MERGE_STATE only), else lists; string_agg takes
    token lists when `scalar` (how states are sent), else strings; bitmaps take bytes or ids.
    """
    if function in (F.RBM32, F.RBM64):
        return st.one_of(st.none(), bitmaps(function), st.integers(0, 40))
    if function in SKETCHES:
        return sketch_values(column)
    if function is F.TOP_K:
        return top_k_values(column)
    if function is F.NESTED_UPDATE:
        return nested_arrays(column.type)
    if function is F.STRING_AGG and scalar:
        return st.one_of(st.none(), token_lists(column.delimiter))
    if function is F.COUNT:
        if mode == "MERGE_STATE":
            return st.one_of(st.none(), st.integers(0, 3), st.sampled_from([2**63 - 1, 2**62]))
        return st.one_of(st.none(), st.integers(0, 5))
    if function is F.ARRAY_AGG and scalar and mode != "OVERWRITE":
        return values_of(column.type.value_type)
    return values_of(column.type)


# --- schemas ---------------------------------------------------------------------------------


def _flag(value: bool) -> st.SearchStrategy:
    """A boolean parameter, given as a Python bool or as an option string (both must work)."""
    return st.sampled_from([value, "true" if value else "false"])


def params_for(function: F | None) -> st.SearchStrategy[dict]:
    if function in (F.ARG_MAX, F.ARG_MIN):
        # Ordered by the key `k` (table_specs draws another column where it can).
        return st.just({"by": "k"})
    if function is F.STRING_AGG:
        return st.fixed_dictionaries(
            {}, optional={"delimiter": st.sampled_from(DELIMITERS), "distinct": st.booleans().flatmap(_flag)}
        )
    if function is F.ARRAY_AGG:
        return st.fixed_dictionaries({}, optional={"distinct": st.booleans().flatmap(_flag)})
    # Small lg_k values take HLL and theta sketches out of their exact modes within a few
    # writes; KLL k stays above what a drawn sequence adds (exact mode, see sketch_values).
    if function is F.HLL_SKETCH:
        return st.fixed_dictionaries({}, optional={
            "lg_k": st.sampled_from([4, 5, 12, "8"]),
            "target-type": st.sampled_from(["HLL_4", "HLL_6", "hll_8"])})
    if function is F.THETA_SKETCH:
        return st.fixed_dictionaries({}, optional={"lg_k": st.sampled_from([5, 12, "6"])})
    if function is F.KLL_SKETCH:
        return st.fixed_dictionaries({}, optional={
            "k": st.sampled_from([200, "400"]), "items": st.sampled_from(["double", "float", "BIGINT"])})
    if function is F.TOP_K:
        return st.fixed_dictionaries({}, optional={
            "k": st.sampled_from([1, 3, "10"]),
            "lg_max_map_size": st.sampled_from([3, 4, "6"])})
    if function is F.NESTED_UPDATE:
        # count-limit is tested on its own: a cell cut to it
        # and read back is not the partial state an associativity check needs.
        return st.builds(lambda name, key: {name: key}, st.sampled_from(["nested-key", "nested_key"]),
                         st.sampled_from(["id", "id,sub", " sub , id"]))
    return st.just({})


@st.composite
def value_columns(draw, name: str, functions: Iterable[F | None] = FUNCTIONS) -> ColumnSpec:
    """One value column: a supported function, one of its types, and parameters."""
    function = draw(st.sampled_from(list(functions)))
    arrow_type = draw(st.sampled_from(FUNCTION_TYPES[function]))
    return ColumnSpec(name, arrow_type, function, draw(params_for(function)))


@st.composite
def table_specs(draw, aggregation: bool | None = None, functions: Iterable[F | None] = FUNCTIONS,
                min_value_columns: int = 1, max_value_columns: int = 4,
                max_key_columns: int = 2) -> TableSpec:
    """A table: 1-2 key columns (int64 or string), value columns, merge engine and delete
    behavior. `aggregation=None` draws both aggregation tables (mostly) and default-engine ones."""
    if aggregation is None:
        aggregation = draw(st.sampled_from([True, True, True, True, False]))
    n_keys = draw(st.sampled_from([1, 1, 1, 2])) if max_key_columns > 1 else 1
    keys = [ColumnSpec(f"k{i}", draw(st.sampled_from([pa.int64(), pa.string()])), nullable=False)
            for i in range(n_keys)]
    n_values = draw(st.integers(min_value_columns, max_value_columns))
    chosen = functions if aggregation else [None]
    values = [draw(value_columns(f"v{i}", chosen)) for i in range(n_values)]
    values = [draw(ordered_by_another(c, keys + values)) for c in values]
    # Key columns usually come first, but schema order is the user's choice.
    columns = keys + values
    if draw(st.integers(0, 4)) == 0:
        columns = draw(st.permutations(columns))
    properties: dict[str, str] = {}
    if aggregation:
        properties[MERGE_ENGINE] = "aggregation"
    behavior = draw(st.sampled_from([None, "ignore", "disable", "allow", "allow"]))
    if behavior is not None:
        properties[DELETE_BEHAVIOR] = behavior
    # Write-through (0), a buffer that fills every few writes, or the default one.
    buffer_size = draw(st.sampled_from([None, None, "0", "600", "4kb"]))
    if buffer_size is not None:
        properties[KV_BUFFER_SIZE] = buffer_size
    return TableSpec(tuple(columns), tuple(k.name for k in keys), properties)


@st.composite
def sequenced_table_specs(draw, functions: Iterable[F | None] = SEQUENCED + (None, F.SUM),
                          max_value_columns: int = 3) -> TableSpec:
    """An aggregation table with `table.sequence-field`: an int64 key `k`, one or two sequence
    columns (`s0` int64, `s1` string) and first/last value columns (and now and then others)."""
    keys = [ColumnSpec("k", pa.int64(), nullable=False)]
    sequence = [ColumnSpec("s0", pa.int64())]
    if draw(st.integers(0, 3)) == 0:
        sequence.append(ColumnSpec("s1", pa.string()))
    n_values = draw(st.integers(1, max_value_columns))
    values = [draw(value_columns(f"v{i}", functions)) for i in range(n_values)]
    properties = {MERGE_ENGINE: "aggregation", SEQUENCE_FIELD: ",".join(c.name for c in sequence),
                  DELETE_BEHAVIOR: draw(st.sampled_from(["allow", "ignore"]))}
    buffer_size = draw(st.sampled_from([None, "0", "600"]))
    if buffer_size is not None:
        properties[KV_BUFFER_SIZE] = buffer_size
    return TableSpec(tuple(keys + sequence + values), ("k",), properties)


@st.composite
def ordered_by_another(draw, column: ColumnSpec, columns: list[ColumnSpec]) -> ColumnSpec:
    """An arg_max/arg_min column ordered by one of `columns` (a key, or a value column whose
    inputs are plain values of an ordered type); any other column as it is."""
    if column.function not in (F.ARG_MAX, F.ARG_MIN):
        return column
    candidates = [c.name for c in columns if c.name != column.name and c.type in ORDERING_TYPES
                  and c.function in ORDERING_FUNCTIONS]
    return ColumnSpec(column.name, column.type, column.function,
                      {**column.params, "by": draw(st.sampled_from(candidates))}, column.nullable)


def single_column_specs(function: F | None, arrow_type: pa.DataType | None = None,
                        params: dict | None = None) -> st.SearchStrategy[TableSpec]:
    """An aggregation table with an int64 key `k` and one value column `v`."""
    types = st.just(arrow_type) if arrow_type is not None else st.sampled_from(FUNCTION_TYPES[function])
    param_strategy = st.just(params) if params is not None else params_for(function)
    return st.builds(
        lambda t, p: TableSpec(
            (ColumnSpec("k", pa.int64(), nullable=False), ColumnSpec("v", t, function, p)),
            ("k",), {MERGE_ENGINE: "aggregation", DELETE_BEHAVIOR: "allow"},
        ),
        types, param_strategy,
    )


# --- rows and writes -------------------------------------------------------------------------


def keys_of(spec: TableSpec) -> st.SearchStrategy[dict]:
    """A primary key as a dict."""
    return st.fixed_dictionaries({n: key_values(spec.column(n).type) for n in spec.primary_key})


@st.composite
def target_columns(draw, spec: TableSpec) -> tuple | None:
    """None (a full-row write) or the primary key plus a subset of the value columns."""
    if draw(st.booleans()):
        return None
    chosen = draw(st.lists(st.sampled_from([c.name for c in spec.value_columns]), unique=True))
    groups = spec.sequence_groups
    if groups and draw(st.booleans()):
        # A partial writer of one group: some of its columns and its sequence.
        sequence, members = draw(st.sampled_from(groups))
        chosen = draw(st.lists(st.sampled_from(members), min_size=1, unique=True)) + list(sequence)
    if spec.sequence_fields and draw(st.integers(0, 9)):
        chosen += [f for f in spec.sequence_fields if f not in chosen]  # rarely left out: refused
    orderings = [c.params["by"] for c in spec.value_columns if c.name in chosen
                 and c.function in (F.ARG_MAX, F.ARG_MIN) and c.params["by"] not in spec.primary_key]
    if orderings and draw(st.integers(0, 9)):
        chosen += [f for f in orderings if f not in chosen]  # rarely left out: refused
    for sequence, members in groups:
        if any(c in chosen for c in members) and draw(st.integers(0, 9)):
            chosen += [f for f in sequence if f not in chosen]  # rarely left out: refused
    return tuple(n for n in spec.names if n in spec.primary_key or n in chosen)


@st.composite
def rows(draw, spec: TableSpec, targets: Iterable[str] | None = None, mode: str = "AGGREGATE",
         min_size: int = 1, max_size: int = 6) -> list[dict]:
    """Rows for a put: dicts with the target columns (all columns when `targets` is None)."""
    names = list(targets) if targets is not None else spec.names
    key_strategy = keys_of(spec)
    columns = {}
    for name in names:
        if name in spec.primary_key:
            continue
        column = spec.column(name)
        function = column.function if spec.is_aggregation else None
        # array_agg inputs are either single elements or lists for the whole put; string_agg
        # inputs strings or (now and then) token lists.
        scalar = (function is F.ARRAY_AGG and draw(st.booleans())) or \
            (function is F.STRING_AGG and draw(st.integers(0, 3)) == 0)
        columns[name] = input_values(column, function, mode, scalar)
        if name in spec.sequence_columns:
            # Few sequence values, so that writes of a key tie; now and then a refused null.
            columns[name] = st.one_of(st.integers(0, 6), st.integers(0, 6), st.none()) \
                if column.type == pa.int64() else values_of(column.type, nulls=False)
    n = draw(st.integers(min_size, max_size))
    out = []
    for _ in range(n):
        row = dict(draw(key_strategy))
        for name, strategy in columns.items():
            row[name] = draw(strategy)
        if mode == "OVERWRITE" and columns and draw(st.integers(0, 5)) == 0:
            # Undo writes images back with the columns no write had targeted: empty values.
            hidden = draw(st.lists(st.sampled_from(sorted(columns)), min_size=1, unique=True))
            for name in hidden:
                row[name] = empty_value(spec.column(name).function if spec.is_aggregation else None)
            row[UNWRITTEN] = hidden
        out.append(row)
    return out


writers = st.one_of(st.none(), st.tuples(st.sampled_from(["w1", "w2"]), st.integers(0, 8)))


@st.composite
def puts(draw, spec: TableSpec, modes: Iterable[str] = MODES, writer: bool = False) -> Put:
    mode = draw(st.sampled_from(list(modes)))
    targets = draw(target_columns(spec))
    drawn = draw(rows(spec, targets, mode))
    # Dict rows mostly; sometimes the same rows as an Arrow table (the engine's other input path).
    arrow = draw(st.integers(0, 3)) == 0
    return Put(tuple(drawn), mode, targets, draw(writers) if writer else None, arrow)


@st.composite
def deletes(draw, spec: TableSpec, modes: Iterable[str] = MODES, writer: bool = False) -> Delete:
    mode = draw(st.sampled_from(list(modes)))
    targets = draw(target_columns(spec))
    keys = draw(st.lists(keys_of(spec), min_size=1, max_size=3))
    return Delete(tuple(keys), mode, targets, draw(writers) if writer else None)


def operations(spec: TableSpec, modes: Iterable[str] = MODES, writer: bool = False) -> st.SearchStrategy:
    """One write: a put (most often), a delete, or a reopen."""
    modes = list(modes)
    return st.one_of(
        puts(spec, modes, writer), puts(spec, modes, writer), puts(spec, modes, writer),
        deletes(spec, modes, writer), st.just(Reopen()),
    )


def write_sequences(spec: TableSpec, min_size: int = 1, max_size: int = 12,
                    modes: Iterable[str] = MODES, writer: bool = False) -> st.SearchStrategy[list]:
    """A list of Put / Delete / Reopen operations for a table."""
    return st.lists(operations(spec, modes, writer), min_size=min_size, max_size=max_size)
