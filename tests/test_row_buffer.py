"""RowBuffer against a plain dict, and the bounds BucketRows keeps on what a crash replays.

The buffer's index keeps keys as uint64 when every key fits in 8 bytes and as fixed-width
strings otherwise, switching when longer keys arrive; both rely on key encodings being
prefix-free. So the keys here come from the real key encoding (int64 keys, and string keys of
any length, empty and NUL-holding ones included).
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
from hypothesis import given, settings, strategies as st

from aggfuncs import AggFunction
from merge_engine import Schema, TableDescriptor
from merge_engine.kv.buffer import ABSENT, REMOVED, RowBuffer
from merge_engine.kv.tablet import KvTablet
from merge_engine.write.keys import KeyArray, encode_keys, group_keys, key_array, rows_as_bytes
from merge_engine.write.state import StateBatch

STRINGS = st.text(alphabet=st.sampled_from(["a", "b", "\x00", "é", "z"]), max_size=12)
INTS = st.integers(-2**63, 2**63 - 1)


def encoded(values: list, kind: pa.DataType | None = None) -> KeyArray:
    """The real encoding of int64 or string key values (`kind`: their type, else guessed)."""
    kind = kind or (pa.string() if values and isinstance(values[0], str) else pa.int64())
    return key_array([pa.array(values, type=kind)])


def rows(values: list[int]) -> StateBatch:
    """One-column rows whose value identifies the write that made them."""
    return StateBatch([pa.array(values, type=pa.int64())], np.ones((len(values), 1), dtype=bool))


@st.composite
def writes(draw):
    """A sequence of writes: (upserted keys, removed keys) over one key type."""
    strings = draw(st.booleans())
    pool = draw(st.lists(STRINGS if strings else INTS, min_size=1, max_size=20, unique=True))
    kind = pa.string() if strings else pa.int64()
    steps = []
    for _ in range(draw(st.integers(1, 12))):
        chosen = draw(st.lists(st.sampled_from(pool), max_size=len(pool), unique=True))
        cut = draw(st.integers(0, len(chosen)))
        # puts hand the buffer their keys in key order; removed keys come in any order
        upserts = encoded(chosen[:cut], kind)
        upserts = upserts.take(np.argsort(upserts.to_list(), kind="stable")) if len(upserts) \
            else upserts
        steps.append((upserts, encoded(chosen[cut:], kind),
                      draw(st.sampled_from(["none", "compact", "copy", "settle", "merge"])),
                      draw(st.integers(0, 12))))
    return encoded(pool, kind), steps


@settings(max_examples=150, deadline=None)
@given(writes())
def test_buffer_matches_a_dict(case):
    keys, steps = case
    buffer, model, serial = RowBuffer(), {}, 0
    for upserts, removed, then, first_run in steps:
        values = list(range(serial, serial + len(upserts)))
        serial += len(upserts)
        buffer.add(upserts, rows(values) if len(upserts) else None, removed)
        model.update(zip(upserts.to_list(), values))
        model.update((k, None) for k in removed.to_list())
        if then == "compact":
            buffer = buffer.compacted()
        elif then == "copy":
            buffer = buffer.copy()
        elif then == "settle":
            buffer = buffer.settled(1 << 30)
        elif then == "merge" and len(buffer._runs):
            buffer = buffer.merged_from(min(first_run, len(buffer._runs) - 1))
        found = buffer.find(keys)
        for key, got in zip(keys.to_list(), found.tolist()):
            expected = model.get(key, ABSENT)
            assert (got == ABSENT) == (expected is ABSENT)
            assert (got == REMOVED) == (expected is None)
        live = [i for i, g in enumerate(found.tolist()) if g >= 0]
        if live:
            got = buffer.states(found[live]).columns[0].to_pylist()
            assert got == [model[keys.to_list()[i]] for i in live]
    # a scan's read: every live row once, each run's as they are (values are unique serials)
    scanned = [v for run in buffer.live_runs() for v in run.columns[0].to_pylist()]
    assert sorted(scanned) == sorted(v for v in model.values() if v is not None)
    drained_keys, drained_rows, drained_removed = buffer.drain()
    if not model:
        assert drained_keys is None and drained_rows is None
        return
    assert drained_keys.to_list() == sorted(k for k, v in model.items() if v is not None)
    assert sorted(drained_removed.to_list()) == sorted(k for k, v in model.items() if v is None)
    if len(drained_keys):
        assert drained_rows.columns[0].to_pylist() == [model[k] for k in drained_keys.to_list()]


def test_a_copy_does_not_change_when_the_original_grows():
    keys = encoded([1, 2, 3])
    none = keys.take(slice(0, 0))
    first = RowBuffer()
    first.add(keys.take(slice(0, 2)), rows([10, 20]), none)
    second = first.copy()
    first.add(keys.take(slice(1, 3)), rows([21, 30]), keys.take(slice(0, 1)))
    assert second.find(keys).tolist()[2] == ABSENT
    assert second.states(second.find(keys.take(slice(0, 2)))).columns[0].to_pylist() == [10, 20]


def _hot_key_tablet(path, buffer_size: str) -> KvTablet:
    schema = (Schema.builder().column("id", pa.int64(), nullable=False)
              .agg_column("n", pa.int64(), AggFunction.SUM).primary_key("id").build())
    return KvTablet.open(path, TableDescriptor(schema, properties={
        "table.merge-engine": "aggregation", "table.kv.buffer-size": buffer_size}))


def test_hot_keys_leave_a_bounded_changelog_to_replay(tmp_path):
    """Three keys updated over and over never fill the buffer (compaction keeps it tiny), yet
    the rows are flushed once the changelog since the last flush reaches 4 buffer sizes."""
    with _hot_key_tablet(tmp_path / "t", "4kb") as tablet:
        applied = []
        for i in range(300):
            tablet.put([{"id": k, "n": 1} for k in (1, 2, 3)])
            applied.append(tablet._rows.applied_offset())
        end = tablet.log_end_offset
        assert len(set(applied)) > 5, "the rows were never flushed while the buffer stayed small"
        lag_bytes = sum(len(data) for first, data in tablet._store.log_entries(applied[-1])
                        if first >= applied[-1])
        assert lag_bytes <= 4 * 4096 + 4096
        assert tablet.lookup({"id": 2}) == {"id": 2, "n": 300}
        assert end == 3 + 299 * 6


def test_a_buffer_that_is_never_flushed_keeps_reads_exact(tmp_path):
    with _hot_key_tablet(tmp_path / "t", "1gb") as tablet:
        for i in range(50):
            tablet.put([{"id": k, "n": i} for k in range(20)])
        assert tablet._rows.applied_offset() == 0
        assert tablet.lookup({"id": 7}) == {"id": 7, "n": sum(range(50))}
        assert tablet.to_arrow().column("n").to_pylist() == [sum(range(50))] * 20
        assert tablet._rows.applied_offset() == tablet.log_end_offset


KEY_SHAPES = {  # key columns of each shape: fixed <= 8 bytes, fixed > 8, variable width
    "int32": [pa.int32()],
    "int64": [pa.int64()],
    "int64+int64": [pa.int64(), pa.int64()],
    "string+int64": [pa.string(), pa.int64()],  # variable width, may end in zero bytes
}


@st.composite
def key_columns(draw):
    types = KEY_SHAPES[draw(st.sampled_from(sorted(KEY_SHAPES)))]
    n = draw(st.integers(0, 30))
    values = {pa.int32(): st.integers(-3, 3) | st.integers(-2**31, 2**31 - 1),
              pa.int64(): st.sampled_from([0, 1, 256, -256, 2**40, -1]) | INTS,
              pa.string(): STRINGS}
    return [pa.array(draw(st.lists(values[t], min_size=n, max_size=n)), type=t) for t in types]


@settings(max_examples=200, deadline=None)
@given(key_columns())
def test_key_arrays_are_the_encoded_bytes_and_sort_like_them(columns):
    """KeyArray keeps every key's exact bytes (also keys ending in zero bytes) and its numpy
    values compare like the bytes: the buffer's index relies on both."""
    keys = key_array(columns)
    encoded_bytes = encode_keys(columns)
    assert keys.to_list() == encoded_bytes
    order = np.argsort(keys.search, kind="stable")
    assert [encoded_bytes[i] for i in order] == sorted(encoded_bytes)
    for i in range(len(keys)):
        for j in range(len(keys)):
            assert (keys.search[i] == keys.search[j]) == (encoded_bytes[i] == encoded_bytes[j])
    grouped, group_ids, firsts = group_keys(columns)
    assert grouped.to_list() == sorted(set(encoded_bytes))
    assert [grouped.to_list()[g] for g in group_ids] == encoded_bytes
    assert list(firsts) == [encoded_bytes.index(k) for k in grouped.to_list()]


