"""Sequence groups: `fields.<seq>[,<seq>...].sequence-group = <col>,<col>...` gives a group of
value columns a sequence of its own, so that writers of different columns (each with its own
clock) order their writes apart: a group's first/last value columns follow the group's
sequence, never arrival and never another group's.

How a table's columns are ordered:
- a column of a group, and the group's sequence columns: by the group's sequence;
- any other value-selection column, and the `table.sequence-field` columns: by that field,
  when the table has one (else by arrival);
- a write to any column of a group (a sum as much as a last_value) must carry the group's
  sequence columns, none null; a group's aggregating columns (sum, ...) still combine every
  write whatever its sequence: the order of a sum does not change it.
"""

from __future__ import annotations

from dataclasses import dataclass

import pyarrow as pa

from tally.errors import InvalidOptionError

FIELDS_PREFIX = "fields."
GROUP_SUFFIX = ".sequence-group"
SEQUENCE_FIELD = "table.sequence-field"


@dataclass(frozen=True)
class SequenceOrder:
    """What orders a column: its sequence columns (compared in this order) and the option that
    says so (named in errors)."""

    fields: tuple[str, ...]
    option: str

    def struct_type(self, schema) -> pa.StructType:
        return pa.struct([pa.field(n, schema.column(n).type) for n in self.fields])


@dataclass(frozen=True)
class SequenceGroup:
    """One `fields.<seq>.sequence-group` option: its sequence columns and the columns they order."""

    option: str
    sequence: tuple[str, ...]
    columns: tuple[str, ...]

    @property
    def order(self) -> SequenceOrder:
        return SequenceOrder(self.sequence, self.option)


def is_group_option(key: str) -> bool:
    return key.startswith(FIELDS_PREFIX) and key.endswith(GROUP_SUFFIX) \
        and len(key) > len(FIELDS_PREFIX) + len(GROUP_SUFFIX)


def sequence_column_problem(schema, name: str) -> str | None:
    """Why value column `name` cannot hold a sequence, or None."""
    from aggfuncs import aggregator_class
    from aggfuncs.sequenced import orderable_sequence

    if not schema.has_column(name):
        return f"'{name}' is not a column; the columns are {schema.names}"
    column = schema.column(name)
    if name in schema.primary_key:
        return f"'{name}' is a primary key column; a sequence column must be a value column"
    if not orderable_sequence(column.type):
        return (f"column '{name}' has type {column.type}; a sequence column must be an "
                "integer, decimal, date, time, timestamp, string or binary")
    if column.agg is not None and not aggregator_class(column.agg).keeps_latest:
        return (f"column '{name}' has the function {column.agg.value}; a sequence column "
                "takes no function (it holds the sequence of the latest write)")
    return None


def _names(text: str) -> tuple[str, ...]:
    return tuple(n.strip() for n in str(text).split(","))


def _resolve(schema, name: str) -> str:
    """A column name as the schema spells it: Spark lower-cases option keys."""
    if schema.has_column(name):
        return name
    folded = [c for c in schema.names if c.lower() == name.lower()]
    return folded[0] if len(folded) == 1 else name


def sequence_groups(properties: dict, schema, aggregation: bool,
                    table_fields: tuple[str, ...]) -> tuple[SequenceGroup, ...]:
    """The table's sequence groups, checked (InvalidOptionError naming the option and column),
    in the order of their options' keys."""
    groups = []
    owner: dict[str, str] = {}  # column -> the option whose group (or sequence) it is in
    for key in sorted(k for k in properties if is_group_option(k)):
        value = properties[key]
        sequence = tuple(_resolve(schema, n)
                         for n in _names(key[len(FIELDS_PREFIX):-len(GROUP_SUFFIX)]))
        columns = tuple(_resolve(schema, n) for n in _names(value))
        problem = _group_problem(sequence, columns, schema, aggregation, table_fields)
        taken = next((n for n in sequence + columns if n in owner), None)
        if problem is None and taken is not None:
            problem = (f"column '{taken}' is already in the group of '{owner[taken]}'; a column "
                       "(or sequence column) belongs to at most one group")
        if problem:
            raise InvalidOptionError(f"Invalid option '{key}' = {value!r}: {problem}")
        owner.update(dict.fromkeys(sequence + columns, key))
        groups.append(SequenceGroup(key, sequence, columns))
    return tuple(groups)


