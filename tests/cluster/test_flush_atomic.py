"""A flush is all or nothing across buckets and partitions, and its error never claims more.

On a real cluster: an upsert writer's flush over many buckets, one of which refuses (an int8
sum overflowing), must leave every bucket as it was and say so; with `atomic=False` it must
raise PartialWriteError naming exactly the buckets that applied and those that refused; an
undo that another writer's change makes inexact leaves that bucket applied and says so. A
hypothesis model drives batches against a plain-Python model of the table.
"""

from __future__ import annotations

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from merge_engine import Schema, TableDescriptor
from tally.errors import AggregateOverflowError, PartialWriteError
from tests.waiting import wait_until

BUCKETS = 4


@pytest.fixture
def counts(conn, table_name):
    schema = (Schema.builder().column("k", pa.int64()).agg_column("n", pa.int8(), "sum")
              .agg_column("tags", pa.list_(pa.string()), "array_agg").primary_key("k").build())
    conn.admin.create_table(table_name, TableDescriptor(schema, bucket_count=BUCKETS, properties={
        "table.merge-engine": "aggregation"}))
    return conn.table(table_name)


@pytest.fixture
def regional(conn, table_name):
    schema = (Schema.builder().column("region", pa.string()).column("k", pa.int64())
              .agg_column("n", pa.int8(), "sum").primary_key("region", "k")
              .partition_key("region").build())
    conn.admin.create_table(table_name, TableDescriptor(schema, bucket_count=2, properties={
        "table.merge-engine": "aggregation",
        "table.partition.dynamic-creation.enabled": "true"}))
    return conn.table(table_name)


def rows(table) -> dict:
    return {tuple(r[c] for c in table.meta.routing.primary_key): r
            for r in table.to_arrow().to_pylist()}


def write(table, batch, **options):
    with table.upsert_writer(**options) as writer:
        writer.upsert(batch)


def test_a_refused_bucket_leaves_every_bucket_as_it_was(counts):
    write(counts, [{"k": k, "n": 127 if k in (3, 6) else 0, "tags": ["a"]} for k in range(16)])
    before = rows(counts)
    writer = counts.upsert_writer()
    writer.upsert([{"k": k, "n": 1, "tags": ["b"]} for k in range(16)])
    with pytest.raises(AggregateOverflowError) as raised:
        writer.flush()
    message = str(raised.value)
    assert "Nothing of this flush was applied" in message
    overflowing = {counts.bucket_of({"k": k}) for k in (3, 6)}
    # once one bucket refuses, a bucket whose part was not sent yet sends nothing: which of
    # the two overflowing buckets got as far as refusing depends on the threads' order
    refused = set(raised.value.refused)
    assert refused and refused <= overflowing
    for _, bucket in refused:  # every refusing bucket is named, not only the first
        assert f"bucket {bucket}:" in message
    assert rows(counts) == before
    # the writer goes on: the next flush is a new unit, applied whole
    writer.upsert([{"k": 0, "n": 5, "tags": None}])
    assert writer.flush()
    assert rows(counts)[(0,)]["n"] == 5
    writer.close()


def test_across_partitions_too(regional):
    write(regional, [{"region": r, "k": k, "n": 127 if (r, k) == ("west", 1) else 0}
                     for r in ("east", "west", "north") for k in range(4)])
    before = rows(regional)
    with pytest.raises(AggregateOverflowError, match="Nothing of this flush was applied"):
        write(regional, [{"region": r, "k": k, "n": 1}
                         for r in ("east", "west", "north", "south") for k in range(4)])
    after = rows(regional)
    assert after == before or {key: r for key, r in after.items() if key[0] != "south"} == before
    # a partition the refused flush created holds no rows of it
    assert not [key for key in after if key[0] == "south"]


def test_atomic_false_names_what_stays_applied(counts):
    write(counts, [{"k": k, "n": 127 if k == 5 else 0} for k in range(12)])
    writer = counts.upsert_writer(atomic=False)
    writer.upsert([{"k": k, "n": 1} for k in range(12)])
    with pytest.raises(PartialWriteError) as raised:
        writer.flush()
    error = raised.value
    refused = counts.bucket_of({"k": 5})
    assert set(error.refused) == {refused}
    assert "partly applied" in str(error)
    applied = {counts.bucket_of({"k": k}) for k in range(12)} - {refused}
    assert set(error.applied) == applied
    now = rows(counts)
    for k in range(12):  # exactly the named buckets hold the write
        want = 127 if k == 5 else (1 if counts.bucket_of({"k": k}) in applied else 0)
        assert now[(k,)]["n"] == want, k
    writer.close()


