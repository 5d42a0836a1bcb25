"""The filter of stored keys (StoredKeys) never hides a stored row from a put.

A put starts a key from an empty row when the filter says the key is not stored; a stored key
wrongly ruled out would restart its sum (and log +I instead of -U/+U). A hypothesis state
machine drives a real KvTablet against the reference model (TabletHarness) through every path
that writes row keys to RocksDB or brings RocksDB files: puts of new and stored keys, deletes
and re-puts of deleted keys, flushes (a tiny row buffer and two rows per write batch, so rows
reach RocksDB in many batches, and writes too large to keep are read back from the changelog),
close and reopen, a crash (RocksDB closed without the flush), undo, cutting the log's tail, a
follower applying the leader's entries and then taking over, and a bucket replaced by its
checkpoint. Half the runs store every write's records as two changelog entries (as a large
write's are) and flush RocksDB's memtables with the rows every few flushes. Filters are made at once or only once puts have asked RocksDB enough (both
policies are drawn), with tiny layers so that several layers and false positives occur. After
every step the harness compares rows, lookups, offsets and the changelog with the model, and
every stored key must be held by a filter that exists (the superset invariant itself).

Budget: `default` profile 40 runs of up to 25 steps.
"""

from __future__ import annotations

import copy
import shutil
import tempfile

import numpy as np
import pyarrow as pa
from hypothesis import event, given, settings, strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from aggfuncs import AggFunction as F
from merge_engine.kv import pending_write
from merge_engine.kv.pending_write import SPLIT_FROM_BYTES
from merge_engine.kv.rows import PERSIST_FROM_BYTES, BucketRows
from merge_engine.kv.stored_keys import StoredKeys, key_hashes
from merge_engine.kv.tablet import KvTablet
from merge_engine.testing import ColumnSpec, Delete, Put, TableSpec
from merge_engine.testing.harness import TabletHarness
from merge_engine.testing.ops import Reopen
from merge_engine.testing.profiles import examples, load_profile
from merge_engine.testing.records import records_from_arrow
from merge_engine.write.keys import KeyArray, key_array
from recovery import undo_bucket

load_profile()

VALUES = (ColumnSpec("total", pa.int64(), F.SUM), ColumnSpec("seen", pa.int64(), F.COUNT))
INT_KEYS = (ColumnSpec("k", pa.int64(), nullable=False),)
TEXT_KEYS = (ColumnSpec("s", pa.string(), nullable=False), ColumnSpec("n", pa.int32(), nullable=False))
OPTIONS = {"table.merge-engine": "aggregation", "table.delete.behavior": "allow"}

INT_KEY = st.integers(0, 12) | st.integers(-(1 << 40), 1 << 40)  # colliding, and mostly new
TEXT_KEY = st.tuples(st.sampled_from(["", "a", "a\0", "ab", "b" * 9, "\0", "é" * 5]),
                     st.integers(-2, 2))


def spec(text_keys: bool, buffer_size: str | None) -> TableSpec:
    options = dict(OPTIONS) if buffer_size is None else {**OPTIONS, "table.kv.buffer-size": buffer_size}
    keys = TEXT_KEYS if text_keys else INT_KEYS
    return TableSpec(keys + VALUES, tuple(c.name for c in keys), options)


def crash(tablet: KvTablet) -> None:
    """What kill -9 leaves behind: RocksDB's committed write batches, not the row buffer."""
    tablet._guard.closed = True
    tablet._store.close()


