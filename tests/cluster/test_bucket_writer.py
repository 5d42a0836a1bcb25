"""The bucket-addressed writer: rows bucketed by the caller go to their bucket as they are.

What the sink's tasks rely on: a bucket's rows, split by partition and cut into several
requests, land exactly as an upsert of the same rows would; rows of another bucket are refused
by the tablet server (its trust boundary), with nothing applied.
"""

from __future__ import annotations

import itertools

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from merge_engine import MergeMode
from merge_engine.write.preaggregate import preaggregate
from tally.errors import InvalidInputError
from tally.wire.bucket_hash import bucket_ids
from tests.cluster import reference_workload

BUCKETS = 3
_tables = itertools.count()

rows_strategy = st.lists(
    st.tuples(st.integers(0, 30), st.sampled_from(reference_workload.REGIONS),
              st.integers(-1000, 1000), st.one_of(st.none(), st.floats(0, 100)),
              st.one_of(st.none(), st.just(1)), st.one_of(st.none(), st.sampled_from("abc"))),
    min_size=1, max_size=120)


def as_table(rows) -> pa.Table:
    names = ["k", "region", "total", "peak", "hits", "label"]
    return pa.table({n: [r[i] for r in rows] for i, n in enumerate(names)},
                    schema=reference_workload.descriptor().schema.to_arrow())


@settings(max_examples=12, deadline=None, suppress_health_check=list(HealthCheck))
@given(rows=rows_strategy, max_request_bytes=st.sampled_from([64, 512, 4 << 20]))
def test_bucket_writes_equal_the_reference_fold(cluster, conn, rows, max_request_bytes):
    """Each bucket's rows, folded as the sink folds them and sent through its own bucket
    writer (in one or many requests), give the reference fold of all rows."""
    name = f"default.bucket_writer{next(_tables)}"
    descriptor = reference_workload.descriptor(buckets=BUCKETS)
    conn.admin.create_table(name, descriptor)
    table = conn.table(name)
    data = as_table(rows)
    ids = bucket_ids(data, ["k"], BUCKETS)
    ends = {}
    for bucket in np.unique(ids):
        mine = data.filter(pa.array(ids == bucket))
        folded = preaggregate(mine, descriptor)
        writer = table.bucket_writer(int(bucket), mode=MergeMode.MERGE_STATE,
                                     max_request_bytes=max_request_bytes)
        ends.update(writer.put(folded))
    assert set(ends) == {(r, int(b)) for r, b in zip(data.column("region").to_pylist(), ids)}
    offsets = table.list_offsets()
    assert all(offsets[key] == end for key, end in ends.items())
    got = reference_workload.as_state(table.to_arrow())
    assert got == reference_workload.fold([data])
    conn.admin.drop_table(name)


def test_rows_of_another_bucket_are_refused_and_nothing_is_applied(conn, table_name):
    conn.admin.create_table(table_name, reference_workload.descriptor(buckets=BUCKETS))
    table = conn.table(table_name)
    data = as_table([(k, "eu", 1, None, 1, None) for k in range(20)])
    ids = bucket_ids(data, ["k"], BUCKETS)
    assert len(set(ids.tolist())) > 1
    writer = table.bucket_writer(int(ids[0]))
    with pytest.raises(InvalidInputError, match="belongs to bucket"):
        writer.put(data)
    assert table.to_arrow().num_rows == 0
    assert all(end == 0 for end in table.list_offsets().values())
