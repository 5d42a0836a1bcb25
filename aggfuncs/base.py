"""What every aggregator is: a column's function, validated against its type and parameters.

An aggregator works on whole Arrow arrays. Its *state* usually has the column's own type: the
stored value is the accumulator. Where the value alone would lose what later merges need, the
state is richer and readers see `values(states)` (string_agg with a self-overlapping delimiter
keeps its tokens apart). Besides the state, each stored cell carries one bit, *written*: whether
any write has targeted the column yet. Most functions treat an unwritten cell like a null (the
null rule: null with x gives x); first_value and last_value tell them apart.
"""

from __future__ import annotations

from typing import Any, Callable, ClassVar

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from aggfuncs.functions import AggFunction
from aggfuncs.segments import Segments
from tally.errors import InvalidAggFunctionError, InvalidInputError, RetractionError

IGNORE_RETRACT = "ignore-retract"


def parse_bool(name: str, value: Any) -> bool:
    """A boolean parameter, given as a Python bool or as an option string."""
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() in ("true", "false"):
        return value.strip().lower() == "true"
    raise InvalidAggFunctionError(f"Parameter '{name}' must be true or false but was {value!r}")


class Aggregator:
    """Base of the per-function aggregators.

    Subclasses set `function`, `type_names` (for messages), override `accepts(type)`, declare
    `parameters` (name -> parser) and implement `fold`.
    """

    function: ClassVar[AggFunction]
    type_names: ClassVar[str] = "any type"
    parameters: ClassVar[dict[str, Callable[[str, Any], Any]]] = {}
    defaults: ClassVar[dict[str, Any]] = {}
    # Can a write take back an earlier contribution exactly (see `fold_signed`)?
    retractable: ClassVar[bool] = False
    # Does the state need a count of contributions to know when it is empty again (a sum back
    # at 0 after +5 -5 is empty, one at 0 after +0 is not)?
    counts_contributions: ClassVar[bool] = False
    # Is a written null a value (first_value keeps it), so that only an unwritten null is empty?
    written_is_state: ClassVar[bool] = False
    # Is the order between writes a sequence field's rather than arrival's (aggfuncs.sequenced)?
    sequenced: ClassVar[bool] = False
    # Is the fold of one input state onto a cell no write has filled that state itself (a sum
    # of one value, the max of one value, ...)? Then a write of one row per key onto such
    # cells (new keys) skips the fold: the merger takes the states as they are. A property
    # test proves each function that says so against the plain-Python model.
    folds_one_as_state: ClassVar[bool] = False

    # --- what the function is (read by recovery, the sink and the table descriptor) ---------

    # Does folding the same rows in a second time leave every state as it was (max, min,
    # bool_and, bool_or, first_value*)? Then a writer that only ever replays the rows it sent
    # before (a Spark batch replayed from its offsets) needs no undo after a crash.
    replay_idempotent: ClassVar[bool] = False
    # Is the state a sketch, read as an estimate (distinct items, a quantile) when a reader
    # asks for estimates rather than images?
    estimated: ClassVar[bool] = False
    # Does the function pick one written value rather than combine them? Then a sequence field,
    # when the table has one, decides which write is latest or earliest (aggfuncs.sequenced).
    selects_value: ClassVar[bool] = False
    # Does the cell show the latest write's value? A sequence column may declare only such a
    # function: it holds the sequence of the latest write.
    keeps_latest: ClassVar[bool] = False

    def __init__(self, column: str, arrow_type: pa.DataType, params: dict | None = None):
        self.column = column
        self.type = arrow_type
        self.params = self._parse_params(params or {})
        if not self.accepts(arrow_type):
            raise InvalidAggFunctionError(
                f"Data type for {self.name} column '{column}' must be one of "
                f"[{self.type_names}] but was {arrow_type}"
            )

    @property
    def name(self) -> str:
        return self.function.value

    def _parse_params(self, given: dict) -> dict:
        parsed = {**self.defaults, IGNORE_RETRACT: False}
        accepted = {**self.parameters, IGNORE_RETRACT: parse_bool}
        for key, value in given.items():
            key = key.replace("_", "-") if key.replace("_", "-") in accepted else key
            parser = accepted.get(key)
            if parser is None:
                supported = sorted(accepted)
                raise InvalidAggFunctionError(
                    f"Parameter '{key}' is not supported for aggregation function '{self.name}' "
                    f"(column '{self.column}'). Supported parameters: {supported}"
                )
            parsed[key] = parser(key, value)
        return parsed

    def explicit_params(self) -> dict:
        """Parameters that differ from the defaults, as JSON-friendly values."""
        defaults = {**self.defaults, IGNORE_RETRACT: False}
        return {k: v for k, v in self.params.items() if defaults.get(k) != v}

    # --- type rules -------------------------------------------------------------------------

    @staticmethod
    def accepts(arrow_type: pa.DataType) -> bool:
        return True

    def input_type(self, given: pa.DataType) -> pa.DataType:
        """The type an input array is cast to before folding (the column's type by default)."""
        return self.type

    def cast_input(self, values: pa.Array) -> pa.Array:
        """Cast a written array to the input type, naming the column when it does not fit."""
        return cast_column(values, self.input_type(values.type), self)

    def takes_type(self, given: pa.DataType, widens: Callable[[pa.DataType, pa.DataType], bool],
                   states: bool = False, replaces: bool = False) -> bool:
        """Whether written columns of Arrow type `given` may feed this column, decided before
        any row is written (a job refuses a column up front instead of failing on its first
        bad value). `widens(a, b)`: every value of type a is exactly one of type b. `states`:
        the inputs are partial states (MERGE_STATE); `replaces`: they replace the stored cells
        (OVERWRITE); else they are raw values to aggregate. By default: the column's type."""
        return widens(given, self.type)

    def python_inputs(self, values: list) -> tuple[list, pa.DataType]:
        """Python values written to the column (rows given as dicts), as the values and the
        Arrow type their input array is built with: the column's type, where a list column
        also takes single elements (each a one-element list)."""
        if pa.types.is_list(self.type) or pa.types.is_large_list(self.type):
            values = [v if v is None or isinstance(v, (list, tuple)) else [v] for v in values]
        return values, self.type

    def fallback_inputs(self, values: list) -> pa.Array | None:
        """The input array of Python values no array of `python_inputs`' type holds, or None:
        they are an error naming the value (count overrides: it counts anything)."""
        return None

    # --- folding ----------------------------------------------------------------------------

    def to_state(self, values: pa.Array) -> pa.Array:
        """Turn AGGREGATE-mode inputs into states (identity for most functions)."""
        return values

    def from_merge_state(self, values: pa.Array) -> pa.Array:
        """Turn MERGE_STATE-mode inputs (partial states) into states."""
        return values

    def overwrite(self, values: pa.Array) -> pa.Array:
        """Turn OVERWRITE-mode inputs into states (they replace what is stored)."""
        return values

    def settle(self, states: pa.Array) -> pa.Array:
        """The states a cell stores, from folded ones: folds may keep what only a partial
        state needs (merge_map's deletions of keys) and a stored cell drops (identity here)."""
        return states

    def check_cells(self, states: pa.Array) -> None:
        """Refuse merged states that pass the column's cell bounds (aggfuncs.cell_limits);
        only the functions whose cells grow without end have any."""

    def empty(self, n: int) -> pa.Array:
        """The state of a cell no write has touched."""
        return pa.nulls(n, type=self.state_type)

    def is_empty(self, values: pa.Array) -> np.ndarray:
        """Whether each state is the empty state (a null; count overrides)."""
        return values.is_null().to_numpy(zero_copy_only=False)

    def holds_nothing(self, states: pa.Array, written: np.ndarray) -> np.ndarray:
        """Whether each cell holds nothing a later merge depends on: the empty state, and for
        first_value also unwritten (a written null decides every later first_value)."""
        empty = self.is_empty(states)
        return empty & ~written if self.written_is_state else empty

    # --- state and value ---------------------------------------------------------------------

    @property
    def state_type(self) -> pa.DataType:
        """The type of the stored state (the column's type unless the state keeps more)."""
        return self.type

    @property
    def tokenized(self) -> bool:
        """Whether the state keeps tokens apart (a list of strings read as their join)."""
        return False

    def values(self, states: pa.Array) -> pa.Array:
        """What readers see of states: lookup, to_arrow and changelog images."""
        return states

    # --- pre-aggregation ---------------------------------------------------------------------

    def run_breaks(self, states: pa.Array, runs: Segments) -> np.ndarray | None:
        """Rows (input order) that must start a new run so that folding each run into one state
        and merging the states equals merging the rows one by one, on any stored state (and is
        accepted or rejected alike). None: any run folds exactly (associative, exact folds)."""
        return None

    def fold(self, states: pa.Array, written: np.ndarray, segments: Segments) -> pa.Array:
        """Fold each group's states in order into one state per group.

        `written[i]` says whether row i targeted this column; unwritten rows are skipped.
        """
        raise NotImplementedError

    def fold_onto(self, stored: pa.Array, stored_written: np.ndarray, states: pa.Array,
                  segments: Segments) -> pa.Array | None:
        """`fold` of each group's stored cell (`stored`, one per group, with its written bit)
        followed by its input `states` (all written, no retractions, every group at least one),
        made by folding the inputs alone and combining the result with the stored cell once:
        the stored rows are neither concatenated with the inputs nor folded again. None where
        that would not be exactly `fold` (this default; a risky integer sum), and the merger
        folds stored and input rows together."""
        return None

    # --- retraction -------------------------------------------------------------------------

    def fold_signed(self, states: pa.Array, written: np.ndarray, segments: Segments,
                    signs: np.ndarray) -> pa.Array:
        """`fold` where rows with a negative sign take back a contribution.

        Groups without retractions fold with the vectorised `fold`; groups with retractions
        (CDC updates and deletes: the rarer case) fold row by row with `step`, in order.
        """
        retracting = written & (signs < 0)
        if not retracting.any():
            return self.fold(states, written, segments)
        if not self.retractable:
            raise RetractionError(
                f"Column '{self.column}' ({self.name}) cannot take back a contribution exactly; "
                f"set 'fields.{self.column}.ignore-retract' = 'true' to ignore retractions for it")
        slow = segments.any(retracting)
        slow_rows = slow[segments.group_ids]
        fast = self.fold(states, written & ~slow_rows, segments)
        groups = np.nonzero(slow)[0]
        values = states.to_pylist()
        results = []
        for g in groups:
            rows = segments.order[segments.starts[g]:segments.starts[g] + segments.lengths[g]]
            acc = None
            for i in rows:
                if written[i]:
                    acc = self.step(acc, values[i], int(signs[i]))
            results.append(self.finish(acc))
        index = np.arange(segments.count)
        index[groups] = segments.count + np.arange(len(groups))
        slow_values = pa.array(results, type=fast.type)
        return pa.concat_arrays([fast, slow_values]).take(pa.array(index, type=pa.int64()))

    def step(self, acc, value, sign: int):
        """One contribution (sign 1) or retraction (sign -1) applied to a Python state."""
        raise NotImplementedError

    def finish(self, acc):
        """The stored value of a Python state built by `step`."""
        return acc