class StoredKeysMachine(RuleBasedStateMachine):
    def __init__(self):
        super().__init__()
        self.directory = tempfile.mkdtemp(prefix="tally-stored-keys-")
        self.harness: TabletHarness | None = None
        self.follower: KvTablet | None = None
        self.follower_path = None
        self.paths = 0
        self.saved = (BucketRows.batch_rows, BucketRows.build_after, StoredKeys.min_capacity)
        self.models: dict[int, object] = {}  # model at each log end offset a write left

    def _path(self) -> str:
        self.paths += 1
        return f"{self.directory}/bucket-{self.paths}"

    @initialize(text_keys=st.booleans(), buffer_size=st.sampled_from([None, "1kb", "0"]),
                build_after=st.sampled_from([0.0, 1.0]), capacity=st.sampled_from([4, 64]),
                split=st.booleans(), persist_from=st.sampled_from([0, PERSIST_FROM_BYTES]))
    def open_bucket(self, text_keys, buffer_size, build_after, capacity, split, persist_from):
        # split: every write's records stored as two changelog entries (as a large one's are);
        # persist_from 0: RocksDB's memtables flushed with every few flushes of rows
        pending_write.SPLIT_FROM_BYTES = 0 if split else SPLIT_FROM_BYTES
        BucketRows.persist_from = persist_from
        BucketRows.batch_rows = 2
        BucketRows.build_after = build_after
        StoredKeys.min_capacity = capacity
        self.text_keys = text_keys
        self.harness = TabletHarness(spec(text_keys, buffer_size), self._path())
        self.follower_path = self._path()
        self.follower = KvTablet.open(self.follower_path, self.harness.descriptor)
        self._remember()

    # --- writes -----------------------------------------------------------------------------

    def _row(self, key, total: int) -> dict:
        if self.text_keys:
            return {"s": key[0], "n": key[1], "total": total, "seen": 1}
        return {"k": key, "total": total, "seen": 1}

    def _key(self, key) -> dict:
        return {"s": key[0], "n": key[1]} if self.text_keys else {"k": key}

    def _keys(self, data, label: str, max_size: int):
        return data.draw(st.lists(TEXT_KEY if self.text_keys else INT_KEY, min_size=1,
                                  max_size=max_size), label=label)

    def _remember(self) -> None:
        self.models[self.harness.model.log_end_offset] = copy.deepcopy(self.harness.model)

    @rule(data=st.data(), arrow=st.booleans())
    def put(self, data, arrow):
        keys = self._keys(data, "put", 30)
        rows = tuple(self._row(k, i % 5 - 2) for i, k in enumerate(keys))
        self.harness.apply(Put(rows, arrow=arrow), check=False)
        self._remember()

    @rule()
    def put_every_key_again(self):
        """Every key the bucket ever saw, stored or deleted: a hidden one restarts its sum."""
        keys = {tuple(r[c] for c in self.harness.spec.primary_key)
                for r in (rec.image for rec in self.harness.model.changelog)}
        if keys:
            rows = tuple(self._row(k if self.text_keys else k[0], 1) for k in sorted(keys))
            self.harness.apply(Put(rows, arrow=True), check=False)
            self._remember()

    @rule(data=st.data())
    def delete(self, data):
        keys = self._keys(data, "delete", 6)
        self.harness.apply(Delete(tuple(self._key(k) for k in keys)), check=False)
        self._remember()

    @rule()
    def flush(self):
        self.harness.tablet.flush()

    # --- restarts ---------------------------------------------------------------------------

    @rule()
    def reopen(self):
        self.harness.apply(Reopen(), check=False)

    @rule()
    def crash_and_reopen(self):
        crash(self.harness.tablet)
        self.harness.tablet = KvTablet.open(self.harness.path, self.harness.descriptor)

    @rule()
    def replace_by_checkpoint(self):
        """The bucket replaced by its copy (a snapshot's restore, a new replica's copy)."""
        copy_path = self._path()
        self.harness.tablet.checkpoint(copy_path)
        self.harness.close()
        self.harness.path = copy_path
        self.harness.tablet = KvTablet.open(copy_path, self.harness.descriptor)

    # --- undo and cutting the tail ----------------------------------------------------------

    @rule(data=st.data())
    def undo(self, data):
        """undo_bucket back to an earlier log end: the rows are the model's rows then, and its
        writes (OVERWRITE puts of before images, deletes) extend the model's history exactly
        (a strict replay: every -U/-D image is the row the model holds, +I only for absent
        keys, so a stored key the undo's puts took for new fails here)."""
        baseline = data.draw(st.sampled_from(sorted(self.models)), label="baseline")
        start = self.harness.tablet.log_end_offset
        undo_bucket(self.harness.tablet, baseline)
        records = records_from_arrow(self.harness.tablet.changelog(start), self.harness.spec.names)
        self.harness.model.replay(records)
        assert self.harness.model.rows() == self.models[baseline].rows()
        self._remember()

    @rule(data=st.data())
    def cut_tail(self, data):
        """A deposed leader's tail cut (truncate_tail), the follower's with it when longer."""
        cut = data.draw(st.sampled_from(sorted(self.models)), label="cut")
        assert self.harness.tablet.truncate_tail(cut) == cut
        self.harness.model = copy.deepcopy(self.models[cut])
        self.models = {offset: m for offset, m in self.models.items() if offset <= cut}
        if self.follower.log_end_offset > cut:
            self.follower.truncate_tail(cut)

    # --- a follower -------------------------------------------------------------------------

    def _catch_up(self) -> None:
        leader = self.harness.tablet
        while self.follower.log_end_offset < leader.log_end_offset:
            entries = leader.replication_entries(self.follower.log_end_offset, max_bytes=1)
            self.follower.apply_replicated(entries)

    @rule()
    def replicate(self):
        self._catch_up()

    @rule()
    def reopen_follower(self):
        self.follower.close()
        self.follower = KvTablet.open(self.follower_path, self.harness.descriptor)

    @rule()
    def fail_over(self):
        """The caught-up follower leads; the old leader follows from the same log end."""
        self._catch_up()
        old, old_path = self.harness.tablet, self.harness.path
        self.harness.tablet, self.harness.path = self.follower, self.follower_path
        self.follower, self.follower_path = old, old_path

    # --- checks -----------------------------------------------------------------------------

    @invariant()
    def bucket_matches_model(self):
        if self.harness is None:
            return
        self.harness.check()
        for tablet in (self.harness.tablet, self.follower):
            self._check_superset(tablet)

    def _check_superset(self, tablet: KvTablet) -> None:
        """The invariant itself: every stored row key is held by the filter, if one exists."""
        filtered = tablet._rows.stored_keys
        event(f"filter {'made' if filtered is not None else 'not made yet'}")
        if filtered is None:
            return
        stored = [k[1:] for k in tablet._store.row_keys()]
        if stored:
            held = filtered.may_hold(KeyArray.from_bytes(stored))
            assert held.all(), f"stored keys the filter does not hold: " \
                               f"{[stored[i] for i in np.flatnonzero(~held)]} ({filtered})"

    def teardown(self):
        BucketRows.batch_rows, BucketRows.build_after, StoredKeys.min_capacity = self.saved
        pending_write.SPLIT_FROM_BYTES, BucketRows.persist_from = SPLIT_FROM_BYTES, PERSIST_FROM_BYTES
        if self.harness is not None:
            self.harness.close()
        if self.follower is not None:
            self.follower.close()
        shutil.rmtree(self.directory, ignore_errors=True)


