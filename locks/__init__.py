"""Column locks: leases with fencing tokens held by the coordinator, commits and baselines.

Every piece of column locking lives here, each in the process that runs it:

- coordinator: `ColumnLockService` grants, renews and releases locks; `CommitLog` records each
  owner's last committed epoch and epoch baselines; `coordinator_actions.CoordinatorLocks`
  serves both as DoActions; `view_publisher.LockViewPublisher` sends every change's lock view
  to the tablet servers (`view_delivery`: a queue per server) and waits where fencing needs it;
- tablet server: `LockView` (versioned) is what writes are checked against,
  `tablet_check.TabletLocks` keeps the newest view per table and runs the check itself, before
  a write touches a tablet;
- client: `client.Locks` is `conn.locks`, whose leases a `keeper.LeaseKeeper` renews.

The server and the client assemble these pieces; nothing here imports them (the coordinator,
tablet server or connection is passed in).
"""

from locks.commits import CommitLog
from locks.fencing import HeldLock, LockView, view_from_records
from locks.lease import Lease, LockRecord, offsets_from_json, offsets_to_json
from locks.request import LockTarget
from locks.service import ColumnLockService

__all__ = ["ColumnLockService", "CommitLog", "HeldLock", "Lease", "LockRecord", "LockTarget",
           "LockView", "offsets_from_json", "offsets_to_json", "view_from_records"]