def cast_column(values: pa.Array, target: pa.DataType, agg: Aggregator) -> pa.Array:
    """Cast `values` to `target` without loss, or raise an error naming the column."""
    if values.type == target:
        return values
    try:
        return values.cast(target, safe=True)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError) as exc:
        raise InvalidInputError(
            f"Column '{agg.column}' ({agg.name}, type {agg.type}) cannot take values of "
            f"type {values.type}: {exc}"
        ) from None


def valid_mask(values: pa.Array) -> np.ndarray:
    """A numpy bool array: which entries are non-null."""
    if values.null_count == 0:
        return np.ones(len(values), dtype=bool)
    return values.is_valid().to_numpy(zero_copy_only=False)


def contributions(states: pa.Array, written: np.ndarray,
                  segments: Segments) -> tuple[pa.Array, Segments]:
    """The null rule: only written, non-null states contribute. Those states, in input order,
    and the segments that group them (a group of none is empty)."""
    keep = written & valid_mask(states)
    return states.filter(pa.array(keep)), segments.filtered(keep)


def stored_contributions(stored: pa.Array, written: np.ndarray) -> pa.Array:
    """Stored cells as the fold sees them (the null rule): an unwritten cell is null."""
    if written.all() or not (valid_mask(stored) & ~written).any():
        return stored  # every unwritten cell null already (an empty row's): nothing to hide
    return pc.if_else(pa.array(written), stored, pa.nulls(len(stored), type=stored.type))


