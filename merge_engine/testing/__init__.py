"""Property-testing support for Tally tables: a reference model and hypothesis strategies.

- `ReferenceTable`: a plain-Python model of one bucket that follows docs/core-contract.md.
- `TableSpec` / `ColumnSpec`: a table in plain data; builds the engine's Schema/TableDescriptor.
- `merge_engine.testing.strategies`: hypothesis strategies for specs, rows and write sequences.
- `TabletHarness`: drives a real KvTablet and the model with the same writes and compares them.

`strategies` needs hypothesis (a test extra), so it is loaded on first use:
`tally.testing.strategies` (or `from merge_engine.testing import strategies`). See
docs/testing.md.
"""

import importlib

from merge_engine.testing.harness import TabletHarness
from merge_engine.testing.model import ReferenceTable, RowState
from merge_engine.testing.ops import Delete, Put, Reopen
from merge_engine.testing.records import ChangeRecord, diff_records, records_from_arrow
from merge_engine.testing.spec import ColumnSpec, TableSpec
from merge_engine.testing.values import same_row, same_value

__all__ = [
    "ChangeRecord",
    "ColumnSpec",
    "Delete",
    "Put",
    "Reopen",
    "TabletHarness",
    "ReferenceTable",
    "RowState",
    "TableSpec",
    "diff_records",
    "records_from_arrow",
    "same_row",
    "same_value",
]


def __getattr__(name: str):
    if name == "strategies":
        # import_module, not `from merge_engine.testing import ...`: that form would look the
        # name up on this package first and land here again.
        return importlib.import_module("merge_engine.testing.strategies")
    raise AttributeError(f"module 'merge_engine.testing' has no attribute {name!r}")
