"""Why a lock cannot be granted: another owner's lock in the way, or a tenure too long expired
to undo. One message each, naming the columns, the owner and when."""

from __future__ import annotations

import time

from locks.lease import LockRecord
from locks.request import LockTarget
from tally.errors import ColumnLockConflict, RecoveryError, UnrecoveredLockError


def when(timestamp: float) -> str:
    return time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(timestamp))


def refuse_overlap(target: LockTarget, record: LockRecord, overlap: set, now: float) -> None:
    """ColumnLockConflict (live) or UnrecoveredLockError (expired) for `record` in the way."""
    columns = sorted(c.name for c in target.schema.columns if c.id in overlap)
    if record.live(now):
        raise ColumnLockConflict(
            f"Columns {columns} of table {target.name} are locked by owner "
            f"'{record.owner_id}' until {when(record.expires_at)} "
            f"({record.expires_at - now:.1f}s from now)")
    raise UnrecoveredLockError(
        f"Columns {columns} of table {target.name} are held by the expired lock of owner "
        f"'{record.owner_id}' (tenure {record.tenure}, expired {when(record.expires_at)}): "
        "its writes since its last commit may still be undone. Restart that owner, take "
        "the columns over with recovery.acquire (which undoes them first), or discard the "
        "lock (`tally locks --discard`), which keeps them as they are")


def refuse_unrecoverable(target: LockTarget, record: LockRecord, now: float) -> None:
    """An expired tenure past the table's expired-lock retention may have lost the
    changelog its undo needs: continuing or taking it over would undo only part of it."""
    if not record.recoverable(now, target.expired_hold):
        raise RecoveryError(
            f"The lock of owner '{record.owner_id}' on table {target.name} (tenure "
            f"{record.tenure}) expired {when(record.expires_at)}, longer ago than the "
            f"table's table.log.retention.expired-lock-ms ({target.expired_hold:.0f}s): "
            "retention may have removed the changelog its undo needs. Nothing was changed. "
            "Discard the lock (`tally locks --discard`) to keep its writes as they are")
