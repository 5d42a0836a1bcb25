"""Undo recovery: roll a writer's columns back to a baseline offset from the changelog.

`undo_bucket` (an in-process KvTablet), `undo_remote` (one bucket of a cluster table) and
`recover` (every bucket of a table, back to the owner's last commit in its lock tenure),
`undo_since` (every bucket back to given baselines) and `acquire` (a lock acquisition that
undoes expired, unrecovered locks in its way before taking their columns).
"""

from recovery.bucket_undo import BucketUndo, UndoResult, undo_bucket
from recovery.recover import RecoveryReport, acquire, recover, undo_can_be_skipped, undo_since
from recovery.remote_bucket import RemoteBucket, undo_remote

__all__ = ["BucketUndo", "RecoveryReport", "RemoteBucket", "UndoResult", "acquire", "recover",
           "undo_bucket", "undo_can_be_skipped", "undo_remote", "undo_since"]
