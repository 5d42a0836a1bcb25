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
    """`put(rows, mode, target_columns, writer)`: rows are dicts with the target columns."""

    rows: tuple
    mode: str = "AGGREGATE"
    target_columns: tuple | None = None
    writer: tuple | None = None

    def apply(self, table: Any, mode: Any = None) -> int:
        return table.put(
            [dict(r) for r in self.rows],
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
