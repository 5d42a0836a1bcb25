"""The merge engine: schemas with aggregate columns, table options, RowMergers and KvTablet."""

from merge_engine.descriptor import TableDescriptor
from merge_engine.modes import DeleteBehavior, MergeMode
from merge_engine.schema import Column, Schema
from merge_engine.tablet import KvTablet

__all__ = ["Column", "DeleteBehavior", "KvTablet", "MergeMode", "Schema", "TableDescriptor"]
