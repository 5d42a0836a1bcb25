"""Column-lock enforcement on a tablet server.

Each table's `LockView` arrives from the coordinator on every lock change (`install_lock_view` action, which only
the cluster credential may call) and is fetched from it when a table is first written here. Writes are checked under the bucket's
lock, the same lock the write then holds while applying, and installing a new view passes through
every bucket lock of that table: once the coordinator's push returns, no write checked against
the old view is still in flight, so none can slip in after the new lease was granted.
"""

from __future__ import annotations

import threading

import pyarrow as pa

from locks import LockView


class TabletLocks:
    """The lock views of the tables a tablet server hosts, and the write check."""

    def __init__(self, server) -> None:
        self.server = server
        self._views: dict[int, LockView] = {}
        self._lock = threading.Lock()
        server.actions["install_lock_view"] = self.install
        server.write_checks.append(self.check)

    def install(self, body: dict) -> None:
        view = LockView.from_json(body["view"])
        with self._lock:
            self._views[view.table_id] = view
        for hosted in self.server.host.hosted(view.table_id):
            with hosted.lock:  # wait out writes checked against the previous view
                pass

    def view(self, table_id: int) -> LockView:
        with self._lock:
            found = self._views.get(table_id)
        if found is None:
            found = LockView.from_json(self.server.coordinator("lock_view", {"table_id": table_id}))
            with self._lock:
                found = self._views.setdefault(table_id, found)
        return found

    def check(self, hosted, header: dict, rows: pa.Table) -> None:
        """Reject a write touching another owner's locked columns, or made under a stale or
        expired lease. Runs under the bucket's lock."""
        tablet = hosted.tablet
        if not tablet.descriptor.column_lock_enabled:
            return
        schema = tablet.schema
        targets = header.get("target_columns") or schema.names
        columns = {schema.column(name).id for name in targets if name not in schema.primary_key}
        lease = header.get("lease") or {}
        self.view(hosted.key.table_id).check_write(
            columns, lease.get("owner_id"), lease.get("token"), now=self.server.clock(),
            table=hosted.routing.name, bucket=hosted.key.bucket, attempt=lease.get("attempt"),
            secret=lease.get("secret"))
