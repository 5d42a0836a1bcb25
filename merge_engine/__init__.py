"""The merge engine: schemas with aggregate columns, table options, RowMergers and KvTablet.

KvTablet is loaded on first use (PEP 562): it brings RocksDB, which declaring a schema or a
table descriptor does not need.
"""

from merge_engine.table.descriptor import TableDescriptor
from merge_engine.table.modes import DeleteBehavior, MergeMode
from merge_engine.table.schema import Column, Schema

__all__ = ["Column", "DeleteBehavior", "KvTablet", "MergeMode", "Schema", "TableDescriptor"]


def __getattr__(name: str):
    if name == "KvTablet":
        from merge_engine.kv.tablet import KvTablet

        return KvTablet
    raise AttributeError(f"module 'merge_engine' has no attribute {name!r}")
