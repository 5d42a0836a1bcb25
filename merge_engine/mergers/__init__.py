"""RowMergers: how a write's rows combine with the stored rows of their keys.

One merger per merge engine, each a `RowMerger`: `AggregateRowMerger` folds with each column's
function (AGGREGATE and MERGE_STATE modes), `OverwriteRowMerger` replaces values (OVERWRITE mode
and tables without a merge engine). Partial writes are the same mergers with a target mask:
non-target columns keep their stored state. `DeleteMerger` applies full and partial deletes.
"""

from merge_engine.mergers.aggregate import AggregateRowMerger
from merge_engine.mergers.deletes import DeleteMerger
from merge_engine.mergers.overwrite import OverwriteRowMerger
from merge_engine.mergers.row_merger import RowMerger

__all__ = ["AggregateRowMerger", "DeleteMerger", "OverwriteRowMerger", "RowMerger"]
