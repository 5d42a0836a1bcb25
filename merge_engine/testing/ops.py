"""Write operations as plain data: what `write_sequences` draws and a harness replays.

An operation applies to anything with the KvTablet write API (`put`, `delete`), so the same
operation runs against the engine and the reference model. `mode` is a name (AGGREGATE,
MERGE_STATE, OVERWRITE); `engine_mode` turns it into the engine's MergeMode.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


def engine_mode(name: str) -> Any:
    """The engine's MergeMode member for a mode name."""
    from merge_engine import MergeMode

    return MergeMode[name]


@dataclass(frozen=True)
class Put:
    """`put(rows, mode, target_columns, writer)`: rows are dicts with the target columns.

    With `arrow`, a harness hands the engine the rows as an Arrow table (`TableSpec.arrow_rows`)
    instead of dicts; the values are the same.
    """

    rows: tuple
    mode: str = "AGGREGATE"
    target_columns: tuple | None = None
    writer: tuple | None = None
    arrow: bool = False

    def apply(self, table: Any, mode: Any = None, convert: Any = None) -> int:
        """`convert(rows, target_columns)` turns the dict rows into another form (Arrow)."""
        rows = [dict(r) for r in self.rows]
        if convert is not None:
            rows = convert(rows, self.target_columns)
        return table.put(
            rows,
            mode=self.mode if mode is None else mode,
            target_columns=None if self.target_columns is None else list(self.target_columns),
            writer=self.writer,
        )


@dataclass(frozen=True)
class Delete:
    """`delete(keys, mode, target_columns, writer)`: keys are dicts of primary-key values."""

    keys: tuple
    mode: str = "AGGREGATE"
    target_columns: tuple | None = None
    writer: tuple | None = None

    def apply(self, table: Any, mode: Any = None) -> int:
        return table.delete(
            [dict(k) for k in self.keys],
            mode=self.mode if mode is None else mode,
            target_columns=None if self.target_columns is None else list(self.target_columns),
            writer=self.writer,
        )


@dataclass(frozen=True)
class Reopen:
    """Close the tablet and open it again from its directory (the model is unaffected)."""


Operation = Put | Delete | Reopen
