"""Column-lock enforcement on a tablet server.

Each table's `LockView` arrives from the coordinator after every lock change (the
`install_lock_view` action, which only the cluster credential may call), in the background and
in any order: a view replaces the one held only when its version is newer, so a superseded
token stays refused whatever order views arrive in. Writes are checked under the bucket's
lock, the same lock the write then holds while applying, and installing a view passes through
every bucket lock of that table before it is confirmed: once the coordinator has the
confirmation, no write checked against an older view is still in flight.

The view is fetched from the coordinator (pulled) when the server cannot trust the one it has:
- a table first written here (no view yet);
- the first write to a bucket under a leadership (epoch) new to this server: a leader elected
  after the coordinator chose whom a lock change waits for must not judge by an older view;
- a write whose lease token, or task attempt, is newer than the view knows: its grant is on its
  way, and the new holder is never refused for that;
- a write whose lease the view finds expired (a renewal's view may be late), at most once per
  PULL_INTERVAL per table; if the coordinator cannot be asked, the view's verdict stands.
Concurrent pulls of one table share one call to the coordinator.
"""

from __future__ import annotations

import threading
import time

import pyarrow as pa

from locks.fencing import LockView
from merge_engine import MergeMode
from tally.errors import InvalidInputError, TallyError, UnavailableError

PULL_INTERVAL = 1.0  # seconds between pulls that leases found expired may cause, per table


class LockViews:
    """The newest lock view of each table a server has seen: a view older than (or as old as)
    the one held is ignored, whatever order views arrive in."""

    def __init__(self) -> None:
        self._views: dict[int, LockView] = {}
        self._lock = threading.Lock()

    def offer(self, view: LockView) -> LockView:
        """Keep `view` if it is newer than the one held; the view held afterwards."""
        with self._lock:
            held = self._views.get(view.table_id)
            if view.newer_than(held):
                self._views[view.table_id] = held = view
            return held

    def get(self, table_id: int) -> LockView | None:
        with self._lock:
            return self._views.get(table_id)


class TabletLocks:
    """The lock views of the tables a tablet server hosts, and the write check."""

    def __init__(self, server) -> None:
        self.server = server
        self.views = LockViews()
        self._lock = threading.Lock()
        self._pull_locks: dict[int, threading.Lock] = {}
        self._pulled: dict[int, float] = {}  # table id -> when its last pull began (monotonic)
        self._epochs: dict = {}  # bucket key -> the leader epoch its view was pulled under
        server.actions["install_lock_view"] = self.install
        server.write_checks.append(self.check)

    def install(self, body: dict) -> int:
        """Keep the pushed view if it is newer; the version held. Confirmed only after every
        write of the table checked against an older view has been applied."""
        try:
            view = LockView.from_json(body["view"])
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            raise InvalidInputError(f"malformed lock view: {e!r}") from None
        held = self.views.offer(view)
        for hosted in self.server.host.hosted(view.table_id):
            with hosted.lock:  # wait out writes checked against an older view
                pass
        return held.version

    def view(self, table_id: int) -> LockView:
        return self.views.get(table_id) or self.pull(table_id, time.monotonic())

    def pull(self, table_id: int, since: float) -> LockView:
        """The table's view from a fetch that began at `since` (time.monotonic) or later:
        concurrent callers share one fetch."""
        with self._lock:
            lock = self._pull_locks.setdefault(table_id, threading.Lock())
        with lock:
            with self._lock:
                began = self._pulled.get(table_id)
            held = self.views.get(table_id)
            if held is not None and began is not None and began >= since:
                return held
            began = time.monotonic()
            fetched = LockView.from_json(self.server.coordinator("lock_view",
                                                                 {"table_id": table_id}))
            with self._lock:
                self._pulled[table_id] = began
            return self.views.offer(fetched)

    def _pulled_since(self, table_id: int) -> float:
        with self._lock:
            began = self._pulled.get(table_id)
        return float("inf") if began is None else time.monotonic() - began

    def check(self, hosted, header: dict, rows: pa.Table) -> None:
        """Reject a write touching another owner's locked columns, or made under a stale or
        expired lease. Runs under the bucket's lock."""
        tablet = hosted.tablet
        if not tablet.descriptor.column_lock_enabled:
            return
        arrived = time.monotonic()
        schema = tablet.schema
        targets = header.get("target_columns") or schema.names
        columns = {schema.column(name).id for name in targets if name not in schema.primary_key}
        lease = header.get("lease") or {}
        owner, token, attempt = lease.get("owner_id"), lease.get("token"), lease.get("attempt")
        table_id, bucket, now = hosted.key.table_id, hosted.key.bucket, self.server.clock()
        view = self.view(table_id)
        epoch = self.server.leadership(hosted).epoch
        if self._epochs.get(hosted.key) != epoch:
            view = self._pull_to_judge(hosted, arrived, "it leads the bucket under a new epoch")
            self._epochs[hosted.key] = epoch
        if view.behind(owner, token, bucket, attempt):
            view = self._pull_to_judge(hosted, arrived, f"its lease (token {token}, attempt "
                                       f"{attempt}) is newer than the view it holds")
        elif view.expired_for(owner, token, now) and \
                self._pulled_since(table_id) >= PULL_INTERVAL:
            try:
                view = self.pull(table_id, arrived)
            except TallyError:
                pass  # the view's verdict stands: the lease may well have lapsed
        view.check_write(
            columns, owner, token, now=now, table=hosted.routing.name, bucket=bucket,
            attempt=attempt, secret=lease.get("secret"),
            # an undo's writes (and the take-back of a refused flush) are OVERWRITE ones
            overwrite=header.get("op") == "undo"
            or MergeMode.parse(header.get("mode", "AGGREGATE")) is MergeMode.OVERWRITE)

    def _pull_to_judge(self, hosted, since: float, why: str) -> LockView:
        try:
            return self.pull(hosted.key.table_id, since)
        except TallyError as e:
            raise UnavailableError(
                f"{hosted.label}: tablet server {self.server.server_id} must fetch the table's "
                f"lock view from the coordinator before it judges this write ({why}), and "
                f"could not: {e}. Nothing was applied; retry") from None
