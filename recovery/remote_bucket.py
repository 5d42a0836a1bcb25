"""Undo of one bucket of a cluster table, through the client.

`RemoteBucket` gives `BucketUndo` the same small interface an in-process KvTablet offers: log
offsets, the changelog streamed in bounded chunks, and OVERWRITE puts and deletes, written under
the owner's lease (the columns being restored are locked by that owner).
"""

from __future__ import annotations

import logging
from typing import Iterator

import pyarrow as pa

from merge_engine.table.modes import MergeMode
from recovery.bucket_undo import BucketUndo, UndoResult
from tally.errors import TallyError

log = logging.getLogger(__name__)

CHUNK_OFFSETS = 50_000  # changelog records read per request: bounds undo's memory


class RemoteBucket:
    def __init__(self, table, bucket: int, partition: str | None = None, lease=None,
                 attempt: int | None = None):
        self.table = table
        self.attempt = attempt
        self.bucket = int(bucket)
        self.partition = partition
        self.lease = lease
        self._writers: dict = {}

    @property
    def schema(self):
        return self.table.meta.descriptor.schema

    def _offsets(self) -> tuple[int, int]:
        # settled: the undo's range must hold every record the leader has, committed or
        # about to be, or a late-committing one would escape it
        return self.table.connection.admin.list_log_offsets(
            self.table.name, self.table.table_id, settle=True)[(self.partition, self.bucket)]

    @property
    def log_start_offset(self) -> int:
        return self._offsets()[0]

    @property
    def log_end_offset(self) -> int:
        return self._offsets()[1]

    def iter_changelog(self, start: int, end: int) -> Iterator[pa.Table]:
        for low in range(start, end, CHUNK_OFFSETS):
            yield self.table.changelog(self.bucket, low, min(low + CHUNK_OFFSETS, end),
                                       partition=self.partition)

    def _writer(self, target_columns):
        key = None if target_columns is None else tuple(target_columns)
        if key not in self._writers:
            self._writers[key] = self.table.upsert_writer(
                target_columns=target_columns, mode=MergeMode.OVERWRITE, lease=self.lease,
                attempt=self.attempt)
        return self._writers[key]

    def put(self, rows, mode=MergeMode.OVERWRITE, target_columns=None) -> None:
        writer = self._writer(target_columns)
        writer.upsert(rows)
        writer.flush()

    def delete(self, keys, mode=MergeMode.OVERWRITE, target_columns=None) -> None:
        writer = self._writer(target_columns)
        writer.delete(keys)
        writer.flush()

    def close(self) -> None:
        for writer in self._writers.values():
            writer.close()


def undo_remote(table, bucket: int, baseline: int, partition: str | None = None,
                end: int | None = None, target_columns=None, lease=None,
                attempt: int | None = None) -> UndoResult:
    """Undo bucket `bucket` (of `partition`) of a cluster table (from `conn.table(name)`) to
    `baseline` for `target_columns` (with the key; None means full rows). Pass the owner's
    `lease` when the columns are locked, and the task's `attempt` once it registered one."""
    remote = RemoteBucket(table, bucket, partition, lease, attempt)
    try:
        result = BucketUndo(remote, remote.schema, baseline, end, target_columns).run()
    finally:
        remote.close()
    result.bucket, result.partition = int(bucket), partition
    report_undo(table, result)
    return result


def report_undo(table, result: UndoResult) -> None:
    """Tell the coordinator what the undo did, for its metrics (undo runs here, in the client,
    where no server sees it whole). Best effort: the undo is done either way."""
    try:
        table.connection.coordinator_action("undo_report", {
            "name": table.name, "table_id": table.table_id,
            "keys_restored": result.keys_restored,
            "keys_deleted": result.keys_deleted, "records_scanned": result.records_scanned,
            "seconds": result.seconds})
    except TallyError as e:
        log.info("the undo of bucket %s of %s was not reported to the metrics: %s",
                 result.bucket, table.name, e)
