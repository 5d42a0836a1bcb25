"""Changelog records of the reference model, and reading the engine's Arrow changelog into them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable

import pyarrow as pa

from merge_engine.table.hidden_columns import (CHANGE_TYPE, CONTRIBUTIONS, OFFSET, SEQUENCES,
                                               TOKENS, UNWRITTEN)
from merge_engine.testing.values import same_row, same_value

CHANGE_TYPES = ("+I", "-U", "+U", "-D")


@dataclass(frozen=True)
class ChangeRecord:
    """One changelog entry: offset, change type, the full row image, its unwritten columns."""

    offset: int
    change_type: str
    image: dict
    unwritten: frozenset = frozenset()
    contributions: tuple = ()  # counts of the sum/product columns, in schema order
    tokens: tuple = ()  # tokens of the string_agg cells that keep them, in schema order
    sequences: tuple = ()  # per sequence-ordered cell, its value's sequence (None: empty)

    def same_as(self, other: "ChangeRecord") -> bool:
        """Equal offsets, types, unwritten sets, counts, tokens and bitwise-equal images."""
        return (
            self.offset == other.offset
            and self.change_type == other.change_type
            and self.unwritten == other.unwritten
            and tuple(self.contributions) == tuple(other.contributions)
            and same_value(list(self.tokens), list(other.tokens))
            and tuple(self.sequences) == tuple(other.sequences)
            and same_row(self.image, other.image)
        )

    def __str__(self) -> str:
        hidden = f" unwritten={sorted(self.unwritten)}" if self.unwritten else ""
        hidden += f" contributions={list(self.contributions)}" if self.contributions else ""
        hidden += f" tokens={list(self.tokens)}" if self.tokens else ""
        hidden += f" sequences={list(self.sequences)}" if self.sequences else ""
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
        unwritten = row.get(UNWRITTEN) or ()
        out.append(
            ChangeRecord(
                offset=int(row[OFFSET]),
                change_type=str(row[CHANGE_TYPE]),
                image={n: row.get(n) for n in names},
                unwritten=frozenset(unwritten),
                contributions=tuple(row.get(CONTRIBUTIONS) or ()),
                tokens=tuple(None if t is None else tuple(t.values()) if isinstance(t, dict)
                             else tuple(t) for t in (row.get(TOKENS) or {}).values()),
                sequences=tuple(None if s is None else tuple(s["sequence"].values())
                                for s in (row.get(SEQUENCES) or {}).values()),
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
            return f"changelog record {i} differs:\n  expected {e}\n  actual   {a}{_hint(expected[i:], actual[i:])}"
    if len(expected) != len(actual):
        extra = expected[len(actual):] or actual[len(expected):]
        side = "expected" if len(expected) > len(actual) else "actual"
        return (
            f"changelog lengths differ: expected {len(expected)}, actual {len(actual)}; "
            f"first extra {side} record: {extra[0]}"
            f"{_hint([], extra) if side == 'actual' else ''}"
        )
    return None


def _hint(expected: list[ChangeRecord], actual: list[ChangeRecord]) -> str:
    """A likely reason for a difference, when one of two common patterns explains it."""
    def shape(r: ChangeRecord) -> tuple:
        return (r.change_type, repr(sorted(r.image.items(), key=str)), tuple(sorted(r.unwritten)))

    n = len(expected)
    if n and len(actual) >= n and sorted(map(shape, expected)) == sorted(map(shape, actual[:n])):
        return ("\n  (the same records in another order: entries of one write are in primary-key "
                "order, docs/core-contract.md)")
    a = actual[0] if actual else None
    b = actual[1] if len(actual) > 1 else None
    if a and b and a.change_type == "-U" and b.change_type == "+U" and shape(a)[1:] == shape(b)[1:]:
        return ("\n  (the engine logged -U/+U with equal images and written bits: a change of "
                "hidden state only, which the contract does not count as a change)")
    return ""