StoredKeysMachine.TestCase.settings = settings(
    max_examples=examples(40), stateful_step_count=25, deadline=None)
TestStoredKeysMachine = StoredKeysMachine.TestCase


# --- the hash: one value per key, whatever form its KeyArray has --------------------------------

TEXT = st.text(alphabet="a\0é", max_size=10)


@settings(max_examples=examples(100), deadline=None)
@given(values=st.lists(st.tuples(TEXT, st.integers(-(1 << 31), (1 << 31) - 1)), min_size=1,
                       max_size=20),
       cut=st.integers(1, 20))
def test_a_key_hashes_alike_in_every_padding(values, cut):
    """Variable-width keys are padded to the longest key of their array: the hash of a key
    must not depend on which array it came in (a put's keys, a flush's, a scan's)."""
    columns = [pa.array([s for s, _ in values], pa.string()),
               pa.array([n for _, n in values], pa.int32())]
    whole = key_array(columns)
    alone = [key_array([c.slice(i, 1) for c in columns]) for i in range(len(values))]
    assert list(key_hashes(whole)) == [key_hashes(k)[0] for k in alone]
    part = whole.take(slice(0, cut))
    assert list(key_hashes(part)) == list(key_hashes(whole)[:cut])


@settings(max_examples=examples(100), deadline=None)
@given(numbers=st.lists(st.integers(-(1 << 63), (1 << 63) - 1), min_size=1, max_size=50),
       width=st.sampled_from([pa.int64(), pa.int32(), pa.int16()]))
def test_fixed_width_keys_hash_as_their_stored_bytes(numbers, width):
    """A put holds fixed-width keys as uint64s; a scan of RocksDB gets them as bytes."""
    bits = width.bit_width
    numbers = [n % (1 << bits) - (1 << (bits - 1)) for n in numbers]
    keys = key_array([pa.array(numbers, width)])
    scanned = StoredKeys.of_stored([b"k" + bytes(k) for k in keys.to_list()], b"k")
    assert scanned.may_hold(keys).all()
    assert list(key_hashes(keys)) == list(key_hashes(KeyArray.from_bytes(keys.to_list())))