@settings(max_examples=100, deadline=None)
@given(st.integers(0, 12).flatmap(lambda width: st.lists(
           st.binary(min_size=width, max_size=width), max_size=20).map(lambda rows: (width, rows))),
       st.sampled_from([b"", b"k", b"\x00ab"]))
def test_rows_as_bytes_keep_every_byte_after_the_prefix(shape, prefix):
    """A RocksDB key is the prefix, then every byte of the encoded key: trailing zero bytes
    too (numpy's 'S' items would drop them), whatever the width."""
    width, rows = shape
    matrix = np.frombuffer(b"".join(rows), dtype=np.uint8).reshape(len(rows), width)
    assert rows_as_bytes(matrix, prefix) == [prefix + row for row in rows]


@settings(max_examples=100, deadline=None)
@given(key_columns(), st.sampled_from([b"", b"k"]))
def test_key_lists_carry_the_prefix(columns, prefix):
    assert key_array(columns).to_list(prefix) == [prefix + k for k in encode_keys(columns)]


def test_small_puts_keep_few_runs_and_every_row():
    """A stream of small puts: the newest runs merge as they outgrow the run before them, so
    the runs a put may have to take from stay logarithmic in the puts, and no row is lost."""
    buffer, model = RowBuffer(), {}
    none = encoded([]).take(slice(0, 0))
    for put in range(300):
        keys = sorted({(put * 37 + i * 11) % 2_000 for i in range(50)})
        buffer.add(encoded(keys), rows([put] * len(keys)), none)
        buffer = buffer.settled(1 << 30)
        model.update((k, put) for k in keys)
        assert len(buffer._runs) <= 10  # 2 * log2(300) would be 16
    found = buffer.find(encoded(sorted(model)))
    assert buffer.states(found).columns[0].to_pylist() == [model[k] for k in sorted(model)]
