"""Undo: roll one bucket's columns back to a baseline offset using the changelog's images.

For the first change of each key in [baseline, end): `+I` means the key did not exist at the
baseline, so it is deleted (for a partial writer, its columns are reset); `-U` and `-D` carry the
key's image at the baseline, which is written back; `+U` is skipped without marking the key (its
`-U` came just before it, or the key was first changed before the baseline). Every undo write is
an OVERWRITE, so writing the same images again changes nothing: an undo that crashes halfway is
finished by running it again from the same baseline.

On a table with a row TTL, a -D the TTL wrote (`_expired`) is skipped without marking its key:
an expiry is not a change to undo, so a key that expired in the range stays gone (a later +I of
it is undone as usual). Images are written back with their `_written_ms`, so a restored row
expires when it would have without the undone writes (merge_engine.kv.row_ttl).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import pyarrow as pa

from merge_engine.format.undo_images import FirstChanges, first_change, restore_rows
from merge_engine.table.hidden_columns import CHANGE_TYPE, EXPIRED
from merge_engine.table.modes import MergeMode
from merge_engine.write.keys import encode_keys
from tally.errors import RecoveryError
from tally.timestamps import duration


@dataclass
class UndoResult:
    """What an undo did to one bucket."""

    baseline: int
    end: int
    records_scanned: int = 0
    keys_restored: int = 0
    keys_deleted: int = 0
    seconds: float = 0.0
    end_after: int | None = None
    bucket: object = None
    partition: object = None

    @property
    def keys_touched(self) -> int:
        return self.keys_restored + self.keys_deleted

    def __repr__(self) -> str:
        where = "" if self.partition is None else f"partition {self.partition!r}, "
        return (f"UndoResult({where}bucket {self.bucket}, offsets [{self.baseline}, {self.end}),"
                f" {self.records_scanned} records scanned, {self.keys_restored} keys restored, "
                f"{self.keys_deleted} deleted, end after {self.end_after}, "
                f"{duration(self.seconds)})")


class BucketUndo:
    """The undo of one bucket, written against a small bucket interface so that the same code
    serves an in-process KvTablet and a remote bucket reached through the client.

    The bucket must offer `log_start_offset`, `log_end_offset`, `iter_changelog(start, end)`,
    `put(rows, mode, target_columns)` and `delete(keys, mode, target_columns)`.
    """

    def __init__(self, bucket, schema, baseline: int, end: int | None = None,
                 target_columns=None):
        self.bucket = bucket
        self.schema = schema
        self.baseline = baseline
        self.end = bucket.log_end_offset if end is None else end  # captured once
        self.target_columns = None if target_columns is None else list(target_columns)
        self._check_range()
        self.restored_names = self._restored_names()

    def _check_range(self) -> None:
        start, log_end = self.bucket.log_start_offset, self.bucket.log_end_offset
        if self.baseline < start:
            raise RecoveryError(
                f"Cannot undo from offset {self.baseline}: the bucket's changelog now starts at "
                f"{start} (older records were removed by retention or truncation), so the "
                "before-images needed are gone. Nothing was changed."
            )
        if self.baseline > self.end or self.end > log_end:
            raise RecoveryError(
                f"Cannot undo the range [{self.baseline}, {self.end}): the bucket's changelog "
                f"ends at {log_end}. Nothing was changed."
            )

    def _restored_names(self) -> list[str]:
        if self.target_columns is None:
            return self.schema.names
        unknown = [c for c in self.target_columns if not self.schema.has_column(c)]
        missing = [k for k in self.schema.primary_key if k not in self.target_columns]
        if unknown or missing:
            raise RecoveryError(
                f"target_columns {self.target_columns} must be columns of the table and include "
                f"the primary key {list(self.schema.primary_key)}"
            )
        return [n for n in self.schema.names if n in self.target_columns]

    def run(self) -> UndoResult:
        started = time.monotonic()
        result = UndoResult(self.baseline, self.end)
        seen: set[bytes] = set()
        for records in self.bucket.iter_changelog(self.baseline, self.end):
            result.records_scanned += records.num_rows
            pending = self._first_changes(records, seen)
            self._apply(records, pending, result)
        result.end_after = self.bucket.log_end_offset
        result.seconds = time.monotonic() - started
        return result

    def _first_changes(self, records: pa.Table, seen: set[bytes]) -> FirstChanges:
        keys = encode_keys([records.column(k).combine_chunks() for k in self.schema.primary_key])
        found = FirstChanges()
        expired = records.column(EXPIRED).to_pylist() if EXPIRED in records.column_names \
            else [False] * records.num_rows
        for i, (key, change) in enumerate(zip(keys, records.column(CHANGE_TYPE).to_pylist())):
            if key not in seen and not expired[i] and first_change(change, i, found):
                seen.add(key)
        return found

    def _apply(self, records: pa.Table, pending: FirstChanges, result: UndoResult) -> None:
        if pending.restore:
            images = records.take(pa.array(pending.restore, type=pa.int64()))
            self.bucket.put(restore_rows(images, self.restored_names), mode=MergeMode.OVERWRITE,
                            target_columns=self.target_columns)
            result.keys_restored += len(pending.restore)
        if pending.delete:
            keys = records.take(pa.array(pending.delete, type=pa.int64()))
            keys = keys.select(list(self.schema.primary_key))
            self.bucket.delete(keys, mode=MergeMode.OVERWRITE, target_columns=self.target_columns)
            result.keys_deleted += len(pending.delete)


def undo_bucket(tablet, baseline: int, end: int | None = None, target_columns=None) -> UndoResult:
    """Undo every change of an in-process KvTablet in [baseline, end) for `target_columns`
    (which include the key; None means full rows)."""
    return BucketUndo(tablet, tablet.schema, baseline, end, target_columns).run()
