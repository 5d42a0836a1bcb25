"""Undo benchmark: the time to undo one batch, side by side with the time to write it.

For each table size (default 1M and 4M rows, built with the ingest workload's table shape) and
each batch size (default 1k, 10k, 100k keys), in one KvTablet: write the batch (AGGREGATE, keys
spread over the table), then `undo_bucket` it back to the offset before the batch. Both are
timed, `rounds` times with a new batch each (the undo leaves the table as it was), and each
side's median counts: one timing of a 0.3 s write moved the ratio by 0.2x from run to run.
The ratio undo/write is the number to watch: the target (<= 1.5x, and flat as the table grows)
is the 10k-key batch's (`target_keys`); the other sizes show how the ratio moves with the
batch. Every undo is verified: the touched keys are back to their state before the batch.

`run()` returns a list of dicts; `python -m tally.bench.undo` prints them.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import tempfile
import time

import numpy as np
import pyarrow as pa

from tally.bench.progress import Progress
from tally.bench.workload import Workload, key_ids, table_descriptor

TARGET_RATIO = 1.5


def _build_table(path: str, rows: int, progress: Progress):
    from merge_engine.kv.tablet import KvTablet

    tablet = KvTablet.open(path, table_descriptor())
    for batch in Workload(rows, None, batch=100_000, seed=7).batches():
        tablet.put(batch)
        progress.rows(tablet.log_end_offset, rows)
    return tablet


def _batch(rows: int, keys: int, seed: int) -> pa.RecordBatch:
    """A batch updating `keys` existing keys spread over the table (one row each)."""
    rng = np.random.default_rng(seed)
    numbers = rng.choice(rows, size=keys, replace=False)
    return pa.record_batch({
        "id": pa.array(key_ids(numbers)),
        "qty": pa.array(rng.integers(1, 100, keys)),
        "price": pa.array(rng.random(keys) * 100),
        "tag": pa.array([f"u{i % 97}" for i in range(keys)]),
        "status": pa.array(["undo-me"] * keys),
    })


def _measure(tablet, batch: pa.RecordBatch) -> dict:
    from recovery import undo_bucket

    sample = [{"id": int(i)} for i in batch.column("id").to_pylist()[:200]]
    before = [tablet.lookup(k) for k in sample]
    baseline = tablet.log_end_offset
    started = time.perf_counter()
    tablet.put(batch)
    write_s = time.perf_counter() - started
    started = time.perf_counter()
    result = undo_bucket(tablet, baseline)
    undo_s = time.perf_counter() - started
    verified = [tablet.lookup(k) for k in sample] == before and result.keys_restored == batch.num_rows
    return {"write_s": write_s, "undo_s": undo_s, "ratio": undo_s / write_s,
            "records": result.records_scanned, "verified": verified}


def run(table_rows=(1_000_000, 4_000_000), batch_keys=(1_000, 10_000, 100_000),
        target_keys: int = 10_000, rounds: int = 3) -> list[dict]:
    progress = Progress(len(table_rows) * (1 + len(batch_keys)))
    results = []
    for rows in table_rows:
        directory = tempfile.mkdtemp(prefix="tally-undo-bench-")
        try:
            progress.step(f"build a table of {rows:,} rows")
            tablet = _build_table(directory + "/t", rows, progress)
            progress.done(f"{rows:,} rows")
            for i, keys in enumerate(batch_keys):
                progress.step(f"write then undo {keys:,} keys in {rows:,} rows, {rounds} rounds")
                outcomes = [_measure(tablet, _batch(rows, keys, seed=i * rounds + r))
                            for r in range(rounds)]
                write_s = statistics.median(o["write_s"] for o in outcomes)
                undo_s = statistics.median(o["undo_s"] for o in outcomes)
                progress.done(f"undo/write {undo_s / write_s:.2f}x")
                results.append({
                    "kind": "undo", "table_rows": rows, "batch_keys": keys, "rounds": rounds,
                    "write_s": write_s, "undo_s": undo_s, "ratio": undo_s / write_s,
                    "records": outcomes[-1]["records"], "target": keys == target_keys,
                    "verified": all(o["verified"] for o in outcomes)})
            tablet.close()
        finally:
            shutil.rmtree(directory, ignore_errors=True)
    return results


def target_mark(result: dict) -> str:
    """The target column's entry: met or MISSED for the target batch size, else a dash."""
    if not result.get("target", True):
        return "-"
    return "met" if result["ratio"] <= TARGET_RATIO else "MISSED"


def format_text(results: list[dict]) -> str:
    from tabulate import tabulate

    rows = [[f"{r['table_rows']:,}", f"{r['batch_keys']:,}", f"{r['write_s']:.3f}",
             f"{r['undo_s']:.3f}", f"{r['ratio']:.2f}x", target_mark(r), str(r["verified"])]
            for r in results]
    headers = ["table rows", "batch keys", "write s", "undo s", "undo/write",
               f"target <= {TARGET_RATIO}x", "verified"]
    return tabulate(rows, headers, colalign=["right"] * 5 + ["left", "left"],
                    disable_numparse=True)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--table-rows", type=int, nargs="+", default=[1_000_000, 4_000_000])
    parser.add_argument("--batch-keys", type=int, nargs="+", default=[1_000, 10_000, 100_000])
    parser.add_argument("--target-keys", type=int, default=10_000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)
    results = run(args.table_rows, args.batch_keys, args.target_keys, args.rounds)
    print(format_text(results))
    return 0 if all(r["verified"] for r in results) else 1


if __name__ == "__main__":
    raise SystemExit(main())
