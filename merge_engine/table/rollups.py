"""Rollups: an aggregate table whose rows are derived from every write into a source table.

A rollup has its own primary key (source columns, and time buckets of a timestamp or date
column) and its own aggregate columns over source columns. A write into the source is projected
(`RollupSpec.project`: one rollup row per source row, its key computed, its aggregate columns'
inputs taken from the source columns) and the projection is written into the rollup like any
write, so the rollup's functions fold the same inputs the source's do. A rollup aggregates what
is *written* to the source, not the source's merged cells.

Time buckets are `pyarrow.compute.floor_temporal` of the column: weeks start on Monday; a
timestamp with a time zone is bucketed in that zone's local time (a naive one as it is); a
bucket keeps the column's type (the start of the bucket). A date column takes the units from
day up.

Which writes feed a rollup (`check_mode`): AGGREGATE writes, with retractions (the change type
column passes through, so a retractable rollup function takes back exactly what was added);
MERGE_STATE writes only when every rollup column they feed has the function, parameters and
type of its source column (the states then merge as they do in the source) and none is
count(*). OVERWRITE writes and deletes replace or remove what a rollup has folded in, which
no rollup function can take back: they are refused on a source with rollups.
"""

from __future__ import annotations

import dataclasses
from typing import Iterable

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from aggfuncs import DEFAULT_FUNCTION, AggFunction, aggregator_class
from merge_engine.table import hidden_columns
from merge_engine.table.descriptor import AGGREGATION, MERGE_ENGINE, TableDescriptor
from merge_engine.table.modes import MergeMode
from merge_engine.table.rollup_expressions import (TIME_UNITS, RollupColumn, RollupKey,
                                                   parse_column, parse_key)
from merge_engine.table.schema import Schema
from tally.errors import InvalidAggFunctionError, InvalidInputError, InvalidOptionError

__all__ = ["TIME_UNITS", "RollupColumn", "RollupKey", "RollupSpec", "BACKFILL", "FROM_NOW"]

BACKFILL, FROM_NOW = "backfill", "from-now"
STARTS = (BACKFILL, FROM_NOW)
BUILDING, READY = "building", "ready"
_DATE_UNITS = ("day", "week", "month", "year")
# Functions whose merged state depends on the order of the inputs (a join, a list, the latest
# map value), besides the value-selection ones: a backfill merges the source's cells in scan
# order, not in the order their writes arrived, so it cannot rebuild them exactly.
_ARRIVAL_ORDERED = frozenset({AggFunction.STRING_AGG, AggFunction.ARRAY_AGG,
                              AggFunction.MERGE_MAP})


def _same_type(given: pa.DataType, target: pa.DataType) -> bool:
    return given == target


def _source_schema(source) -> Schema:
    return source.schema if isinstance(source, TableDescriptor) else source


