"""Where a bucket's log diverged from its leader's, and cutting it back there.

Each leader of a bucket leads under an epoch and
records (epoch, the log end offset it started at); followers copy the list. A deposed leader
asks the new one where its own last epoch ended there (`epoch_end_offset`, Kafka's
OffsetsForLeaderEpoch), cuts its log back to that offset (`truncate_tail`) and then follows.

Cutting the tail restores the rows from the dropped records' before images (each key's first
record at or past the cut: a +I means the key was absent, a -U or -D holds its whole stored
state then, hidden state included), and the idempotent writers' states from the writer
records of the entries that remain.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from merge_engine.kv import changelog as log
from merge_engine.kv.guard import BucketGuard, LogOffsets
from merge_engine.kv.rows import BucketRows
from merge_engine.kv.storage import END_OFFSET, KV_APPLIED, TabletStore
from merge_engine.table.change_types import INSERT
from merge_engine.table.hidden_columns import CHANGE_TYPE
from merge_engine.write.keys import group_keys
from tally.errors import FencedLeaderEpochError, InvalidInputError, OffsetOutOfRangeError


class TabletEpochs:
    """A bucket's leader epochs, and the cut of a tail that diverged from the leader's log."""

    def __init__(self, guard: BucketGuard, offsets: LogOffsets, store: TabletStore,
                 images: log.Images, rows: BucketRows, primary_key: list[str]):
        self._guard = guard
        self._offsets = offsets
        self._store = store
        self._images = images
        self._rows = rows
        self._primary_key = primary_key

    # --- leader epochs ----------------------------------------------------------------------

    @property
    def leader_epochs(self) -> list[tuple[int, int]]:
        """(leader epoch, start offset) pairs recorded, ascending; [] for a new bucket."""
        with self._guard.lock:
            self._guard.check_open()
            return self._store.leader_epochs()

    def record_leader_epoch(self, epoch: int, start_offset: int) -> None:
        """Record that leader epoch `epoch` starts at `start_offset`: appended when above the
        last recorded epoch, nothing when it repeats the last one; a lower epoch (or the last
        one with another start, or a start below the last one's) is refused."""
        for name, value in (("epoch", epoch), ("start_offset", start_offset)):
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise InvalidInputError(f"{name} must be a non-negative int, got {value!r}")
        with self._guard.lock:
            self._guard.check_open()
            epochs = self._store.leader_epochs()
            if epochs:
                last, last_start = epochs[-1]
                if (epoch, start_offset) == (last, last_start):
                    return
                if epoch <= last:
                    raise FencedLeaderEpochError(
                        f"{self._guard.name} has recorded leader epoch {last} from offset "
                        f"{last_start}: cannot record epoch {epoch} from offset {start_offset}")
                if start_offset < last_start:
                    raise OffsetOutOfRangeError(
                        f"Leader epoch {epoch} of {self._guard.name} cannot start at offset "
                        f"{start_offset}, below the start {last_start} of epoch {last}")
            batch = self._store.new_batch()
            TabletStore.put_leader_epochs(batch, epochs + [(epoch, start_offset)])
            self._store.commit(batch)

    def epoch_end_offset(self, epoch: int) -> int:
        """Where leader epoch `epoch` ended in this log: the start offset of the first
        recorded epoch above it, or the log end offset when none is (the current epoch's
        log has not ended). An epoch below every recorded one ends where the first starts."""
        with self._guard.lock:
            self._guard.check_open()
            for recorded, start in self._store.leader_epochs():
                if recorded > epoch:
                    return start
            return self._offsets.end

    # --- cutting the tail -------------------------------------------------------------------

    def truncate_tail(self, offset: int) -> int:
        """Drop the changelog records at and above `offset` and restore the rows, writer
        states and leader epochs to what they were at it; returns the new log end offset.
        An `offset` inside a stored entry cuts at that entry's first offset.

        The row buffer is flushed first; then one atomic batch holds the restored rows, the
        deleted entries, the new log end and KV_APPLIED (equal, so a reopen replays nothing),
        the writers' states and the epochs: a crash leaves the bucket before or after the cut.
        The dropped records are held in memory at once (a diverged tail is short)."""
        name, offsets = self._guard.name, self._offsets
        with self._guard.lock:
            self._guard.check_open()
            if not isinstance(offset, int) or not offsets.start <= offset <= offsets.end:
                raise OffsetOutOfRangeError(
                    f"Cannot truncate {name} from offset {offset!r}: its log is "
                    f"[{offsets.start}, {offsets.end})")
            dropped = [(first, self._images.conform(log.deserialize(data, first)))
                       for first, data in self._store.log_entries(offset)] \
                if offset < offsets.end else []
            cut = dropped[0][0] if dropped else offset
            if cut < offsets.start:
                raise OffsetOutOfRangeError(
                    f"Cannot truncate {name} from offset {offset}: its changelog entry "
                    f"starts at offset {cut}, below the log start {offsets.start}")
            self._rows.flush(offsets.end)  # the rows to restore are then all in RocksDB
            self._rows.persist()  # the entries to go must not be the only copy of rows
            batch = self._store.new_batch()
            if dropped:
                self._restore_rows(batch, [records for _, records in dropped])
            for first, _ in dropped:
                TabletStore.delete_log_entry(batch, first)
            self._restore_writers(batch, cut)
            epochs = self._store.leader_epochs()
            kept = [(epoch, start) for epoch, start in epochs if start <= cut]
            if kept != epochs:
                TabletStore.put_leader_epochs(batch, kept)
            TabletStore.put_int(batch, END_OFFSET, cut)
            TabletStore.put_int(batch, KV_APPLIED, cut)
            self._store.commit(batch)
            offsets.end = cut
            return cut

    def _restore_rows(self, batch, dropped: list) -> None:
        """Put each key the dropped records touch back as its first record found it."""
        records = pa.concat_tables(dropped)
        keys, _, firsts = group_keys([records.column(k).combine_chunks()
                                      for k in self._primary_key])
        change = records.column(CHANGE_TYPE).combine_chunks().take(pa.array(firsts))
        inserted = pc.equal(change, INSERT).to_numpy(zero_copy_only=False)
        existed = np.flatnonzero(~inserted)
        before = self._images.to_state(records.take(pa.array(firsts[existed])))
        self._rows.put_rows(batch, keys.take(existed), before,
                            keys.take(np.flatnonzero(inserted)))

    def _restore_writers(self, batch, cut: int) -> None:
        """Writers whose state ends past `cut` get the state of their last write that
        remains (its writer record, beside the write's last entry); without one they are
        forgotten. States at or below `cut` stay: such a write is before the cut, including
        writes that changed nothing (they have no entry)."""
        moved = {w for w, (_, end) in self._store.writer_states().items() if end > cut}
        for first, writer_id, sequence in self._store.entry_writers_below(cut):
            if not moved:
                break
            if writer_id in moved:
                moved.discard(writer_id)
                TabletStore.put_writer(batch, writer_id, sequence,
                                       self._store.entry_end(first, cut))
        for writer_id in moved:
            TabletStore.delete_writer(batch, writer_id)
