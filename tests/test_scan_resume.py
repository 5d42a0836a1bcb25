"""The rest of a bucket's scan, resumed from a later state, equals a plain model's rows as of the
scan's offset: hypothesis draws a bucket's state, the order its rows were streamed in, how many
were handed out before the stream failed, and the changes the new leader applied since (each a
changelog record pair, as a tablet writes them). No cluster: `resumed_batches` on Arrow tables."""

from __future__ import annotations

import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from tally.client.scan_resume import KeysSeen, resumed_batches

SCHEMA = pa.schema([pa.field("k", pa.int64(), False), pa.field("tag", pa.string()),
                    pa.field("total", pa.int64())])
KEYS = st.integers(0, 30)


def table(rows: dict[tuple[int, str], int], order=None) -> pa.Table:
    keys = list(rows) if order is None else order
    return pa.table({"k": [k for k, _t in keys], "tag": [t for _k, t in keys],
                     "total": [rows[key] for key in keys]}, schema=SCHEMA)


def apply(state: dict, changes, start: int) -> tuple[dict, pa.Table]:
    """The state after `changes` and their changelog records from offset `start`."""
    state = dict(state)
    out = {"_offset": [], "_change_type": [], "k": [], "tag": [], "total": []}

    def record(kind, key, total):
        out["_offset"].append(start + len(out["_offset"]))
        out["_change_type"].append(kind)
        out["k"].append(key[0])
        out["tag"].append(key[1])
        out["total"].append(total)

    for key, value in changes:
        if value is None:
            if key in state:
                record("-D", key, state.pop(key))
        elif key in state:
            record("-U", key, state[key])
            record("+U", key, value)
            state[key] = value
        else:
            record("+I", key, value)
            state[key] = value
    return state, pa.table(out)


@settings(max_examples=200, deadline=None)
@given(st.dictionaries(st.tuples(KEYS, st.sampled_from(["a", "b"])), st.integers(-5, 5),
                       max_size=40),
       st.randoms(use_true_random=False),
       st.floats(0, 1),
       st.lists(st.tuples(st.tuples(KEYS, st.sampled_from(["a", "b"])),
                          st.one_of(st.none(), st.integers(-5, 5))), max_size=30),
       st.integers(1, 7))
def test_a_resumed_scan_is_the_state_at_its_offset_exactly_once(at_a, rng, cut, changes,
                                                                 batch_rows):
    order = list(at_a)
    rng.shuffle(order)
    streamed = table(at_a, order)
    handed_count = int(cut * streamed.num_rows)
    seen = KeysSeen(["k", "tag"])
    handed = streamed.slice(0, handed_count)
    for batch in handed.to_batches(max_chunksize=batch_rows):
        seen.add(batch)
    scan_offset = 100
    at_b, records = apply(at_a, changes, scan_offset)
    fresh_order = list(at_b)
    rng.shuffle(fresh_order)
    fresh = table(at_b, fresh_order).to_batches(max_chunksize=batch_rows)

    def read_range(start, end):
        return records.filter(pa.compute.and_(
            pa.compute.greater_equal(records.column("_offset"), start),
            pa.compute.less(records.column("_offset"), end)))

    rest = list(resumed_batches(iter(fresh), SCHEMA, seen, read_range, scan_offset,
                                scan_offset + records.num_rows, "bucket 0"))
    got = pa.Table.from_batches(handed.to_batches() + rest, schema=SCHEMA).to_pylist()
    pairs = [((r["k"], r["tag"]), r["total"]) for r in got]
    assert len(pairs) == len({key for key, _v in pairs}), "a row handed out twice"
    assert dict(pairs) == at_a
