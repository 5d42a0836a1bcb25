"""Undo recovery: roll a writer's columns back to a baseline offset from the changelog.

`undo_bucket` (an in-process KvTablet), `undo_remote` (one bucket of a cluster table) and
`recover` (every bucket of a table, from the owner's last commit or its lock's initial offsets).
"""

from recovery.recover import RecoveryReport, recover, undo_can_be_skipped
from recovery.remote import RemoteBucket, undo_remote
from recovery.undo import BucketUndo, UndoResult, undo_bucket

__all__ = ["BucketUndo", "RecoveryReport", "RemoteBucket", "UndoResult", "recover",
           "undo_bucket", "undo_can_be_skipped", "undo_remote"]
