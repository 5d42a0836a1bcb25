"""MemoryBudget (merge_engine/kv/budget.py): buckets opened with one budget share its cap.

Real RocksDB, real tablets. Each bucket's own row buffer is set far above the budget, so only
the budget can make them flush; a plain dict of per-key sums is the reference.
"""

from __future__ import annotations

import argparse
import random
import threading

import pyarrow as pa
import pytest

from aggfuncs import AggFunction
from merge_engine import Schema, TableDescriptor
from merge_engine.kv.budget import MemoryBudget
from merge_engine.kv.storage import KV_APPLIED
from merge_engine.kv.tablet import KvTablet

ROW_CAP = 64 << 10  # the row buffers' half of a 128 KiB budget


def descriptor() -> TableDescriptor:
    schema = (Schema.builder().column("id", pa.int64(), nullable=False)
              .agg_column("n", pa.int64(), AggFunction.SUM)
              .agg_column("tags", pa.string(), AggFunction.STRING_AGG)
              .primary_key("id").build())
    return TableDescriptor(schema, properties={"table.merge-engine": "aggregation",
                                               "table.kv.buffer-size": "1gb"})


def open_buckets(tmp_path, count: int, budget: MemoryBudget | None) -> list[KvTablet]:
    return [KvTablet.open(tmp_path / f"bucket-{i}", descriptor(), budget) for i in range(count)]


def write(tablet: KvTablet, model: dict, rnd: random.Random) -> None:
    rows = [{"id": rnd.randrange(400), "n": rnd.randint(1, 9), "tags": rnd.choice("abc")}
            for _ in range(rnd.randint(1, 60))]
    tablet.put(rows)
    for row in rows:
        n, tags = model.get(row["id"], (0, None))
        model[row["id"]] = (n + row["n"], row["tags"] if tags is None else tags + "," + row["tags"])


def check(tablet: KvTablet, model: dict) -> None:
    got = {r["id"]: (r["n"], r["tags"]) for r in tablet.to_arrow().to_pylist()}
    assert got == model


def flushed_up_to(tablet: KvTablet) -> int:
    return tablet._store.get_int(KV_APPLIED)


def test_row_buffers_of_all_buckets_stay_within_the_budget(tmp_path):
    budget = MemoryBudget(2 * ROW_CAP)
    assert budget.row_buffer_bytes == ROW_CAP
    buckets = open_buckets(tmp_path, 3, budget)
    models = [{} for _ in buckets]
    rnd = random.Random(5)
    peak = 0
    for _ in range(300):
        i = rnd.randrange(len(buckets))
        write(buckets[i], models[i], rnd)
        total = sum(b.buffered_bytes for b in buckets)
        assert total == budget.buffered_bytes
        assert total <= ROW_CAP, f"row buffers hold {total} bytes, over the cap of {ROW_CAP}"
        peak = max(peak, total)
    assert peak > ROW_CAP // 4, "the workload never filled the buffers: nothing was tested"
    assert all(flushed_up_to(b) > 0 for b in buckets), "the budget flushed no bucket"
    assert budget.memtable_bytes > 0, "the buckets' memtables are not counted by the budget"
    for bucket, model in zip(buckets, models):
        check(bucket, model)
        bucket.close()
    assert budget.buffered_bytes == 0


def test_without_a_budget_the_same_writes_outgrow_the_cap(tmp_path):
    """The contrast that shows the budget is what bounds the buffers above."""
    buckets = open_buckets(tmp_path, 3, None)
    models = [{} for _ in buckets]
    rnd = random.Random(5)
    for _ in range(300):
        i = rnd.randrange(len(buckets))
        write(buckets[i], models[i], rnd)
    assert sum(b.buffered_bytes for b in buckets) > ROW_CAP
    assert all(flushed_up_to(b) == 0 for b in buckets)
    for bucket, model in zip(buckets, models):
        check(bucket, model)
        bucket.close()


def test_buckets_written_from_many_threads_share_a_budget_without_deadlock(tmp_path):
    """Each write may flush another bucket while that bucket is being written: no lock is held
    across buckets, so nothing waits in a cycle, and every row lands."""
    budget = MemoryBudget(2 * ROW_CAP)
    buckets = open_buckets(tmp_path, 4, budget)
    models = [{} for _ in buckets]
    errors: list[BaseException] = []

    def writer(i: int) -> None:
        rnd = random.Random(i)
        try:
            for _ in range(150):
                write(buckets[i], models[i], rnd)
        except BaseException as e:  # reported below, with the thread's bucket
            errors.append(e)

    threads = [threading.Thread(target=writer, args=(i,)) for i in range(len(buckets))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not any(t.is_alive() for t in threads), "writers sharing a budget deadlocked"
    assert not errors, errors
    assert budget.buffered_bytes <= ROW_CAP
    for bucket, model in zip(buckets, models):
        check(bucket, model)
        bucket.close()


def test_a_closed_bucket_leaves_the_budget_and_is_never_flushed_again(tmp_path):
    budget = MemoryBudget(2 * ROW_CAP)
    first, second = open_buckets(tmp_path, 2, budget)
    rnd = random.Random(9)
    model: dict = {}
    write(first, {}, rnd)
    first.close()
    for _ in range(200):
        write(second, model, rnd)
    assert budget.buffered_bytes == second.buffered_bytes <= ROW_CAP
    check(second, model)
    second.close()


@pytest.mark.parametrize("bad", [0, -1, "1gb"])
def test_a_budget_must_be_a_positive_byte_count(bad):
    with pytest.raises(ValueError, match="positive number of bytes"):
        MemoryBudget(bad)


def test_a_tablet_host_opens_every_bucket_with_its_servers_budget(tmp_path):
    """What `tally serve --memory-budget` sets up: one budget for all hosted buckets."""
    from tally.server.serve_args import add_serve_arguments
    from tally.server.tablet.tablets import TabletHost, TabletKey

    parse = add_serve_arguments(argparse.ArgumentParser()).parse_args
    assert parse(["--data-dir", "d"]).memory_budget == 1 << 30
    assert parse(["--data-dir", "d", "--memory-budget", "128kb"]).memory_budget == 2 * ROW_CAP
    assert TabletHost(str(tmp_path / "unbudgeted"), parse(
        ["--data-dir", "d", "--memory-budget", "0"]).memory_budget).budget is None

    host = TabletHost(str(tmp_path / "server"), 2 * ROW_CAP)
    desc = descriptor()
    buckets = [host.open(TabletKey(1, 0, b), desc.to_json(), None, None).tablet for b in range(3)]
    assert {id(b._budget) for b in buckets} == {id(host.budget)}
    models = [{} for _ in buckets]
    rnd = random.Random(11)
    for _ in range(200):
        i = rnd.randrange(len(buckets))
        write(buckets[i], models[i], rnd)
        assert host.budget.buffered_bytes <= ROW_CAP
    for bucket, model in zip(buckets, models):
        check(bucket, model)
    host.close()
