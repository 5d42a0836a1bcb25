"""ReferenceTable: a plain-Python, per-row model of one bucket, written from docs/core-contract.md.

It is a second, independent implementation of the engine's semantics: rows are dicts, every
cell has a written bit, puts fold row by row, and the changelog is a list of `ChangeRecord`s.
Tests drive the engine and this model with the same writes and compare them; where they differ,
the contract decides which one is wrong. Slow on purpose: obvious beats fast here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable

import pyarrow as pa

from aggfuncs import AggFunction
from merge_engine.table.hidden_columns import CONTRIBUTIONS, UNWRITTEN
from merge_engine.testing.model_functions import (FOLDS, bitmap_input, empty_value, fold_merge_map,
                                                  is_empty, self_overlapping, sketch_input,
                                                  tokens_of)
from merge_engine.testing.model_sequences import check_sequences, fold_sequenced
from merge_engine.testing.model_states import STATEFUL, check_orderings, fold_stateful
from merge_engine.testing.records import ChangeRecord, as_records
from merge_engine.testing.spec import TableSpec
from merge_engine.testing.values import check_range, coerce_input, same_row, same_value
from tally.errors import DeleteDisabledError, InvalidInputError

AGGREGATE, MERGE_STATE, OVERWRITE = "AGGREGATE", "MERGE_STATE", "OVERWRITE"


def mode_name(mode: Any) -> str:
    """AGGREGATE | MERGE_STATE | OVERWRITE from the engine's MergeMode or a string."""
    name = str(getattr(mode, "name", mode)).strip().upper().replace("-", "_")
    if name not in (AGGREGATE, MERGE_STATE, OVERWRITE):
        raise InvalidInputError(f"Unknown merge mode {mode!r}")
    return name


@dataclass(frozen=True)
class RowState:
    """A stored row: every column's value, and the non-key columns no write has targeted."""

    values: dict
    unwritten: frozenset
    counts: tuple = ()  # contributions held by each sum/product cell (retraction needs them)
    tokens: tuple = ()  # the tokens of each string_agg cell whose delimiter overlaps itself
    sequences: tuple = ()  # the sequence of each sequence-ordered cell's value (None: empty)

    def same_as(self, other: "RowState") -> bool:
        return (self.unwritten == other.unwritten and tuple(self.counts) == tuple(other.counts)
                and same_value(list(self.tokens), list(other.tokens))
                and tuple(self.sequences) == tuple(other.sequences)
                and same_row(self.values, other.values))


