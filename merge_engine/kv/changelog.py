"""The changelog: Arrow record batches of +I, -U, +U and -D records with full row images.

One offset per record. One put appends at most one batch (one entry per key per put: +I for a
new key, -U/+U for a changed one, -D for a removed one), stored as an Arrow IPC stream in the
same RocksDB write batch as the offsets. The stored batch is leaner than what readers get: the
change type is an int8 code and offsets are implied by the batch's first offset (its RocksDB
key); `deserialize` restores the `_offset` and `_change_type` columns.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from aggfuncs.string_rows import is_string, take_rows
from merge_engine.table.change_types import CHANGE_TYPES, DELETE, INSERT, UPDATE_AFTER
from merge_engine.table.hidden_columns import (CHANGE_CODE, CHANGE_TYPE, CONTRIBUTIONS, EXPIRED,
                                               OFFSET, SEQUENCES, TOKENS, UNWRITTEN, WRITTEN_MS)
from merge_engine.write.keys import KeyArray, key_array
from merge_engine.write.row_gather import gather_rows
from merge_engine.write.state import StateBatch, contribution_lists

# What happened to each key of a write.
UNCHANGED, INSERTED, UPDATED, REMOVED = 0, 1, 2, 3


class Images:
    """How a table's stored states appear as changelog images, and back.

    Images hold what readers see (each aggregator's `values`), the written bits (`_unwritten`),
    the contribution counts (`_contributions`) and, for columns whose state keeps tokens apart,
    those tokens (`_tokens`: a struct with one list<string> field per such column), so replay
    and undo rebuild every state exactly. Tables with a row TTL (`timed`) add each image's
    last-write time (`_written_ms`) and whether a -D is an expiry (`_expired`).
    """

    def __init__(self, arrow_schema: pa.Schema, aggregators, value_positions: list[int],
                 counted: list[int], timed: bool = False):
        self.schema = arrow_schema
        self.timed = timed
        self.aggregators = aggregators
        self.value_positions = value_positions
        self.counted = counted
        self.tokenized = [i for i in value_positions if aggregators[i].tokenized]
        self.token_type = pa.struct([pa.field(arrow_schema.names[i], aggregators[i].state_type)
                                     for i in self.tokenized])
        # Cells ordered by a sequence field keep the sequence beside the value (`_sequences`).
        self.sequenced = [i for i in value_positions if aggregators[i].sequenced]
        self.sequence_type = pa.struct([pa.field(arrow_schema.names[i], aggregators[i].state_type)
                                        for i in self.sequenced])

    def state_schema(self) -> pa.Schema:
        """The schema of stored states (the row format's columns)."""
        return pa.schema([pa.field(f.name, agg.state_type)
                          for f, agg in zip(self.schema, self.aggregators)])

    def visible(self, states: StateBatch) -> pa.Table:
        """Rows as readers see them (lookup, to_arrow): each aggregator's values of its states."""
        return pa.Table.from_arrays(
            [agg.values(c) for agg, c in zip(self.aggregators, states.columns)],
            names=self.schema.names)

    def visible_arrays(self, states: StateBatch) -> list:
        """visible() as one array per column, without making a table (a point lookup's)."""
        return [agg.values(c) for agg, c in zip(self.aggregators, states.columns)]

    def reader_schema(self) -> pa.Schema:
        """The schema readers see."""
        fields = [pa.field(OFFSET, pa.int64(), nullable=False),
                  pa.field(CHANGE_TYPE, pa.string(), nullable=False)]
        return pa.schema(fields + self._image_fields())

    def stored_schema(self) -> pa.Schema:
        """The schema of a stored batch."""
        return pa.schema([pa.field(CHANGE_CODE, pa.int8(), nullable=False)]
                         + self._image_fields())

    def _image_fields(self) -> list[pa.Field]:
        fields = [pa.field(f.name, f.type) for f in self.schema]
        fields.append(pa.field(UNWRITTEN, pa.list_(pa.string())))
        fields.append(pa.field(CONTRIBUTIONS, pa.list_(pa.int64())))
        if self.tokenized:
            fields.append(pa.field(TOKENS, self.token_type))
        if self.sequenced:
            fields.append(pa.field(SEQUENCES, self.sequence_type))
        if self.timed:
            fields.append(pa.field(WRITTEN_MS, pa.int64()))
            fields.append(pa.field(EXPIRED, pa.bool_()))
        return fields

    def conform(self, records: pa.Table) -> pa.Table:
        """Records stored before columns were added (add_column), read with today's columns:
        each added column null and listed in `_unwritten` (no write had targeted it), its
        contribution count 0 and its tokens and sequence null. Records of today's columns are returned
        as they are."""
        missing = [f for f in self.schema if f.name not in records.column_names]
        if not missing:
            return records
        n = records.num_rows
        names = {f.name for f in missing}
        unwritten = [list(u or ()) + [f.name for f in missing]
                     for u in records.column(UNWRITTEN).to_pylist()]
        added_counted = [i for i in self.counted if self.schema.names[i] in names]
        contributions = [list(c or ()) + [0] * len(added_counted)
                         for c in records.column(CONTRIBUTIONS).to_pylist()]
        columns = {}
        for f in self.schema:
            columns[f.name] = records.column(f.name) if f.name not in names \
                else pa.nulls(n, type=f.type)
        columns[UNWRITTEN] = pa.array(unwritten, type=pa.list_(pa.string()))
        columns[CONTRIBUTIONS] = pa.array(contributions, type=pa.list_(pa.int64()))
        for hidden, struct_type in ((TOKENS, self.token_type), (SEQUENCES, self.sequence_type)):
            if struct_type.num_fields:
                columns[hidden] = _struct_with_nulls(records, hidden, struct_type)
        schema = self.reader_schema()  # the row TTL's columns come as they are
        arrays = [columns[f.name] if f.name in columns else records.column(f.name)
                  for f in schema]
        return pa.Table.from_arrays(arrays, schema=schema)

    def build_records(self, before: StateBatch, after: StateBatch, outcome: np.ndarray,
                      expired: np.ndarray | None = None) -> pa.Table | None:
        """The changelog records of one write in stored form, or None when nothing changed.

        `before` and `after` hold one row per key (aligned); `outcome` says per key whether it
        was inserted, updated, removed or left unchanged. Records follow the keys' order.
        `expired`: per key, whether its removal is the row TTL's, not a delete (`_expired`).
        """
        counts = np.select([outcome == INSERTED, outcome == UPDATED, outcome == REMOVED],
                           [1, 2, 1], 0)
        total = int(counts.sum())
        if total == 0:
            return None
        m = len(before)
        key = np.repeat(np.arange(m), counts)
        first = np.concatenate([[True], key[1:] != key[:-1]])
        kind = outcome[key]
        # Rows of concat(before, after): before images at g, after images at m + g.
        take_after = (kind == INSERTED) | ((kind == UPDATED) & ~first)
        index = np.where(take_after, m + key, key)
        change = np.where(kind == INSERTED, 0, np.where(kind == REMOVED, 3, np.where(first, 1, 2)))
        if total == m and (outcome == INSERTED).all():
            images = after  # only new keys: their +I images are the after states, in order
        else:
            images = self._interleaved(before, after, key, index)
        arrays = [pa.array(change.astype(np.int8))]
        arrays += [agg.values(c) for agg, c in zip(self.aggregators, images.columns)]
        arrays.append(unwritten_lists(images.written, self.value_positions, self.schema.names))
        arrays.append(contribution_lists(images.counts(), self.counted))
        if self.tokenized:
            arrays.append(pa.StructArray.from_arrays([images.columns[i] for i in self.tokenized],
                                                     fields=list(self.token_type)))
        if self.sequenced:
            arrays.append(pa.StructArray.from_arrays([images.columns[i] for i in self.sequenced],
                                                     fields=list(self.sequence_type)))
        if self.timed:
            arrays.append(pa.array(images.times(), type=pa.int64()))
            cause = np.zeros(len(key), dtype=bool) if expired is None else expired[key]
            arrays.append(pa.array((change == 3) & cause, type=pa.bool_()))
        return pa.Table.from_arrays(arrays, schema=self.stored_schema())

    def _interleaved(self, before: StateBatch, after: StateBatch, key: np.ndarray,
                     index: np.ndarray) -> StateBatch:
        """The images of records: row `index[r]` of before's rows then after's. A column the
        write left as it was (the key's, a column it did not target) is the same array on both
        sides: its images are its rows at `key`, without joining the two first. The
        bookkeeping is gathered a whole row at a time (gather_rows): selecting the shown
        columns of both sides, joining them and assigning them back cost more than the rows'
        other cells, which no image shows (key columns always written, uncounted cells 0)."""
        at_key = pa.array(key, type=pa.int64())
        at_index = pa.array(index, type=pa.int64())
        m = len(before)
        side = (index >= m).astype(np.int64)  # 0: before's rows, 1: after's
        rows = index - m * side
        columns = [b.take(at_key) if a is b else
                   take_rows([b, a.cast(b.type)], side, rows, b.type)
                   if is_string(b.type) else
                   pa.concat_arrays([b, a.cast(b.type)]).take(at_index)
                   for b, a in zip(before.columns, after.columns)]
        written = gather_rows([before.written.astype(bool, copy=False),
                               after.written.astype(bool, copy=False)], side, rows)
        counts = None
        if self.counted:
            counts = gather_rows([before.counts().astype(np.int64, copy=False),
                                  after.counts().astype(np.int64, copy=False)], side, rows)
        touched = None
        if self.timed:
            touched = np.concatenate([before.times(), after.times()])[index]
        return StateBatch(columns, written, counts, touched)

    def to_state(self, records: pa.Table) -> StateBatch:
        """Row images of changelog records as a StateBatch (written bits, counts and tokens
        restored)."""
        names = self.schema.names
        columns = [records.column(n).combine_chunks() for n in names]
        if self.tokenized:
            tokens = records.column(TOKENS).combine_chunks()
            for i in self.tokenized:
                columns[i] = tokens.field(names[i])
        if self.sequenced:
            sequences = records.column(SEQUENCES).combine_chunks()
            for i in self.sequenced:
                columns[i] = sequences.field(names[i])
        written = np.ones((records.num_rows, len(names)), dtype=bool)
        unwritten = records.column(UNWRITTEN).combine_chunks()
        missing = pc.list_flatten(unwritten)
        if len(missing):  # most images have every cell written: no pass over the rows
            position = {names[p]: p for p in self.value_positions}
            rows = pc.list_parent_indices(unwritten).to_numpy(zero_copy_only=False)
            cells = [position[name] for name in missing.to_pylist()]
            written[rows, cells] = False
        counts = np.zeros(written.shape, dtype=np.int64)
        if self.counted and records.num_rows:
            flat = records.column(CONTRIBUTIONS).combine_chunks().flatten().to_numpy()
            counts[:, self.counted] = flat.reshape(records.num_rows, len(self.counted))
        touched = None
        if self.timed:
            touched = pc.fill_null(records.column(WRITTEN_MS), 0).to_numpy().astype(np.int64)
        return StateBatch(columns, written, counts, touched)

    def row_changes(self, records: pa.Table, primary_key) -> tuple[KeyArray, StateBatch, KeyArray]:
        """(upserted keys, their after-images as states, removed keys) of one write's records:
        what replaying them does to the rows. The after-images are taken from the records
        once (a filter of the images and then a take of the upserts copied the strings
        twice)."""
        change = records.column(CHANGE_TYPE)
        upserted = pc.or_(pc.equal(change, INSERT), pc.equal(change, UPDATE_AFTER))
        upserts = np.flatnonzero(upserted.to_numpy(zero_copy_only=False))
        deletes = np.flatnonzero(pc.equal(change, DELETE).to_numpy(zero_copy_only=False))
        keys = key_array([records.column(k).combine_chunks() for k in primary_key])
        after = records.take(pa.array(upserts, type=pa.int64()))
        return keys.take(upserts), self.to_state(after), keys.take(deletes)


def _struct_with_nulls(records: pa.Table, hidden: str, struct_type: pa.StructType) -> pa.Array:
    """Hidden struct column `hidden` of `records` with today's fields: a field of a column
    added since those records were written is null."""
    n = records.num_rows
    old = records.column(hidden).combine_chunks() if hidden in records.column_names else None
    fields = [old.field(f.name) if old is not None and old.type.get_field_index(f.name) >= 0
              else pa.nulls(n, type=f.type) for f in struct_type]
    return pa.StructArray.from_arrays(fields, fields=list(struct_type))


def unwritten_lists(written: np.ndarray, value_positions: list[int], names: list[str]):
    if not value_positions:
        return pa.array([[] for _ in range(len(written))], type=pa.list_(pa.string()))
    missing = ~written[:, value_positions]
    if not missing.any():  # every cell written (the usual put): n empty lists, no name pass
        return pa.ListArray.from_arrays(pa.array(np.zeros(len(written) + 1, dtype=np.int32)),
                                        pa.array([], type=pa.string()))
    counts = missing.sum(axis=1)
    offsets = np.concatenate([[0], np.cumsum(counts)]).astype(np.int32)
    value_names = np.array([names[p] for p in value_positions], dtype=object)
    flat = value_names[np.nonzero(missing)[1]]
    return pa.ListArray.from_arrays(pa.array(offsets), pa.array(flat.tolist(), type=pa.string()))


# Entries of at least this many Arrow bytes are stored with their buffers LZ4-compressed.
# Why: a put's entry (full before and after images) is most of what it writes, and every byte
# is copied into the write batch, the WAL (fsynced), the memtable and SST files: on the ingest
# benchmark an entry shrinks about 2.2x. LZ4, not zstd (3.5x): the encoding runs beside the
# put on the core it leaves, and zstd's took a third more CPU than LZ4's, which the put then
# waited for (1M rows of repeated keys: 1.20M -> 1.30M rows/s, process CPU -13%), and every
# reader (followers, replay, undo, tiering) decodes LZ4 about three times as fast. Small
# entries (a few rows) stay plain: compressing them saves nothing and adds latency. Readers
# need no flag: Arrow's IPC format says which buffers are compressed, and how, so entries
# written with zstd before read as they always did.
COMPRESS_FROM_BYTES = 64 * 1024
_COMPRESSED = pa.ipc.IpcWriteOptions(compression="lz4")


def serialize(records: pa.Table) -> bytes:
    if records.nbytes < COMPRESS_FROM_BYTES:
        return _streamed(records, None)
    records = _compact_counts(records)
    # Into one buffer sized for the worst case, not a stream that grows by doubling: every
    # growth copied what was written into memory never touched before, which on the ingest
    # benchmark's first puts cost more than the copies. Pages past the end stay untouched.
    bound = int(records.nbytes * 1.02) + (64 << 10) \
        + 1024 * records.num_columns * max(1, len(records.to_batches()))
    buffer = pa.allocate_buffer(bound)
    sink = pa.FixedSizeBufferWriter(buffer)
    try:
        _write(records, sink, _COMPRESSED)
    except (pa.ArrowException, OSError):  # past the bound after all (Arrow: "out of bounds")
        return _streamed(records, _COMPRESSED)
    return buffer.slice(0, sink.tell()).to_pybytes()


def _streamed(records: pa.Table, options) -> bytes:
    sink = pa.BufferOutputStream()
    _write(records, sink, options)
    return sink.getvalue().to_pybytes()


def _write(records: pa.Table, sink, options) -> None:
    with pa.ipc.new_stream(sink, records.schema, options=options) as writer:
        writer.write_table(records)


def decode(data: bytes) -> pa.Table:
    """A stored entry's records as written, every column in the form writers gave it (the
    change type still as its code, no offsets)."""
    stored = pa.ipc.open_stream(pa.py_buffer(data)).read_all()
    index = stored.schema.get_field_index(CONTRIBUTIONS)
    if index >= 0 and pa.types.is_fixed_size_list(stored.schema.field(index).type):
        stored = stored.set_column(index, _COUNTS_FIELD,
                                   _count_lists(stored.column(index).combine_chunks()))
    return stored


# Contribution counts as a large entry stores them: when every record holds the same number
# of counts (the usual case: one per sum or product column), a fixed-size list of the
# narrowest signed integer that holds every count, not a list of int64 with an offset per
# record. On the ingest benchmark's repeated keys the counts were a sixth of an entry's
# compressed bytes, and every byte of an entry is copied into the write batch, the WAL and
# the memtable; compacted, they take almost nothing, and the same puts ran 4-5% faster.
_COUNTS_FIELD = pa.field(CONTRIBUTIONS, pa.list_(pa.int64()))
_COUNT_TYPES = (np.int8, np.int16, np.int32, np.int64)


def _compact_counts(records: pa.Table) -> pa.Table:
    index = records.schema.get_field_index(CONTRIBUTIONS)
    if index < 0 or not records.num_rows:
        return records
    lists = records.column(index).combine_chunks()
    if lists.null_count or not pa.types.is_list(lists.type):
        return records
    offsets = lists.offsets.to_numpy()
    n = len(lists)
    width = int(offsets[1] - offsets[0])
    if not width or not (np.diff(offsets) == width).all():
        return records
    counts = lists.values.slice(int(offsets[0]), n * width).to_numpy(zero_copy_only=False)
    low, high = int(counts.min()), int(counts.max())
    stored = next(t for t in _COUNT_TYPES if np.iinfo(t).min <= low and high <= np.iinfo(t).max)
    values = pa.array(counts.astype(stored, copy=False))
    return records.set_column(index, pa.field(CONTRIBUTIONS, pa.list_(values.type, width)),
                              pa.FixedSizeListArray.from_arrays(values, width))


def _count_lists(compact: pa.FixedSizeListArray) -> pa.ListArray:
    width = compact.type.list_size
    values = compact.flatten().cast(pa.int64())
    offsets = np.arange(len(compact) + 1, dtype=np.int32) * width
    return pa.ListArray.from_arrays(pa.array(offsets), values)


def deserialize(data: bytes, first_offset: int) -> pa.Table:
    """A stored batch as readers see it, its first record at `first_offset`."""
    stored = decode(data)
    n = stored.num_rows
    codes = stored.column(CHANGE_CODE).combine_chunks()
    return stored.drop_columns([CHANGE_CODE]) \
        .add_column(0, pa.field(CHANGE_TYPE, pa.string(), nullable=False), [CHANGE_TYPES.take(codes)]) \
        .add_column(0, pa.field(OFFSET, pa.int64(), nullable=False),
                    [pa.array(np.arange(first_offset, first_offset + n, dtype=np.int64))])
