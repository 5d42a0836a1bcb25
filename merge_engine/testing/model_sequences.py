"""The reference model's sequence-ordered cells: last_value / first_value (and their
ignore-nulls forms) ordered by the table's sequence field, or by their sequence group's own
sequence (`fields.<seq>.sequence-group`), rather than by arrival.

Kept apart from the row fold because the rule differs in kind: a cell keeps the value of the
highest (or lowest) sequence seen, and the whole write is refused if any of its rows lacks a
sequence, before any key is folded.
"""

from __future__ import annotations

from aggfuncs import AggFunction
from tally.errors import InvalidInputError

_LAST = (AggFunction.LAST_VALUE, AggFunction.LAST_VALUE_IGNORE_NULLS)
_IGNORE_NULLS = (AggFunction.LAST_VALUE_IGNORE_NULLS, AggFunction.FIRST_VALUE_IGNORE_NULLS)


def check_sequences(spec, groups: dict[tuple, list[dict]], targets: list[str],
                    key_names: list[str]) -> None:
    """The whole write's sequences before any key is folded (contract): a write that lacks
    or nulls the sequence of a sequenced column, or of any column of a sequence group (a
    group's sum too), is refused as such, whatever else would fail."""
    for name in targets:
        if name in key_names or not spec.order_of(name):
            continue
        _require_sequence_columns(spec, name, targets)
        for rows in groups.values():
            if any(row.get(f) is None for row in rows for f in spec.order_of(name)):
                raise InvalidInputError(f"A write to column '{name}' needs a non-null sequence")


def fold_sequenced(spec, function: AggFunction | None, name: str, rows: list[dict],
                   targets: list[str], overwrite: bool, values: dict, sequences: dict) -> None:
    """A sequence-ordered cell: the value of the highest sequence (last_value, the later
    write on a tie) or the lowest (first_value, the earlier on a tie); the ignore-nulls
    forms only look at non-null values. OVERWRITE takes the last row, sequence and all.
    `values` and `sequences` are the row's, updated in place."""
    fields = spec.order_of(name)
    if name in fields:
        function = AggFunction.LAST_VALUE
    ignore_nulls = function in _IGNORE_NULLS
    _require_sequence_columns(spec, name, targets)
    candidates = []
    if sequences[name] is not None:
        candidates.append((sequences[name], -1, values[name]))
    for position, row in enumerate(rows):
        sequence = tuple(row.get(f) for f in fields)
        if any(s is None for s in sequence):
            raise InvalidInputError(f"A write to column '{name}' needs a non-null sequence")
        if not (ignore_nulls and row.get(name) is None):
            candidates.append((sequence, position, row.get(name)))
    if overwrite:
        last = rows[-1]
        value = last.get(name)
        values[name] = value
        sequences[name] = None if ignore_nulls and value is None else \
            tuple(last.get(f) for f in fields)
        return
    if not candidates:
        return
    pick = max if function in _LAST else min
    sequence, _, value = pick(candidates, key=lambda c: (c[0], c[1]))
    values[name], sequences[name] = value, sequence


def _require_sequence_columns(spec, name: str, targets: list[str]) -> None:
    missing = [f for f in spec.order_of(name) if f not in targets]
    if missing:
        raise InvalidInputError(f"Column '{name}' follows a sequence: a write to it must carry "
                                f"column '{missing[0]}'")