@dataclasses.dataclass(frozen=True)
class RollupSpec:
    """A rollup's definition; see the module docstring. `source_key`: the source's primary key
    (recorded when the rollup is created), columns every write of the source carries."""

    name: str
    source: str
    keys: tuple[RollupKey, ...]
    columns: tuple[RollupColumn, ...]
    start: str = BACKFILL
    state: str = READY
    source_key: tuple[str, ...] = ()

    # --- definition ---------------------------------------------------------------------

    @classmethod
    def define(cls, name: str, source: str, keys, columns, start: str = BACKFILL) -> "RollupSpec":
        """keys: ["product", "date_trunc('hour', ts) AS hour"] or {name: expression};
        columns: {name: "sum(clicks)" | "count(*)" | (function, source, params)}."""
        if isinstance(keys, dict):
            parsed_keys = tuple(parse_key(expr, name=n) for n, expr in keys.items())
        elif isinstance(keys, (list, tuple)):
            parsed_keys = tuple(parse_key(expr) for expr in keys)
        else:
            raise InvalidInputError(f"rollup {name}: keys are a list of expressions or a dict "
                                    f"of name -> expression, not {type(keys).__name__}")
        if not isinstance(columns, dict):
            raise InvalidInputError(f"rollup {name}: columns are a dict of name -> expression "
                                    f"(such as {{'clicks': 'sum(clicks)'}}), not "
                                    f"{type(columns).__name__}")
        parsed_columns = tuple(parse_column(n, expr) for n, expr in columns.items())
        if start not in STARTS:
            raise InvalidOptionError(f"rollup {name}: start is one of {', '.join(STARTS)}, not "
                                     f"{start!r}")
        spec = cls(name, source, parsed_keys, parsed_columns, start,
                   BUILDING if start == BACKFILL else READY)
        spec._check_names()
        return spec

    def _check_names(self) -> None:
        if not self.keys:
            raise InvalidInputError(f"rollup {self.name}: give at least one key")
        if not self.columns:
            raise InvalidInputError(f"rollup {self.name}: give at least one aggregate column")
        seen: set[str] = set()
        for name, expression in [(k.name, k.expression) for k in self.keys] + \
                [(c.name, c.expression) for c in self.columns]:
            if name in seen:
                raise InvalidInputError(f"rollup {self.name}: the name '{name}' ({expression}) "
                                        "is used twice; name each key and column once")
            if name in hidden_columns.ALL:
                raise InvalidInputError(f"rollup {self.name}: '{name}' is a hidden column's name")
            seen.add(name)

    def to_json(self) -> dict:
        return {"name": self.name, "source": self.source, "start": self.start,
                "state": self.state, "source_key": list(self.source_key),
                "keys": [{"name": k.name, "source": k.source, "unit": k.unit}
                         for k in self.keys],
                "columns": [{"name": c.name, "function": c.function.value, "source": c.source,
                             "params": dict(c.params)} for c in self.columns]}

    @classmethod
    def from_json(cls, d: dict) -> "RollupSpec":
        try:
            return cls(str(d["name"]), str(d["source"]),
                       tuple(RollupKey(k["name"], k["source"], k.get("unit")) for k in d["keys"]),
                       tuple(RollupColumn(c["name"], AggFunction.parse(c["function"], c["name"]),
                                          c.get("source"), dict(c.get("params") or {}))
                             for c in d["columns"]),
                       str(d.get("start", BACKFILL)), str(d.get("state", READY)),
                       tuple(d.get("source_key") or ()))
        except (KeyError, TypeError, AttributeError) as e:
            raise InvalidInputError(f"malformed rollup definition {d!r}: {e}") from None

    def with_state(self, state: str) -> "RollupSpec":
        return dataclasses.replace(self, state=state)

    def bind(self, source) -> "RollupSpec":
        """This spec checked against the source's schema, with its primary key recorded."""
        schema = _source_schema(source)
        self.check(schema)
        return dataclasses.replace(self, source_key=tuple(schema.primary_key))

    def __str__(self) -> str:
        keys = ", ".join(k.expression for k in self.keys)
        columns = ", ".join(f"{c.name}={c.expression}" for c in self.columns)
        return f"{self.name} of {self.source} ({self.state}): key {keys}; {columns}"

    # --- checks against the source ------------------------------------------------------

    def check(self, source_schema) -> None:
        """Typed errors naming the expression and column when the source cannot feed this."""
        schema = _source_schema(source_schema)
        self._check_names()
        for key in self.keys:
            self._key_type(schema, key)
        for column in self.columns:
            self._column_type(schema, column)

    def _source_column(self, schema: Schema, name: str, expression: str):
        if not schema.has_column(name):
            raise InvalidInputError(f"rollup {self.name}: {expression} names column '{name}', "
                                    f"which {self.source} does not have; its columns are "
                                    f"{schema.names}")
        return schema.column(name)

    def _key_type(self, schema: Schema, key: RollupKey) -> pa.DataType:
        column = self._source_column(schema, key.source, key.expression)
        if key.unit is None:
            return column.type
        if pa.types.is_date(column.type):
            if key.unit not in _DATE_UNITS:
                raise InvalidInputError(
                    f"rollup {self.name}: {key.expression}: '{key.source}' is a date "
                    f"({column.type}); a date takes the units {', '.join(_DATE_UNITS)}")
        elif not pa.types.is_timestamp(column.type):
            raise InvalidInputError(
                f"rollup {self.name}: {key.expression}: date_trunc needs a timestamp or date "
                f"column, and '{key.source}' is {column.type}")
        return column.type

    def _column_type(self, schema: Schema, column: RollupColumn) -> pa.DataType:
        """The rollup column's type: the first of the source column's type, int64, a list of
        it, binary that the function's aggregator class accepts with the source's values as
        its inputs (sum keeps the type, count is int64, sketches and bitmaps are binary)."""
        cls = aggregator_class(column.function)
        if column.source is None:
            return pa.int64()
        given = self._source_column(schema, column.source, column.expression).type
        for candidate in (given, pa.int64(), pa.list_(given), pa.binary()):
            if not cls.accepts(candidate):
                continue
            try:
                aggregator = cls(column.name, candidate, column.params)
            except InvalidAggFunctionError as e:
                raise InvalidAggFunctionError(
                    f"rollup {self.name}: column '{column.name}' = {column.expression}: "
                    f"{e}") from None
            # takes the source's values as they are, or turns them into states itself (ids
            # into a bitmap)
            if aggregator.takes_type(given, _same_type) or aggregator.input_type(given) == given:
                return candidate
        raise InvalidAggFunctionError(
            f"rollup {self.name}: column '{column.name}' = {column.expression}: "
            f"{column.function.value} does not take '{column.source}' of type {given} (it "
            f"takes {cls.type_names})")

    def descriptor(self, source_schema, bucket_count: int | None = None,
                   options: dict | None = None) -> TableDescriptor:
        """The rollup table: its keys (the source column's type, a time bucket keeping it)
        as primary key, then its aggregate columns, an aggregation table."""
        schema = _source_schema(source_schema)
        self.check(schema)
        builder = Schema.builder()
        for key in self.keys:
            builder.column(key.name, self._key_type(schema, key))
        for column in self.columns:
            builder.agg_column(column.name, self._column_type(schema, column), column.function,
                               **column.params)
        builder.primary_key(*(k.name for k in self.keys))
        properties = dict(options or {})
        engine = properties.get(MERGE_ENGINE, AGGREGATION)
        if engine != AGGREGATION:
            raise InvalidOptionError(f"rollup {self.name}: a rollup is an aggregation table; "
                                     f"'{MERGE_ENGINE}' = {engine!r} cannot be set")
        properties[MERGE_ENGINE] = AGGREGATION
        return TableDescriptor(builder.build(), bucket_count, properties)

    def check_backfill(self, source_schema) -> None:
        """InvalidInputError naming the column when a backfill from a scan of the source could
        not be exact: the scan reads merged cells, which rebuild the rollup only when every key
        comes from the source's primary key and every column merges the states of a source
        column with the same function, in any order."""
        schema = _source_schema(source_schema)
        hint = "; create it with start='from-now' instead"
        for key in self.keys:
            if key.source not in schema.primary_key:
                raise InvalidInputError(
                    f"rollup {self.name} cannot be backfilled: key {key.expression} comes from "
                    f"'{key.source}', not a primary-key column of {self.source} (a stored row "
                    f"holds its last value, not each write's){hint}")
        for column in self.columns:
            where = f"rollup {self.name} cannot be backfilled: column '{column.name}' = " \
                    f"{column.expression}"
            if column.source is None:
                raise InvalidInputError(f"{where} counts the source's writes, which its stored "
                                        f"rows do not keep (count a count column instead){hint}")
            problem = self._state_problem(schema, column)
            if problem:
                raise InvalidInputError(f"{where}: {problem}{hint}")
            cls = aggregator_class(column.function)
            if cls.selects_value or column.function in _ARRIVAL_ORDERED:
                raise InvalidInputError(f"{where}: {column.function.value} depends on the order "
                                        "of the writes, which a scan does not keep" + hint)

    def _state_problem(self, schema: Schema, column: RollupColumn) -> str | None:
        """Why the source column's states do not merge into this rollup column, or None."""
        if column.source in schema.primary_key:
            return f"'{column.source}' is a primary-key column of {self.source}, not aggregated"
        source = schema.column(column.source)
        function = source.agg or DEFAULT_FUNCTION
        if function is not column.function:
            return f"'{column.source}' has the function {function.value}, not " \
                   f"{column.function.value}"
        mine = aggregator_class(column.function)(column.name, self._column_type(schema, column),
                                                 column.params)
        if mine.type != source.type or mine.explicit_params() != dict(source.params):
            return f"'{column.source}' is {source.type} with parameters {dict(source.params)}, " \
                   f"the rollup column {mine.type} with {mine.explicit_params()}"
        return None

    # --- writes ------------------------------------------------------------------------

    def source_columns(self) -> set[str]:
        return {k.source for k in self.keys} | {c.source for c in self.columns if c.source}

    def fed_columns(self, written: Iterable[str]) -> list[str]:
        """The aggregate columns a write of source columns `written` feeds (count(*): every
        write); InvalidInputError naming the key when it feeds some but lacks a key's source
        column (the source's primary key counts as written)."""
        present = set(written) | set(self.source_key)
        fed = [c.name for c in self.columns if c.source is None or c.source in present]
        if fed:
            for key in self.keys:
                if key.source not in present:
                    raise InvalidInputError(
                        f"a write of {self.source} feeds rollup {self.name} ({', '.join(fed)}) "
                        f"but lacks column '{key.source}' of its key {key.expression}; write "
                        f"'{key.source}' too")
        return fed

    def check_mode(self, mode, source_schema, written: Iterable[str] | None = None) -> None:
        """InvalidInputError unless a write in `mode` (of the source columns `written`, all
        when None) can feed this rollup exactly; see the module docstring."""
        mode = MergeMode.parse(mode)
        schema = _source_schema(source_schema)
        if mode is MergeMode.AGGREGATE:
            return
        if mode is MergeMode.OVERWRITE:
            raise InvalidInputError(
                f"{self.source} has the rollup {self.name}: an OVERWRITE write replaces values "
                "a rollup has folded in and cannot be rolled up; write in aggregate mode, or "
                "drop the rollup")
        fed = self.fed_columns(schema.names if written is None else written)
        for column in (c for c in self.columns if c.name in fed):
            problem = "it counts rows, and a state stands for many" if column.source is None \
                else self._state_problem(schema, column)
            if problem:
                raise InvalidInputError(
                    f"{self.source} has the rollup {self.name}: a MERGE_STATE write cannot feed "
                    f"its column '{column.name}' = {column.expression}: {problem}; write in "
                    "aggregate mode, or drop the rollup")

    def check_delete(self) -> None:
        raise InvalidInputError(
            f"{self.source} has the rollup {self.name}: a delete removes rows a rollup has "
            "folded in, which cannot be taken back from it; retract the rows instead, or drop "
            "the rollup")

    def project(self, rows: pa.Table, fed: list[str] | None = None) -> pa.Table:
        """The rollup's rows of source-named `rows`: its key columns and the inputs of the fed
        aggregate columns, one row per source row, in order; a change type column passes
        through (a retraction retracts from the rollup too)."""
        if isinstance(rows, pa.RecordBatch):
            rows = pa.Table.from_batches([rows])
        fed = self.fed_columns(rows.column_names) if fed is None else list(fed)
        names, arrays = [], []
        for key in self.keys:
            values = self._input(rows, key.source, key.expression)
            if key.unit is not None:
                values = pc.floor_temporal(values, multiple=1, unit=key.unit,
                                           week_starts_monday=True)
            names.append(key.name)
            arrays.append(values)
        by_name = {c.name: c for c in self.columns}
        for name in fed:
            column = by_name.get(name)
            if column is None:
                raise InvalidInputError(f"rollup {self.name} has no column '{name}'")
            names.append(name)
            arrays.append(pa.array(np.ones(rows.num_rows, dtype=np.int64)) if column.source is None
                          else self._input(rows, column.source, column.expression))
        if hidden_columns.CHANGE_TYPE in rows.column_names:
            names.append(hidden_columns.CHANGE_TYPE)
            arrays.append(rows.column(hidden_columns.CHANGE_TYPE))
        return pa.table(arrays, names=names)

    def _input(self, rows: pa.Table, source: str, expression: str):
        if source not in rows.column_names:
            raise InvalidInputError(f"rollup {self.name}: the rows lack column '{source}' "
                                    f"({expression}); they have {rows.column_names}")
        return rows.column(source)
