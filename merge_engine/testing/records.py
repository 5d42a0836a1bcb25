"""Changelog records of the reference model, and reading the engine's Arrow changelog into them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable

import pyarrow as pa

from merge_engine.testing.values import same_row

CHANGE_TYPES = ("+I", "-U", "+U", "-D")
META_COLUMNS = ("_offset", "_change_type", "_unwritten")


@dataclass(frozen=True)
class ChangeRecord:
    """One changelog entry: offset, change type, the full row image, its unwritten columns."""

    offset: int
    change_type: str
    image: dict
    unwritten: frozenset = frozenset()

    def same_as(self, other: "ChangeRecord") -> bool:
        """Equal offsets, types, unwritten sets and bitwise-equal images."""
        return (
            self.offset == other.offset
            and self.change_type == other.change_type
            and self.unwritten == other.unwritten
            and same_row(self.image, other.image)
        )

    def __str__(self) -> str:
        hidden = f" unwritten={sorted(self.unwritten)}" if self.unwritten else ""
        return f"{self.offset} {self.change_type} {self.image!r}{hidden}"


def records_from_arrow(table: pa.Table | pa.RecordBatch, names: Iterable[str]) -> list[ChangeRecord]:
    """The records of an engine changelog table (`KvTablet.changelog()`).

    `names` are the table's columns in schema order; a missing `_unwritten` column reads as
    "every column written", so changelogs from tables without that column still replay.
    """
    names = list(names)
    rows = table.to_pylist()
    out = []
    for row in rows:
        unwritten = row.get("_unwritten") or ()
        out.append(
            ChangeRecord(
                offset=int(row["_offset"]),
                change_type=str(row["_change_type"]),
                image={n: row.get(n) for n in names},
                unwritten=frozenset(unwritten),
            )
        )
    return out


def as_records(changelog: Any, names: Iterable[str]) -> list[ChangeRecord]:
    """ChangeRecords from a list of records or an Arrow changelog table."""
    if isinstance(changelog, (pa.Table, pa.RecordBatch)):
        return records_from_arrow(changelog, names)
    return list(changelog)


def diff_records(expected: list[ChangeRecord], actual: list[ChangeRecord]) -> str | None:
    """None when both lists match record by record, else a readable description of the first
    difference (used in assertion messages)."""
    for i, (e, a) in enumerate(zip(expected, actual)):
        if not e.same_as(a):
            return f"changelog record {i} differs:\n  expected {e}\n  actual   {a}"
    if len(expected) != len(actual):
        extra = expected[len(actual):] or actual[len(expected):]
        side = "expected" if len(expected) > len(actual) else "actual"
        return (
            f"changelog lengths differ: expected {len(expected)}, actual {len(actual)}; "
            f"first extra {side} record: {extra[0]}"
        )
    return None
