"""Column locks: leases with fencing tokens held by the coordinator, commits and baselines.

`ColumnLockService` grants, renews and releases locks; `CommitLog` records each owner's last
committed epoch and epoch baselines; `LockView` is what tablet servers check writes against.
"""

from locks.commits import CommitLog
from locks.fencing import HeldLock, LockView, view_from_records
from locks.lease import Lease, LockRecord, offsets_from_json, offsets_to_json
from locks.service import ColumnLockService, LockTarget

__all__ = ["ColumnLockService", "CommitLog", "HeldLock", "Lease", "LockRecord", "LockTarget",
           "LockView", "offsets_from_json", "offsets_to_json", "view_from_records"]
