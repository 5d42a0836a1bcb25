"""A table described in plain data: what the strategies draw and the reference model reads.

`TableSpec` is the common currency of `merge_engine.testing`: it builds the engine's `Schema`
and `TableDescriptor` through the public builder, and `TableSpec.of(...)` turns an engine
`Schema` or `TableDescriptor` back into a spec, so users can hand their own tables to the model.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

import pyarrow as pa

from aggfuncs import SKETCH_FUNCTIONS, AggFunction, build_bitmap, build_sketch
from aggfuncs.base import parse_bool
from merge_engine.table.hidden_columns import UNWRITTEN
from tally.errors import InvalidAggFunctionError

MERGE_ENGINE = "table.merge-engine"
DELETE_BEHAVIOR = "table.delete.behavior"
SEQUENCE_FIELD = "table.sequence-field"
SEQUENCE_GROUP = ".sequence-group"  # `fields.<seq>[,<seq>...].sequence-group` = its columns
SEQUENCED = (AggFunction.LAST_VALUE, AggFunction.LAST_VALUE_IGNORE_NULLS, AggFunction.FIRST_VALUE,
             AggFunction.FIRST_VALUE_IGNORE_NULLS)


@dataclass(frozen=True)
class ColumnSpec:
    """One column: name, Arrow type, aggregate function (None: no function) and parameters.

    `params` holds what the user wrote (Python values or option strings); `delimiter` and
    `distinct` give the parsed values the model folds with.
    """

    name: str
    type: pa.DataType
    function: AggFunction | None = None
    params: Mapping[str, Any] = field(default_factory=dict)
    nullable: bool = True

    def __repr__(self) -> str:
        function = self.function.name if self.function is not None else None
        return f"ColumnSpec({self.name!r}, pa.{self.type}, {function}, {dict(self.params)!r})"

    @property
    def delimiter(self) -> str:
        return str(self.params.get("delimiter", ","))

    @property
    def distinct(self) -> bool:
        return parse_bool("distinct", self.params.get("distinct", False))


@dataclass(frozen=True)
class TableSpec:
    """Columns in schema order, the primary key, and the table properties."""

    columns: tuple[ColumnSpec, ...]
    primary_key: tuple[str, ...]
    properties: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "columns", tuple(self.columns))
        object.__setattr__(self, "primary_key", tuple(self.primary_key))
        object.__setattr__(self, "properties", dict(self.properties))

    # --- derived facts ----------------------------------------------------------------------

    @property
    def names(self) -> list[str]:
        return [c.name for c in self.columns]

    @property
    def value_columns(self) -> list[ColumnSpec]:
        """The non-key columns, in schema order."""
        return [c for c in self.columns if c.name not in self.primary_key]

    def column(self, name: str) -> ColumnSpec:
        for c in self.columns:
            if c.name == name:
                return c
        raise KeyError(name)

    @property
    def is_aggregation(self) -> bool:
        return str(self.properties.get(MERGE_ENGINE, "")).strip().lower() == "aggregation"

    @property
    def delete_behavior(self) -> str:
        """`ignore` | `disable` | `allow`; the default depends on the engine (contract)."""
        given = self.properties.get(DELETE_BEHAVIOR)
        if given is not None:
            return str(given).strip().lower()
        return "ignore" if self.is_aggregation else "allow"

    @property
    def sequence_fields(self) -> tuple[str, ...]:
        """The columns of `table.sequence-field` (none: writes are ordered by arrival)."""
        given = self.properties.get(SEQUENCE_FIELD)
        return () if given is None else tuple(n.strip() for n in str(given).split(","))

    @property
    def sequence_groups(self) -> list[tuple[tuple[str, ...], tuple[str, ...]]]:
        """(sequence columns, the columns they order) of each `fields.<seq>.sequence-group`."""
        groups = []
        for key in sorted(self.properties):
            if key.startswith("fields.") and key.endswith(SEQUENCE_GROUP):
                sequence = key[len("fields."):-len(SEQUENCE_GROUP)]
                groups.append((tuple(n.strip() for n in sequence.split(",")),
                               tuple(n.strip() for n in str(self.properties[key]).split(","))))
        return groups

    def order_of(self, name: str) -> tuple[str, ...]:
        """The sequence columns a write to value column `name` must carry (none: arrival
        order and no sequence needed): its group's, or for a first/last value column in no
        group (and the field's own columns) the sequence field's."""
        if not self.is_aggregation:
            return ()
        for sequence, columns in self.sequence_groups:
            if name in sequence or name in columns:
                return sequence
        if name in self.sequence_fields or self.function_of(name) in SEQUENCED:
            return self.sequence_fields
        return ()

    @property
    def sequence_columns(self) -> list[str]:
        """Every sequence column: the sequence field's and the groups'."""
        return [*self.sequence_fields, *(n for sequence, _ in self.sequence_groups
                                         for n in sequence)]

    @property
    def sequenced(self) -> list[str]:
        """The value columns a sequence orders: the sequence columns themselves (they show
        the latest write's sequence) and the first/last value columns with a sequence to
        follow (their group's or the sequence field), in schema order."""
        if not self.is_aggregation:
            return []
        return [c.name for c in self.value_columns if self.order_of(c.name) and (
            c.name in self.sequence_columns or self.function_of(c.name) in SEQUENCED)]

    def function_of(self, name: str) -> AggFunction:
        """The function a value column folds with (last_value_ignore_nulls when none is set)."""
        fn = self.column(name).function
        return fn if fn is not None else AggFunction.LAST_VALUE_IGNORE_NULLS

    def arrow_rows(self, rows: list[dict], target_columns=None) -> pa.Table:
        """Dict rows as an Arrow table of the written columns (targets, or every column).

        An array_agg column whose values are single elements becomes a column of the element
        type (the contract's "Arrow column of type T"), string_agg token lists list<string>,
        bitmap ids int64, raw sketch values their own type; `_unwritten` becomes list<string>.
        """
        names = list(target_columns) if target_columns is not None else self.names
        arrays, fields = [], []
        for name in names:
            values = [r.get(name) for r in rows]
            column = self.column(name)
            arrow_type = column.type
            if pa.types.is_list(arrow_type) and any(
                v is not None and not isinstance(v, (list, tuple)) for v in values
            ):
                arrow_type = arrow_type.value_type
            if any(isinstance(v, (list, tuple)) for v in values) and pa.types.is_string(arrow_type):
                arrow_type = pa.list_(arrow_type)  # string_agg token lists
            if column.function in (AggFunction.RBM32, AggFunction.RBM64) and any(
                isinstance(v, int) for v in values
            ):  # bitmap ids: an integer column when all are ids, else their bitmaps
                if all(v is None or isinstance(v, int) for v in values):
                    arrow_type = pa.int64()
                else:
                    values = [build_bitmap([v], 32 if column.function is AggFunction.RBM32 else 64)
                              if isinstance(v, int) else v for v in values]
            if column.function in SKETCH_FUNCTIONS and any(
                v is not None and not isinstance(v, bytes) for v in values
            ):  # raw values: their own column when all are of one kind, else their images
                kinds = {type(v) for v in values if v is not None}
                if len(kinds) == 1:
                    arrow_type = pa.array([v for v in values if v is not None]).type
                else:
                    values = [v if v is None or isinstance(v, bytes)
                              else build_sketch(column.function, [v], dict(column.params))
                              for v in values]
            arrays.append(pa.array(values, type=arrow_type))
            fields.append(pa.field(name, arrow_type))
        if any(UNWRITTEN in r for r in rows):
            arrays.append(pa.array([r.get(UNWRITTEN) for r in rows], type=pa.list_(pa.string())))
            fields.append(pa.field(UNWRITTEN, pa.list_(pa.string())))
        return pa.Table.from_arrays(arrays, schema=pa.schema(fields))

    # --- the engine's objects ---------------------------------------------------------------

    def schema(self):
        """The engine's Schema, built through the public builder."""
        from merge_engine import Schema

        builder = Schema.builder()
        for c in self.columns:
            nullable = c.nullable and c.name not in self.primary_key
            if c.function is None:
                builder = builder.column(c.name, c.type, nullable=nullable)
            else:
                builder = builder.agg_column(c.name, c.type, c.function, nullable=nullable, **c.params)
        builder = builder.primary_key(*self.primary_key)
        return builder.build()

    def descriptor(self):
        """The engine's TableDescriptor for this spec."""
        from merge_engine import TableDescriptor

        return TableDescriptor(self.schema(), properties=dict(self.properties))

    @classmethod
    def of(cls, obj: Any, properties: Mapping[str, str] | None = None) -> "TableSpec":
        """A spec from a TableSpec, an engine TableDescriptor, or an engine Schema (+properties)."""
        if isinstance(obj, TableSpec):
            return obj
        if hasattr(obj, "schema") and hasattr(obj, "properties") and not callable(obj.schema):
            props = dict(obj.properties)
            if properties:
                props.update(properties)
            return cls._from_schema(obj.schema, props)
        return cls._from_schema(obj, dict(properties or {}))

    @classmethod
    def _from_schema(cls, schema: Any, properties: dict) -> "TableSpec":
        # The engine's Column keeps the function as `agg` and its parameters as `params`.
        columns = [ColumnSpec(col.name, col.type, col.agg, dict(col.params), col.nullable)
                   for col in schema.columns]
        return cls(tuple(columns), tuple(schema.primary_key), properties)