def test_an_undo_another_writer_made_inexact_stays_applied_and_says_so(counts):
    write(counts, [{"k": k, "n": 127 if k == 1 else 0} for k in range(8)])
    target = next(k for k in range(8) if counts.bucket_of({"k": k}) != counts.bucket_of({"k": 1}))
    writer = counts.upsert_writer()
    writer.upsert([{"k": target, "n": 2}])
    wait_until(lambda: counts.lookup({"k": target})["n"] == 2, "the first part applied",
               deadline=60)
    write(counts, [{"k": target, "n": 10}])  # another writer, on the same key
    writer.upsert([{"k": 1, "n": 1}])  # refused: overflows
    with pytest.raises(PartialWriteError) as raised:
        writer.flush()
    error = raised.value
    assert set(error.applied) == {counts.bucket_of({"k": target})}
    assert counts.bucket_of({"k": 1}) in error.refused
    assert "WriteUndoConflictError" in str(error) and "partly applied" in str(error)
    assert counts.lookup({"k": target})["n"] == 12  # both writes stand, as the error says
    writer.close()


def test_an_owners_flush_is_undone_under_its_lease(conn, table_name):
    schema = (Schema.builder().column("k", pa.int64()).agg_column("n", pa.int8(), "sum")
              .agg_column("other", pa.int64(), "sum").primary_key("k").build())
    conn.admin.create_table(table_name, TableDescriptor(schema, bucket_count=BUCKETS, properties={
        "table.merge-engine": "aggregation", "table.column-lock.enabled": "true"}))
    table = conn.table(table_name)
    lease = conn.locks.acquire(table_name, "owner-1", ["n"], ttl=60)
    try:
        write(table, [{"k": k, "n": 127 if k == 2 else 0} for k in range(8)],
              target_columns=["k", "n"], lease=lease)
        before = rows(table)
        with pytest.raises(AggregateOverflowError, match="Nothing of this flush was applied"):
            write(table, [{"k": k, "n": 1} for k in range(8)], target_columns=["k", "n"],
                  lease=lease)
        assert rows(table) == before
    finally:
        conn.locks.release(lease)


batches = st.lists(st.lists(st.tuples(st.integers(0, 9), st.integers(-60, 60)), min_size=1,
                            max_size=12), min_size=1, max_size=4)


@settings(max_examples=6, deadline=None, database=None, suppress_health_check=list(HealthCheck))
@given(batches=batches)
def test_flushes_against_a_model(conn, table_name, batches):
    """Each flush either applies whole (every running total fits int8) or not at all."""
    name = f"{table_name}_{abs(hash(str(batches))) % 10**8}"
    schema = (Schema.builder().column("k", pa.int64()).agg_column("n", pa.int8(), "sum")
              .primary_key("k").build())
    conn.admin.create_table(name, TableDescriptor(schema, bucket_count=BUCKETS, properties={
        "table.merge-engine": "aggregation"}))
    table = conn.table(name)
    model: dict[int, int] = {}
    try:
        for batch in batches:
            trial, fits = dict(model), True
            for k, n in batch:
                trial[k] = trial.get(k, 0) + n
                fits &= -128 <= trial[k] <= 127
            try:
                write(table, [{"k": k, "n": n} for k, n in batch])
                assert fits, f"{batch} was accepted over {model}"
                model = trial
            except AggregateOverflowError as e:
                assert not fits, f"{batch} was refused over {model}: {e}"
            assert {k[0]: r["n"] for k, r in rows(table).items()} == model
    finally:
        conn.admin.drop_table(name)


def test_a_bucket_that_did_not_answer_is_never_claimed_unapplied():
    """An unanswered request may yet commit (it sits above the high watermark): the error
    must not say nothing was applied, even when every answered part was undone."""
    from tally.client.flush_outcome import FlushOutcome
    from tally.errors import UnavailableError

    outcome = FlushOutcome()
    outcome.applied((None, 0), 10, 14)
    outcome.refuse((None, 1), UnavailableError("write not acknowledged, retry"))
    undone = []
    error = outcome.failure(lambda key, ranges: undone.append((key, ranges)) or 20)
    assert undone == [((None, 0), [(10, 14)])]
    assert isinstance(error, PartialWriteError) and error.applied == {}
    assert "may be partly applied" in str(error) and "may yet be applied" in str(error)
    assert "Nothing of this flush was applied" not in str(error)