def _group_problem(sequence: tuple[str, ...], columns: tuple[str, ...], schema,
                   aggregation: bool, table_fields: tuple[str, ...]) -> str | None:
    """Why `sequence` cannot order `columns` (one group on its own), or None."""
    if not aggregation:
        return ("a sequence group orders the writes of aggregation tables; set "
                "'table.merge-engine' = 'aggregation'")
    if not all(sequence) or len(set(sequence)) != len(sequence):
        return ("name the sequence column(s) between 'fields.' and '.sequence-group', "
                "distinct and separated by commas")
    if not all(columns) or len(set(columns)) != len(columns):
        return "give the group's columns as distinct names separated by commas"
    for name in sequence:
        problem = sequence_column_problem(schema, name)
        if problem:
            return f"sequence column {problem}"
        if name in table_fields:
            return (f"'{name}' is a column of '{SEQUENCE_FIELD}'; a group needs sequence "
                    "columns of its own")
    for name in columns:
        if not schema.has_column(name):
            return f"'{name}' is not a column; the columns are {schema.names}"
        if name in schema.primary_key:
            return f"'{name}' is a primary key column; a group holds value columns"
        if name in sequence:
            return f"'{name}' is the group's own sequence column"
        if name in table_fields:
            return f"'{name}' is a column of '{SEQUENCE_FIELD}'"
    return None


def column_orders(schema, aggregators: list, groups: tuple[SequenceGroup, ...],
                  table_fields: tuple[str, ...]) -> dict[str, SequenceOrder]:
    """For each value column a sequence orders or whose writes need one: that order. A group's
    columns and sequence columns take the group's; the table-wide field orders its own columns
    and the value-selection columns in no group."""
    orders: dict[str, SequenceOrder] = {}
    for group in groups:
        for name in group.sequence + group.columns:
            orders[name] = group.order
    if table_fields:
        table_order = SequenceOrder(table_fields, SEQUENCE_FIELD)
        for agg in aggregators:
            name = agg.column
            if name in orders or name in schema.primary_key:
                continue
            if name in table_fields or agg.selects_value:
                orders[name] = table_order
    return orders


def missing_sequence(groups: tuple[SequenceGroup, ...], targets) -> str | None:
    """Why a write of `targets` (column names) lacks a group's sequence, or None."""
    targets = set(targets)
    for group in groups:
        written = [c for c in group.columns if c in targets]
        absent = [s for s in group.sequence if s not in targets]
        if written and absent:
            return (f"column '{written[0]}' is in the sequence group '{group.option}': a write "
                    f"to it must also write the sequence column '{absent[0]}'")
    return None


def check_groups_against_table(descriptor, options: dict, table: str) -> None:
    """Refuse `fields.<seq>.sequence-group` options that an existing table does not have: such
    options take effect only when a table is created, so a writer that asked for a group the
    table lacks would silently be ordered otherwise. Keys may come lower-cased (Spark)."""
    asked = {str(k).lower(): v for k, v in options.items() if is_group_option(str(k).lower())}
    if not asked:
        return
    have = {(g.sequence, frozenset(g.columns)) for g in descriptor.sequence_groups}
    for group in sequence_groups(asked, descriptor.schema, descriptor.is_aggregation, ()):
        if (group.sequence, frozenset(group.columns)) not in have:
            existing = {g.option: ",".join(g.columns) for g in descriptor.sequence_groups}
            raise InvalidOptionError(
                f"Option '{group.option}' = {','.join(group.columns)!r} asks for a sequence "
                f"group the existing table '{table}' does not have (its groups: {existing or 'none'}"
                "); a table's groups are fixed when it is created")
