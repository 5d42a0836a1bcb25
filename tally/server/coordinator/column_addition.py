"""add_column on the coordinator: a nullable column added to a live table.

The new schema is the table's plus the column (Schema.with_column: the next stable column id,
validated as table creation validates), stored in the catalog with compare-and-set against the
descriptor it was built from; then every live tablet server reopens its buckets of the table
with it (`reopen_tablets`). Stored rows and changelog records are not rewritten: buckets read
them with the column empty (merge_engine.kv.row_layouts, Images.conform).

Refused while a column lock (live, or expired and not yet released: its undo is pending) covers
every value column of the table: such a holder writes and undoes whole rows as they were when it
took the lock, so its rows would miss the column. Holders of some columns only are unaffected
(their columns do not change) and may go on writing while the column is added.
"""

from __future__ import annotations

import logging

from merge_engine.table.types_json import type_from_json
from tally.errors import ColumnLockConflict, SchemaError, TallyError, UnavailableError
from tally.wire.messages import field

log = logging.getLogger(__name__)


class ColumnAddition:
    def __init__(self, coordinator) -> None:
        self.coordinator = coordinator
        coordinator.actions["add_column"] = self.add_column

    def add_column(self, body: dict) -> dict:
        from merge_engine import TableDescriptor

        coordinator = self.coordinator
        record = coordinator.named_table(body)
        column = field(body, "column", str)
        params = body.get("params") or {}
        if not isinstance(params, dict):
            raise SchemaError(f"the parameters of column '{column}' must be an object")
        try:
            arrow_type = type_from_json(body.get("type"))
        except (KeyError, TypeError, ValueError) as e:
            raise SchemaError(f"column '{column}': unsupported type {body.get('type')!r}: {e}") \
                from None
        old = coordinator.parse_descriptor(record.descriptor)
        agg = body.get("agg")
        if agg is not None and not old.is_aggregation:
            raise SchemaError(
                f"Column '{column}' has aggregation function '{agg}', but table "
                f"'{record.name}' is not an aggregation merge engine table")
        schema = old.schema.with_column(column, arrow_type, agg, **params)
        new = TableDescriptor(schema, old.bucket_count, old.properties)
        self._check_locks(record, old)
        coordinator.catalog.set_descriptor(record.name, record.table_id, record.descriptor,
                                           new.to_json())
        log.info("added column %s to table %s (id %d)", column, record.name, record.table_id)
        self._reopen(record.table_id, new.to_json())
        return {"table_id": record.table_id, "column_id": schema.column(column).id}

    def _check_locks(self, record, descriptor) -> None:
        value_ids = {c.id for c in descriptor.schema.value_columns}
        for lock, _ in self.coordinator.locking.locks.records(record.table_id).values():
            if value_ids and value_ids <= set(lock.column_ids):
                raise ColumnLockConflict(
                    f"Cannot add a column to table '{record.name}' while owner "
                    f"'{lock.owner_id}' holds a lock on all of its columns "
                    f"{list(lock.column_names)} (it writes whole rows); release the lock, or "
                    "wait for its undo, then add the column. Nothing was changed.")

    def _reopen(self, table_id: int, descriptor_json: str) -> None:
        """Have every live tablet server reopen its buckets of the table with the new schema;
        raise if one is unreachable (the column stands; it reopens on its next start)."""
        failed = []
        for server_id, address in self.coordinator.liveness.live().items():
            try:
                self.coordinator.channels.get(address).action(
                    "reopen_tablets", {"table_id": table_id, "descriptor": descriptor_json})
            except TallyError as e:
                failed.append(f"{server_id}: {e}")
        if failed:
            raise UnavailableError(
                "the column was added but not every tablet server could reopen the table's "
                f"buckets ({'; '.join(failed)})")