class ReferenceTable:
    """The model of one bucket of a table (see the module docstring).

    `schema_like` is a `TableSpec`, an engine `TableDescriptor`, or an engine `Schema` (then
    `properties` gives the table properties).
    """

    def __init__(self, schema_like: Any, properties: dict | None = None):
        self.spec = TableSpec.of(schema_like, properties)
        self.names = self.spec.names
        self.key_names = list(self.spec.primary_key)
        self.value_names = [c.name for c in self.spec.value_columns]
        # Sum and product cells count their contributions (contract: row state, like the
        # written bits), so a sum of 0 is a change: it adds a contribution.
        self.counted = [n for n in self.value_names if self.spec.is_aggregation and
                        self._function(n) in (AggFunction.SUM, AggFunction.PRODUCT)]
        # string_agg cells whose joined value does not tell their tokens apart keep the tokens
        # (contract: row state, shown in images as `_tokens`).
        self.tokenized = [n for n in self.value_names if self._function(n) is AggFunction.STRING_AGG
                          and self_overlapping(self.spec.column(n).delimiter)
                          or self._function(n) in STATEFUL]  # avg, arg_*: their states
        # Cells ordered by `table.sequence-field` keep their value's sequence (contract: row
        # state, shown in images as `_sequences`).
        self.sequence_fields = self.spec.sequence_fields
        self.sequenced = self.spec.sequenced
        self._rows: dict[tuple, RowState] = {}
        self.changelog: list[ChangeRecord] = []
        self.log_start_offset = 0
        self.log_end_offset = 0
        self._writers: dict[Any, tuple[int, int]] = {}

    # --- reads ------------------------------------------------------------------------------

    def lookup(self, key: dict) -> dict | None:
        state = self._rows.get(self._key_of(key))
        return dict(state.values) if state else None

    def state(self, key: dict) -> RowState | None:
        """The stored row with its written bits (hidden from `lookup`)."""
        return self._rows.get(self._key_of(key))

    def rows(self) -> list[dict]:
        """Every row, ordered by key (what `KvTablet.to_arrow().to_pylist()` should give)."""
        return [dict(s.values) for s in self.states()]

    def states(self) -> list[RowState]:
        return [self._rows[k] for k in sorted(self._rows)]

    def changelog_records(self, start: int = 0, end: int | None = None) -> list[ChangeRecord]:
        end = self.log_end_offset if end is None else end
        return [r for r in self.changelog if start <= r.offset < end]

    def __len__(self) -> int:
        return len(self._rows)

    # --- writes -----------------------------------------------------------------------------

    def put(self, rows: Any, mode: Any = AGGREGATE, target_columns: Iterable[str] | None = None,
            writer: tuple | None = None) -> int:
        """Fold a put into the table; returns the log end offset (exclusive) after it."""
        mode = mode_name(mode)
        if not self.spec.is_aggregation:
            mode = OVERWRITE  # the default engine treats every put as OVERWRITE
        if self._is_retry(writer):
            return self._writers[writer[0]][1]
        targets = self._targets(target_columns)
        groups = self._group(self._as_dicts(rows), targets, mode)
        check_sequences(self.spec, groups, targets, self.key_names)
        check_orderings(self.spec, self._function, targets, self.key_names)
        changes: list[tuple[tuple, RowState | None, RowState]] = []
        for key, key_rows in groups.items():
            old = self._rows.get(key)
            new = self._fold(key, old, key_rows, targets, mode)
            if old is None or not new.same_as(old):
                changes.append((key, old, new))
        # Everything is validated and folded before anything is applied: a write is atomic.
        # Entries of one write are in primary-key order (contract).
        for key, old, new in sorted(changes, key=lambda change: change[0]):
            if old is None:
                self._append("+I", new)
            else:
                self._append("-U", old)
                self._append("+U", new)
            self._rows[key] = new
        return self._done(writer)

    def delete(self, keys: Any, mode: Any = AGGREGATE, target_columns: Iterable[str] | None = None,
               writer: tuple | None = None) -> int:
        """Apply a delete by the table's delete behavior; returns the log end offset after it."""
        mode = mode_name(mode)
        if self._is_retry(writer):
            return self._writers[writer[0]][1]
        behavior = "allow" if mode == OVERWRITE else self.spec.delete_behavior
        if behavior == "disable":
            raise DeleteDisabledError(
                "Delete operations are disabled for this table (table.delete.behavior = disable)"
            )
        targets = self._targets(target_columns)
        unique = {self._key_of(row) for row in self._as_dicts(keys)}
        if behavior == "ignore":
            return self._done(writer)
        partial = target_columns is not None
        for key in sorted(unique):  # entries of one write in primary-key order
            old = self._rows.get(key)
            if old is None:
                continue  # a delete of an absent key is a no-op
            if not partial:
                self._append("-D", old)
                del self._rows[key]
                continue
            new = self._reset(old, targets)
            others = [n for n in self.value_names if n not in targets]
            # Removed only when what is left is a key no write has touched (contract).
            if all(n in old.unwritten and is_empty(self._function(n), new.values[n])
                   for n in others):
                self._append("-D", old)
                del self._rows[key]
            elif not new.same_as(old):
                self._append("-U", old)
                self._append("+U", new)
                self._rows[key] = new
        return self._done(writer)

    def replay(self, changelog: Any, strict: bool = True) -> "ReferenceTable":
        """Rebuild state from a changelog (records or an engine Arrow changelog table).

        With `strict`, every -U/-D image must equal the stored row and +I must be for an absent
        key, so a changelog that does not describe a consistent history fails loudly.
        """
        for rec in as_records(changelog, self.names):
            key = self._key_of(rec.image)
            current = self._rows.get(key)
            tokens = tuple(rec.tokens) or tuple(self._split(n, rec.image[n]) for n in self.tokenized)
            state = RowState(dict(rec.image), frozenset(rec.unwritten),
                             tuple(rec.contributions) or (0,) * len(self.counted), tokens,
                             tuple(rec.sequences) or (None,) * len(self.sequenced))
            if strict:
                self._check_replay(rec, current, state)
            if rec.change_type in ("+I", "+U"):
                self._rows[key] = state
            elif rec.change_type == "-D":
                self._rows.pop(key, None)
            self.changelog.append(rec)
            self.log_end_offset = max(self.log_end_offset, rec.offset + 1)
        return self

    # --- folding ----------------------------------------------------------------------------

    def _fold(self, key: tuple, old: RowState | None, rows: list[dict], targets: list[str],
              mode: str) -> RowState:
        if old is None:
            key_values = dict(zip(self.key_names, key))
            values = {
                n: key_values[n] if n in key_values else empty_value(self._function(n))
                for n in self.names  # schema order, as the engine's images have it
            }
            old_unwritten = frozenset(self.value_names)
            counts = dict.fromkeys(self.counted, 0)
            tokens = dict.fromkeys(self.tokenized)
            sequences = dict.fromkeys(self.sequenced)
        else:
            values, old_unwritten = dict(old.values), old.unwritten
            counts = dict(zip(self.counted, old.counts))
            tokens = dict(zip(self.tokenized, old.tokens))
            sequences = dict(zip(self.sequenced, old.sequences))
        unwritten = set(old_unwritten)
        for name in targets:
            if name in self.key_names:
                continue
            column = self.spec.column(name)
            function = self._function(name)
            if name in sequences:
                fold_sequenced(self.spec, self._function(name), name, rows, targets,
                               mode == OVERWRITE, values, sequences)
                if mode != OVERWRITE or name not in (rows[-1].get(UNWRITTEN) or ()):
                    unwritten.discard(name)
                else:
                    unwritten.add(name)
                continue
            if function in STATEFUL:
                fold_stateful(self.spec, function, name, rows, dict(zip(self.key_names, key)),
                              mode == OVERWRITE, values, tokens)
                if mode != OVERWRITE or name not in (rows[-1].get(UNWRITTEN) or ()):
                    unwritten.discard(name)
                else:
                    unwritten.add(name)
                continue
            if mode == OVERWRITE:
                last = rows[-1]
                value = last.get(name)
                if function is AggFunction.COUNT and value is None:
                    value = 0
                if function is AggFunction.ARRAY_AGG and value == []:
                    value = None  # no elements: the empty state
                if function is AggFunction.STRING_AGG:
                    value = self._set_tokens(name, tokens_of(column, value), tokens)
                if function is AggFunction.MERGE_MAP:
                    value = fold_merge_map(column, None, False, [value], False)  # normalised
                if function is AggFunction.SUM_MAP:
                    value = FOLDS[function](column, None, False, [value], False)  # normalised
                values[name] = value
                if name in (last.get(UNWRITTEN) or ()):
                    unwritten.add(name)
                else:
                    unwritten.discard(name)
                if name in counts:
                    given = last.get(CONTRIBUTIONS)
                    counts[name] = given[self.counted.index(name)] if given else \
                        int(value is not None)
                continue
            inputs = [r.get(name) for r in rows]
            stored = values[name]
            if function is AggFunction.STRING_AGG:
                stored = tokens[name] if name in tokens else self._split(name, stored)
            result = FOLDS[function](column, stored, name not in old_unwritten, inputs,
                                     mode == MERGE_STATE)
            if function is AggFunction.STRING_AGG:
                result = self._set_tokens(name, result, tokens)
            # Every running value was range-checked by the fold (contract); this normalises.
            values[name] = check_range(name, column.type, result)
            unwritten.discard(name)
            if name in counts:
                counts[name] += sum(v is not None for v in inputs)
        return RowState(values, frozenset(unwritten), tuple(counts[n] for n in self.counted),
                        tuple(tokens[n] for n in self.tokenized),
                        tuple(sequences[n] for n in self.sequenced))

    def _split(self, name: str, value) -> tuple | None:
        """The tokens of a stored string_agg value (exact when the delimiter does not overlap)."""
        tokens = tokens_of(self.spec.column(name), value)
        return None if tokens is None else tuple(tokens)

    def _set_tokens(self, name: str, result: list | None, tokens: dict) -> str | None:
        """Record a string_agg cell's tokens (if it keeps them) and return its joined value."""
        if name in tokens:
            tokens[name] = None if result is None else tuple(result)
        return None if result is None else self.spec.column(name).delimiter.join(result)

    def _reset(self, old: RowState, targets: list[str]) -> RowState:
        """A partial delete: target columns back to empty and unwritten."""
        values = dict(old.values)
        unwritten = set(old.unwritten)
        counts = dict(zip(self.counted, old.counts))
        tokens = dict(zip(self.tokenized, old.tokens))
        sequences = dict(zip(self.sequenced, old.sequences))
        for name in targets:
            if name not in self.key_names:
                values[name] = empty_value(self._function(name))
                unwritten.add(name)
                if name in sequences:
                    sequences[name] = None
                if name in counts:
                    counts[name] = 0
                if name in tokens:
                    tokens[name] = None
        return RowState(values, frozenset(unwritten), tuple(counts[n] for n in self.counted),
                        tuple(tokens[n] for n in self.tokenized),
                        tuple(sequences[n] for n in self.sequenced))

    # --- input handling ---------------------------------------------------------------------

    def _function(self, name: str) -> AggFunction | None:
        return self.spec.function_of(name) if self.spec.is_aggregation else None

    def _targets(self, target_columns: Iterable[str] | None) -> list[str]:
        if target_columns is None:
            return list(self.names)
        targets = list(dict.fromkeys(target_columns))
        unknown = [t for t in targets if t not in self.names]
        if unknown:
            raise InvalidInputError(f"Unknown target columns {unknown}; the table has {self.names}")
        missing = [k for k in self.key_names if k not in targets]
        if missing:
            raise InvalidInputError(f"The target columns must include the primary key {missing}")
        return [n for n in self.names if n in targets]

    @staticmethod
    def _as_dicts(rows: Any) -> list[dict]:
        if isinstance(rows, (pa.Table, pa.RecordBatch)):
            return rows.to_pylist()
        return [dict(r) for r in rows]

    def _key_of(self, row: dict) -> tuple:
        key = []
        for name in self.key_names:
            value = row.get(name)
            if value is None:
                raise InvalidInputError(f"Primary key column '{name}' must not be null")
            key.append(coerce_input(name, self.spec.column(name).type, value))
        return tuple(key)

    def _group(self, rows: list[dict], targets: list[str], mode: str) -> dict[tuple, list[dict]]:
        """Checked rows grouped by key, each group's rows in batch order."""
        allowed = set(self.names) | ({UNWRITTEN} if mode == OVERWRITE else set())
        groups: dict[tuple, list[dict]] = {}
        for row in rows:
            unknown = [c for c in row if c not in allowed]
            if unknown:
                raise InvalidInputError(f"Unknown columns {unknown}; the table has {self.names}")
            key = self._key_of(row)
            checked = {n: self._coerce(n, row.get(n), mode) for n in targets if n not in self.key_names}
            if mode == OVERWRITE and row.get(UNWRITTEN):
                checked[UNWRITTEN] = list(row[UNWRITTEN])
            groups.setdefault(key, []).append(checked)
        return groups

    def _coerce(self, name: str, value: Any, mode: str) -> Any:
        column = self.spec.column(name)
        function = self._function(name)
        if mode == AGGREGATE and function is AggFunction.COUNT:
            return value  # AGGREGATE count only looks at whether the input is null
        if function in (AggFunction.RBM32, AggFunction.RBM64):
            value = bitmap_input(column, value)
        if function in (AggFunction.HLL_SKETCH, AggFunction.THETA_SKETCH, AggFunction.KLL_SKETCH):
            value = sketch_input(column, value)
        if function is AggFunction.STRING_AGG and isinstance(value, (list, tuple)):
            return [coerce_input(name, column.type, v) for v in value]  # a token list
        if function is AggFunction.ARRAY_AGG and value is not None and not isinstance(value, (list, tuple)):
            element = coerce_input(name, column.type.value_type, value)
            # A T input is appended; in OVERWRITE it stands for the one-element list.
            return [element] if mode == OVERWRITE else element
        return coerce_input(name, column.type, value)

    # --- log and writers --------------------------------------------------------------------

    def _append(self, change_type: str, state: RowState) -> None:
        self.changelog.append(
            ChangeRecord(self.log_end_offset, change_type, dict(state.values), state.unwritten,
                         tuple(state.counts), tuple(state.tokens), tuple(state.sequences))
        )
        self.log_end_offset += 1

    def _is_retry(self, writer: tuple | None) -> bool:
        """A writer's sequence at or below its last applied one is a retry: nothing applies."""
        if writer is None:
            return False
        writer_id, sequence = writer
        last = self._writers.get(writer_id)
        return last is not None and sequence <= last[0]

    def _done(self, writer: tuple | None) -> int:
        if writer is not None:
            self._writers[writer[0]] = (writer[1], self.log_end_offset)
        return self.log_end_offset

    def _check_replay(self, rec: ChangeRecord, current: RowState | None, state: RowState) -> None:
        if rec.change_type == "+I" and current is not None:
            raise AssertionError(f"replay: +I for a key that exists: {rec}")
        if rec.change_type in ("-U", "-D"):
            if current is None or not current.same_as(state):
                raise AssertionError(f"replay: {rec} does not match the stored row {current}")
        if rec.change_type not in ("+I", "-U", "+U", "-D"):
            raise AssertionError(f"replay: unknown change type in {rec}")
