"""The merge engine: schemas with aggregate columns, table options, RowMergers and KvTablet.

The package's face is the table model (what declaring a table needs). A bucket's storage,
KvTablet, is `merge_engine.kv.tablet.KvTablet` (or `tally.KvTablet`): it brings RocksDB, which
clients never load.
"""

from merge_engine.table.descriptor import TableDescriptor
from merge_engine.table.modes import DeleteBehavior, MergeMode
from merge_engine.table.schema import Column, Schema

__all__ = ["Column", "DeleteBehavior", "MergeMode", "Schema", "TableDescriptor"]
