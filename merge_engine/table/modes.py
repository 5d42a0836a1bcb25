"""How a write is merged (MergeMode) and what a delete does (DeleteBehavior)."""

from __future__ import annotations

import enum

from tally.errors import InvalidOptionError


class MergeMode(enum.IntEnum):
    """AGGREGATE runs the table's engine; OVERWRITE bypasses it (values replace: undo uses it);
    MERGE_STATE merges pre-aggregated partial states from the client."""

    AGGREGATE = 0
    OVERWRITE = 1
    MERGE_STATE = 2

    @classmethod
    def parse(cls, value: "MergeMode | str | int") -> "MergeMode":
        if isinstance(value, MergeMode):
            return value
        if isinstance(value, int) and not isinstance(value, bool):
            try:
                return cls(value)
            except ValueError:
                pass
        if isinstance(value, str):
            key = value.strip().replace("-", "_").upper()
            if key in cls.__members__:
                return cls[key]
        names = ", ".join(m.name.lower() for m in cls)
        raise InvalidOptionError(f"Unknown merge mode {value!r}; expected one of: {names}")


class DeleteBehavior(enum.Enum):
    """`table.delete.behavior`: whether a delete removes a key, is ignored, or is refused."""

    ALLOW = "allow"
    IGNORE = "ignore"
    DISABLE = "disable"
