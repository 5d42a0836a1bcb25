"""RowBuffer against a plain dict, and the bounds BucketRows keeps on what a crash replays.

The buffer's index keeps keys as uint64 when every key fits in 8 bytes and as fixed-width
strings otherwise, switching when longer keys arrive; both rely on key encodings being
prefix-free. So the keys here come from the real key encoding (int64 keys, and string keys of
any length, empty and NUL-holding ones included).
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from aggfuncs import AggFunction
from merge_engine import KvTablet, Schema, TableDescriptor
from merge_engine.buffer import ABSENT, REMOVED, RowBuffer
from merge_engine.keys import encode_keys
from merge_engine.state import StateBatch

STRINGS = st.text(alphabet=st.sampled_from(["a", "b", "\x00", "é", "z"]), max_size=12)
INTS = st.integers(-2**63, 2**63 - 1)


def encoded(values: list) -> list[bytes]:
    kind = pa.string() if values and isinstance(values[0], str) else pa.int64()
    return encode_keys([pa.array(values, type=kind)])


def rows(values: list[int]) -> StateBatch:
    """One-column rows whose value identifies the write that made them."""
    return StateBatch([pa.array(values, type=pa.int64())], np.ones((len(values), 1), dtype=bool))


@st.composite
def writes(draw):
    """A sequence of writes: (upserted keys, removed keys) over one key type."""
    pool = draw(st.lists(STRINGS, min_size=1, max_size=20, unique=True) if draw(st.booleans())
                else st.lists(INTS, min_size=1, max_size=20, unique=True))
    keys = encoded(pool)
    steps = []
    for _ in range(draw(st.integers(1, 12))):
        chosen = draw(st.lists(st.sampled_from(keys), max_size=len(keys), unique=True))
        cut = draw(st.integers(0, len(chosen)))
        steps.append((sorted(chosen[:cut]), sorted(chosen[cut:]),
                      draw(st.sampled_from(["none", "compact", "copy"]))))
    return keys, steps


@settings(max_examples=150, deadline=None)
@given(writes())
def test_buffer_matches_a_dict(case):
    keys, steps = case
    buffer, model, serial = RowBuffer(), {}, 0
    for upserts, removed, then in steps:
        values = list(range(serial, serial + len(upserts)))
        serial += len(upserts)
        buffer.add(upserts, rows(values) if upserts else None, removed)
        model.update(zip(upserts, values))
        model.update((k, None) for k in removed)
        if then == "compact":
            buffer = buffer.compacted()
        elif then == "copy":
            buffer = buffer.copy()
        found = buffer.find(keys)
        for key, got in zip(keys, found.tolist()):
            expected = model.get(key, ABSENT)
            assert (got == ABSENT) == (expected is ABSENT)
            assert (got == REMOVED) == (expected is None)
        live = [i for i, g in enumerate(found.tolist()) if g >= 0]
        if live:
            got = buffer.states(found[live]).columns[0].to_pylist()
            assert got == [model[keys[i]] for i in live]
    drained_keys, drained_rows, drained_removed = buffer.drain()
    assert drained_keys == sorted(k for k, v in model.items() if v is not None)
    assert sorted(drained_removed) == sorted(k for k, v in model.items() if v is None)
    if drained_keys:
        assert drained_rows.columns[0].to_pylist() == [model[k] for k in drained_keys]


def test_a_copy_does_not_change_when_the_original_grows():
    keys = encoded([1, 2, 3])
    first = RowBuffer()
    first.add(keys[:2], rows([10, 20]), [])
    second = first.copy()
    first.add(keys[1:], rows([21, 30]), [keys[0]])
    assert second.find(keys).tolist()[2] == ABSENT
    assert second.states(second.find(keys[:2])).columns[0].to_pylist() == [10, 20]


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
            applied.append(tablet._rows.applied_offset(tablet.log_end_offset))
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
        assert tablet._rows.applied_offset(tablet.log_end_offset) == 0
        assert tablet.lookup({"id": 7}) == {"id": 7, "n": sum(range(50))}
        assert tablet.to_arrow().column("n").to_pylist() == [sum(range(50))] * 20
        assert tablet._rows.applied_offset(tablet.log_end_offset) == tablet.log_end_offset
