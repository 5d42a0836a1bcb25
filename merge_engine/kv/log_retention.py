"""Changelog retention policy: how far a table's retention options let one bucket's log be cut.

`table.log.retention.offsets` keeps at most N most recent records, `table.log.retention.ms` drops
the stored batches written more than N ms ago. The cut never goes above a `floor`, the oldest
offset a live lock or an uncommitted epoch still needs for its undo, unless
`table.log.retention.ignore-locks` is true, nor above the lowest position a registered changelog
consumer has not read yet (for `table.log.retention.consumer-ms` after it registered). The tablet only supplies the mechanism
(KvTablet.log_entry_spans, KvTablet.truncate_log); a tablet server runs this policy periodically
(tally/server/tablet/retention.py, which also fetches the floor from the coordinator).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from merge_engine.table.descriptor import (RETENTION_IGNORE_LOCKS, RETENTION_MS, RETENTION_OFFSETS,
                                           TableDescriptor)

if TYPE_CHECKING:
    from merge_engine.kv.tablet import KvTablet


def has_retention(descriptor: TableDescriptor) -> bool:
    """Whether the table bounds its changelog at all (offsets or age)."""
    return RETENTION_OFFSETS in descriptor.properties or RETENTION_MS in descriptor.properties


def retention_offset(tablet: KvTablet, now_ms: int | None = None) -> int:
    """The log start offset the table's retention options ask of `tablet` (ignoring locks)."""
    properties = tablet.descriptor.properties
    keep = properties.get(RETENTION_OFFSETS)
    max_age = properties.get(RETENTION_MS)
    end = tablet.log_end_offset
    cut = tablet.log_start_offset
    if keep is not None:
        cut = max(cut, end - int(keep))
    if max_age is not None:
        now_ms = int(time.time() * 1000) if now_ms is None else now_ms
        for _, following, written in tablet.log_entry_spans():
            if now_ms - written > int(max_age):
                cut = max(cut, following)
    return min(cut, end)


def enforce_retention(tablet: KvTablet, floor: int | None = None,
                      now_ms: int | None = None, consumer_floor: int | None = None) -> int:
    """Truncate `tablet`'s log to what the retention options allow, but never above `floor`
    unless `table.log.retention.ignore-locks` is true, nor above `consumer_floor` (the lowest
    position of the changelog consumers that still hold retention). Returns the log start
    offset."""
    cut = retention_offset(tablet, now_ms)
    if floor is not None and not tablet.descriptor.bool_option(RETENTION_IGNORE_LOCKS):
        cut = min(cut, floor)
    if consumer_floor is not None:
        cut = min(cut, consumer_floor)
    start = tablet.log_start_offset
    return tablet.truncate_log(cut) if cut > start else start