def numeric_values(values: pa.Array) -> np.ndarray:
    """The values as numpy, nulls filled with zero (callers track validity separately)."""
    if values.null_count:
        values = pc.fill_null(values, pa.scalar(0, values.type))
    return values.to_numpy(zero_copy_only=False)


def with_nulls(data: np.ndarray, valid: np.ndarray, arrow_type: pa.DataType) -> pa.Array:
    """An Arrow array of `data` with nulls where `valid` is false."""
    mask = None if valid.all() else ~valid
    return pa.array(data, type=arrow_type, mask=mask)


def fold_cells(states: pa.Array, written: np.ndarray, segments: Segments,
               combine: Callable[[list], Any], arrow_type: pa.DataType) -> pa.Array:
    """Per group, `combine` of its written, non-null cells as Python values, for states merged
    by a library object (bitmaps, sketches) rather than by Arrow kernels. A stored cell with
    only nulls after it stays byte for byte (the null rule, keep_untouched)."""
    keep = written & valid_mask(states)
    values = states.to_pylist()
    out = [None] * segments.count
    for g in np.nonzero(segments.any(keep))[0]:
        rows = segments.order[segments.starts[g]:segments.starts[g] + segments.lengths[g]]
        out[g] = combine([values[i] for i in rows if keep[i]])
    return keep_untouched(pa.array(out, type=arrow_type), states, keep, segments)


