"""Table schemas: columns with stable ids, each value column carrying its aggregate function.

The function is part of the column's definition (like `pv BIGINT SUM` in StarRocks DDL), so the
schema alone says how every column merges; options such as `fields.<col>.agg` are translated
into it and never kept beside it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

import pyarrow as pa

from aggfuncs import AggFunction, Aggregator, make_aggregator
from aggfuncs.arg_select import bind_orderings
from merge_engine.table.types_json import type_from_json, type_to_json
from tally.errors import SchemaError


@dataclass(frozen=True)
class Column:
    """One column: its stable id, name, Arrow type, nullability and aggregate function."""

    id: int
    name: str
    type: pa.DataType
    nullable: bool = True
    agg: AggFunction | None = None
    params: dict = field(default_factory=dict)

    def to_json(self) -> dict:
        d = {"id": self.id, "name": self.name, "type": type_to_json(self.type),
             "nullable": self.nullable}
        if self.agg is not None:
            d["agg"] = {"function": self.agg.value, "parameters": dict(self.params)}
        return d

    @classmethod
    def from_json(cls, d: dict) -> "Column":
        agg = d.get("agg")
        return cls(
            id=int(d["id"]),
            name=str(d["name"]),
            type=type_from_json(d["type"]),
            nullable=bool(d.get("nullable", True)),
            agg=AggFunction.parse(agg["function"], d["name"]) if agg else None,
            params=dict(agg.get("parameters", {})) if agg else {},
        )


def _column_text(column: Column, is_key: bool) -> str:
    """`name type [NOT NULL] [function(parameter=value, ...)]`: every parameter given."""
    text = f"{column.name} {column.type}"
    if not column.nullable and not is_key:
        text += " NOT NULL"
    if column.agg is not None:
        params = ", ".join(f"{k}={v!r}" for k, v in sorted(column.params.items()))
        text += f" {column.agg.value}" + (f"({params})" if params else "")
    return text


class Schema:
    """An immutable, validated list of columns plus primary and partition keys."""

    def __init__(self, columns, primary_key=(), partition_key=()):
        self.columns: tuple[Column, ...] = tuple(columns)
        self.primary_key: tuple[str, ...] = tuple(primary_key)
        self.partition_key: tuple[str, ...] = tuple(partition_key)
        self._by_name = {c.name: c for c in self.columns}
        self._validate()

    @staticmethod
    def builder() -> "SchemaBuilder":
        return SchemaBuilder()

    def _validate(self) -> None:
        if len(self._by_name) != len(self.columns):
            seen, dup = set(), None
            for c in self.columns:
                dup = c.name if c.name in seen else dup
                seen.add(c.name)
            raise SchemaError(f"Column '{dup}' is defined twice")
        for key in self.primary_key + self.partition_key:
            if key not in self._by_name:
                raise SchemaError(f"Key column '{key}' is not a column of the schema")
        if len(set(self.primary_key)) != len(self.primary_key):
            raise SchemaError(f"Primary key {list(self.primary_key)} names a column twice")
        if self.primary_key:
            outside = [k for k in self.partition_key if k not in self.primary_key]
            if outside:
                raise SchemaError(
                    f"Partition key columns {outside} must be part of the primary key "
                    f"{list(self.primary_key)}"
                )
        for c in self.columns:
            if c.name in self.primary_key and c.agg is not None:
                raise SchemaError(
                    f"Cannot set aggregation function for primary key column '{c.name}'. "
                    "Primary key columns are the row's identity and are never aggregated."
                )
            if c.agg is not None:
                make_aggregator(c.agg, c.name, c.type, c.params)
        self.aggregators(True)  # arg_max/arg_min: their ordering columns exist and are ordered

    # --- lookups ----------------------------------------------------------------------------

    def column(self, name: str) -> Column:
        try:
            return self._by_name[name]
        except KeyError:
            raise SchemaError(
                f"Unknown column '{name}'; the columns are {self.names}"
            ) from None

    def has_column(self, name: str) -> bool:
        return name in self._by_name

    @property
    def names(self) -> list[str]:
        return [c.name for c in self.columns]

    @property
    def value_columns(self) -> list[Column]:
        return [c for c in self.columns if c.name not in self.primary_key]

    def with_column(self, name: str, arrow_type: pa.DataType, function: AggFunction | str | None = None,
                    **params) -> "Schema":
        """This schema plus one nullable value column at the end, with the next stable id
        (never reused: one past the highest id so far). Validated exactly as at creation (the
        builder's column construction, then the schema's checks)."""
        if not isinstance(name, str) or not name:
            raise SchemaError(f"A column name must be a non-empty string, got {name!r}")
        agg = None if function is None else AggFunction.parse(function, name)
        if agg is None and params:
            raise SchemaError(f"Column '{name}' has parameters {sorted(params)} but no "
                              "aggregation function")
        next_id = max((c.id for c in self.columns), default=-1) + 1
        column = _make_column(next_id, name, arrow_type, True, agg, params, is_key=False)
        return Schema(self.columns + (column,), self.primary_key, self.partition_key)

    def extends(self, older: "Schema") -> bool:
        """Whether this schema is `older` plus columns added at the end (add_column)."""
        n = len(older.columns)
        return (self.primary_key == older.primary_key
                and self.partition_key == older.partition_key
                and len(self.columns) >= n
                and [c.to_json() for c in self.columns[:n]] == [c.to_json() for c in older.columns])

    def index(self, name: str) -> int:
        return self.names.index(self.column(name).name)

    def to_arrow(self) -> pa.Schema:
        return pa.schema([pa.field(c.name, c.type, nullable=c.nullable) for c in self.columns])

    def aggregators(self, aggregation: bool) -> list[Aggregator]:
        """One aggregator per column: the declared function, or the engine's default.

        Key columns and every column of a non-aggregation table take last_value (the input
        replaces the value); undeclared value columns of an aggregation table take
        last_value_ignore_nulls.
        """
        result = []
        for c in self.columns:
            if c.name in self.primary_key or not aggregation:
                fn, params = AggFunction.LAST_VALUE, {}
            else:
                fn, params = c.agg or AggFunction.LAST_VALUE_IGNORE_NULLS, c.params
            result.append(make_aggregator(fn, c.name, c.type, params))
        bind_orderings(result, {c.name: c.type for c in self.columns})
        return result

    # --- serialization ----------------------------------------------------------------------

    def to_json(self) -> str:
        return json.dumps(
            {
                "columns": [c.to_json() for c in self.columns],
                "primary_key": list(self.primary_key),
                "partition_key": list(self.partition_key),
            },
            sort_keys=True,
        )

    @classmethod
    def from_json(cls, text: str | dict) -> "Schema":
        try:
            d = json.loads(text) if isinstance(text, str) else text
            columns = [Column.from_json(c) for c in d["columns"]]
            return cls(columns, d.get("primary_key", ()), d.get("partition_key", ()))
        except (KeyError, TypeError, ValueError) as exc:
            raise SchemaError(f"Malformed schema JSON: {exc}") from None

    def __eq__(self, other) -> bool:
        return isinstance(other, Schema) and self.to_json() == other.to_json()

    def __hash__(self) -> int:
        return hash(self.to_json())

    def __repr__(self) -> str:
        cols = ", ".join(_column_text(c, c.name in self.primary_key) for c in self.columns)
        keys = f"primary key {list(self.primary_key)}"
        if self.partition_key:
            keys += f", partition key {list(self.partition_key)}"
        return f"Schema({cols}; {keys})"


class SchemaBuilder:
    """`Schema.builder().column(...).agg_column(...).primary_key(...).build()`."""

    def __init__(self):
        self._columns: list[tuple] = []
        self._primary_key: tuple[str, ...] = ()
        self._partition_key: tuple[str, ...] = ()

    def column(self, name: str, arrow_type: pa.DataType, nullable: bool = True) -> "SchemaBuilder":
        self._columns.append((name, arrow_type, nullable, None, {}))
        return self

    def agg_column(self, name: str, arrow_type: pa.DataType, function: AggFunction | str,
                   nullable: bool = True, **params) -> "SchemaBuilder":
        if function is None:
            raise SchemaError(f"Aggregation function of column '{name}' must not be None")
        self._columns.append((name, arrow_type, nullable, AggFunction.parse(function, name),
                              params))
        return self

    def primary_key(self, *columns: str) -> "SchemaBuilder":
        self._primary_key = tuple(columns)
        return self

    def partition_key(self, *columns: str) -> "SchemaBuilder":
        self._partition_key = tuple(columns)
        return self

    def build(self) -> Schema:
        columns = [_make_column(i, name, arrow_type, nullable, agg, params,
                                is_key=name in self._primary_key)
                   for i, (name, arrow_type, nullable, agg, params) in enumerate(self._columns)]
        return Schema(columns, self._primary_key, self._partition_key)


def _make_column(column_id: int, name: str, arrow_type, nullable: bool, agg, params: dict,
                 is_key: bool) -> Column:
    """One column as a table's creation builds it (and add_column, with the same checks)."""
    if not isinstance(arrow_type, pa.DataType):
        raise SchemaError(f"Column '{name}' needs a pyarrow type, got {arrow_type!r}")
    type_to_json(arrow_type)  # rejects unsupported types early, naming the type
    if agg is not None:
        # Normalise option strings ('true', ';') into typed parameters once, here.
        params = make_aggregator(agg, name, arrow_type, params).explicit_params()
    return Column(column_id, name, arrow_type, nullable and not is_key, agg, params)