def keep_untouched(result: pa.Array, states: pa.Array, keep: np.ndarray,
                   segments: Segments) -> pa.Array:
    """`result`, except for groups whose only eligible row is their first (the stored state):
    those keep that state exactly (x with null gives x, without rewriting x)."""
    first_rows = segments.order[segments.starts[segments.lengths > 0]]
    groups = np.nonzero(segments.lengths > 0)[0]
    eligible = np.bincount(segments.group_ids[keep], minlength=segments.count)
    untouched = np.zeros(segments.count, dtype=bool)
    untouched[groups] = (eligible[groups] == 1) & keep[first_rows]
    if not untouched.any():
        return result
    index = np.full(segments.count, -1, dtype=np.int64)
    index[groups] = first_rows
    original = take_or_null(states, np.where(untouched, index, -1)).cast(result.type)
    return pc.if_else(pa.array(untouched), original, result)


def take_clamped(values: pa.Array, index: np.ndarray) -> pa.Array:
    """values[index] per group, values[0] where index is -1: for callers that choose another
    value there anyway (take_or_null nulls them at the cost of another pass)."""
    return values.take(pa.array(np.maximum(index, 0), type=pa.int64()))


def take_or_null(values: pa.Array, index: np.ndarray) -> pa.Array:
    """values[index] per group, null where index is -1."""
    found = index >= 0
    taken = take_clamped(values, index)
    if found.all():
        return taken
    return pc.if_else(pa.array(found), taken, pa.nulls(len(index), type=values.type))
